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
//! `c/dt`). Utilization is taken to be proportional to the launch rate, so the rate that would have
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

/// Work one purchase of tokens covers on the slow path: a launch that finds the prepaid tokens used
/// up buys this much GPU time at once (or its own cost, when larger), so the clock is read and the
/// GCRA word updated about once per millisecond of work, not once per launch.
pub const BATCH_NS: u64 = 1_000_000;
/// Tokens one purchase gets while the bucket has no rate yet (not throttled): effectively endless,
/// and cut to one batch when the first rate is set.
const UNTHROTTLED_BATCH: u64 = 1 << 40;

/// One device's token bucket. `ns_per_block` 0 = not throttled (yet).
///
/// Two layers: a pool of prepaid tokens (`tokens`), from which a launch takes its blocks with one
/// relaxed atomic subtraction (the fast path, no clock, no syscall), and the GCRA word `tat` from
/// which the pool is bought, a batch of [`BATCH_NS`] of work at a time, by the launch that finds the
/// pool empty (the slow path: it waits what the GCRA says, then deposits the batch). Every token
/// taken was bought at the refill rate, so the long-run rate is the GCRA's; the pool adds at most one
/// batch per concurrent buyer to the burst.
#[derive(Debug, Default)]
pub struct Bucket {
    tokens: AtomicI64,
    bought: AtomicU64,
    tat: AtomicU64,
    ns_per_block: AtomicU64,
}

impl Bucket {
    /// Fast path: takes `blocks` prepaid tokens. `false` when the pool did not hold them: the blocks
    /// are taken anyway (the pool goes into debt) and the caller must [`Bucket::buy`], wait, and
    /// [`Bucket::deposit`].
    #[inline]
    pub fn try_take(&self, blocks: u64) -> bool {
        let b = blocks.min(i64::MAX as u64 / 2) as i64;
        self.tokens.fetch_sub(b, Relaxed) >= b
    }

    /// Slow path after a failed [`Bucket::try_take`] of `blocks` at `now` (ns): buys a batch of
    /// tokens from the GCRA. Returns (ns to wait before depositing, tokens to deposit).
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

    /// Puts bought tokens in the pool (after the wait [`Bucket::buy`] asked for).
    pub fn deposit(&self, batch: u64) {
        let b = batch.min(i64::MAX as u64 / 2);
        self.bought.fetch_add(b, Relaxed);
        self.tokens.fetch_add(b as i64, Relaxed);
    }

    /// Takes `blocks` tokens at `now` (ns), buying and depositing at once when the pool is empty;
    /// returns how long the launch must wait, in ns (the caller waits after the deposit, which is
    /// the same for a single thread; the launch path waits first).
    pub fn take(&self, now: u64, blocks: u64) -> u64 {
        if self.try_take(blocks) {
            return 0;
        }
        let (wait, batch) = self.buy(now, blocks);
        self.deposit(batch);
        wait
    }

    /// Blocks launched so far: every token bought less those still in the pool.
    pub fn consumed(&self) -> u64 {
        let bought = self.bought.load(Relaxed);
        let pool = self.tokens.load(Relaxed);
        if pool >= 0 {
            bought.saturating_sub(pool as u64)
        } else {
            bought.saturating_add(pool.unsigned_abs())
        }
    }

    /// Refill rate in blocks per second; `None` while not throttled.
    pub fn rate(&self) -> Option<f64> {
        let nspb = f64::from_bits(self.ns_per_block.load(Relaxed));
        (nspb > 0.0).then(|| 1e9 / nspb)
    }

