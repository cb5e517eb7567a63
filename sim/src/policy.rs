//! Placement policies: the published simulator's baselines, FGD, and ours.
//!
//! Each policy scores one feasible node for one pod class and names the GPU a share pod would
//! take; the simulator keeps the highest score and breaks ties uniformly at random, as
//! kube-scheduler's `selectHost` does. Scores depend only on the node and the class, so they are
//! cached per (class, node) and recomputed only when the node changed.

use std::fmt;
use std::str::FromStr;

use vgpu_core::placement::frag::{fgd_score, FragTable, MILLI};
use vgpu_core::placement::host::HostRequest;
use vgpu_core::placement::live::LiveFrag;

pub use crate::node::{GpuPick, NodeState};
use crate::workload::{PodClass, Trace};

/// `MaxSpecCpu` of the published simulator (milli-CPU) used to normalise scores.
pub const MAX_SPEC_CPU: f64 = 128_000.0;
/// `MaxSpecGpu` of the published simulator (milli-GPU).
pub const MAX_SPEC_GPU: f64 = 8_000.0;

/// A placement policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Policy {
    /// A random feasible node; a random GPU that fits.
    Random,
    /// Tetris dot product of free and requested (CPU, GPU), normalised by the max spec.
    DotProd,
    /// Least leftover CPU and GPU (equal weights).
    BestFit,
    /// Shared GPUs first, then free GPUs of a used node, then an idle node.
    GpuPacking,
    /// Nodes already running pods of the same GPU kind first.
    GpuClustering,
    /// Fragmentation gradient descent (ATC'23), as published.
    Fgd,
    /// vgpu's policy: FGD gradient on fragmentation + CPU-stranded GPU + the unusable part of
    /// each GPU's gap at LP prices of the trace's share sizes, bucketed so near-equal moves pack
    /// by node order (see [`crate::ours`]).
    Ours,
    /// What the live extender's `fragmentation` policy computes, through the same code
    /// ([`LiveFrag::fragmentation`]): FGD without CPU or model lists (the extender leaves CPU
    /// and memory to kube-scheduler), node scores on kube-scheduler's 0..=10.
    FgdLive,
    /// What the live extender's `gap-aware` policy computes, through the same code
    /// ([`LiveFrag::gap_measure`]): `ours`' measure with the node's CPU and memory left, without
    /// model lists, prices solved over at most 24 share sizes; nodes ranked by the unclamped step
    /// with `--ties name` (the extender choosing the node, `--choose-node`), by the 0..=10 node
    /// score with `--ties random` (kube-scheduler choosing among the extender's scores).
    OursLive,
    /// DRA mode as kube-scheduler 1.36 places a claim of class `gpu.vgpu.io` by itself
    /// (docs/dra.md): nodes by its default scores, which see no device (NodeResourcesFit's
    /// LeastAllocated and NodeResourcesBalancedAllocation over CPU and memory, weight 1 each), and
    /// inside the node the structured allocator's first fit: the first GPU in slice order (device
    /// index) with room. Run with `--ties random`, as kube-scheduler breaks ties.
    DraDefault,
    /// DRA mode with vgpu's extender scoring the nodes for claims (`ours-live`'s step), knowing
    /// that the structured allocator takes the first GPU with room: the step is the one that GPU
    /// gives, and that GPU is the one taken.
    DraExtender,
}

impl Policy {
    /// All policies, in report order.
    pub const ALL: [Policy; 11] = [
        Policy::Random,
        Policy::DotProd,
        Policy::BestFit,
        Policy::GpuPacking,
        Policy::GpuClustering,
        Policy::Fgd,
        Policy::Ours,
        Policy::FgdLive,
        Policy::OursLive,
        Policy::DraDefault,
        Policy::DraExtender,
    ];

