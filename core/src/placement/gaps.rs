//! LP dual prices of share sizes (Gilmore-Gomory bin-packing LP): what each GPU's gap is still
//! worth, the `W` term of the `gap-aware` policy (live) and of the simulator's `ours`.
//!
//! The LP packs the trace's share pods (one GPU, under 1000m) into the fewest GPUs, patterns
//! being any multiset of sizes that fits one GPU. Its dual gives each size a price `y(s)`, in
//! GPUs, with every pattern worth at most one GPU; `K(r)`, the most a gap of `r` milli can
//! still earn at those prices, values a partial GPU. Putting a pod of size `s` into a gap `h`
//! loses `K(h) - K(h - s) - y(s) >= 0`; moves that lose nothing follow an optimal packing (a
//! 470m pod into a lone 470m's 530m gap, a 160m pod into an 810m's 190m hole), the others cost
//! what the gap can no longer earn (a 320m pod into that 530m gap: 0.5 - 0 - 0.33 of a GPU).

use super::frag::MILLI;

/// Weight of the gap waste `W` in a node measure (fragmentation and CPU-stranded GPU count
/// once): the smallest loss `W` tells apart on the Alibaba trace (a twelfth of a GPU, 83m) then
/// spans two [`BUCKET_MILLI`] steps and outweighs fragmentation's one-pod view.
pub const WASTE_WEIGHT: f64 = 8.0;

/// Width of a score step, milli-GPU of node measure: moves whose measure changes round to the
/// same step score the same, so that near-equal moves pack by node order.
pub const BUCKET_MILLI: f64 = 300.0;

/// Column generation stops after adding this many patterns (it adds about 30 on the Alibaba
/// traces).
const MAX_PATTERNS: usize = 400;
/// The LP is solved over at most this many distinct share sizes; a pod list with more (the
/// Alibaba traces have at most 20) has its sizes rounded down onto a coarser grid first
/// ([`coarsen`]): the LP's cost grows steeply with the number of sizes (100 distinct sizes took
/// seconds, 150 minutes), and a pod list given by path is outside input.
const MAX_SIZES: usize = 40;
/// Tolerance of the simplex and of "a pattern worth more than one GPU".
const EPS: f64 = 1e-9;

/// The gap table and the prices of one trace, in milli-GPU.
#[derive(Clone, Debug, PartialEq)]
pub struct GapPrices {
    /// `unusable[r]` for `r` in `0..=1000`: `r - 1000 K(r)`, the milli of a gap the prices say
    /// will not be used (0 for a free GPU, `r` for a gap no share fits; negative where a gap is
    /// worth more than its size, as an 810m pod's is). Putting a pod of `m` milli and price `p`
    /// into a gap `h` changes it by `p - m + loss`, the loss `1000 (K(h) - K(h - m)) - p >= 0`.
    pub unusable: Vec<f64>,
    /// `price[m]`: `1000 y(m)` for a share size of the trace, 0 for other sizes.
    pub price: Vec<f64>,
    /// `sized[m]`: whether `m` is one of the share sizes the prices were solved for.
    pub sized: Vec<bool>,
}

impl GapPrices {
    /// What a move of a share pod of `milli` into some gap changes `W` by when it loses nothing:
    /// `WASTE_WEIGHT (price - milli)`. A size the prices were not solved for is valued as a gap
    /// of its size, `1000 K(milli)`. Taking this out of every move of the pod centres the score
    /// steps on lossless moves.
    pub fn move_constant(&self, milli: u32) -> f64 {
        let m = milli.min(MILLI) as usize;
        if m == 0 || m >= MILLI as usize {
            return 0.0;
        }
        let value = if self.sized[m] {
            self.price[m]
        } else {
            m as f64 - self.unusable[m]
        };
        WASTE_WEIGHT * (value - m as f64)
    }

    /// `W` of a node: the unusable part of each GPU's gap (free milli-GPU per GPU).
    pub fn waste(&self, left: &[u32]) -> f64 {
        left.iter()
            .map(|&l| self.unusable[l.min(MILLI) as usize])
            .sum()
    }
}

/// The score step of a move from node measure `before` to `after` ([`BUCKET_MILLI`] wide), with
/// the pod's [`GapPrices::move_constant`] taken out.
pub fn bucket(before: f64, after: f64, constant: f64) -> i64 {
    ((before - after + constant) / BUCKET_MILLI).round() as i64
}

