//! Test double of `libnvidia-ml.so.1`, shared by every test: the subset of the NVML C ABI that
//! nvml-wrapper calls for the device plugin (discovery, utilization, critical-XID events) and the
//! calls the runtime hook makes or intercepts (memory info, device and process utilization, compute
//! processes). Tests point the plugin's `--nvml-lib` at the built `libfake_nvml.so`, and install it
//! as `libnvidia-ml.so.1` next to the fake driver for programs under the hook, so both go through
//! the same `dlopen`/link path as with the real library.
//!
//! Configuration: `FAKE_NVML_CONFIG`, read at `nvmlInit_v2`, is a path to a JSON file or inline JSON
//! (every field optional; a value that does not parse makes `nvmlInit_v2` fail with
//! `NVML_ERROR_UNKNOWN`):
//!
//! ```json
//! {"driverVersion": "550.54.15",
//!  "gpus": [{"uuid": "GPU-…", "name": "NVIDIA A100-SXM4-80GB", "memoryMib": 81920, "usedMib": 0,
//!            "busId": "00000000:3B:00.0", "numa": 0, "mig": false, "utilization": [10, 20, 30],
//!            "nvlinks": [1, 1, 2]}],
//!  "xidEvents": [{"afterMs": 200, "gpu": 0, "xid": 79}],
//!  "eventsFile": "events.txt",
//!  "faults": [{"function": "nvmlDeviceGetMemoryInfo_v2", "error": "GPU_IS_LOST", "count": 3, "gpu": 0}],
//!  "faultsFile": "faults.txt",
//!  "logFile": "nvml.log",
//!  "pidOffset": 100000, "otherTenantUtilization": 40, "processUtilization": true}
//! ```
//!
//! - `gpus` absent (or no `FAKE_NVML_CONFIG` at all): the GPUs of the fake CUDA driver
//!   (`FAKE_CUDA_DEVICE_MEMORY`, as `tests/fake-cuda` reads it), named `GPU-fake-<index>`, as NVML
//!   describes the GPUs the kernel driver runs.
//! - When the fake driver is loaded in the same process (see [`driver`]), memory in use, device
//!   utilization and the compute-process list follow what the program allocated and launched
//!   (utilization is the share of the sample period the fake GPU was busy, so it is proportional
//!   to the launch rate); elsewhere `usedMib` and the `utilization` series stand, and no process
//!   runs.
//! - `utilization` is a series: each `nvmlDeviceGetUtilizationRates` returns the next value, cycling.
//! - `pidOffset`: the calling process is reported as pid `getpid() + pidOffset`. NVML reports the pids
//!   of the host's pid namespace, so inside a container its own process has another number.
//! - `otherTenantUtilization` N: another tenant's process ([`OTHER_PID`]) keeps each GPU N % busy: it
//!   is one of the device's compute processes, has its own process-utilization sample, and adds N to
//!   the device's utilization (capped at 100), as a shared GPU shows everyone's kernels.
//! - `processUtilization: false`: `nvmlDeviceGetProcessUtilization` returns
//!   `NVML_ERROR_NOT_SUPPORTED`, as on GPUs without per-process accounting.
//! - `numa` absent: `nvmlDeviceGetNumaNodeId` returns `NVML_ERROR_NOT_SUPPORTED`, as on single-socket
//!   machines.
//! - `nvlinks`: the GPU's NVLinks, one entry per link, each the index of the GPU at its other end
//!   (two entries with the same peer: two links to it). Links 0.. are active, the rest up to
//!   `NVML_NVLINK_MAX_LINKS` (18) inactive; absent: the GPU has no NVLink, and the NVLink calls
//!   return `NVML_ERROR_NOT_SUPPORTED`, as on PCIe-only boards.
//! - `xidEvents` fire once each, `afterMs` after `nvmlInit_v2`.
//! - `eventsFile` is append-only: each line `<gpu index> <xid>` that a test appends is delivered once
//!   to every event set that registered that GPU, so a test can inject an XID at any moment.
//! - Error injection: each entry of `faults` makes the next `count` calls of `function` (an exported
//!   NVML name, or `*` for every function but init/shutdown) return `error` (an NVML return code name
//!   such as `GPU_IS_LOST`, `UNKNOWN`, `TIMEOUT`, with or without the `NVML_ERROR_` prefix, or its
//!   number) instead of doing their work. With `gpu`, only calls about that device count (a device
//!   handle, an index or a UUID that resolves to it); without, every matching call. `faultsFile` is
//!   append-only like `eventsFile`: each complete line `<function> <error> <count> [gpu]` adds one
//!   such entry when a call next looks at the file, so a test can start a fault at any moment.
//! - `logFile`, when set, gets one line per delivered XID (`xid <unix µs> <gpu> <xid>`) and per
//!   injected error (`fault <unix µs> <function> <code> <gpu or ->`), so a test can time the plugin
//!   from the moment NVML handed it the event, and knows when its faults were used up.
//!
//! Each function's comment names the documented NVML behaviour it copies.
//!
//! Unsafe code: this crate *is* a C ABI, so it writes through the caller's pointers after null checks;
//! each such spot carries a `SAFETY` comment.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
#![allow(missing_docs)]

pub mod driver;

use driver::{Driver, Sample};
use serde::Deserialize;
use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

