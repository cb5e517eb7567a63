//! vgpu's policy (`ours`).

use std::collections::HashMap;

use vgpu_core::placement::frag::{
    fgd_score, typical_pods, FragTable, NodeView, PodShape, TypicalPod, MILLI,
};

use crate::policy::{GpuPick, NodeState};
use crate::trace::MAX_GPUS;
use crate::workload::PodClass;

/// Parameters and compiled typical pods of `ours` for one trace.
#[derive(Clone, Debug)]
pub struct Ours {
    table: FragTable,
    typical: Vec<TypicalPod>,
    alpha: f64,
    beta: f64,
    kappa: f64,
    /// milli-CPU the GPU workload asks per milli-GPU.
    cpu_per_gpu: f64,
    mem_per_gpu: f64,
    lambda: f64,
    mu: f64,
    q: String,
    tb: String,
}

impl Ours {
    /// Build from the trace's shape counts.
    pub fn new(counts: &HashMap<PodShape, u64>, mem_counts: &HashMap<PodClass, u64>) -> Ours {
        let v = std::env::var("VGPU_OURS").unwrap_or_default();
        let get = |k: &str, d: &str| {
            v.split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{k}=")).map(str::to_string))
                .unwrap_or_else(|| d.to_string())
        };
        let pop: f64 = get("pop", "95").parse().unwrap_or(95.0);
        let typical: Vec<TypicalPod> = typical_pods(counts.iter().map(|(s, n)| (*s, *n)), pop);
        let (mut cpu, mut gpu) = (0.0, 0.0);
        let (mut mem, mut mgpu) = (0.0, 0.0);
        for (c, n) in mem_counts {
            if c.shape.num_gpu > 0 {
                mem += c.memory_mib as f64 * *n as f64;
                mgpu += c.shape.total_milli() as f64 * *n as f64;
            }
        }
        for (s, n) in counts {
            if s.num_gpu > 0 {
                cpu += s.cpu_milli as f64 * *n as f64;
                gpu += s.total_milli() as f64 * *n as f64;
            }
        }
        let r: f64 = get("r", "1").parse().unwrap_or(1.0);
        Ours {
            table: FragTable::new(&typical),
            typical: typical.clone(),
            alpha: get("a", "1").parse().unwrap_or(1.0),
            beta: get("b", "0").parse().unwrap_or(0.0),
            kappa: get("k", "0").parse().unwrap_or(0.0),
            cpu_per_gpu: if gpu > 0.0 { r * cpu / gpu } else { 0.0 },
            lambda: get("l", "1").parse().unwrap_or(0.0),
            mu: get("m", "0").parse().unwrap_or(0.0),
            mem_per_gpu: if mgpu > 0.0 { r * mem / mgpu } else { 0.0 },
            q: get("q", "int"),
            tb: get("tb", "name"),
        }
    }

    /// GPU (milli) the node cannot fill for lack of CPU, at the workload's CPU per GPU.
    fn stranded(&self, v: NodeView<'_>) -> f64 {
        if self.cpu_per_gpu <= 0.0 {
            return 0.0;
        }
        (v.idle() as f64 - v.cpu_left as f64 / self.cpu_per_gpu).max(0.0)
    }

    /// Fill fragmentation: for each typical pod, the idle GPU left over after filling the node
    /// with as many copies of it as its GPUs and CPU allow.
    fn fill(&self, v: NodeView<'_>) -> f64 {
        let idle = v.idle() as f64;
        if idle == 0.0 {
            return 0.0;
        }
        let mut f = 0.0;
        for t in &self.typical {
            let s = &t.shape;
            if s.gpu_milli == 0 || !s.models.allows(v.model) {
                f += t.weight * idle;
                continue;
            }
            let gpu_copies: u64 = if s.is_share() {
                v.gpu_left.iter().map(|&g| u64::from(g / s.gpu_milli)).sum()
            } else {
                v.gpu_left.iter().filter(|&&g| g >= MILLI).count() as u64
                    / u64::from(s.num_gpu.max(1))
            };
            let cpu_copies = v.cpu_left.checked_div(s.cpu_milli).unwrap_or(u64::MAX);
            let copies = gpu_copies.min(cpu_copies);
            f += t.weight * (idle - (copies * s.total_milli()) as f64).max(0.0);
        }
        f
    }

