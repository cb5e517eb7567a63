//! The process's hook: its configuration, accounting slot, live allocations and launch meters,
//! made by the first call, and what every export asks of it (reserve, free, launch, current
//! device).

use super::*;

/// Core-limit state: one bucket per device, the limits, and whether this process's watcher runs.
pub(super) struct Throttle {
    pub(super) limits: [u32; MAX_DEVICES],
    pub(super) buckets: [Bucket; MAX_DEVICES],
    /// Per limited device, the pids NVML listed as its compute processes when the hook started
    /// (before this process had a context); `None` where NVML could not say.
    pub(super) before: Vec<Option<Vec<u32>>>,
}

pub(super) const SINGLE_UNKNOWN: u8 = 0;
pub(super) const SINGLE_YES: u8 = 1;
pub(super) const SINGLE_NO: u8 = 2;

impl Throttle {
    /// `None` when no device has a limit below 100 %, or the core policy is `disable` (the launch
    /// path then does nothing more).
    pub(super) fn new(sm_limit: &[u32; MAX_DEVICES], policy: CorePolicy) -> Option<Throttle> {
        if policy == CorePolicy::Disable {
            return None;
        }
        let limits = sm_limit.map(|l| if l >= 100 { 0 } else { l });
        limits.iter().any(|&l| l > 0).then(|| Throttle {
            limits,
            buckets: std::array::from_fn(|_| Bucket::default()),
            before: (0..MAX_DEVICES)
                .map(|d| {
                    (limits[d] > 0)
                        .then(|| nvml_device(d).and_then(|(nv, h)| compute_pids(nv, h)))
                        .flatten()
                })
                .collect(),
        })
    }
}

/// Monotonic nanoseconds since the first call (vDSO clock read, no syscall).
pub(super) fn now_ns() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}

/// Milliseconds of `CLOCK_MONOTONIC`: the clock every container of the kernel shares, which the
/// GPU activity files are written in (vDSO, no syscall).
pub(super) fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1000 + (ts.tv_nsec as u64) / 1_000_000
}

/// Everything the hook holds for this process.
pub(super) struct Hook {
    pub(super) config: Config,
    pub(super) real: Real,
    pub(super) ledger: Ledger<'static>,
    /// Core limit; `None` when no device is limited.
    pub(super) throttle: Option<Throttle>,
    /// The GPU activity files (task priority, the `default` core policy).
    pub(super) boards: Boards,
    /// Whether the driver shows this process a single device: [`SINGLE_UNKNOWN`] until a launch or
    /// an allocation asks, then [`SINGLE_YES`] (they skip `cuCtxGetDevice`) or [`SINGLE_NO`].
    pub(super) single: AtomicU8,
    /// Limit index of CUDA ordinal 0 (the only device when `single` says so).
    pub(super) single_index: usize,
    /// Whether this process's watcher thread runs.
    pub(super) watcher: AtomicBool,
    /// When a refused allocation last reclaimed dead slots (`now_ns`, 0 = never).
    pub(super) last_reclaim: AtomicU64,
    /// This process's slot; [`SLOT_UNCLAIMED`] until claimed (and again in a forked child),
    /// [`SLOT_CLAIMING`] while one thread claims it.
    pub(super) slot: AtomicUsize,
    /// Live allocations: (kind, pointer or handle) -> (limit index, bytes). parking_lot's Mutex
    /// hands the lock to a thread that has waited 0.5 ms; std's lets a busy thread barge ahead,
    /// and with 16 threads allocating one of them could wait for seconds.
    pub(super) allocations: parking_lot::Mutex<KeyMap>,
    /// What the memory pools this process allocated from are charged (see [`crate::pools`]).
    pub(super) pools: parking_lot::Mutex<crate::pools::PoolBook>,
    /// Exported allocations, which outlive their release (see [`crate::shareable`]).
    pub(super) shareable: parking_lot::Mutex<crate::shareable::Shareable>,
    /// Charged VMM handles, which outlive their release while mapped or retained (see
    /// [`crate::handles`]).
    pub(super) handles: parking_lot::Mutex<crate::handles::Handles>,
}

