//! A node's GPUs as placement reads them: [`Gpu`] (a device and what is placed on it), its hot
//! record [`GpuHot`], the [`GpuSet`] view and [`NodeGpus`].

use super::*;

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
    pub(super) model_lower: String,
    /// Index within its node of the first GPU with the same model (set by [`NodeGpus::new`]), so
    /// type lists are tested once per distinct model.
    pub(super) model_first: usize,
    /// [`permille_scale`] of `memory_mib`.
    pub(super) mem_scale: u64,
    /// [`permille_scale`] of `cores`.
    pub(super) cores_scale: u64,
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
    pub(super) memory_mib: u64,
    pub(super) used_mib: u64,
    pub(super) mem_scale: u64,
    pub(super) cores_scale: u64,
    pub(super) cores: u32,
    pub(super) used_cores: u32,
    pub(super) split: u32,
    pub(super) slices: u32,
    pub(super) index: u32,
    pub(super) model_key: u32,
    pub(super) usable: bool,
    pub(super) exclusive: bool,
    pub(super) cordoned: bool,
    /// `use_permille(used_mib, used_cores)`, computed once when the record is made: the node score
    /// sums it over the GPUs placement did not touch (most of them) instead of recomputing it.
    pub(super) use_now: u32,
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
    pub(super) fn use_permille(&self, used_mib: u64, used_cores: u32) -> u64 {
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
pub(super) fn permille_scale(total: u64) -> u64 {
    (1000u64 << 32).div_ceil(total.max(1))
}

#[inline]
pub(super) fn permille(used: u64, total: u64, scale: u64) -> u64 {
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
    pub(super) gpus: Vec<Gpu>,
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
