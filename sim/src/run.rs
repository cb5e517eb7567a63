//! One simulation run: schedule an arrival sequence one pod at a time, never deleting, and record
//! the GPU allocation ratio at every 1 % of arrived GPU request.

use crate::policy::{score, GpuPick, NodeState, Policy};
use crate::rng::Rng;
use crate::trace::MAX_GPUS;
use crate::workload::{Cluster, Trace};

use vgpu_core::placement::frag::MILLI;

/// Result of one run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// Trace name.
    pub trace: String,
    /// Policy.
    pub policy: Policy,
    /// Seed.
    pub seed: u64,
    /// `alloc_pct[k]`: allocated milli-GPU / capacity (percent) when arrived GPU request first
    /// reached k % of capacity; points past the last arrival repeat the final allocation.
    pub alloc_pct: Vec<f64>,
    /// Pods that arrived.
    pub pods: usize,
    /// Pods that found no node.
    pub failed: usize,
    /// Pods that fitted no node of kube-scheduler's first window (with a sample): each a
    /// FailedScheduling and a retry on a later window.
    pub retried: usize,
    /// Where each pod went (`None` = failed), in arrival order.
    pub placements: Vec<Option<u32>>,
    /// Node states when arrival first reached 100 % of capacity (the end state if it never did).
    pub nodes_at_100: Vec<NodeState>,
}

impl RunResult {
    /// Allocation percentage at `k` % arrival, if recorded.
    pub fn at(&self, k: usize) -> Option<f64> {
        self.alloc_pct.get(k).copied()
    }
}

#[derive(Clone, Copy)]
struct Cached {
    version: u32,
    score: i64,
    pick: GpuPick,
    feasible: bool,
}

/// Arrival points recorded for a tune ratio: 0..=round(tune × 100).
pub fn points(tune: f64) -> usize {
    (tune * 100.0).round().max(0.0) as usize
}

/// Which of the nodes with the best score a pod goes to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ties {
    /// The smallest node name: the published simulator's rule, and the extender's with
    /// `--choose-node` (its filter passes only that node).
    #[default]
    Name,
    /// One of them uniformly at random: upstream kube-scheduler's `selectHost`, which the
    /// extender leaves the choice to with `--choose-node=false` (other score plugins aside).
    Random,
}

/// kube-scheduler's `numFeasibleNodesToFind` (pkg/scheduler/schedule_one.go): how many nodes that
/// pass its own filters it looks for before it stops and hands them to the extender. Under 100
/// nodes all; `percentage` 0 is its adaptive default (50 % less one point per 125 nodes, at least
/// 5 %); never fewer than 100.
pub fn feasible_nodes_to_find(percentage: u32, all: usize) -> usize {
    if all < 100 {
        return all;
    }
    let mut p = percentage.min(100) as usize;
    if p == 0 {
        p = 50usize.saturating_sub(all / 125).max(5);
    }
    (all * p / 100).max(100)
}

/// How a run is carried out (results depend only on `ties` and `percentage_of_nodes_to_score`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Keep scores per (class, node) until the node changes; off, every node is rescored for
    /// every pod (for benchmarking the cache; results are identical).
    pub score_cache: bool,
    /// The tie rule.
    pub ties: Ties,
    /// kube-scheduler's `percentageOfNodesToScore` (100: every node; 0: its adaptive default, the
    /// chart's). Below 100 a pod sees only the window kube-scheduler samples: the next
    /// [`feasible_nodes_to_find`] nodes that pass its own filters, from where the last pod's
    /// search stopped (`nextStartNodeIndex`); a pod that fits no node of its window is retried on
    /// the next one, as kube-scheduler's backoff would.
    pub percentage_of_nodes_to_score: u32,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            score_cache: true,
            ties: Ties::Name,
            percentage_of_nodes_to_score: 100,
        }
    }
}

/// Run `policy` on `arrivals` (class indices of `trace`). `seed` drives the random policy's
/// choices; score ties go to the node with the smallest name.
pub fn simulate(
    cluster: &Cluster,
    trace: &Trace,
    arrivals: &[u32],
    policy: Policy,
    seed: u64,
    tune: f64,
) -> RunResult {
    simulate_with(
        cluster,
        trace,
        arrivals,
        policy,
        seed,
        tune,
        RunOptions::default(),
    )
}

