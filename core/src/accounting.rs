//! The shared accounting file: how the processes of one container share their GPU memory and launch
//! meters (hook <-> hook), and how the device plugin reads them for metrics (hook -> device plugin).
//!
//! The file is an array of native-endian `u64` words, memory-mapped by every process of the container
//! and updated only with atomic word operations, so no lock exists that a killed process could leave
//! held (HAMi-core's semaphore in the shared region deadlocked exactly there). It starts with a header
//! of [`HEADER_WORDS`] words, followed by [`SLOT_COUNT`] process slots of [`SLOT_WORDS`] words each:
//!
//! | header word | meaning |
//! |---|---|
//! | 0 | [`MAGIC`], written last by the first process that lays the file out |
//! | 1 | layout version ([`VERSION`]) |
//! | 2, 3, 4, 5 | header words, slot count, slot words, device count: a reader uses these, so fields appended later within version 1 do not break it |
//! | 6 .. 6+[`MAX_DEVICES`] | memory limit per visible device in bytes, 0 = none |
//! | 22 .. 22+[`MAX_DEVICES`] | SM limit per visible device in percent, 0 = none |
//! | 38, 39, 40 | launches, refusals and throttled ns of processes whose slots were reclaimed (so the container's counters never go back when a process exits) |
//! | 41 .. 41+[`MAX_DEVICES`] | peak bytes the whole container had allocated, per device |
//! | 57 | slot high-water mark: no slot at or above this index has ever been owned (writers raise it before a new slot's first use, so the hooks sum only the slots below it; readers may ignore it) |
//! | 58 .. 64 | reserved, 0 |
//!
//! | slot word | meaning |
//! |---|---|
//! | 0 | owner: the pid in the low 32 bits, [`OWNER_RECLAIMING`] while a dead owner's slot is being cleared; 0 = free |
//! | 1 | kernel launches |
//! | 2 | allocations refused as over the limit |
//! | 3 | nanoseconds launches waited for the core limit |
//! | 4 .. 4+[`MAX_DEVICES`] | bytes allocated now, per device |
//! | 20 .. 20+[`MAX_DEVICES`] | peak bytes allocated, per device |
//! | 36 | the process's pid as NVML reports it (the host's pid namespace), 0 = not known yet; the hook learns it from NVML's running processes, to find its own utilization samples |
//! | 37 .. 40 | reserved, 0 |
//!
//! The container's usage of a device is the sum of the `used` words of all owned slots. A process
//! reserves by adding to its own word first and then summing all slots; if the sum is over the limit
//! it subtracts again and refuses. Every allocation that passes its check therefore saw every other
//! allocation that passed before it, so the sum of live allocations never exceeds the limit; two racing
//! processes near the limit may both refuse, never both succeed past it.
//!
//! Words 38..57 were reserved (zero) in the first version-1 files, so a file written before they
//! were defined reads as "nothing retired, peak unknown (0)"; readers of that time ignore them.
//!
//! This module does no I/O: [`Snapshot::parse`] reads bytes someone read from the file.

use thiserror::Error;

/// `b"VGPUACC1"` read as a little-endian word.
pub const MAGIC: u64 = u64::from_le_bytes(*b"VGPUACC1");
/// Current layout version.
pub const VERSION: u64 = 1;
/// Devices one container can see.
pub const MAX_DEVICES: usize = 16;
/// Words in the header.
pub const HEADER_WORDS: usize = 64;
/// Process slots: processes of one container that may use CUDA at the same time.
pub const SLOT_COUNT: usize = 128;
/// Words per process slot.
pub const SLOT_WORDS: usize = 40;
/// Total words of a version-1 file.
pub const FILE_WORDS: usize = HEADER_WORDS + SLOT_COUNT * SLOT_WORDS;
/// Total bytes of a version-1 file.
pub const FILE_BYTES: usize = FILE_WORDS * 8;

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
    /// Number of device entries.
    pub const DEVICES: usize = 5;
    /// First memory-limit word.
    pub const MEMORY_LIMIT: usize = 6;
    /// First SM-limit word.
    pub const SM_LIMIT: usize = 22;
    /// Launches of reclaimed slots.
    pub const RETIRED_LAUNCHES: usize = 38;
    /// Refusals of reclaimed slots.
    pub const RETIRED_OOM_REFUSALS: usize = 39;
    /// Throttled ns of reclaimed slots.
    pub const RETIRED_THROTTLED_NS: usize = 40;
    /// First per-device container peak word.
    pub const CONTAINER_PEAK: usize = 41;
    /// Slot high-water mark.
    pub const SLOTS_USED: usize = 57;
}

