//! What the extender knows about the cluster: each node's GPUs (from the device plugin's inventory
//! annotation and heartbeat) and what is placed on them (from vGPU pods' assignment annotations,
//! plus the pods it has *assumed*: chosen in a bind call but not yet seen back from the API).
//!
//! The assume step works like kube-scheduler's own assume cache. kube-scheduler binds one pod while
//! it already filters the next, and the pod watch shows our assignment only a moment after we
//! write it; without the assumption the next filter would see the GPUs as still free. A bind
//! re-checks the chosen node under the write lock and records the assumption before any API call,
//! so two pods in flight can never be given the same capacity: the second finds it taken. An
//! assumption ends when the watch shows the pod with its assignment (the pod's own entry then
//! counts), when the pod is deleted, when the bind fails (rolled back), or after a time limit
//! (the pod was never seen again).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

use std::cell::OnceCell;

use vgpu_core::assignment::{ContainerAssignment, PodAssignment};
use vgpu_core::inventory::{DeviceInfo, NodeInventory};
use vgpu_core::placement::frag::{typical_pods, LiveFrag, ModelMask, PodShape};
use vgpu_core::placement::host::{HostLeft, HostRequest, PodKind};
use vgpu_core::placement::{
    self, Gpu, GpuFilter, GpuHot, GpuSet, Miss, NameList, NodeGpus, PlaceBuf, PodRequest, Standing,
};

use crate::dense::{self, Dense};
use crate::hosts::Hosts;

/// The Fx hash (rustc's): a multiply-rotate over 8-byte words, several times faster than SipHash
/// on short keys like node names. Not DoS-resistant, which is fine for keys that come from the
/// cluster's own Node objects.
#[derive(Debug, Clone, Copy, Default)]
pub struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
        }
        for &b in chunks.remainder() {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
        }
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A map keyed by node name with [`FxHasher`].
type NodeMap<V> = HashMap<String, V, BuildHasherDefault<FxHasher>>;

/// A hash of a sequence of node names (to recognise the list a filter answered).
pub fn names_hash<'a>(names: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut h = FxHasher::default();
    for n in names {
        h.write(n.as_bytes());
        h.write(&[0xff]);
    }
    h.finish()
}

/// How the node's inventory looks.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Inventory {
    /// No Node object seen (only pods that name it).
    Unseen,
    /// The Node has no inventory annotation.
    Missing,
    /// The annotation cannot be read.
    Bad(String),
    /// The devices.
    Devices(Vec<DeviceInfo>),
}

/// The heartbeat annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Heartbeat {
    Missing,
    Bad(String),
    At(u64),
}

#[derive(Debug, Clone)]
struct NodeEntry {
    inventory: Inventory,
    heartbeat: Heartbeat,
    /// GPUs the node's `hami.io/device-cordon` names.
    cordon: NameList,
    /// Devices with usage counted, rebuilt on every change to the node or its pods.
    gpus: NodeGpus,
    /// UIDs of pods placed here.
    pods: HashSet<String>,
}

impl NodeEntry {
    fn unseen() -> NodeEntry {
        NodeEntry {
            inventory: Inventory::Unseen,
            heartbeat: Heartbeat::Missing,
            cordon: NameList::default(),
            gpus: NodeGpus::default(),
            pods: HashSet::new(),
        }
    }
}

/// A pod's GPUs on a node.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Placed {
    node: String,
    containers: Vec<ContainerAssignment>,
    /// When it was assumed; `None` once the watch shows it.
    assumed: Option<Instant>,
    /// Its containers' kinds, counted in the typical-pod table.
    shapes: Vec<Kind>,
}

/// A vGPU container as the typical-pod table counts it: (milli-GPU per GPU, GPUs, the pod's
/// milli-CPU, the pod's MiB, the model groups its GPU-type lists allow).
type Kind = (u32, u32, u64, u64, u64);

/// Counts of nodes by state, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Inventory and a fresh heartbeat.
    pub ready: u64,
    /// Heartbeat missing or too old.
    pub stale: u64,
    /// No readable inventory.
    pub no_inventory: u64,
}

/// One GPU as exported in metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuReport {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
    /// Device memory, MiB.
    pub memory_mib: u64,
    /// Placed memory, MiB.
    pub used_mib: u64,
    /// Cores, percent.
    pub cores: u32,
    /// Placed cores, percent.
    pub used_cores: u32,
    /// Healthy.
    pub healthy: bool,
}

/// GPU models seen, numbered in order of appearance (never forgotten: a cluster has few), so a
/// filter tests the pod's type lists once per model instead of once per node. Each spelling has
/// its own number (messages show the model as reported); spellings equal but for case share a
/// group (type lists ignore case, and a message lists such models once, as the node entry does).
#[derive(Debug, Default)]
struct Models {
    ids: HashMap<String, u32>,
    name: Vec<String>,
    group: Vec<u32>,
    group_ids: HashMap<String, u32>,
    lower: Vec<String>,
}

impl Models {
    fn id(&mut self, model: &str) -> u32 {
        if let Some(&id) = self.ids.get(model) {
            return id;
        }
        let lower = model.to_ascii_lowercase();
        let group = match self.group_ids.get(&lower) {
            Some(&g) => g,
            None => {
                let g = self.lower.len() as u32;
                self.lower.push(lower.clone());
                self.group_ids.insert(lower, g);
                g
            }
        };
        let id = self.name.len() as u32;
        self.name.push(model.to_string());
        self.group.push(group);
        self.ids.insert(model.to_string(), id);
        id
    }

    fn name(&self, id: u32) -> &str {
        self.name.get(id as usize).map_or("", String::as_str)
    }

    fn group(&self, id: u32) -> Option<u32> {
        self.group.get(id as usize).copied()
    }

    /// The model groups (lower-cased models) a pod's type lists allow, as a mask over group
    /// numbers; [`ModelMask::ANY`] without lists, or when none of the first 64 groups passes.
    fn mask(&self, filter: &GpuFilter) -> ModelMask {
        if !filter.typed() {
            return ModelMask::ANY;
        }
        ModelMask::of(
            (0..self.lower.len().min(64) as u32)
                .filter(|&g| filter.type_ok_lower(&self.lower[g as usize])),
        )
        .unwrap_or(ModelMask::ANY)
    }
}

/// The cluster as the extender sees it.
#[derive(Debug)]
pub struct Cluster {
    nodes: NodeMap<NodeEntry>,
    pods: HashMap<String, Placed>,
    assumed: HashMap<String, Instant>,
    heartbeat_timeout: Duration,
    assume_ttl: Duration,
    /// The hot copy of every node's state and GPUs that filters read.
    dense: Dense,
    models: Models,
    /// Bumped on every change to what a decision reads.
    generation: u64,
    /// Placed containers by kind: the typical pods of the live table.
    shape_counts: HashMap<Kind, u64>,
    /// Every pod's CPU and memory on its node (the `gap-aware` host terms).
    hosts: Hosts,
    /// The model groups allowed to pods with GPU-type lists, by UID (counted in their kinds).
    typed: HashMap<String, ModelMask>,
    /// The `fragmentation` and `gap-aware` policies' table from a file.
    fixed_frag: Option<LiveFrag>,
    /// The table from `shape_counts`, built when first needed after a change (a relist of
    /// thousands of pods then builds it once, not once per pod).
    live_frag: std::sync::OnceLock<LiveFrag>,
    /// The table before the last change, whose `gap-aware` prices the next table reuses while
    /// the typical share sizes stay the same ([`LiveFrag::reuse_gaps_from`]): a burst of binds
    /// then solves the LP once, not once per bind.
    prev_frag: Option<LiveFrag>,
    /// Changes whenever the table the policies read may have changed.
    table_epoch: u64,
    /// Containers counted in `shape_counts`.
    placed_kinds: u64,
    /// How far the counted mix may have moved since the live table was built (a bound on the
    /// total variation).
    table_drift: f64,
}

/// How far (total variation, 0..=1) the placed mix may move from the live table's before the
/// table is rebuilt.
const MIX_DRIFT: f64 = 0.02;

