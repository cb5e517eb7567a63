//! GPU placement: which physical GPUs of one node each vGPU container of a pod gets, and how good
//! that node is for the pod. Pure functions over a node's GPUs and what is already placed on them,
//! so the scheduler extender and the simulator run the same code.
//!
//! A container asking for `n` vGPUs gets `n` distinct GPUs of the node, each with
//!
//! - a healthy device of the NVIDIA vendor type,
//! - a model allowed by `nvidia.com/use-gputype` and not refused by `nvidia.com/nouse-gputype`
//!   (comma lists; an entry matches when the model contains it, ignoring case, as HAMi's `checkType`),
//! - a UUID allowed by `nvidia.com/use-gpuuuid` and not refused by `nvidia.com/nouse-gpuuuid`
//!   (comma lists of exact UUIDs, ignoring case),
//! - not cordoned: the node annotation `hami.io/device-cordon` (HAMi's: a comma list of GPU
//!   UUIDs) keeps new pods off the GPUs it names; pods already there keep running,
//! - fewer slices in use than the device's split count,
//! - the requested gpucores free (0 asks for no share; 100 asks for the card alone, so the card must
//!   hold no slice at all, and nothing else may join it afterwards; a pod whose
//!   `hami.io/gpu-scheduler-policy` lists `mutex` holds each of its GPUs alone the same way,
//!   with only the cores it asks for),
//! - the requested gpumem free (a percentage resolves against that card's memory).
//!
//! Containers of one pod are placed in order and see each other's slices, so two containers may
//! share a GPU (within its limits) but one container never holds the same GPU twice.
//!
//! Policies (`hami.io/node-scheduler-policy`, `hami.io/gpu-scheduler-policy`, HAMi-compatible):
//! `binpack` fills the most used GPUs (and nodes) first, `spread` the least used; with a table of
//! typical pods, `fragmentation` (FGD, [`frag`]) and `gap-aware` (FGD plus LP-priced gaps,
//! [`gaps`]) score what the typical pods could still use after the move. The GPU policy is a
//! comma list as in HAMi v2.10 (`binpack,mutex`): its first ordering policy orders the GPUs (the
//! scheduler's default when it names none), `mutex` adds the rule above ([`GpuPolicy`]).
//!
//! Topology (HAMi's `topology-aware` and `numa` words, and the pod annotation
//! `nvidia.com/numa-bind`), for the GPUs each container gets among those that fit:
//! `topology-aware` gives a container of several GPUs the set joined by the most NVLinks (the
//! node inventory's `nvlinks`; ties: the policy's order) and a one-GPU container the GPU with the
//! fewest NVLinks, keeping linked sets free; `numa` takes a container's GPUs from one NUMA node
//! when one has enough, `nvidia.com/numa-bind: "true"` insists (the node fails otherwise).

pub mod frag;
pub mod gaps;
pub mod host;

use std::fmt;

use thiserror::Error;

use crate::annotations::{
    GPU_POLICY, NODE_POLICY, NOUSE_GPU_TYPE, NOUSE_GPU_UUID, USE_GPU_TYPE, USE_GPU_UUID,
};

/// The word of `hami.io/gpu-scheduler-policy` that asks for GPUs nothing else uses.
pub const MUTEX: &str = "mutex";
/// The word of `hami.io/gpu-scheduler-policy` that asks for NVLink-joined GPUs.
pub const TOPOLOGY_AWARE: &str = "topology-aware";
/// The word of `hami.io/gpu-scheduler-policy` that prefers a container's GPUs on one NUMA node.
pub const NUMA: &str = "numa";
/// Pod annotation that requires a container's GPUs on one NUMA node (HAMi's, Go `ParseBool`).
pub const NUMA_BIND: &str = "nvidia.com/numa-bind";
/// Largest candidate set whose subsets `topology-aware` tries one by one (beyond: greedy).
const TOPOLOGY_EXACT_MAX: usize = 16;
use crate::assignment::{ContainerAssignment, DeviceSlice};
use crate::inventory::DeviceInfo;
use crate::request::VgpuRequest;
use host::{HostLeft, HostRequest};

/// The gpucores value that asks for a whole card, exclusively.
pub const EXCLUSIVE_CORES: u32 = 100;

/// The highest node score [`place_scored`] gives (kube-scheduler's `MaxExtenderPriority`).
pub const MAX_SCORE: u32 = 10;

/// How to order nodes, or GPUs within a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Policy {
    /// Most used first: keeps whole cards and nodes free for large requests.
    #[default]
    Binpack,
    /// Least used first: spreads load and interference.
    Spread,
    /// Fragmentation-aware (FGD, "Beware of Fragmentation", ATC'23): as a node policy, nodes
    /// whose fragmentation against the typical pods grows least score highest; as a GPU policy, a
    /// one-GPU pod takes the GPU that leaves its node least fragmented. Needs a typical-pod table
    /// ([`frag::LiveFrag`]); without one it acts as `binpack`.
    Fragmentation,
    /// `fragmentation` plus what each GPU's gap is still worth ([`gaps`]): the node measure adds
    /// the unusable part of every GPU's free share at LP prices of the typical share sizes, so a
    /// pod goes where it spoils no gap the typical pods could still fill (a 47 % pod next to a
    /// lone 47 %, a 16 % pod into an 81 %'s hole). The simulator's `ours-live`. Needs the
    /// typical-pod table; without one it acts as `binpack`.
    GapAware,
}

impl Policy {
    /// The policy's name as annotations and flags spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Binpack => "binpack",
            Policy::Spread => "spread",
            Policy::Fragmentation => "fragmentation",
            Policy::GapAware => "gap-aware",
        }
    }

    /// Whether the policy scores against the typical-pod table.
    pub fn uses_table(self) -> bool {
        matches!(self, Policy::Fragmentation | Policy::GapAware)
    }

    /// Every policy name, for messages.
    pub const NAMES: &'static str = "binpack, spread, fragmentation, gap-aware";

    /// Reads a policy name (case-insensitive, surrounding spaces ignored).
    pub fn parse(s: &str) -> Option<Policy> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("binpack") {
            Some(Policy::Binpack)
        } else if s.eq_ignore_ascii_case("spread") {
            Some(Policy::Spread)
        } else if s.eq_ignore_ascii_case("fragmentation") {
            Some(Policy::Fragmentation)
        } else if s.eq_ignore_ascii_case("gap-aware") {
            Some(Policy::GapAware)
        } else {
            None
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::parse(s).ok_or_else(|| format!("{s:?} is not one of {}", Policy::NAMES))
    }
}

/// One physical GPU with what is already placed on it. Build it with [`Gpu::from_device`]; the
/// capacity fields are for reading (scores use factors derived from them at construction), the
/// usage fields change through [`Gpu::add`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Vendor UUID.
    pub uuid: String,
    /// Index on the node.
    pub index: u32,
    /// Model name as reported.
    pub model: String,
    /// `model`, lower-cased once so type matching does not allocate.
    model_lower: String,
    /// Index within its node of the first GPU with the same model (set by [`NodeGpus::new`]), so
    /// type lists are tested once per distinct model.
    model_first: usize,
    /// [`permille_scale`] of `memory_mib`.
    mem_scale: u64,
    /// [`permille_scale`] of `cores`.
    cores_scale: u64,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// Compute capacity in percent (100 unscaled).
    pub cores: u32,
    /// How many slices may share the device (at least 1).
    pub split: u32,
    /// Whether work may be placed here: healthy and of a vendor this placement handles.
    pub usable: bool,
    /// Device memory already placed, MiB.
    pub used_mib: u64,
    /// Cores already placed, percent.
    pub used_cores: u32,
    /// Slices already placed.
    pub slices: u32,
    /// Whether a slice holds the card exclusively (gpucores 100, or a `mutex` pod's).
    pub exclusive: bool,
    /// Whether the node's `hami.io/device-cordon` names it: no new slice goes here.
    pub cordoned: bool,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// NVLinks to the node's other GPUs, by peer UUID.
    pub nvlinks: std::collections::BTreeMap<String, u32>,
}

