//! vgpu's policy (`ours`): FGD's fragmentation gradient on a richer node measure, coarsely
//! bucketed so that near-equal moves pack by node order.
//!
//! The node measure is [`vgpu_core::placement::host`]'s (fragmentation, CPU-stranded GPU and the
//! unusable part of each GPU's gap at the LP prices of the trace's share sizes, fillers by CPU and
//! memory), here over the trace's own pod kinds with their model lists and prices solved from the
//! exact pod counts. The live extender's `gap-aware` policy computes the same measure through
//! [`vgpu_core::placement::live::LiveFrag`] (the simulator's `ours-live`), from the pods it
//! watches and without model lists.
//!
//! Score = `round((M_before - M_after) / 300)`: moves whose gradients round to the same 300
//! milli-GPU step are equal, and the tie-break (smallest node name) then packs them onto the same
//! nodes, which keeps whole nodes free for multi-GPU and model-constrained pods. A share pod
//! takes the GPU with the best score, lowest index first.

use std::collections::HashMap;

use vgpu_core::placement::frag::{NodeView, PodShape};
use vgpu_core::placement::gaps::{bucket, gap_prices, GapPrices};
use vgpu_core::placement::host::{HostTerms, PodKind as PodClass};

use crate::node::{GpuPick, NodeState};

/// `ours` for one trace: the host terms of its pod kinds and the gap prices of its share pods.
#[derive(Clone, Debug)]
pub struct Ours {
    host: HostTerms,
    gaps: GapPrices,
}

impl Ours {
    /// Build from the trace's class counts; its typical pods are the most popular ones that make
    /// up `typical_pct` percent of the pods.
    pub fn new(classes: &HashMap<PodClass, u64>, typical_pct: f64) -> Ours {
        let kinds = sorted_kinds(classes.iter().map(|(c, &n)| (*c, n)));
        let mut shares: HashMap<u32, u64> = HashMap::new();
        for (c, n) in &kinds {
            if c.shape.is_share() {
                *shares.entry(c.shape.gpu_milli).or_default() += n;
            }
        }
        let mut shares: Vec<(u32, u64)> = shares.into_iter().collect();
        shares.sort_unstable();
        Ours {
            host: HostTerms::new(&kinds, typical_pct),
            gaps: gap_prices(&shares),
        }
    }

    /// The node measure `M`.
    pub fn measure(&self, v: NodeView<'_>, mem_left: u64) -> f64 {
        self.host.measure(&self.gaps, v, mem_left)
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

/// Pod kinds with counts in one fixed order (the tables sum floats in input order, and a hash
/// map's order changes from run to run).
pub fn sorted_kinds(kinds: impl IntoIterator<Item = (PodClass, u64)>) -> Vec<(PodClass, u64)> {
    let mut v: Vec<(PodClass, u64)> = kinds.into_iter().collect();
    let key = |c: &PodClass| {
        let s: &PodShape = &c.shape;
        (
            s.gpu_milli,
            s.num_gpu,
            s.cpu_milli,
            c.memory_mib,
            s.models.0,
        )
    };
    v.sort_by_key(|(c, _)| key(c));
    v
}
