//! `vgpu-sim`: trace-driven simulator for GPU placement policies.
//!
//! It replays the Alibaba GPU-sharing trace (`openb_*` CSVs) with the method of the published FGD
//! simulator (Weng et al., ATC'23), so its numbers compare with the published ones: the workload
//! is tuned to `tune` × cluster GPU capacity by drawing trace pods with replacement, shuffled by
//! seed, and scheduled one pod at a time, never deleted. The GPU allocation ratio is recorded at
//! every 1 % of arrived GPU request. Fragmentation math lives in
//! [`vgpu_core::placement::frag`], shared with the live scheduler.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod node;
pub mod ours;
pub mod policy;
pub mod report;
pub mod rng;
pub mod run;
pub mod trace;
pub mod workload;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

pub use policy::Policy;
pub use run::{simulate, simulate_with, RunOptions, RunResult, Ties};
pub use workload::{Cluster, Trace};

/// Parse a seed list: `42`, `42-51`, `1,2,7-9`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |e: std::num::ParseIntError| format!("seed `{part}`: {e}");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u64, u64) = (
                    a.trim().parse().map_err(bad)?,
                    b.trim().parse().map_err(bad)?,
                );
                if b < a {
                    return Err(format!("seed range `{part}` is empty"));
                }
                if b - a >= 100_000 {
                    return Err(format!("seed range `{part}` is too long"));
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(bad)?),
        }
    }
    if out.is_empty() {
        return Err("no seed given".into());
    }
    Ok(out)
}

/// Run every (trace, policy, seed) on `threads` threads. Results come back in job order:
/// trace, then policy, then seed.
pub fn run_all(
    cluster: &Cluster,
    traces: &[Trace],
    policies: &[Policy],
    seeds: &[u64],
    tune: f64,
    threads: usize,
) -> Vec<RunResult> {
    run_all_with(
        cluster,
        traces,
        policies,
        seeds,
        tune,
        threads,
        RunOptions::default(),
    )
}

/// [`run_all`] with [`RunOptions`] (see [`simulate_with`]).
pub fn run_all_with(
    cluster: &Cluster,
    traces: &[Trace],
    policies: &[Policy],
    seeds: &[u64],
    tune: f64,
    threads: usize,
    opts: RunOptions,
) -> Vec<RunResult> {
    let capacity = cluster.gpu_capacity();
    let mut jobs = Vec::new();
    let mut workloads = Vec::new();
    for (t, trace) in traces.iter().enumerate() {
        for &seed in seeds {
            workloads.push(((t, seed), trace.arrivals(capacity, tune, seed)));
        }
        for &p in policies {
            for (si, &seed) in seeds.iter().enumerate() {
                jobs.push((t, p, seed, t * seeds.len() + si));
            }
        }
    }
    let next = AtomicUsize::new(0);
    let slots: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| loop {
                let j = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(t, p, seed, w)) = jobs.get(j) else {
                    break;
                };
                let r = simulate_with(cluster, &traces[t], &workloads[w].1, p, seed, tune, opts);
                if let Ok(mut s) = slots.lock() {
                    s[j] = Some(r);
                }
            });
        }
    });
    slots
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds() {
        assert_eq!(parse_seeds("42").unwrap(), vec![42]);
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,3-4").unwrap(), vec![1, 3, 4]);
        assert!(parse_seeds("5-3").is_err());
        assert!(parse_seeds("x").unwrap_err().contains("seed `x`"));
        assert!(parse_seeds("").is_err());
    }
}
