//! Core limit (`CUDA_DEVICE_SM_LIMIT`): a token bucket per device, and the controller a watcher
//! thread runs to steer the bucket's refill rate toward the limit. Safe code over atomics; the
//! clock, the sleeping and NVML are the caller's (`ffi`), so unit tests drive it with made-up time.
//!
//! **Bucket.** Tokens are thread blocks (a launch of grid `x*y*z` takes `x*y*z`). The bucket is kept
//! in its GCRA form, one atomic word: the *theoretical arrival time* `tat`, the moment the bucket
//! would be full again. A launch of cost `c = blocks * ns_per_block` moves `tat` to
//! `max(tat, now) + c`; it must wait `tat_before - now - BURST_NS` when that is positive, capped at
//! [`MAX_WAIT_NS`] per launch. Long-run the device gets at most `1 / ns_per_block` blocks per second
//! with bursts of [`BURST_NS`] of work; oversleeping costs nothing because `tat` is absolute.
//!
//! **Control law.** Every [`PERIOD`] the watcher reads the utilization `u` (percent) the device showed
//! over the last period and the blocks `c` this process launched on it in that period (rate
//! `c/dt`; `c` is the sum of the process's per-thread block meters). Utilization is taken to be proportional to the launch rate, so the rate that would have
//! produced the limit `L` is `est = (c/dt) * L / u`. The new refill rate is
//! `r' = clamp((r + est) / 2, r / 4, 2 r)` (first throttled period: `r' = est`): a proportional
//! step that halves the error each period and cannot collapse or explode on one noisy sample. While
//! `u` is below 1 % with launches happening (the device shows no work yet) the rate doubles. With no
//! launch in a period the rate is kept. Several processes of one container each run the law on their
//! own launches against the container's utilization; every one scales by the same `L/u`, so the sum
//! converges to `L` too.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Work a bucket lets through at once after an idle time.
pub const BURST_NS: u64 = 10_000_000;
/// Longest one launch waits (the wait is bounded; the debt stays in `tat`).
pub const MAX_WAIT_NS: u64 = 100_000_000;
/// Control period of the watcher thread.
pub const PERIOD: Duration = Duration::from_millis(50);
/// Lowest refill rate, blocks per second (a starved process still makes progress).
pub const MIN_RATE: f64 = 10.0;

/// Work one purchase of tokens covers on the slow path: a launch that finds its thread's prepaid
/// tokens used up buys this much GPU time at once (or its own cost, when larger), so the clock is
/// read and the GCRA word updated about once per millisecond of work per thread, not once per
/// launch.
pub const BATCH_NS: u64 = 1_000_000;
/// Tokens one purchase gets while the bucket has no rate yet (not throttled): effectively endless,
/// and cut to one batch when the first rate is set.
const UNTHROTTLED_BATCH: u64 = 1 << 40;
/// Largest cost one launch is charged, in blocks (keeps the pool's arithmetic in range).
const MAX_BLOCKS: u64 = 1 << 50;

/// One device's token bucket, shared by the process's threads. `ns_per_block` 0 = not throttled
/// (yet).
///
/// Two layers: each launching thread keeps a [`Pool`] of prepaid tokens, from which a launch takes
/// its blocks with plain arithmetic on memory only that thread writes (the fast path: no atomic read-modify-write, no
/// clock, no syscall), and the pools are bought from this bucket's GCRA word, a batch of
/// [`BATCH_NS`] of work at a time, by the launch that finds its pool empty (the slow path: it waits
/// what the GCRA says). Every token taken was bought at the refill rate, so the long-run rate is the
/// GCRA's; the pools add at most one batch per launching thread to the burst. A rate change bumps
/// `epoch`, and each pool then keeps at most one batch at the new rate.
#[derive(Debug, Default)]
pub struct Bucket {
    tat: AtomicU64,
    ns_per_block: AtomicU64,
    epoch: AtomicU64,
}

