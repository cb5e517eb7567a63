//! One node's state during a run: what is left of its CPU, memory and GPUs, and the moves a
//! policy weighs on it.

use vgpu_core::placement::frag::{FragTable, NodeView, MILLI};
use vgpu_core::placement::host::{HostLeft, PodKind as PodClass};

use crate::trace::MAX_GPUS;

/// Mutable state of one node during a run.
#[derive(Clone, Debug)]
pub struct NodeState {
    /// Free milli-CPU.
    pub cpu_left: u64,
    /// Free MiB.
    pub mem_left: u64,
    /// Allocatable milli-CPU and MiB (kube-scheduler's resource scores are fractions of them).
    pub cpu_mem_cap: (u64, u64),
    /// Free milli-GPU per GPU (first `ngpu` entries).
    pub gpu_left: [u32; MAX_GPUS],
    /// GPU count.
    pub ngpu: usize,
    /// Model index.
    pub model: u32,
    /// GPU pods placed here per kind: `[0]` share pods, `[k]` k-GPU pods (GpuClustering's
    /// affinity).
    pub kinds: [u32; MAX_GPUS + 1],
    /// Bumped on every change; caches compare it.
    pub version: u32,
    /// Current fragmentation (FGD) or node measure (ours); kept only for those two.
    pub frag: f64,
}

impl NodeState {
    /// CPU and memory left, as the extender's host cache knows them.
    pub fn host_left(&self) -> HostLeft {
        HostLeft {
            cpu_milli: self.cpu_left,
            mem_mib: self.mem_left,
            model: self.model,
        }
    }
}

impl NodeState {
    /// Free milli-GPU per GPU.
    pub fn gpus(&self) -> &[u32] {
        &self.gpu_left[..self.ngpu]
    }

    /// View for the fragmentation math.
    pub fn view(&self) -> NodeView<'_> {
        NodeView {
            cpu_left: self.cpu_left,
            gpu_left: self.gpus(),
            model: self.model,
        }
    }

    /// Total free milli-GPU.
    pub fn gpu_idle(&self) -> u64 {
        self.gpus().iter().map(|&g| u64::from(g)).sum()
    }

    /// NodeResourcesFit (CPU, memory) plus the GPU filter (model, enough GPUs with room).
    pub fn fits(&self, c: &PodClass) -> bool {
        let s = &c.shape;
        if self.cpu_left < s.cpu_milli || self.mem_left < c.memory_mib {
            return false;
        }
        if s.num_gpu == 0 {
            return true;
        }
        s.models.allows(self.model)
            && self.gpus().iter().filter(|&&g| g >= s.gpu_milli).count() >= s.num_gpu as usize
    }

    /// What kube-scheduler's own filters see of a vGPU pod: CPU, memory and the GPU count
    /// (`nvidia.com/gpu` is split `--split-count` ways per GPU, so the count alone seldom binds; the
    /// GPUs' room is the extender's to judge).
    pub fn host_fits(&self, c: &PodClass) -> bool {
        let s = &c.shape;
        self.cpu_left >= s.cpu_milli
            && self.mem_left >= c.memory_mib
            && self.ngpu >= s.num_gpu as usize
    }

    /// Best-fit GPU for a share pod: least room that fits, lowest index on ties.
    pub fn best_fit_gpu(&self, milli: u32) -> Option<usize> {
        let mut best: Option<usize> = None;
        for (i, &g) in self.gpus().iter().enumerate() {
            if g >= milli && best.is_none_or(|b| g < self.gpu_left[b]) {
                best = Some(i);
            }
        }
        best
    }

    /// GPU left lists after placing `c` (share pod on `gpu`, whole GPUs on the lowest free
    /// indices), and the CPU left.
    pub fn after(&self, c: &PodClass, gpu: Option<usize>) -> ([u32; MAX_GPUS], u64) {
        let mut g = self.gpu_left;
        let s = &c.shape;
        if s.is_share() {
            if let Some(i) = gpu {
                g[i] -= s.gpu_milli;
            }
        } else if s.num_gpu > 0 {
            let mut need = s.num_gpu;
            for slot in g.iter_mut().take(self.ngpu) {
                if need == 0 {
                    break;
                }
                if *slot >= MILLI {
                    *slot -= MILLI;
                    need -= 1;
                }
            }
        }
        (g, self.cpu_left.saturating_sub(s.cpu_milli))
    }

    pub(crate) fn frag_after(&self, table: &FragTable, c: &PodClass, gpu: Option<usize>) -> f64 {
        let (g, cpu) = self.after(c, gpu);
        table.fragmentation(NodeView {
            cpu_left: cpu,
            gpu_left: &g[..self.ngpu],
            model: self.model,
        })
    }
}

/// Which GPU a share pod takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPick {
    /// No choice to make (CPU-only or whole-GPU pod).
    None,
    /// This GPU index.
    Index(u8),
    /// A random GPU that fits, drawn at bind time.
    Random,
}
