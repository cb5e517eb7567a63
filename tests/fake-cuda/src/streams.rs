//! Streams and events: handles the fake hands out and checks. Work is done when it is queued, so
//! a stream is always idle and an event completes when it is recorded; what callers can observe
//! (a valid handle, `CUDA_ERROR_INVALID_HANDLE` after destroy, elapsed time between two records)
//! behaves as cuda.h documents.

use crate::{current, state, try_cu, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_int, c_uint, c_void};
use std::time::Instant;

/// `CUDA_ERROR_INVALID_HANDLE`: "a resource handle passed to the API call was not valid".
pub const CUDA_ERROR_INVALID_HANDLE: CUresult = 400;
/// `CUDA_ERROR_NOT_READY`: an event not recorded yet.
const CUDA_ERROR_NOT_READY: CUresult = 600;

/// What a handle names.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Handle {
    /// A stream, with the flags and priority it was created with.
    Stream { flags: c_uint, priority: c_int },
    /// An event, with the time of its last record.
    Event(Option<Instant>),
}

/// Live handles by address; addresses are never reused, so a destroyed handle stays invalid.
static HANDLES: Mutex<(usize, Option<HashMap<usize, Handle>>)> = Mutex::new((0x5000_0000, None));

fn create(kind: Handle) -> usize {
    let mut h = HANDLES.lock();
    h.0 += 0x10;
    let at = h.0;
    h.1.get_or_insert_with(HashMap::new).insert(at, kind);
    at
}

fn with<R>(handle: *mut c_void, f: impl FnOnce(&mut Handle) -> R) -> Option<R> {
    let mut h = HANDLES.lock();
    h.1.as_mut()?.get_mut(&(handle as usize)).map(f)
}

fn destroy(handle: *mut c_void, stream: bool) -> CUresult {
    let mut h = HANDLES.lock();
    let Some(map) = h.1.as_mut() else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    match map.get(&(handle as usize)) {
        Some(Handle::Stream { .. }) if stream => {}
        Some(Handle::Event(_)) if !stream => {}
        _ => return CUDA_ERROR_INVALID_HANDLE,
    }
    map.remove(&(handle as usize));
    CUDA_SUCCESS
}

/// A stream argument: NULL (the legacy default stream), `CU_STREAM_LEGACY` (0x1),
/// `CU_STREAM_PER_THREAD` (0x2), or a live stream.
pub(crate) fn stream_ok(stream: *mut c_void) -> CUresult {
    match stream as usize {
        0..=2 => CUDA_SUCCESS,
        _ if with(stream, |h| matches!(h, Handle::Stream { .. })) == Some(true) => CUDA_SUCCESS,
        _ => CUDA_ERROR_INVALID_HANDLE,
    }
}

unsafe fn new_handle(out: *mut *mut c_void, kind: Handle) -> CUresult {
    let _ = try_cu!(current());
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *out = create(kind) as *mut c_void };
    CUDA_SUCCESS
}

/// `cuStreamCreate`: "Creates a stream and returns a handle in phStream" in the current context.
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut *mut c_void, flags: c_uint) -> CUresult {
    // SAFETY: same contract.
    unsafe { new_handle(stream, Handle::Stream { flags, priority: 0 }) }
}

/// Stream priorities of the fake device, as `cuCtxGetStreamPriorityRange` reports them for current
/// NVIDIA GPUs: "lower numbers represent higher priorities", 0 the default and least.
const LEAST_PRIORITY: c_int = 0;
const GREATEST_PRIORITY: c_int = -5;

/// `cuCtxGetStreamPriorityRange`: "Returns numerical values that correspond to the least and
/// greatest stream priorities"; "If a null pointer is passed in for *leastPriority or
/// *greatestPriority, the value is not returned".
#[no_mangle]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    let _ = try_cu!(current());
    // SAFETY: each written only when non-null.
    unsafe {
        if !least.is_null() {
            *least = LEAST_PRIORITY;
        }
        if !greatest.is_null() {
            *greatest = GREATEST_PRIORITY;
        }
    }
    CUDA_SUCCESS
}

