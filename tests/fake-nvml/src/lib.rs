//! Test double of `libnvidia-ml.so.1`: the subset of the NVML C ABI that nvml-wrapper calls for the
//! device plugin (discovery, utilization, critical-XID events). Tests point the plugin's `--nvml-lib` at
//! the built `libfake_nvml.so`, so the plugin goes through the same `dlopen` path as with the real
//! library.
//!
//! Configuration: `FAKE_NVML_CONFIG`, read at `nvmlInit_v2`, is a path to a JSON file or inline JSON:
//!
//! ```json
//! {"driverVersion": "550.54.15",
//!  "gpus": [{"uuid": "GPU-…", "name": "NVIDIA A100-SXM4-80GB", "memoryMib": 81920, "usedMib": 0,
//!            "busId": "00000000:3B:00.0", "numa": 0, "mig": false, "utilization": [10, 20, 30]}],
//!  "xidEvents": [{"afterMs": 200, "gpu": 0, "xid": 79}],
//!  "eventsFile": "events.txt"}
//! ```
//!
//! - `utilization` is a series: each `nvmlDeviceGetUtilizationRates` returns the next value, cycling.
//! - `numa` absent: `nvmlDeviceGetNumaNodeId` returns `NVML_ERROR_NOT_SUPPORTED`, as on single-socket
//!   machines.
//! - `xidEvents` fire once each, `afterMs` after `nvmlInit_v2`.
//! - `eventsFile` is append-only: each line `<gpu index> <xid>` that a test appends is delivered once
//!   to every event set that registered that GPU, so a test can inject an XID at any moment.
//!
//! Each function's comment names the documented NVML behaviour it copies.
//!
//! Unsafe code: this crate *is* a C ABI, so it writes through the caller's pointers after null checks;
//! each such spot carries a `SAFETY` comment.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
#![allow(missing_docs)]

use serde::Deserialize;
use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

type NvmlReturn = c_uint;
type NvmlDevice = *mut c_void;
type NvmlEventSet = *mut c_void;

const NVML_SUCCESS: NvmlReturn = 0;
const NVML_ERROR_UNINITIALIZED: NvmlReturn = 1;
const NVML_ERROR_INVALID_ARGUMENT: NvmlReturn = 2;
const NVML_ERROR_NOT_SUPPORTED: NvmlReturn = 3;
const NVML_ERROR_INSUFFICIENT_SIZE: NvmlReturn = 7;
const NVML_ERROR_TIMEOUT: NvmlReturn = 10;
const NVML_ERROR_UNKNOWN: NvmlReturn = 999;

/// `nvmlEventTypeXidCriticalError`.
const EVENT_XID_CRITICAL: c_ulonglong = 0x8;

#[derive(Deserialize, Clone)]
#[serde(rename_all = "camelCase")]
struct GpuConfig {
    uuid: String,
    #[serde(default = "default_name")]
    name: String,
    memory_mib: u64,
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
}