/// Slot word indexes (relative to the slot's first word).
pub mod slot {
    /// Owner pid (low 32 bits) and flags.
    pub const OWNER: usize = 0;
    /// Kernel launches.
    pub const LAUNCHES: usize = 1;
    /// Refused allocations.
    pub const OOM_REFUSALS: usize = 2;
    /// Nanoseconds spent waiting for the core limit.
    pub const THROTTLED_NS: usize = 3;
    /// First per-device bytes-in-use word.
    pub const USED: usize = 4;
    /// First per-device peak word.
    pub const PEAK: usize = 20;
    /// The pid NVML reports for the process (host pid namespace), 0 = unknown.
    pub const HOST_PID: usize = 36;
}

/// Owner flag: the slot's dead owner is being cleared by another process.
pub const OWNER_RECLAIMING: u64 = 1 << 32;

/// Word index of slot `i`'s word `field`.
pub const fn slot_word(i: usize, field: usize) -> usize {
    HEADER_WORDS + i * SLOT_WORDS + field
}

/// Why an accounting file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum AccountingError {
    /// Shorter than its header says.
    #[error("accounting file is {len} bytes, its layout needs {need}")]
    Truncated {
        /// Bytes found.
        len: usize,
        /// Bytes needed.
        need: usize,
    },
    /// No magic word (not laid out yet, or not an accounting file).
    #[error("accounting file has no vgpu magic word (not initialised, or another file)")]
    BadMagic,
    /// A version this build does not know.
    #[error("accounting file version {0} is not supported (this build reads {VERSION})")]
    UnsupportedVersion(u64),
    /// Header sizes that cannot be version 1.
    #[error("accounting file header field {field} is {value}, smaller than version 1 needs")]
    BadHeader {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

/// Meters of one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessUsage {
    /// Process id in the container's pid namespace.
    pub pid: u32,
    /// Its pid as NVML (the host) reports it, 0 = not known (written by the hook with a core limit).
    pub host_pid: u32,
    /// Kernel launches.
    pub launches: u64,
    /// Allocations refused as over the limit.
    pub oom_refusals: u64,
    /// Nanoseconds launches waited for the core limit.
    pub throttled_ns: u64,
    /// Bytes allocated now, per device.
    pub used: [u64; MAX_DEVICES],
    /// Peak bytes allocated, per device.
    pub peak: [u64; MAX_DEVICES],
}

/// Everything an accounting file says, as the device plugin reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// Memory limit per device in bytes, 0 = none.
    pub memory_limit: [u64; MAX_DEVICES],
    /// SM limit per device in percent, 0 = none.
    pub sm_limit: [u64; MAX_DEVICES],
    /// Owned slots, in slot order.
    pub processes: Vec<ProcessUsage>,
    /// Counters of processes whose slots were reclaimed (launches, refusals and throttled ns in
    /// `launches`, `oom_refusals`, `throttled_ns`; `pid` 0, no bytes).
    pub retired: ProcessUsage,
    /// Peak bytes the whole container had allocated, per device.
    pub container_peak: [u64; MAX_DEVICES],
}

fn word(bytes: &[u8], i: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
    u64::from_ne_bytes(w)
}

