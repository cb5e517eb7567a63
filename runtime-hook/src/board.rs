//! What the processes on one GPU tell each other through its activity file (layout and windows in
//! `vgpu_core::activity`): each process beats in its own slot every watcher period with its
//! container key, its task priority and when it last launched; every process reads the others' to
//! decide whether a high-priority container is busy (low-priority launches then wait) and whether
//! another container uses the GPU (the `default` core policy throttles only then). Safe code over
//! `&[AtomicU64]`, so unit tests run it on a plain vector.
//!
//! No lock: a claim is one word (owner token and last beat) taken with a compare-and-swap, and a
//! claim that has not beaten for `EXPIRE_MS` is free again, so a process killed at any instruction
//! costs the others nothing but its slot for a second. A process whose slot was taken while it
//! stalled finds out at its next beat and claims another.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use vgpu_core::activity::{
    claim, header_ok, held, owner, slot, slot_word, FILE_WORDS, PRIORITY_WINDOW_MS,
    SHARED_WINDOW_MS, SLOT_COUNT,
};

/// One process's view of a GPU's activity words.
pub struct Board<'a> {
    words: &'a [AtomicU64],
}

impl<'a> Board<'a> {
    /// The board over these words, when they hold the version-1 layout (the device plugin lays
    /// it out when it creates the file).
    pub fn new(words: &'a [AtomicU64]) -> Option<Board<'a>> {
        let ok = words.len() >= FILE_WORDS && header_ok(|i| words[i].load(SeqCst));
        ok.then_some(Board { words })
    }

    fn w(&self, s: usize, field: usize) -> &AtomicU64 {
        &self.words[slot_word(s, field)]
    }

    /// Takes a free or expired slot for `token` (non-zero) and fills it in; `None` when every
    /// slot is held.
    pub fn claim(&self, token: u32, key: u64, priority: u8, now_ms: u64) -> Option<usize> {
        for s in 0..SLOT_COUNT {
            let c = self.w(s, slot::CLAIM).load(SeqCst);
            if held(c, now_ms) {
                continue;
            }
            if self
                .w(s, slot::CLAIM)
                .compare_exchange(c, claim(token, now_ms), SeqCst, SeqCst)
                .is_ok()
            {
                // A slot is free only after its owner's beat expired, so its last launch is older
                // than every window: nobody reads the old key or priority as current.
                self.w(s, slot::KEY).store(key, SeqCst);
                self.w(s, slot::PRIORITY).store(u64::from(priority), SeqCst);
                self.w(s, slot::LAUNCH_MS).store(0, SeqCst);
                return Some(s);
            }
        }
        None
    }

    /// Beats in slot `s` at `now_ms`, recording a launch when `launched`; false when the slot is
    /// no longer `token`'s (it expired while the process stalled; claim another).
    pub fn beat(&self, s: usize, token: u32, now_ms: u64, launched: bool) -> bool {
        let renewed = self
            .w(s, slot::CLAIM)
            .fetch_update(SeqCst, SeqCst, |c| {
                (owner(c) == token).then_some(claim(token, now_ms))
            })
            .is_ok();
        if renewed && launched {
            self.w(s, slot::LAUNCH_MS).store(now_ms.max(1), SeqCst);
        }
        renewed
    }

    /// Gives slot `s` back (a normal exit).
    pub fn release(&self, s: usize, token: u32) {
        let _ = self
            .w(s, slot::CLAIM)
            .fetch_update(SeqCst, SeqCst, |c| (owner(c) == token).then_some(0));
    }

    /// Held slots other than `me` that launched within `window_ms` of `now_ms`, with (key,
    /// priority).
    fn recent(
        &self,
        me: Option<usize>,
        now_ms: u64,
        window_ms: u64,
    ) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..SLOT_COUNT)
            .filter(move |&s| Some(s) != me)
            .filter(move |&s| held(self.w(s, slot::CLAIM).load(SeqCst), now_ms))
            .filter_map(move |s| {
                let at = self.w(s, slot::LAUNCH_MS).load(SeqCst);
                (at != 0 && now_ms.saturating_sub(at) <= window_ms).then(|| {
                    (
                        self.w(s, slot::KEY).load(SeqCst),
                        self.w(s, slot::PRIORITY).load(SeqCst),
                    )
                })
            })
    }

    /// Whether a high-priority process other than slot `me` launched within the priority window.
    pub fn high_priority_busy(&self, me: Option<usize>, now_ms: u64) -> bool {
        self.recent(me, now_ms, PRIORITY_WINDOW_MS)
            .any(|(_, p)| p == 0)
    }

    /// Whether a process of another container than `key` launched within the shared window.
    pub fn shared(&self, key: u64, now_ms: u64) -> bool {
        self.recent(None, now_ms, SHARED_WINDOW_MS)
            .any(|(k, _)| k != key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_core::activity::{initial_bytes, EXPIRE_MS};

    fn words() -> Vec<AtomicU64> {
        initial_bytes()
            .chunks_exact(8)
            .map(|c| AtomicU64::new(u64::from_ne_bytes(c.try_into().unwrap_or_default())))
            .collect()
    }

    #[test]
    fn a_busy_high_priority_container_pauses_the_low_one_until_it_goes_idle() {
        let w = words();
        let b = Board::new(&w).expect("layout");
        let high = b.claim(1, 100, 0, 1_000).expect("slot");
        let low = b.claim(2, 200, 1, 1_000).expect("slot");
        assert_ne!(high, low);
        // Nobody launched yet.
        assert!(!b.high_priority_busy(Some(low), 1_000));
        assert!(b.beat(high, 1, 1_050, true));
        assert!(b.high_priority_busy(Some(low), 1_100));
        // The high one does not pause itself; a low one's launches pause nobody.
        assert!(!b.high_priority_busy(Some(high), 1_100));
        assert!(b.beat(low, 2, 1_100, true));
        assert!(!b.high_priority_busy(Some(high), 1_120));
        // Idle for longer than the window: the low one resumes, though the high one still beats.
        assert!(b.beat(high, 1, 1_200, false));
        assert!(!b.high_priority_busy(Some(low), 1_151));
    }

    #[test]
    fn another_container_shares_the_gpu_while_it_launches() {
        let w = words();
        let b = Board::new(&w).expect("layout");
        let a1 = b.claim(1, 100, 1, 0).expect("slot");
        let a2 = b.claim(2, 100, 1, 0).expect("slot");
        assert!(b.beat(a1, 1, 10, true) && b.beat(a2, 2, 10, true));
        // Two processes of one container: not shared.
        assert!(!b.shared(100, 20));
        let other = b.claim(3, 300, 1, 20).expect("slot");
        assert!(b.beat(other, 3, 30, true));
        assert!(b.shared(100, 40) && b.shared(300, 40));
        assert!(!b.shared(100, 31 + SHARED_WINDOW_MS));
    }

    #[test]
    fn a_dead_owner_s_claim_expires_and_a_stalled_owner_learns_it_lost_its_slot() {
        let w = words();
        let b = Board::new(&w).expect("layout");
        let s = b.claim(1, 100, 0, 0).expect("slot");
        assert!(b.beat(s, 1, 10, true));
        assert!(b.high_priority_busy(None, 20));
        // Killed: no more beats. The claim holds for EXPIRE_MS, but the launch window ends first.
        assert!(!b.high_priority_busy(None, 10 + PRIORITY_WINDOW_MS + 1));
        let later = 10 + u64::from(EXPIRE_MS) + 1;
        let taken = b.claim(2, 200, 1, later).expect("slot");
        assert_eq!(taken, s, "the expired slot is taken first");
        assert!(!b.beat(s, 1, later + 1, true), "the old owner lost it");
        assert!(!b.high_priority_busy(Some(taken), later + 2));
        b.release(taken, 2);
        assert_eq!(b.claim(3, 300, 1, later + 3), Some(s));
    }

    #[test]
    fn a_beat_newer_than_the_reader_s_clock_is_live() {
        let w = words();
        let b = Board::new(&w).expect("layout");
        let high = b.claim(1, 100, 0, 5_000).expect("slot");
        assert!(b.beat(high, 1, 5_001, true));
        // Read with a clock a millisecond behind: still held, still busy, not taken.
        assert!(b.high_priority_busy(None, 5_000));
        assert_ne!(b.claim(2, 200, 1, 5_000), Some(high));
    }

    #[test]
    fn every_slot_held_means_no_slot_and_a_foreign_layout_is_refused() {
        let w = words();
        let b = Board::new(&w).expect("layout");
        for t in 1..=SLOT_COUNT as u32 {
            assert!(b.claim(t, 1, 1, 5).is_some());
        }
        assert_eq!(b.claim(9999, 1, 1, 5), None);
        w[vgpu_core::activity::header::VERSION].store(2, SeqCst);
        assert!(Board::new(&w).is_none());
        assert!(Board::new(&w[..4]).is_none());
    }
}
