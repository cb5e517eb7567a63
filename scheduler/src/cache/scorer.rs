//! Scoring one pod against the cached nodes: [`Scorer`] (what a filter or prioritize call does for
//! each candidate, over the dense copy), the memos that make a burst of pods of a few shapes cheap
//! ([`StandingMemo`], [`FailMemo`]), and the dense view of a node's GPUs the placement code reads.

use super::*;

/// Scores one pod against nodes by name: what a filter or prioritize call does for each candidate
/// ([`Cluster::scorer`]). Reads the dense copy; the node entries only for messages.
pub struct Scorer<'a> {
    pub(super) cluster: &'a Cluster,
    pub(super) pod: &'a PodRequest,
    pub(super) now: u64,
    /// The pod's type lists' verdict per model id, when it has type lists.
    pub(super) verdicts: Vec<bool>,
    pub(super) frag: Option<&'a LiveFrag>,
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
    pub(super) entries: Vec<(usize, usize, Vec<u32>, String)>,
}

/// More distinct model sets than this in one scan are written out each time.
const FAIL_MEMO_MAX: usize = 64;

/// A node's GPUs as the dense copy holds them; UUIDs come from the node entry, found only when a
/// UUID list, a message or an assignment needs them.
pub(super) struct DenseSet<'a> {
    pub(super) hot: &'a [GpuHot],
    pub(super) verdicts: &'a [bool],
    pub(super) models: &'a Models,
    pub(super) nodes: &'a NodeMap<NodeEntry>,
    pub(super) hosts: &'a Hosts,
    pub(super) name: &'a str,
    pub(super) cold: OnceCell<Option<&'a NodeGpus>>,
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