impl Gpu {
    /// An idle GPU from its inventory entry. Devices of another vendor than NVIDIA are not usable.
    pub fn from_device(d: &DeviceInfo) -> Gpu {
        let nvidia = d.vendor.is_empty() || d.vendor.eq_ignore_ascii_case("nvidia");
        Gpu {
            uuid: d.uuid.clone(),
            index: d.index,
            model: d.model.clone(),
            model_lower: d.model.to_ascii_lowercase(),
            model_first: 0,
            mem_scale: permille_scale(d.memory_mib),
            cores_scale: permille_scale(u64::from(d.cores)),
            memory_mib: d.memory_mib,
            cores: d.cores,
            split: d.split.max(1),
            usable: d.healthy && nvidia,
            used_mib: 0,
            used_cores: 0,
            slices: 0,
            exclusive: false,
            cordoned: false,
            numa: d.numa,
            nvlinks: d.nvlinks.clone(),
        }
    }

    /// `model`, lower-cased.
    pub fn model_lower(&self) -> &str {
        &self.model_lower
    }

    /// Counts one placed slice against this GPU.
    pub fn add(&mut self, s: &DeviceSlice) {
        self.used_mib = self.used_mib.saturating_add(s.memory_mib);
        self.used_cores = self.used_cores.saturating_add(s.cores);
        self.slices = self.slices.saturating_add(1);
        self.exclusive |= s.exclusive || s.cores >= EXCLUSIVE_CORES;
    }

    /// Device memory still free, MiB.
    pub fn free_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.used_mib)
    }

    /// Cores still free, percent.
    pub fn free_cores(&self) -> u32 {
        self.cores.saturating_sub(self.used_cores)
    }

    /// The fields placement reads for every candidate, packed; its [`GpuHot::model_key`] is this
    /// GPU's model key within its node.
    pub fn hot(&self) -> GpuHot {
        let mut h = GpuHot {
            memory_mib: self.memory_mib,
            used_mib: self.used_mib,
            mem_scale: self.mem_scale,
            cores_scale: self.cores_scale,
            cores: self.cores,
            used_cores: self.used_cores,
            split: self.split,
            slices: self.slices,
            index: self.index,
            model_key: self.model_first as u32,
            usable: self.usable,
            exclusive: self.exclusive,
            cordoned: self.cordoned,
            use_now: 0,
        };
        h.use_now = h.use_permille(h.used_mib, h.used_cores) as u32;
        h
    }
}

/// The part of a [`Gpu`] that placement reads for every candidate GPU, in one 64-byte record: a
/// filter over thousands of nodes then streams through a dense array of these instead of chasing
/// each node's heap objects (names and UUIDs stay with the [`Gpu`], read only for type and UUID
/// lists, messages and assignments).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuHot {
    memory_mib: u64,
    used_mib: u64,
    mem_scale: u64,
    cores_scale: u64,
    cores: u32,
    used_cores: u32,
    split: u32,
    slices: u32,
    index: u32,
    model_key: u32,
    usable: bool,
    exclusive: bool,
    cordoned: bool,
    /// `use_permille(used_mib, used_cores)`, computed once when the record is made: the node score
    /// sums it over the GPUs placement did not touch (most of them) instead of recomputing it.
    use_now: u32,
}

impl GpuHot {
    /// The same GPU with another model key (a number that GPUs of one model, and only those,
    /// share within the node; type lists are tested once per key).
    pub fn with_model_key(mut self, key: u32) -> GpuHot {
        self.model_key = key;
        self
    }

    /// The model key.
    #[inline]
    pub fn model_key(&self) -> u32 {
        self.model_key
    }

    /// Use in per-mille: the mean of the memory and the cores fractions in use.
    #[inline]
    fn use_permille(&self, used_mib: u64, used_cores: u32) -> u64 {
        let mem = permille(used_mib, self.memory_mib, self.mem_scale);
        let cores = permille(
            u64::from(used_cores),
            u64::from(self.cores),
            self.cores_scale,
        );
        (mem + cores) / 2
    }
}

/// A node's GPUs as placement reads them: the hot record of each for every decision, and names
/// only where a list, a message or an assignment needs them. [`NodeGpus`] is one; a scheduler may
/// keep a dense copy of the hot records of all its nodes and implement this over it.
pub trait GpuSet {
    /// Number of GPUs.
    fn len(&self) -> usize;
    /// Whether the node has no GPU.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The hot record of GPU `i`.
    fn hot(&self, i: usize) -> GpuHot;
    /// Its UUID.
    fn uuid(&self, i: usize) -> &str;
    /// Its model as reported.
    fn model(&self, i: usize) -> &str;
    /// Whether its model passes the pod's type lists (called once per model key and node).
    fn type_ok(&self, i: usize, filter: &GpuFilter) -> bool;
    /// The hot records of all GPUs, when the set holds them as one slice (then placement reads
    /// them in place instead of copying).
    fn hot_slice(&self) -> Option<&[GpuHot]> {
        None
    }
    /// Whether GPUs `i` and `j` are of one model (models are listed once each in messages).
    fn same_model(&self, i: usize, j: usize) -> bool {
        self.hot(i).model_key == self.hot(j).model_key
    }
    /// GPU `i`'s NUMA node, when known.
    fn numa(&self, _i: usize) -> Option<u32> {
        None
    }
    /// NVLinks between GPUs `i` and `j`.
    fn links(&self, _i: usize, _j: usize) -> u32 {
        0
    }
    /// The node's CPU and memory left for new pods, when known (the `gap-aware` measure's host
    /// terms need it).
    fn host_left(&self) -> Option<HostLeft> {
        None
    }
}

impl GpuSet for NodeGpus {
    fn len(&self) -> usize {
        self.gpus.len()
    }
    fn hot(&self, i: usize) -> GpuHot {
        self.gpus[i].hot()
    }
    fn uuid(&self, i: usize) -> &str {
        &self.gpus[i].uuid
    }
    fn model(&self, i: usize) -> &str {
        &self.gpus[i].model
    }
    fn type_ok(&self, i: usize, filter: &GpuFilter) -> bool {
        filter.type_ok_lower(&self.gpus[i].model_lower)
    }
    fn numa(&self, i: usize) -> Option<u32> {
        self.gpus[i].numa
    }
    fn links(&self, i: usize, j: usize) -> u32 {
        let peer = &self.gpus[j].uuid;
        self.gpus[i].nvlinks.get(peer).copied().unwrap_or(0)
    }
}

/// `ceil(1000 * 2^32 / total)`: per-mille by a multiply and a shift instead of a division (a
/// filter over 40 000 GPUs did little else than divide).
fn permille_scale(total: u64) -> u64 {
    (1000u64 << 32).div_ceil(total.max(1))
}