/// `cuStreamCreateWithPriority`: as cuStreamCreate with a priority; one "outside the numerical
/// range returned by cuCtxGetStreamPriorityRange ... will automatically be clamped".
#[no_mangle]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut *mut c_void,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
    // SAFETY: same contract.
    unsafe { new_handle(stream, Handle::Stream { flags, priority }) }
}

/// A stream's flags and priority; the default streams have neither.
fn stream_properties(stream: *mut c_void) -> Result<(c_uint, c_int), CUresult> {
    state().map(drop)?;
    match stream as usize {
        0..=2 => Ok((0, LEAST_PRIORITY)),
        _ => match with(stream, |h| *h) {
            Some(Handle::Stream { flags, priority }) => Ok((flags, priority)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        },
    }
}

/// `cuStreamGetPriority`: "Query the priority of a given stream".
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetPriority(
    stream: *mut c_void,
    priority: *mut c_int,
) -> CUresult {
    if priority.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (_, p) = try_cu!(stream_properties(stream));
    // SAFETY: checked non-null.
    unsafe { *priority = p };
    CUDA_SUCCESS
}

/// `cuStreamGetFlags`: "Query the flags of a given stream".
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetFlags(stream: *mut c_void, flags: *mut c_uint) -> CUresult {
    if flags.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let (f, _) = try_cu!(stream_properties(stream));
    // SAFETY: checked non-null.
    unsafe { *flags = f };
    CUDA_SUCCESS
}

/// `cuStreamDestroy_v2`: "Destroys the stream specified by hStream".
#[no_mangle]
pub extern "C" fn cuStreamDestroy_v2(stream: *mut c_void) -> CUresult {
    destroy(stream, true)
}

/// `cuStreamSynchronize`: "Waits until the device has completed all operations in the stream";
/// memory pools then give back what they hold above their release thresholds.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize(stream: *mut c_void) -> CUresult {
    synchronize(stream)
}

/// `cuStreamSynchronize_ptsz`.
#[no_mangle]
pub extern "C" fn cuStreamSynchronize_ptsz(stream: *mut c_void) -> CUresult {
    synchronize(stream)
}

fn synchronize(stream: *mut c_void) -> CUresult {
    try_cu!(state().map(drop));
    let r = stream_ok(stream);
    if r == CUDA_SUCCESS {
        crate::pools::synchronized();
    }
    r
}

/// `cuStreamQuery`: CUDA_SUCCESS "if all operations in the stream specified by hStream have
/// completed".
#[no_mangle]
pub extern "C" fn cuStreamQuery(stream: *mut c_void) -> CUresult {
    let _s = try_cu!(state());
    stream_ok(stream)
}