type NvmlReturn = c_uint;
type NvmlDevice = *mut c_void;
type NvmlEventSet = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_NOT_FOUND: NvmlReturn = 6;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: NvmlReturn = 25;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// NVML's documented return codes (`nvmlReturn_t` in nvml.h), by name, for error injection.
const RETURN_CODES: [(&str, NvmlReturn); 30] = [
    ("SUCCESS", 0),
    ("UNINITIALIZED", 1),
    ("INVALID_ARGUMENT", 2),
    ("NOT_SUPPORTED", 3),
    ("NO_PERMISSION", 4),
    ("ALREADY_INITIALIZED", 5),
    ("NOT_FOUND", 6),
    ("INSUFFICIENT_SIZE", 7),
    ("INSUFFICIENT_POWER", 8),
    ("DRIVER_NOT_LOADED", 9),
    ("TIMEOUT", 10),
    ("IRQ_ISSUE", 11),
    ("LIBRARY_NOT_FOUND", 12),
    ("FUNCTION_NOT_FOUND", 13),
    ("CORRUPTED_INFOROM", 14),
    ("GPU_IS_LOST", 15),
    ("RESET_REQUIRED", 16),
    ("OPERATING_SYSTEM", 17),
    ("LIB_RM_VERSION_MISMATCH", 18),
    ("IN_USE", 19),
    ("MEMORY", 20),
    ("NO_DATA", 21),
    ("VGPU_ECC_NOT_SUPPORTED", 22),
    ("INSUFFICIENT_RESOURCES", 23),
    ("FREQ_NOT_SUPPORTED", 24),
    ("ARGUMENT_VERSION_MISMATCH", 25),
    ("DEPRECATED", 26),
    ("NOT_READY", 27),
    ("GPU_NOT_FOUND", 28),
    ("INVALID_STATE", 29),
];

/// A return code from its nvml.h name (`GPU_IS_LOST`, `NVML_ERROR_GPU_IS_LOST`), `UNKNOWN` (999),
/// or its number.
fn return_code(name: &str) -> Option<NvmlReturn> {
    let n = name.trim();
    let n = n
        .strip_prefix("NVML_ERROR_")
        .or_else(|| n.strip_prefix("NVML_"))
        .unwrap_or(n);
    if n == "UNKNOWN" {
        return Some(NVML_ERROR_UNKNOWN);
    }
    RETURN_CODES
        .iter()
        .find(|(k, _)| *k == n)
        .map(|(_, v)| *v)
        .or_else(|| n.parse().ok())
}

/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID_CRITICAL: c_ulonglong = 0x8;

/// Host pid of the other tenant's process (`otherTenantUtilization`).
pub const OTHER_PID: c_uint = 4_194_000;

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct GpuConfig {
    uuid: String,
    #[serde(default = "default_name")]
    name: String,
    memory_mib: u64,
    /// Exact total, for GPUs taken from the fake driver (whose totals need not be whole MiB).
    #[serde(skip)]
    memory_bytes: Option<u64>,
    #[serde(default)]
    used_mib: u64,
    #[serde(default)]
    bus_id: Option<String>,
    #[serde(default)]
    numa: Option<u32>,
    #[serde(default)]
    mig: bool,
    #[serde(default)]
    utilization: Vec<u32>,
    #[serde(default)]
    nvlinks: Option<Vec<usize>>,
}

fn default_name() -> String {
    "NVIDIA A100-SXM4-80GB".into()
}

impl GpuConfig {
    /// The GPU the fake driver calls device `index`.
    fn of_fake_driver(index: usize, total: u64) -> GpuConfig {
        GpuConfig {
            uuid: format!("GPU-fake-{index}"),
            name: default_name(),
            memory_mib: total >> 20,
            memory_bytes: Some(total),
            used_mib: 0,
            bus_id: None,
            numa: None,
            mig: false,
            utilization: Vec::new(),
            nvlinks: None,
        }
    }

