//! Per-thread launch meters: what a kernel launch counts (launches, and thread blocks per device for
//! the core limit's controller) and the thread's prepaid core-limit tokens ([`Pool`]), without an
//! atomic read-modify-write on a shared cache line. Safe code over atomics.
//!
//! Each launching thread owns one [`ThreadMeter`] of a process-wide [`Meters`] table and adds to it
//! with a plain load and store (only its owner writes it, so no increment is lost); the watcher sums
//! the table. A thread that exits gives its meter back (its counts stay in it), and the next new
//! thread adopts it and keeps adding, so the sums stay exact and the table holds at most as many
//! meters as threads launched at the same time. Past [`THREAD_METERS`] concurrent threads, the
//! rest share one overflow meter, updated with atomic adds.
//!
//! The process's launch count reaches the shared accounting file when the watcher copies the sum
//! there (every [`crate::throttle::PERIOD`]) and when the process exits normally; see the crate's
//! docs for the staleness bound.

use crate::throttle::Pool;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use vgpu_core::accounting::MAX_DEVICES;

/// Meters for this many concurrently launching threads; more share the overflow meter.
pub const THREAD_METERS: usize = 1024;

/// One thread's counters. Cache-line aligned, so owners never write a line another thread writes.
#[derive(Debug)]
#[repr(align(64))]
pub struct ThreadMeter {
    launches: AtomicU64,
    blocks: [AtomicU64; MAX_DEVICES],
    pools: [Pool; MAX_DEVICES],
    in_use: AtomicBool,
    /// The overflow meter: several threads write it, so it adds atomically.
    shared: bool,
}

impl ThreadMeter {
    const fn new(shared: bool) -> ThreadMeter {
        ThreadMeter {
            launches: AtomicU64::new(0),
            blocks: [const { AtomicU64::new(0) }; MAX_DEVICES],
            pools: [const { Pool::new() }; MAX_DEVICES],
            in_use: AtomicBool::new(false),
            shared,
        }
    }

    #[inline]
    fn add(&self, c: &AtomicU64, n: u64) {
        if self.shared {
            c.fetch_add(n, Relaxed);
        } else {
            // The owner is the only writer: a plain load and store, no locked instruction.
            c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
        }
    }

    /// Counts one kernel launch.
    #[inline]
    pub fn launched(&self) {
        self.add(&self.launches, 1);
    }

    /// Counts `blocks` thread blocks launched on limit index `dev` (ignored past the last device).
    #[inline]
    pub fn blocks(&self, dev: usize, blocks: u64) {
        if let Some(c) = self.blocks.get(dev) {
            self.add(c, blocks);
        }
    }

    /// The thread's prepaid tokens for limit index `dev`.
    #[inline]
    pub fn pool(&self, dev: usize) -> Option<&Pool> {
        self.pools.get(dev)
    }

    /// Whether several threads write this meter (the overflow meter): its pools must then be used
    /// with `shared = true`.
    #[inline]
    pub fn shared(&self) -> bool {
        self.shared
    }

    fn clear(&self) {
        for p in &self.pools {
            p.clear();
        }
        self.launches.store(0, Relaxed);
        for b in &self.blocks {
            b.store(0, Relaxed);
        }
    }
}

/// The process's table of thread meters.
#[derive(Debug)]
pub struct Meters {
    meters: [ThreadMeter; THREAD_METERS],
    /// High-water mark: meters below it may hold counts.
    used: AtomicUsize,
    overflow: ThreadMeter,
}

impl Default for Meters {
    fn default() -> Meters {
        Meters::new()
    }
}

impl Meters {
    /// An empty table (usable in a `static`).
    pub const fn new() -> Meters {
        Meters {
            meters: [const { ThreadMeter::new(false) }; THREAD_METERS],
            used: AtomicUsize::new(0),
            overflow: ThreadMeter::new(true),
        }
    }

    fn used(&self) -> &[ThreadMeter] {
        &self.meters[..self.used.load(Relaxed).min(THREAD_METERS)]
    }

    /// A meter for the calling thread, which must give it back with [`Meters::release`] when it
    /// exits: a free one (adopted with its counts), else a new one, else the shared overflow meter.
    pub fn acquire(&self) -> &ThreadMeter {
        loop {
            if let Some(m) = self.used().iter().find(|m| {
                m.in_use
                    .compare_exchange(false, true, Relaxed, Relaxed)
                    .is_ok()
            }) {
                return m;
            }
            // None free: raise the mark by one and look again (a racing thread may take it first).
            let n = self.used.load(Relaxed);
            if n >= THREAD_METERS {
                return &self.overflow;
            }
            let _ = self.used.compare_exchange(n, n + 1, Relaxed, Relaxed);
        }
    }

    /// Gives a meter back (its counts stay in the sums). The overflow meter is never owned.
    pub fn release(&self, m: &ThreadMeter) {
        m.in_use.store(false, Relaxed);
    }

    fn all(&self) -> impl Iterator<Item = &ThreadMeter> {
        self.used().iter().chain(std::iter::once(&self.overflow))
    }

    /// Kernel launches counted so far by every thread of the process.
    pub fn launches(&self) -> u64 {
        self.all()
            .map(|m| m.launches.load(Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// Blocks launched so far on limit index `dev`.
    pub fn blocks_on(&self, dev: usize) -> u64 {
        self.all()
            .filter_map(|m| m.blocks.get(dev))
            .map(|c| c.load(Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// In the child of fork(), where only the forking thread exists: every count back to 0 and
    /// every meter free (the forking thread acquires a new one at its next launch).
    pub fn reset(&self) {
        for m in self.all() {
            m.clear();
            m.in_use.store(false, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_survive_their_threads_and_meters_are_reused() {
        let meters = Meters::new();
        std::thread::scope(|s| {
            for t in 0..8u64 {
                let meters = &meters;
                s.spawn(move || {
                    let m = meters.acquire();
                    for _ in 0..10_000 {
                        m.launched();
                        m.blocks(t as usize % 2, 3);
                    }
                    m.blocks(MAX_DEVICES, 1); // past the last device: ignored
                    meters.release(m);
                });
            }
        });
        assert_eq!(meters.launches(), 80_000);
        assert_eq!(meters.blocks_on(0), 120_000);
        assert_eq!(meters.blocks_on(1), 120_000);
        assert!(meters.used.load(Relaxed) <= 8);
        // A later thread adopts a released meter and keeps adding to the same sums.
        let before = meters.used.load(Relaxed);
        let m = meters.acquire();
        m.launched();
        assert_eq!(meters.used.load(Relaxed), before);
        assert_eq!(meters.launches(), 80_001);
        meters.reset();
        assert_eq!((meters.launches(), meters.blocks_on(0)), (0, 0));
    }

    #[test]
    fn threads_past_the_table_share_the_overflow_meter() {
        let meters = Meters::new();
        let held: Vec<&ThreadMeter> = (0..THREAD_METERS).map(|_| meters.acquire()).collect();
        assert!(held.iter().all(|m| !m.shared));
        std::thread::scope(|s| {
            for _ in 0..4 {
                let meters = &meters;
                s.spawn(move || {
                    let m = meters.acquire();
                    assert!(m.shared);
                    for _ in 0..10_000 {
                        m.launched();
                    }
                    meters.release(m);
                });
            }
        });
        assert_eq!(meters.launches(), 40_000);
        meters.release(held[5]);
        assert!(std::ptr::eq(meters.acquire(), held[5]));
    }
}