#[inline]
fn permille(used: u64, total: u64, scale: u64) -> u64 {
    if total == 0 {
        return 1000;
    }
    (used.min(total).saturating_mul(scale) >> 32).min(1000)
}

/// A node's GPUs with the slices already placed on them.
///
/// ```
/// use vgpu_core::inventory::DeviceInfo;
/// use vgpu_core::placement::{Gpu, NodeGpus};
///
/// let dev = DeviceInfo { uuid: "GPU-a".into(), index: 0, model: "NVIDIA T4".into(),
///     memory_mib: 15360, cores: 100, split: 4, numa: None, healthy: true, vendor: String::new(),
///     nvlinks: Default::default() };
/// let node = NodeGpus::new(vec![Gpu::from_device(&dev)]);
/// assert_eq!(node.gpus()[0].free_mib(), 15360);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeGpus {
    gpus: Vec<Gpu>,
}

impl NodeGpus {
    /// A node with these GPUs.
    pub fn new(mut gpus: Vec<Gpu>) -> NodeGpus {
        for i in 0..gpus.len() {
            let first = gpus[..i]
                .iter()
                .position(|g| g.model_lower == gpus[i].model_lower)
                .unwrap_or(i);
            gpus[i].model_first = first;
        }
        NodeGpus { gpus }
    }

    /// The GPUs, in inventory order.
    pub fn gpus(&self) -> &[Gpu] {
        &self.gpus
    }

    /// Counts a placed slice against the GPU with its UUID. Returns false when the node has no
    /// such GPU (the slice is then ignored: the device went away).
    pub fn add(&mut self, s: &DeviceSlice) -> bool {
        match self.gpus.iter_mut().find(|g| g.uuid == s.uuid) {
            Some(g) => {
                g.add(s);
                true
            }
            None => false,
        }
    }

    /// Marks the GPUs whose UUID the list names (ignoring case) as cordoned, the others not.
    pub fn cordon(&mut self, uuids: &NameList) {
        for g in &mut self.gpus {
            g.cordoned = uuids.any_equal(&g.uuid);
        }
    }

    /// Counts every slice of a pod's assignment.
    pub fn add_all<'a>(&mut self, containers: impl IntoIterator<Item = &'a ContainerAssignment>) {
        for c in containers {
            for s in &c.devices {
                self.add(s);
            }
        }
    }
}

/// A comma list from an annotation: trimmed, lower-cased, empty entries dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameList(Vec<String>);

impl NameList {
    /// Reads `a, B ,c` into `["a", "b", "c"]`.
    pub fn parse(s: &str) -> NameList {
        NameList(
            s.split(',')
                .map(|p| p.trim().to_ascii_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        )
    }

    /// Whether the list has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, lower-cased.
    pub fn entries(&self) -> &[String] {
        &self.0
    }

    fn any_contained_in(&self, lower: &str) -> bool {
        self.0.iter().any(|t| lower.contains(t.as_str()))
    }

    fn any_equal(&self, s: &str) -> bool {
        self.0.iter().any(|t| t.eq_ignore_ascii_case(s))
    }

    fn joined(&self) -> String {
        self.0.join(",")
    }
}

/// Which GPUs a pod may use, from its annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFilter {
    /// `nvidia.com/use-gputype`: when not empty, the model must contain one entry.
    pub use_types: NameList,
    /// `nvidia.com/nouse-gputype`: the model must contain none.
    pub nouse_types: NameList,
    /// `nvidia.com/use-gpuuuid`: when not empty, the UUID must be one of these.
    pub use_uuids: NameList,
    /// `nvidia.com/nouse-gpuuuid`: the UUID must be none of these.
    pub nouse_uuids: NameList,
}

impl GpuFilter {
    /// The lists a pod's annotations give.
    pub fn from_annotations<'a>(annotation: impl Fn(&str) -> Option<&'a str>) -> GpuFilter {
        let list = |key| annotation(key).map(NameList::parse).unwrap_or_default();
        GpuFilter {
            use_types: list(USE_GPU_TYPE),
            nouse_types: list(NOUSE_GPU_TYPE),
            use_uuids: list(USE_GPU_UUID),
            nouse_uuids: list(NOUSE_GPU_UUID),
        }
    }

    /// Whether a model, lower-cased, passes the type lists.
    pub fn type_ok_lower(&self, model_lower: &str) -> bool {
        (self.use_types.is_empty() || self.use_types.any_contained_in(model_lower))
            && !self.nouse_types.any_contained_in(model_lower)
    }

    /// Whether the type lists say anything.
    #[inline]
    pub fn typed(&self) -> bool {
        !self.use_types.is_empty() || !self.nouse_types.is_empty()
    }

    #[inline]
    fn uuids(&self) -> bool {
        !self.use_uuids.is_empty() || !self.nouse_uuids.is_empty()
    }

    fn uuid_ok(&self, uuid: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.any_equal(uuid))
            && !self.nouse_uuids.any_equal(uuid)
    }
}

/// One vGPU container of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    /// Container name.
    pub name: String,
    /// What it asks for.
    pub request: VgpuRequest,
}

/// Everything placement needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// The vGPU containers, init containers first, in pod-spec order.
    pub containers: Vec<ContainerRequest>,
    /// Which GPUs it may use.
    pub filter: GpuFilter,
    /// Node policy.
    pub node_policy: Policy,
    /// GPU policy: how GPUs are ordered.
    pub gpu_policy: Policy,
    /// Whether the GPU policy lists `mutex`: each GPU the pod gets holds nothing else.
    pub mutex: bool,
    /// Whether the GPU policy lists `topology-aware`.
    pub topology: bool,
    /// Whether the GPU policy lists `numa` (a container's GPUs on one NUMA node when one has
    /// enough).
    pub numa: bool,
    /// `nvidia.com/numa-bind: "true"`: a container's GPUs on one NUMA node, or the node fails.
    pub numa_bind: bool,
    /// The pod's CPU and memory request (the `gap-aware` measure's host terms read it).
    pub host: HostRequest,
}

/// An annotation holding a policy name we do not know.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("annotation {annotation}: {word:?} is not one of {known}")]
pub struct PolicyError {
    /// The annotation key.
    pub annotation: &'static str,
    /// The word we do not know (the whole value for the node policy).
    pub word: String,
    /// The words the annotation takes.
    pub known: &'static str,
}

/// What `hami.io/gpu-scheduler-policy` says: a comma list as HAMi v2.10 reads it
/// (`pkg/scheduler/policy/gpu_policy.go` `gpuSortKeyChain`, `pkg/util/util.go` `PolicyContains`):
/// the first ordering policy orders the GPUs (HAMi breaks its ties with the later ones, we by
/// GPU index), `mutex` asks for GPUs nothing else uses, `topology-aware` for NVLink-joined GPUs,
/// `numa` for one NUMA node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuPolicy {
    /// The ordering policy, if the list names one.
    pub order: Option<Policy>,
    /// Whether the list has `mutex`.
    pub mutex: bool,
    /// Whether the list has `topology-aware`.
    pub topology: bool,
    /// Whether the list has `numa`.
    pub numa: bool,
}

impl GpuPolicy {
    /// Every word the GPU policy takes, for messages.
    pub const NAMES: &'static str =
        "binpack, spread, fragmentation, gap-aware, mutex, topology-aware, numa";

