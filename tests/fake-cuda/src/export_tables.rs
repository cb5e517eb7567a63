//! `cuGetExportTable`: the driver's internal function tables the CUDA runtime (cudart) asks for by
//! UUID before its first device call. cuda.h declares the entry point without documentation
//! (`\cond CUDA_EXPORT_TABLES`); NVIDIA publishes neither the tables' UUIDs nor their layouts.
//! What the fake provides is what cudart 12.9 and 13.x call over it, each table laid out as
//! ZLUDA's `dark_api` crate (vosen/ZLUDA, `dark_api/src/lib.rs`: an independent, public
//! reimplementation of the driver that runs unmodified CUDA programs) describes it, and nothing
//! more: every slot the fake does not implement is a trap that names its table and slot on stderr
//! and aborts, so a runtime that starts calling something new fails the tests loudly instead of
//! jumping through a null pointer. `FAKE_CUDA_TRACE` prints each table asked for.
//!
//! Slot 0 of a table is its size in bytes (cudart reads it to know which slots exist); the tables
//! are arrays of function pointers after it.

use std::collections::HashMap;
use std::ffi::{c_uint, c_void};

use parking_lot::Mutex;

use crate::device::CuUuid;
use crate::{CUcontext, CUdevice, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};

type Slot = *const c_void;

/// A table as cudart reads it: a pointer to its first slot.
struct Table<const N: usize>([Slot; N]);

// SAFETY: the tables are immutable arrays of function addresses and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

/// Asked first by cudart 12.9 and 13.x; a table here makes cudart skip its usual start (the
/// primary context through CUDART_INTERFACE) for one the fake does not know, so it must be
/// refused (the public reimplementations agree: an error, not success).
const SKIP_INIT: [u8; 16] = uuid(0xf8cff951_2146_8b4e_b9e2_fb469e7c0dd9);
const CUDART_INTERFACE: [u8; 16] = uuid(0x6bd5fb6c_5bf4_e74a_8987_d93912fd9df9);
const TOOLS_TLS: [u8; 16] = uuid(0x42d85a81_23f6_cb47_8298_f6e78a3aecdc);
const TOOLS_RUNTIME_CALLBACK_HOOKS: [u8; 16] = uuid(0xa094798c_2e74_2e74_93f2_0800200c0a66);
const CONTEXT_LOCAL_STORAGE: [u8; 16] = uuid(0xc693336e_1121_df11_a8c3_68f355d89593);
const CONTEXT_CHECKS: [u8; 16] = uuid(0x263e8860_7cd2_6143_92f6_bbd5006dfa7e);
const TOOLS_CONTEXT: [u8; 16] = uuid(0x21318c60_9714_3248_8ca6_41ff7324c8f2);
const INTEGRITY_CHECK: [u8; 16] = uuid(0xd4082055_bde6_704b_8d34_ba123c66e1f2);

const fn uuid(v: u128) -> [u8; 16] {
    v.to_be_bytes()
}

/// The tables' names, indexed by the `TABLE` parameter of [`trap`].
const NAMES: [&str; 7] = [
    "CUDART_INTERFACE",
    "TOOLS_TLS",
    "TOOLS_RUNTIME_CALLBACK_HOOKS",
    "CONTEXT_LOCAL_STORAGE",
    "CONTEXT_CHECKS",
    "INTEGRITY_CHECK",
    "TOOLS_CONTEXT",
];

/// A slot the fake does not implement: says which and stops the process (its signature is
/// unknown, so returning anything could corrupt the caller).
extern "C" fn trap<const TABLE: usize, const SLOT: usize>() -> ! {
    eprintln!(
        "fake-cuda: cuGetExportTable {} slot {SLOT} called: not provided by the fake",
        NAMES[TABLE]
    );
    std::process::abort()
}

/// A table's slots: the given ones, then traps for the listed slots of table `$t` (an index into
/// [`NAMES`]).
macro_rules! slots {
    ($t:literal; $($given:expr),*; $($slot:literal)*) => {
        [$($given,)* $(trap::<$t, $slot> as Slot),*]
    };
}

const fn size_of_table(slots: usize) -> Slot {
    (slots * std::mem::size_of::<usize>()) as Slot
}