/// [`simulate`] with [`RunOptions`]. Random ties draw from the random policy's stream.
pub fn simulate_with(
    cluster: &Cluster,
    trace: &Trace,
    arrivals: &[u32],
    policy: Policy,
    seed: u64,
    tune: f64,
    opts: RunOptions,
) -> RunResult {
    let score_cache = opts.score_cache;
    let table = &trace.table;
    let frag_of = |st: &NodeState| match policy {
        Policy::Ours => trace.ours.measure(st.view(), st.mem_left),
        Policy::FgdLive => trace.live.fragmentation(st.gpus()),
        Policy::OursLive | Policy::DraExtender => {
            trace.live.gap_measure(st.gpus(), Some(st.host_left()))
        }
        _ => table.fragmentation(st.view()),
    };
    let mut nodes: Vec<NodeState> = cluster
        .nodes
        .iter()
        .map(|n| {
            let mut gpu_left = [0u32; MAX_GPUS];
            let ngpu = (n.gpus as usize).min(MAX_GPUS);
            gpu_left[..ngpu].fill(MILLI);
            let mut st = NodeState {
                cpu_left: n.cpu_milli,
                mem_left: n.memory_mib,
                cpu_mem_cap: (n.cpu_milli, n.memory_mib),
                gpu_left,
                ngpu,
                model: n.model,
                kinds: [0; MAX_GPUS + 1],
                version: 1,
                frag: 0.0,
            };
            if policy.uses_fragmentation() {
                st.frag = frag_of(&st);
            }
            st
        })
        .collect();
    let n = nodes.len();
    // The published simulator's kube-scheduler breaks score ties by the smallest node name
    // ("for reproducibility"), not at random as upstream selectHost does.
    let mut by_name: Vec<usize> = (0..n).collect();
    by_name.sort_by(|&a, &b| cluster.nodes[a].name.cmp(&cluster.nodes[b].name));
    let mut rank = vec![0u32; n];
    for (r, &i) in by_name.iter().enumerate() {
        rank[i] = r as u32;
    }
    let mut cache = vec![
        Cached {
            version: 0,
            score: 0,
            pick: GpuPick::None,
            feasible: false,
        };
        n * trace.classes.len()
    ];
    // The random policy's stream, independent of the workload stream of the same seed.
    let mut rng = Rng::new(
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add(0x1234_5678),
    );
    let capacity = cluster.gpu_capacity().max(1);
    let last = points(tune);
    let mut alloc_pct = Vec::with_capacity(last + 1);
    let mut arrived: u64 = 0;
    let mut allocated: u64 = 0;
    let mut failed = 0;
    let mut placements = Vec::with_capacity(arrivals.len());
    let mut nodes_at_100: Vec<NodeState> = Vec::new();
    let window = feasible_nodes_to_find(opts.percentage_of_nodes_to_score, n);
    let mut next_start = 0usize;
    let mut retried = 0;

    for &cls_id in arrivals {
        let c = &trace.classes[cls_id as usize];
        let row = &mut cache[cls_id as usize * n..(cls_id as usize + 1) * n];
        let mut best: Option<(usize, i64, GpuPick)> = None;
        let mut feasible = 0u64;
        let mut tied = 0u64;
        let mut in_window = 0usize;
        let mut processed = 0usize;
        let mut missed_a_window = false;
        for step in 0..n {
            let i = (next_start + step) % n;
            let node = &nodes[i];
            if window < n {
                if in_window == window {
                    if best.is_some() {
                        break;
                    }
                    if !missed_a_window {
                        missed_a_window = true;
                        retried += 1;
                    }
                    in_window = 0;
                }
                if node.host_fits(c) {
                    in_window += 1;
                }
            }
            processed += 1;
            let e = &mut row[i];
            if e.version != node.version || !score_cache {
                match score(policy, node, c, trace, opts.ties == Ties::Name) {
                    Some((s, p)) => {
                        *e = Cached {
                            version: node.version,
                            score: s,
                            pick: p,
                            feasible: true,
                        }
                    }
                    None => {
                        *e = Cached {
                            version: node.version,
                            score: 0,
                            pick: GpuPick::None,
                            feasible: false,
                        }
                    }
                }
            }
            if !e.feasible {
                continue;
            }
            if policy == Policy::Random {
                // Its PreScore draws one feasible node uniformly (reservoir sampling here).
                feasible += 1;
                if rng.below(feasible) == 0 {
                    best = Some((i, e.score, e.pick));
                }
                continue;
            }
            match best {
                Some((_, s, _)) if e.score < s => {}
                Some((b, s, _)) if e.score == s => {
                    let take = match opts.ties {
                        Ties::Name => rank[i] < rank[b],
                        // Reservoir sampling over the nodes tied at the best score so far.
                        Ties::Random => {
                            tied += 1;
                            rng.below(tied) == 0
                        }
                    };
                    if take {
                        best = Some((i, e.score, e.pick));
                    }
                }
                _ => {
                    tied = 1;
                    best = Some((i, e.score, e.pick));
                }
            }
        }
        next_start = (next_start + processed) % n.max(1);
        let s = &c.shape;
        arrived += s.total_milli();
        match best {
            Some((i, _, pick)) => {
                let node = &mut nodes[i];
                node.cpu_left -= s.cpu_milli;
                node.mem_left -= c.memory_mib;
                if s.is_share() {
                    let gpu = match pick {
                        GpuPick::Index(g) => Some(g as usize),
                        GpuPick::Random => {
                            let fitting: Vec<usize> = (0..node.ngpu)
                                .filter(|&g| node.gpu_left[g] >= s.gpu_milli)
                                .collect();
                            fitting
                                .get(rng.below(fitting.len() as u64) as usize)
                                .copied()
                        }
                        GpuPick::None => node.best_fit_gpu(s.gpu_milli),
                    };
                    if let Some(g) = gpu {
                        node.gpu_left[g] -= s.gpu_milli;
                    }
                    node.kinds[0] += 1;
                } else if s.num_gpu > 0 {
                    let (g, _) = node.after(c, None);
                    node.gpu_left = g;
                    node.kinds[(s.num_gpu as usize).min(MAX_GPUS)] += 1;
                }
                node.version += 1;
                if policy.uses_fragmentation() {
                    node.frag = frag_of(node);
                }
                allocated += s.total_milli();
                placements.push(Some(i as u32));
            }
            None => {
                failed += 1;
                placements.push(None);
            }
        }
        if nodes_at_100.is_empty() && arrived >= capacity {
            nodes_at_100 = nodes.clone();
        }
        while alloc_pct.len() <= last && arrived * 100 >= alloc_pct.len() as u64 * capacity {
            alloc_pct.push(allocated as f64 * 100.0 / capacity as f64);
        }
    }
    let final_pct = allocated as f64 * 100.0 / capacity as f64;
    while alloc_pct.len() <= last {
        alloc_pct.push(final_pct);
    }
    RunResult {
        trace: trace.name.clone(),
        policy,
        seed,
        alloc_pct,
        pods: arrivals.len(),
        failed,
        retried,
        placements,
        nodes_at_100: if nodes_at_100.is_empty() {
            nodes
        } else {
            nodes_at_100
        },
    }
}