    /// Reads a comma list (words case-insensitive, spaces and empty entries ignored); the
    /// unknown word on error.
    pub fn parse(s: &str) -> Result<GpuPolicy, String> {
        let mut p = GpuPolicy {
            order: None,
            mutex: false,
            topology: false,
            numa: false,
        };
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word.eq_ignore_ascii_case(MUTEX) {
                p.mutex = true;
            } else if word.eq_ignore_ascii_case(TOPOLOGY_AWARE) {
                p.topology = true;
            } else if word.eq_ignore_ascii_case(NUMA) {
                p.numa = true;
            } else {
                let order = Policy::parse(word).ok_or_else(|| word.to_string())?;
                p.order.get_or_insert(order);
            }
        }
        Ok(p)
    }
}

impl PodRequest {
    /// A pod request from its containers and annotations; the policies default to the given ones
    /// when the pod does not choose.
    pub fn from_annotations<'a>(
        containers: Vec<ContainerRequest>,
        annotation: impl Fn(&str) -> Option<&'a str>,
        default_node: Policy,
        default_gpu: Policy,
    ) -> Result<PodRequest, PolicyError> {
        let node_policy = match annotation(NODE_POLICY) {
            None => default_node,
            Some(v) if v.trim().is_empty() => default_node,
            Some(v) => Policy::parse(v).ok_or_else(|| PolicyError {
                annotation: NODE_POLICY,
                word: v.to_string(),
                known: Policy::NAMES,
            })?,
        };
        let gpu = GpuPolicy::parse(annotation(GPU_POLICY).unwrap_or_default()).map_err(|word| {
            PolicyError {
                annotation: GPU_POLICY,
                word,
                known: GpuPolicy::NAMES,
            }
        })?;
        let numa_bind = match annotation(NUMA_BIND).map(str::trim) {
            None | Some("") => false,
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => true,
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => false,
            Some(v) => {
                return Err(PolicyError {
                    annotation: NUMA_BIND,
                    word: v.to_string(),
                    known: "true, false",
                })
            }
        };
        Ok(PodRequest {
            containers,
            filter: GpuFilter::from_annotations(&annotation),
            node_policy,
            gpu_policy: gpu.order.unwrap_or(default_gpu),
            mutex: gpu.mutex,
            topology: gpu.topology,
            numa: gpu.numa,
            numa_bind,
            host: HostRequest::default(),
        })
    }

    /// A pod of these containers with no GPU filter and the default policies.
    pub fn simple(containers: Vec<ContainerRequest>) -> PodRequest {
        PodRequest {
            containers,
            filter: GpuFilter::default(),
            node_policy: Policy::Binpack,
            gpu_policy: Policy::Spread,
            mutex: false,
            topology: false,
            numa: false,
            numa_bind: false,
            host: HostRequest::default(),
        }
    }
}

/// Why a container fits no set of GPUs on a node: the first check, in the order the module
/// documentation lists them, that left fewer GPUs than the container needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnfitReason {
    /// The node has no GPU in its inventory.
    NoGpus,
    /// Too few healthy NVIDIA GPUs.
    Unhealthy {
        /// Usable GPUs.
        usable: usize,
    },
    /// Too few GPUs that `hami.io/device-cordon` does not name.
    Cordoned {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs of an allowed type.
    Type {
        /// GPUs left.
        left: usize,
        /// `use-gputype`, joined.
        want: String,
        /// `nouse-gputype`, joined.
        refuse: String,
        /// The models the node has, distinct, in inventory order.
        models: Vec<String>,
    },
    /// Too few GPUs with an allowed UUID.
    Uuid {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs below their split count.
    Split {
        /// GPUs left.
        left: usize,
    },
    /// Too few GPUs free of an exclusive slice (or idle, for an exclusive request).
    Exclusive {
        /// GPUs left.
        left: usize,
        /// Whether the container itself asks for exclusivity.
        wants_exclusive: bool,
        /// Whether it does so by the `mutex` policy (else by gpucores 100).
        mutex: bool,
    },
    /// Too few GPUs with the requested cores free.
    Cores {
        /// GPUs left.
        left: usize,
        /// Cores asked per GPU.
        want: u32,
        /// The most cores free on one candidate GPU, and its UUID.
        best: Option<(u32, String)>,
    },
    /// Too few GPUs with the requested memory free.
    Memory {
        /// GPUs left.
        left: usize,
        /// MiB asked per GPU (for a percentage, on the largest candidate).
        want_mib: u64,
        /// The percentage asked, when the request is a percentage.
        percent: Option<u32>,
        /// The most MiB free on one candidate GPU, and its UUID.
        best: Option<(u64, String)>,
    },
    /// Enough GPUs fit, but too few on any one NUMA node (`nvidia.com/numa-bind`).
    Numa {
        /// The most that fit on one NUMA node.
        left: usize,
    },
}

/// A container that fits no GPUs of a node, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unfit {
    /// The container.
    pub container: String,
    /// GPUs it asks for.
    pub gpus: u32,
    /// Why.
    pub reason: UnfitReason,
    /// Whether the pod has more than one vGPU container (then messages name the container).
    pub several: bool,
}

impl fmt::Display for Unfit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.several {
            write!(f, "container {:?}: ", self.container)?;
        }
        let n = self.gpus;
        // "no GPU with X" for one GPU, "2 GPUs with X needed, 1 has it" for several.
        let lead = |f: &mut fmt::Formatter<'_>, what: &str, left: usize| {
            if n <= 1 || left == 0 {
                write!(f, "no GPU {what}")
            } else {
                write!(f, "{n} GPUs {what} needed, only {left}")
            }
        };
        match &self.reason {
            UnfitReason::NoGpus => write!(f, "no GPUs in the node's inventory"),
            UnfitReason::Unhealthy { usable } => {
                if *usable == 0 {
                    write!(f, "no healthy GPU")
                } else {
                    write!(f, "{n} healthy GPUs needed, only {usable}")
                }
            }
            UnfitReason::Type {
                left,
                want,
                refuse,
                models,
            } => {
                let mut what = String::new();
                if !want.is_empty() {
                    what.push_str(&format!("of type {want}"));
                }
                if !refuse.is_empty() {
                    if !what.is_empty() {
                        what.push_str(", ");
                    }
                    what.push_str(&format!("not of type {refuse}"));
                }
                lead(f, &what, *left)?;
                write!(f, " (node has {})", models.join(", "))
            }
            UnfitReason::Cordoned { left } => lead(f, CORDON_WORDS, *left),
            UnfitReason::Uuid { left } => lead(f, "with an allowed UUID", *left),
            UnfitReason::Split { left } => lead(f, "below its split count", *left),
            UnfitReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            } => lead(f, exclusive_words(*wants_exclusive, *mutex), *left),
            UnfitReason::Cores { left, want, best } => {
                lead(f, &format!("with {want}% cores free"), *left)?;
                match best {
                    Some((c, uuid)) => write!(f, " (most {c}% on {uuid})"),
                    None => Ok(()),
                }
            }
            UnfitReason::Memory {
                left,
                want_mib,
                percent,
                best,
            } => {
                let what = match percent {
                    Some(p) => format!("with {p}% memory ({want_mib} MiB) free"),
                    None => format!("with {want_mib} MiB free"),
                };
                lead(f, &what, *left)?;
                match best {
                    Some((m, uuid)) => write!(f, " (largest {m} MiB on {uuid})"),
                    None => Ok(()),
                }
            }
            UnfitReason::Numa { left } => lead(f, NUMA_WORDS, *left),
        }
    }
}