/// 13 slots (ZLUDA's current layout); cudart 12.9 and 13.5 call slot 2 alone over the fake,
/// cudart 13.2 (PyTorch 2.15's) slot 12 too.
static CUDART: Table<13> = Table([
    size_of_table(13),
    trap::<0, 1> as Slot,
    get_primary_context as Slot,
    trap::<0, 3> as Slot,
    trap::<0, 4> as Slot,
    trap::<0, 5> as Slot,
    trap::<0, 6> as Slot,
    trap::<0, 7> as Slot,
    trap::<0, 8> as Slot,
    trap::<0, 9> as Slot,
    trap::<0, 10> as Slot,
    trap::<0, 11> as Slot,
    load_compilers as Slot,
]);

static TOOLS_TLS_TABLE: Table<4> = Table(slots!(1; size_of_table(4); 1 2 3));

static CALLBACK_HOOKS: Table<7> = Table([
    size_of_table(7),
    trap::<2, 1> as Slot,
    callback_buffer_1 as Slot,
    trap::<2, 3> as Slot,
    trap::<2, 4> as Slot,
    trap::<2, 5> as Slot,
    callback_buffer_2 as Slot,
]);

/// No size slot: its first entry is a function.
static LOCAL_STORAGE: Table<4> = Table(slots!(3;
    local_storage_put as Slot, local_storage_delete as Slot, local_storage_get as Slot; 3));

static CHECKS: Table<4> = Table([
    size_of_table(4),
    trap::<4, 1> as Slot,
    context_check as Slot,
    global_check as Slot,
]);

static INTEGRITY: Table<3> = Table(slots!(5; size_of_table(3), integrity_check as Slot; 2));

/// Asked for by cudart 13.5 and none of its slots called over the fake: 94 slots behind the size,
/// as a public test of another reimplementation records for driver 595.
static TOOLS_CONTEXT_TABLE: Table<95> = Table(
    slots!(6; size_of_table(95); 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89 90 91 92 93 94),
);

fn table_for(id: &[u8; 16]) -> Option<(&'static str, Slot)> {
    Some(match *id {
        CUDART_INTERFACE => ("CUDART_INTERFACE", CUDART.0.as_ptr().cast()),
        TOOLS_TLS => ("TOOLS_TLS", TOOLS_TLS_TABLE.0.as_ptr().cast()),
        TOOLS_RUNTIME_CALLBACK_HOOKS => (
            "TOOLS_RUNTIME_CALLBACK_HOOKS",
            CALLBACK_HOOKS.0.as_ptr().cast(),
        ),
        CONTEXT_LOCAL_STORAGE => ("CONTEXT_LOCAL_STORAGE", LOCAL_STORAGE.0.as_ptr().cast()),
        CONTEXT_CHECKS => ("CONTEXT_CHECKS", CHECKS.0.as_ptr().cast()),
        INTEGRITY_CHECK => ("INTEGRITY_CHECK", INTEGRITY.0.as_ptr().cast()),
        TOOLS_CONTEXT => ("TOOLS_CONTEXT", TOOLS_CONTEXT_TABLE.0.as_ptr().cast()),
        _ => return None,
    })
}

/// `cuGetExportTable(const void **ppExportTable, const CUuuid *pExportTableId)`.
#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CuUuid,
) -> CUresult {
    if table.is_null() || id.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; a CUuuid is 16 bytes.
    let bytes = unsafe { (*id).bytes };
    let found = if bytes == SKIP_INIT {
        None
    } else {
        table_for(&bytes)
    };
    if std::env::var_os("FAKE_CUDA_TRACE").is_some() {
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let what = found.map_or("NOT PROVIDED", |(name, _)| name);
        eprintln!("fake-cuda: cuGetExportTable {hex}: {what}");
    }
    let (result, ptr) = match found {
        Some((_, ptr)) => (CUDA_SUCCESS, ptr),
        None => (crate::CUDA_ERROR_NOT_FOUND, std::ptr::null()),
    };
    // SAFETY: checked non-null.
    unsafe { *table = ptr };
    result
}

