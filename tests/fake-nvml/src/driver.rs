//! The link to the fake CUDA driver (`tests/fake-cuda`), for processes that load both doubles.
//!
//! On a real node NVML and the CUDA driver describe the same GPUs: NVML's memory in use and its
//! utilization are what the kernel driver sees CUDA programs do. When the fake driver is loaded in
//! the calling process (a test program under the runtime hook), this module reads its test hooks,
//! found with `dlsym(RTLD_DEFAULT)`, so NVML's answers follow what the program allocated and
//! launched. In a process without it (the device plugin), [`Driver::find`] gives `None` and the
//! configured values stand.

use std::ffi::{c_int, c_void, CStr};

type Query = unsafe extern "C" fn(c_int, *mut u64) -> c_int;

/// The fake driver's per-device test hooks.
#[derive(Clone, Copy)]
pub struct Driver {
    used: Query,
    busy: Query,
    contexts: Query,
}

fn lookup(name: &CStr) -> Option<Query> {
    // SAFETY: looking up a constant, NUL-terminated name in the global scope.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: the fake driver exports these hooks with this signature (tests/fake-cuda).
    Some(unsafe { std::mem::transmute::<*mut c_void, Query>(p) })
}

impl Driver {
    /// The fake driver of this process, if it has one.
    pub fn find() -> Option<Driver> {
        Some(Driver {
            used: lookup(c"fakeCudaGetDeviceUsed")?,
            busy: lookup(c"fakeCudaGetBusyNs")?,
            contexts: lookup(c"fakeCudaGetContextCount")?,
        })
    }

    fn query(f: Query, dev: usize) -> u64 {
        let mut v = 0u64;
        // SAFETY: a valid out pointer; the hook checks the device index.
        if unsafe { f(dev as c_int, &mut v) } == 0 {
            v
        } else {
            0
        }
    }

    /// Bytes the program holds on device `dev`.
    pub fn used(&self, dev: usize) -> u64 {
        Self::query(self.used, dev)
    }

    /// Nanoseconds device `dev` has spent running the program's kernels.
    pub fn busy_ns(&self, dev: usize) -> u64 {
        Self::query(self.busy, dev)
    }

    /// Whether the program has a context on device `dev` (NVML then lists it as a compute process).
    pub fn has_context(&self, dev: usize) -> bool {
        Self::query(self.contexts, dev) > 0
    }
}

/// The fake driver's devices, as it reads them: `FAKE_CUDA_DEVICE_MEMORY`, comma-separated totals
/// with the hook's units (`16g,8g`), one 16 GiB device when unset. `None` for a value the fake
/// driver refuses too.
pub fn device_totals() -> Option<Vec<u64>> {
    let spec = std::env::var("FAKE_CUDA_DEVICE_MEMORY").unwrap_or_else(|_| "16g".into());
    spec.split(',')
        .map(|v| vgpu_core::env::parse_memory_bytes(v).ok())
        .collect()
}

/// The CUDA version the fake driver reports (`FAKE_CUDA_DRIVER_VERSION`, default 12090: the same
/// setting and default as tests/fake-cuda).
pub fn cuda_version() -> c_int {
    std::env::var("FAKE_CUDA_DRIVER_VERSION")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(12090)
}

/// Shortest sample period: NVML's utilization is "percent of time over the past sample period", a
/// period between 1/6 s and 1 s on real GPUs; the fake uses the time since the previous sample, but
/// at least this long (a query sooner returns the previous value).
const MIN_SAMPLE_NS: u64 = 40_000_000;

/// One device's last utilization sample from the driver's busy time.
#[derive(Default)]
pub struct Sample {
    at_ns: u64,
    busy_ns: u64,
    percent: u32,
}

impl Sample {
    /// Percent of the time since the previous sample that the device was busy; the previous
    /// value when that was less than `MIN_SAMPLE_NS` ago.
    pub fn update(&mut self, now_ns: u64, busy_ns: u64) -> u32 {
        let dt = now_ns.saturating_sub(self.at_ns);
        if dt >= MIN_SAMPLE_NS {
            self.percent = (busy_ns.saturating_sub(self.busy_ns).saturating_mul(100) / dt.max(1))
                .min(100) as u32;
            self.at_ns = now_ns;
            self.busy_ns = busy_ns;
        }
        self.percent
    }
}
