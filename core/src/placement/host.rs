//! The host terms of the `gap-aware` node measure: what a node's CPU and memory leave its GPUs
//! able to serve. The simulator's `ours` and the live extender compute them with this code.
//!
//! The measure `M = F + S + WASTE_WEIGHT x W` (all milli-GPU):
//! * `F`: FGD's fragmentation against the typical pods, a pod whose CPU request exceeds the
//!   node's free CPU counting as not fitting ([`FragTable`]);
//! * `S`: CPU-stranded GPU, idle GPU beyond what the node's free CPU can serve at the workload's
//!   average CPU per GPU of GPU pods ([`cpu_stranded`]). FGD only sees CPU through the *next*
//!   pod's fit, so it happily fills a node's CPU while its GPUs stay idle;
//! * `W`: each GPU's unusable share of its gap at the LP dual prices of the share sizes
//!   ([`super::gaps`]), plus the rest of the gap in the proportion of its fillers (single-GPU
//!   pods that fit the gap) that ask more CPU or memory than the node has left ([`Fillers`]):
//!   the prices know no CPU, and a 350m gap next to 2 free cores will not get the 320m pods
//!   (4 to 8 cores) they count on.
//!
//! Without CPU or memory requests in the workload every pod fits by CPU and memory, `S` is 0 and
//! the measure is the GPU-only one.

use super::frag::{cpu_stranded, typical_pods, FragTable, NodeView, PodShape, MILLI};
use super::gaps::{GapPrices, WASTE_WEIGHT};

/// What a node has left for new pods besides its GPUs: allocatable minus what its pods request
/// (kube-scheduler's `NodeResourcesFit` view), and its GPU model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostLeft {
    /// Free milli-CPU.
    pub cpu_milli: u64,
    /// Free memory, MiB.
    pub mem_mib: u64,
    /// The node's GPU model, as an index of the pod kinds' model lists ([`super::frag::ModelMask`]).
    pub model: u32,
}

impl HostLeft {
    /// What is left once `r` is placed too (never below zero).
    pub fn after(self, r: HostRequest) -> HostLeft {
        HostLeft {
            cpu_milli: self.cpu_milli.saturating_sub(r.cpu_milli),
            mem_mib: self.mem_mib.saturating_sub(r.mem_mib),
            model: self.model,
        }
    }
}

/// A pod's CPU and memory request, as kube-scheduler counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostRequest {
    /// milli-CPU.
    pub cpu_milli: u64,
    /// MiB (rounded up).
    pub mem_mib: u64,
}

/// One kind of pod of a workload: its shape (GPU and CPU), memory and how many there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PodKind {
    /// GPU and CPU request (model list included).
    pub shape: PodShape,
    /// Memory request, MiB.
    pub memory_mib: u64,
}

/// The host terms of one workload: its typical pods with their CPU, its CPU per GPU and the
/// fillers of each gap size.
#[derive(Clone, Debug)]
pub struct HostTerms {
    table: FragTable,
    cpu_per_milli_gpu: f64,
    fillers: Fillers,
}

impl HostTerms {
    /// From pod kinds and their counts; `typical_pct` is FGD's popularity threshold (percent of
    /// pods the typical pods cover).
    pub fn new(kinds: &[(PodKind, u64)], typical_pct: f64) -> HostTerms {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for (k, n) in kinds {
            if k.shape.num_gpu > 0 {
                cpu += k.shape.cpu_milli as f64 * *n as f64;
                gpu += k.shape.total_milli() as f64 * *n as f64;
            }
        }
        let mut shapes: Vec<(PodShape, u64)> = Vec::new();
        for (k, n) in kinds {
            match shapes.iter_mut().find(|s| s.0 == k.shape) {
                Some(s) => s.1 += n,
                None => shapes.push((k.shape, *n)),
            }
        }
        HostTerms {
            table: FragTable::new(&typical_pods(shapes, typical_pct)),
            cpu_per_milli_gpu: if gpu > 0.0 { cpu / gpu } else { 0.0 },
            fillers: Fillers::new(kinds),
        }
    }

    /// The node measure `M` of a node (`v`: free CPU, free milli-GPU per GPU, model) with
    /// `mem_left` MiB free, at the gap prices `gaps`.
    pub fn measure(&self, gaps: &GapPrices, v: NodeView<'_>, mem_left: u64) -> f64 {
        let w: f64 = v
            .gpu_left
            .iter()
            .map(|&g| self.gpu_waste(gaps, g, v.cpu_left, mem_left))
            .sum();
        self.table.fragmentation(v) + cpu_stranded(v, self.cpu_per_milli_gpu) + WASTE_WEIGHT * w
    }

    /// One GPU's share of `W`: the unusable part of its gap at the prices, plus the rest of the
    /// gap in the proportion of fillers that need more CPU or memory than is left. A free GPU
    /// keeps its table value (whole-GPU pods' CPU is `F`'s and `S`'s business).
    fn gpu_waste(&self, gaps: &GapPrices, free: u32, cpu_left: u64, mem_left: u64) -> f64 {
        let v = gaps.waste(&[free]);
        if free >= MILLI {
            return v;
        }
        v + (f64::from(free) - v) * (1.0 - self.fillers.fit(free, cpu_left, mem_left))
    }
}

