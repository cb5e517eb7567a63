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
use std::hash::BuildHasherDefault;
use std::time::{Duration, Instant};

use std::cell::OnceCell;

use vgpu_core::assignment::{ContainerAssignment, PodAssignment};
use vgpu_core::inventory::{DeviceInfo, NodeInventory};
use vgpu_core::placement::frag::{typical_pods, ModelMask, PodShape};
use vgpu_core::placement::host::{HostLeft, HostRequest, PodKind};
use vgpu_core::placement::live::LiveFrag;
use vgpu_core::placement::{
    self, Gpu, GpuFilter, GpuHot, GpuSet, Miss, NameList, NodeGpus, PlaceBuf, PodRequest, Standing,
};

use crate::dense::{self, Dense};
use crate::fxhash::FxHasher;
use crate::hosts::Hosts;

/// A map keyed by node name with [`FxHasher`].
type NodeMap<V> = HashMap<String, V, BuildHasherDefault<FxHasher>>;

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

mod scorer;
#[cfg(test)]
use scorer::DenseSet;
pub use scorer::{Fail, FailMemo, MemoSlot, Scorer, StandingMemo};

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
    /// `hami.io/device-cordon`); whether its GPUs or cordon changed.
    pub fn apply_node(
        &mut self,
        name: &str,
        inventory: Option<&str>,
        heartbeat: Option<&str>,
        cordon: Option<&str>,
    ) -> bool {
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
        changed
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

    /// Sets a node's allocatable CPU and memory, from its Node object (`None`: not known); whether
    /// they changed.
    pub fn apply_allocatable(&mut self, name: &str, allocatable: Option<HostLeft>) -> bool {
        let changed = self.hosts.set_allocatable(name, allocatable);
        if changed {
            self.sync(name);
        }
        changed
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
mod tests;