/// Scores one pod against nodes by name: what a filter or prioritize call does for each candidate
/// ([`Cluster::scorer`]). Reads the dense copy; the node entries only for messages.
pub struct Scorer<'a> {
    cluster: &'a Cluster,
    pod: &'a PodRequest,
    now: u64,
    /// The pod's type lists' verdict per model id, when it has type lists.
    verdicts: Vec<bool>,
    frag: Option<&'a LiveFrag>,
}

/// The most pod requests whose standings a [`StandingMemo`] keeps.
const MEMO_PODS: usize = 16;

/// Standings of recent pod requests per node: each is kept while the node's dense version and
/// the typical-pod table stay the same, so that a burst of pods of a few shapes scores only the
/// nodes the last binds changed. Without it a `gap-aware` filter over 5000 nodes costs tens of
/// milliseconds.
#[derive(Debug, Default)]
pub struct StandingMemo {
    /// (pod request, table epoch, per dense slot (version, result)), most recent first.
    entries: Vec<(PodRequest, u64, Vec<MemoSlot>)>,
}

/// A node's remembered result, with its dense version when computed.
pub type MemoSlot = Option<(u64, Result<Standing, Miss>)>;

impl StandingMemo {
    /// The slots of `pod` at table epoch `epoch` (new and empty when not kept).
    pub fn slots(&mut self, pod: &PodRequest, epoch: u64) -> &mut Vec<MemoSlot> {
        let at = self
            .entries
            .iter()
            .position(|(p, e, _)| *e == epoch && p == pod);
        let entry = match at {
            Some(i) => self.entries.remove(i),
            None => {
                if self.entries.len() >= MEMO_PODS {
                    self.entries.pop();
                }
                (pod.clone(), epoch, Vec::new())
            }
        };
        self.entries.insert(0, entry);
        &mut self.entries[0].2
    }
}

/// Why a node failed a [`Scorer::score_lean`], cheap to make; [`Scorer::write_fail`] writes the
/// message.
#[derive(Debug, Clone, Copy)]
pub enum Fail<'a> {
    /// No such node.
    Unknown,
    /// Not usable (no inventory, stale heartbeat...): the node entry says why.
    Unusable,
    /// A container does not fit its GPUs.
    Miss(&'a [GpuHot], Miss),
}

impl<'a> Scorer<'a> {
    /// Whether the pod fits on node `name`, and its score, or the message for kube-scheduler;
    /// the same decision as [`Cluster::check`] without building the placement.
    pub fn score(&self, name: &str) -> Result<u32, String> {
        let mut buf = PlaceBuf::default();
        self.score_lean(name, &mut buf).map_err(|f| {
            let mut msg = String::new();
            self.write_fail(&mut msg, name, &f);
            msg
        })
    }

    /// [`Scorer::score`] without allocating: `buf` is reused from node to node, and a failure
    /// is only described ([`Scorer::write_fail`] writes its message).
    pub fn score_lean(&self, name: &str, buf: &mut PlaceBuf) -> Result<u32, Fail<'a>> {
        self.score_at(name, &mut None, buf)
    }

    /// [`Scorer::score_lean`] trying the dense slot `hint` first; `hint`
    /// is left at the node's slot.
    pub fn score_at(
        &self,
        name: &str,
        hint: &mut Option<u32>,
        buf: &mut PlaceBuf,
    ) -> Result<u32, Fail<'a>> {
        self.standing_at(name, hint, buf).map(|s| s.score)
    }

    /// [`Scorer::score_at`] with the node's rank ([`Standing`]), which a filter choosing the node
    /// itself orders by.
    pub fn standing_at(
        &self,
        name: &str,
        hint: &mut Option<u32>,
        buf: &mut PlaceBuf,
    ) -> Result<Standing, Fail<'a>> {
        let view = self.usable(name, hint)?;
        let set = self.set(view.gpus, name);
        placement::standing_buf(&set, self.pod, buf, self.frag)
            .map_err(|m| Fail::Miss(view.gpus, m))
    }

    /// [`Scorer::standing_at`] through `memo` (this pod's, at the cluster's current table): a
    /// node whose dense version is the one remembered is not scored again.
    pub fn standing_memo(
        &self,
        name: &str,
        hint: &mut Option<u32>,
        buf: &mut PlaceBuf,
        memo: &mut Vec<MemoSlot>,
    ) -> Result<Standing, Fail<'a>> {
        let view = self.usable(name, hint)?;
        let slot = view.slot as usize;
        if memo.len() <= slot {
            memo.resize(slot + 1, None);
        }
        let got = match memo[slot] {
            Some((v, r)) if v == view.version => r,
            _ => {
                let set = self.set(view.gpus, name);
                let r = placement::standing_buf(&set, self.pod, buf, self.frag);
                memo[slot] = Some((view.version, r));
                r
            }
        };
        got.map_err(|m| Fail::Miss(view.gpus, m))
    }

    /// The node's dense view when it can take vGPU pods now (known, inventory, fresh heartbeat).
    fn usable(&self, name: &str, hint: &mut Option<u32>) -> Result<dense::NodeView<'a>, Fail<'a>> {
        let c = self.cluster;
        let view = c.dense.get_at(name, hint).ok_or(Fail::Unknown)?;
        match view.state {
            dense::State::Heartbeat(t)
                if self.now.saturating_sub(t) <= c.heartbeat_timeout.as_secs() =>
            {
                Ok(view)
            }
            _ => Err(Fail::Unusable),
        }
    }

    fn set<'s>(&'s self, hot: &'s [GpuHot], name: &'s str) -> DenseSet<'s> {
        DenseSet {
            hot,
            verdicts: &self.verdicts,
            models: &self.cluster.models,
            nodes: &self.cluster.nodes,
            hosts: &self.cluster.hosts,
            name,
            cold: OnceCell::new(),
        }
    }

    /// [`Scorer::write_fail`], reusing the words of an earlier GPU-type miss on the same models.
    pub fn write_fail_memo(
        &self,
        out: &mut String,
        name: &str,
        fail: &Fail<'_>,
        memo: &mut FailMemo,
    ) {
        let (hot, container, left) = match fail {
            Fail::Miss(hot, m) => match m.why {
                placement::MissReason::Type { left } => (*hot, m.container, left),
                _ => return self.write_fail(out, name, fail),
            },
            _ => return self.write_fail(out, name, fail),
        };
        let models = || hot.iter().map(GpuHot::model_key);
        let hit = memo
            .entries
            .iter()
            .find(|e| e.0 == container && e.1 == left && e.2.iter().copied().eq(models()));
        if let Some(e) = hit {
            out.push_str(name);
            out.push_str(": ");
            out.push_str(&e.3);
            return;
        }
        let start = out.len();
        self.write_fail(out, name, fail);
        // A miss is written as `{name}: {words}`.
        if memo.entries.len() < FAIL_MEMO_MAX {
            if let Some(words) = out.get(start + name.len() + 2..) {
                let words = words.to_string();
                memo.entries
                    .push((container, left, models().collect(), words));
            }
        }
    }

    /// Appends the message for node `name`'s failure (`node-7: no GPU with …`).
    pub fn write_fail(&self, out: &mut String, name: &str, fail: &Fail<'_>) {
        use std::fmt::Write;
        match fail {
            Fail::Unknown => {
                let _ = write!(
                    out,
                    "{name}: not known to the vGPU extender (no Node object seen)"
                );
            }
            Fail::Unusable => {
                if let Err(m) = self.cluster.score_cold(name, self.pod, self.now) {
                    out.push_str(&m);
                }
            }
            Fail::Miss(hot, m) => {
                let set = self.set(hot, name);
                let _ = write!(out, "{name}: ");
                let _ = placement::write_miss(out, &set, self.pod, m);
            }
        }
    }
}

/// The words after `name: ` of GPU-type misses, by container, GPUs left and the node's GPU models
/// in order, for one scan: a type list fails thousands of nodes of a few models with the same
/// words, and writing them node by node was a tenth of a typed multi-GPU filter (`perf`, filter
/// bench). Those inputs fix the words ([`placement::write_miss`] reads nothing else of the node
/// for a type miss), so a hit is the message [`Scorer::write_fail`] would write.
#[derive(Default)]
pub struct FailMemo {
    entries: Vec<(usize, usize, Vec<u32>, String)>,
}

