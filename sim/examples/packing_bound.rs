//! Offline packing reference for the default trace: how much GPU a clairvoyant packer could
//! allocate at 100 % arrival if it saw every arrived pod in advance, ignoring CPU, memory and
//! node boundaries (both only make packing harder).
//!
//! For each seed, the pods that arrived by 100 % arrival (the same sequence `vgpu-sim` replays)
//! are packed into `total GPUs` bins of 1000 milli: whole-GPU pods take whole GPUs, share pods
//! go first-fit decreasing. If bins run out, whole-GPU pods fail (`all shares placed`); the
//! last figure also lets the packer drop 810m-style pods (a share pod alone on its GPU frees a
//! GPU for a whole-GPU pod).
//!
//! `upper-bound` and `lp-bound` bound every packing that places all the share pods that
//! arrived: the GPUs the share pods need (a counting argument, and the Gilmore-Gomory LP's
//! Farley bound, which is tighter) leave the rest to whole-GPU pods. They do not bound a
//! scheduler: once no GPU is free, late share pods that fit no gap fail, and a failed 810m pod
//! is one fewer 190m hole. `vgpu-sim`'s `ours` beats `lp-bound` on some seeds.
//!
//! `cargo run --release -p vgpu-sim --example packing_bound -- <trace dir> [pod list] [seeds]`
//! (defaults: `default`, `42-51`).

use std::path::PathBuf;

use anyhow::Context;
use vgpu_core::placement::gaps::share_gpus_lower_bound;
use vgpu_sim::{parse_seeds, trace, Cluster, Trace};

/// First-fit decreasing: bins used and milli placed.
fn ffd(mut shares: Vec<u32>) -> (u64, u64) {
    shares.sort_unstable_by(|a, b| b.cmp(a));
    let mut bins: Vec<u32> = Vec::new();
    for s in shares {
        match bins.iter_mut().find(|b| **b >= s) {
            Some(b) => *b -= s,
            None => bins.push(1000 - s),
        }
    }
    let used = bins.len() as u64;
    let free: u64 = bins.iter().map(|&b| u64::from(b)).sum();
    (used, used * 1000 - free)
}

