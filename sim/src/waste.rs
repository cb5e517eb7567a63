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
    fn deterministic() {
        let counts = HashMap::from([
            (shape(470, 1), 30),
            (shape(320, 1), 20),
            (shape(1000, 1), 9),
        ]);
        assert_eq!(learned_waste(&counts, 3), learned_waste(&counts, 3));
    }
}