impl Bucket {
    /// Slow path of [`Pool::try_take`] for `blocks` at `now` (ns): buys a batch of tokens from the
    /// GCRA. Returns (ns to wait before launching, tokens bought).
    pub fn buy(&self, now: u64, blocks: u64) -> (u64, u64) {
        let nspb = f64::from_bits(self.ns_per_block.load(Relaxed));
        if nspb <= 0.0 {
            return (0, blocks.max(UNTHROTTLED_BATCH));
        }
        let batch = blocks.max((BATCH_NS as f64 / nspb) as u64).max(1);
        let cost = (batch as f64 * nspb).min(1e18) as u64;
        let prev = match self
            .tat
            .fetch_update(Relaxed, Relaxed, |t| Some(t.max(now).saturating_add(cost)))
        {
            Ok(p) | Err(p) => p,
        };
        let wait = prev
            .saturating_sub(now.saturating_add(BURST_NS))
            .min(MAX_WAIT_NS);
        (wait, batch)
    }

    /// Tokens a pool may keep across a rate change: one batch at the current rate.
    fn batch_cap(&self) -> i64 {
        let nspb = f64::from_bits(self.ns_per_block.load(Relaxed));
        if nspb <= 0.0 {
            return i64::MAX;
        }
        ((BATCH_NS as f64 / nspb) as i64).max(1)
    }

    /// Refill rate in blocks per second; `None` while not throttled.
    pub fn rate(&self) -> Option<f64> {
        let nspb = f64::from_bits(self.ns_per_block.load(Relaxed));
        (nspb > 0.0).then(|| 1e9 / nspb)
    }

    /// Stops throttling (the `default` core policy while the GPU is not shared); prepaid tokens
    /// stay valid and every later purchase is free until the next [`Bucket::set_rate`].
    pub fn unthrottle(&self) {
        if self.ns_per_block.swap(0, Relaxed) != 0 {
            self.epoch.fetch_add(1, Relaxed);
        }
    }

    /// Sets the refill rate; debt older than one burst is forgiven (it was owed at the old rate), and
    /// every pool's prepaid tokens beyond one batch at the new rate are taken back at its next
    /// launch (they were bought at the old rate, or for nothing before the first rate).
    pub fn set_rate(&self, blocks_per_s: f64, now: u64) {
        let r = blocks_per_s.max(MIN_RATE);
        self.ns_per_block.store((1e9 / r).to_bits(), Relaxed);
        let _ = self.tat.fetch_update(Relaxed, Relaxed, |t| {
            Some(t.min(now.saturating_add(BURST_NS)))
        });
        self.epoch.fetch_add(1, Relaxed);
    }
}

/// One thread's prepaid tokens for one device's [`Bucket`], kept in the thread's
/// [`crate::meter::ThreadMeter`]. Its owner is the only writer (`shared == false`): the fast path of
/// a throttled launch is a compare and a plain store, no locked instruction. The overflow meter's
/// pools are written by several threads (`shared == true`) and use atomic read-modify-writes.
#[derive(Debug, Default)]
pub struct Pool {
    tokens: AtomicI64,
    /// The bucket's `epoch` when these tokens were bought (or last cut).
    epoch: AtomicU64,
}

