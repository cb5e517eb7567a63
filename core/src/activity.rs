//! The GPU activity file: what the containers sharing one GPU tell each other (hook <-> hook across
//! containers), for task priority (`nvidia.com/priority`, HAMi's) and the `default` core-limit
//! policy (throttle only while another container uses the GPU).
//!
//! The device plugin creates one file per GPU (`<host-dir>/gpus/<uuid>`, laid out by
//! [`initial_bytes`]) and mounts it read-write into every vGPU container on that GPU at
//! `/usr/local/vgpu/gpus/<i>` (`i` the container's device index). Like the accounting file it is an
//! array of native-endian `u64` words changed only by atomic word operations, so no lock exists that
//! a killed process could leave held; a process's claim on a slot lives only as long as it keeps
//! beating ([`EXPIRE_MS`]).
//!
//! | header word | meaning |
//! |---|---|
//! | 0 | [`MAGIC`] |
//! | 1 | layout version ([`VERSION`]) |
//! | 2, 3, 4 | header words, slot count, slot words |
//! | 5 .. 8 | reserved, 0 |
//!
//! | slot word | meaning |
//! |---|---|
//! | 0 | claim: owner token (high 32 bits, never 0) and the owner's last beat (low 32 bits, milliseconds of `CLOCK_MONOTONIC`, wrapping); 0 = free. One word, so a claimer that takes an expired slot with a compare-and-swap can never take one that was just renewed |
//! | 1 | container key: equal for the processes of one container, different between containers |
//! | 2 | task priority: 0 high, 1 low |
//! | 3 | milliseconds of `CLOCK_MONOTONIC` of the owner's last kernel launch, 0 = none yet |
//!
//! `CLOCK_MONOTONIC` is one clock for every container of a kernel (Linux time namespaces aside).
//! This module does no I/O.

/// `b"VGPUACT1"` read as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUACT1");
/// Current layout version.
pub const VERSION: u64 = 1;
/// Words in the header.
pub const HEADER_WORDS: usize = 8;
/// Process slots: processes on one GPU that launch kernels at the same time.
pub const SLOT_COUNT: usize = 256;
/// Words per slot.
pub const SLOT_WORDS: usize = 4;
/// Total words of a version-1 file.
pub const FILE_WORDS: usize = HEADER_WORDS + SLOT_COUNT * SLOT_WORDS;
/// Total bytes of a version-1 file.
pub const FILE_BYTES: usize = FILE_WORDS * 8;

/// A claim whose beat is older than this is free to take (its owner died or hangs).
pub const EXPIRE_MS: u32 = 1000;
/// A high-priority process that launched within this window pauses the low-priority ones.
pub const PRIORITY_WINDOW_MS: u64 = 100;
/// Another container that launched within this window shares the GPU (the `default` core policy
/// throttles then).
pub const SHARED_WINDOW_MS: u64 = 1000;

/// Header word indexes.
pub mod header {
    /// [`super::MAGIC`].
    pub const MAGIC: usize = 0;
    /// Layout version.
    pub const VERSION: usize = 1;
    /// Header size in words.
    pub const HEADER_WORDS: usize = 2;
    /// Number of slots.
    pub const SLOT_COUNT: usize = 3;
    /// Slot size in words.
    pub const SLOT_WORDS: usize = 4;
}

/// Slot word indexes (relative to the slot's first word).
pub mod slot {
    /// Owner token and last beat.
    pub const CLAIM: usize = 0;
    /// Container key.
    pub const KEY: usize = 1;
    /// Task priority.
    pub const PRIORITY: usize = 2;
    /// Last launch, ms.
    pub const LAUNCH_MS: usize = 3;
}

/// Word index of slot `i`'s word `field`.
pub const fn slot_word(i: usize, field: usize) -> usize {
    HEADER_WORDS + i * SLOT_WORDS + field
}

/// The claim word for `token` (non-zero) beating at `now_ms`.
pub const fn claim(token: u32, now_ms: u64) -> u64 {
    ((token as u64) << 32) | (now_ms & 0xffff_ffff)
}

/// The owner token of a claim word (0 = free).
pub const fn owner(claim: u64) -> u32 {
    (claim >> 32) as u32
}

/// Whether a claim word is held at `now_ms`: owned, and beaten within [`EXPIRE_MS`] or later than
/// `now_ms` (another process's clock read may come after ours). The beat's 32 bits wrap every 49
/// days: the difference is taken modulo 2^32, as a signed number.
pub fn held(claim: u64, now_ms: u64) -> bool {
    owner(claim) != 0 && ((now_ms as u32).wrapping_sub(claim as u32) as i32) <= EXPIRE_MS as i32
}

/// A new file: the header, every slot free.
pub fn initial_bytes() -> Vec<u8> {
    let mut words = vec![0u64; FILE_WORDS];
    words[header::MAGIC] = MAGIC;
    words[header::VERSION] = VERSION;
    words[header::HEADER_WORDS] = HEADER_WORDS as u64;
    words[header::SLOT_COUNT] = SLOT_COUNT as u64;
    words[header::SLOT_WORDS] = SLOT_WORDS as u64;
    words.iter().flat_map(|w| w.to_ne_bytes()).collect()
}

/// Bytes of the header words [`header_ok`] reads.
pub const HEADER_CHECK_BYTES: usize = (header::SLOT_WORDS + 1) * 8;

/// Whether the header words, read through `word` (index -> value), are the version-1 layout this
/// build uses; the caller checks the file is [`FILE_BYTES`] long.
pub fn header_ok(word: impl Fn(usize) -> u64) -> bool {
    word(header::MAGIC) == MAGIC
        && word(header::VERSION) == VERSION
        && word(header::HEADER_WORDS) == HEADER_WORDS as u64
        && word(header::SLOT_COUNT) == SLOT_COUNT as u64
        && word(header::SLOT_WORDS) == SLOT_WORDS as u64
}

/// Whether the bytes start with a version-1 header (at least [`HEADER_CHECK_BYTES`] of them).
pub fn header_bytes_ok(bytes: &[u8]) -> bool {
    bytes.len() >= HEADER_CHECK_BYTES
        && header_ok(|i| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_file_has_the_layout_and_free_slots() {
        let bytes = initial_bytes();
        assert_eq!(bytes.len(), FILE_BYTES);
        assert!(header_bytes_ok(&bytes));
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().unwrap_or_default()))
            .collect();
        assert!((0..SLOT_COUNT).all(|s| words[slot_word(s, slot::CLAIM)] == 0));
        let mut other = bytes.clone();
        other[header::VERSION * 8] = 2;
        assert!(!header_bytes_ok(&other) && !header_bytes_ok(&bytes[..HEADER_CHECK_BYTES - 1]));
    }

    #[test]
    fn claims_expire_and_survive_the_clock_wrapping() {
        let c = claim(7, 5_000);
        assert_eq!(owner(c), 7);
        assert!(held(c, 5_000) && held(c, 6_000) && !held(c, 6_001));
        assert!(!held(0, 5_000));
        // A beat just before the 32-bit millisecond counter wraps is still fresh just after.
        let c = claim(9, (1 << 32) - 10);
        assert!(held(c, (1 << 32) + 500) && !held(c, (1 << 32) + 991));
        // A beat a moment after our own clock read (another process read later) is held.
        assert!(held(claim(3, 5_001), 5_000));
    }
}