/// What a container's GPUs must be under `nvidia.com/numa-bind` when too few fit on one node.
const NUMA_WORDS: &str = "that fit on one NUMA node (nvidia.com/numa-bind)";

/// What a GPU must be for a pod when cordons leave too few.
const CORDON_WORDS: &str = "outside the cordon (node annotation hami.io/device-cordon)";

/// What a GPU must be for a pod when exclusive slices leave too few.
fn exclusive_words(wants_exclusive: bool, mutex: bool) -> &'static str {
    match (wants_exclusive, mutex) {
        (true, false) => "idle (gpucores 100 needs a whole card)",
        (true, true) => "idle (the mutex policy needs a GPU nothing else uses)",
        (false, _) => "free of an exclusive pod (gpucores 100 or mutex)",
    }
}

/// Usage of one GPU while a pod's containers are placed one after another.
#[derive(Debug, Clone, Copy, Default)]
struct Scratch {
    used_mib: u64,
    used_cores: u32,
    slices: u32,
    exclusive: bool,
}

impl Scratch {
    /// This GPU's usage once a slice of `r` is added (what placement does to the chosen GPUs).
    #[inline]
    fn with(self, g: &GpuHot, r: &VgpuRequest) -> Scratch {
        let exclusive = r.cores >= EXCLUSIVE_CORES;
        Scratch {
            used_mib: self.used_mib.saturating_add(r.mib_per_gpu(g.memory_mib)),
            used_cores: self
                .used_cores
                .saturating_add(if exclusive { g.cores } else { r.cores }),
            slices: self.slices.saturating_add(1),
            exclusive: self.exclusive || exclusive,
        }
    }

    #[inline]
    fn of(g: &GpuHot) -> Scratch {
        Scratch {
            used_mib: g.used_mib,
            used_cores: g.used_cores,
            slices: g.slices,
            exclusive: g.exclusive,
        }
    }
}

/// Buffers one placement needs, kept between nodes so that checking a node allocates nothing (a
/// filter reuses one for all its candidates).
#[derive(Debug, Default)]
pub struct PlaceBuf {
    hot: Vec<GpuHot>,
    scratch: Vec<Scratch>,
    /// (use per mille after placement, GPU index, position)
    cand: Vec<(u64, u32, usize)>,
    type_memo: Vec<(u32, bool)>,
    frag_before: Vec<u32>,
    frag_after: Vec<u32>,
    /// Positions of the GPUs placement gave a slice to, each once.
    touched: Vec<usize>,
}

/// Why a container fits no GPUs of a node, as positions into the node's GPUs instead of names:
/// what [`score_buf`] returns, cheap to make for every failing node. [`write_miss`] writes the
/// same words as [`Unfit`]'s `Display`; [`Miss::to_unfit`] gives the [`Unfit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Miss {
    /// Position of the container in [`PodRequest::containers`].
    pub container: usize,
    /// Why.
    pub why: MissReason,
}

/// [`UnfitReason`] without names (GPUs by position in the node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum MissReason {
    NoGpus,
    Unhealthy {
        usable: usize,
    },
    Cordoned {
        left: usize,
    },
    Type {
        left: usize,
    },
    Uuid {
        left: usize,
    },
    Split {
        left: usize,
    },
    Exclusive {
        left: usize,
        wants_exclusive: bool,
        mutex: bool,
    },
    Cores {
        left: usize,
        want: u32,
        best: Option<(u32, usize)>,
    },
    Memory {
        left: usize,
        want_mib: u64,
        percent: Option<u32>,
        best: Option<(u64, usize)>,
    },
    Numa {
        left: usize,
    },
}

/// Positions of the first GPU of each distinct model, in inventory order.
fn distinct_models<S: GpuSet + ?Sized>(node: &S) -> impl Iterator<Item = usize> + '_ {
    (0..node.len()).filter(move |&i| (0..i).all(|j| !node.same_model(j, i)))
}

impl Miss {
    /// The [`Unfit`] this stands for, names resolved on `node`.
    pub fn to_unfit<S: GpuSet + ?Sized>(&self, node: &S, pod: &PodRequest) -> Unfit {
        let c = &pod.containers[self.container];
        let reason = match self.why {
            MissReason::NoGpus => UnfitReason::NoGpus,
            MissReason::Unhealthy { usable } => UnfitReason::Unhealthy { usable },
            MissReason::Cordoned { left } => UnfitReason::Cordoned { left },
            MissReason::Type { left } => UnfitReason::Type {
                left,
                want: pod.filter.use_types.joined(),
                refuse: pod.filter.nouse_types.joined(),
                models: distinct_models(node)
                    .map(|i| node.model(i).to_string())
                    .collect(),
            },
            MissReason::Uuid { left } => UnfitReason::Uuid { left },
            MissReason::Split { left } => UnfitReason::Split { left },
            MissReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            } => UnfitReason::Exclusive {
                left,
                wants_exclusive,
                mutex,
            },
            MissReason::Cores { left, want, best } => UnfitReason::Cores {
                left,
                want,
                best: best.map(|(c, i)| (c, node.uuid(i).to_string())),
            },
            MissReason::Memory {
                left,
                want_mib,
                percent,
                best,
            } => UnfitReason::Memory {
                left,
                want_mib,
                percent,
                best: best.map(|(m, i)| (m, node.uuid(i).to_string())),
            },
            MissReason::Numa { left } => UnfitReason::Numa { left },
        };
        Unfit {
            container: c.name.clone(),
            gpus: c.request.gpus,
            reason,
            several: pod.containers.len() > 1,
        }
    }
}

