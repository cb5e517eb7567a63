//! What this process's memory pools hold, as the hook charges it.
//!
//! A stream-ordered allocation (`cuMemAllocAsync`, `cuMemAllocFromPoolAsync`) comes from a memory
//! pool, and its free returns the memory to the pool, not to the device: the pool keeps it until a
//! synchronisation gives back what it holds above its release threshold, or `cuMemPoolTrimTo`
//! (cuda.h, "Stream Ordered Memory Allocator"). So the device memory a pool takes is its reserve,
//! not its live allocations, and that is what the slice must count: crediting at each free would
//! let a program that frees into one pool (with a raised threshold) and allocates from another, or
//! through `cuMemAlloc`, hold more than its slice.
//!
//! The book charges each pool the growth of its reserve as the hook sees it: an allocation that
//! fits in what the pool is charged for and does not use costs nothing more, one that does not
//! costs the difference; a free lowers the pool's use and keeps the charge. When the driver has
//! given memory back (a synchronisation, a trim), [`PoolBook::settle`] lowers a pool's charge to
//! what it reserves now, never below its use: the hook settles its pools before refusing an
//! allocation, after a trim and when a pool is destroyed. Safe code.

use std::collections::HashMap;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Entry {
    /// Limit index of the pool's device.
    dev: usize,
    /// Bytes charged to the slice for the pool's reserve.
    charged: u64,
    /// Bytes of live allocations from the pool.
    used: u64,
}

/// The pools this process allocated from, and its live pool allocations.
#[derive(Debug, Default)]
pub struct PoolBook {
    pools: HashMap<u64, Entry>,
    /// Pointer -> (pool, bytes).
    allocations: HashMap<u64, (u64, u64)>,
}

impl PoolBook {
    /// What allocating `bytes` from `pool` must charge first: the part the pool's charge does not
    /// cover.
    pub fn growth(&self, pool: u64, bytes: u64) -> u64 {
        let e = self.pools.get(&pool).copied().unwrap_or_default();
        e.used.saturating_add(bytes).saturating_sub(e.charged)
    }

    /// Records an allocation of `bytes` at `ptr` from `pool` on limit index `dev`, for which
    /// `charged` more bytes were charged.
    pub fn allocated(&mut self, pool: u64, dev: usize, ptr: u64, bytes: u64, charged: u64) {
        let e = self.pools.entry(pool).or_insert(Entry {
            dev,
            ..Entry::default()
        });
        e.used = e.used.saturating_add(bytes);
        e.charged = e.charged.saturating_add(charged);
        self.allocations.insert(ptr, (pool, bytes));
    }

    /// A free of `ptr`: its pool's use falls, its charge stays. `false` when `ptr` is not a pool
    /// allocation of this process.
    pub fn freed(&mut self, ptr: u64) -> bool {
        let Some((pool, bytes)) = self.allocations.remove(&ptr) else {
            return false;
        };
        if let Some(e) = self.pools.get_mut(&pool) {
            e.used = e.used.saturating_sub(bytes);
        }
        true
    }

    /// The pools charged for more than they use (the only ones a settle can credit).
    pub fn settleable(&self) -> Vec<u64> {
        self.pools
            .iter()
            .filter(|(_, e)| e.charged > e.used)
            .map(|(p, _)| *p)
            .collect()
    }

    /// The driver says `pool` reserves `reserved` bytes now: its charge falls to that (never below
    /// its use). Returns the limit index and the bytes to credit, if any.
    pub fn settle(&mut self, pool: u64, reserved: u64) -> Option<(usize, u64)> {
        let e = self.pools.get_mut(&pool)?;
        let keep = reserved.max(e.used);
        (e.charged > keep).then(|| {
            let credit = e.charged - keep;
            e.charged = keep;
            (e.dev, credit)
        })
    }

    /// `pool` was destroyed: the driver gives back what no live allocation uses.
    pub fn destroyed(&mut self, pool: u64) -> Option<(usize, u64)> {
        self.settle(pool, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn a_pool_is_charged_its_reserve_until_the_driver_gives_it_back() {
        let mut b = PoolBook::default();
        // 600 MiB from pool A: charged 600.
        assert_eq!(b.growth(0xa, 600 * MIB), 600 * MIB);
        b.allocated(0xa, 0, 0x1000, 600 * MIB, 600 * MIB);
        // Freed: the pool keeps the memory, so the charge stays.
        assert!(b.freed(0x1000));
        assert!(!b.freed(0x1000));
        // Reused from the same pool: within the charge, nothing more.
        assert_eq!(b.growth(0xa, 500 * MIB), 0);
        b.allocated(0xa, 0, 0x2000, 500 * MIB, 0);
        // Past it: only the difference.
        assert_eq!(b.growth(0xa, 200 * MIB), 100 * MIB);
        // Another pool starts from nothing.
        assert_eq!(b.growth(0xb, 10 * MIB), 10 * MIB);
        b.freed(0x2000);
        assert_eq!(b.settleable(), vec![0xa]);
        // The driver still reserves 600 MiB (raised threshold): nothing to credit.
        assert_eq!(b.settle(0xa, 600 * MIB), None);
        // After a trim it reserves 100: 500 back.
        assert_eq!(b.settle(0xa, 100 * MIB), Some((0, 500 * MIB)));
        // Never below what live allocations use.
        b.allocated(0xa, 0, 0x3000, 50 * MIB, 0);
        assert_eq!(b.settle(0xa, 0), Some((0, 50 * MIB)));
        assert_eq!(b.destroyed(0xa), None);
        b.freed(0x3000);
        assert_eq!(b.destroyed(0xa), Some((0, 50 * MIB)));
        assert_eq!(b.settle(0xc, 0), None);
    }
}
