//! Lock-free container accounting over the words of the shared file (layout in
//! `vgpu_core::accounting`). Safe code over `&[AtomicU64]`, so unit tests run it on a plain vector.
//!
//! Reserve-then-check: a process adds to its own slot first, then sums every slot; over the limit it
//! subtracts again and refuses. All operations are `SeqCst`, so every allocation that passes its check
//! saw all allocations that passed before it: the sum of live allocations never exceeds the limit.
//! No lock exists, so a process killed at any instruction leaves nobody waiting; its slot is
//! reclaimed once its pid is gone (the driver frees a dead process's memory).

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use vgpu_core::accounting::{
    header, slot, slot_word, FILE_WORDS, HEADER_WORDS, MAGIC, MAX_DEVICES, OWNER_RECLAIMING,
    SLOT_COUNT, SLOT_WORDS, VERSION,
};

/// The words did not hold a usable version-1 layout.
#[derive(Debug, thiserror::Error)]
#[error("vgpu: the accounting file has another layout (magic {magic:#x}, version {version}); refusing CUDA")]
pub struct LayoutMismatch {
    magic: u64,
    version: u64,
}

/// One process's view of the container's accounting words.
pub struct Ledger<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Ledger<'a> {
    /// Lays out the header if the file is new (every process writes the same constants, then the
    /// magic word last), and checks it otherwise.
    pub fn init(
        words: &'a [AtomicU64],
        memory_limit: &[Option<u64>; MAX_DEVICES],
        sm_limit: &[u32; MAX_DEVICES],
    ) -> Result<Ledger<'a>, LayoutMismatch> {
        assert_eq!(words.len(), FILE_WORDS);
        let magic = words[header::MAGIC].load(SeqCst);
        if magic == 0 {
            words[header::VERSION].store(VERSION, SeqCst);
            words[header::HEADER_WORDS].store(HEADER_WORDS as u64, SeqCst);
            words[header::SLOT_COUNT].store(SLOT_COUNT as u64, SeqCst);
            words[header::SLOT_WORDS].store(SLOT_WORDS as u64, SeqCst);
            words[header::DEVICES].store(MAX_DEVICES as u64, SeqCst);
            for d in 0..MAX_DEVICES {
                words[header::MEMORY_LIMIT + d].store(memory_limit[d].unwrap_or(0), SeqCst);
                words[header::SM_LIMIT + d].store(u64::from(sm_limit[d]), SeqCst);
            }
            words[header::MAGIC].store(MAGIC, SeqCst);
        }
        let (magic, version) = (
            words[header::MAGIC].load(SeqCst),
            words[header::VERSION].load(SeqCst),
        );
        let sizes_ok = words[header::HEADER_WORDS].load(SeqCst) == HEADER_WORDS as u64
            && words[header::SLOT_COUNT].load(SeqCst) == SLOT_COUNT as u64
            && words[header::SLOT_WORDS].load(SeqCst) == SLOT_WORDS as u64;
        if magic != MAGIC || version != VERSION || !sizes_ok {
            return Err(LayoutMismatch { magic, version });
        }
        Ok(Ledger { words })
    }

    fn w(&self, s: usize, field: usize) -> &AtomicU64 {
        &self.words[slot_word(s, field)]
    }

    /// Slots that may be owned: those below the high-water mark. Reserve-then-check stays exact:
    /// a claimer raises the mark before its first reservation, so a sum that comes after that
    /// reservation in the SeqCst order also reads a mark covering the slot.
    fn used_slots(&self) -> std::ops::Range<usize> {
        0..(self.words[header::SLOTS_USED].load(SeqCst) as usize).min(SLOT_COUNT)
    }

    /// Takes a slot for `pid`: one it already owns (its pid was reused: the old owner is dead) is
    /// cleared and kept, else a free one; when none is free, dead owners' slots are reclaimed first.
    pub fn claim(&self, pid: u32, alive: &dyn Fn(u32) -> bool) -> Option<usize> {
        for attempt in 0..2 {
            for s in 0..SLOT_COUNT {
                let owner = self.w(s, slot::OWNER);
                if owner.load(SeqCst) == u64::from(pid) {
                    self.retire(s);
                    return Some(s);
                }
            }
            for s in 0..SLOT_COUNT {
                if self
                    .w(s, slot::OWNER)
                    .compare_exchange(0, u64::from(pid), SeqCst, SeqCst)
                    .is_ok()
                {
                    // Before the slot's first reservation: every later sum then covers it.
                    self.words[header::SLOTS_USED].fetch_max(s as u64 + 1, SeqCst);
                    return Some(s);
                }
            }
            if attempt == 0 {
                self.reclaim_dead(pid, alive);
            }
        }
        None
    }

    /// Folds a slot's counters into the header's retired counters (so the container's counters stay
    /// monotonic) and clears it.
    fn retire(&self, s: usize) {
        for (field, total) in [
            (slot::LAUNCHES, header::RETIRED_LAUNCHES),
            (slot::OOM_REFUSALS, header::RETIRED_OOM_REFUSALS),
            (slot::THROTTLED_NS, header::RETIRED_THROTTLED_NS),
        ] {
            let v = self.w(s, field).swap(0, SeqCst);
            self.words[total].fetch_add(v, SeqCst);
        }
        self.clear(s);
    }

    fn clear(&self, s: usize) {
        for f in 1..SLOT_WORDS {
            self.w(s, f).store(0, SeqCst);
        }
    }

    /// Frees the slots whose owner (or reclaimer) is dead. Returns how many.
    ///
    /// Every slot is checked, not only those below the high-water mark: a process killed between
    /// taking a slot and raising the mark leaves an owned slot above it (it reserved nothing yet,
    /// so the sums may skip it, but it must still be freed).
    pub fn reclaim_dead(&self, me: u32, alive: &dyn Fn(u32) -> bool) -> usize {
        let mut n = 0;
        for s in 0..SLOT_COUNT {
            let owner = self.w(s, slot::OWNER);
            let cur = owner.load(SeqCst);
            let pid = (cur & 0xffff_ffff) as u32;
            if cur == 0 || pid == me || alive(pid) {
                continue;
            }
            // Mark it ours while clearing; should we die here, the next reclaimer sees our pid dead.
            if owner
                .compare_exchange(cur, OWNER_RECLAIMING | u64::from(me), SeqCst, SeqCst)
                .is_ok()
            {
                self.retire(s);
                owner.store(0, SeqCst);
                n += 1;
            }
        }
        n
    }

    /// Pids NVML may report for the container's CUDA processes: every slot owner's pid and, where
    /// known, its host pid ([`Ledger::set_host_pid`]).
    pub fn pids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        for s in self.used_slots() {
            let o = self.w(s, slot::OWNER).load(SeqCst);
            if o == 0 || o & OWNER_RECLAIMING != 0 {
                continue;
            }
            v.push((o & 0xffff_ffff) as u32);
            let host = (self.w(s, slot::HOST_PID).load(SeqCst) & 0xffff_ffff) as u32;
            if host != 0 {
                v.push(host);
            }
        }
        v
    }

    /// Records the pid NVML reports for slot `s`'s process (its pid in the host's namespace).
    pub fn set_host_pid(&self, s: usize, pid: u32) {
        self.w(s, slot::HOST_PID).store(u64::from(pid), SeqCst);
    }

    /// The pid NVML reports for slot `s`'s process, 0 = not known.
    pub fn host_pid(&self, s: usize) -> u32 {
        (self.w(s, slot::HOST_PID).load(SeqCst) & 0xffff_ffff) as u32
    }

    /// Bytes the container uses on `dev`.
    pub fn container_used(&self, dev: usize) -> u64 {
        self.used_slots()
            .map(|s| self.w(s, slot::USED + dev).load(SeqCst))
            .fold(0u64, u64::saturating_add)
    }

    /// Reserves `bytes` on `dev` for slot `s` under `limit`; `false` (and nothing changed) when it
    /// would pass the limit.
    pub fn reserve(&self, s: usize, dev: usize, bytes: u64, limit: Option<u64>) -> bool {
        if dev >= MAX_DEVICES {
            return limit.is_none();
        }
        let used = self.w(s, slot::USED + dev);
        let mine = used.fetch_add(bytes, SeqCst).saturating_add(bytes);
        let container = self.container_used(dev);
        if let Some(limit) = limit {
            if bytes > limit || container > limit {
                used.fetch_sub(bytes, SeqCst);
                self.w(s, slot::OOM_REFUSALS).fetch_add(1, SeqCst);
                return false;
            }
        }
        // Peaks only grow: a read first skips the read-modify-write (on the container's peak, a
        // word every process writes) unless this is a new peak.
        for (word, v) in [
            (self.w(s, slot::PEAK + dev), mine),
            (&self.words[header::CONTAINER_PEAK + dev], container),
        ] {
            if word.load(SeqCst) < v {
                word.fetch_max(v, SeqCst);
            }
        }
        true
    }

    /// Gives back a reservation or a freed allocation.
    pub fn release(&self, s: usize, dev: usize, bytes: u64) {
        if dev < MAX_DEVICES {
            let used = self.w(s, slot::USED + dev);
            // Never below zero, even if a reclaimer cleared the slot meanwhile.
            let _ = used.fetch_update(SeqCst, SeqCst, |v| Some(v.saturating_sub(bytes)));
        }
    }

    /// Records that slot `s`'s process has launched `total` kernels so far (its threads' meters,
    /// summed: see `crate::meter`). Never lowers the count, so a late copy of an older sum cannot
    /// undo a newer one.
    pub fn record_launches(&self, s: usize, total: u64) {
        self.w(s, slot::LAUNCHES).fetch_max(total, SeqCst);
    }

    /// Adds time a launch waited for the core limit.
    pub fn throttled(&self, s: usize, ns: u64) {
        self.w(s, slot::THROTTLED_NS).fetch_add(ns, SeqCst);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vgpu_core::accounting::Snapshot;

    fn words() -> Vec<AtomicU64> {
        (0..FILE_WORDS).map(|_| AtomicU64::new(0)).collect()
    }

    fn bytes(w: &[AtomicU64]) -> Vec<u8> {
        w.iter()
            .flat_map(|x| x.load(SeqCst).to_ne_bytes())
            .collect()
    }

    #[test]
    fn limit_exactly_and_reader_agrees() {
        let w = words();
        let mut lim = [None; MAX_DEVICES];
        lim[0] = Some(1 << 30);
        let l = Ledger::init(&w, &lim, &[0; MAX_DEVICES]).unwrap();
        let a = l.claim(10, &|_| true).unwrap();
        let b = l.claim(11, &|_| true).unwrap();
        assert_ne!(a, b);
        // Only the claimed slots are summed.
        assert_eq!(w[header::SLOTS_USED].load(SeqCst), 2);
        assert_eq!(l.used_slots(), 0..2);
        assert!(l.reserve(a, 0, 1023 << 20, lim[0]));
        assert!(!l.reserve(b, 0, 2 << 20, lim[0]));
        assert!(l.reserve(b, 0, 1 << 20, lim[0]));
        assert!(!l.reserve(b, 0, 1, lim[0]));
        l.record_launches(a, 1);
        l.record_launches(a, 0);
        let s = Snapshot::parse(&bytes(&w)).unwrap();
        assert_eq!(s.used(0), 1 << 30);
        assert_eq!(s.memory_limit[0], 1 << 30);
        assert_eq!(s.oom_refusals(), 2);
        assert_eq!(s.launches(), 1);
        assert_eq!(s.container_peak[0], 1 << 30);
        l.release(a, 0, 1023 << 20);
        assert_eq!(l.container_used(0), 1 << 20);
    }

    #[test]
    fn dead_slots_are_reclaimed_and_reused_pids_cleared() {
        let w = words();
        let l = Ledger::init(&w, &[Some(100); MAX_DEVICES], &[0; MAX_DEVICES]).unwrap();
        let a = l.claim(10, &|_| true).unwrap();
        assert!(l.reserve(a, 0, 100, Some(100)));
        let b = l.claim(11, &|_| true).unwrap();
        assert!(!l.reserve(b, 0, 1, Some(100)));
        l.record_launches(a, 1);
        l.throttled(a, 5);
        assert_eq!(l.reclaim_dead(11, &|p| p != 10), 1);
        assert!(l.reserve(b, 0, 100, Some(100)));
        // The dead process's counters stay in the container's totals.
        let snap = Snapshot::parse(&bytes(&w)).unwrap();
        assert_eq!(snap.processes.len(), 1);
        assert_eq!(
            (snap.launches(), snap.throttled_ns(), snap.oom_refusals()),
            (1, 5, 1)
        );
        // Host pids join the pids NVML may name, and leave with the slot.
        l.set_host_pid(b, 40_011);
        assert_eq!(l.host_pid(b), 40_011);
        assert_eq!(l.pids(), vec![11, 40_011]);
        assert_eq!(
            Snapshot::parse(&bytes(&w)).unwrap().processes[0].host_pid,
            40_011
        );
        // Pid 11 comes back as a new process: its old slot is cleared.
        assert_eq!(l.claim(11, &|_| true), Some(b));
        assert_eq!(l.container_used(0), 0);
        assert_eq!(l.host_pid(b), 0);
    }

    /// A process killed after taking a slot but before raising the high-water mark is still
    /// reclaimed.
    #[test]
    fn a_slot_above_the_mark_is_reclaimed() {
        let w = words();
        let l = Ledger::init(&w, &[None; MAX_DEVICES], &[0; MAX_DEVICES]).unwrap();
        let a = l.claim(10, &|_| true).unwrap();
        w[slot_word(a + 1, slot::OWNER)].store(11, SeqCst); // claimed, mark not raised
        assert_eq!(l.used_slots(), 0..1);
        assert_eq!(l.reclaim_dead(10, &|p| p != 11), 1);
        assert_eq!(w[slot_word(a + 1, slot::OWNER)].load(SeqCst), 0);
    }

    #[test]
    fn other_layout_refused() {
        let w = words();
        w[header::MAGIC].store(MAGIC, SeqCst);
        w[header::VERSION].store(9, SeqCst);
        assert!(Ledger::init(&w, &[None; MAX_DEVICES], &[0; MAX_DEVICES]).is_err());
    }

    /// 8 threads race reservations on one limit; the sum of what succeeded never passes it.
    #[test]
    fn racing_reservations_never_pass_the_limit() {
        let w = words();
        let limit = Some(1000u64);
        let l = Ledger::init(&w, &[limit; MAX_DEVICES], &[0; MAX_DEVICES]).unwrap();
        let live = AtomicU64::new(0);
        let peak = AtomicU64::new(0);
        std::thread::scope(|sc| {
            for t in 0..8u32 {
                let (l, live, peak) = (&l, &live, &peak);
                sc.spawn(move || {
                    let s = l.claim(100 + t, &|_| true).unwrap();
                    let mut held = Vec::new();
                    for i in 0..20_000u64 {
                        let size = 1 + (i * 7 + u64::from(t) * 13) % 300;
                        if i % 3 != 2 && l.reserve(s, 0, size, limit) {
                            let now = live.fetch_add(size, SeqCst) + size;
                            peak.fetch_max(now, SeqCst);
                            held.push(size);
                        } else if let Some(b) = held.pop() {
                            live.fetch_sub(b, SeqCst);
                            l.release(s, 0, b);
                        }
                    }
                });
            }
        });
        assert!(peak.load(SeqCst) <= 1000, "{}", peak.load(SeqCst));
        assert!(peak.load(SeqCst) > 500);
    }
}
