//! GPU fragmentation measure of Fragmentation Gradient Descent (Weng et al., "Beware of
//! Fragmentation", USENIX ATC'23), as the published simulator computes it.
//!
//! A node's fragmentation is the expected amount of its idle milli-GPU that the next pod, drawn
//! from the *typical* workload, could not use:
//!
//! * a CPU-only pod uses no GPU, so all idle GPU is fragment for it;
//! * a pod whose GPU model list excludes the node's model: all idle GPU;
//! * a pod that fits (enough GPUs with `left >= milli` and enough CPU): the GPUs with
//!   `left < milli`, which it cannot use;
//! * a pod that does not fit: all idle GPU.
//!
//! FGD places a pod where it *reduces* fragmentation most: score = `sigmoid(ΔF / 1000) × 100`.
//! Everything here is pure arithmetic on small slices, shared by the live scheduler and the trace
//! simulator (`vgpu-sim`), so both score nodes identically.

use std::cmp::Ordering;

/// One GPU in milli-GPU (1000 = a whole card).
pub const MILLI: u32 = 1000;

/// A set of GPU models, one bit per model index (the caller numbers its models); empty = any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelMask(pub u64);

impl ModelMask {
    /// No constraint: every model is allowed.
    pub const ANY: ModelMask = ModelMask(0);

    /// The set holding the given model indices; `None` if one is 64 or more (a mask has 64 bits).
    pub fn of(models: impl IntoIterator<Item = u32>) -> Option<ModelMask> {
        let mut bits = 0u64;
        for m in models {
            bits |= 1u64.checked_shl(m).filter(|_| m < 64)?;
        }
        Some(ModelMask(bits))
    }

    /// Whether a GPU of model index `model` satisfies this constraint.
    pub fn allows(self, model: u32) -> bool {
        self.0 == 0 || (model < 64 && self.0 & (1u64 << model) != 0)
    }
}

/// The resource shape of a pod as fragmentation sees it (memory plays no part, as in FGD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PodShape {
    /// CPU request in milli-CPU.
    pub cpu_milli: u64,
    /// milli-GPU per GPU: 1..=999 for a shared GPU, 1000 for whole GPUs, 0 for a CPU-only pod.
    pub gpu_milli: u32,
    /// Number of GPUs (0 for a CPU-only pod).
    pub num_gpu: u32,
    /// Allowed GPU models.
    pub models: ModelMask,
}

impl PodShape {
    /// Total milli-GPU the pod asks for.
    pub fn total_milli(&self) -> u64 {
        u64::from(self.gpu_milli) * u64::from(self.num_gpu)
    }

    /// Whether this is a GPU-sharing pod (one GPU, part of it).
    pub fn is_share(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < MILLI
    }
}

/// A typical pod with its probability in the target workload.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TypicalPod {
    /// The shape.
    pub shape: PodShape,
    /// Probability, the weights of a list summing to 1.
    pub weight: f64,
}

/// Order of the published simulator: most frequent first; equal counts by descending
/// (cpu, milli, num, models).
fn popularity_order(a: &(PodShape, u64), b: &(PodShape, u64)) -> Ordering {
    b.1.cmp(&a.1).then_with(|| {
        let ka = (a.0.cpu_milli, a.0.gpu_milli, a.0.num_gpu, a.0.models);
        let kb = (b.0.cpu_milli, b.0.gpu_milli, b.0.num_gpu, b.0.models);
        kb.cmp(&ka)
    })
}

/// The typical pods of a workload: distinct shapes with their counts, most frequent first, the
/// top ones until they cover `popularity_pct` percent of all pods (one shape at a time), weights
/// renormalised to sum to 1. Returns an empty list for an empty workload.
pub fn typical_pods(
    counts: impl IntoIterator<Item = (PodShape, u64)>,
    popularity_pct: f64,
) -> Vec<TypicalPod> {
    let mut shapes: Vec<(PodShape, u64)> = counts.into_iter().filter(|(_, c)| *c > 0).collect();
    shapes.sort_by(popularity_order);
    let total: u64 = shapes.iter().map(|(_, c)| c).sum();
    if total == 0 {
        return Vec::new();
    }
    let expected = popularity_pct * total as f64 / 100.0;
    let mut cum = 0u64;
    let mut taken = 0;
    while taken < shapes.len() && (cum as f64) < expected {
        cum += shapes[taken].1;
        taken += 1;
    }
    shapes.truncate(taken.max(1));
    let kept: u64 = shapes.iter().map(|(_, c)| c).sum();
    shapes
        .into_iter()
        .map(|(shape, c)| TypicalPod {
            shape,
            weight: c as f64 / kept as f64,
        })
        .collect()
}