/// Online best fit in the same relaxation: pods in arrival order, a share pod on the GPU with the
/// least room that fits, whole-GPU pods on free GPUs; a pod fails when nothing fits. Returns milli
/// allocated.
fn online_best_fit(pods: &[(u32, u32)], gpus: u64) -> u64 {
    // free[h] = GPUs with exactly h milli free.
    let mut free = vec![0u64; 1001];
    free[1000] = gpus;
    let mut alloc = 0;
    for &(milli, num) in pods {
        if milli < 1000 {
            if let Some(h) = (milli as usize..=1000).find(|&h| free[h] > 0) {
                free[h] -= 1;
                free[h - milli as usize] += 1;
                alloc += u64::from(milli);
            }
        } else if free[1000] >= u64::from(num) {
            free[1000] -= u64::from(num);
            alloc += 1000 * u64::from(num);
        }
    }
    alloc
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = PathBuf::from(
        args.next()
            .context("usage: packing_bound <trace dir> [pod list] [seeds]")?,
    );
    let list = args.next().unwrap_or_else(|| "default".into());
    let seeds =
        parse_seeds(&args.next().unwrap_or_else(|| "42-51".into())).map_err(anyhow::Error::msg)?;
    let rows = trace::load_nodes(&dir.join("openb_node_list_gpu_node.csv"))?;
    let mut cluster = Cluster::new(&rows)?;
    let pods = trace::load_pods(&trace::pod_list_path(&dir, &list))?;
    let t = Trace::new(&list, &pods, &mut cluster)?;
    let cap = cluster.gpu_capacity();
    let gpus = cluster.gpu_count();
    let (mut sum_a, mut sum_b, mut sum_u, mut sum_o, mut sum_l) = (0.0, 0.0, 0.0, 0.0, 0.0);
    println!("seed  online-best-fit  all-shares-placed  upper-bound  lp-bound  dropping-some-810m");
    for &seed in &seeds {
        let (mut arrived, mut whole, mut shares) = (0u64, 0u64, Vec::new());
        let mut seq = Vec::new();
        for &c in &t.arrivals(cap, 1.3, seed) {
            let s = t.classes[c as usize].shape;
            arrived += s.total_milli();
            if s.num_gpu > 0 {
                seq.push((s.gpu_milli, s.num_gpu));
            }
            if s.is_share() {
                shares.push(s.gpu_milli);
            } else {
                whole += u64::from(s.num_gpu);
            }
            if arrived >= cap {
                break;
            }
        }
        let alloc = |shares: Vec<u32>| {
            let (bins, placed) = ffd(shares);
            placed + whole.min(gpus.saturating_sub(bins)) * 1000
        };
        let a = alloc(shares.clone());
        // Bins no packing can avoid (a valid lower bound for every packing of all share pods):
        // one per pod above 500m ("big"); pods in (1000 - smallest big, 500] ("mid") cannot
        // share with a big one and go at most two to a GPU; pods between the smallest one and
        // "mid" ("small") fit into big pods' leftovers only up to those leftovers' size, and
        // what overflows needs GPUs of its own (see `per_extra`). Pods of 190m or less are assumed to fit anywhere.
        let big: Vec<u32> = shares.iter().copied().filter(|&s| s > 500).collect();
        let min_big = big.iter().copied().min().unwrap_or(1000);
        let mid_low = 1000 - min_big;
        let mid = shares.iter().filter(|&&s| s > mid_low && s <= 500).count() as u64;
        let min_small = shares
            .iter()
            .copied()
            .filter(|&s| s > 190 && s <= mid_low)
            .min()
            .unwrap_or(1000);
        let small_vol: u64 = shares
            .iter()
            .filter(|&&s| s > 190 && s <= mid_low)
            .map(|&s| u64::from(s))
            .sum();
        let absorb: u64 = big
            .iter()
            .map(|&m| 1000 - m)
            .filter(|&space| space >= min_small)
            .map(u64::from)
            .sum();
        let min_mid = shares
            .iter()
            .copied()
            .filter(|&s| s > mid_low && s <= 500)
            .min()
            .unwrap_or(500);
        // Per extra GPU: a "mid" pair split in two frees 2 × (1000 - min_mid) for small pods,
        // a GPU without "mid" 1000. Valid only if a "mid" pair leaves no room for a small pod.
        let per_extra = u64::from((2 * (1000 - min_mid)).max(1000));
        let overflow = if 1000 - 2 * min_mid.min(500) < min_small {
            small_vol.saturating_sub(absorb)
        } else {
            0
        };
        let lb = big.len() as u64 + mid.div_ceil(2) + overflow.div_ceil(per_extra);
        let share_sum: u64 = shares.iter().map(|&s| u64::from(s)).sum();
        let ub = share_sum + whole.min(gpus.saturating_sub(lb)) * 1000;
        // The LP bound is fractional: a packing needs its ceiling (less a rounding margin).
        let lp_gpus = (share_gpus_lower_bound(&shares) - 1e-6).ceil().max(0.0) as u64;
        let lp = share_sum + whole.min(gpus.saturating_sub(lp_gpus)) * 1000;
        let mut b = a;
        let big = shares.iter().filter(|&&s| s > 800).count();
        for drop in (0..=big).step_by(5) {
            let mut kept = 0;
            let v: Vec<u32> = shares
                .iter()
                .copied()
                .filter(|&s| {
                    if s > 800 && kept < drop {
                        kept += 1;
                        return false;
                    }
                    true
                })
                .collect();
            b = b.max(alloc(v));
        }
        let pct = |x: u64| x as f64 * 100.0 / cap as f64;
        let (pa, pb, pu, pl) = (pct(a), pct(b), pct(ub), pct(lp));
        sum_l += pl;
        let po = pct(online_best_fit(&seq, gpus));
        sum_o += po;
        sum_u += pu;
        sum_a += pa;
        sum_b += pb;
        println!("{seed:4}  {po:15.2}  {pa:17.2}  {pu:11.2}  {pl:8.2}  {pb:18.2}");
    }
    let n = seeds.len().max(1) as f64;
    println!(
        "mean  {:15.2}  {:17.2}  {:11.2}  {:8.2}  {:18.2}",
        sum_o / n,
        sum_a / n,
        sum_u / n,
        sum_l / n,
        sum_b / n
    );
    Ok(())
}