/// The most share sizes the live scheduler's LP works on (beyond, a coarser grid): it runs on
/// the filter path when the typical pods change; 20 sizes solve in about 0.3 ms where 40 take
/// 4-10 ms, and the Alibaba pod lists have at most 20 (with 16, coarsening cost `ours-live` 0.2
/// points on gpushare20).
pub const LIVE_MAX_SIZES: usize = 24;

/// Solve the LP of the share pods given as (milli-GPU, pods) pairs (sizes outside `1..1000`
/// are ignored; a size may repeat) and tabulate. With no share pod at all every gap is worth its
/// size (`W = 0`): the LP has nothing to say, and fragmentation alone judges the node.
pub fn gap_prices(shares: &[(u32, u64)]) -> GapPrices {
    gap_prices_within(shares, MAX_SIZES)
}

/// [`gap_prices`] over at most `max_sizes` distinct sizes (rounded down onto a coarser grid
/// beyond that).
pub fn gap_prices_within(shares: &[(u32, u64)], max_sizes: usize) -> GapPrices {
    let (sizes, demand) = share_sizes(shares);
    let table = MILLI as usize + 1;
    if sizes.is_empty() {
        return GapPrices {
            unusable: vec![0.0; table],
            price: vec![0.0; table],
            sized: vec![false; table],
        };
    }
    let (step, grid, grid_demand) = coarsen(&sizes, &demand, max_sizes.max(1));
    let prices = dual_prices(&grid, &grid_demand);
    let k = gap_values(&grid, &prices, &grid_demand);
    let full = f64::from(MILLI);
    let mut price = vec![0.0; MILLI as usize + 1];
    let mut sized = vec![false; MILLI as usize + 1];
    // Each size is priced as its grid size (the same size when the grid is not coarsened).
    for &s in &sizes {
        if let Ok(i) = grid.binary_search(&(s - s % step)) {
            price[s as usize] = full * prices[i];
            sized[s as usize] = true;
        }
    }
    GapPrices {
        unusable: k
            .iter()
            .enumerate()
            .map(|(r, v)| r as f64 - full * v)
            .collect(),
        price,
        sized,
    }
}

/// A lower bound on the GPUs that any packing of these share pods (milli each, 1..=999) needs:
/// Farley's bound `d·y / z` at the column-generation prices `y`, with `d` the pods per size and
/// `z` the most one GPU's pattern earns at `y`. It holds for any prices `y >= 0`, so rounding in
/// the LP cannot make it wrong; at the LP optimum it is the LP bound.
pub fn share_gpus_lower_bound(shares: &[u32]) -> f64 {
    let mut by: Vec<(u32, f64)> = Vec::new();
    for &m in shares.iter().filter(|&&m| m > 0 && m < MILLI) {
        match by.iter_mut().find(|e| e.0 == m) {
            Some(e) => e.1 += 1.0,
            None => by.push((m, 1.0)),
        }
    }
    by.sort_by_key(|e| e.0);
    let sizes: Vec<u32> = by.iter().map(|e| e.0).collect();
    let demand: Vec<f64> = by.iter().map(|e| e.1).collect();
    // Rounding sizes down can only lower the GPUs a packing needs, so the bound stays a bound.
    let (_, sizes, demand) = coarsen(&sizes, &demand, MAX_SIZES);
    let y = dual_prices(&sizes, &demand);
    let (z, _) = knapsack(&sizes, &y, &demand);
    let dy: f64 = demand.iter().zip(&y).map(|(d, y)| d * y).sum();
    // Prices from a column generation cut short are still a bound, but can be a weak one: never
    // below the plain size sum.
    let size_sum: f64 = shares
        .iter()
        .filter(|&&m| m > 0 && m < MILLI)
        .map(|&m| f64::from(m))
        .sum::<f64>()
        / f64::from(MILLI);
    (dy / z.max(1.0)).max(size_sum)
}