/// More distinct model sets than this in one scan are written out each time.
const FAIL_MEMO_MAX: usize = 64;

/// A node's GPUs as the dense copy holds them; UUIDs come from the node entry, found only when a
/// UUID list, a message or an assignment needs them.
struct DenseSet<'a> {
    hot: &'a [GpuHot],
    verdicts: &'a [bool],
    models: &'a Models,
    nodes: &'a NodeMap<NodeEntry>,
    hosts: &'a Hosts,
    name: &'a str,
    cold: OnceCell<Option<&'a NodeGpus>>,
}

impl DenseSet<'_> {
    fn cold(&self, i: usize) -> Option<&Gpu> {
        self.cold
            .get_or_init(|| self.nodes.get(self.name).map(|e| &e.gpus))
            .and_then(|g| g.gpus().get(i))
    }
}

impl GpuSet for DenseSet<'_> {
    fn len(&self) -> usize {
        self.hot.len()
    }
    fn hot(&self, i: usize) -> GpuHot {
        self.hot[i]
    }
    fn hot_slice(&self) -> Option<&[GpuHot]> {
        Some(self.hot)
    }
    fn uuid(&self, i: usize) -> &str {
        self.cold(i).map_or("", |g| g.uuid.as_str())
    }
    fn model(&self, i: usize) -> &str {
        self.models.name(self.hot[i].model_key())
    }
    fn same_model(&self, i: usize, j: usize) -> bool {
        self.models.group(self.hot[i].model_key()) == self.models.group(self.hot[j].model_key())
    }
    fn type_ok(&self, i: usize, filter: &GpuFilter) -> bool {
        match self.verdicts.get(self.hot[i].model_key() as usize) {
            Some(&ok) => ok,
            None => self
                .cold(i)
                .is_some_and(|g| filter.type_ok_lower(g.model_lower())),
        }
    }
    fn numa(&self, i: usize) -> Option<u32> {
        self.cold(i).and_then(|g| g.numa)
    }
    fn links(&self, i: usize, j: usize) -> u32 {
        match (self.cold(i), self.cold(j)) {
            (Some(a), Some(b)) => a.nvlinks.get(&b.uuid).copied().unwrap_or(0),
            _ => 0,
        }
    }
    fn host_left(&self) -> Option<HostLeft> {
        let mut left = self.hosts.left(self.name)?;
        // The node's model group (a node's GPUs share a model), in the kinds' model masks.
        left.model = self
            .hot
            .first()
            .and_then(|g| self.models.group(g.model_key()))
            .unwrap_or(u32::MAX);
        Some(left)
    }
}

impl Cluster {
    /// An empty cluster; nodes whose heartbeat is older than `heartbeat_timeout` are left out, and
    /// an assumed pod not seen from the API within `assume_ttl` is forgotten.
    pub fn new(heartbeat_timeout: Duration, assume_ttl: Duration) -> Cluster {
        Cluster {
            nodes: NodeMap::default(),
            pods: HashMap::new(),
            assumed: HashMap::new(),
            heartbeat_timeout,
            assume_ttl,
            dense: Dense::default(),
            models: Models::default(),
            generation: 0,
            shape_counts: HashMap::new(),
            hosts: Hosts::default(),
            typed: HashMap::new(),
            fixed_frag: None,
            live_frag: std::sync::OnceLock::new(),
            prev_frag: None,
            table_epoch: 0,
            placed_kinds: 0,
            table_drift: 0.0,
        }
    }

    /// Changes whenever the typical-pod table may have changed (with the dense slots'
    /// versions, what tells whether a decision about a node is still right).
    pub fn table_epoch(&self) -> u64 {
        self.table_epoch
    }

    /// A number that changes whenever anything a decision reads changes (so a result computed
    /// at one value is still right while it stays).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Uses this typical-pod table for the `fragmentation` and `gap-aware` policies instead of the one built from
    /// the placed pods (`None`: back to the placed pods).
    pub fn set_typical_pods(&mut self, table: Option<LiveFrag>) {
        self.fixed_frag = table;
        self.table_epoch += 1;
        self.generation += 1;
    }

    /// The table the `fragmentation` and `gap-aware` policies use, when it knows any GPU pod.
    pub fn typical_pods(&self) -> Option<&LiveFrag> {
        self.frag()
    }

    fn frag(&self) -> Option<&LiveFrag> {
        let t = match &self.fixed_frag {
            Some(t) => t,
            None => self.live_frag.get_or_init(|| self.live_table()),
        };
        (!t.is_empty()).then_some(t)
    }

    fn live_table(&self) -> LiveFrag {
        let kinds = self.kinds();
        let shapes = kinds.iter().map(|(k, n)| (k.shape, *n));
        let pct = crate::typical::TYPICAL_PCT;
        let mut t = LiveFrag::new(&typical_pods(shapes, pct)).with_host(kinds, pct);
        if let Some(old) = &self.prev_frag {
            t.reuse_gaps_from(old);
        }
        t
    }

    /// The placed pods' kinds and counts, in a fixed order.
    fn kinds(&self) -> Vec<(PodKind, u64)> {
        let mut kinds: Vec<(PodKind, u64)> = self
            .shape_counts
            .iter()
            .map(
                |(&(gpu_milli, num_gpu, cpu_milli, memory_mib, models), &n)| {
                    let shape = PodShape {
                        cpu_milli,
                        gpu_milli,
                        num_gpu,
                        models: ModelMask(models),
                    };
                    (PodKind { shape, memory_mib }, n)
                },
            )
            .collect();
        // Deterministic whatever the map's order.
        kinds.sort_by_key(|(k, _)| {
            let s = &k.shape;
            (
                s.gpu_milli,
                s.num_gpu,
                s.cpu_milli,
                k.memory_mib,
                s.models.0,
            )
        });
        kinds
    }

    /// The kind of each container: milli-GPU per GPU (per GPU the larger of its memory and
    /// cores shares of that card, the largest over the container's GPUs), GPUs, and the pod's
    /// CPU and memory, counted with its first vGPU container (a pod is one typical pod however
    /// many containers it has; the simulator's pods have one). GPUs the node does not list are
    /// left out.
    fn shapes_of(&self, uid: &str, p: &Placed) -> Vec<Kind> {
        let Some(e) = self.nodes.get(&p.node) else {
            return Vec::new();
        };
        let mut host = Some(self.hosts.request(uid).unwrap_or_default());
        let models = self.typed.get(uid).copied().unwrap_or(ModelMask::ANY).0;
        p.containers
            .iter()
            .filter_map(|c| {
                let mut milli = 0u64;
                let mut n = 0u32;
                for d in &c.devices {
                    let Some(g) = e.gpus.gpus().iter().find(|g| g.uuid == d.uuid) else {
                        continue;
                    };
                    let mem = d.memory_mib.saturating_mul(1000) / g.memory_mib.max(1);
                    let cores = u64::from(d.cores.min(100)) * 10;
                    milli = milli.max(mem.max(cores));
                    n += 1;
                }
                if n == 0 {
                    return None;
                }
                let h = host.take().unwrap_or_default();
                Some((
                    milli.clamp(1, 1000) as u32,
                    n,
                    h.cpu_milli,
                    h.mem_mib,
                    models,
                ))
            })
            .collect()
    }