/// What fragmentation needs to know about a node.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    /// Free milli-CPU.
    pub cpu_left: u64,
    /// Free milli-GPU of each GPU, in device order.
    pub gpu_left: &'a [u32],
    /// The node's GPU model index.
    pub model: u32,
}

impl NodeView<'_> {
    /// Total idle milli-GPU.
    pub fn idle(&self) -> u64 {
        self.gpu_left.iter().map(|&g| u64::from(g)).sum()
    }
}

/// Fragment (milli-GPU) of `node` with respect to one pod shape.
pub fn pod_fragment(node: NodeView<'_>, pod: &PodShape) -> u64 {
    let idle = node.idle();
    if pod.gpu_milli == 0 || !pod.models.allows(node.model) {
        return idle;
    }
    let fitting = node
        .gpu_left
        .iter()
        .filter(|&&g| g >= pod.gpu_milli)
        .count();
    if fitting >= pod.num_gpu as usize && node.cpu_left >= pod.cpu_milli {
        node.gpu_left
            .iter()
            .filter(|&&g| g < pod.gpu_milli)
            .map(|&g| u64::from(g))
            .sum()
    } else {
        idle
    }
}

/// Node fragmentation: the typical pods' fragments weighted by their probabilities (reference
/// form, one pass per typical pod; [`FragTable`] computes the same faster).
pub fn node_fragmentation(node: NodeView<'_>, typical: &[TypicalPod]) -> f64 {
    typical
        .iter()
        .map(|t| t.weight * pod_fragment(node, &t.shape) as f64)
        .sum()
}

/// FGD's node score for a move from fragmentation `before` to `after`:
/// `int(sigmoid((before - after) / 1000) × 100)`, in 0..=100.
pub fn fgd_score(before: f64, after: f64) -> i64 {
    let x = (before - after) / 1000.0;
    (100.0 / (1.0 + (-x).exp())) as i64
}

/// Typical pods of one GPU group (same milli, count and models), sorted by CPU.
#[derive(Clone, Debug)]
struct Group {
    gpu_milli: u32,
    num_gpu: u32,
    models: ModelMask,
    /// CPU requests ascending.
    cpu: Vec<u64>,
    /// `cum[i]` = total weight of the first `i` entries; `cum.len() == cpu.len() + 1`.
    cum: Vec<f64>,
}

impl Group {
    fn weight_fitting_cpu(&self, cpu_left: u64) -> f64 {
        let n = self.cpu.partition_point(|&c| c <= cpu_left);
        self.cum[n]
    }

    fn total(&self) -> f64 {
        self.cum[self.cpu.len()]
    }
}

/// Typical pods precompiled for fast [`node_fragmentation`]: pods grouped by GPU request, one
/// pass over the GPUs per group and a binary search on CPU.
#[derive(Clone, Debug)]
pub struct FragTable {
    groups: Vec<Group>,
    cpu_only: f64,
}

impl FragTable {
    /// Compile a typical pod list.
    pub fn new(typical: &[TypicalPod]) -> FragTable {
        let mut cpu_only = 0.0;
        // (milli, count, models) -> (cpu, weight) of its pods.
        type Key = (u32, u32, ModelMask);
        let mut groups: Vec<(Key, Vec<(u64, f64)>)> = Vec::new();
        for t in typical {
            let s = &t.shape;
            if s.gpu_milli == 0 {
                cpu_only += t.weight;
                continue;
            }
            let key = (s.gpu_milli, s.num_gpu, s.models);
            match groups.iter_mut().find(|g| g.0 == key) {
                Some(g) => g.1.push((s.cpu_milli, t.weight)),
                None => groups.push((key, vec![(s.cpu_milli, t.weight)])),
            }
        }
        let groups = groups
            .into_iter()
            .map(|((gpu_milli, num_gpu, models), mut pods)| {
                pods.sort_by_key(|p| p.0);
                let mut cum = Vec::with_capacity(pods.len() + 1);
                cum.push(0.0);
                let mut acc = 0.0;
                for p in &pods {
                    acc += p.1;
                    cum.push(acc);
                }
                Group {
                    gpu_milli,
                    num_gpu,
                    models,
                    cpu: pods.iter().map(|p| p.0).collect(),
                    cum,
                }
            })
            .collect();
        FragTable { groups, cpu_only }
    }