    fn total(&self) -> u64 {
        self.memory_bytes.unwrap_or(self.memory_mib << 20)
    }
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct XidConfig {
    after_ms: u64,
    gpu: u32,
    xid: u64,
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct FaultConfig {
    function: String,
    error: String,
    count: u32,
    #[serde(default)]
    gpu: Option<usize>,
}

/// An injected error still to be returned `left` more times.
struct Fault {
    function: String,
    code: NvmlReturn,
    left: u32,
    gpu: Option<usize>,
}

impl Fault {
    fn from_config(f: &FaultConfig) -> Option<Fault> {
        Some(Fault {
            function: f.function.clone(),
            code: return_code(&f.error)?,
            left: f.count,
            gpu: f.gpu,
        })
    }

    /// `<function> <error> <count> [gpu]`.
    fn from_line(line: &str) -> Option<Fault> {
        let mut p = line.split_whitespace();
        let function = p.next()?.to_string();
        let code = return_code(p.next()?)?;
        let left = p.next()?.parse().ok()?;
        let gpu = match p.next() {
            Some(g) => Some(g.parse().ok()?),
            None => None,
        };
        Some(Fault {
            function,
            code,
            left,
            gpu,
        })
    }
}

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct Config {
    #[serde(default = "default_driver")]
    driver_version: String,
    /// `None`: the fake driver's devices.
    #[serde(default)]
    gpus: Option<Vec<GpuConfig>>,
    #[serde(default)]
    xid_events: Vec<XidConfig>,
    #[serde(default)]
    events_file: Option<String>,
    #[serde(default)]
    faults: Vec<FaultConfig>,
    #[serde(default)]
    faults_file: Option<String>,
    #[serde(default)]
    log_file: Option<String>,
    #[serde(default)]
    pid_offset: u32,
    #[serde(default)]
    other_tenant_utilization: u32,
    #[serde(default = "yes")]
    process_utilization: bool,
}

fn yes() -> bool {
    true
}

fn default_driver() -> String {
    "550.54.15".into()
}

struct EventSet {
    /// GPU indexes registered for critical XIDs.
    gpus: Vec<u32>,
    /// Scheduled events not yet delivered.
    scheduled: Vec<XidConfig>,
    /// Lines of the events file already delivered.
    file_lines_seen: usize,
}

struct State {
    config: Config,
    gpus: Vec<GpuConfig>,
    /// The fake CUDA driver, when this process has loaded it.
    driver: Option<Driver>,
    /// Per GPU: the last utilization sample from the driver's busy time.
    samples: Vec<Sample>,
    started: Instant,
    utilization_calls: Vec<usize>,
    /// Event sets by handle - 1; `None` once freed.
    sets: Vec<Option<EventSet>>,
    init_count: u32,
    faults: Vec<Fault>,
    /// Lines of the faults file already turned into faults.
    fault_lines_seen: usize,
}

impl State {
    /// The fake CUDA driver, looked for again until found: a program may load it (dlopen with
    /// RTLD_GLOBAL) after NVML's init.
    fn driver(&mut self) -> Option<Driver> {
        if self.driver.is_none() {
            self.driver = Driver::find();
        }
        self.driver
    }
}

fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// Appends a line to the log file, when one is configured.
fn log_line(state: &State, line: &str) {
    use std::io::Write;
    let Some(path) = &state.config.log_file else {
        return;
    };
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

/// The injected error for this call of `function` about device `gpu`, if one is due; uses it up.
/// Picks up new lines of the faults file first.
fn fault(state: &mut State, function: &str, gpu: Option<usize>) -> Option<NvmlReturn> {
    if let Some(path) = state.config.faults_file.clone() {
        if let Ok(text) = std::fs::read_to_string(path) {
            // Only complete lines: a test may be in the middle of appending one.
            let complete = text.rsplit_once('\n').map(|(head, _)| head).unwrap_or("");
            let new: Vec<Fault> = complete
                .lines()
                .skip(state.fault_lines_seen)
                .filter_map(Fault::from_line)
                .collect();
            state.fault_lines_seen = complete.lines().count();
            state.faults.extend(new);
        }
    }
    let f = state.faults.iter_mut().find(|f| {
        f.left > 0
            && (f.function == function || f.function == "*")
            && (f.gpu.is_none() || f.gpu == gpu)
    })?;
    f.left -= 1;
    let code = f.code;
    let gpu = gpu.map_or_else(|| "-".to_string(), |g| g.to_string());
    log_line(
        state,
        &format!("fault {} {function} {code} {gpu}", unix_micros()),
    );
    Some(code)
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The configuration, all defaults without `FAKE_NVML_CONFIG`; `None` when it cannot be read.
fn load_config() -> Option<Config> {
    let raw = std::env::var("FAKE_NVML_CONFIG").unwrap_or_else(|_| "{}".into());
    let text = if raw.trim_start().starts_with('{') {
        raw
    } else {
        std::fs::read_to_string(&raw).ok()?
    };
    serde_json::from_str(&text).ok()
}

/// Device handles are `index + 1` as a pointer: NVML handles are opaque and stay valid (and equal) for
/// the library's lifetime, which nvml-wrapper relies on when it builds a device from an event.
fn handle_of(index: usize) -> NvmlDevice {
    (index + 1) as NvmlDevice
}

fn index_of(state: &State, device: NvmlDevice) -> Option<usize> {
    let i = (device as usize).checked_sub(1)?;
    (i < state.gpus.len()).then_some(i)
}

/// Runs `f` on the initialised state and the GPU behind `device`; NVML returns
/// `NVML_ERROR_UNINITIALIZED` before `nvmlInit` and `NVML_ERROR_INVALID_ARGUMENT` for a bad handle.
/// An injected error for `function` on that GPU is returned instead of running `f`.
fn with_gpu(
    function: &str,
    device: NvmlDevice,
    f: impl FnOnce(&mut State, usize) -> NvmlReturn,
) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    match index_of(state, device) {
        Some(i) => match fault(state, function, Some(i)) {
            Some(code) => code,
            None => f(state, i),
        },
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}

/// Copies `s` and a NUL into a caller buffer of `len` bytes; NVML returns
/// `NVML_ERROR_INSUFFICIENT_SIZE` when the buffer is too small.
unsafe fn write_str(buf: *mut c_char, len: c_uint, s: &str) -> NvmlReturn {
    if buf.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller gave a buffer of `len` bytes, and we write at most `len`.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), buf, bytes.len());
        *buf.add(bytes.len()) = 0;
    }
    NVML_SUCCESS
}

/// `nvmlInit_v2`: initialises the library; NVML reference-counts init/shutdown pairs.
#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> NvmlReturn {
    let mut guard = lock();
    if let Some(state) = guard.as_mut() {
        state.init_count += 1;
        return NVML_SUCCESS;
    }
    let Some(config) = load_config() else {
        return NVML_ERROR_UNKNOWN;
    };
    let gpus = match &config.gpus {
        Some(g) => g.clone(),
        None => match driver::device_totals() {
            Some(t) => t
                .into_iter()
                .enumerate()
                .map(|(i, total)| GpuConfig::of_fake_driver(i, total))
                .collect(),
            None => return NVML_ERROR_UNKNOWN,
        },
    };
    let n = gpus.len();
    let faults = config
        .faults
        .iter()
        .filter_map(Fault::from_config)
        .collect();
    *guard = Some(State {
        config,
        gpus,
        driver: Driver::find(),
        samples: (0..n).map(|_| Sample::default()).collect(),
        started: Instant::now(),
        utilization_calls: vec![0; n],
        sets: Vec::new(),
        init_count: 1,
        faults,
        fault_lines_seen: 0,
    });
    NVML_SUCCESS
}