    /// Sets the refill rate; debt older than one burst is forgiven (it was owed at the old rate), and
    /// prepaid tokens beyond one batch at the new rate are taken back (they were bought at the old
    /// one, or for nothing before the first rate).
    pub fn set_rate(&self, blocks_per_s: f64, now: u64) {
        let r = blocks_per_s.max(MIN_RATE);
        self.ns_per_block.store((1e9 / r).to_bits(), Relaxed);
        let _ = self.tat.fetch_update(Relaxed, Relaxed, |t| {
            Some(t.min(now.saturating_add(BURST_NS)))
        });
        let cap = ((r * BATCH_NS as f64 / 1e9) as i64).max(1);
        let prev = self.tokens.fetch_min(cap, Relaxed);
        if prev > cap {
            self.bought.fetch_sub((prev - cap) as u64, Relaxed);
        }
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
    /// A controller for a limit in percent (1..=99), starting at `now`.
    pub fn new(limit_percent: u32, bucket: &Bucket, now: u64) -> Controller {
        Controller {
            limit: f64::from(limit_percent),
            last_consumed: bucket.consumed(),
            last_at: now,
        }
    }

    /// One control step at `now` with the utilization (percent) the device showed over the period
    /// just ended (`None`: unknown, nothing changes). Returns the new rate when it changed.
    pub fn step(&mut self, bucket: &Bucket, now: u64, util: Option<f64>) -> Option<f64> {
        let consumed = bucket.consumed();
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

    #[test]
    fn an_unthrottled_bucket_never_waits() {
        let b = Bucket::default();
        for i in 0..1000 {
            assert_eq!(b.take(i, 1_000_000), 0);
        }
        assert_eq!(b.consumed(), 1_000_000_000);
        assert_eq!(b.rate(), None);
    }

    #[test]
    fn a_bucket_paces_to_its_rate_after_one_burst() {
        let b = Bucket::default();
        b.set_rate(1000.0, 0); // 1 ms per block
        let mut now = 0u64;
        let mut waited = 0u64;
        for _ in 0..1000 {
            let w = b.take(now, 1);
            now += w;
            waited += w;
        }
        // 1000 blocks at 1000/s take 1 s, less the 10 ms burst and the last block's own time.
        assert!((980_000_000..=1_000_000_000).contains(&now), "{now}");
        assert_eq!(waited, now);
        assert!(b.take(now, 1_000_000) <= MAX_WAIT_NS);
    }

    /// Small launches at a high rate: the pool serves almost all of them (the slow path buys one
    /// batch per millisecond of work), the long-run rate is still the refill rate, and the
    /// controller's count of launched blocks stays exact through a rate change.
    #[test]
    fn prepaid_tokens_keep_the_rate_and_the_count() {
        let b = Bucket::default();
        b.set_rate(1_000_000.0, 0); // 1 us per block: batches of 1000 blocks
        let (mut now, mut slow) = (0u64, 0u32);
        for _ in 0..1_000_000 {
            if !b.try_take(1) {
                slow += 1;
                let (wait, batch) = b.buy(now, 1);
                now += wait;
                b.deposit(batch);
            }
        }
        assert_eq!(slow, 1000);
        // 1e6 blocks at 1e6/s: 1 s, less the 10 ms burst and the last batch's own time.
        assert!((985_000_000..=1_000_000_000).contains(&now), "{now}");
        assert_eq!(b.consumed(), 1_000_000);
        // A lower rate takes back prepaid tokens beyond one batch of it; the count is unchanged.
        b.deposit(50_000);
        b.set_rate(100_000.0, now);
        assert_eq!(b.consumed(), 1_000_000);
        assert!(b.try_take(100) && !b.try_take(1));
        assert_eq!(b.consumed(), 1_000_101);
    }

    /// Before the first rate the pool is endless (no launch waits), and the first rate cuts it to
    /// one batch, so an unthrottled start does not leave a burst behind.
    #[test]
    fn the_first_rate_cuts_the_free_pool() {
        let b = Bucket::default();
        assert_eq!(b.take(0, 10), 0);
        assert!(b.try_take(1 << 30));
        b.set_rate(1000.0, 0); // 1 ms per block: one-block batches
        assert!(b.try_take(1));
        assert!(!b.try_take(1));
        assert_eq!(b.consumed(), 10 + (1 << 30) + 2);
    }

    /// A simulated device whose utilization is proportional to the launch rate: the law converges
    /// to the limit from either side, and holds with two processes sharing it.
    #[test]
    fn the_law_converges_to_the_limit() {
        // Unthrottled, the device runs 10_000 blocks/s at 100 %.
        let full = 10_000.0;
        for start_util in [100.0, 10.0] {
            let b = Bucket::default();
            let mut c = Controller::new(30, &b, 0);
            let mut now = 0;
            let mut demand = full * start_util / 100.0;
            for _ in 0..40 {
                let rate = b.rate().map_or(demand, |r| r.min(demand));
                let period = PERIOD.as_nanos() as u64;
                b.take(now, (rate * 0.05) as u64);
                now += period;
                c.step(&b, now, Some((rate / full * 100.0).min(100.0)));
                demand = full; // the load then grows to all the device can do
            }
            let r = b.rate().unwrap();
            assert!((r / full - 0.30).abs() < 0.01, "start {start_util}: {r}");
        }
    }

    #[test]
    fn two_processes_share_the_limit() {
        let full = 10_000.0;
        let (a, b) = (Bucket::default(), Bucket::default());
        let (mut ca, mut cb) = (Controller::new(50, &a, 0), Controller::new(50, &b, 0));
        let mut now = 0;
        for _ in 0..60 {
            // Both saturate; the device splits its time by their launch rates.
            let ra = a.rate().unwrap_or(full);
            let rb = b.rate().unwrap_or(full);
            let total = (ra + rb).min(full);
            let (sa, sb) = (total * ra / (ra + rb), total * rb / (ra + rb));
            a.take(now, (sa * 0.05) as u64);
            b.take(now, (sb * 0.05) as u64);
            now += PERIOD.as_nanos() as u64;
            let u = Some(total / full * 100.0);
            ca.step(&a, now, u);
            cb.step(&b, now, u);
        }
        let sum = a.rate().unwrap() + b.rate().unwrap();
        assert!((sum / full - 0.50).abs() < 0.02, "{sum}");
    }

    #[test]
    fn idle_periods_and_unknown_utilization_change_nothing() {
        let b = Bucket::default();
        let mut c = Controller::new(30, &b, 0);
        assert_eq!(c.step(&b, 50, Some(80.0)), None); // no launches
        b.take(60, 100);
        assert_eq!(c.step(&b, 100, None), None);
        b.take(110, 100);
        assert!(c.step(&b, 150, Some(60.0)).is_some());
        let r = b.rate().unwrap();
        b.take(160, 100);
        assert_eq!(c.step(&b, 200, Some(0.0)), Some(r * 2.0));
    }
}