/// CUDART_INTERFACE slot 2: the device's primary context, retained (cudart's context for a
/// device; ZLUDA implements it as `cuDevicePrimaryCtxRetain`).
unsafe extern "C" fn get_primary_context(ctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    // SAFETY: same contract as cuDevicePrimaryCtxRetain.
    unsafe { crate::cuDevicePrimaryCtxRetain(ctx, dev) }
}

/// CUDART_INTERFACE slot 12: in NVIDIA's driver it loads the PTX compiler and libNVVM (ZLUDA's
/// name and reading); a driver that compiles nothing has nothing to load, and ZLUDA answers
/// success the same way. cudart 13.2 calls it before its first module load.
unsafe extern "C" fn load_compilers() -> CUresult {
    CUDA_SUCCESS
}

/// Memory the runtime's tools callbacks keep their state in (TOOLS_RUNTIME_CALLBACK_HOOKS slots 2
/// and 6 hand out a buffer and its size; ZLUDA's are 1024 and 14 32-bit words, zeroed).
struct Buffer<const N: usize>(std::cell::UnsafeCell<[u32; N]>);
// SAFETY: the fake never reads it; the runtime owns its contents.
unsafe impl<const N: usize> Sync for Buffer<N> {}
static BUFFER_1: Buffer<1024> = Buffer(std::cell::UnsafeCell::new([0; 1024]));
static BUFFER_2: Buffer<14> = Buffer(std::cell::UnsafeCell::new([0; 14]));

unsafe fn hand_out<const N: usize>(b: &'static Buffer<N>, ptr: *mut *mut c_void, size: *mut usize) {
    if !ptr.is_null() {
        // SAFETY: checked non-null; the caller passes a writable pointer.
        unsafe { *ptr = b.0.get().cast() };
    }
    if !size.is_null() {
        // SAFETY: checked non-null.
        unsafe { *size = N };
    }
}

unsafe extern "C" fn callback_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: same contract.
    unsafe { hand_out(&BUFFER_1, ptr, size) }
}

unsafe extern "C" fn callback_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: same contract.
    unsafe { hand_out(&BUFFER_2, ptr, size) }
}

type Destructor = Option<extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

/// Values the runtime keeps per context and key (CONTEXT_LOCAL_STORAGE: put, delete, get). A NULL
/// context means the calling thread's current one.
static LOCAL_VALUES: Mutex<Option<HashMap<(usize, usize), usize>>> = Mutex::new(None);

fn resolve(ctx: CUcontext) -> usize {
    if !ctx.is_null() {
        return ctx as usize;
    }
    let mut current: CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out pointer.
    unsafe { crate::device::cuCtxGetCurrent(&mut current) };
    current as usize
}

unsafe extern "C" fn local_storage_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    _destructor: Destructor,
) -> CUresult {
    let ctx = resolve(ctx);
    if ctx == 0 {
        return crate::CUDA_ERROR_INVALID_CONTEXT;
    }
    LOCAL_VALUES
        .lock()
        .get_or_insert_with(HashMap::new)
        .insert((ctx, key as usize), value as usize);
    CUDA_SUCCESS
}

unsafe extern "C" fn local_storage_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    let ctx = resolve(ctx);
    if let Some(values) = LOCAL_VALUES.lock().as_mut() {
        values.remove(&(ctx, key as usize));
    }
    CUDA_SUCCESS
}

unsafe extern "C" fn local_storage_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    if value.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let ctx = resolve(ctx);
    let found = LOCAL_VALUES
        .lock()
        .as_ref()
        .and_then(|v| v.get(&(ctx, key as usize)).copied());
    match found {
        Some(v) => {
            // SAFETY: checked non-null.
            unsafe { *value = v as *mut c_void };
            CUDA_SUCCESS
        }
        // ZLUDA answers an unknown key with CUDA_ERROR_INVALID_HANDLE, which cudart reads as
        // "not stored yet".
        None => crate::streams::CUDA_ERROR_INVALID_HANDLE,
    }
}