/// `nvmlInit`: the older name of `nvmlInit_v2`, which programs built against old headers call.
#[no_mangle]
pub extern "C" fn nvmlInit() -> NvmlReturn {
    nvmlInit_v2()
}

/// `nvmlInitWithFlags` (nvml.h: "nvmlInitWithFlags is a variant of nvmlInit(), that allows passing
/// a set of boolean values modifying the behaviour of nvmlInit()"): `NVML_INIT_FLAG_NO_GPUS` (1)
/// lets it succeed without GPUs, `NVML_INIT_FLAG_NO_ATTACH` (2) skips attaching; the fake always
/// has its GPUs and attaches nothing, so both change nothing. nvidia-ml-py's `nvmlInit()` calls
/// this one.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> NvmlReturn {
    nvmlInit_v2()
}

/// `nvmlShutdown`: the last shutdown of a reference-counted init releases the library.
#[no_mangle]
pub extern "C" fn nvmlShutdown() -> NvmlReturn {
    let mut guard = lock();
    match guard.as_mut() {
        None => NVML_ERROR_UNINITIALIZED,
        Some(state) => {
            state.init_count = state.init_count.saturating_sub(1);
            if state.init_count == 0 {
                *guard = None;
            }
            NVML_SUCCESS
        }
    }
}

/// `nvmlSystemGetDriverVersion`.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(buf: *mut c_char, len: c_uint) -> NvmlReturn {
    let mut guard = lock();
    match guard.as_mut() {
        Some(s) => match fault(s, "nvmlSystemGetDriverVersion", None) {
            Some(code) => code,
            // SAFETY: forwarded caller buffer.
            None => unsafe { write_str(buf, len, &s.config.driver_version) },
        },
        None => NVML_ERROR_UNINITIALIZED,
    }
}

/// `nvmlSystemGetCudaDriverVersion_v2`: "Retrieves the version of the CUDA driver from the shared
/// library" (`1000 * major + 10 * minor`): the fake driver's, `FAKE_CUDA_DRIVER_VERSION` or 12090.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) -> NvmlReturn {
    if version.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let mut guard = lock();
    let Some(s) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if let Some(code) = fault(s, "nvmlSystemGetCudaDriverVersion_v2", None) {
        return code;
    }
    // SAFETY: checked non-null.
    unsafe { *version = driver::cuda_version() };
    NVML_SUCCESS
}

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if let Some(code) = fault(state, "nvmlDeviceGetCount_v2", None) {
        return code;
    }
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *count = state.gpus.len() as c_uint };
    NVML_SUCCESS
}

/// `nvmlDeviceGetHandleByIndex_v2`: `NVML_ERROR_INVALID_ARGUMENT` for an index past the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if device.is_null() || index as usize >= state.gpus.len() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // A lost GPU fails its handle lookup too (NVML_ERROR_GPU_IS_LOST).
    if let Some(code) = fault(state, "nvmlDeviceGetHandleByIndex_v2", Some(index as usize)) {
        return code;
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *device = handle_of(index as usize) };
    NVML_SUCCESS
}

/// A handle lookup by a string key (`nvmlDeviceGetHandleByUUID`, `..ByPciBusId_v2`): the GPU
/// `find` picks, `NVML_ERROR_NOT_FOUND` when none, `NVML_ERROR_INVALID_ARGUMENT` for a null
/// pointer or a key `find` cannot read.
///
/// # Safety
/// `key` is null or NUL-terminated; `device` is null or valid for a write.
unsafe fn handle_by(
    function: &str,
    key: *const c_char,
    device: *mut NvmlDevice,
    find: impl FnOnce(&State, &str) -> Result<Option<usize>, NvmlReturn>,
) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if key.is_null() || device.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null, NUL-terminated string from the caller (nvml.h's contract).
    let wanted = unsafe { std::ffi::CStr::from_ptr(key) }.to_string_lossy();
    let i = match find(state, &wanted) {
        Ok(Some(i)) => i,
        Ok(None) => return NVML_ERROR_NOT_FOUND,
        Err(code) => return code,
    };
    if let Some(code) = fault(state, function, Some(i)) {
        return code;
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *device = handle_of(i) };
    NVML_SUCCESS
}

/// `nvmlDeviceGetHandleByUUID`: `NVML_ERROR_NOT_FOUND` for a UUID no device has,
/// `NVML_ERROR_INVALID_ARGUMENT` for a null pointer.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe {
        handle_by("nvmlDeviceGetHandleByUUID", uuid, device, |s, wanted| {
            Ok(s.gpus.iter().position(|g| g.uuid == wanted))
        })
    }
}

/// `nvmlDeviceGetIndex`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    if index.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetIndex", device, |_, i| {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *index = i as c_uint };
        NVML_SUCCESS
    })
}

/// `nvmlDeviceGetUUID`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: NvmlDevice,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded caller buffer.
    with_gpu("nvmlDeviceGetUUID", device, |s, i| unsafe {
        write_str(buf, len, &s.gpus[i].uuid)
    })
}