/// Sizes (ascending, with their demand) on a grid of `step` milli, rounded down, the smallest
/// step (1, 5, 10, 20, ...) that leaves at most `max_sizes` sizes; a size rounded to 0 fits
/// anywhere and is dropped. Returns the step and the grid sizes with their summed demand.
fn coarsen(sizes: &[u32], demand: &[f64], max_sizes: usize) -> (u32, Vec<u32>, Vec<f64>) {
    let mut step = 1;
    loop {
        let mut grid: Vec<(u32, f64)> = Vec::new();
        for (&s, &d) in sizes.iter().zip(demand) {
            let g = s - s % step;
            match grid.last_mut() {
                _ if g == 0 => {}
                Some(last) if last.0 == g => last.1 += d,
                _ => grid.push((g, d)),
            }
        }
        if grid.len() <= max_sizes {
            return (
                step,
                grid.iter().map(|e| e.0).collect(),
                grid.iter().map(|e| e.1).collect(),
            );
        }
        step = if step == 1 { 5 } else { step * 2 };
    }
}

/// Distinct share sizes ascending, and how many pods ask each.
fn share_sizes(shares: &[(u32, u64)]) -> (Vec<u32>, Vec<f64>) {
    let mut by: Vec<(u32, u64)> = Vec::new();
    for &(m, n) in shares.iter().filter(|e| e.0 > 0 && e.0 < MILLI && e.1 > 0) {
        match by.iter_mut().find(|e| e.0 == m) {
            Some(e) => e.1 += n,
            None => by.push((m, n)),
        }
    }
    by.sort_unstable();
    (
        by.iter().map(|e| e.0).collect(),
        by.iter().map(|e| e.1 as f64).collect(),
    )
}

/// Dual prices by column generation: solve the dual over the patterns known so far, add the
/// pattern the prices undervalue most (a bounded knapsack), until none is worth over one GPU.
fn dual_prices(sizes: &[u32], demand: &[f64]) -> Vec<f64> {
    // Start with one pattern per size: as many copies as fit (and exist).
    let mut patterns: Vec<Vec<f64>> = (0..sizes.len())
        .map(|i| {
            let mut p = vec![0.0; sizes.len()];
            p[i] = (f64::from(MILLI / sizes[i])).min(demand[i]);
            p
        })
        .collect();
    loop {
        // Basic variables come out of the tableau as tiny negatives at worst; prices are >= 0.
        let y: Vec<f64> = simplex_max(&patterns, demand)
            .into_iter()
            .map(|v| v.max(0.0))
            .collect();
        let (value, best) = knapsack(sizes, &y, demand);
        if value <= 1.0 + EPS || patterns.len() - sizes.len() >= MAX_PATTERNS {
            return y;
        }
        patterns.push(best);
    }
}

/// max `c·y` subject to `p·y <= 1` for every row `p`, `y >= 0` (dense tableau, Bland's rule).
fn simplex_max(rows: &[Vec<f64>], c: &[f64]) -> Vec<f64> {
    let (m, n) = (rows.len(), c.len());
    let width = n + m + 1;
    let mut t: Vec<Vec<f64>> = rows
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut r = p.clone();
            r.resize(width, 0.0);
            r[n + i] = 1.0;
            r[width - 1] = 1.0;
            r
        })
        .collect();
    let mut z: Vec<f64> = c.iter().map(|v| -v).collect();
    z.resize(width, 0.0);
    let mut basis: Vec<usize> = (n..n + m).collect();
    while let Some(e) = (0..n + m).find(|&j| z[j] < -EPS) {
        // Ratio test, ties to the lowest basic variable (Bland).
        let mut leave: Option<(f64, usize)> = None;
        for (i, row) in t.iter().enumerate() {
            if row[e] > EPS {
                let ratio = row[width - 1] / row[e];
                let better = leave.is_none_or(|(r, l)| {
                    ratio < r - EPS || (ratio <= r + EPS && basis[i] < basis[l])
                });
                if better {
                    leave = Some((ratio, i));
                }
            }
        }
        let Some((_, l)) = leave else {
            break; // unbounded: cannot happen, every size is in a pattern
        };
        pivot(&mut t, &mut z, l, e);
        basis[l] = e;
    }
    let mut y = vec![0.0; n];
    for (i, &b) in basis.iter().enumerate() {
        if b < n {
            y[b] = t[i][width - 1];
        }
    }
    y
}

fn pivot(t: &mut [Vec<f64>], z: &mut [f64], l: usize, e: usize) {
    let p = t[l][e];
    t[l].iter_mut().for_each(|v| *v /= p);
    let lead = t[l].clone();
    for (i, row) in t.iter_mut().enumerate() {
        let f = row[e];
        if i != l && f != 0.0 {
            row.iter_mut().zip(&lead).for_each(|(v, w)| *v -= f * w);
        }
    }
    let f = z[e];
    z.iter_mut().zip(&lead).for_each(|(v, w)| *v -= f * w);
}