/// Single-GPU pods of a workload by milli-GPU, to tell how many of a gap's fillers a node can
/// still host by CPU and memory.
#[derive(Clone, Debug, Default)]
pub struct Fillers {
    /// By milli ascending.
    groups: Vec<Group>,
}

/// The single-GPU pods of one milli-GPU size.
#[derive(Clone, Debug)]
struct Group {
    milli: u32,
    /// (milli-CPU, MiB, pods), by CPU ascending.
    pods: Vec<(u64, u64, f64)>,
    total: f64,
}

impl Fillers {
    /// From pod kinds and their counts (single-GPU pods, share or whole, are kept).
    pub fn new(kinds: &[(PodKind, u64)]) -> Fillers {
        let mut groups: Vec<Group> = Vec::new();
        for (k, n) in kinds.iter().filter(|(k, _)| k.shape.num_gpu == 1) {
            let pod = (k.shape.cpu_milli, k.memory_mib, *n as f64);
            match groups.iter_mut().find(|g| g.milli == k.shape.gpu_milli) {
                Some(g) => g.pods.push(pod),
                None => groups.push(Group {
                    milli: k.shape.gpu_milli,
                    pods: vec![pod],
                    total: 0.0,
                }),
            }
        }
        for g in &mut groups {
            g.pods.sort_by_key(|p| (p.0, p.1));
            g.total = g.pods.iter().map(|p| p.2).sum();
        }
        groups.sort_by_key(|g| g.milli);
        Fillers { groups }
    }

    /// Share (0..=1) of the single-GPU pods of at most `gap` milli that ask no more than
    /// `cpu_left` and `mem_left`; 1 when no pod is that small.
    pub fn fit(&self, gap: u32, cpu_left: u64, mem_left: u64) -> f64 {
        let (mut fit, mut all) = (0.0, 0.0);
        for g in &self.groups {
            if g.milli > gap {
                break;
            }
            all += g.total;
            fit += g
                .pods
                .iter()
                .take_while(|p| p.0 <= cpu_left)
                .filter(|p| p.1 <= mem_left)
                .map(|p| p.2)
                .sum::<f64>();
        }
        if all > 0.0 {
            fit / all
        } else {
            1.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::frag::ModelMask;
    use crate::placement::gaps::gap_prices;

    fn kind(gpu_milli: u32, cpu_milli: u64, memory_mib: u64) -> PodKind {
        PodKind {
            shape: PodShape {
                cpu_milli,
                gpu_milli,
                num_gpu: 1,
                models: ModelMask::ANY,
            },
            memory_mib,
        }
    }

    #[test]
    fn fillers_by_cpu_and_memory() {
        let kinds = [
            (kind(300, 1000, 100), 3),
            (kind(300, 8000, 100), 1),
            (kind(300, 1000, 9000), 2),
            (kind(1000, 1000, 100), 6),
        ];
        let f = Fillers::new(&kinds);
        assert_eq!(f.fit(200, 0, 0), 1.0); // nothing that small
        assert_eq!(f.fit(300, 999, 1 << 20), 0.0);
        assert_eq!(f.fit(300, 1000, 100), 0.5);
        assert_eq!(f.fit(300, 1000, 9000), 5.0 / 6.0);
        assert_eq!(f.fit(999, 8000, 9000), 1.0);
        assert_eq!(f.fit(1000, 1000, 100), 9.0 / 12.0);
    }

    /// A node whose CPU is nearly gone measures worse than the same GPUs with CPU to spare: its
    /// idle GPU is stranded and its gaps' fillers no longer fit.
    #[test]
    fn cpu_left_counts_in_the_measure() {
        let kinds = [(kind(500, 4000, 1024), 10), (kind(1000, 8000, 4096), 5)];
        let terms = HostTerms::new(&kinds, 95.0);
        let gaps = gap_prices(&[(500, 10)]);
        let gpus = [500, 1000];
        let view = |cpu_left| NodeView {
            cpu_left,
            gpu_left: &gpus,
            model: 0,
        };
        let roomy = terms.measure(&gaps, view(64_000), 1 << 20);
        let starved = terms.measure(&gaps, view(2_000), 1 << 20);
        let no_memory = terms.measure(&gaps, view(64_000), 512);
        assert!(starved > roomy + 1000.0, "{starved} vs {roomy}");
        assert!(no_memory > roomy, "{no_memory} vs {roomy}");
        // A workload without CPU or memory requests: the GPU-only measure.
        let gpu_only = HostTerms::new(&[(kind(500, 0, 0), 10)], 95.0);
        assert_eq!(
            gpu_only.measure(&gaps, view(0), 0),
            gpu_only.measure(&gaps, view(64_000), 1 << 20)
        );
    }
}