/// `cuStreamWaitEvent`: "Make a compute stream wait on an event".
#[no_mangle]
pub extern "C" fn cuStreamWaitEvent(
    stream: *mut c_void,
    event: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    let _s = try_cu!(state());
    if with(event, |h| matches!(h, Handle::Event(_))) != Some(true) {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    stream_ok(stream)
}

/// `cuEventCreate`: "Creates an event *phEvent for the current context".
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(event: *mut *mut c_void, _flags: c_uint) -> CUresult {
    // SAFETY: same contract.
    unsafe { new_handle(event, Handle::Event(None)) }
}

fn record(event: *mut c_void, stream: *mut c_void) -> CUresult {
    let _s = try_cu!(state());
    let r = stream_ok(stream);
    if r != CUDA_SUCCESS {
        return r;
    }
    let now = Instant::now();
    match with(event, |h| match h {
        Handle::Event(at) => {
            *at = Some(now);
            true
        }
        Handle::Stream { .. } => false,
    }) {
        Some(true) => CUDA_SUCCESS,
        _ => CUDA_ERROR_INVALID_HANDLE,
    }
}

/// `cuEventRecord`: "Captures in hEvent the contents of hStream at the time of this call".
#[no_mangle]
pub extern "C" fn cuEventRecord(event: *mut c_void, stream: *mut c_void) -> CUresult {
    record(event, stream)
}

/// `cuEventRecord_ptsz`.
#[no_mangle]
pub extern "C" fn cuEventRecord_ptsz(event: *mut c_void, stream: *mut c_void) -> CUresult {
    record(event, stream)
}

fn recorded(event: *mut c_void) -> Result<Option<Instant>, CUresult> {
    match with(event, |h| *h) {
        Some(Handle::Event(at)) => Ok(at),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// `cuEventSynchronize`: "Waits until the completion of all work currently captured in hEvent";
/// memory pools then give back what they hold above their release thresholds.
#[no_mangle]
pub extern "C" fn cuEventSynchronize(event: *mut c_void) -> CUresult {
    try_cu!(state().map(drop));
    try_cu!(recorded(event));
    crate::pools::synchronized();
    CUDA_SUCCESS
}

/// `cuEventQuery`: CUDA_SUCCESS once the captured work completed (at the record, here).
#[no_mangle]
pub extern "C" fn cuEventQuery(event: *mut c_void) -> CUresult {
    let _s = try_cu!(state());
    try_cu!(recorded(event));
    CUDA_SUCCESS
}

/// `cuEventDestroy_v2`: "Destroys the event specified by hEvent".
#[no_mangle]
pub extern "C" fn cuEventDestroy_v2(event: *mut c_void) -> CUresult {
    destroy(event, false)
}

unsafe fn elapsed(ms: *mut f32, start: *mut c_void, end: *mut c_void) -> CUresult {
    let _s = try_cu!(state());
    if ms.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // "If either event was last recorded in a non-NULL stream and either event has not been
    // recorded, CUDA_ERROR_INVALID_HANDLE is returned"; not yet complete: CUDA_ERROR_NOT_READY.
    let (Some(a), Some(b)) = (try_cu!(recorded(start)), try_cu!(recorded(end))) else {
        return CUDA_ERROR_NOT_READY;
    };
    let t = if b >= a {
        (b - a).as_secs_f32() * 1000.0
    } else {
        -((a - b).as_secs_f32() * 1000.0)
    };
    // SAFETY: checked non-null.
    unsafe { *ms = t };
    CUDA_SUCCESS
}

/// `cuEventElapsedTime`: "Computes the elapsed time between two events (in milliseconds)".
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { elapsed(ms, start, end) }
}

/// `cuEventElapsedTime_v2` (CUDA 12.8): the same contract.
#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: *mut c_void,
    end: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { elapsed(ms, start, end) }
}

/// `CU_STREAM_CAPTURE_STATUS_NONE` (cuda.h `CUstreamCaptureStatus`): "Stream is not capturing".
/// The fake records no graphs (it has no `cuStreamBeginCapture`), so no stream ever is.
const CAPTURE_STATUS_NONE: c_int = 0;

unsafe fn capture_status(stream: *mut c_void, status: *mut c_int) -> CUresult {
    if status.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    try_cu!(stream_properties(stream));
    // SAFETY: checked non-null.
    unsafe { *status = CAPTURE_STATUS_NONE };
    CUDA_SUCCESS
}

/// `cuStreamIsCapturing`: "Returns a stream's capture status".
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing(stream: *mut c_void, status: *mut c_int) -> CUresult {
    // SAFETY: same contract.
    unsafe { capture_status(stream, status) }
}

/// `cuStreamIsCapturing_ptsz`.
#[no_mangle]
pub unsafe extern "C" fn cuStreamIsCapturing_ptsz(
    stream: *mut c_void,
    status: *mut c_int,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { capture_status(stream, status) }
}

/// `cuStreamGetCaptureInfo_v2` (CUDA 11.3): the capture status ("required"); the id, graph and
/// dependencies are "only valid" while capturing, which no stream of the fake is.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v2(
    stream: *mut c_void,
    status: *mut c_int,
    _id: *mut u64,
    _graph: *mut *mut c_void,
    _dependencies: *mut *const *mut c_void,
    _count: *mut usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { capture_status(stream, status) }
}

/// `cuStreamGetCaptureInfo_v3` (CUDA 12.3): as `_v2`, with edge data.
#[no_mangle]
pub unsafe extern "C" fn cuStreamGetCaptureInfo_v3(
    stream: *mut c_void,
    status: *mut c_int,
    _id: *mut u64,
    _graph: *mut *mut c_void,
    _dependencies: *mut *const *mut c_void,
    _edges: *mut *const c_void,
    _count: *mut usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { capture_status(stream, status) }
}
