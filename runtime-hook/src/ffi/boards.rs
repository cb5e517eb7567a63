//! The GPU activity files this process's devices share with the other containers on them (task
//! priority, whether a GPU is shared), and the pause a busy high-priority container puts on
//! launches.

use super::*;

/// Limit indexes (bit `i`) of the devices where a busy high-priority container pauses this
/// low-priority process's launches; set by the watcher every period.
pub(super) static PAUSED: AtomicU64 = AtomicU64::new(0);
/// When the watcher last set [`PAUSED`] (`monotonic_ms`): a pause older than [`PAUSE_STALE_MS`]
/// is ignored, so a watcher that stopped (stuck in NVML, say) never holds launches back.
pub(super) static PAUSED_AT: AtomicU64 = AtomicU64::new(0);
/// See [`PAUSED_AT`].
pub(super) const PAUSE_STALE_MS: u64 = 1000;
/// Limit indexes (bit `i`) of the devices with an activity file this process launched on since
/// the watcher's last period.
pub(super) static LAUNCHED: AtomicU64 = AtomicU64::new(0);

/// How often a paused launch looks whether it may go.
pub(super) const PAUSE_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// The GPU activity files of this process's devices (`<library dir>/gpus/<limit index>`, mounted
/// by the device plugin), with its slot in each and the token it claims them with.
pub(super) struct Boards {
    /// (limit index, board).
    pub(super) boards: Vec<(usize, Board<'static>)>,
    /// The limit index of the only board, when there is exactly one (launches then need not ask
    /// the driver for their device).
    pub(super) only: Option<usize>,
    /// This process's slot in each board, [`SLOT_UNCLAIMED`] = none.
    pub(super) slots: Vec<AtomicUsize>,
    /// Non-zero, fresh in every process (a forked child draws its own).
    pub(super) token: AtomicU32,
    /// The container's key: the identity of its accounting file.
    pub(super) key: u64,
}

impl Boards {
    /// Maps the activity files that exist; one line on stderr for one that cannot be used (the
    /// device then has no priority, and the `default` core policy throttles as `force`).
    pub(super) fn open(dir: Option<std::path::PathBuf>, cache: &std::path::Path) -> Boards {
        let mut boards = Vec::new();
        for i in 0..MAX_DEVICES {
            let Some(path) = dir.as_ref().map(|d| d.join("gpus").join(i.to_string())) else {
                break;
            };
            // The device plugin mounts one per device, 0.. in order: the first missing ends the
            // list (a process outside Kubernetes looks once, not 16 times).
            if std::fs::symlink_metadata(&path).is_err() {
                break;
            }
            let words = map_existing(&path, vgpu_core::activity::FILE_WORDS);
            match words.map(|w| Board::new(w).ok_or("it has another layout".to_string())) {
                Ok(Ok(b)) => boards.push((i, b)),
                Ok(Err(e)) | Err(e) => eprintln!(
                    "vgpu: GPU activity file {}: {e}; task priority is off on device {i}",
                    path.display()
                ),
            }
        }
        use std::os::unix::fs::MetadataExt;
        let key = std::fs::metadata(cache)
            .map(|m| m.dev().wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ m.ino())
            .unwrap_or(1)
            .max(1);
        Boards {
            slots: boards
                .iter()
                .map(|_| AtomicUsize::new(SLOT_UNCLAIMED))
                .collect(),
            only: match boards.as_slice() {
                [(d, _)] => Some(*d),
                _ => None,
            },
            boards,
            token: AtomicU32::new(random_token()),
            key,
        }
    }

    /// One watcher period: beats (claiming a slot where it has none), recording a launch on the
    /// devices of `launched` (bit per limit index), and returns the limit indexes where a
    /// high-priority container is busy and where another container launches.
    pub(super) fn tick(&self, priority: u8, now_ms: u64, launched: u64) -> (u64, u64) {
        let token = self.token.load(Ordering::Relaxed);
        let (mut paused, mut shared) = (0u64, 0u64);
        for ((i, b), slot) in self.boards.iter().zip(&self.slots) {
            let launched = launched & (1 << i) != 0;
            let mut s = slot.load(Ordering::Relaxed);
            if s == SLOT_UNCLAIMED || !b.beat(s, token, now_ms, launched) {
                s = b
                    .claim(token, self.key, priority, now_ms)
                    .unwrap_or(SLOT_UNCLAIMED);
                if s != SLOT_UNCLAIMED {
                    b.beat(s, token, now_ms, launched);
                }
                slot.store(s, Ordering::Relaxed);
            }
            let me = (s != SLOT_UNCLAIMED).then_some(s);
            if priority > 0 && b.high_priority_busy(me, now_ms) {
                paused |= 1 << i;
            }
            if b.shared(self.key, now_ms) {
                shared |= 1 << i;
            }
        }
        (paused, shared)
    }

    /// Whether device `d` has an activity file (without one, it counts as shared).
    pub(super) fn has(&self, d: usize) -> bool {
        self.boards.iter().any(|(i, _)| *i == d)
    }

    /// Gives the slots back (a normal exit), so the others need not wait for them to expire.
    pub(super) fn release(&self) {
        let token = self.token.load(Ordering::Relaxed);
        for ((_, b), slot) in self.boards.iter().zip(&self.slots) {
            let s = slot.swap(SLOT_UNCLAIMED, Ordering::Relaxed);
            if s != SLOT_UNCLAIMED {
                b.release(s, token);
            }
        }
    }

    /// A forked child: no slots, its own token.
    pub(super) fn forget(&self) {
        for slot in &self.slots {
            slot.store(SLOT_UNCLAIMED, Ordering::Relaxed);
        }
        self.token.store(random_token(), Ordering::Relaxed);
    }
}

/// A random non-zero claim token.
pub(super) fn random_token() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: getrandom fills at most the 4 bytes of the buffer it is given.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    let t = if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        std::process::id() ^ (monotonic_ms() as u32).rotate_left(16)
    };
    t.max(1)
}
