//! The fragmentation measure of the live scheduler ([`LiveFrag`]): FGD's ([`super::frag`]) over
//! GPUs shared by memory and cores, with the `gap-aware` terms ([`super::gaps`], [`super::host`])
//! when the extender knows its pods' CPU and memory.

use std::sync::OnceLock;

use super::frag::{NodeView, TypicalPod, MILLI};
use super::gaps::{bucket, gap_prices_within, GapPrices, LIVE_MAX_SIZES, WASTE_WEIGHT};
use super::host::{HostLeft, HostRequest, HostTerms, PodKind};
use super::{permille, GpuHot, Scratch};
use crate::request::VgpuRequest;

/// The fragmentation measure for the live scheduler, where GPUs are shared by memory and cores
/// rather than one milli-GPU number, and CPU is left to kube-scheduler's own `NodeResourcesFit`.
///
/// A GPU's free milli-GPU is the smaller of its free memory and free cores, per mille of the card
/// (0 when it is unhealthy, cordoned, at its split count or held exclusively); a pod's milli-GPU per GPU is
/// the larger of its memory and cores shares. Typical pods keep only their GPU shape: the CPU term
/// of [`FragTable`] is dropped (every pod "fits" by CPU) and so are model lists.
#[derive(Clone, Debug, Default)]
pub struct LiveFrag {
    /// (milli per GPU, GPUs, weight), distinct shapes.
    groups: Vec<(u32, u32, f64)>,
    cpu_only: f64,
    /// The `gap-aware` policy's prices of the one-GPU share shapes, solved when first needed
    /// (at most [`LIVE_MAX_SIZES`] sizes, under 1 ms; tables that only `fragmentation`
    /// reads never pay it), with the share weights they were solved for.
    gaps: OnceLock<(Vec<(u32, f64)>, GapPrices)>,
    /// The `gap-aware` measure's CPU and memory terms, with every pod kind they were built from
    /// (the terms keep the most frequent [`MAX_HOST_KINDS`]).
    host: Option<(Vec<(PodKind, u64)>, HostTerms)>,
}

/// Tables are equal when their typical pods are. The prices are left out: they follow from the
/// typical pods, except that a table may carry prices reused from a close earlier mix
/// ([`LiveFrag::reuse_gaps_from`]).
impl PartialEq for LiveFrag {
    fn eq(&self, other: &LiveFrag) -> bool {
        self.groups == other.groups
            && self.cpu_only == other.cpu_only
            && self.host.as_ref().map(|h| &h.0) == other.host.as_ref().map(|h| &h.0)
    }
}

/// Weights are probabilities; the LP wants pod counts, so each weight counts as this many pods.
/// The LP caps a pattern's copies of a size at its count; at this scale no cap binds (a weight
/// would have to be under 1e-3), as in a long trace, so live prices are those of the mix.
const GAP_WEIGHT_PODS: f64 = 1e6;

/// How far (as a ratio) a share size's weight may move before the prices are solved again.
pub const GAP_REUSE_RATIO: f64 = 1.25;

/// The most pod kinds (shape, CPU, memory) the live table's host terms keep: the Alibaba pod
/// lists have at most 151.
pub const MAX_HOST_KINDS: usize = 256;

/// Node scores run 0..=10 ([`super::MAX_SCORE`]); a fragmentation change of this many
/// milli-GPU moves the score from 5 to about 7.3.
const LIVE_SCORE_MILLI: f64 = 500.0;

impl LiveFrag {
    /// From typical pods (see [`typical_pods`]); CPU and model lists are ignored.
    pub fn new(typical: &[TypicalPod]) -> LiveFrag {
        let mut t = LiveFrag::default();
        for p in typical {
            let s = &p.shape;
            if s.gpu_milli == 0 || s.num_gpu == 0 {
                t.cpu_only += p.weight;
                continue;
            }
            let milli = s.gpu_milli.min(MILLI);
            match t
                .groups
                .iter_mut()
                .find(|g| g.0 == milli && g.1 == s.num_gpu)
            {
                Some(g) => g.2 += p.weight,
                None => t.groups.push((milli, s.num_gpu, p.weight)),
            }
        }
        t.groups.sort_by_key(|g| (g.0, g.1));
        t
    }

