//! vgpu's policy (`ours`): FGD's fragmentation gradient on a richer node measure, coarsely
//! bucketed so that near-equal moves pack by node order.
//!
//! Node measure `M = F + S + W` (all milli-GPU):
//! * `F`: FGD's fragmentation against the typical pods (the same 95 % list FGD uses);
//! * `S`: CPU-stranded GPU, idle GPU beyond what the node's free CPU can serve at the trace's
//!   average CPU per GPU of GPU pods. FGD only sees CPU through the *next* pod's fit, so it happily
//!   fills a node's CPU while its GPUs stay idle;
//! * `W`: each GPU's unusable share of its gap at the LP dual prices of the trace's share sizes
//!   (see [`vgpu_core::placement::gaps`]): `r - 1000 K(r)` for a gap of `r` milli, `K(r)` the most the gap can
//!   still earn in GPUs. A move that follows an optimal packing of the trace's share mix (a
//!   470m pod next to a lone 470m, a 160m pod into an 810m's hole) leaves `W` falling by just
//!   the pod's price; one that spoils a gap (a 320m pod into that 470m's 530m) raises it by what
//!   the gap can no longer earn. Prices know no CPU, so the part of a gap whose fillers ask more
//!   CPU than the node has left counts as unusable ([`crate::fillers`]). `F` looks one pod
//!   ahead; `W` looks at the gap's whole future. `W` counts [`WASTE_WEIGHT`] times, so that
//!   the smallest loss it tells apart (a twelfth of a GPU on the Alibaba trace, 83m) spans
//!   two of the 300m score steps below and outweighs `F`'s one-pod view (4x: -0.06 points on
//!   default, 16x: -0.02).
//!
//! Score = `round((M_before - M_after) / 300)`: moves whose gradients round to the same 300
//! milli-GPU step are equal, and kube-scheduler's tie-break (smallest node name) then packs them
//! onto the same nodes, which keeps whole nodes free for multi-GPU and model-constrained pods. A
//! share pod takes the GPU with the best score, lowest index first.

use std::collections::HashMap;

use vgpu_core::placement::frag::{cpu_stranded, FragTable, NodeView, PodShape, MILLI};
use vgpu_core::placement::gaps::{bucket, gap_prices, GapPrices, WASTE_WEIGHT};

use crate::fillers::Fillers;
use crate::policy::{GpuPick, NodeState};
use crate::workload::PodClass;

/// `ours` for one trace: typical pods, CPU per GPU, the gap prices of `W` and the fillers.
#[derive(Clone, Debug)]
pub struct Ours {
    table: FragTable,
    cpu_per_milli_gpu: f64,
    gaps: GapPrices,
    fillers: Fillers,
}

impl Ours {
    /// Build from the trace's typical pods, shape counts and class counts (with memory).
    pub fn new(
        table: FragTable,
        counts: &HashMap<PodShape, u64>,
        classes: &HashMap<PodClass, u64>,
    ) -> Ours {
        let (mut cpu, mut gpu) = (0.0, 0.0);
        for (s, &n) in counts {
            if s.num_gpu > 0 {
                cpu += s.cpu_milli as f64 * n as f64;
                gpu += s.total_milli() as f64 * n as f64;
            }
        }
        Ours {
            table,
            cpu_per_milli_gpu: if gpu > 0.0 { cpu / gpu } else { 0.0 },
            gaps: gap_prices(&share_counts(counts)),
            fillers: Fillers::new(classes),
        }
    }

    /// The node measure `M`.
    pub fn measure(&self, v: NodeView<'_>, mem_left: u64) -> f64 {
        let w: f64 = v
            .gpu_left
            .iter()
            .map(|&g| self.gpu_waste(g, v.cpu_left, mem_left))
            .sum();
        self.table.fragmentation(v) + cpu_stranded(v, self.cpu_per_milli_gpu) + WASTE_WEIGHT * w
    }

    /// One GPU's share of `W`: the unusable part of its gap at the dual prices, plus the rest of
    /// the gap in the proportion of fillers that need more CPU or memory than is left. A free GPU
    /// keeps its table value (whole-GPU pods' CPU is `F`'s and `S`'s business).
    fn gpu_waste(&self, free: u32, cpu_left: u64, mem_left: u64) -> f64 {
        let v = self.gaps.waste(&[free]);
        if free >= MILLI {
            return v;
        }
        v + (f64::from(free) - v) * (1.0 - self.fillers.fit(free, cpu_left, mem_left))
    }

    fn measure_after(&self, node: &NodeState, c: &PodClass, gpu: Option<usize>) -> f64 {
        let (g, cpu) = node.after(c, gpu);
        let view = NodeView {
            cpu_left: cpu,
            gpu_left: &g[..node.ngpu],
            model: node.model,
        };
        self.measure(view, node.mem_left.saturating_sub(c.memory_mib))
    }

    /// Score of a feasible node (`node.frag` holds its current measure).
    pub fn score(&self, node: &NodeState, c: &PodClass) -> (i64, GpuPick) {
        // Every share move changes `W` by the pod's price minus its size, plus its loss; taking
        // that constant out centres the steps on lossless moves, so that a loss or a gain of
        // `F` or `S` is not rounded away on one node and kept on another.
        let s = &c.shape;
        let constant = if s.is_share() {
            self.gaps.move_constant(s.gpu_milli)
        } else {
            0.0
        };
        let step = |after: f64| bucket(node.frag, after, constant);
        if !c.shape.is_share() {
            return (step(self.measure_after(node, c, None)), GpuPick::None);
        }
        let gpus = node.gpus();
        let mut best: Option<(i64, usize)> = None;
        for (i, &g) in gpus.iter().enumerate() {
            // Equal free milli gives the same measure; the first such GPU wins anyway.
            if g < c.shape.gpu_milli || gpus[..i].contains(&g) {
                continue;
            }
            let sc = step(self.measure_after(node, c, Some(i)));
            if best.is_none_or(|b| sc > b.0) {
                best = Some((sc, i));
            }
        }
        best.map_or((0, GpuPick::None), |(sc, i)| (sc, GpuPick::Index(i as u8)))
    }
}

/// (milli-GPU, pods) of the trace's share pods, for the LP.
pub fn share_counts(counts: &HashMap<PodShape, u64>) -> Vec<(u32, u64)> {
    let mut v: Vec<(u32, u64)> = counts
        .iter()
        .filter(|(s, _)| s.is_share())
        .map(|(s, &n)| (s.gpu_milli, n))
        .collect();
    // The LP sums per size; sorting keeps its input the same whatever the map's order.
    v.sort_unstable();
    v
}