fn default_name() -> String {
    "NVIDIA A100-SXM4-80GB".into()
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
struct Config {
    #[serde(default = "default_driver")]
    driver_version: String,
    gpus: Vec<GpuConfig>,
    #[serde(default)]
    xid_events: Vec<XidConfig>,
    #[serde(default)]
    events_file: Option<String>,
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
    started: Instant,
    utilization_calls: Vec<usize>,
    /// Event sets by handle - 1; `None` once freed.
    sets: Vec<Option<EventSet>>,
    init_count: u32,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, Option<State>> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

fn load_config() -> Option<Config> {
    let raw = std::env::var("FAKE_NVML_CONFIG").ok()?;
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
    (i < state.config.gpus.len()).then_some(i)
}

/// Runs `f` on the initialised state and the GPU behind `device`; NVML returns
/// `NVML_ERROR_UNINITIALIZED` before `nvmlInit` and `NVML_ERROR_INVALID_ARGUMENT` for a bad handle.
fn with_gpu(device: NvmlDevice, f: impl FnOnce(&mut State, usize) -> NvmlReturn) -> NvmlReturn {
    let mut guard = lock();
    let Some(state) = guard.as_mut() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    match index_of(state, device) {
        Some(i) => f(state, i),
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
    let n = config.gpus.len();
    *guard = Some(State {
        config,
        started: Instant::now(),
        utilization_calls: vec![0; n],
        sets: Vec::new(),
        init_count: 1,
    });
    NVML_SUCCESS
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
    let guard = lock();
    match guard.as_ref() {
        // SAFETY: forwarded caller buffer.
        Some(s) => unsafe { write_str(buf, len, &s.config.driver_version) },
        None => NVML_ERROR_UNINITIALIZED,
    }
}

/// `nvmlDeviceGetCount_v2`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> NvmlReturn {
    let guard = lock();
    let Some(state) = guard.as_ref() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if count.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *count = state.config.gpus.len() as c_uint };
    NVML_SUCCESS
}

/// `nvmlDeviceGetHandleByIndex_v2`: `NVML_ERROR_INVALID_ARGUMENT` for an index past the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut NvmlDevice,
) -> NvmlReturn {
    let guard = lock();
    let Some(state) = guard.as_ref() else {
        return NVML_ERROR_UNINITIALIZED;
    };
    if device.is_null() || index as usize >= state.config.gpus.len() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *device = handle_of(index as usize) };
    NVML_SUCCESS
}

/// `nvmlDeviceGetIndex`.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: NvmlDevice, index: *mut c_uint) -> NvmlReturn {
    if index.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu(device, |_, i| {
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
    with_gpu(device, |s, i| unsafe {
        write_str(buf, len, &s.config.gpus[i].uuid)
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
    with_gpu(device, |s, i| unsafe {
        write_str(buf, len, &s.config.gpus[i].name)
    })
}

#[repr(C)]
pub struct NvmlMemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlDeviceGetMemoryInfo_v2`: the caller sets `version`; NVML fills totals in bytes.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: NvmlDevice,
    info: *mut NvmlMemoryV2,
) -> NvmlReturn {
    if info.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu(device, |s, i| {
        let g = &s.config.gpus[i];
        let total = g.memory_mib << 20;
        let used = (g.used_mib << 20).min(total);
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
    with_gpu(device, |s, i| {
        let bus_id = s.config.gpus[i]
            .bus_id
            .clone()
            .unwrap_or_else(|| format!("00000000:{:02X}:00.0", i + 1));
        // SAFETY: non-null pointer to the caller's struct; buffers are the struct's arrays.
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
    with_gpu(device, |s, i| match s.config.gpus[i].numa {
        Some(n) => {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *node = n };
            NVML_SUCCESS
        }
        None => NVML_ERROR_NOT_SUPPORTED,
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
    with_gpu(device, |s, i| {
        let m = c_uint::from(s.config.gpus[i].mig);
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

/// `nvmlDeviceGetUtilizationRates`: percent of the last sample period; here the next value of the
/// configured series.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: NvmlDevice,
    util: *mut NvmlUtilization,
) -> NvmlReturn {
    if util.is_null() {
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    with_gpu(device, |s, i| {
        let series = &s.config.gpus[i].utilization;
        let v = if series.is_empty() {
            0
        } else {
            series[s.utilization_calls[i] % series.len()]
        };
        s.utilization_calls[i] += 1;
        let g = &s.config.gpus[i];
        let mem = (g.used_mib * 100).checked_div(g.memory_mib).unwrap_or(0) as c_uint;
        // SAFETY: non-null pointer to the caller's struct.
        unsafe {
            (*util).gpu = v;
            (*util).memory = mem;
        }
        NVML_SUCCESS
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
    state.sets.push(Some(EventSet {
        gpus: Vec::new(),
        scheduled: state.config.xid_events.clone(),
        file_lines_seen: 0,
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
    with_gpu(device, |s, i| {
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
            if let Some((gpu, xid)) = next_event(state, set) {
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
