//! Cluster and workload of one simulation, built the way the published FGD simulator builds them.

use std::collections::HashMap;

use vgpu_core::placement::frag::{typical_pods, FragTable, ModelMask, PodShape, TypicalPod, MILLI};

use crate::rng::Rng;
use crate::trace::{Models, NodeRow, PodRow, TraceError, MAX_GPUS};

/// Popularity threshold of the typical pods (percent of all pods), as in the published runs.
pub const TYPICAL_POPULARITY_PCT: f64 = 95.0;

/// One node as the simulator sees it.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Node name.
    pub name: String,
    /// milli-CPU.
    pub cpu_milli: u64,
    /// MiB.
    pub memory_mib: u64,
    /// GPU count.
    pub gpus: u32,
    /// Model index.
    pub model: u32,
}

/// The GPU nodes of a node list.
#[derive(Clone, Debug)]
pub struct Cluster {
    /// Nodes.
    pub nodes: Vec<NodeSpec>,
    /// Model names by index.
    pub models: Models,
}

impl Cluster {
    /// Build from a node list (CPU-only nodes included: CPU-only pods may land there).
    pub fn new(rows: &[NodeRow]) -> Result<Cluster, TraceError> {
        let mut models = Models::default();
        let mut nodes = Vec::new();
        for r in rows {
            nodes.push(NodeSpec {
                name: r.name.clone(),
                cpu_milli: r.cpu_milli,
                memory_mib: r.memory_mib,
                gpus: r.gpus.min(MAX_GPUS as u32),
                model: models.intern(&r.model)?,
            });
        }
        Ok(Cluster { nodes, models })
    }

    /// Total milli-GPU.
    pub fn gpu_capacity(&self) -> u64 {
        self.nodes
            .iter()
            .map(|n| u64::from(n.gpus) * u64::from(MILLI))
            .sum()
    }

    /// Total GPUs.
    pub fn gpu_count(&self) -> u64 {
        self.nodes.iter().map(|n| u64::from(n.gpus)).sum()
    }
}

/// A distinct pod request (all pods of a class score alike, so scores are cached per class):
/// its shape and memory request, MiB (memory must fit but plays no part in fragmentation).
pub use vgpu_core::placement::host::PodKind as PodClass;

/// A pod list turned into classes, with its typical pods.
#[derive(Clone, Debug)]
pub struct Trace {
    /// Report name (`default`, `gpushare100`, ...).
    pub name: String,
    /// Distinct classes.
    pub classes: Vec<PodClass>,
    /// The trace's pods, as class indices, in file order.
    pub pods: Vec<u32>,
    /// Typical pods (FGD's target workload).
    pub typical: Vec<TypicalPod>,
    /// The same, compiled.
    pub table: FragTable,
    /// Model of `ours`.
    pub ours: crate::ours::Ours,
    /// The live extender's table for `fgd-live` and `ours-live`: the same typical pods (GPU
    /// shape only) and the host terms of the trace's pod kinds without model lists.
    pub live: vgpu_core::placement::live::LiveFrag,
}

impl Trace {
    /// Build from pod rows; models of `gpu_spec` lists are numbered in `cluster.models`.
    pub fn new(name: &str, rows: &[PodRow], cluster: &mut Cluster) -> Result<Trace, TraceError> {
        let mut index: HashMap<PodClass, u32> = HashMap::new();
        let mut classes = Vec::new();
        let mut pods = Vec::with_capacity(rows.len());
        let mut shape_counts: HashMap<PodShape, u64> = HashMap::new();
        let mut class_counts: HashMap<PodClass, u64> = HashMap::new();
        for r in rows {
            let models = if r.num_gpu == 0 {
                ModelMask::ANY
            } else {
                cluster.models.mask(&r.gpu_spec)?
            };
            let class = PodClass {
                shape: PodShape {
                    cpu_milli: r.cpu_milli,
                    gpu_milli: r.gpu_milli,
                    num_gpu: r.num_gpu,
                    models,
                },
                memory_mib: r.memory_mib,
            };
            *shape_counts.entry(class.shape).or_default() += 1;
            *class_counts.entry(class).or_default() += 1;
            let id = *index.entry(class).or_insert_with(|| {
                classes.push(class);
                classes.len() as u32 - 1
            });
            pods.push(id);
        }
        let typical = typical_pods(
            shape_counts.iter().map(|(s, n)| (*s, *n)),
            TYPICAL_POPULARITY_PCT,
        );
        let table = FragTable::new(&typical);
        let ours = crate::ours::Ours::new(&class_counts, TYPICAL_POPULARITY_PCT);
        // What the extender learns from the pods it watches: shapes with their GPU-type lists,
        // CPU and memory requests.
        let live = vgpu_core::placement::live::LiveFrag::new(&typical).with_host(
            crate::ours::sorted_kinds(class_counts.iter().map(|(c, &n)| (*c, n))),
            TYPICAL_POPULARITY_PCT,
        );
        Ok(Trace {
            name: name.to_string(),
            classes,
            pods,
            typical,
            table,
            ours,
            live,
        })
    }

    fn milli(&self, pod: u32) -> u64 {
        self.classes[pod as usize].shape.total_milli()
    }

    /// The arrival sequence of one run: the published simulator's workload tuning for `tune`
    /// (ratio of total GPU request to capacity), then a shuffle, both drawn from `seed`.
    ///
    /// Under the target, pods are drawn with replacement and appended until the next one would
    /// pass it (the published code compares with the drawn pod's per-GPU milli, which we copy);
    /// over it, random pods are removed until the total is at most the target.
    pub fn arrivals(&self, capacity: u64, tune: f64, seed: u64) -> Vec<u32> {
        let mut rng = Rng::new(seed);
        let mut pods = self.pods.clone();
        let mut total: u64 = pods.iter().map(|&p| self.milli(p)).sum();
        let target = tune * capacity as f64;
        if tune > 0.0 && !self.pods.is_empty() {
            if (total as f64) < target {
                loop {
                    let p = self.pods[rng.below(self.pods.len() as u64) as usize];
                    let per_gpu = u64::from(self.classes[p as usize].shape.gpu_milli);
                    if (total + per_gpu) as f64 > target {
                        break;
                    }
                    total += self.milli(p);
                    pods.push(p);
                }
            } else {
                while total as f64 > target && !pods.is_empty() {
                    let i = rng.below(pods.len() as u64) as usize;
                    total -= self.milli(pods.remove(i));
                }
            }
        }
        rng.shuffle(&mut pods);
        pods
    }
}