/// Writes the message for `miss` on `node`: the same words as the `Display` of
/// [`Miss::to_unfit`], without building it.
pub fn write_miss<S: GpuSet + ?Sized, W: fmt::Write + ?Sized>(
    f: &mut W,
    node: &S,
    pod: &PodRequest,
    miss: &Miss,
) -> fmt::Result {
    let c = &pod.containers[miss.container];
    if pod.containers.len() > 1 {
        write!(f, "container {:?}: ", c.name)?;
    }
    let n = c.request.gpus;
    fn lead<W: fmt::Write + ?Sized>(
        f: &mut W,
        n: u32,
        left: usize,
        what: fmt::Arguments<'_>,
    ) -> fmt::Result {
        if n <= 1 || left == 0 {
            write!(f, "no GPU {what}")
        } else {
            write!(f, "{n} GPUs {what} needed, only {left}")
        }
    }
    struct Types<'a>(&'a GpuFilter);
    impl fmt::Display for Types<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            let list = |f: &mut fmt::Formatter<'_>, l: &NameList| {
                for (k, t) in l.0.iter().enumerate() {
                    if k > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(t)?;
                }
                Ok(())
            };
            if !self.0.use_types.is_empty() {
                f.write_str("of type ")?;
                list(f, &self.0.use_types)?;
            }
            if !self.0.nouse_types.is_empty() {
                if !self.0.use_types.is_empty() {
                    f.write_str(", ")?;
                }
                f.write_str("not of type ")?;
                list(f, &self.0.nouse_types)?;
            }
            Ok(())
        }
    }
    match miss.why {
        MissReason::NoGpus => f.write_str("no GPUs in the node's inventory"),
        MissReason::Unhealthy { usable } => {
            if usable == 0 {
                f.write_str("no healthy GPU")
            } else {
                write!(f, "{n} healthy GPUs needed, only {usable}")
            }
        }
        MissReason::Type { left } => {
            lead(f, n, left, format_args!("{}", Types(&pod.filter)))?;
            f.write_str(" (node has ")?;
            for (k, i) in distinct_models(node).enumerate() {
                if k > 0 {
                    f.write_str(", ")?;
                }
                f.write_str(node.model(i))?;
            }
            f.write_str(")")
        }
        MissReason::Cordoned { left } => lead(f, n, left, format_args!("{CORDON_WORDS}")),
        MissReason::Uuid { left } => lead(f, n, left, format_args!("with an allowed UUID")),
        MissReason::Split { left } => lead(f, n, left, format_args!("below its split count")),
        MissReason::Exclusive {
            left,
            wants_exclusive,
            mutex,
        } => lead(
            f,
            n,
            left,
            format_args!("{}", exclusive_words(wants_exclusive, mutex)),
        ),
        MissReason::Cores { left, want, best } => {
            lead(f, n, left, format_args!("with {want}% cores free"))?;
            match best {
                Some((c, i)) => write!(f, " (most {c}% on {})", node.uuid(i)),
                None => Ok(()),
            }
        }
        MissReason::Memory {
            left,
            want_mib,
            percent,
            best,
        } => {
            match percent {
                Some(p) => lead(
                    f,
                    n,
                    left,
                    format_args!("with {p}% memory ({want_mib} MiB) free"),
                )?,
                None => lead(f, n, left, format_args!("with {want_mib} MiB free"))?,
            }
            match best {
                Some((m, i)) => write!(f, " (largest {m} MiB on {})", node.uuid(i)),
                None => Ok(()),
            }
        }
        MissReason::Numa { left } => lead(f, n, left, format_args!("{NUMA_WORDS}")),
    }
}

/// Places every vGPU container of `pod` on `node`, or says why one does not fit.
///
/// Returns the devices of each container in order, with percentages resolved to MiB on the chosen
/// card. The node's own counts are not changed.
pub fn place(node: &NodeGpus, pod: &PodRequest) -> Result<Vec<ContainerAssignment>, Unfit> {
    place_scored(node, pod).map(|(a, _)| a)
}

/// [`place`], plus the node's score for the pod under the pod's node policy (0..=[`MAX_SCORE`]).
pub fn place_scored(
    node: &NodeGpus,
    pod: &PodRequest,
) -> Result<(Vec<ContainerAssignment>, u32), Unfit> {
    place_scored_with(node, pod, None)
}

/// [`place_scored`] with the fragmentation table the `fragmentation` policies score against
/// (without one they act as `binpack`).
pub fn place_scored_with<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    frag: Option<&frag::LiveFrag>,
) -> Result<(Vec<ContainerAssignment>, u32), Unfit> {
    let mut out = Vec::with_capacity(pod.containers.len());
    let mut buf = PlaceBuf::default();
    place_core(node, pod, &mut buf, Some(&mut out), frag)
        .map(|s| (out, s.score))
        .map_err(|m| m.to_unfit(node, pod))
}

/// Whether the pod fits, and the node's score, without building the assignment: what filter and
/// prioritize need for every candidate node (the same decisions as [`place_scored`]).
pub fn score(node: &NodeGpus, pod: &PodRequest) -> Result<u32, Unfit> {
    score_set(node, pod)
}

/// [`score`] over any [`GpuSet`]: the same code, so the same decisions and messages.
pub fn score_set<S: GpuSet + ?Sized>(node: &S, pod: &PodRequest) -> Result<u32, Unfit> {
    let mut buf = PlaceBuf::default();
    score_buf(node, pod, &mut buf, None).map_err(|m| m.to_unfit(node, pod))
}

/// How a node stands for a pod: the score kube-scheduler gets (0..=[`MAX_SCORE`]) and the rank
/// a scheduler choosing the node itself orders by. They differ only under `gap-aware`, whose
/// rank is the measure's step before it is clamped into the score's range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Node score, 0..=[`MAX_SCORE`].
    pub score: u32,
    /// The higher the better; the same order as `score` where that tells nodes apart.
    pub rank: i64,
}

impl Standing {
    fn of_score(score: u32) -> Standing {
        Standing {
            score,
            rank: i64::from(score),
        }
    }
}

/// [`score_set`] reusing `buf`, failing with a [`Miss`] (no names, nothing allocated): the form a
/// filter over thousands of nodes uses. `frag` as in [`place_scored_with`].
pub fn score_buf<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    frag: Option<&frag::LiveFrag>,
) -> Result<u32, Miss> {
    standing_buf(node, pod, buf, frag).map(|s| s.score)
}

/// [`score_buf`] with the node's rank as well ([`Standing`]).
pub fn standing_buf<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    frag: Option<&frag::LiveFrag>,
) -> Result<Standing, Miss> {
    // The table is only read under `fragmentation` or `gap-aware` (the cluster hands it over
    // whenever it knows a GPU pod).
    let frag_used = frag.is_some() && (pod.node_policy.uses_table() || pod.gpu_policy.uses_table());
    if !frag_used && !pod.mutex && !pod.topology && !pod.filter.typed() && !pod.filter.uuids() {
        if let [c] = pod.containers.as_slice() {
            if c.request.gpus == 1 {
                let gpus = hot_records(node, &mut buf.hot);
                if let Some(score) = score_one_gpu(gpus, pod, &c.request) {
                    return Ok(Standing::of_score(score));
                }
            }
        }
    }
    place_core(node, pod, buf, None, frag)
}

/// [`score_buf`] for the request nearly every pod makes (one container, one GPU, no type or UUID
/// lists, no fragmentation policy with a table), in one pass over the hot records: no scratch
/// copy, no candidate list, the node's use summed in the same pass. The same choice and score as
/// [`place_core`] (proptest `never_overcommits` compares the two); `None` when no GPU fits, and
/// [`place_core`] then works out why.
fn score_one_gpu(gpus: &[GpuHot], pod: &PodRequest, r: &VgpuRequest) -> Option<u32> {
    let exclusive = r.cores >= EXCLUSIVE_CORES;
    let spread = pod.gpu_policy == Policy::Spread;
    let (mut sum, mut n) = (0u64, 0u64);
    // (use after placement, GPU index, position) of the best GPU so far, first one on ties.
    let mut best: Option<(u64, u32, usize)> = None;
    for (i, g) in gpus.iter().enumerate() {
        if !g.usable {
            continue;
        }
        sum += u64::from(g.use_now);
        n += 1;
        if g.cordoned || g.slices >= g.split || g.exclusive || (exclusive && g.slices > 0) {
            continue;
        }
        let free_cores = g.cores.saturating_sub(g.used_cores);
        let want = r.mib_per_gpu(g.memory_mib);
        if !cores_fit(r, exclusive, free_cores) || g.memory_mib.saturating_sub(g.used_mib) < want {
            continue;
        }
        let after = g.use_permille(g.used_mib.saturating_add(want), g.used_cores);
        let better = match best {
            None => true,
            Some((a, index, _)) if spread => (after, g.index) < (a, index),
            Some((a, index, _)) => after > a || (after == a && g.index < index),
        };
        if better {
            best = Some((after, g.index, i));
        }
    }
    let (_, _, i) = best?;
    let g = &gpus[i];
    let s = Scratch::of(g).with(g, r);
    let sum = sum - u64::from(g.use_now) + g.use_permille(s.used_mib, s.used_cores);
    Some(node_score(sum, n, pod.node_policy))
}