/// The inode descriptor `fd` names, `None` when it is not open.
pub(super) fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: fstat into a zeroed stat buffer; a closed descriptor is an error, not a fault.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_ino)
    }
}

/// Whether descriptor `fd` still names inode `ino`.
fn still_open(fd: i32, ino: u64) -> bool {
    inode(fd) == Some(ino)
}

/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` (cuda.h `CUmemPool_attribute`): "Amount of backing
/// memory currently allocated for the mempool", a cuuint64_t.
const MEMPOOL_ATTR_RESERVED_MEM_CURRENT: c_int = 5;

pub(super) static HOOK: OnceLock<Result<Hook, CUresult>> = OnceLock::new();

/// [`Hook::slot`] before the process has a slot.
pub(super) const SLOT_UNCLAIMED: usize = usize::MAX;
/// [`Hook::slot`] while one thread claims the process's slot.
pub(super) const SLOT_CLAIMING: usize = usize::MAX - 1;

thread_local! {
    pub(super) static INITIALIZING: Cell<bool> = const { Cell::new(false) };
    /// The thread's launch meter (with its prepaid tokens): taken at its first launch, given
    /// back when it exits.
    pub(super) static METER: Cell<Option<&'static ThreadMeter>> = const { Cell::new(None) };
}

/// Every launching thread's meters (see [`crate::meter`]).
pub(super) static METERS: Meters = Meters::new();

/// The key whose destructor gives an exiting thread's meter back; `None` if it cannot be created
/// (the meters of exited threads are then not reused).
pub(super) fn meter_key() -> Option<libc::pthread_key_t> {
    static KEY: OnceLock<Option<libc::pthread_key_t>> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: a valid out pointer and a destructor with the C signature pthread expects.
        (unsafe { libc::pthread_key_create(&mut key, Some(release_meter)) } == 0).then_some(key)
    })
}

/// pthread key destructor, run as a thread that launched exits: its meter goes back to the table
/// (the counts stay in it), and a launch after this (another destructor's) acquires a new one.
extern "C" fn release_meter(_: *mut c_void) {
    if let Ok(Some(m)) = METER.try_with(Cell::take) {
        METERS.release(m);
    }
}

/// Copies the process's launch count (its threads' meters, summed) into its slot.
pub(super) fn flush_launches(h: &Hook) {
    if let Some(s) = h.claimed_slot() {
        h.ledger.record_launches(s, METERS.launches());
    }
}

/// At a normal exit: the last launches reach the file, so a reader sees the exact count.
extern "C" fn flush_at_exit() {
    if let Some(Ok(h)) = HOOK.get() {
        flush_launches(h);
        h.boards.release();
    }
}

/// The process's hook, initialised by the first call.
#[inline]
pub(super) fn hook() -> Result<&'static Hook, CUresult> {
    match HOOK.get() {
        Some(h) => h.as_ref().map_err(|e| *e),
        None => hook_init(),
    }
}

/// First call: reads the configuration and maps the file; a call the initialisation itself makes
/// (the driver's or the C library's calls back into our exports) is refused instead of recursing.
#[cold]
pub(super) fn hook_init() -> Result<&'static Hook, CUresult> {
    if INITIALIZING.with(Cell::get) {
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let h = HOOK.get_or_init(|| {
        INITIALIZING.with(|c| c.set(true));
        let r = init();
        INITIALIZING.with(|c| c.set(false));
        r
    });
    h.as_ref().map_err(|e| *e)
}

pub(super) fn init() -> Result<Hook, CUresult> {
    let limits = library_dir().map(|d| d.join(vgpu_core::limits_file::FILE_NAME));
    let (config, source) = crate::config::load(|k| std::env::var(k).ok(), limits.as_deref())
        .map_err(|e| {
            eprintln!("{e}");
            CUDA_ERROR_INVALID_VALUE
        })?;
    if let crate::config::Source::LimitsFile { overridden } = &source {
        if !overridden.is_empty() {
            eprintln!(
                "vgpu: ignoring {} from the environment: the device plugin's limits file decides",
                overridden.join(" ")
            );
        }
    }
    let Some(dlsym) = real_dlsym() else {
        eprintln!("vgpu: cannot find the C library's dlsym; refusing CUDA");
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    };
    // SAFETY: dlopen with a constant name.
    let handle =
        unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if handle.is_null() {
        eprintln!("vgpu: libcuda.so.1 (the NVIDIA driver) cannot be loaded; CUDA is not available");
        return Err(CUDA_ERROR_NOT_INITIALIZED);
    }
    let real = Real::load(handle, dlsym);
    let words = map_file(&config.cache_path).map_err(|e| {
        eprintln!(
            "vgpu: accounting file {}: {e}; refusing CUDA",
            config.cache_path.display()
        );
        CUDA_ERROR_NOT_INITIALIZED
    })?;
    let ledger = Ledger::init(words, &config.memory_limit, &config.sm_limit).map_err(|e| {
        eprintln!("{e}");
        CUDA_ERROR_NOT_INITIALIZED
    })?;
    // SAFETY: registering plain function pointers that only touch atomics and this thread's state.
    unsafe {
        libc::pthread_atfork(None, None, Some(after_fork_child));
        libc::atexit(flush_at_exit);
    }
    Ok(Hook {
        throttle: Throttle::new(&config.sm_limit, config.core_policy),
        boards: Boards::open(library_dir(), &config.cache_path),
        single: AtomicU8::new(SINGLE_UNKNOWN),
        single_index: config.limit_index(0),
        watcher: AtomicBool::new(false),
        last_reclaim: AtomicU64::new(0),
        config,
        real,
        ledger,
        slot: AtomicUsize::new(SLOT_UNCLAIMED),
        allocations: parking_lot::Mutex::new(KeyMap::default()),
        pools: parking_lot::Mutex::new(crate::pools::PoolBook::default()),
        shareable: parking_lot::Mutex::new(crate::shareable::Shareable::default()),
        handles: parking_lot::Mutex::new(crate::handles::Handles::default()),
    })
}

/// The directory this library was loaded from (`/usr/local/vgpu` in a container), where the device
/// plugin mounts the limits file. Found with dladdr on one of our own functions, so no variable the
/// tenant controls can point it elsewhere.
pub(super) fn library_dir() -> Option<std::path::PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr only writes `info`; the address is a function of this library.
    let found = unsafe { libc::dladdr(library_dir as *const libc::c_void, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated string owned by the dynamic loader.
    let name = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    use std::os::unix::ffi::OsStrExt;
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
    path.parent().map(std::path::Path::to_path_buf)
}

/// The child of fork() starts with clean per-process state: its own slot, claimed on first use.
/// Allocations the parent made are the parent's (CUDA state does not survive fork).
extern "C" fn after_fork_child() {
    if let Some(Ok(h)) = HOOK.get() {
        h.slot.store(SLOT_UNCLAIMED, Ordering::SeqCst);
        // The watcher thread does not exist in the child; claiming the slot starts one.
        h.watcher.store(false, Ordering::SeqCst);
        // The parent's launches are the parent's; the forking thread takes a new meter (and so
        // claims the child's slot) at its next launch.
        METERS.reset();
        let _ = METER.try_with(|m| m.set(None));
        h.boards.forget();
        PAUSED.store(0, Ordering::SeqCst);
        LAUNCHED.store(0, Ordering::SeqCst);
        FORKED.fetch_add(1, Ordering::SeqCst);
    }
}

pub(super) static FORKED: AtomicU64 = AtomicU64::new(0);

impl Hook {
    /// The process's slot, claimed by its first caller. Exactly one thread claims: threads that
    /// launch for the first time together would otherwise each claim a slot for the same pid (a
    /// race seen in CI: 3 slots for one process, its launches split among them), or the second
    /// would find the first's slot by pid and clear it as a reused pid's.
    pub(super) fn slot(&'static self) -> Result<usize, CUresult> {
        // The common case reads only: a compare-exchange would take the cache line exclusively
        // on every allocation of every thread.
        if let Some(s) = self.claimed_slot() {
            return Ok(s);
        }
        loop {
            match self.slot.compare_exchange(
                SLOT_UNCLAIMED,
                SLOT_CLAIMING,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return self.claim_slot(),
                // Another thread claims: a scan of the slot table (and at worst one liveness
                // check of each dead owner), so yielding until it is done waits microseconds.
                // A fork meanwhile resets the child's state to unclaimed (after_fork_child).
                Err(SLOT_CLAIMING) => std::thread::yield_now(),
                Err(s) => return Ok(s),
            }
        }
    }

    /// The claim itself, by the one thread that moved the state to [`SLOT_CLAIMING`].
    #[cold]
    pub(super) fn claim_slot(&'static self) -> Result<usize, CUresult> {
        /// Should the claim unwind (the entry point catches it), waiters must not yield forever.
        struct Unclaimed<'a>(&'a AtomicUsize);
        impl Drop for Unclaimed<'_> {
            fn drop(&mut self) {
                let _ = self.0.compare_exchange(
                    SLOT_CLAIMING,
                    SLOT_UNCLAIMED,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
        let _unclaimed = Unclaimed(&self.slot);
        match self.ledger.claim(std::process::id(), &alive) {
            Some(s) => {
                self.slot.store(s, Ordering::SeqCst);
                if !self.watcher.swap(true, Ordering::SeqCst) {
                    let spawned = std::thread::Builder::new()
                        .name("vgpu-watcher".into())
                        .spawn(move || watch(self));
                    if spawned.is_err() {
                        eprintln!("vgpu: cannot start the watcher thread; CUDA_DEVICE_SM_LIMIT is not enforced and dead processes are reclaimed only when memory runs out");
                    }
                }
                Ok(s)
            }
            None => {
                // Unclaimed again (by the guard): a later call tries again, as a dead process
                // may free a slot.
                eprintln!("vgpu: no free process slot in the accounting file; refusing allocation");
                Err(CUDA_ERROR_OUT_OF_MEMORY)
            }
        }
    }

    /// The process's slot when it has one (not while it is being claimed).
    pub(super) fn claimed_slot(&self) -> Option<usize> {
        let s = self.slot.load(Ordering::SeqCst);
        (s < SLOT_CLAIMING).then_some(s)
    }

    /// Limit index of the calling thread's current device.
    pub(super) fn device(&self) -> Result<usize, CUresult> {
        let f = self.real.cuCtxGetDevice.ok_or(CUDA_ERROR_NOT_FOUND)?;
        let mut d: c_int = 0;
        // SAFETY: passing a valid out pointer to the driver.
        let r = unsafe { f(&mut d) };
        if r != CUDA_SUCCESS {
            return Err(r);
        }
        Ok(self.config.limit_index(d.max(0) as usize))
    }

    /// Reserves `bytes` on `dev`, refusing over the limit; dead processes' memory is reclaimed once
    /// before a refusal.
    pub(super) fn reserve(&'static self, dev: usize, bytes: u64) -> Result<usize, CUresult> {
        let slot = self.slot()?;
        let limit = self.config.memory_limit.get(dev).copied().flatten();
        if !self.ledger.reserve(slot, dev, bytes, limit)
            && (!self.reclaim_now() || !self.ledger.reserve(slot, dev, bytes, limit))
            && (!self.settle() || !self.ledger.reserve(slot, dev, bytes, limit))
        {
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        Ok(slot)
    }

    /// Credits the memory the driver gave back since the hook last asked: pools' reserves
    /// ([`Hook::settle_pools`]) and released exported allocations whose descriptors are closed
    /// now. Whether anything was credited.
    pub(super) fn settle(&'static self) -> bool {
        let pools = self.settle_pools();
        let closed = self.shareable.lock().closed(still_open);
        if let (false, Ok(slot)) = (closed.is_empty(), self.slot()) {
            for (dev, bytes) in &closed {
                self.ledger.release(slot, *dev, *bytes);
            }
        }
        pools || !closed.is_empty()
    }

    /// The memory of `handle` is no longer held by a reference or a mapping
    /// ([`crate::handles`]): its charge ends, unless a descriptor exported for it keeps the memory
    /// alive ([`crate::shareable`]).
    pub(super) fn release_handle(&'static self, handle: u64) {
        let entry = self.allocations.lock().remove(&(Kind::Handle, handle));
        let Some((dev, bytes)) = entry else {
            return;
        };
        if self
            .shareable
            .lock()
            .released(handle, dev, bytes, still_open)
        {
            return;
        }
        if let Ok(slot) = self.slot() {
            self.ledger.release(slot, dev, bytes);
        }
    }

    /// Lowers the charge of every pool charged for more than it uses to what the driver reserves
    /// for it now (memory a synchronisation or a trim gave back); whether anything was credited.
    pub(super) fn settle_pools(&'static self) -> bool {
        let (Some(get), Ok(slot)) = (self.real.cuMemPoolGetAttribute, self.slot()) else {
            return false;
        };
        let pools = self.pools.lock().settleable();
        let mut credited = false;
        for pool in pools {
            let mut reserved: u64 = 0;
            // SAFETY: a pool this process allocated from, an attribute that is a cuuint64_t, and
            // a valid out pointer to one.
            let r = unsafe {
                get(
                    pool as *mut c_void,
                    MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                    (&mut reserved as *mut u64).cast(),
                )
            };
            if r != CUDA_SUCCESS {
                continue;
            }
            if let Some((dev, credit)) = self.pools.lock().settle(pool, reserved) {
                self.ledger.release(slot, dev, credit);
                credited = true;
            }
        }
        credited
    }

    /// The current context's device's current memory pool (where `cuMemAllocAsync` allocates);
    /// 0 stands for it when the driver cannot say (one pool per process is then assumed, which
    /// charges at least as much).
    pub(super) fn current_pool(&self) -> u64 {
        let (Some(ctx_device), Some(get_pool)) =
            (self.real.cuCtxGetDevice, self.real.cuDeviceGetMemPool)
        else {
            return 0;
        };
        let mut ordinal: c_int = 0;
        let mut pool: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid out pointers; the ordinal is the driver's own answer.
        let ok = unsafe {
            ctx_device(&mut ordinal) == CUDA_SUCCESS && get_pool(&mut pool, ordinal) == CUDA_SUCCESS
        };
        if ok {
            pool as u64
        } else {
            0
        }
    }

    /// A stream-ordered allocation of `bytes` from `pool` on `dev`: charges the growth of the
    /// pool's reserve ([`crate::pools::PoolBook::growth`]) first, runs the driver's `call`, and
    /// records it or rolls the charge back.
    pub(super) fn allocate_pooled(
        &'static self,
        dev: Result<usize, CUresult>,
        pool: u64,
        bytes: u64,
        call: impl FnOnce() -> Result<u64, CUresult>,
    ) -> CUresult {
        let dev = try_cu!(dev);
        let growth = self.pools.lock().growth(pool, bytes);
        let slot = try_cu!(if growth > 0 {
            self.reserve(dev, growth)
        } else {
            self.slot()
        });
        match call() {
            Ok(ptr) => {
                self.pools.lock().allocated(pool, dev, ptr, bytes, growth);
                CUDA_SUCCESS
            }
            Err(r) => {
                if growth > 0 {
                    self.ledger.release(slot, dev, growth);
                }
                r
            }
        }
    }

    /// On a refusal: reclaims dead processes' slots, at most once per 10 ms per process (a program
    /// probing the limit in a loop would otherwise check every slot owner's liveness per refusal;
    /// the watcher reclaims every 500 ms anyway). Whether something was reclaimed.
    pub(super) fn reclaim_now(&self) -> bool {
        const EVERY_NS: u64 = 10_000_000;
        let now = now_ns().max(1);
        let last = self.last_reclaim.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < EVERY_NS {
            return false;
        }
        self.last_reclaim
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
            && self.ledger.reclaim_dead(std::process::id(), &alive) > 0
    }

    pub(super) fn remember(&self, kind: Kind, key: u64, dev: usize, bytes: u64) {
        self.allocations.lock().insert((kind, key), (dev, bytes));
    }

    /// Reserves `bytes` on `dev`, runs the driver allocation `call` (which returns the new pointer or
    /// handle), and commits or rolls back.
    pub(super) fn allocate(
        &'static self,
        dev: Result<usize, CUresult>,
        bytes: u64,
        kind: Kind,
        call: impl FnOnce() -> Result<u64, CUresult>,
    ) -> CUresult {
        let dev = try_cu!(dev);
        let slot = try_cu!(self.reserve(dev, bytes));
        match call() {
            Ok(key) => {
                self.remember(kind, key, dev, bytes);
                CUDA_SUCCESS
            }
            Err(r) => {
                self.ledger.release(slot, dev, bytes);
                r
            }
        }
    }

    pub(super) fn free(
        &'static self,
        kind: Kind,
        key: u64,
        call: impl FnOnce() -> CUresult,
    ) -> CUresult {
        let r = call();
        if r == CUDA_SUCCESS {
            let entry = self.allocations.lock().remove(&(kind, key));
            match (entry, self.slot()) {
                (Some((dev, bytes)), Ok(slot)) => self.ledger.release(slot, dev, bytes),
                // A pool allocation: its memory goes back to its pool, which stays charged.
                (None, _) if kind == Kind::Ptr => {
                    self.pools.lock().freed(key);
                }
                _ => {}
            }
        }
        r
    }

    /// Limit index of CUDA device ordinal `ordinal`.
    pub(super) fn device_of(&self, ordinal: c_int) -> Result<usize, CUresult> {
        if ordinal < 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(self.config.limit_index(ordinal as usize))
    }

    /// Meters a kernel launch of `blocks` thread blocks, first waiting for the core limit's tokens.
    /// No atomic read-modify-write and no syscall while the thread's prepaid tokens last: the
    /// counts go to the thread's own meter, the tokens come from its own pool.
    #[inline]
    pub(super) fn launch(&'static self, blocks: u64, call: impl FnOnce() -> CUresult) -> CUresult {
        let m = match METER.with(Cell::get) {
            Some(m) => m,
            None => self.register(),
        };
        if !self.boards.boards.is_empty() {
            self.mark_launched();
        }
        if PAUSED.load(Ordering::Relaxed) != 0 {
            self.wait_while_paused();
        }
        if let Some(t) = &self.throttle {
            self.throttle_launch(t, m, blocks);
        }
        let r = call();
        if r == CUDA_SUCCESS {
            m.launched();
        }
        r
    }

    /// Notes a launch on the calling thread's device for the watcher's next beat (one load when
    /// the bit is already set, as it is for all but the first launch of a period).
    #[inline]
    pub(super) fn mark_launched(&self) {
        let d = match self.boards.only {
            Some(d) => d,
            None => match self.current_device() {
                Ok(d) => d,
                Err(_) => return,
            },
        };
        let bit = 1u64.checked_shl(d as u32).unwrap_or(0);
        if LAUNCHED.load(Ordering::Relaxed) & bit != bit {
            LAUNCHED.fetch_or(bit, Ordering::Relaxed);
        }
    }

    /// A low-priority launch on a device where a high-priority container is busy: waits until
    /// the watcher sees that container idle (or gone), or stops refreshing the pause, and meters
    /// the wait as throttled time.
    #[cold]
    pub(super) fn wait_while_paused(&'static self) {
        let Ok(d) = self.current_device() else {
            return;
        };
        let started = now_ns();
        let mut waited = false;
        while d < 64
            && PAUSED.load(Ordering::Relaxed) & (1 << d) != 0
            && monotonic_ms().saturating_sub(PAUSED_AT.load(Ordering::Relaxed)) <= PAUSE_STALE_MS
        {
            std::thread::sleep(PAUSE_POLL);
            waited = true;
        }
        // Only a launch that waited is metered (another device's pause brings every launch here).
        if waited {
            if let Ok(s) = self.slot() {
                self.ledger.throttled(s, now_ns().saturating_sub(started));
            }
        }
    }

    /// A thread's first launch: takes a meter and claims the process's slot, which starts the
    /// watcher that copies the meters into the file.
    #[cold]
    pub(super) fn register(&'static self) -> &'static ThreadMeter {
        let m = METERS.acquire();
        METER.with(|c| c.set(Some(m)));
        if let Some(key) = meter_key() {
            // SAFETY: any non-null value makes the key's destructor run at thread exit; it is never
            // dereferenced.
            unsafe {
                libc::pthread_setspecific(key, std::ptr::NonNull::<c_void>::dangling().as_ptr())
            };
        }
        let _ = self.slot();
        m
    }

    /// Counts the launch's blocks and takes its tokens from the thread's pool for its device,
    /// sleeping (bounded) when the bucket has none. The fast path, while prepaid tokens last, is
    /// plain thread-local arithmetic (and, in a process that sees more than one device, the
    /// driver's `cuCtxGetDevice`); only the launch that finds the pool empty reads the clock, buys
    /// the next batch and may sleep.
    #[inline(always)]
    pub(super) fn throttle_launch(
        &'static self,
        t: &'static Throttle,
        m: &ThreadMeter,
        blocks: u64,
    ) {
        let Some(d) = self.launch_device(t) else {
            return;
        };
        let (Some(bucket), Some(pool)) = (t.buckets.get(d), m.pool(d)) else {
            return;
        };
        m.blocks(d, blocks);
        if !pool.try_take(bucket, blocks, m.shared()) {
            self.refill(pool, bucket, blocks, m.shared());
        }
    }

    /// The slow path of [`Hook::throttle_launch`]: buys a batch of tokens, waits what the bucket
    /// says and meters the wait.
    #[cold]
    pub(super) fn refill(&'static self, pool: &Pool, bucket: &Bucket, blocks: u64, shared: bool) {
        let wait = pool.refill(bucket, now_ns(), blocks, shared);
        if wait > 0 {
            std::thread::sleep(std::time::Duration::from_nanos(wait));
            if let Ok(s) = self.slot() {
                self.ledger.throttled(s, wait);
            }
        }
    }

    /// Limit index of the launching thread's device when it has a core limit.
    #[inline]
    pub(super) fn launch_device(&self, t: &Throttle) -> Option<usize> {
        let d = self.current_device().ok()?;
        (d < MAX_DEVICES && t.limits[d] > 0).then_some(d)
    }

    /// Limit index of the calling thread's current device. A process whose driver shows a single
    /// device (the usual vGPU container) learns it once from `cuDeviceGetCount`; otherwise every
    /// call asks the driver for the current device (`cuCtxGetDevice`). With no current context the
    /// single-device answer still names the device: the driver call that follows fails, and an
    /// allocation's reservation is rolled back.
    #[inline]
    pub(super) fn current_device(&self) -> Result<usize, CUresult> {
        if self.single.load(Ordering::Relaxed) == SINGLE_YES {
            Ok(self.single_index)
        } else {
            self.current_device_asked()
        }
    }

    /// [`Hook::current_device`] when the process is not known to see a single device.
    #[cold]
    pub(super) fn current_device_asked(&self) -> Result<usize, CUresult> {
        if self.single.load(Ordering::Relaxed) != SINGLE_NO {
            match self.device_count() {
                Some(1) => {
                    self.single.store(SINGLE_YES, Ordering::Relaxed);
                    return Ok(self.single_index);
                }
                Some(_) => self.single.store(SINGLE_NO, Ordering::Relaxed),
                None => {}
            }
        }
        self.device()
    }

    /// Devices the driver shows this process (`cuDeviceGetCount`), `None` when it cannot say.
    pub(super) fn device_count(&self) -> Option<c_int> {
        let f = self.real.cuDeviceGetCount?;
        let mut n: c_int = 0;
        // SAFETY: a valid out pointer.
        (unsafe { f(&mut n) } == CUDA_SUCCESS).then_some(n)
    }

    /// `free`/`total` as the container sees them on limit index `dev`: total = limit,
    /// free = limit - container usage, never above the driver's free. Memory the driver gave back
    /// since the hook last asked ([`Hook::settle`]) counts as free.
    pub(super) fn clamp_info(&'static self, dev: usize, free: u64, total: u64) -> (u64, u64) {
        self.settle();
        match self.config.memory_limit.get(dev).copied().flatten() {
            Some(limit) => {
                let used = if dev < MAX_DEVICES {
                    self.ledger.container_used(dev)
                } else {
                    0
                };
                (free.min(limit.saturating_sub(used)), total.min(limit))
            }
            None => (free, total),
        }
    }
}