/// The most valuable pattern at `prices` (at most `demand[i]` copies of size `i`): value and
/// copies per size. Of equally valuable patterns, the lightest.
fn knapsack(sizes: &[u32], prices: &[f64], demand: &[f64]) -> (f64, Vec<f64>) {
    let dp = BoundedKnapsack::solve(sizes, prices, demand, true);
    let cap = MILLI as usize;
    // The lightest pattern of the best value (exact weights, ascending).
    let mut best = (0.0, 0usize);
    for (w, &v) in dp.exact.iter().enumerate() {
        if v > best.0 + EPS {
            best = (v, w);
        }
    }
    let mut copies = vec![0.0; sizes.len()];
    let mut w = best.1;
    for (k, item) in dp.items.iter().enumerate().rev() {
        let weight = item.copies * sizes[item.size] as usize;
        // A repeatable item may have been taken several times at this pass.
        while w >= weight && dp.took[k * (cap + 1) + w] {
            copies[item.size] += item.copies as f64;
            w -= weight;
            if !item.repeatable {
                break;
            }
        }
    }
    (best.0, copies)
}

/// One 0/1 (or, when the caps cannot bind, repeatable) item of [`BoundedKnapsack`].
struct Chunk {
    /// Index of the size.
    size: usize,
    /// Copies of the size in the chunk.
    copies: usize,
    /// Any number of this chunk may go in (the size's demand is at least what fits).
    repeatable: bool,
}

/// Bounded knapsack over one GPU by exact weight. A size whose demand is at least what fits is
/// one repeatable item (one forward sweep of the 1001 weights); another is split into chunks of
/// 1, 2, 4, ... copies, each a 0/1 item (one backward sweep each). No pattern vectors are copied
/// per weight; the pattern is read back from the `took` flags.
struct BoundedKnapsack {
    /// `exact[w]`: the most a pattern of exactly `w` milli earns (`-inf`: no such pattern).
    exact: Vec<f64>,
    /// The items, in the order swept.
    items: Vec<Chunk>,
    /// `took[k * 1001 + w]`: item `k` is in the best pattern of exactly `w` milli over items
    /// `0..=k` (filled only when asked for).
    took: Vec<bool>,
}

impl BoundedKnapsack {
    fn solve(sizes: &[u32], prices: &[f64], demand: &[f64], record: bool) -> BoundedKnapsack {
        let cap = MILLI as usize;
        let mut items = Vec::new();
        for (i, &s) in sizes.iter().enumerate() {
            let fit = cap / s as usize;
            // `demand` is a whole count (a huge one saturates, then the fit caps it).
            let mut left = fit.min(demand[i] as usize);
            if left == fit {
                items.push(Chunk {
                    size: i,
                    copies: 1,
                    repeatable: true,
                });
                continue;
            }
            let mut chunk = 1;
            while left > 0 {
                let q = chunk.min(left);
                items.push(Chunk {
                    size: i,
                    copies: q,
                    repeatable: false,
                });
                left -= q;
                chunk *= 2;
            }
        }
        let mut exact = vec![f64::NEG_INFINITY; cap + 1];
        exact[0] = 0.0;
        let mut took = if record {
            vec![false; items.len() * (cap + 1)]
        } else {
            Vec::new()
        };
        for (k, item) in items.iter().enumerate() {
            let weight = item.copies * sizes[item.size] as usize;
            let value = item.copies as f64 * prices[item.size];
            let mut relax = |w: usize| {
                let v = exact[w - weight] + value;
                if v > exact[w] + EPS {
                    exact[w] = v;
                    if record {
                        took[k * (cap + 1) + w] = true;
                    }
                }
            };
            if item.repeatable {
                (weight..=cap).for_each(&mut relax);
            } else {
                (weight..=cap).rev().for_each(&mut relax);
            }
        }
        BoundedKnapsack { exact, items, took }
    }
}