/// The node's hot GPU records: its own slice when it keeps one, else made into `hot`.
fn hot_records<'a, S: GpuSet + ?Sized>(node: &'a S, hot: &'a mut Vec<GpuHot>) -> &'a [GpuHot] {
    match node.hot_slice() {
        Some(s) => s,
        None => {
            hot.clear();
            hot.extend((0..node.len()).map(|i| node.hot(i)));
            hot
        }
    }
}

/// Whether a GPU with `free_cores` left takes the request's cores (`exclusive`: the request takes
/// the whole card, whatever its cores). A share of 0 cores still needs some compute left on the
/// card (HAMi skips a card whose cores are all placed).
#[inline]
fn cores_fit(r: &VgpuRequest, exclusive: bool, free_cores: u32) -> bool {
    if exclusive {
        true
    } else if r.cores == 0 {
        free_cores > 0
    } else {
        free_cores >= r.cores
    }
}

/// The node score from the use per mille summed over its `n` usable GPUs after placement: the
/// mean use under binpack, what is left of it under spread, on the `0..=MAX_SCORE` scale.
#[inline]
fn node_score(sum: u64, n: u64, node_policy: Policy) -> u32 {
    let used = sum.checked_div(n).unwrap_or(0);
    let permille = match node_policy {
        Policy::Spread => 1000 - used.min(1000),
        _ => used,
    };
    ((permille * u64::from(MAX_SCORE) + 500) / 1000) as u32
}

/// Topology and NUMA for one container: moves the GPUs it gets to the front of `cand` (every
/// candidate, sorted in the GPU policy's order), keeping their order; or says why none fit.
fn arrange<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    need: usize,
    cand: &mut [(u64, u32, usize)],
) -> Result<(), MissReason> {
    if need == 1 {
        if pod.topology {
            // HAMi's `computeWorstSingleCard`: the GPU with the fewest NVLinks to the others,
            // leaving linked sets whole for containers of several GPUs (ties: the policy's order).
            let links = |i: usize| -> u32 {
                (0..node.len())
                    .filter(|&j| j != i)
                    .map(|j| node.links(i, j))
                    .sum()
            };
            if let Some(k) = (0..cand.len()).min_by_key(|&k| (links(cand[k].2), k)) {
                cand[..=k].rotate_right(1);
            }
        }
        return Ok(());
    }
    // Candidates (positions in `cand`) by NUMA node, in the order of each node's best candidate.
    let mut groups: Vec<Vec<usize>> = vec![(0..cand.len()).collect()];
    if pod.numa || pod.numa_bind {
        let mut by_node: Vec<(Option<u32>, Vec<usize>)> = Vec::new();
        for (k, c) in cand.iter().enumerate() {
            let n = node.numa(c.2);
            match by_node.iter_mut().find(|g| g.0 == n) {
                Some(g) => g.1.push(k),
                None => by_node.push((n, vec![k])),
            }
        }
        let most = by_node.iter().map(|g| g.1.len()).max().unwrap_or(0);
        let fitting: Vec<Vec<usize>> = by_node
            .into_iter()
            .filter(|g| g.1.len() >= need)
            .map(|g| g.1)
            .collect();
        if !fitting.is_empty() {
            groups = fitting;
        } else if pod.numa_bind {
            return Err(MissReason::Numa { left: most });
        }
    }
    let set_links = |ks: &[usize]| -> u32 {
        let mut sum = 0;
        for (x, &a) in ks.iter().enumerate() {
            for &b in &ks[x + 1..] {
                sum += node.links(cand[a].2, cand[b].2);
            }
        }
        sum
    };
    // In each group the first `need` in order, or under `topology-aware` the set joined by the
    // most NVLinks (HAMi's `computeBestCombination`; ties: the earliest in order); across groups
    // the most links, then the group with the best candidate.
    let mut best: Option<(u32, Vec<usize>)> = None;
    for g in &groups {
        let pick = if pod.topology {
            most_linked(g, need, &set_links)
        } else {
            g[..need].to_vec()
        };
        let score = if pod.topology { set_links(&pick) } else { 0 };
        if best.as_ref().is_none_or(|b| score > b.0) {
            best = Some((score, pick));
        }
    }
    if let Some((_, pick)) = best {
        let mut order: Vec<(u64, u32, usize)> = pick.iter().map(|&k| cand[k]).collect();
        order.extend(
            (0..cand.len())
                .filter(|k| !pick.contains(k))
                .map(|k| cand[k]),
        );
        cand.copy_from_slice(&order);
    }
    Ok(())
}

/// The `need` members of `group` (in order) with the most links by `score`: every subset while
/// there are at most [`TOPOLOGY_EXACT_MAX`] candidates, else greedily from the first (each next
/// member the one most linked to those taken).
fn most_linked(group: &[usize], need: usize, score: &dyn Fn(&[usize]) -> u32) -> Vec<usize> {
    if group.len() <= TOPOLOGY_EXACT_MAX {
        let n = group.len();
        let mut idx: Vec<usize> = (0..need).collect();
        let mut best: Option<(u32, Vec<usize>)> = None;
        loop {
            let set: Vec<usize> = idx.iter().map(|&i| group[i]).collect();
            let s = score(&set);
            if best.as_ref().is_none_or(|b| s > b.0) {
                best = Some((s, set));
            }
            // The next subset in lexicographic order.
            let Some(p) = (0..need).rev().find(|&p| idx[p] < n - need + p) else {
                break;
            };
            idx[p] += 1;
            for q in p + 1..need {
                idx[q] = idx[q - 1] + 1;
            }
        }
        return best.map(|b| b.1).unwrap_or_default();
    }
    let mut taken = vec![group[0]];
    while taken.len() < need {
        let next = group
            .iter()
            .filter(|k| !taken.contains(k))
            .max_by_key(|&&k| {
                let mut with = taken.clone();
                with.push(k);
                // Earlier in order wins ties: max_by_key keeps the last maximum, so rank by
                // (links, -position).
                (score(&with), std::cmp::Reverse(k))
            })
            .copied();
        match next {
            Some(k) => taken.push(k),
            None => break,
        }
    }
    taken
}