impl Pool {
    /// An empty pool (usable in a `static`).
    pub const fn new() -> Pool {
        Pool {
            tokens: AtomicI64::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    /// Fast path: takes `blocks` prepaid tokens when the pool holds them and the bucket's rate has
    /// not changed since they were bought. `false` (nothing taken): the caller must
    /// [`Pool::refill`].
    #[inline]
    pub fn try_take(&self, bucket: &Bucket, blocks: u64, shared: bool) -> bool {
        let b = blocks.min(MAX_BLOCKS) as i64;
        if self.epoch.load(Relaxed) != bucket.epoch.load(Relaxed) {
            return false;
        }
        if shared {
            if self.tokens.fetch_sub(b, Relaxed) >= b {
                return true;
            }
            self.tokens.fetch_add(b, Relaxed);
            return false;
        }
        let t = self.tokens.load(Relaxed);
        if t >= b {
            self.tokens.store(t - b, Relaxed);
            true
        } else {
            false
        }
    }

    /// Slow path after a failed [`Pool::try_take`] of `blocks` at `now` (ns): after a rate change
    /// the pool keeps at most one batch at the new rate; when that does not cover the launch it
    /// buys a batch. Takes the blocks either way and returns how long the launch must wait (ns).
    pub fn refill(&self, bucket: &Bucket, now: u64, blocks: u64, shared: bool) -> u64 {
        let b = blocks.min(MAX_BLOCKS) as i64;
        let epoch = bucket.epoch.load(Relaxed);
        if self.epoch.load(Relaxed) != epoch {
            self.epoch.store(epoch, Relaxed);
            let cap = bucket.batch_cap();
            if shared {
                self.tokens.fetch_min(cap, Relaxed);
            } else {
                self.tokens
                    .store(self.tokens.load(Relaxed).min(cap), Relaxed);
            }
            if self.try_take(bucket, blocks, shared) {
                return 0;
            }
        }
        let (wait, batch) = bucket.buy(now, blocks);
        let add = (batch.min(MAX_BLOCKS) as i64) - b;
        if shared {
            self.tokens.fetch_add(add, Relaxed);
        } else {
            self.tokens
                .store(self.tokens.load(Relaxed).saturating_add(add), Relaxed);
        }
        wait
    }

    /// Takes `blocks` at `now`, refilling when needed; the wait in ns (for tests and simple callers).
    pub fn take(&self, bucket: &Bucket, now: u64, blocks: u64) -> u64 {
        if self.try_take(bucket, blocks, false) {
            0
        } else {
            self.refill(bucket, now, blocks, false)
        }
    }

    /// Prepaid tokens left.
    pub fn tokens(&self) -> i64 {
        self.tokens.load(Relaxed)
    }

    /// Empties the pool (a forked child's meters start over).
    pub fn clear(&self) {
        self.tokens.store(0, Relaxed);
        self.epoch.store(0, Relaxed);
    }
}

/// The watcher's state for one device.
#[derive(Debug)]
pub struct Controller {
    limit: f64,
    last_consumed: u64,
    last_at: u64,
}

impl Controller {
    /// A controller for a limit in percent (1..=99), starting at `now` with `consumed` blocks
    /// launched on its device so far (the process's threads' meters, summed).
    pub fn new(limit_percent: u32, consumed: u64, now: u64) -> Controller {
        Controller {
            limit: f64::from(limit_percent),
            last_consumed: consumed,
            last_at: now,
        }
    }

    /// One control step at `now`, with the blocks launched on the device so far (`consumed`, as
    /// in [`Controller::new`]) and the utilization (percent) the device showed over the period just
    /// ended (`None`: unknown, nothing changes). Returns the new rate when it changed.
    pub fn step(
        &mut self,
        bucket: &Bucket,
        consumed: u64,
        now: u64,
        util: Option<f64>,
    ) -> Option<f64> {
        let (c, dt) = (
            consumed.saturating_sub(self.last_consumed),
            now.saturating_sub(self.last_at),
        );
        self.last_consumed = consumed;
        self.last_at = now;
        let u = util?;
        if c == 0 || dt == 0 {
            return None;
        }
        let rate_now = c as f64 * 1e9 / dt as f64;
        let new = match bucket.rate() {
            Some(r) if u < 1.0 => r * 2.0,
            None if u < 1.0 => return None,
            Some(r) => {
                let est = rate_now * self.limit / u;
                ((r + est) / 2.0).clamp(r / 4.0, r * 2.0)
            }
            None => rate_now * self.limit / u,
        };
        bucket.set_rate(new, now);
        bucket.rate()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// One process with one launching thread: the bucket, the thread's pool and its block meter.
    #[derive(Default)]
    struct Proc {
        bucket: Bucket,
        pool: Pool,
        consumed: u64,
    }

    impl Proc {
        fn take(&mut self, now: u64, blocks: u64) -> u64 {
            self.consumed += blocks;
            self.pool.take(&self.bucket, now, blocks)
        }
    }

    #[test]
    fn unthrottling_frees_the_bucket_until_the_next_rate() {
        let mut p = Proc::default();
        p.bucket.set_rate(1000.0, 0);
        let waited: u64 = (0..100).map(|i| p.take(i, 1000)).sum();
        assert!(waited > 0);
        p.bucket.unthrottle();
        assert_eq!(p.bucket.rate(), None);
        assert!((0..100).all(|i| p.take(1_000_000 + i, 1000) == 0));
        p.bucket.set_rate(1000.0, 2_000_000);
        let waited: u64 = (0..100).map(|i| p.take(2_000_000 + i, 1000)).sum();
        assert!(waited > 0);
    }

    #[test]
    fn an_unthrottled_bucket_never_waits() {
        let mut p = Proc::default();
        for i in 0..1000 {
            assert_eq!(p.take(i, 1_000_000), 0);
        }
        assert_eq!(p.bucket.rate(), None);
    }

    #[test]
    fn a_bucket_paces_to_its_rate_after_one_burst() {
        let mut p = Proc::default();
        p.bucket.set_rate(1000.0, 0); // 1 ms per block
        let mut now = 0u64;
        let mut waited = 0u64;
        for _ in 0..1000 {
            let w = p.take(now, 1);
            now += w;
            waited += w;
        }
        // 1000 blocks at 1000/s take 1 s, less the 10 ms burst and the last block's own time.
        assert!((980_000_000..=1_000_000_000).contains(&now), "{now}");
        assert_eq!(waited, now);
        assert!(p.take(now, 1_000_000) <= MAX_WAIT_NS);
    }

    /// Small launches at a high rate: the pool serves almost all of them (the slow path buys one
    /// batch per millisecond of work), the long-run rate is still the refill rate, and a rate change
    /// takes back prepaid tokens beyond one batch at the new rate.
    #[test]
    fn prepaid_tokens_keep_the_rate() {
        let (b, pool) = (Bucket::default(), Pool::new());
        b.set_rate(1_000_000.0, 0); // 1 us per block: batches of 1000 blocks
        let (mut now, mut slow) = (0u64, 0u32);
        for _ in 0..1_000_000 {
            if !pool.try_take(&b, 1, false) {
                slow += 1;
                now += pool.refill(&b, now, 1, false);
            }
        }
        assert_eq!(slow, 1000);
        // 1e6 blocks at 1e6/s: 1 s, less the 10 ms burst and the last batch's own time.
        assert!((985_000_000..=1_000_000_000).contains(&now), "{now}");
        // A big purchase, then a lower rate: the pool keeps one batch of the new rate (100 blocks).
        now += pool.refill(&b, now, 1, false);
        assert_eq!(pool.tokens(), 999);
        b.set_rate(100_000.0, now);
        assert!(
            !pool.try_take(&b, 1, false),
            "a rate change must reach the slow path"
        );
        assert_eq!(pool.refill(&b, now, 100, false), 0);
        assert_eq!(pool.tokens(), 0);
        // Two threads' pools draw on one bucket: together they get the bucket's rate.
        let (p1, p2) = (Pool::new(), Pool::new());
        let mut t = now;
        for _ in 0..100_000 {
            t += p1.take(&b, t, 1);
            t += p2.take(&b, t, 1);
        }
        let secs = (t - now) as f64 / 1e9;
        assert!((1.9..=2.0).contains(&secs), "{secs}");
    }

    /// The overflow meter's pool, shared by several threads, loses no take.
    #[test]
    fn a_shared_pool_counts_every_take() {
        let (b, pool) = (Bucket::default(), Pool::new());
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..100_000 {
                        if !pool.try_take(&b, 1, true) {
                            assert_eq!(pool.refill(&b, 0, 1, true), 0);
                        }
                    }
                });
            }
        });
        // Each thread that found it empty bought one endless batch (2^40).
        let bought = pool.tokens() + 400_000;
        assert!(bought > 0 && bought % (1 << 40) == 0, "{bought}");
    }

    /// Before the first rate the pool is endless (no launch waits), and the first rate cuts it to
    /// one batch, so an unthrottled start does not leave a burst behind.
    #[test]
    fn the_first_rate_cuts_the_free_pool() {
        let (b, pool) = (Bucket::default(), Pool::new());
        assert_eq!(pool.take(&b, 0, 10), 0);
        assert!(pool.try_take(&b, 1 << 30, false));
        b.set_rate(1000.0, 0); // 1 ms per block: one-block batches
        assert_eq!(pool.take(&b, 0, 1), 0);
        assert!(!pool.try_take(&b, 1, false));
    }

    /// A simulated device whose utilization is proportional to the launch rate: the law converges
    /// to the limit from either side, and holds with two processes sharing it.
    #[test]
    fn the_law_converges_to_the_limit() {
        // Unthrottled, the device runs 10_000 blocks/s at 100 %.
        let full = 10_000.0;
        for start_util in [100.0, 10.0] {
            let mut p = Proc::default();
            let mut c = Controller::new(30, 0, 0);
            let mut now = 0;
            let mut demand = full * start_util / 100.0;
            for _ in 0..40 {
                let rate = p.bucket.rate().map_or(demand, |r| r.min(demand));
                let period = PERIOD.as_nanos() as u64;
                p.take(now, (rate * 0.05) as u64);
                now += period;
                c.step(
                    &p.bucket,
                    p.consumed,
                    now,
                    Some((rate / full * 100.0).min(100.0)),
                );
                demand = full; // the load then grows to all the device can do
            }
            let r = p.bucket.rate().unwrap();
            assert!((r / full - 0.30).abs() < 0.01, "start {start_util}: {r}");
        }
    }

    #[test]
    fn two_processes_share_the_limit() {
        let full = 10_000.0;
        let (mut a, mut b) = (Proc::default(), Proc::default());
        let (mut ca, mut cb) = (Controller::new(50, 0, 0), Controller::new(50, 0, 0));
        let mut now = 0;
        for _ in 0..60 {
            // Both saturate; the device splits its time by their launch rates.
            let ra = a.bucket.rate().unwrap_or(full);
            let rb = b.bucket.rate().unwrap_or(full);
            let total = (ra + rb).min(full);
            let (sa, sb) = (total * ra / (ra + rb), total * rb / (ra + rb));
            a.take(now, (sa * 0.05) as u64);
            b.take(now, (sb * 0.05) as u64);
            now += PERIOD.as_nanos() as u64;
            let u = Some(total / full * 100.0);
            ca.step(&a.bucket, a.consumed, now, u);
            cb.step(&b.bucket, b.consumed, now, u);
        }
        let sum = a.bucket.rate().unwrap() + b.bucket.rate().unwrap();
        assert!((sum / full - 0.50).abs() < 0.02, "{sum}");
    }

    #[test]
    fn idle_periods_and_unknown_utilization_change_nothing() {
        let mut p = Proc::default();
        let mut c = Controller::new(30, 0, 0);
        assert_eq!(c.step(&p.bucket, p.consumed, 50, Some(80.0)), None); // no launches
        p.take(60, 100);
        assert_eq!(c.step(&p.bucket, p.consumed, 100, None), None);
        p.take(110, 100);
        assert!(c.step(&p.bucket, p.consumed, 150, Some(60.0)).is_some());
        let r = p.bucket.rate().unwrap();
        p.take(160, 100);
        assert_eq!(c.step(&p.bucket, p.consumed, 200, Some(0.0)), Some(r * 2.0));
    }
}