/// `nvmlDeviceGetName`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: NvmlDevice,
    buf: *mut c_char,
    len: c_uint,
) -> NvmlReturn {
    // SAFETY: forwarded caller buffer.
    with_gpu("nvmlDeviceGetName", device, |s, i| unsafe {
        write_str(buf, len, &s.gpus[i].name)
    })
}

/// Total and used bytes of GPU `i`: used from the fake driver when this process has it.
fn memory(s: &mut State, i: usize) -> (u64, u64) {
    let total = s.gpus[i].total();
    let used = match s.driver() {
        Some(d) => d.used(i),
        None => s.gpus[i].used_mib << 20,
    };
    (total, used.min(total))
}

/// `nvmlMemory_t`.
#[repr(C)]
pub struct NvmlMemory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlDeviceGetMemoryInfo`: total, free and used bytes of the device.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo(
    device: NvmlDevice,
    info: *mut NvmlMemory,
) -> NvmlReturn {
    if info.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetMemoryInfo", device, |s, i| {
        let (total, used) = memory(s, i);
        // SAFETY: non-null pointer to the caller's struct.
        unsafe {
            *info = NvmlMemory {
                total,
                free: total - used,
                used,
            }
        };
        NVML_SUCCESS
    })
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlMemory_v2`: the version the caller must set (`NVML_STRUCT_VERSION(Memory, 2)`: the
/// struct's size with the version number in the top byte).
pub const MEMORY_V2: c_uint = std::mem::size_of::<NvmlMemoryV2>() as c_uint | (2 << 24);

/// `nvmlDeviceGetMemoryInfo_v2`: the caller sets `version` (any other value is
/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`); NVML fills totals in bytes, reserved memory 0 here.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    info: *mut NvmlMemoryV2,
) -> NvmlReturn {
    if info.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null pointer to the caller's struct.
    if unsafe { (*info).version } != MEMORY_V2 {
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    with_gpu("nvmlDeviceGetMemoryInfo_v2", device, |s, i| {
        let (total, used) = memory(s, i);
        // SAFETY: non-null pointer to the caller's struct.
        unsafe {
            (*info).total = total;
            (*info).reserved = 0;
            (*info).used = used;
            (*info).free = total - used;
        }
        NVML_SUCCESS
    })
}

#[repr(C)]
pub struct NvmlPciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlDeviceGetPciInfo_v3`: bus id `domain:bus:device.function`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    device: NvmlDevice,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetPciInfo_v3", device, |s, i| {
        // SAFETY: non-null pointer to the caller's struct.
        unsafe { write_pci(pci, &s.gpus[i], i) }
    })
}

/// GPU `i`'s PCI bus id: as configured, else bus `i + 1` (what the fake driver's
/// `CU_DEVICE_ATTRIBUTE_PCI_BUS_ID` says).
fn bus_id_of(gpu: &GpuConfig, i: usize) -> String {
    gpu.bus_id
        .clone()
        .unwrap_or_else(|| format!("00000000:{:02X}:00.0", i + 1))
}

/// Fills the caller's `nvmlPciInfo_t` for GPU `i`.
///
/// # Safety
/// `pci` is a valid, non-null pointer to an `nvmlPciInfo_t`.
unsafe fn write_pci(pci: *mut NvmlPciInfo, gpu: &GpuConfig, i: usize) -> NvmlReturn {
    let bus_id = bus_id_of(gpu, i);
    // SAFETY: the caller's pointer is valid; buffers are the struct's arrays.
    unsafe {
        (*pci).domain = 0;
        (*pci).bus = (i + 1) as c_uint;
        (*pci).device = 0;
        (*pci).pci_device_id = 0x20b2_10de;
        (*pci).pci_sub_system_id = 0x1463_10de;
        let legacy: String = bus_id.chars().skip(4).collect();
        write_str((*pci).bus_id_legacy.as_mut_ptr(), 16, &legacy);
        write_str((*pci).bus_id.as_mut_ptr(), 32, &bus_id)
    }
}

/// A PCI bus id's numbers (`domain:bus:device.function`, hexadecimal; NVML's 8-digit domain or
/// the 4-digit one CUDA's `cuDeviceGetPCIBusId` writes).
fn parse_bus_id(id: &str) -> Option<[u32; 4]> {
    let (rest, function) = id.trim().rsplit_once('.')?;
    let mut parts = rest.split(':');
    let mut next = || u32::from_str_radix(parts.next()?, 16).ok();
    Some([
        next()?,
        next()?,
        next()?,
        u32::from_str_radix(function, 16).ok()?,
    ])
}

/// `nvmlDeviceGetHandleByPciBusId_v2`: "Acquire the handle for a particular device, based on its
/// PCI bus id" (`domain:bus:device.function` in hexadecimal); NVML_ERROR_NOT_FOUND for none.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    bus_id: *const c_char,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe {
        handle_by(
            "nvmlDeviceGetHandleByPciBusId_v2",
            bus_id,
            device,
            |s, wanted| {
                let wanted = parse_bus_id(wanted).ok_or(NVML_ERROR_INVALID_ARGUMENT)?;
                Ok((0..s.gpus.len())
                    .find(|&i| parse_bus_id(&bus_id_of(&s.gpus[i], i)) == Some(wanted)))
            },
        )
    }
}

/// `NVML_NVLINK_MAX_LINKS` of nvml.h.
const NVLINK_MAX_LINKS: usize = 18;

