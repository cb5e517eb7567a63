//! A GPU's expected final waste by its free milli-GPU, learned by replaying the trace's own GPU
//! pods (the `W` term of [`crate::ours`]).
//!
//! A closed-form estimate (`frag::single_gpu_waste`: fill the GPU with pods drawn from the
//! single-GPU mix until none fits) assumes every remainder finds its filler. In the Alibaba
//! trace the small pods are scarce: about a hundred pods of 190m or less face over a thousand
//! 190m holes of 810m pods, so a 210m remainder (470m + 320m) is nearly all waste, while a 530m
//! one (a lone 470m) almost always gets its second 470m. Replaying the pods measures that.

use std::collections::HashMap;

use vgpu_core::placement::frag::{PodShape, MILLI};

use crate::rng::Rng;

/// Replays averaged into the table (more smooth the rarely seen remainders).
pub const ROUNDS: usize = 8;

/// Remainders seen fewer times than this keep the pessimistic `table[r] = r`.
const MIN_SEEN: u64 = 3;

/// Seed of the first replay's order; far from the small seeds runs use, though any would do.
const SEED: u64 = 0x5eed_0000_0000;

/// `table[r]` for `r` in `0..=1000`: the mean free milli at the end of a replay of the GPUs
/// that had `r` free at some point; 0 for a free GPU (whole-GPU pods use it), `r` where `r`
/// was (almost) never seen.
///
/// Each replay puts the trace's GPU pods (`counts`, CPU-only ones ignored), in a random order,
/// onto a relaxed cluster (GPUs only: no nodes, CPU or models) with just enough GPUs for their
/// demand; share pods go best fit, whole-GPU pods onto free GPUs or fail. Only the trace's
/// shape counts are used, as FGD uses them for its typical pods, never a run's order.
pub fn learned_waste(counts: &HashMap<PodShape, u64>, rounds: usize) -> Vec<f64> {
    let pods = gpu_pods(counts);
    let size = MILLI as usize + 1;
    let (mut sum, mut seen) = (vec![0.0; size], vec![0u64; size]);
    for round in 0..rounds {
        let mut order = pods.clone();
        Rng::new(SEED + round as u64).shuffle(&mut order);
        for (r, end) in replay_best_fit(&order) {
            sum[r] += end as f64;
            seen[r] += 1;
        }
    }
    (0..size)
        .map(|r| match r {
            _ if r == MILLI as usize => 0.0,
            _ if seen[r] >= MIN_SEEN => sum[r] / seen[r] as f64,
            _ => r as f64,
        })
        .collect()
}

/// The trace's GPU pods as (milli per GPU, GPUs), in a fixed order (the map's is random).
fn gpu_pods(counts: &HashMap<PodShape, u64>) -> Vec<(u32, u32)> {
    let mut shapes: Vec<(&PodShape, &u64)> = counts.iter().filter(|(s, _)| s.num_gpu > 0).collect();
    shapes.sort_by_key(|(s, _)| (s.gpu_milli, s.num_gpu, s.cpu_milli, s.models));
    let mut pods = Vec::new();
    for (s, &n) in shapes {
        let pod = (s.gpu_milli.min(MILLI), s.num_gpu);
        pods.extend(std::iter::repeat_n(pod, n as usize));
    }
    pods
}

/// One replay: every (remainder left by a share pod, that GPU's free milli at the end).
fn replay_best_fit(order: &[(u32, u32)]) -> Vec<(usize, u32)> {
    let demand: u64 = order
        .iter()
        .map(|&(m, n)| u64::from(m) * u64::from(n))
        .sum();
    let gpus = demand.div_ceil(u64::from(MILLI)) as u32;
    let full = MILLI as usize;
    // at[h]: ids of the GPUs with exactly h free; left[id]: a GPU's free milli.
    let mut at: Vec<Vec<u32>> = vec![Vec::new(); full + 1];
    at[full] = (0..gpus).rev().collect();
    let mut left = vec![MILLI; gpus as usize];
    let mut visits = Vec::new();
    let mut take = |at: &mut Vec<Vec<u32>>, h: usize, m: usize| -> Option<u32> {
        let id = at[h].pop()?;
        left[id as usize] = (h - m) as u32;
        at[h - m].push(id);
        Some(id)
    };
    for &(milli, num) in order {
        let m = milli as usize;
        if milli == MILLI {
            if at[full].len() >= num as usize {
                for _ in 0..num {
                    take(&mut at, full, full);
                }
            }
            continue;
        }
        // Best fit: the fullest GPU with room.
        if let Some(h) = (m..=full).find(|&h| !at[h].is_empty()) {
            if let Some(id) = take(&mut at, h, m) {
                visits.push((id, h - m));
            }
        }
    }
    visits
        .into_iter()
        .map(|(id, r)| (r, left[id as usize]))
        .collect()
}