fn place_core<S: GpuSet + ?Sized>(
    node: &S,
    pod: &PodRequest,
    buf: &mut PlaceBuf,
    mut record: Option<&mut Vec<ContainerAssignment>>,
    frag: Option<&frag::LiveFrag>,
) -> Result<Standing, Miss> {
    let PlaceBuf {
        hot,
        scratch,
        cand,
        type_memo,
        frag_before,
        frag_after,
        touched,
    } = buf;
    let gpus = hot_records(node, hot);
    scratch.clear();
    scratch.extend(gpus.iter().map(Scratch::of));
    touched.clear();
    // What the node has left besides GPUs and what the pod asks (the `gap-aware` host terms).
    let host = node.host_left().map(|left| (left, pod.host));
    let typed = pod.filter.typed();
    let uuids = pod.filter.uuids();
    for (ci, c) in pod.containers.iter().enumerate() {
        let r = &c.request;
        let need = r.gpus as usize;
        let miss = |why| Miss { container: ci, why };
        if gpus.is_empty() {
            return Err(miss(MissReason::NoGpus));
        }
        cand.clear();
        type_memo.clear();
        // Counts after each check, for the failure message.
        let (mut n_usable, mut n_open, mut n_type, mut n_uuid, mut n_split) =
            (0usize, 0usize, 0usize, 0usize, 0usize);
        let (mut n_excl, mut n_cores) = (0usize, 0usize);
        let mut best_cores: Option<(u32, usize)> = None;
        let mut best_mem: Option<(u64, usize)> = None;
        let mut max_want_mib = 0u64;
        let exclusive = r.cores >= EXCLUSIVE_CORES;
        let alone = exclusive || pod.mutex;
        for (i, (g, s)) in gpus.iter().zip(scratch.iter()).enumerate() {
            if !g.usable {
                continue;
            }
            n_usable += 1;
            // GPUs of one node mostly share a model: test the type lists once per distinct model.
            let type_ok = !typed
                || match type_memo.iter().find(|(key, _)| *key == g.model_key) {
                    Some(&(_, ok)) => ok,
                    None => {
                        let ok = node.type_ok(i, &pod.filter);
                        type_memo.push((g.model_key, ok));
                        ok
                    }
                };
            if !type_ok {
                continue;
            }
            n_type += 1;
            if uuids && !pod.filter.uuid_ok(node.uuid(i)) {
                continue;
            }
            n_uuid += 1;
            if g.cordoned {
                continue;
            }
            n_open += 1;
            if s.slices >= g.split {
                continue;
            }
            n_split += 1;
            if s.exclusive || (alone && s.slices > 0) {
                continue;
            }
            n_excl += 1;
            let free_cores = g.cores.saturating_sub(s.used_cores);
            let cores_ok = cores_fit(r, exclusive, free_cores);
            if best_cores.is_none_or(|(b, _)| free_cores > b) {
                best_cores = Some((free_cores, i));
            }
            if !cores_ok {
                continue;
            }
            n_cores += 1;
            let want = r.mib_per_gpu(g.memory_mib);
            max_want_mib = max_want_mib.max(want);
            let free = g.memory_mib.saturating_sub(s.used_mib);
            if best_mem.is_none_or(|(b, _)| free > b) {
                best_mem = Some((free, i));
            }
            if free < want {
                continue;
            }
            let after = g.use_permille(s.used_mib.saturating_add(want), s.used_cores);
            cand.push((after, g.index, i));
        }
        if cand.len() < need {
            let why = if n_usable < need {
                MissReason::Unhealthy { usable: n_usable }
            } else if n_type < need {
                MissReason::Type { left: n_type }
            } else if n_uuid < need {
                MissReason::Uuid { left: n_uuid }
            } else if n_open < need {
                MissReason::Cordoned { left: n_open }
            } else if n_split < need {
                MissReason::Split { left: n_split }
            } else if n_excl < need {
                MissReason::Exclusive {
                    left: n_excl,
                    wants_exclusive: alone,
                    mutex: pod.mutex,
                }
            } else if n_cores < need {
                MissReason::Cores {
                    left: n_cores,
                    want: r.cores.max(1),
                    best: best_cores,
                }
            } else {
                MissReason::Memory {
                    left: cand.len(),
                    want_mib: max_want_mib,
                    percent: match r.memory {
                        crate::request::Memory::Percent(p) => Some(p),
                        crate::request::Memory::Mib(_) => None,
                    },
                    best: best_mem,
                }
            };
            return Err(miss(why));
        }
        let gpu_policy = match (pod.gpu_policy, frag) {
            (Policy::Fragmentation, Some(t)) if need == 1 => {
                // Fragmentation gradient: the GPU whose use leaves the node least fragmented
                // (ties: the fullest, then the lowest index).
                t.rank_share(gpus, scratch, r, cand, frag_before);
                Policy::Binpack
            }
            (Policy::GapAware, Some(t)) if need == 1 => {
                // The GPU whose use leaves the node's measure the best step lower (ties: the
                // lowest index, as the simulator).
                t.rank_share_gaps(gpus, scratch, r, host, cand, (frag_before, frag_after));
                Policy::Binpack
            }
            (Policy::Spread, _) => Policy::Spread,
            _ => Policy::Binpack,
        };
        // The first `need` candidates in order, by selection: the order of a full sort (keys are
        // unique: GPU indexes differ) for a few comparisons per GPU, where sorting every
        // candidate of every node cost a tenth of a multi-GPU filter (`perf`, filter bench).
        let better = |a: &(u64, u32, usize), b: &(u64, u32, usize)| match gpu_policy {
            // Emptiest after placement first; ties by index.
            Policy::Spread => (a.0, a.1) < (b.0, b.1),
            // Fullest after placement first; ties by index.
            _ => a.0 > b.0 || (a.0 == b.0 && a.1 < b.1),
        };
        let arranged = pod.topology || (need > 1 && (pod.numa || pod.numa_bind));
        let sort_to = if arranged { cand.len() } else { need };
        for k in 0..sort_to {
            let mut best = k;
            for j in k + 1..cand.len() {
                if better(&cand[j], &cand[best]) {
                    best = j;
                }
            }
            cand.swap(k, best);
        }
        if arranged {
            arrange(node, pod, need, cand).map_err(miss)?;
        }
        let mut devices = Vec::with_capacity(if record.is_some() { need } else { 0 });
        for &(_, _, i) in cand.iter().take(need) {
            let g = &gpus[i];
            let mib = r.mib_per_gpu(g.memory_mib);
            scratch[i] = scratch[i].with(g, r);
            scratch[i].exclusive |= pod.mutex;
            if !touched.contains(&i) {
                touched.push(i);
            }
            if record.is_some() {
                devices.push(DeviceSlice {
                    uuid: node.uuid(i).to_string(),
                    memory_mib: mib,
                    cores: r.cores,
                    exclusive: pod.mutex,
                });
            }
        }
        if let Some(out) = record.as_deref_mut() {
            out.push(ContainerAssignment {
                name: c.name.clone(),
                devices,
            });
        }
    }
    match (pod.node_policy, frag) {
        (Policy::Fragmentation, Some(t)) => {
            let score = t.node_score(gpus, scratch, frag_before, frag_after);
            return Ok(Standing::of_score(score));
        }
        (Policy::GapAware, Some(t)) => {
            let step = t.gap_node_step(gpus, scratch, host, frag_before, frag_after);
            return Ok(Standing {
                score: frag::LiveFrag::gap_score_of_step(step),
                rank: step,
            });
        }
        _ => {}
    }
    // Node use after placement: mean over usable GPUs. An untouched GPU's use is its record's
    // `use_now` (its scratch is its record); only the touched ones are recomputed. Chosen GPUs are
    // always usable.
    let (mut sum, mut n) = (0u64, 0u64);
    for g in gpus.iter().filter(|g| g.usable) {
        sum += u64::from(g.use_now);
        n += 1;
    }
    for &i in touched.iter() {
        let (g, s) = (&gpus[i], &scratch[i]);
        sum = sum - u64::from(g.use_now) + g.use_permille(s.used_mib, s.used_cores);
    }
    Ok(Standing::of_score(node_score(sum, n, pod.node_policy)))
}

#[cfg(test)]
mod tests;