/// The peer GPU index of `link` on GPU `i`: `Err` with NVML's code when the GPU has no NVLink
/// (`NVML_ERROR_NOT_SUPPORTED`) or the link number is out of range (`NVML_ERROR_INVALID_ARGUMENT`);
/// `Ok(None)` for an inactive link.
fn nvlink_peer(s: &State, i: usize, link: c_uint) -> Result<Option<usize>, NvmlReturn> {
    let links = s.gpus[i].nvlinks.as_ref().ok_or(NVML_ERROR_NOT_SUPPORTED)?;
    if link as usize >= NVLINK_MAX_LINKS {
        return Err(NVML_ERROR_INVALID_ARGUMENT);
    }
    Ok(links.get(link as usize).copied())
}

/// `nvmlDeviceGetNvLinkState`: `NVML_FEATURE_ENABLED` (1) for an active link, `DISABLED` (0)
/// otherwise (nvml.h: "Retrieves the state of the device's NvLink for the link specified").
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkState(
    device: NvmlDevice,
    link: c_uint,
    is_active: *mut c_uint,
) -> NvmlReturn {
    if is_active.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetNvLinkState", device, |s, i| {
        match nvlink_peer(s, i, link) {
            Ok(peer) => {
                // SAFETY: non-null out pointer from the caller.
                unsafe { *is_active = c_uint::from(peer.is_some()) };
                NVML_SUCCESS
            }
            Err(code) => code,
        }
    })
}

/// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the PCI information of the device at the other end of
/// an active link (its `busId` as `nvmlDeviceGetPciInfo_v3` reports it); an inactive link is
/// `NVML_ERROR_INVALID_ARGUMENT`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemotePciInfo_v2(
    device: NvmlDevice,
    link: c_uint,
    pci: *mut NvmlPciInfo,
) -> NvmlReturn {
    if pci.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetNvLinkRemotePciInfo_v2", device, |s, i| {
        match nvlink_peer(s, i, link) {
            Ok(Some(peer)) if peer < s.gpus.len() => {
                // SAFETY: non-null pointer to the caller's struct.
                unsafe { write_pci(pci, &s.gpus[peer], peer) }
            }
            Ok(_) => NVML_ERROR_INVALID_ARGUMENT,
            Err(code) => code,
        }
    })
}

/// `nvmlDeviceGetNvLinkRemoteDeviceType`: "Get the NVLink device type of the remote device
/// connected over the given link": `NVML_NVLINK_DEVICE_TYPE_GPU` (0) for the fake's peers, which
/// are all GPUs.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNvLinkRemoteDeviceType(
    device: NvmlDevice,
    link: c_uint,
    kind: *mut c_int,
) -> NvmlReturn {
    if kind.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetNvLinkRemoteDeviceType", device, |s, i| {
        match nvlink_peer(s, i, link) {
            Ok(Some(_)) => {
                // SAFETY: non-null out pointer from the caller.
                unsafe { *kind = 0 };
                NVML_SUCCESS
            }
            Ok(None) => NVML_ERROR_INVALID_ARGUMENT,
            Err(code) => code,
        }
    })
}

/// `nvmlDeviceGetNumaNodeId`: `NVML_ERROR_NOT_SUPPORTED` where the platform has no NUMA affinity.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetNumaNodeId(
    device: NvmlDevice,
    node: *mut c_uint,
) -> NvmlReturn {
    if node.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetNumaNodeId", device, |s, i| {
        match s.gpus[i].numa {
            Some(n) => {
                // SAFETY: non-null out pointer from the caller.
                unsafe { *node = n };
                NVML_SUCCESS
            }
            None => NVML_ERROR_NOT_SUPPORTED,
        }
    })
}

/// `nvmlDeviceGetMigMode`: current and pending mode, 1 = enabled.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: NvmlDevice,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> NvmlReturn {
    if current.is_null() || pending.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetMigMode", device, |s, i| {
        let m = c_uint::from(s.gpus[i].mig);
        // SAFETY: non-null out pointers from the caller.
        unsafe {
            *current = m;
            *pending = m;
        }
        NVML_SUCCESS
    })
}

#[repr(C)]
pub struct NvmlUtilization {
    gpu: c_uint,
    memory: c_uint,
}

/// The program's own utilization of GPU `i`, percent of the last sample period: from the fake
/// driver's busy time when this process has it, else the next value of the configured series.
fn own_utilization(s: &mut State, i: usize) -> u32 {
    if let Some(d) = s.driver() {
        let now = s.started.elapsed().as_nanos() as u64;
        return s.samples[i].update(now, d.busy_ns(i));
    }
    let series = &s.gpus[i].utilization;
    let v = if series.is_empty() {
        0
    } else {
        series[s.utilization_calls[i] % series.len()]
    };
    s.utilization_calls[i] += 1;
    v
}

/// `nvmlDeviceGetUtilizationRates`: "percent of time over the past sample period during which one or
/// more kernels was executing on the GPU", everyone's kernels (the other tenant's too).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    util: *mut NvmlUtilization,
) -> NvmlReturn {
    if util.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetUtilizationRates", device, |s, i| {
        let v = (own_utilization(s, i) + s.config.other_tenant_utilization).min(100);
        let (total, used) = memory(s, i);
        let mem = (used * 100).checked_div(total).unwrap_or(0) as c_uint;
        // SAFETY: non-null pointer to the caller's struct.
        unsafe {
            (*util).gpu = v;
            (*util).memory = mem;
        }
        NVML_SUCCESS
    })
}