    /// `ours`' node measure.
    pub fn fragmentation(&self, v: NodeView<'_>, mem_left: u64) -> f64 {
        let mut f = if self.alpha != 0.0 {
            self.alpha * self.table.fragmentation(v)
        } else {
            0.0
        };
        if self.beta != 0.0 {
            f += self.beta * self.fill(v);
        }
        if self.kappa != 0.0 && self.cpu_per_gpu > 0.0 {
            f += self.kappa * (v.cpu_left as f64 / self.cpu_per_gpu - v.idle() as f64).max(0.0);
        }
        if self.lambda != 0.0 {
            f += self.lambda * self.stranded(v);
        }
        if self.mu != 0.0 && self.mem_per_gpu > 0.0 {
            f += self.mu * (v.idle() as f64 - mem_left as f64 / self.mem_per_gpu).max(0.0);
        }
        f
    }

    fn after(&self, node: &NodeState, c: &PodClass, gpu: Option<usize>) -> (f64, f64) {
        let (g, cpu): ([u32; MAX_GPUS], u64) = node.after(c, gpu);
        let v = NodeView {
            cpu_left: cpu,
            gpu_left: &g[..node.ngpu],
            model: node.model,
        };
        (
            self.fragmentation(v, node.mem_left - c.memory_mib),
            self.stranded(v),
        )
    }

    /// Score of a feasible node.
    pub fn score(&self, node: &NodeState, c: &PodClass) -> (i64, GpuPick) {
        let before = node.frag;
        let primary = |after: f64| -> i64 {
            match self.q.as_str() {
                "exact" => ((before - after) * 1000.0).round() as i64,
                _ => fgd_score(before, after),
            }
        };
        let (p, pick, strand) = if c.shape.is_share() {
            let gpus = node.gpus();
            let mut best: Option<(i64, usize, u32, f64)> = None;
            for (i, &g) in gpus.iter().enumerate() {
                if g < c.shape.gpu_milli || gpus[..i].contains(&g) {
                    continue;
                }
                let (f, st) = self.after(node, c, Some(i));
                let sc = primary(f);
                let left = g - c.shape.gpu_milli;
                let better = match best {
                    None => true,
                    Some((bs, _, bl, _)) => sc > bs || (sc == bs && self.tb != "name" && left < bl),
                };
                if better {
                    best = Some((sc, i, left, st));
                }
            }
            match best {
                Some((sc, i, _, st)) => (sc, GpuPick::Index(i as u8), st),
                None => (0, GpuPick::None, 0.0),
            }
        } else {
            let (f, st) = self.after(node, c, None);
            (primary(f), GpuPick::None, st)
        };
        let secondary: i64 = match self.tb.as_str() {
            "bestfit" => {
                let gl = node.gpu_idle() as i64 - c.shape.total_milli() as i64;
                let cl = node.cpu_left as i64 - c.shape.cpu_milli as i64;
                SCALE - 1 - (gl * 1_000_000 + cl.min(999_999))
            }
            "strand" => SCALE - 1 - (strand * 1000.0) as i64,
            "strandfit" => {
                let gl = node.gpu_idle() as i64 - c.shape.total_milli() as i64;
                SCALE - 1 - ((strand as i64) * 100_000 + gl)
            }
            _ => 0,
        };
        let _ = MILLI;
        (p.saturating_mul(SCALE).saturating_add(secondary), pick)
    }
}

const SCALE: i64 = 1 << 40;