/// CONTEXT_CHECKS slot 2: flags about a context that are 0 on every driver ZLUDA observed.
unsafe extern "C" fn context_check(
    _ctx: CUcontext,
    flags: *mut c_uint,
    detail: *mut Slot,
) -> CUresult {
    if !flags.is_null() {
        // SAFETY: checked non-null.
        unsafe { *flags = 0 };
    }
    if !detail.is_null() {
        // SAFETY: checked non-null.
        unsafe { *detail = std::ptr::null() };
    }
    CUDA_SUCCESS
}

/// CONTEXT_CHECKS slot 3: 0 on every driver ZLUDA observed.
extern "C" fn global_check() -> c_uint {
    0
}

/// INTEGRITY_CHECK slot 1: cudart proves it talks to the driver it expects by asking for a keyed
/// hash of values both sides know (the driver version, the caller's version, process and thread,
/// the two tables' and this function's addresses, a time cudart chooses, each device's UUID and
/// PCI address) and comparing it with its own. ZLUDA's `dark_api::integrity_check` shows the hash
/// byte by byte; it is HMAC (RFC 2104) over MD2 (RFC 1319: its 256-byte substitution table, its
/// padding and checksum; inner and outer pads 0x36 and 0x5c), keyed with 16 bytes the runtime
/// holds, so it is computed here with RustCrypto's `hmac` and `md2`.
unsafe extern "C" fn integrity_check(
    version: c_uint,
    unix_seconds: u64,
    out: *mut [u8; 16],
) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let digest = match integrity_digest(version, unix_seconds) {
        Ok(d) => d,
        Err(e) => return e,
    };
    // SAFETY: checked non-null; the caller passes two 64-bit words.
    unsafe { *out = digest };
    CUDA_SUCCESS
}

/// The hash's key (ZLUDA: the result of a first pass that reads no input).
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

fn integrity_digest(version: c_uint, unix_seconds: u64) -> Result<[u8; 16], CUresult> {
    use hmac::{Mac, SimpleHmac};
    // Versions ending in 0 and 1 are answered with fixed values (ZLUDA).
    let fixed = |first: u64| {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&first.to_ne_bytes());
        d[8..].copy_from_slice(&0x8ed3_83aa_1f4c_d1e8u64.to_ne_bytes());
        d
    };
    match version % 10 {
        0 => return Ok(fixed(0x3341_181c_03cb_675c)),
        1 => return Ok(fixed(0x1841_181c_03cb_675c)),
        _ => {}
    }
    let mut mac = SimpleHmac::<md2::Md2>::new_from_slice(&INTEGRITY_KEY)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    // The caller's view, as one C struct: four 32-bit words, three pointers, a 64-bit time.
    mac.update(&(crate::driver_version() as u32).to_ne_bytes());
    mac.update(&version.to_ne_bytes());
    mac.update(&std::process::id().to_ne_bytes());
    // SAFETY: pthread_self has no preconditions.
    mac.update(&(unsafe { libc::pthread_self() } as u32).to_ne_bytes());
    for address in [
        CUDART.0.as_ptr() as usize,
        INTEGRITY.0.as_ptr() as usize,
        INTEGRITY.0[1] as usize,
    ] {
        mac.update(&address.to_ne_bytes());
    }
    mac.update(&unix_seconds.to_ne_bytes());
    // Then each device: its UUID and PCI domain, bus and device (three 32-bit ints).
    let mut count = 0;
    // SAFETY: valid out pointers throughout.
    unsafe {
        check(crate::cuDeviceGetCount(&mut count))?;
        for dev in 0..count {
            let mut uuid = CuUuid { bytes: [0; 16] };
            check(crate::device::cuDeviceGetUuid(&mut uuid, dev))?;
            mac.update(&uuid.bytes);
            for attribute in [PCI_DOMAIN_ID, PCI_BUS_ID, PCI_DEVICE_ID] {
                let mut v = 0;
                check(crate::device::cuDeviceGetAttribute(&mut v, attribute, dev))?;
                mac.update(&v.to_ne_bytes());
            }
        }
    }
    Ok(mac.finalize().into_bytes().into())
}

// cuda.h's CUdevice_attribute values.
const PCI_BUS_ID: std::ffi::c_int = 33;
const PCI_DEVICE_ID: std::ffi::c_int = 34;
const PCI_DOMAIN_ID: std::ffi::c_int = 50;

fn check(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}