/// The pid NVML reports for the calling process (host pid namespace: `pidOffset`).
fn reported_pid(s: &State) -> c_uint {
    std::process::id().wrapping_add(s.config.pid_offset)
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// `nvmlDeviceGetProcessUtilization`: one sample per process that used the device since
/// `lastSeenTimeStamp` (µs). With a NULL buffer or one too small it returns
/// NVML_ERROR_INSUFFICIENT_SIZE and the count; NVML_ERROR_NOT_FOUND when no process has a newer
/// sample. The processes are the calling one when it runs on the fake driver (its GPU work is the
/// only work the fake driver sees), under its host pid, and the other tenant's when there is one.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: NvmlDevice,
    samples: *mut NvmlProcessSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetProcessUtilization", device, |s, i| {
        if !s.config.process_utilization {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        let now_us = s.started.elapsed().as_micros() as u64;
        if now_us <= last_seen {
            return NVML_ERROR_NOT_FOUND;
        }
        let sample = |pid, sm_util| NvmlProcessSample {
            pid,
            time_stamp: now_us,
            sm_util,
            mem_util: 0,
            enc_util: 0,
            dec_util: 0,
        };
        let mut all = Vec::new();
        if s.driver().is_some() {
            let own = own_utilization(s, i);
            all.push(sample(reported_pid(s), own));
        }
        if s.config.other_tenant_utilization > 0 {
            all.push(sample(OTHER_PID, s.config.other_tenant_utilization));
        }
        if all.is_empty() {
            return NVML_ERROR_NOT_FOUND;
        }
        // SAFETY: non-null count; `samples` holds `*count` entries when non-null.
        unsafe {
            if samples.is_null() || (*count as usize) < all.len() {
                *count = all.len() as c_uint;
                return NVML_ERROR_INSUFFICIENT_SIZE;
            }
            for (k, x) in all.iter().enumerate() {
                *samples.add(k) = *x;
            }
            *count = all.len() as c_uint;
        }
        NVML_SUCCESS
    })
}

/// `nvmlProcessInfo_t` (`_v2` and `_v3` of nvmlDeviceGetComputeRunningProcesses).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlProcessInfo_v1_t`: what the unversioned `nvmlDeviceGetComputeRunningProcesses` (the first
/// ABI, still exported by the driver's library) writes: pid and memory only.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvmlProcessInfoV1 {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
}

/// The compute processes of GPU `i`: the calling process once it has a context on the fake
/// driver's device, and the other tenant's process when there is one; (pid, memory).
fn compute_processes(s: &mut State, i: usize) -> Vec<(c_uint, c_ulonglong)> {
    let mut all = Vec::new();
    if s.config.other_tenant_utilization > 0 {
        all.push((OTHER_PID, 0));
    }
    if let Some(d) = s.driver().filter(|d| d.has_context(i)) {
        all.push((reported_pid(s), d.used(i)));
    }
    all
}

/// Writes a process list under NVML's contract: `*count` in, the buffer's size; out, the number
/// of processes; NVML_ERROR_INSUFFICIENT_SIZE (with the count) when the buffer is too small, or
/// NULL with a non-zero count needed.
///
/// # Safety
/// `count` is non-null; `infos` holds `*count` entries when non-null.
unsafe fn write_processes<T: Copy>(count: *mut c_uint, infos: *mut T, all: &[T]) -> NvmlReturn {
    // SAFETY: the caller's contract.
    unsafe {
        if (*count as usize) < all.len() || (infos.is_null() && !all.is_empty()) {
            *count = all.len() as c_uint;
            return NVML_ERROR_INSUFFICIENT_SIZE;
        }
        for (k, x) in all.iter().enumerate() {
            *infos.add(k) = *x;
        }
        *count = all.len() as c_uint;
    }
    NVML_SUCCESS
}

/// `nvmlDeviceGetComputeRunningProcesses` (`_v3`, `_v2`: the same `nvmlProcessInfo_t`):
/// "information about processes with a compute context on a device" ([`compute_processes`]).
unsafe fn processes(
    function: &str,
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu(function, device, |s, i| {
        let all: Vec<NvmlProcessInfo> = compute_processes(s, i)
            .into_iter()
            .map(|(pid, used_gpu_memory)| NvmlProcessInfo {
                pid,
                used_gpu_memory,
                gpu_instance_id: u32::MAX,
                compute_instance_id: u32::MAX,
            })
            .collect();
        // SAFETY: non-null count; `infos` holds `*count` entries when non-null.
        unsafe { write_processes(count, infos, &all) }
    })
}

/// `nvmlDeviceGetComputeRunningProcesses_v3`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe {
        processes(
            "nvmlDeviceGetComputeRunningProcesses_v3",
            device,
            count,
            infos,
        )
    }
}

/// `nvmlDeviceGetComputeRunningProcesses_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfo,
) -> NvmlReturn {
    // SAFETY: same contract.
    unsafe {
        processes(
            "nvmlDeviceGetComputeRunningProcesses_v2",
            device,
            count,
            infos,
        )
    }
}

/// `nvmlDeviceGetComputeRunningProcesses` (the first ABI, `nvmlProcessInfo_v1_t`; PyTorch looks it
/// up by this name for its out-of-memory report).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses(
    device: NvmlDevice,
    count: *mut c_uint,
    infos: *mut NvmlProcessInfoV1,
) -> NvmlReturn {
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu("nvmlDeviceGetComputeRunningProcesses", device, |s, i| {
        let all: Vec<NvmlProcessInfoV1> = compute_processes(s, i)
            .into_iter()
            .map(|(pid, used_gpu_memory)| NvmlProcessInfoV1 {
                pid,
                used_gpu_memory,
            })
            .collect();
        // SAFETY: non-null count; `infos` holds `*count` entries when non-null.
        unsafe { write_processes(count, infos, &all) }
    })
}