    /// Node fragmentation, equal to [`node_fragmentation`] up to float rounding.
    pub fn fragmentation(&self, node: NodeView<'_>) -> f64 {
        let idle = node.idle() as f64;
        if idle == 0.0 {
            return 0.0;
        }
        let mut f = self.cpu_only * idle;
        for g in &self.groups {
            let total = g.total();
            if !g.models.allows(node.model) {
                f += total * idle;
                continue;
            }
            let mut fitting = 0u32;
            let mut small = 0u64;
            for &left in node.gpu_left {
                if left >= g.gpu_milli {
                    fitting += 1;
                } else {
                    small += u64::from(left);
                }
            }
            if fitting < g.num_gpu {
                f += total * idle;
                continue;
            }
            let fit = g.weight_fitting_cpu(node.cpu_left);
            f += fit * small as f64 + (total - fit) * idle;
        }
        f
    }
}

/// GPU a node cannot fill for lack of CPU: idle milli-GPU beyond what its free CPU can serve
/// at `cpu_per_milli_gpu` milli-CPU per milli-GPU (the workload's GPU pods' average).
pub fn cpu_stranded(node: NodeView<'_>, cpu_per_milli_gpu: f64) -> f64 {
    if cpu_per_milli_gpu <= 0.0 {
        return 0.0;
    }
    (node.idle() as f64 - node.cpu_left as f64 / cpu_per_milli_gpu).max(0.0)
}