/// Single-GPU pods of the trace by milli-GPU, to tell how many of a gap's fillers a node can
/// still host by CPU. The replay behind [`learned_waste`] has no CPU: a 350m gap next to 2
/// free cores will not get the 320m pod (4 to 8 cores) the table counts on.
#[derive(Clone, Debug, Default)]
pub struct Fillers {
    /// By milli ascending: (milli, CPU requests ascending, `cum[i]` = pods among the first `i`).
    groups: Vec<(u32, Vec<u64>, Vec<f64>)>,
}

impl Fillers {
    /// From the trace's shape counts (single-GPU pods, share or whole).
    pub fn new(counts: &HashMap<PodShape, u64>) -> Fillers {
        let mut by_milli: Vec<(u32, Vec<(u64, u64)>)> = Vec::new();
        for (s, &n) in counts.iter().filter(|(s, _)| s.num_gpu == 1) {
            match by_milli.iter_mut().find(|g| g.0 == s.gpu_milli) {
                Some(g) => g.1.push((s.cpu_milli, n)),
                None => by_milli.push((s.gpu_milli, vec![(s.cpu_milli, n)])),
            }
        }
        by_milli.sort_by_key(|g| g.0);
        let groups = by_milli
            .into_iter()
            .map(|(milli, mut pods)| {
                pods.sort_unstable();
                let mut cum = vec![0.0];
                for &(_, n) in &pods {
                    cum.push(cum[cum.len() - 1] + n as f64);
                }
                (milli, pods.into_iter().map(|p| p.0).collect(), cum)
            })
            .collect();
        Fillers { groups }
    }

    /// Share (0..=1) of the single-GPU pods of at most `gap` milli that ask no more than
    /// `cpu_left`; 1 when no pod is that small.
    pub fn cpu_fit(&self, gap: u32, cpu_left: u64) -> f64 {
        let (mut fit, mut all) = (0.0, 0.0);
        for (milli, cpu, cum) in &self.groups {
            if *milli > gap {
                break;
            }
            all += cum[cpu.len()];
            fit += cum[cpu.partition_point(|&c| c <= cpu_left)];
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
    use vgpu_core::placement::frag::ModelMask;

    fn shape(gpu_milli: u32, num_gpu: u32) -> PodShape {
        PodShape {
            cpu_milli: 1000,
            gpu_milli,
            num_gpu,
            models: ModelMask::ANY,
        }
    }

    #[test]
    fn pairs_fill_and_lone_remainders_waste() {
        // 500m pods pair up: a 500m remainder ends at 0. 810m pods find no filler: 190m stays.
        let counts = HashMap::from([(shape(500, 1), 40), (shape(810, 1), 20)]);
        let t = learned_waste(&counts, 4);
        assert_eq!(t.len(), 1001);
        assert_eq!(t[1000], 0.0);
        assert_eq!(t[190], 190.0);
        assert!(t[500] < 50.0, "500m remainder mostly paired: {}", t[500]);
        assert_eq!(t[0], 0.0);
        // Never seen: pessimistic.
        assert_eq!(t[333], 333.0);
    }

    #[test]
    fn scarce_fillers_leave_holes() {
        // Two 190m pods for forty 810m holes: a 190m hole mostly stays.
        let counts = HashMap::from([(shape(810, 1), 40), (shape(190, 1), 2), (shape(1000, 2), 5)]);
        let t = learned_waste(&counts, 4);
        assert!(t[190] > 150.0, "{}", t[190]);
    }

    #[test]
    fn fillers_by_cpu() {
        let mut counts = HashMap::from([(shape(300, 1), 3), (shape(1000, 1), 5)]);
        counts.insert(
            PodShape {
                cpu_milli: 8000,
                ..shape(300, 1)
            },
            1,
        );
        let f = Fillers::new(&counts);
        assert_eq!(f.cpu_fit(200, 0), 1.0); // nothing that small
        assert_eq!(f.cpu_fit(300, 999), 0.0);
        assert_eq!(f.cpu_fit(300, 1000), 0.75);
        assert_eq!(f.cpu_fit(999, 8000), 1.0);
        assert_eq!(f.cpu_fit(1000, 1000), 8.0 / 9.0);
    }

    #[test]
    fn deterministic() {
        let counts = HashMap::from([
            (shape(470, 1), 30),
            (shape(320, 1), 20),
            (shape(1000, 1), 9),
        ]);
        assert_eq!(learned_waste(&counts, 3), learned_waste(&counts, 3));
    }
}