/// `nvmlEventSetCreate`.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut NvmlEventSet) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if set.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if let Some(code) = fault(state, "nvmlEventSetCreate", None) {
        return code;
    }
    // A set only gets events that happen after it is made (nvmlEventSetCreate's set starts
    // empty): lines already in the events file are not replayed, nor scheduled events already due
    // (except for the first set, so that `afterMs: 0` means "at start").
    let elapsed = state.started.elapsed();
    let first = state.sets.is_empty();
    let scheduled = state
        .config
        .xid_events
        .iter()
        .filter(|e| first || Duration::from_millis(e.after_ms) > elapsed)
        .cloned()
        .collect();
    let file_lines_seen = state
        .config
        .events_file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .map(|t| t.matches('\n').count())
        .unwrap_or(0);
    state.sets.push(Some(EventSet {
        gpus: Vec::new(),
        scheduled,
        file_lines_seen,
    }));
    // SAFETY: non-null out pointer from the caller.
    unsafe { *set = state.sets.len() as NvmlEventSet };
    NVML_SUCCESS
}

fn set_mut(state: &mut State, set: NvmlEventSet) -> Option<&mut EventSet> {
    let i = (set as usize).checked_sub(1)?;
    state.sets.get_mut(i)?.as_mut()
}

/// `nvmlDeviceRegisterEvents`: only critical XID events are supported here; asking for other types
/// alone is `NVML_ERROR_NOT_SUPPORTED`, as on boards without them.
#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: NvmlDevice,
    types: c_ulonglong,
    set: NvmlEventSet,
) -> NvmlReturn {
    with_gpu("nvmlDeviceRegisterEvents", device, |s, i| {
        if types & EVENT_XID_CRITICAL == 0 {
            return NVML_ERROR_NOT_SUPPORTED;
        }
        match set_mut(s, set) {
            Some(es) => {
                es.gpus.push(i as u32);
                NVML_SUCCESS
            }
            None => NVML_ERROR_INVALID_ARGUMENT,
        }
    })
}

#[repr(C)]
pub struct NvmlEventData {
    device: NvmlDevice,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// The next pending event of a set: a due scheduled one, else a new line of the events file.
fn next_event(state: &mut State, set: NvmlEventSet) -> Option<(u32, u64)> {
    let started = state.started;
    let file = state.config.events_file.clone();
    let es = set_mut(state, set)?;
    let now = started.elapsed();
    if let Some(pos) = es
        .scheduled
        .iter()
        .position(|e| Duration::from_millis(e.after_ms) <= now && es.gpus.contains(&e.gpu))
    {
        let e = es.scheduled.remove(pos);
        return Some((e.gpu, e.xid));
    }
    let text = std::fs::read_to_string(file?).ok()?;
    // Only complete lines: a test may be in the middle of appending one.
    let complete = text.rsplit_once('\n').map(|(head, _)| head).unwrap_or("");
    for line in complete.lines().skip(es.file_lines_seen) {
        es.file_lines_seen += 1;
        let mut parts = line.split_whitespace();
        let gpu = parts.next().and_then(|p| p.parse::<u32>().ok());
        let xid = parts.next().and_then(|p| p.parse::<u64>().ok());
        if let (Some(gpu), Some(xid)) = (gpu, xid) {
            if es.gpus.contains(&gpu) {
                return Some((gpu, xid));
            }
        }
    }
    None
}

/// `nvmlEventSetWait_v2`: waits up to `timeout_ms` for an event; `NVML_ERROR_TIMEOUT` when none came.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: NvmlEventSet,
    data: *mut NvmlEventData,
    timeout_ms: c_uint,
) -> NvmlReturn {
    if data.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        {
            let mut guard = lock();
            let Some(state) = guard.as_mut() else {
                return NVML_ERROR_UNINITIALIZED;
            };
            if set_mut(state, set).is_none() {
                return NVML_ERROR_INVALID_ARGUMENT;
            }
            // The documented failures of a wait (NVML_ERROR_GPU_IS_LOST, NVML_ERROR_UNKNOWN, ...)
            // come back at once, without waiting.
            if let Some(code) = fault(state, "nvmlEventSetWait_v2", None) {
                return code;
            }
            if let Some((gpu, xid)) = next_event(state, set) {
                log_line(state, &format!("xid {} {gpu} {xid}", unix_micros()));
                // SAFETY: non-null pointer to the caller's struct.
                unsafe {
                    (*data).device = handle_of(gpu as usize);
                    (*data).event_type = EVENT_XID_CRITICAL;
                    (*data).event_data = xid;
                    (*data).gpu_instance_id = 0xffff_ffff;
                    (*data).compute_instance_id = 0xffff_ffff;
                }
                return NVML_SUCCESS;
            }
        }
        if Instant::now() >= deadline {
            return NVML_ERROR_TIMEOUT;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `nvmlEventSetFree`.
#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: NvmlEventSet) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    match (set as usize)
        .checked_sub(1)
        .and_then(|i| state.sets.get_mut(i))
    {
        Some(slot) => {
            *slot = None;
            NVML_SUCCESS
        }
        None => NVML_ERROR_INVALID_ARGUMENT,
    }
}
