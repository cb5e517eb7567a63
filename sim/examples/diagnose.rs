//! Where a policy loses GPU at 100 % arrival: the pods that failed by then (by shape), and the
//! idle milli-GPU left on the nodes (whole or partial GPUs, by model and by the node's free CPU).
//!
//! `cargo run --release -p vgpu-sim --example diagnose -- <trace dir> [pod list] [seeds]
//! [policies]` (defaults: `default`, `42-51`, `fgd,ours`). Numbers are means over seeds.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use vgpu_sim::policy::parse_policies;
use vgpu_sim::{parse_seeds, simulate, trace, Cluster, Trace};

/// Free-CPU classes of a node (milli-CPU upper bounds, exclusive): below the smallest common GPU
/// pod's CPU, below an 810m pod's, below a typical whole-GPU pod's, the rest.
const CPU_CLASSES: [(u64, &str); 4] = [
    (1000, "cpu<1"),
    (3152, "cpu<3.152"),
    (11300, "cpu<11.3"),
    (u64::MAX, "cpu>=11.3"),
];

fn cpu_class(cpu: u64) -> &'static str {
    CPU_CLASSES
        .iter()
        .find(|(b, _)| cpu < *b)
        .map_or("?", |(_, n)| n)
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: diagnose <trace dir> [pod list] [seeds] [policies]")?,
    );
    let list = args.next().unwrap_or_else(|| "default".into());
    let seeds =
        parse_seeds(&args.next().unwrap_or_else(|| "42-51".into())).map_err(anyhow::Error::msg)?;
    let policies = parse_policies(&args.next().unwrap_or_else(|| "fgd,ours".into()))?;
    let rows = trace::load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let mut cluster = Cluster::new(&rows)?;
    let pods = trace::load_pods(&trace::pod_list_path(&dir, &list))?;
    let t = Trace::new(&list, &pods, &mut cluster)?;
    let cap = cluster.gpu_capacity();
    let n = seeds.len() as f64;
    for p in policies {
        // (num, milli) -> (failed count, failed milli, sum of arrival % at failure)
        let mut failed: BTreeMap<(u32, u32), (f64, f64, f64)> = BTreeMap::new();
        // (model, cpu class, whole?) -> idle milli
        let mut idle: BTreeMap<(String, &str, bool), f64> = BTreeMap::new();
        // partial free milli bucketed by 50 -> milli
        let mut partial: BTreeMap<(u32, &str), f64> = BTreeMap::new();
        let mut alloc = 0.0;
        // model -> (cpu capacity, cpu of CPU-only pods, cpu of GPU pods, cpu free, gpu free)
        let mut by_model: BTreeMap<String, [f64; 5]> = BTreeMap::new();
        for &seed in &seeds {
            let arrivals = t.arrivals(cap, 1.3, seed);
            let r = simulate(&cluster, &t, &arrivals, p, seed, 1.3);
            alloc += r.at(100).unwrap_or(0.0) / n;
            let mut arrived = 0u64;
            for (&c, pl) in arrivals.iter().zip(&r.placements) {
                if arrived >= cap {
                    break;
                }
                let s = t.classes[c as usize].shape;
                arrived += s.total_milli();
                if let Some(i) = pl {
                    let node = &cluster.nodes[*i as usize];
                    let model = cluster.models.names()[node.model as usize].clone();
                    let e = by_model.entry(model).or_default();
                    e[if s.num_gpu == 0 { 1 } else { 2 }] += s.cpu_milli as f64 / 1000.0 / n;
                }
                if pl.is_none() {
                    let e = failed.entry((s.num_gpu, s.gpu_milli)).or_default();
                    e.0 += 1.0 / n;
                    e.1 += s.total_milli() as f64 / n;
                    e.2 += arrived as f64 * 100.0 / cap as f64;
                }
            }
            for (st, spec) in r.nodes_at_100.iter().zip(&cluster.nodes) {
                let model = cluster.models.names()[st.model as usize].clone();
                let e = by_model.entry(model.clone()).or_default();
                e[0] += spec.cpu_milli as f64 / 1000.0 / n;
                e[3] += st.cpu_left as f64 / 1000.0 / n;
                e[4] += st.gpu_idle() as f64 / n;
                for &g in st.gpus() {
                    if g == 0 {
                        continue;
                    }
                    let whole = g == 1000;
                    *idle
                        .entry((model.clone(), cpu_class(st.cpu_left), whole))
                        .or_default() += f64::from(g) / n;
                    if !whole {
                        *partial
                            .entry((g / 50 * 50, cpu_class(st.cpu_left)))
                            .or_default() += f64::from(g) / n;
                    }
                }
            }
        }
        println!("== {p}: alloc@100 {alloc:.2}");
        println!("failed by 100 % arrival (num x milli: pods, milli, mean arrival % at failure):");
        for ((num, milli), (c, m, at)) in &failed {
            println!(
                "  {num} x {milli:4}: {c:7.1} {m:9.0} {:6.1}",
                at / (c * n).max(1.0)
            );
        }
        let tot: f64 = failed.values().map(|v| v.1).sum();
        println!("  total failed milli {tot:.0}");
        println!("idle milli at 100 % (model, node free CPU, whole GPU?):");
        for ((m, cls, whole), v) in &idle {
            println!(
                "  {m:8} {cls:10} {:7} {v:9.0}",
                if *whole { "whole" } else { "partial" }
            );
        }
        let tot: f64 = idle.values().sum();
        println!("  total idle milli {tot:.0}");
        println!(
            "by model: cores, cores of CPU-only pods, of GPU pods, cores free, milli-GPU free"
        );
        for (m, e) in &by_model {
            println!(
                "  {m:8} {:8.0} {:8.0} {:8.0} {:8.0} {:8.0}",
                e[0], e[1], e[2], e[3], e[4]
            );
        }
        println!("partial GPUs' free milli by 50m bucket:");
        for ((b, cls), v) in &partial {
            println!("  {b:4}-{:4} {cls:10}: {v:9.0}", b + 49);
        }
    }
    Ok(())
}