    /// Adds the `gap-aware` measure's CPU and memory terms ([`HostTerms`]) for a workload of
    /// these pod kinds (`typical_pct` as in [`typical_pods`]): with them the measure also counts
    /// GPU a node's CPU cannot serve and gaps whose fillers ask more CPU or memory than is left.
    /// At most [`MAX_HOST_KINDS`] kinds are kept, the most frequent (the measure's cost grows
    /// with them).
    pub fn with_host(mut self, kinds: Vec<(PodKind, u64)>, typical_pct: f64) -> LiveFrag {
        let terms = if kinds.len() > MAX_HOST_KINDS {
            // Most frequent first; equal counts in the order given.
            let mut kept = kinds.clone();
            kept.sort_by_key(|k| std::cmp::Reverse(k.1));
            kept.truncate(MAX_HOST_KINDS);
            HostTerms::new(&kept, typical_pct)
        } else {
            HostTerms::new(&kinds, typical_pct)
        };
        self.host = Some((kinds, terms));
        self
    }

    /// Whether the table knows no GPU pod (then every node scores the same).
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Fragmentation of a node whose GPUs have these free milli-GPU (as [`FragTable`] with every
    /// pod fitting by CPU and by model).
    pub fn fragmentation(&self, left: &[u32]) -> f64 {
        let idle: u64 = left.iter().map(|&l| u64::from(l)).sum();
        if idle == 0 {
            return 0.0;
        }
        let mut f = self.cpu_only * idle as f64;
        for &(milli, num, w) in &self.groups {
            let (mut fitting, mut small) = (0u32, 0u64);
            for &l in left {
                if l >= milli {
                    fitting += 1;
                } else {
                    small += u64::from(l);
                }
            }
            f += w * if fitting >= num { small } else { idle } as f64;
        }
        f
    }

    fn left_of(g: &GpuHot, s: &Scratch) -> u32 {
        if !g.usable || g.cordoned || s.exclusive || s.slices >= g.split {
            return 0;
        }
        let mem = 1000 - permille(s.used_mib, g.memory_mib, g.mem_scale);
        let cores = 1000 - permille(u64::from(s.used_cores), u64::from(g.cores), g.cores_scale);
        mem.min(cores) as u32
    }

    fn fill(left: &mut Vec<u32>, gpus: &[GpuHot], state: &[Scratch]) {
        left.clear();
        left.extend(gpus.iter().zip(state).map(|(g, s)| Self::left_of(g, s)));
    }

    /// Re-keys one-GPU candidates `(key, index, position)` so that the largest key leaves the
    /// node least fragmented (ties: the fullest GPU after placement).
    pub(super) fn rank_share(
        &self,
        gpus: &[GpuHot],
        state: &[Scratch],
        r: &VgpuRequest,
        cand: &mut [(u64, u32, usize)],
        left: &mut Vec<u32>,
    ) {
        Self::fill(left, gpus, state);
        for c in cand.iter_mut() {
            let i = c.2;
            let before = left[i];
            left[i] = Self::left_of(&gpus[i], &state[i].with(&gpus[i], r));
            let f = self.fragmentation(left).round().max(0.0) as u64;
            left[i] = before;
            // Less fragmentation first, then the fuller GPU (c.0 is its use after, <= 1000).
            c.0 = ((1u64 << 40).saturating_sub(f) << 11) | c.0.min(1000);
        }
    }

    /// The prices of the `gap-aware` policy: the LP of the table's one-GPU share shapes.
    pub fn gaps(&self) -> &GapPrices {
        &self
            .gaps
            .get_or_init(|| {
                let basis = self.share_weights();
                let pods: Vec<(u32, u64)> = basis
                    .iter()
                    .map(|&(m, w)| (m, (w * GAP_WEIGHT_PODS).round().max(1.0) as u64))
                    .collect();
                let prices = gap_prices_within(&pods, LIVE_MAX_SIZES);
                (basis, prices)
            })
            .1
    }

    /// Whether this table's `gap-aware` prices are solved (or reused) yet.
    pub fn gaps_solved(&self) -> bool {
        self.gaps.get().is_some()
    }

    /// (milli, weight) of the one-GPU share shapes, ascending, weights summing to 1 over them
    /// (the LP's prices depend only on the share mix, not on how many other pods there are).
    fn share_weights(&self) -> Vec<(u32, f64)> {
        let shares: Vec<(u32, f64)> = match &self.host {
            // Every share pod of the workload, not only the typical ones: a size too rare to be
            // typical still takes gaps (the simulator's `ours` prices them all).
            Some((kinds, _)) => {
                let mut v: Vec<(u32, f64)> = Vec::new();
                for (k, n) in kinds.iter().filter(|(k, _)| k.shape.is_share()) {
                    match v.iter_mut().find(|s| s.0 == k.shape.gpu_milli) {
                        Some(s) => s.1 += *n as f64,
                        None => v.push((k.shape.gpu_milli, *n as f64)),
                    }
                }
                v.sort_by_key(|s| s.0);
                v
            }
            None => self
                .groups
                .iter()
                .filter(|g| g.1 == 1 && g.0 < MILLI)
                .map(|g| (g.0, g.2))
                .collect(),
        };
        let total: f64 = shares.iter().map(|s| s.1).sum();
        if total <= 0.0 {
            return shares;
        }
        shares.into_iter().map(|(m, w)| (m, w / total)).collect()
    }

    /// Takes `old`'s solved prices when this table has the same one-GPU share sizes, each
    /// weight within [`GAP_REUSE_RATIO`] of the weight the prices were solved for: prices barely
    /// move with small changes of the mix, and the live table changes with every placed or
    /// removed pod.
    pub fn reuse_gaps_from(&mut self, old: &LiveFrag) {
        let Some((basis, prices)) = old.gaps.get() else {
            return;
        };
        let now = self.share_weights();
        let close = now.len() == basis.len()
            && now.iter().zip(basis).all(|(a, b)| {
                a.0 == b.0 && a.1 <= b.1 * GAP_REUSE_RATIO && b.1 <= a.1 * GAP_REUSE_RATIO
            });
        if close {
            let _ = self.gaps.set((basis.clone(), prices.clone()));
        }
    }

    /// The `gap-aware` node measure of a node whose GPUs have these free milli-GPU and, when
    /// known, this much CPU and memory left: with the host terms and `host`, the measure of
    /// [`HostTerms::measure`]; else `M = F + WASTE_WEIGHT x W`, fragmentation against the
    /// typical pods plus the unusable part of each GPU's gap at the prices.
    pub fn gap_measure(&self, left: &[u32], host: Option<HostLeft>) -> f64 {
        match (&self.host, host) {
            (Some((_, terms)), Some(h)) => {
                let view = NodeView {
                    cpu_left: h.cpu_milli,
                    gpu_left: left,
                    model: h.model,
                };
                terms.measure(self.gaps(), view, h.mem_mib)
            }
            _ => self.fragmentation(left) + WASTE_WEIGHT * self.gaps().waste(left),
        }
    }

    /// The per-move constant of a placement that takes `before` to `after` (free milli-GPU per
    /// GPU): the sum of [`GapPrices::move_constant`] of what each GPU lost.
    pub fn gap_constant(&self, before: &[u32], after: &[u32]) -> f64 {
        before
            .iter()
            .zip(after)
            .filter(|(b, a)| a < b)
            .map(|(b, a)| self.gaps().move_constant(b - a))
            .sum()
    }

    /// The score step of a placement from `before` (measure `m_before`) to `after`, the node
    /// having `host_after` left once the pod is placed.
    pub fn gap_step(
        &self,
        m_before: f64,
        before: &[u32],
        after: &[u32],
        host_after: Option<HostLeft>,
    ) -> i64 {
        bucket(
            m_before,
            self.gap_measure(after, host_after),
            self.gap_constant(before, after),
        )
    }

    /// A step as a node score 0..=10: 5 for a move that changes the measure by less than half
    /// a step, one point per step, clamped (kube-scheduler's extender scores run 0..=10).
    pub fn gap_score_of_step(step: i64) -> u32 {
        (5 + step).clamp(0, i64::from(super::MAX_SCORE)) as u32
    }

    /// [`LiveFrag::rank_share`] for `gap-aware`: the key is the candidate's step (the largest
    /// wins; ties go to the lowest index).
    pub(super) fn rank_share_gaps(
        &self,
        gpus: &[GpuHot],
        state: &[Scratch],
        r: &VgpuRequest,
        host: Option<(HostLeft, HostRequest)>,
        cand: &mut [(u64, u32, usize)],
        (before, after): (&mut Vec<u32>, &mut Vec<u32>),
    ) {
        Self::fill(before, gpus, state);
        let m_before = self.gap_measure(before, host.map(|h| h.0));
        let host_after = host.map(|(left, req)| left.after(req));
        after.clear();
        after.extend_from_slice(before);
        for c in cand.iter_mut() {
            let i = c.2;
            after[i] = Self::left_of(&gpus[i], &state[i].with(&gpus[i], r));
            let step = self.gap_step(m_before, before, after, host_after);
            after[i] = before[i];
            c.0 = step.saturating_add(1 << 40).max(0) as u64;
        }
    }

    /// The `gap-aware` step for moving from `gpus` as they are to `state` (the node score is
    /// [`LiveFrag::gap_score_of_step`]); `host`: what the node has left before the move and
    /// what the pod asks.
    pub(super) fn gap_node_step(
        &self,
        gpus: &[GpuHot],
        state: &[Scratch],
        host: Option<(HostLeft, HostRequest)>,
        before: &mut Vec<u32>,
        after: &mut Vec<u32>,
    ) -> i64 {
        Self::fill_move(gpus, state, before, after);
        let m_before = self.gap_measure(before, host.map(|h| h.0));
        self.gap_step(m_before, before, after, host.map(|(l, r)| l.after(r)))
    }

    /// The free milli-GPU per GPU before a placement (`gpus` as they are) and after (`state`).
    fn fill_move(gpus: &[GpuHot], state: &[Scratch], before: &mut Vec<u32>, after: &mut Vec<u32>) {
        before.clear();
        before.extend(gpus.iter().map(|g| Self::left_of(g, &Scratch::of(g))));
        Self::fill(after, gpus, state);
    }

    /// The node score 0..=10 for moving from `gpus` as they are to `state` (after placement):
    /// `round(10 × sigmoid((F_before - F_after) / 500))`.
    pub(super) fn node_score(
        &self,
        gpus: &[GpuHot],
        state: &[Scratch],
        before: &mut Vec<u32>,
        after: &mut Vec<u32>,
    ) -> u32 {
        Self::fill_move(gpus, state, before, after);
        Self::fgd_score_of(self.fragmentation(before), self.fragmentation(after))
    }

    /// The `fragmentation` node score 0..=10 of a move from fragmentation `before` to `after`:
    /// `round(10 × sigmoid((before - after) / 500))`.
    pub fn fgd_score_of(before: f64, after: f64) -> u32 {
        let delta = before - after;
        let s = f64::from(super::MAX_SCORE) / (1.0 + (-delta / LIVE_SCORE_MILLI).exp());
        (s.round() as u32).min(super::MAX_SCORE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::frag::tests::shape;
    use crate::placement::frag::typical_pods;

    fn live(shares: &[(u32, u64)]) -> LiveFrag {
        LiveFrag::new(&typical_pods(
            shares.iter().map(|&(m, n)| (shape(0, m, 1), n)),
            100.0,
        ))
    }

    #[test]
    fn gap_prices_are_reused_while_the_share_mix_stays_close() {
        let solved = live(&[(600, 20), (400, 10)]);
        let prices = solved.gaps().clone();
        // 10 % more 600s: reused, no LP.
        let mut near = live(&[(600, 22), (400, 10)]);
        near.reuse_gaps_from(&solved);
        assert_eq!(near.gaps.get().map(|g| &g.1), Some(&prices));
        // Drift is measured from the weights the prices were solved for, not from the last table.
        let mut drifted = live(&[(600, 30), (400, 10)]);
        drifted.reuse_gaps_from(&near);
        assert!(drifted.gaps.get().is_none());
        // Another size, or an unsolved table: nothing to reuse.
        let mut other = live(&[(600, 20), (400, 10), (300, 1)]);
        other.reuse_gaps_from(&solved);
        assert!(other.gaps.get().is_none());
        // Whole-GPU pods joining the mix do not move the share mix: reused.
        let mut with_whole = LiveFrag::new(&typical_pods(
            [
                (shape(0, 600, 1), 20),
                (shape(0, 400, 1), 10),
                (shape(0, 1000, 1), 30),
            ],
            100.0,
        ));
        with_whole.reuse_gaps_from(&solved);
        assert_eq!(with_whole.gaps.get().map(|g| &g.1), Some(&prices));
        let mut from_unsolved = live(&[(600, 20), (400, 10)]);
        from_unsolved.reuse_gaps_from(&live(&[(600, 20), (400, 10)]));
        assert!(from_unsolved.gaps.get().is_none());
        assert_eq!(from_unsolved.gaps(), &prices);
    }
}
