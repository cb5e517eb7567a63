//! vgpu's policy (`ours`).

use vgpu_core::placement::frag::FragTable;

use crate::policy::{frag_after, GpuPick, NodeState};
use crate::workload::PodClass;

/// Score of a feasible node: exact fragmentation gradient (no sigmoid quantisation).
pub fn score(node: &NodeState, c: &PodClass, table: &FragTable) -> (i64, GpuPick) {
    let before = node.frag;
    let delta = |gpu: Option<usize>| before - frag_after(node, c, table, gpu);
    if c.shape.is_share() {
        let gpus = node.gpus();
        let mut best: Option<(f64, usize)> = None;
        for (i, &g) in gpus.iter().enumerate() {
            if g < c.shape.gpu_milli || gpus[..i].contains(&g) {
                continue;
            }
            let d = delta(Some(i));
            if best.is_none_or(|b| d > b.0) {
                best = Some((d, i));
            }
        }
        best.map_or((i64::MIN + 1, GpuPick::None), |(d, i)| {
            (quantise(d), GpuPick::Index(i as u8))
        })
    } else {
        (quantise(delta(None)), GpuPick::None)
    }
}

fn quantise(d: f64) -> i64 {
    (d * 1000.0).round() as i64
}