/// `K(r)` for `r` in `0..=1000`: the most a gap of `r` milli earns at `prices`, with at most
/// `demand[i]` copies of size `i` (the LP's patterns have the same caps; without them a size
/// asked by one pod, which the LP may price up to a whole GPU, would make every gap worth many).
fn gap_values(sizes: &[u32], prices: &[f64], demand: &[f64]) -> Vec<f64> {
    let dp = BoundedKnapsack::solve(sizes, prices, demand, false);
    let mut k = vec![0.0; dp.exact.len()];
    for r in 1..k.len() {
        k[r] = f64::max(k[r - 1], dp.exact[r]);
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(list: &[(u32, u64)]) -> Vec<(u32, u64)> {
        list.to_vec()
    }

    #[test]
    fn halves_and_thirds() {
        // 500m pods pair: each is worth half a GPU; a 500m gap is fully usable.
        let g = gap_prices(&counts(&[(500, 10)]));
        assert!((g.price[500] - 500.0).abs() < 1e-6);
        let t = g.unusable;
        assert!((t[500] - 0.0).abs() < 1e-6, "{}", t[500]);
        assert!((t[499] - 499.0).abs() < 1e-6);
        assert!(t[1000].abs() < 1e-6);
        let t = gap_prices(&counts(&[(330, 9)])).unusable;
        assert!((t[670] - (670.0 - 666.666_666)).abs() < 1e-3, "{}", t[670]);
    }

    #[test]
    fn holes_without_fillers() {
        // 810m pods and a few 160m: the 160m fill holes, worth nothing more; a 190m hole is
        // worth nothing, so it counts fully; the 810m pod earns a whole GPU.
        let t = gap_prices(&counts(&[(810, 40), (160, 4)])).unusable;
        assert!((t[190] - 190.0).abs() < 1e-6, "{}", t[190]);
        assert!((t[810] - (810.0 - 1000.0)).abs() < 1e-6, "{}", t[810]);
    }

    #[test]
    fn lower_bound_on_gpus() {
        // Three 400m pods need two GPUs (the LP says 1.5); 600m + 400m pairs need one each.
        assert!((share_gpus_lower_bound(&[400, 400, 400]) - 1.5).abs() < 1e-9);
        assert!((share_gpus_lower_bound(&[600, 400, 600, 400]) - 2.0).abs() < 1e-9);
        assert_eq!(share_gpus_lower_bound(&[]), 0.0);
        assert_eq!(share_gpus_lower_bound(&[1000]), 0.0);
    }

    #[test]
    fn many_distinct_sizes_are_solved_on_a_coarser_grid() {
        // 300 distinct sizes (a pod list given by path can have any): solved over at most
        // MAX_SIZES grid sizes, so quickly; the bound is at least the size sum and at most one
        // GPU per pod, and every size gets the price of its grid size.
        let shares: Vec<u32> = (300..600).collect();
        let sum = shares.iter().map(|&m| f64::from(m)).sum::<f64>() / 1000.0;
        let bound = share_gpus_lower_bound(&shares);
        assert!(
            bound >= sum - 1e-9 && bound <= 300.0,
            "{bound} vs size sum {sum}"
        );
        let g = gap_prices(&counts(&shares.iter().map(|&m| (m, 1)).collect::<Vec<_>>()));
        assert!((300..600).all(|m| g.price[m] > 0.0));
        assert_eq!(g.price[299], 0.0);
        let (step, grid, demand) = coarsen(&[3, 7, 12, 999], &[1.0, 2.0, 3.0, 4.0], MAX_SIZES);
        assert_eq!(
            (step, grid, demand),
            (1, vec![3, 7, 12, 999], vec![1.0, 2.0, 3.0, 4.0])
        );
        let sizes: Vec<u32> = (1..=999).collect();
        let (step, grid, demand) = coarsen(&sizes, &vec![1.0; 999], MAX_SIZES);
        assert!(grid.len() <= MAX_SIZES && step > 1);
        assert!(grid.iter().all(|g| g % step == 0 && *g > 0));
        // Sizes under the step round to 0 and are dropped; the rest keep their demand.
        assert_eq!(demand.iter().sum::<f64>(), f64::from(999 - (step - 1)));
    }

    #[test]
    fn gap_values_respect_demand() {
        // One 50m pod among 987m pods: whatever its price, a gap holds at most one of it.
        let g = gap_prices(&[(50, 1), (987, 20)]);
        for r in 0..=1000 {
            assert!(
                g.unusable[r] >= r as f64 - 1000.0 - 1e-6,
                "{r}: {}",
                g.unusable[r]
            );
        }
    }

    #[test]
    fn knapsack_respects_demand() {
        let (v, c) = knapsack(&[300], &[0.4], &[2.0]);
        assert!((v - 0.8).abs() < 1e-9);
        assert_eq!(c, vec![2.0]);
    }
}