    fn count_shapes(&mut self, shapes: &[Kind], add: bool) {
        if shapes.is_empty() {
            return;
        }
        for s in shapes {
            let n = self.shape_counts.entry(*s).or_insert(0);
            if add {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.shape_counts.remove(s);
                }
            }
        }
        // The table stays while the mix is close to the one it was built from, so decisions
        // computed with it (the filter's memo) stay right across binds. One pod more or less in
        // a mix of N moves it by at most 1/N in total variation; the sum of those bounds the
        // drift since the table was built, in O(1) per change.
        let n = shapes.len() as u64;
        self.placed_kinds = if add {
            self.placed_kinds.saturating_add(n)
        } else {
            self.placed_kinds.saturating_sub(n)
        };
        self.table_drift += n as f64 / self.placed_kinds.max(1) as f64;
        if self.live_frag.get().is_none() || self.table_drift > MIX_DRIFT {
            if let Some(old) = self.live_frag.take() {
                self.prev_frag = Some(old);
            }
            self.table_epoch += 1;
            self.table_drift = 0.0;
        }
        self.generation += 1;
    }

    /// Copies a node's state and GPUs into the dense copy (or drops it there, when gone).
    fn sync(&mut self, name: &str) {
        let Cluster {
            nodes,
            dense,
            models,
            generation,
            ..
        } = self;
        *generation += 1;
        let Some(e) = nodes.get(name) else {
            dense.remove(name);
            return;
        };
        let state = match (&e.inventory, &e.heartbeat) {
            (Inventory::Devices(_), Heartbeat::At(t)) => dense::State::Heartbeat(*t),
            _ => dense::State::Unusable,
        };
        let gpus = e
            .gpus
            .gpus()
            .iter()
            .map(|g| g.hot().with_model_key(models.id(&g.model)));
        dense.set(name, state, gpus);
    }

    fn rebuild(&mut self, name: &str) {
        self.rebuild_entry(name);
        self.sync(name);
    }

    fn rebuild_entry(&mut self, name: &str) {
        let Some(entry) = self.nodes.get_mut(name) else {
            return;
        };
        let mut gpus = match &entry.inventory {
            Inventory::Devices(d) => NodeGpus::new(d.iter().map(Gpu::from_device).collect()),
            _ => NodeGpus::default(),
        };
        for uid in &entry.pods {
            if let Some(p) = self.pods.get(uid) {
                gpus.add_all(&p.containers);
            }
        }
        gpus.cordon(&entry.cordon);
        entry.gpus = gpus;
    }

    /// Adds or updates a node from its annotations (`vgpu.io/node-devices`, `vgpu.io/node-heartbeat`,
    /// `hami.io/device-cordon`).
    pub fn apply_node(
        &mut self,
        name: &str,
        inventory: Option<&str>,
        heartbeat: Option<&str>,
        cordon: Option<&str>,
    ) {
        let inv = match inventory.map(NodeInventory::decode) {
            None => Inventory::Missing,
            Some(Ok(i)) => Inventory::Devices(i.devices),
            Some(Err(e)) => Inventory::Bad(e.to_string()),
        };
        let hb = match heartbeat.map(vgpu_core::time::parse_rfc3339) {
            None => Heartbeat::Missing,
            Some(Ok(t)) => Heartbeat::At(t),
            Some(Err(e)) => Heartbeat::Bad(e.to_string()),
        };
        let entry = self
            .nodes
            .entry(name.to_string())
            .or_insert_with(NodeEntry::unseen);
        let cordon = cordon.map(NameList::parse).unwrap_or_default();
        let changed = entry.inventory != inv || entry.cordon != cordon;
        entry.inventory = inv;
        entry.heartbeat = hb;
        entry.cordon = cordon;
        if changed {
            self.rebuild_entry(name);
        }
        self.sync(name);
    }

    /// Forgets a node (its pods stay counted, should it come back).
    pub fn delete_node(&mut self, name: &str) {
        self.hosts.delete_node(name);
        if let Some(e) = self.nodes.get_mut(name) {
            if e.pods.is_empty() {
                self.nodes.remove(name);
            } else {
                e.inventory = Inventory::Unseen;
                e.heartbeat = Heartbeat::Missing;
                e.gpus = NodeGpus::default();
            }
        }
        self.sync(name);
    }

    fn unplace(&mut self, uid: &str) -> Option<Placed> {
        let old = self.pods.remove(uid)?;
        self.count_shapes(&old.shapes, false);
        if let Some(e) = self.nodes.get_mut(&old.node) {
            e.pods.remove(uid);
        }
        self.rebuild(&old.node);
        Some(old)
    }

    fn place_entry(&mut self, uid: &str, mut p: Placed) {
        let node = p.node.clone();
        p.shapes = self.shapes_of(uid, &p);
        self.count_shapes(&p.shapes, true);
        self.pods.insert(uid.to_string(), p);
        self.nodes
            .entry(node.clone())
            .or_insert_with(NodeEntry::unseen)
            .pods
            .insert(uid.to_string());
        self.rebuild(&node);
    }

    /// Sets a node's allocatable CPU and memory, from its Node object (`None`: not known).
    pub fn apply_allocatable(&mut self, name: &str, allocatable: Option<HostLeft>) {
        if self.hosts.set_allocatable(name, allocatable) {
            self.sync(name);
        }
    }

    /// Counts any pod's CPU and memory request on its node (`node`: its `spec.nodeName`): what
    /// the `gap-aware` host terms read. Call it before [`Cluster::apply_pod`] for the same
    /// event. A pod not bound yet that the extender assumed stays counted where it was assumed.
    pub fn apply_pod_host(
        &mut self,
        uid: &str,
        node: Option<&str>,
        host: HostRequest,
        terminal: bool,
    ) {
        let on = match node.filter(|n| !n.is_empty()) {
            _ if terminal => None,
            Some(n) => Some((n, host)),
            None if self.assumed.contains_key(uid) => return,
            None => None,
        };
        self.set_host(uid, on);
    }

    /// Counts a pod's host request on a node (or nowhere), re-syncing the nodes that changed.
    fn set_host(&mut self, uid: &str, on: Option<(&str, HostRequest)>) {
        let changed: Vec<String> = self
            .hosts
            .set_pod(uid, on)
            .into_iter()
            .map(str::to_string)
            .collect();
        for n in changed {
            self.sync(&n);
        }
    }

    /// Remembers a pod's GPU-type lists (from its annotations) as the model mask its kind is
    /// counted with in the typical-pod table. Call it before [`Cluster::apply_pod`] for the same
    /// event. The mask covers the models known then.
    pub fn apply_pod_types(&mut self, uid: &str, filter: &GpuFilter) {
        if filter.typed() {
            let mask = self.models.mask(filter);
            self.typed.insert(uid.to_string(), mask);
        } else {
            self.typed.remove(uid);
        }
    }

    /// Adds or updates a pod from the watch: `assignment` is its decoded annotation (if any), `node`
    /// its `spec.nodeName`; a finished pod frees its GPUs.
    pub fn apply_pod(
        &mut self,
        uid: &str,
        node: Option<&str>,
        assignment: Option<PodAssignment>,
        terminal: bool,
    ) {
        let placed = match assignment {
            Some(a) if !terminal => {
                let node = node
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&a.node)
                    .to_string();
                Some(Placed {
                    node,
                    containers: a.containers,
                    assumed: None,
                    shapes: Vec::new(),
                })
            }
            _ => None,
        };
        match placed {
            Some(p) => {
                self.assumed.remove(uid);
                let same = |o: &Placed| {
                    o.node == p.node && o.containers == p.containers && o.assumed == p.assumed
                };
                if !self.pods.get(uid).is_some_and(same) {
                    self.unplace(uid);
                    self.place_entry(uid, p);
                }
            }
            // Not placed (yet): an assumption stands until its own write shows up.
            None if !terminal && self.assumed.contains_key(uid) => {}
            None => {
                self.assumed.remove(uid);
                self.unplace(uid);
            }
        }
    }

    /// Forgets a deleted pod.
    pub fn delete_pod(&mut self, uid: &str) {
        self.set_host(uid, None);
        self.typed.remove(uid);
        self.assumed.remove(uid);
        self.unplace(uid);
    }

    /// After a relist that began at `listed_from`: every pod not in `seen` is gone, except those
    /// assumed since the list began. A pod is created before it is bound, so one assumed before
    /// the list began existed when the list's snapshot was taken; absent from it, it was deleted
    /// meanwhile (a watch outage hides the delete), and its capacity is free again. One assumed
    /// after may be newer than the snapshot, and keeps its assumption.
    pub fn retain_pods(&mut self, seen: &HashSet<String>, listed_from: Instant) {
        let deleted: Vec<String> = self
            .assumed
            .iter()
            .filter(|(uid, at)| **at < listed_from && !seen.contains(*uid))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &deleted {
            self.delete_pod(uid);
        }
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !seen.contains(*uid) && !self.assumed.contains_key(*uid))
            .cloned()
            .collect();
        for uid in gone {
            self.unplace(&uid);
        }
        let assumed = &self.assumed;
        self.typed
            .retain(|uid, _| seen.contains(uid) || assumed.contains_key(uid));
        let changed = self
            .hosts
            .retain_pods(&|uid| seen.contains(uid) || assumed.contains_key(uid));
        for n in changed {
            self.sync(&n);
        }
    }

    /// After a relist: every node not in `seen` is gone.
    pub fn retain_nodes(&mut self, seen: &HashSet<String>) {
        let gone: Vec<String> = self
            .nodes
            .iter()
            .filter(|(n, e)| !seen.contains(*n) && e.inventory != Inventory::Unseen)
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            self.delete_node(&n);
        }
    }

    /// Why the node cannot take vGPU pods at all, if it cannot; `now` is Unix seconds.
    fn unusable(&self, name: &str, e: &NodeEntry, now: u64) -> Option<String> {
        match &e.inventory {
            Inventory::Unseen => {
                return Some(format!("{name}: not known to the vGPU extender (no Node object seen)"))
            }
            Inventory::Missing => {
                return Some(format!(
                    "{name}: no vGPU inventory (annotation {} missing; is the device plugin running there?)",
                    vgpu_core::annotations::NODE_DEVICES
                ))
            }
            Inventory::Bad(err) => return Some(format!("{name}: {err}")),
            Inventory::Devices(_) => {}
        }
        match e.heartbeat {
            Heartbeat::Missing => Some(format!(
                "{name}: no device-plugin heartbeat (annotation {})",
                vgpu_core::annotations::NODE_HEARTBEAT
            )),
            Heartbeat::Bad(ref err) => Some(format!(
                "{name}: annotation {}: {err}",
                vgpu_core::annotations::NODE_HEARTBEAT
            )),
            Heartbeat::At(t) => {
                let age = now.saturating_sub(t);
                (age > self.heartbeat_timeout.as_secs()).then(|| {
                    format!(
                        "{name}: device-plugin heartbeat is {age}s old (limit {}s)",
                        self.heartbeat_timeout.as_secs()
                    )
                })
            }
        }
    }

    /// Whether `pod` fits on node `name` now, with its placement and score, or the message for
    /// kube-scheduler (`node-7: no GPU with …`).
    pub fn check(
        &self,
        name: &str,
        pod: &PodRequest,
        now: u64,
    ) -> Result<(Vec<ContainerAssignment>, u32), String> {
        let Some(e) = self.nodes.get(name) else {
            return Err(format!(
                "{name}: not known to the vGPU extender (no Node object seen)"
            ));
        };
        if let Some(why) = self.unusable(name, e, now) {
            return Err(why);
        }
        placement::place_scored_with(&e.gpus, pod, self.frag()).map_err(|u| format!("{name}: {u}"))
    }

    /// Whether `pod` fits on node `name` now, and its score, or the message; the same decision as
    /// [`Cluster::check`] without building the placement. For many nodes, [`Cluster::scorer`].
    pub fn score(&self, name: &str, pod: &PodRequest, now: u64) -> Result<u32, String> {
        self.scorer(pod, now).score(name)
    }

    /// Scores `pod` against nodes by name, from the dense copy; `now` is Unix seconds.
    pub fn scorer<'a>(&'a self, pod: &'a PodRequest, now: u64) -> Scorer<'a> {
        let verdicts = if pod.filter.typed() {
            let groups: Vec<bool> = self
                .models
                .lower
                .iter()
                .map(|m| pod.filter.type_ok_lower(m))
                .collect();
            self.models
                .group
                .iter()
                .map(|&g| groups.get(g as usize).copied().unwrap_or(false))
                .collect()
        } else {
            Vec::new()
        };
        Scorer {
            cluster: self,
            pod,
            now,
            verdicts,
            frag: self.frag(),
        }
    }

    /// [`Cluster::score`] from the node entries (the reference the dense copy must agree with).
    fn score_cold(&self, name: &str, pod: &PodRequest, now: u64) -> Result<u32, String> {
        let Some(e) = self.nodes.get(name) else {
            return Err(format!(
                "{name}: not known to the vGPU extender (no Node object seen)"
            ));
        };
        if let Some(why) = self.unusable(name, e, now) {
            return Err(why);
        }
        placement::score_buf(&e.gpus, pod, &mut PlaceBuf::default(), self.frag())
            .map_err(|m| format!("{name}: {}", m.to_unfit(&e.gpus, pod)))
    }

    /// Places `pod` (uid `uid`) on `node` and records the assumption; fails, changing nothing, when
    /// it does not fit there any more. A previous placement of the same pod is replaced.
    pub fn assume(
        &mut self,
        uid: &str,
        node: &str,
        pod: &PodRequest,
        now: u64,
        at: Instant,
    ) -> Result<PodAssignment, String> {
        self.expire(at);
        let previous = self.unplace(uid);
        match self.check(node, pod, now) {
            Ok((containers, _)) => {
                self.assumed.insert(uid.to_string(), at);
                self.set_host(uid, Some((node, pod.host)));
                self.apply_pod_types(uid, &pod.filter);
                self.place_entry(
                    uid,
                    Placed {
                        node: node.to_string(),
                        containers: containers.clone(),
                        assumed: Some(at),
                        shapes: Vec::new(),
                    },
                );
                Ok(PodAssignment::new(node, containers))
            }
            Err(e) => {
                if let Some(p) = previous {
                    self.place_entry(uid, p);
                }
                Err(e)
            }
        }
    }

    /// Drops a pod's placement after its bind failed and was rolled back (whether or not the
    /// watch has already shown the annotation that was written).
    pub fn forget(&mut self, uid: &str) {
        self.assumed.remove(uid);
        self.set_host(uid, None);
        self.unplace(uid);
    }

    /// Forgets assumptions older than the time limit; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let ttl = self.assume_ttl;
        let old: Vec<String> = self
            .assumed
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) > ttl)
            .map(|(u, _)| u.clone())
            .collect();
        for uid in &old {
            tracing::warn!(%uid, "assumed pod never seen with its assignment; forgetting it");
            self.assumed.remove(uid);
            self.set_host(uid, None);
            self.unplace(uid);
        }
        old.len()
    }

    /// The assignment of pod `uid` when it is assumed (not yet seen back from the API) on `node`:
    /// what a filter that chose the node holds for the bind.
    pub fn assumed_on(&self, uid: &str, node: &str) -> Option<PodAssignment> {
        if !self.assumed.contains_key(uid) {
            return None;
        }
        let p = self.pods.get(uid).filter(|p| p.node == node)?;
        Some(PodAssignment::new(node, p.containers.clone()))
    }

    /// Whether pod `uid` is assumed (not yet seen back from the API with its assignment).
    pub fn is_assumed(&self, uid: &str) -> bool {
        self.assumed.contains_key(uid)
    }

    /// Number of assumed pods.
    pub fn assumed(&self) -> usize {
        self.assumed.len()
    }

    /// Number of pods whose CPU and memory are counted on a node.
    pub fn host_pods(&self) -> usize {
        self.hosts.pods()
    }

    /// Number of pods counted (assumed or seen).
    pub fn placed_pods(&self) -> usize {
        self.pods.len()
    }

    /// Node counts by state; `now` is Unix seconds.
    pub fn node_counts(&self, now: u64) -> NodeCounts {
        let mut c = NodeCounts::default();
        for (name, e) in &self.nodes {
            match (&e.inventory, self.unusable(name, e, now)) {
                (Inventory::Unseen, _) => {}
                (Inventory::Missing | Inventory::Bad(_), _) => c.no_inventory += 1,
                (Inventory::Devices(_), Some(_)) => c.stale += 1,
                (Inventory::Devices(_), None) => c.ready += 1,
            }
        }
        c
    }

    /// Every GPU with its placed totals.
    pub fn gpus(&self) -> Vec<GpuReport> {
        let mut out = Vec::new();
        for (name, e) in &self.nodes {
            for g in e.gpus.gpus() {
                out.push(GpuReport {
                    node: name.clone(),
                    uuid: g.uuid.clone(),
                    memory_mib: g.memory_mib,
                    used_mib: g.used_mib,
                    cores: g.cores,
                    used_cores: g.used_cores,
                    healthy: g.usable,
                });
            }
        }
        out
    }

    /// The GPUs of one node with usage, for tests and diagnostics.
    pub fn node_gpus(&self, name: &str) -> Option<&NodeGpus> {
        self.nodes.get(name).map(|e| &e.gpus)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vgpu_core::assignment::DeviceSlice;
    use vgpu_core::placement::ContainerRequest;
    use vgpu_core::request::{Memory, VgpuRequest};
    use vgpu_core::time::format_rfc3339;

    const NOW: u64 = 1_800_000_000;

    fn inventory(gpus: &[(&str, u64)]) -> String {
        NodeInventory::new(
            gpus.iter()
                .enumerate()
                .map(|(i, (uuid, mib))| DeviceInfo {
                    uuid: uuid.to_string(),
                    index: i as u32,
                    model: "NVIDIA T4".into(),
                    memory_mib: *mib,
                    cores: 100,
                    split: 10,
                    numa: None,
                    healthy: true,
                    vendor: String::new(),
                    nvlinks: Default::default(),
                })
                .collect(),
        )
        .encode()
    }

    fn cluster() -> Cluster {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW - 10);
        c.apply_node("n1", Some(&inventory(&[("GPU-a", 8192)])), Some(&hb), None);
        c
    }

    fn mib(m: u64) -> PodRequest {
        PodRequest::simple(vec![ContainerRequest {
            name: "main".into(),
            request: VgpuRequest {
                gpus: 1,
                memory: Memory::Mib(m),
                cores: 0,
            },
        }])
    }

    fn assignment(node: &str, uuid: &str, m: u64) -> PodAssignment {
        PodAssignment::new(
            node,
            vec![ContainerAssignment {
                name: "main".into(),
                devices: vec![DeviceSlice {
                    uuid: uuid.into(),
                    memory_mib: m,
                    cores: 0,
                    exclusive: false,
                }],
            }],
        )
    }

    #[test]
    fn stale_missing_and_unknown_nodes_fail_with_reasons() {
        let mut c = cluster();
        assert!(c.check("n1", &mib(1), NOW).is_ok());
        assert_eq!(
            c.check("n1", &mib(1), NOW + 100).unwrap_err(),
            "n1: device-plugin heartbeat is 110s old (limit 60s)"
        );
        c.apply_node("n2", None, None, None);
        assert!(c
            .check("n2", &mib(1), NOW)
            .unwrap_err()
            .starts_with("n2: no vGPU inventory (annotation vgpu.io/node-devices missing"));
        c.apply_node("n3", Some(&inventory(&[("GPU-x", 1)])), None, None);
        assert_eq!(
            c.check("n3", &mib(1), NOW).unwrap_err(),
            "n3: no device-plugin heartbeat (annotation vgpu.io/node-heartbeat)"
        );
        c.apply_node("n4", Some("{"), None, None);
        assert!(c
            .check("n4", &mib(1), NOW)
            .unwrap_err()
            .starts_with("n4: annotation vgpu.io/node-devices is not valid"));
        assert_eq!(
            c.check("zz", &mib(1), NOW).unwrap_err(),
            "zz: not known to the vGPU extender (no Node object seen)"
        );
        assert_eq!(
            c.node_counts(NOW),
            NodeCounts {
                ready: 1,
                stale: 1,
                no_inventory: 2
            }
        );
    }

    #[test]
    fn cordoned_gpus_refuse_new_pods_and_keep_theirs_counted() {
        let mut c = cluster();
        c.apply_pod(
            "u1",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 4096)),
            false,
        );
        let hb = format_rfc3339(NOW - 10);
        let inv = inventory(&[("GPU-a", 8192)]);
        c.apply_node("n1", Some(&inv), Some(&hb), Some("gpu-a"));
        assert_eq!(
            c.check("n1", &mib(1), NOW).unwrap_err(),
            "n1: no GPU outside the cordon (node annotation hami.io/device-cordon)"
        );
        assert_eq!(
            c.scorer(&mib(1), NOW).score("n1").unwrap_err(),
            "n1: no GPU outside the cordon (node annotation hami.io/device-cordon)"
        );
        // Lifted: the running pod's 4096 MiB were counted all along.
        c.apply_node("n1", Some(&inv), Some(&hb), Some(" "));
        assert!(c.check("n1", &mib(4096), NOW).is_ok());
        assert!(c.check("n1", &mib(4097), NOW).is_err());
    }

    #[test]
    fn pods_count_and_finished_or_deleted_pods_free_their_gpus() {
        let mut c = cluster();
        c.apply_pod(
            "u1",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 6144)),
            false,
        );
        assert_eq!(
            c.check("n1", &mib(4096), NOW).unwrap_err(),
            "n1: no GPU with 4096 MiB free (largest 2048 MiB on GPU-a)"
        );
        c.apply_pod(
            "u1",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 6144)),
            true,
        );
        assert!(c.check("n1", &mib(4096), NOW).is_ok());
        c.apply_pod("u2", None, Some(assignment("n1", "GPU-a", 6144)), false);
        assert!(c.check("n1", &mib(4096), NOW).is_err());
        c.delete_pod("u2");
        assert!(c.check("n1", &mib(4096), NOW).is_ok());
        // A pod seen before its node: counted once the node appears.
        c.apply_pod(
            "u3",
            Some("n9"),
            Some(assignment("n9", "GPU-z", 8000)),
            false,
        );
        c.apply_node(
            "n9",
            Some(&inventory(&[("GPU-z", 8192)])),
            Some(&format_rfc3339(NOW)),
            None,
        );
        assert!(c.check("n9", &mib(1024), NOW).is_err());
        assert_eq!(c.placed_pods(), 1);
    }

    #[test]
    fn assumptions_hold_capacity_until_seen_forgotten_or_expired() {
        let mut c = cluster();
        let t0 = Instant::now();
        let a = c.assume("u1", "n1", &mib(6144), NOW, t0).unwrap();
        assert_eq!(a.containers[0].devices[0].uuid, "GPU-a");
        // A second pod in flight does not get the same memory.
        assert_eq!(
            c.assume("u2", "n1", &mib(6144), NOW, t0).unwrap_err(),
            "n1: no GPU with 6144 MiB free (largest 2048 MiB on GPU-a)"
        );
        // The watch shows u1 before our patch: the assumption stands.
        c.apply_pod("u1", None, None, false);
        assert!(c.check("n1", &mib(4096), NOW).is_err());
        // ... and then with it: counted once, not twice.
        c.apply_pod("u1", Some("n1"), Some(a), false);
        assert_eq!(c.assumed(), 0);
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 6144);
        // Rollback frees the capacity.
        c.delete_pod("u1");
        c.assume("u3", "n1", &mib(6144), NOW, t0).unwrap();
        c.forget("u3");
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
        // Expiry.
        c.assume("u4", "n1", &mib(6144), NOW, t0).unwrap();
        assert_eq!(c.expire(t0 + Duration::from_secs(301)), 1);
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
        // Re-assuming the same pod replaces its own previous placement.
        c.assume("u5", "n1", &mib(6144), NOW, t0).unwrap();
        c.assume("u5", "n1", &mib(6144), NOW, t0).unwrap();
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 6144);
    }

    /// `gap-aware` prices solved for one live table carry over to the next while the share mix
    /// stays close (a burst of binds solves the LP once), and are solved again when it moves.
    #[test]
    fn gap_prices_carry_over_while_the_placed_mix_stays_close() {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW);
        let gpus: Vec<(String, u64)> = (0..40).map(|i| (format!("GPU-{i}"), 10000)).collect();
        let gpu_refs: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
        c.apply_node("n1", Some(&inventory(&gpu_refs)), Some(&hb), None);
        let place = |c: &mut Cluster, i: usize, mib: u64| {
            c.apply_pod(
                &format!("u{i}"),
                Some("n1"),
                Some(assignment("n1", &format!("GPU-{i}"), mib)),
                false,
            );
        };
        // Ten 40 % and ten 60 % pods; the prices are solved on first use.
        for i in 0..20 {
            place(&mut c, i, if i % 2 == 0 { 4000 } else { 6000 });
        }
        let t = c.typical_pods().unwrap();
        assert!(!t.gaps_solved());
        let prices = t.gaps().clone();
        // One more 40 % pod: a new table, the same prices without a solve.
        place(&mut c, 20, 4000);
        let t = c.typical_pods().unwrap();
        assert!(t.gaps_solved());
        assert_eq!(t.gaps(), &prices);
        // Ten more 40 % pods move the mix past 1.25x: solved again.
        for i in 21..31 {
            place(&mut c, i, 4000);
        }
        assert!(!c.typical_pods().unwrap().gaps_solved());
    }

    /// The typical-pod table follows the placed pods (shapes from their assignments on the
    /// node's cards), and a `fragmentation` GPU policy then picks another GPU than binpack.
    /// `gap-aware` reads every pod's CPU and memory on its node: a node whose CPU a plain pod
    /// has taken ranks below one with the same GPUs and CPU to spare, and the extender's own
    /// binds count until the watch shows them.
    #[test]
    fn gap_aware_sees_cpu_taken_by_any_pod() {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW);
        for n in ["n1", "n2"] {
            let gpus = [(format!("GPU-{n}a"), 10000), (format!("GPU-{n}b"), 10000)];
            let gpus: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
            c.apply_node(n, Some(&inventory(&gpus)), Some(&hb), None);
        }
        let shapes = [crate::typical::TypicalShape {
            gpus: 1,
            percent: 50,
            count: 10,
            cpu: Some("4".into()),
            memory: Some("8Gi".into()),
        }];
        c.set_typical_pods(Some(crate::typical::table(&shapes)));
        let mut pod = PodRequest::simple(vec![ContainerRequest {
            name: "main".into(),
            request: VgpuRequest {
                gpus: 1,
                memory: Memory::Percent(50),
                cores: 0,
            },
        }]);
        pod.node_policy = placement::Policy::GapAware;
        pod.gpu_policy = placement::Policy::GapAware;
        pod.host = HostRequest {
            cpu_milli: 4000,
            mem_mib: 8192,
        };
        let rank = |c: &Cluster, n: &str| {
            let s = c.scorer(&pod, NOW);
            s.standing_at(n, &mut None, &mut PlaceBuf::default())
                .map(|s| s.rank)
                .unwrap()
        };
        // No allocatable known: the GPU-only measure, the two nodes alike.
        c.apply_pod_host(
            "plain",
            Some("n1"),
            HostRequest {
                cpu_milli: 12_000,
                mem_mib: 1024,
            },
            false,
        );
        assert_eq!(rank(&c, "n1"), rank(&c, "n2"));
        let alloc = Some(HostLeft {
            cpu_milli: 16_000,
            mem_mib: 65_536,
            model: 0,
        });
        let before = c.generation();
        c.apply_allocatable("n1", alloc);
        c.apply_allocatable("n2", alloc);
        assert!(c.generation() > before);
        // n1 keeps 4 cores: the pod would leave 1.5 idle GPUs with no CPU to serve them.
        assert!(
            rank(&c, "n1") < rank(&c, "n2"),
            "{} {}",
            rank(&c, "n1"),
            rank(&c, "n2")
        );
        // The plain pod finishes: alike again.
        c.apply_pod_host("plain", Some("n1"), HostRequest::default(), true);
        assert_eq!(rank(&c, "n1"), rank(&c, "n2"));
        // A bind counts its CPU at once, and keeps counting while the watch still shows the
        // pod unbound.
        c.assume("u1", "n2", &pod, NOW, Instant::now()).unwrap();
        let left = |c: &Cluster| c.hosts.left("n2").map(|l| l.cpu_milli);
        assert_eq!(left(&c), Some(12_000));
        c.apply_pod_host("u1", None, pod.host, false);
        assert_eq!(left(&c), Some(12_000));
        c.forget("u1");
        assert_eq!(left(&c), Some(16_000));
    }

    /// A placed pod's GPU-type lists count in its kind as the model groups they allow, and the
    /// node's model reaches the measure (the simulator's `ours` does the same with its lists).
    #[test]
    fn typed_pods_count_with_the_models_they_allow() {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW);
        let mut inv = |node: &str, model: &str| {
            let d = DeviceInfo {
                uuid: format!("GPU-{node}"),
                index: 0,
                model: model.into(),
                memory_mib: 10000,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            };
            c.apply_node(
                node,
                Some(&NodeInventory::new(vec![d]).encode()),
                Some(&hb),
                None,
            );
        };
        inv("a", "NVIDIA A100");
        inv("t", "NVIDIA T4");
        let filter = GpuFilter::from_annotations(|k| {
            (k == vgpu_core::annotations::USE_GPU_TYPE).then_some("a100")
        });
        c.apply_pod_types("u1", &filter);
        c.apply_pod("u1", Some("a"), Some(assignment("a", "GPU-a", 5000)), false);
        c.apply_pod("u2", Some("t"), Some(assignment("t", "GPU-t", 5000)), false);
        let masks: Vec<u64> = c.kinds().iter().map(|(k, _)| k.shape.models.0).collect();
        // Groups are numbered as first seen: a100 is 0, t4 is 1.
        assert_eq!(masks, [0, 0b1], "{masks:?}");
        let set = |c: &Cluster, name: &'static str| {
            let view = c.dense.get(name).unwrap();
            DenseSet {
                hot: view.gpus,
                verdicts: &[],
                models: &c.models,
                nodes: &c.nodes,
                hosts: &c.hosts,
                name,
                cold: OnceCell::new(),
            }
            .host_left()
        };
        // No allocatable yet: no host terms; then the node's model group comes with them.
        assert_eq!(set(&c, "t"), None);
        let alloc = Some(HostLeft {
            cpu_milli: 8000,
            mem_mib: 8192,
            model: 0,
        });
        c.apply_allocatable("a", alloc);
        c.apply_allocatable("t", alloc);
        assert_eq!(set(&c, "a").map(|h| h.model), Some(0));
        assert_eq!(set(&c, "t").map(|h| h.model), Some(1));
        c.delete_pod("u1");
        assert!(c.typed.is_empty());
    }

    /// Binds and deletes that barely move the placed mix keep the live table (and so every
    /// remembered standing); a real change of the mix rebuilds it.
    #[test]
    fn binds_keep_the_table_while_the_mix_stays_close() {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW);
        let gpus: Vec<(String, u64)> = (0..64).map(|i| (format!("GPU-{i}"), 10000)).collect();
        let gpus: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
        c.apply_node("n1", Some(&inventory(&gpus)), Some(&hb), None);
        for i in 0..600 {
            let a = assignment("n1", &format!("GPU-{}", i % 64), 1000);
            c.apply_pod(&format!("u{i}"), Some("n1"), Some(a), false);
        }
        assert!(c.typical_pods().is_some());
        let epoch = c.table_epoch();
        let mut pod = mib(1000);
        pod.node_policy = placement::Policy::GapAware;
        c.assume("new", "n1", &pod, NOW, Instant::now()).unwrap();
        c.forget("new");
        c.delete_pod("u0");
        assert!(c.typical_pods().is_some());
        assert_eq!(c.table_epoch(), epoch);
        // Three in a hundred pods of another size: rebuilt.
        for i in 600..620 {
            let a = assignment("n1", &format!("GPU-{}", i % 64), 5000);
            c.apply_pod(&format!("u{i}"), Some("n1"), Some(a), false);
            c.typical_pods();
        }
        assert!(c.table_epoch() > epoch);
    }

    #[test]
    fn typical_pods_come_from_placed_pods_and_steer_the_fragmentation_policy() {
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let hb = format_rfc3339(NOW);
        c.apply_node(
            "n1",
            Some(&inventory(&[("GPU-a", 10000), ("GPU-b", 10000)])),
            Some(&hb),
            None,
        );
        assert!(c.typical_pods().is_none());
        // The placed pods: 40 % and 50 % of a card.
        c.apply_pod(
            "u1",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 4000)),
            false,
        );
        c.apply_pod(
            "u2",
            Some("n1"),
            Some(assignment("n1", "GPU-b", 5000)),
            false,
        );
        let before = c.generation();
        let t = c.typical_pods().unwrap().clone();
        // Both shapes are typical: a GPU with 45 % free fits the 40 % pod only.
        assert!(t.fragmentation(&[450]) > 0.0 && t.fragmentation(&[500]) == 0.0);
        // A 10 % pod: binpack takes the fuller GPU-b (50 % free -> 40 %), fragmentation GPU-a
        // (60 % free -> 50 %: still room for either typical pod; GPU-b keeps 50 %).
        let mut pod = PodRequest::simple(vec![ContainerRequest {
            name: "main".into(),
            request: VgpuRequest {
                gpus: 1,
                memory: Memory::Percent(10),
                cores: 0,
            },
        }]);
        pod.gpu_policy = placement::Policy::Binpack;
        let (a, _) = c.check("n1", &pod, NOW).unwrap();
        assert_eq!(a[0].devices[0].uuid, "GPU-b");
        pod.gpu_policy = placement::Policy::Fragmentation;
        let a = c.assume("u3", "n1", &pod, NOW, Instant::now()).unwrap();
        assert_eq!(a.containers[0].devices[0].uuid, "GPU-a");
        assert!(c.generation() > before);
        // Pods leaving take their shapes with them; a file's table replaces the live one.
        for u in ["u1", "u2", "u3"] {
            c.delete_pod(u);
        }
        assert!(c.typical_pods().is_none());
        c.set_typical_pods(Some(t.clone()));
        assert_eq!(c.typical_pods(), Some(&t));
        c.apply_pod(
            "u4",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 9000)),
            false,
        );
        assert_eq!(c.typical_pods(), Some(&t));
    }

    #[test]
    fn relists_drop_what_is_gone_but_keep_assumptions() {
        let mut c = cluster();
        c.apply_pod(
            "u1",
            Some("n1"),
            Some(assignment("n1", "GPU-a", 1000)),
            false,
        );
        let listed_from = Instant::now();
        c.assume("u2", "n1", &mib(1000), NOW, listed_from).unwrap();
        c.retain_pods(&HashSet::new(), listed_from);
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 1000);
        assert_eq!(c.assumed(), 1);
        // A pod assumed before a list began and missing from it was deleted during the outage
        // that forced the list: its memory is free again (it was counted until the assume TTL).
        c.retain_pods(&HashSet::new(), listed_from + Duration::from_millis(1));
        assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
        assert_eq!(c.assumed(), 0);
        c.retain_nodes(&HashSet::new());
        assert!(c.check("n1", &mib(1), NOW).is_err());
        assert_eq!(c.gpus().len(), 0);
    }

    /// The dense copy decides exactly as the node entries do, message for message, through
    /// inventory changes, pods coming and going, stale heartbeats and deleted nodes.
    #[test]
    fn dense_copy_agrees_with_the_entries() {
        use vgpu_core::placement::{GpuFilter, NameList};
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
        let models = [
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A10",
            "Tesla T4",
            "nvidia a10",
        ];
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in 0..60usize {
            let name = format!("n{n}");
            let count = 1 + (n % 5) as u32;
            let devices: Vec<DeviceInfo> = (0..count)
                .map(|i| DeviceInfo {
                    uuid: format!("GPU-{n}-{i}"),
                    index: i,
                    model: models[(n + i as usize) % models.len()].into(),
                    memory_mib: [16384, 24576, 81920][(n + i as usize) % 3],
                    cores: 100,
                    split: 1 + (n as u32 % 4),
                    numa: None,
                    healthy: !(n + i as usize).is_multiple_of(7),
                    vendor: String::new(),
                    nvlinks: Default::default(),
                })
                .collect();
            let hb = match n % 10 {
                0 => None,
                1 => Some(format_rfc3339(NOW - 500)),
                _ => Some(format_rfc3339(NOW - 5)),
            };
            let inv = (n % 13 != 0).then(|| NodeInventory::new(devices.clone()).encode());
            c.apply_node(&name, inv.as_deref(), hb.as_deref(), None);
            for (i, d) in devices.iter().enumerate() {
                if next() % 3 == 0 {
                    continue;
                }
                c.apply_pod(
                    &format!("p{n}-{i}"),
                    Some(&name),
                    Some(PodAssignment::new(
                        &name,
                        vec![ContainerAssignment {
                            name: "c".into(),
                            devices: vec![DeviceSlice {
                                uuid: d.uuid.clone(),
                                memory_mib: next() % d.memory_mib,
                                cores: [0, 10, 50, 100][next() as usize % 4],
                                exclusive: false,
                            }],
                        }],
                    )),
                    false,
                );
            }
        }
        // Changes after the first fill: a bigger inventory, deletions, a pod leaving.
        c.apply_node(
            "n2",
            Some(&inventory(&[
                ("GPU-x1", 8192),
                ("GPU-x2", 8192),
                ("GPU-x3", 4096),
            ])),
            Some(&format_rfc3339(NOW)),
            None,
        );
        c.delete_node("n3");
        c.delete_node("n4");
        c.delete_pod("p5-0");
        let container = |gpus, memory, cores| ContainerRequest {
            name: "c".into(),
            request: VgpuRequest {
                gpus,
                memory,
                cores,
            },
        };
        let mut pods = Vec::new();
        for (gpus, memory, cores) in [
            (1, Memory::Mib(1024), 0),
            (1, Memory::Mib(20000), 30),
            (2, Memory::Percent(25), 10),
            (3, Memory::Mib(4096), 0),
            (1, Memory::Percent(100), 100),
            (1, Memory::Mib(1), 60),
        ] {
            pods.push(PodRequest::simple(vec![container(gpus, memory, cores)]));
        }
        let mut two = PodRequest::simple(vec![
            container(1, Memory::Mib(8192), 20),
            container(2, Memory::Mib(4096), 0),
        ]);
        two.gpu_policy = placement::Policy::Binpack;
        two.node_policy = placement::Policy::Spread;
        pods.push(two);
        for (use_t, nouse_t, use_u, nouse_u) in [
            ("a100", "", "", ""),
            ("", "a10", "", ""),
            ("T4,a10", "a100", "", ""),
            ("", "", "gpu-7-0,GPU-9-1", ""),
            ("", "", "", "GPU-8-0"),
        ] {
            let mut p = PodRequest::simple(vec![container(1, Memory::Mib(2048), 10)]);
            p.filter = GpuFilter {
                use_types: NameList::parse(use_t),
                nouse_types: NameList::parse(nouse_t),
                use_uuids: NameList::parse(use_u),
                nouse_uuids: NameList::parse(nouse_u),
            };
            pods.push(p);
        }
        let mut names: Vec<String> = (0..62).map(|n| format!("n{n}")).collect();
        names.push("unknown".into());
        let (mut passed, mut failed) = (0, 0);
        let mut two_typed = PodRequest::simple(vec![container(2, Memory::Mib(2048), 10)]);
        two_typed.filter = GpuFilter {
            use_types: NameList::parse("a10"),
            ..GpuFilter::default()
        };
        pods.push(two_typed);
        let mut memo_hits = 0;
        for pod in &pods {
            let scorer = c.scorer(pod, NOW);
            // The memoised messages are the plain ones, on a first and a second pass.
            let mut memo = FailMemo::default();
            for n in names.iter().chain(&names) {
                let mut buf = PlaceBuf::default();
                if let Err(f) = scorer.score_lean(n, &mut buf) {
                    let (mut plain, mut memoised) = (String::new(), String::from("x"));
                    scorer.write_fail(&mut plain, n, &f);
                    let before = memo.entries.len();
                    scorer.write_fail_memo(&mut memoised, n, &f, &mut memo);
                    assert_eq!(memoised[1..], plain, "{n} {pod:?}");
                    memo_hits += usize::from(
                        matches!(f, Fail::Miss(_, m) if matches!(m.why, placement::MissReason::Type { .. }))
                            && memo.entries.len() == before,
                    );
                }
            }
            for n in &names {
                let dense = scorer.score(n);
                assert_eq!(dense, c.score_cold(n, pod, NOW), "{n} {pod:?}");
                if dense.is_ok() {
                    passed += 1;
                } else {
                    failed += 1;
                }
            }
        }
        assert!(
            passed > 50 && failed > 50,
            "{passed} passed, {failed} failed"
        );
        assert!(memo_hits > 20, "{memo_hits} memoised type misses");
    }
}
