//! Which of a gap's fillers a node can still host by CPU and memory (part of `ours`' `W` term).

use std::collections::HashMap;

use crate::workload::PodClass;

/// Single-GPU pods of the trace by milli-GPU, to tell how many of a gap's fillers a node can
/// still host by CPU and memory. The dual prices behind [`vgpu_core::placement::gaps`] know neither: a 350m gap
/// next to 2 free cores will not get the 320m pod (4 to 8 cores) they count on.
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
    /// From the trace's class counts (single-GPU pods, share or whole).
    pub fn new(counts: &HashMap<PodClass, u64>) -> Fillers {
        let mut groups: Vec<Group> = Vec::new();
        for (c, &n) in counts.iter().filter(|(c, _)| c.shape.num_gpu == 1) {
            let pod = (c.shape.cpu_milli, c.memory_mib, n as f64);
            match groups.iter_mut().find(|g| g.milli == c.shape.gpu_milli) {
                Some(g) => g.pods.push(pod),
                None => groups.push(Group {
                    milli: c.shape.gpu_milli,
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
    use vgpu_core::placement::frag::{ModelMask, PodShape};

    fn class(gpu_milli: u32, cpu_milli: u64, memory_mib: u64) -> PodClass {
        PodClass {
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
        let counts = HashMap::from([
            (class(300, 1000, 100), 3),
            (class(300, 8000, 100), 1),
            (class(300, 1000, 9000), 2),
            (class(1000, 1000, 100), 6),
        ]);
        let f = Fillers::new(&counts);
        assert_eq!(f.fit(200, 0, 0), 1.0); // nothing that small
        assert_eq!(f.fit(300, 999, 1 << 20), 0.0);
        assert_eq!(f.fit(300, 1000, 100), 0.5);
        assert_eq!(f.fit(300, 1000, 9000), 5.0 / 6.0);
        assert_eq!(f.fit(999, 8000, 9000), 1.0);
        assert_eq!(f.fit(1000, 1000, 100), 9.0 / 12.0);
    }
}