impl Snapshot {
    /// Reads a file's bytes (a copy taken while processes may be writing: each word is read whole).
    pub fn parse(bytes: &[u8]) -> Result<Snapshot, AccountingError> {
        if bytes.len() < HEADER_WORDS * 8 {
            return Err(AccountingError::Truncated {
                len: bytes.len(),
                need: HEADER_WORDS * 8,
            });
        }
        if word(bytes, header::MAGIC) != MAGIC {
            return Err(AccountingError::BadMagic);
        }
        let version = word(bytes, header::VERSION);
        if version != VERSION {
            return Err(AccountingError::UnsupportedVersion(version));
        }
        let field = |name: &'static str, i: usize, min: usize| {
            let v = word(bytes, i);
            if v < min as u64 || v > (1 << 20) {
                Err(AccountingError::BadHeader {
                    field: name,
                    value: v,
                })
            } else {
                Ok(v as usize)
            }
        };
        let header_words = field("header_words", header::HEADER_WORDS, HEADER_WORDS)?;
        let slot_count = field("slot_count", header::SLOT_COUNT, 1)?;
        let slot_words = field("slot_words", header::SLOT_WORDS, SLOT_WORDS)?;
        let devices = field("devices", header::DEVICES, MAX_DEVICES)?;
        let need = (header_words + slot_count * slot_words) * 8;
        if bytes.len() < need {
            return Err(AccountingError::Truncated {
                len: bytes.len(),
                need,
            });
        }
        let _ = devices; // only the first MAX_DEVICES entries are defined in version 1
        let mut snap = Snapshot::default();
        for d in 0..MAX_DEVICES {
            snap.memory_limit[d] = word(bytes, header::MEMORY_LIMIT + d);
            snap.sm_limit[d] = word(bytes, header::SM_LIMIT + d);
            snap.container_peak[d] = word(bytes, header::CONTAINER_PEAK + d);
        }
        snap.retired.launches = word(bytes, header::RETIRED_LAUNCHES);
        snap.retired.oom_refusals = word(bytes, header::RETIRED_OOM_REFUSALS);
        snap.retired.throttled_ns = word(bytes, header::RETIRED_THROTTLED_NS);
        for s in 0..slot_count {
            let base = header_words + s * slot_words;
            let owner = word(bytes, base + slot::OWNER);
            if owner == 0 || owner & OWNER_RECLAIMING != 0 {
                continue;
            }
            let mut p = ProcessUsage {
                pid: (owner & 0xffff_ffff) as u32,
                host_pid: (word(bytes, base + slot::HOST_PID) & 0xffff_ffff) as u32,
                launches: word(bytes, base + slot::LAUNCHES),
                oom_refusals: word(bytes, base + slot::OOM_REFUSALS),
                throttled_ns: word(bytes, base + slot::THROTTLED_NS),
                ..ProcessUsage::default()
            };
            for d in 0..MAX_DEVICES {
                p.used[d] = word(bytes, base + slot::USED + d);
                p.peak[d] = word(bytes, base + slot::PEAK + d);
            }
            snap.processes.push(p);
        }
        Ok(snap)
    }

    /// Writes a version-1 file with the processes in the first slots (for tests and tools).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = vec![0u64; FILE_WORDS];
        w[header::MAGIC] = MAGIC;
        w[header::VERSION] = VERSION;
        w[header::HEADER_WORDS] = HEADER_WORDS as u64;
        w[header::SLOT_COUNT] = SLOT_COUNT as u64;
        w[header::SLOT_WORDS] = SLOT_WORDS as u64;
        w[header::DEVICES] = MAX_DEVICES as u64;
        w[header::MEMORY_LIMIT..header::MEMORY_LIMIT + MAX_DEVICES]
            .copy_from_slice(&self.memory_limit);
        w[header::SM_LIMIT..header::SM_LIMIT + MAX_DEVICES].copy_from_slice(&self.sm_limit);
        w[header::CONTAINER_PEAK..header::CONTAINER_PEAK + MAX_DEVICES]
            .copy_from_slice(&self.container_peak);
        w[header::RETIRED_LAUNCHES] = self.retired.launches;
        w[header::RETIRED_OOM_REFUSALS] = self.retired.oom_refusals;
        w[header::RETIRED_THROTTLED_NS] = self.retired.throttled_ns;
        for (s, p) in self.processes.iter().take(SLOT_COUNT).enumerate() {
            w[slot_word(s, slot::OWNER)] = u64::from(p.pid);
            w[slot_word(s, slot::LAUNCHES)] = p.launches;
            w[slot_word(s, slot::OOM_REFUSALS)] = p.oom_refusals;
            w[slot_word(s, slot::THROTTLED_NS)] = p.throttled_ns;
            w[slot_word(s, slot::HOST_PID)] = u64::from(p.host_pid);
            for d in 0..MAX_DEVICES {
                w[slot_word(s, slot::USED + d)] = p.used[d];
                w[slot_word(s, slot::PEAK + d)] = p.peak[d];
            }
        }
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// Bytes the container uses on `device` now (sum over its processes; saturating: the file is
    /// written by the container and may hold anything).
    pub fn used(&self, device: usize) -> u64 {
        self.processes
            .iter()
            .map(|p| p.used.get(device).copied().unwrap_or(0))
            .fold(0, u64::saturating_add)
    }

    /// Kernel launches of the container, exited processes included (monotonic).
    pub fn launches(&self) -> u64 {
        self.total(|p| p.launches)
    }

    /// Refused allocations of the container, exited processes included (monotonic).
    pub fn oom_refusals(&self) -> u64 {
        self.total(|p| p.oom_refusals)
    }

    /// Nanoseconds the container's launches waited for the core limit (monotonic).
    pub fn throttled_ns(&self) -> u64 {
        self.total(|p| p.throttled_ns)
    }

    fn total(&self, f: impl Fn(&ProcessUsage) -> u64) -> u64 {
        self.processes
            .iter()
            .chain(std::iter::once(&self.retired))
            .map(f)
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Snapshot {
        let mut s = Snapshot::default();
        s.memory_limit[0] = 1 << 30;
        s.memory_limit[1] = 2 << 30;
        s.sm_limit[0] = 30;
        let mut a = ProcessUsage {
            pid: 7,
            host_pid: 41_007,
            launches: 100,
            oom_refusals: 2,
            throttled_ns: 5_000,
            ..Default::default()
        };
        a.used[0] = 10 << 20;
        a.peak[0] = 20 << 20;
        let mut b = ProcessUsage {
            pid: 9,
            launches: 1,
            ..Default::default()
        };
        b.used[0] = 1 << 20;
        b.used[1] = 3;
        s.processes = vec![a, b];
        s.retired.launches = 1000;
        s.retired.throttled_ns = 7;
        s.container_peak[0] = 30 << 20;
        s
    }

    #[test]
    fn round_trip() {
        let s = sample();
        let bytes = s.to_bytes();
        assert_eq!(bytes.len(), FILE_BYTES);
        let back = Snapshot::parse(&bytes).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.used(0), 11 << 20);
        assert_eq!(back.used(1), 3);
        assert_eq!(back.used(99), 0);
        assert_eq!(back.launches(), 1101);
        assert_eq!(back.oom_refusals(), 2);
        assert_eq!(back.throttled_ns(), 5_007);
        assert_eq!(back.container_peak[0], 30 << 20);
    }

    #[test]
    fn skips_free_and_reclaiming_slots() {
        let mut bytes = sample().to_bytes();
        // Mark slot 0 as being reclaimed: a reader must not count it.
        let i = slot_word(0, slot::OWNER) * 8;
        bytes[i..i + 8].copy_from_slice(&(7 | OWNER_RECLAIMING).to_ne_bytes());
        let back = Snapshot::parse(&bytes).unwrap();
        assert_eq!(back.processes.len(), 1);
        assert_eq!(back.processes[0].pid, 9);
    }

    /// A version-1 file written by a later build that appended fields to the header and to each slot
    /// still parses: the reader follows the sizes in the header.
    #[test]
    fn wider_version_1_still_parses() {
        let s = sample();
        let (hw, sw, n) = (HEADER_WORDS + 8, SLOT_WORDS + 4, 3usize);
        let mut w = vec![0u64; hw + n * sw];
        let old = s.to_bytes();
        for (i, x) in w.iter_mut().enumerate().take(HEADER_WORDS) {
            *x = word(&old, i);
        }
        w[header::HEADER_WORDS] = hw as u64;
        w[header::SLOT_COUNT] = n as u64;
        w[header::SLOT_WORDS] = sw as u64;
        for slot_i in 0..2 {
            for f in 0..SLOT_WORDS {
                w[hw + slot_i * sw + f] = word(&old, slot_word(slot_i, f));
            }
            w[hw + slot_i * sw + SLOT_WORDS] = 0xdead; // a future field
        }
        let bytes: Vec<u8> = w.iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert_eq!(Snapshot::parse(&bytes).unwrap(), s);
    }

    #[test]
    fn refuses_bad_files() {
        assert!(matches!(
            Snapshot::parse(&[0u8; 16]),
            Err(AccountingError::Truncated { len: 16, .. })
        ));
        assert_eq!(
            Snapshot::parse(&vec![0u8; FILE_BYTES]),
            Err(AccountingError::BadMagic)
        );
        let mut b = sample().to_bytes();
        b[8..16].copy_from_slice(&2u64.to_ne_bytes());
        assert_eq!(
            Snapshot::parse(&b),
            Err(AccountingError::UnsupportedVersion(2))
        );
        let b = sample().to_bytes();
        assert!(matches!(
            Snapshot::parse(&b[..FILE_BYTES - 8]),
            Err(AccountingError::Truncated { .. })
        ));
        let mut b = sample().to_bytes();
        b[header::SLOT_WORDS * 8..header::SLOT_WORDS * 8 + 8].copy_from_slice(&1u64.to_ne_bytes());
        assert!(matches!(
            Snapshot::parse(&b),
            Err(AccountingError::BadHeader {
                field: "slot_words",
                ..
            })
        ));
    }

    /// The file is the container's to write: totals saturate instead of overflowing.
    #[test]
    fn totals_saturate() {
        let mut s = sample();
        s.processes[0].used[0] = u64::MAX;
        s.processes[0].launches = u64::MAX;
        let back = Snapshot::parse(&s.to_bytes()).unwrap();
        assert_eq!(back.used(0), u64::MAX);
        assert_eq!(back.launches(), u64::MAX);
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the reader.
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)) {
            let _ = Snapshot::parse(&bytes);
        }

        /// A valid file with corrupted words (header included) never panics the reader, and any
        /// truncation is an error, not a short read.
        #[test]
        fn corrupted_or_truncated_files_are_errors_not_crashes(
            edits in proptest::collection::vec((0..FILE_WORDS, proptest::num::u64::ANY), 0..16),
            cut in 0..FILE_BYTES,
        ) {
            let mut b = sample().to_bytes();
            for (i, v) in &edits {
                b[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
            }
            if let Ok(s) = Snapshot::parse(&b) {
                let _ = (s.launches(), s.oom_refusals(), s.throttled_ns(), s.used(0));
            }
            let whole = sample().to_bytes();
            proptest::prop_assert!(Snapshot::parse(&whole[..cut]).is_err());
        }
    }
}