    /// Name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::DotProd => "dotprod",
            Policy::BestFit => "bestfit",
            Policy::GpuPacking => "gpu-packing",
            Policy::GpuClustering => "gpu-clustering",
            Policy::Fgd => "fgd",
            Policy::Ours => "ours",
            Policy::FgdLive => "fgd-live",
            Policy::OursLive => "ours-live",
            Policy::DraDefault => "dra-default",
            Policy::DraExtender => "dra-extender",
        }
    }

    /// The `sc_policy` label of the published results file, if the policy is there.
    pub fn published_label(self) -> Option<&'static str> {
        match self {
            Policy::Random => Some("01-Random"),
            Policy::DotProd => Some("02-DotProd"),
            Policy::GpuClustering => Some("03-GpuClustering"),
            Policy::GpuPacking => Some("04-GpuPacking"),
            Policy::BestFit => Some("05-BestFit"),
            Policy::Fgd => Some("06-FGD"),
            Policy::Ours
            | Policy::FgdLive
            | Policy::OursLive
            | Policy::DraDefault
            | Policy::DraExtender => None,
        }
    }

    /// Whether the policy needs each node's fragmentation kept up to date.
    pub fn uses_fragmentation(self) -> bool {
        matches!(
            self,
            Policy::Fgd | Policy::Ours | Policy::FgdLive | Policy::OursLive | Policy::DraExtender
        )
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown policy name.
#[derive(Debug, thiserror::Error)]
#[error("unknown policy `{0}` (known: random, dotprod, bestfit, gpu-packing, gpu-clustering, fgd, ours, fgd-live, ours-live, dra-default, dra-extender, all)")]
pub struct UnknownPolicy(pub String);

impl FromStr for Policy {
    type Err = UnknownPolicy;

    fn from_str(s: &str) -> Result<Policy, UnknownPolicy> {
        let norm = s.trim().to_ascii_lowercase().replace('_', "-");
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == norm || p.name().replace('-', "") == norm)
            .ok_or_else(|| UnknownPolicy(s.to_string()))
    }
}