/// Expected final waste of a single GPU by its free milli: `table[r]` for `r` in `0..=1000`.
///
/// A GPU with `r` free receives single-GPU pods drawn from `mix` (milli per GPU, weight),
/// conditioned on fitting, until none fits; `table[r]` is the expected milli left then. Whole-GPU
/// pods (1000) in the mix make a free GPU's expected waste small; a remainder below the smallest
/// share is wasted entirely.
pub fn single_gpu_waste(mix: &[(u32, f64)]) -> Vec<f64> {
    let mut v = vec![0.0; MILLI as usize + 1];
    for r in 0..=MILLI as usize {
        let (mut w, mut acc) = (0.0, 0.0);
        for &(m, p) in mix {
            let m = m as usize;
            if m > 0 && m <= r && p > 0.0 {
                w += p;
                acc += p * v[r - m];
            }
        }
        v[r] = if w > 0.0 { acc / w } else { r as f64 };
    }
    v
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A pod shape of any model, for the measures' tests.
    pub(in crate::placement) fn shape(cpu: u64, milli: u32, num: u32) -> PodShape {
        PodShape {
            cpu_milli: cpu,
            gpu_milli: milli,
            num_gpu: num,
            models: ModelMask::ANY,
        }
    }

    #[test]
    fn fragment_cases() {
        let gpus = [1000, 300, 600, 0];
        let node = NodeView {
            cpu_left: 8000,
            gpu_left: &gpus,
            model: 2,
        };
        assert_eq!(node.idle(), 1900);
        // CPU-only: all idle GPU.
        assert_eq!(pod_fragment(node, &shape(1000, 0, 0)), 1900);
        // A 500m pod fits on the 1000 and 600 GPUs; 300 (and 0) are fragment.
        assert_eq!(pod_fragment(node, &shape(1000, 500, 1)), 300);
        // Not enough CPU: everything is fragment.
        assert_eq!(pod_fragment(node, &shape(9000, 500, 1)), 1900);
        // Two whole GPUs: only one is free.
        assert_eq!(pod_fragment(node, &shape(1000, 1000, 2)), 1900);
        // One whole GPU: the partial ones are fragment.
        assert_eq!(pod_fragment(node, &shape(1000, 1000, 1)), 900);
        // Model not allowed.
        let mut s = shape(1000, 500, 1);
        s.models = ModelMask::of([1]).unwrap();
        assert_eq!(pod_fragment(node, &s), 1900);
        s.models = ModelMask::of([1, 2]).unwrap();
        assert_eq!(pod_fragment(node, &s), 300);
    }

    #[test]
    fn typical_pods_cover_threshold_and_renormalise() {
        let counts = vec![
            (shape(1, 500, 1), 50),
            (shape(2, 1000, 1), 30),
            (shape(3, 0, 0), 15),
            (shape(4, 1000, 8), 5),
        ];
        let t = typical_pods(counts.clone(), 95.0);
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].shape, shape(1, 500, 1));
        assert!((t[0].weight - 50.0 / 95.0).abs() < 1e-12);
        let sum: f64 = t.iter().map(|p| p.weight).sum();
        assert!((sum - 1.0).abs() < 1e-12);
        assert_eq!(typical_pods(counts, 100.0).len(), 4);
        assert!(typical_pods(Vec::new(), 95.0).is_empty());
    }

    #[test]
    fn typical_pods_break_count_ties_by_descending_shape() {
        let t = typical_pods(vec![(shape(1, 500, 1), 10), (shape(2, 500, 1), 10)], 50.0);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].shape.cpu_milli, 2);
    }

    #[test]
    fn table_matches_reference() {
        let typical = typical_pods(
            vec![
                (shape(2000, 500, 1), 40),
                (shape(6000, 500, 1), 10),
                (shape(4000, 250, 1), 20),
                (shape(8000, 1000, 1), 15),
                (shape(16000, 1000, 2), 5),
                (shape(1000, 0, 0), 10),
                (
                    PodShape {
                        models: ModelMask::of([0]).unwrap(),
                        ..shape(3000, 1000, 1)
                    },
                    7,
                ),
            ],
            100.0,
        );
        let table = FragTable::new(&typical);
        let states: [&[u32]; 5] = [
            &[1000, 1000],
            &[400, 1000, 0, 750],
            &[100],
            &[0, 0],
            &[500, 500, 1000, 1000, 250, 0, 0, 1000],
        ];
        for gpus in states {
            for cpu in [0, 1500, 2000, 5000, 7000, 100_000] {
                for model in [0, 1] {
                    let node = NodeView {
                        cpu_left: cpu,
                        gpu_left: gpus,
                        model,
                    };
                    let a = node_fragmentation(node, &typical);
                    let b = table.fragmentation(node);
                    assert!(
                        (a - b).abs() < 1e-6,
                        "{gpus:?} cpu {cpu} model {model}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn fgd_score_is_sigmoid_of_delta() {
        assert_eq!(fgd_score(1000.0, 1000.0), 50);
        assert_eq!(fgd_score(2000.0, 1000.0), 73);
        assert_eq!(fgd_score(1000.0, 2000.0), 26);
        assert_eq!(fgd_score(1e9, 0.0), 100);
        assert_eq!(fgd_score(0.0, 1e9), 0);
    }

    #[test]
    fn stranded_gpu_is_what_cpu_cannot_serve() {
        let gpus = [1000, 1000, 500];
        let node = NodeView {
            cpu_left: 12_000,
            gpu_left: &gpus,
            model: 0,
        };
        // 12 CPU at 12 milli-CPU per milli-GPU serve 1000 milli of the 2500 idle.
        assert!((cpu_stranded(node, 12.0) - 1500.0).abs() < 1e-9);
        assert_eq!(cpu_stranded(node, 1.0), 0.0);
        assert_eq!(cpu_stranded(node, 0.0), 0.0);
    }

    #[test]
    fn single_gpu_waste_table() {
        // Only 400m pods: 1000 -> 600 -> 200 wasted; 399 wasted entirely; 800 -> 0.
        let v = single_gpu_waste(&[(400, 1.0)]);
        assert_eq!(v.len(), 1001);
        assert_eq!(v[1000], 200.0);
        assert_eq!(v[399], 399.0);
        assert_eq!(v[800], 0.0);
        // Half whole-GPU pods, half 400m: a free GPU wastes (0 + 200) / 2.
        let v = single_gpu_waste(&[(1000, 1.0), (400, 1.0)]);
        assert_eq!(v[1000], 100.0);
        assert_eq!(single_gpu_waste(&[])[700], 700.0);
    }

    #[test]
    fn model_mask() {
        assert!(ModelMask::ANY.allows(5));
        let m = ModelMask::of([3, 5]).unwrap();
        assert!(m.allows(3));
        assert!(!m.allows(4));
        assert!(!m.allows(70));
        assert_eq!(ModelMask::of([3, 70]), None);
    }
}
