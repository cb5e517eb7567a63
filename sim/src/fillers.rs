//! Which of a gap's fillers a node can still host by CPU (part of `ours`' `W` term).

use std::collections::HashMap;

use vgpu_core::placement::frag::PodShape;

/// Single-GPU pods of the trace by milli-GPU, to tell how many of a gap's fillers a node can
/// still host by CPU. The dual prices behind [`crate::dual`] know no CPU: a 350m gap next to 2
/// free cores will not get the 320m pod (4 to 8 cores) they count on.
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
}