/// Parse a comma list of policies; `all` means every policy.
pub fn parse_policies(list: &str) -> Result<Vec<Policy>, UnknownPolicy> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if part.eq_ignore_ascii_case("all") {
            out.extend(Policy::ALL);
        } else {
            out.push(part.parse()?);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Score of a node, `None` if the pod does not fit. `choose_node`: the extender ranks nodes
/// itself (the live policies then rank by what the extender orders by).
pub fn score(
    policy: Policy,
    node: &NodeState,
    c: &PodClass,
    trace: &Trace,
    choose_node: bool,
) -> Option<(i64, GpuPick)> {
    let table = &trace.table;
    if !node.fits(c) {
        return None;
    }
    let s = &c.shape;
    let share_best = || {
        if s.is_share() {
            node.best_fit_gpu(s.gpu_milli)
                .map_or(GpuPick::None, |i| GpuPick::Index(i as u8))
        } else {
            GpuPick::None
        }
    };
    let req_gpu = s.total_milli() as f64;
    let req_cpu = s.cpu_milli as f64;
    Some(match policy {
        Policy::Random => (
            0,
            if s.is_share() {
                GpuPick::Random
            } else {
                GpuPick::None
            },
        ),
        Policy::BestFit => {
            let free_cpu = node.cpu_left as f64;
            let free_gpu = node.gpu_idle() as f64;
            let share = 0.5 * (free_cpu - req_cpu) / MAX_SPEC_CPU
                + 0.5 * (free_gpu - req_gpu) / MAX_SPEC_GPU;
            (((1.0 - share) * 100.0) as i64, share_best())
        }
        Policy::DotProd => {
            let dot = (node.cpu_left as f64 / MAX_SPEC_CPU) * (req_cpu / MAX_SPEC_CPU)
                + (node.gpu_idle() as f64 / MAX_SPEC_GPU) * (req_gpu / MAX_SPEC_GPU);
            (((1.0 - dot / 2.0) * 100.0) as i64, share_best())
        }
        Policy::GpuPacking => (gpu_packing(node, c), share_best()),
        Policy::GpuClustering => (gpu_clustering(node, c), share_best()),
        Policy::Fgd => fgd(node, c, table),
        Policy::Ours => trace.ours.score(node, c),
        Policy::FgdLive => fgd_live(node, c, &trace.live),
        Policy::OursLive => ours_live(node, c, &trace.live, choose_node),
        Policy::DraDefault => (kube_default(node, c), first_fit(node, c)),
        Policy::DraExtender => dra_extender(node, c, &trace.live, choose_node),
    })
}

/// kube-scheduler's default node score without device scoring: NodeResourcesFit (LeastAllocated:
/// the mean free fraction of CPU and memory after the pod, x100) plus
/// NodeResourcesBalancedAllocation (100 x (1 - the standard deviation of the two used fractions)),
/// as `pkg/scheduler/framework/plugins/noderesources` computes them.
fn kube_default(node: &NodeState, c: &PodClass) -> i64 {
    let (cpu_cap, mem_cap) = node.cpu_mem_cap;
    if cpu_cap == 0 || mem_cap == 0 {
        return 0;
    }
    let cpu_used = 1.0 - (node.cpu_left.saturating_sub(c.shape.cpu_milli)) as f64 / cpu_cap as f64;
    let mem_used = 1.0 - (node.mem_left.saturating_sub(c.memory_mib)) as f64 / mem_cap as f64;
    let least = ((1.0 - cpu_used) + (1.0 - mem_used)) / 2.0 * 100.0;
    let balanced = (1.0 - (cpu_used - mem_used).abs() / 2.0) * 100.0;
    (least + balanced) as i64
}

/// The structured allocator's first fit: the lowest-index GPU with room for a share pod.
fn first_fit(node: &NodeState, c: &PodClass) -> GpuPick {
    if !c.shape.is_share() {
        return GpuPick::None;
    }
    node.gpus()
        .iter()
        .position(|&g| g >= c.shape.gpu_milli)
        .map_or(GpuPick::None, |i| GpuPick::Index(i as u8))
}

/// [`Policy::DraExtender`]: `ours-live`'s step for the GPU first fit takes.
fn dra_extender(
    node: &NodeState,
    c: &PodClass,
    live: &LiveFrag,
    choose_node: bool,
) -> (i64, GpuPick) {
    let pick = first_fit(node, c);
    let gpu = match pick {
        GpuPick::Index(i) => Some(usize::from(i)),
        _ if c.shape.is_share() => return (0, GpuPick::None),
        _ => None,
    };
    let host_after = node.host_left().after(HostRequest {
        cpu_milli: c.shape.cpu_milli,
        mem_mib: c.memory_mib,
    });
    let (after, _) = node.after(c, gpu);
    let step = live.gap_step(
        node.frag,
        node.gpus(),
        &after[..node.ngpu],
        Some(host_after),
    );
    let score = if choose_node {
        step
    } else {
        i64::from(LiveFrag::gap_score_of_step(step))
    };
    (score, pick)
}

/// GpuPacking: case 1 (only partly used GPUs needed) in [50, 100], case 2 (needs fully free
/// GPUs on a used node) in [33, 50], case 3 (idle node) below 33. CPU-only pods score 0.
fn gpu_packing(node: &NodeState, c: &PodClass) -> i64 {
    let s = &c.shape;
    if s.num_gpu == 0 {
        return 0;
    }
    let gpus = node.gpus();
    let fully_free = gpus.iter().filter(|&&g| g == MILLI).count() as i64;
    if fully_free == node.ngpu as i64 {
        return (100 / 3 - fully_free).max(fully_free);
    }
    let mut order: Vec<usize> = (0..node.ngpu).collect();
    order.sort_by_key(|&i| gpus[i]); // stable: lowest index first on ties
    let mut need = s.num_gpu;
    let mut free_used = 0i64;
    let mut ratio_sum = 0i64;
    for i in order {
        if need == 0 {
            break;
        }
        if gpus[i] >= s.gpu_milli {
            need -= 1;
            if gpus[i] == MILLI {
                free_used += 1;
            }
            ratio_sum += i64::from(gpus[i]) * 100 / i64::from(MILLI);
        }
    }
    if free_used > 0 {
        (100 / 2 - free_used).max(100 / 3)
    } else {
        (100 - ratio_sum / 10).max(100 / 2)
    }
}

/// GpuClustering: four tiers of 25 by how the node's GPU pods match the pod's kind (share, or k
/// whole GPUs), each tier ordered by GPU in use out of the max spec. CPU-only pods score 0.
fn gpu_clustering(node: &NodeState, c: &PodClass) -> i64 {
    let s = &c.shape;
    if s.num_gpu == 0 {
        return 0;
    }
    let kind = if s.is_share() { 0 } else { s.num_gpu as usize };
    let kinds = node.kinds.iter().filter(|&&k| k > 0).count();
    let used = (MAX_SPEC_GPU as i64 - node.gpu_idle() as i64) * 25 / MAX_SPEC_GPU as i64;
    let tier = if node.kinds[kind] > 0 {
        if kinds == 1 {
            75
        } else {
            50
        }
    } else if kinds == 0 {
        25
    } else {
        0
    };
    used + tier
}

/// FGD as published: a share pod tries every GPU with room and keeps the first with the best
/// integer score; other pods take whole GPUs lowest index first.
fn fgd(node: &NodeState, c: &PodClass, table: &FragTable) -> (i64, GpuPick) {
    let before = node.frag;
    if c.shape.is_share() {
        let mut best: Option<(i64, usize)> = None;
        let gpus = node.gpus();
        for (i, &g) in gpus.iter().enumerate() {
            // GPUs with the same room give the same fragmentation; the first one wins anyway.
            if g < c.shape.gpu_milli || gpus[..i].contains(&g) {
                continue;
            }
            let sc = fgd_score(before, node.frag_after(table, c, Some(i)));
            if best.is_none_or(|b| sc > b.0) {
                best = Some((sc, i));
            }
        }
        best.map_or((0, GpuPick::None), |(sc, i)| (sc, GpuPick::Index(i as u8)))
    } else {
        (
            fgd_score(before, node.frag_after(table, c, None)),
            GpuPick::None,
        )
    }
}

/// The live `fragmentation` policy on simulator nodes (`node.frag` holds [`LiveFrag`]'s
/// fragmentation): the node score of [`LiveFrag::fgd_score_of`]; a share pod takes the GPU that
/// leaves the least fragmentation, then the fullest, then the lowest index, as the extender.
fn fgd_live(node: &NodeState, c: &PodClass, live: &LiveFrag) -> (i64, GpuPick) {
    let frag_after = |gpu: Option<usize>| {
        let (after, _) = node.after(c, gpu);
        live.fragmentation(&after[..node.ngpu])
    };
    let score = |after: f64| i64::from(LiveFrag::fgd_score_of(node.frag, after));
    if !c.shape.is_share() {
        return (score(frag_after(None)), GpuPick::None);
    }
    let gpus = node.gpus();
    let mut best: Option<(u64, u32, usize)> = None;
    for (i, &g) in gpus.iter().enumerate() {
        if g < c.shape.gpu_milli {
            continue;
        }
        let f = frag_after(Some(i)).round().max(0.0) as u64;
        let left = g - c.shape.gpu_milli;
        if best.is_none_or(|b| (f, left) < (b.0, b.1)) {
            best = Some((f, left, i));
        }
    }
    match best {
        Some((_, _, i)) => (score(frag_after(Some(i))), GpuPick::Index(i as u8)),
        None => (0, GpuPick::None),
    }
}

/// The live `gap-aware` policy on simulator nodes: the same measure, steps and node score
/// as [`vgpu_core::placement`] computes over a node's GPUs, CPU and memory (`node.frag` holds the
/// measure). A share pod takes the GPU with the best step, lowest index first; other pods take
/// whole GPUs lowest index first. With `choose_node` the node's rank is the step itself (as the
/// extender's `Standing::rank`), else the 0..=10 score.
fn ours_live(node: &NodeState, c: &PodClass, live: &LiveFrag, choose_node: bool) -> (i64, GpuPick) {
    let before = node.gpus();
    let host_after = node.host_left().after(HostRequest {
        cpu_milli: c.shape.cpu_milli,
        mem_mib: c.memory_mib,
    });
    let step = |gpu: Option<usize>| {
        let (after, _) = node.after(c, gpu);
        live.gap_step(node.frag, before, &after[..node.ngpu], Some(host_after))
    };
    let score = |step: i64| {
        if choose_node {
            step
        } else {
            i64::from(LiveFrag::gap_score_of_step(step))
        }
    };
    if !c.shape.is_share() {
        return (score(step(None)), GpuPick::None);
    }
    let mut best: Option<(i64, usize)> = None;
    for (i, &g) in before.iter().enumerate() {
        if g < c.shape.gpu_milli || before[..i].contains(&g) {
            continue;
        }
        let st = step(Some(i));
        if best.is_none_or(|b| st > b.0) {
            best = Some((st, i));
        }
    }
    best.map_or((0, GpuPick::None), |(st, i)| {
        (score(st), GpuPick::Index(i as u8))
    })
}
