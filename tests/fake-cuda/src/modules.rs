//! Modules, libraries, kernels and functions: what a program loads its device code through
//! (cuda.h "Module Management" and "Library Management"). The CUDA runtime loads the fat binaries
//! linked into a program with `cuLibraryLoadData` and finds a kernel with `cuLibraryGetKernel`
//! before its first launch; CuPy loads what NVRTC compiled with `cuModuleLoadData`. The fake runs
//! no code: it checks that an image is one of the formats the driver accepts, then finds every
//! name in it (it does not read symbol tables), so a launch reaches `cuLaunchKernel` with a valid
//! function handle and does no work. Handles are never reused, so one used after its unload stays
//! `CUDA_ERROR_INVALID_HANDLE`.

use crate::streams::CUDA_ERROR_INVALID_HANDLE;
use crate::{current, try_cu, CUdevice, CUresult, CUDA_ERROR_INVALID_VALUE, CUDA_SUCCESS};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

/// `CUDA_ERROR_INVALID_IMAGE`: "the kernel image is invalid".
const CUDA_ERROR_INVALID_IMAGE: CUresult = 200;
/// `CUDA_ERROR_FILE_NOT_FOUND`: "the file specified was not found".
const CUDA_ERROR_FILE_NOT_FOUND: CUresult = 301;

/// `CU_MODULE_EAGER_LOADING` and `CU_MODULE_LAZY_LOADING` (cuda.h `CUmoduleLoadingMode`).
const EAGER_LOADING: c_int = 1;
const LAZY_LOADING: c_int = 2;

/// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` (cuda.h `CUfunction_attribute`): the first
/// of the attributes `cuFuncSetAttribute` may set; those before it are properties of the code.
const MAX_DYNAMIC_SHARED_SIZE_BYTES: c_int = 8;
/// `CU_FUNC_ATTRIBUTE_MAX`: one past the last attribute.
const ATTRIBUTE_MAX: c_int = 16;

enum Object {
    Module,
    /// A library and the module it has in the context it was loaded in.
    Library {
        module: usize,
    },
    Kernel {
        library: usize,
        name: CString,
    },
    /// A function and the attributes set on it (`cuFuncSetAttribute`).
    Function {
        module: usize,
        name: CString,
        set: HashMap<c_int, c_int>,
    },
}

#[derive(Default)]
struct Objects {
    next: usize,
    live: HashMap<usize, Object>,
    /// The handle already handed out for a kernel or function name of a library or module: the
    /// driver returns the same one each time it is asked.
    named: HashMap<(usize, CString), usize>,
    /// Global variables handed out, by module and name: their device address.
    globals: HashMap<(usize, CString), u64>,
    next_global: u64,
}

/// Where globals' addresses start (apart from every allocator's range).
const GLOBALS_BASE: u64 = 0x5800_0000_0000;

impl Objects {
    fn add(&mut self, object: Object) -> usize {
        self.next += 0x10;
        let at = 0x6000_0000 + self.next;
        self.live.insert(at, object);
        at
    }

    fn named(&mut self, owner: usize, name: &CStr, make: impl FnOnce() -> Object) -> usize {
        let key = (owner, name.to_owned());
        if let Some(&at) = self.named.get(&key) {
            return at;
        }
        let at = self.add(make());
        self.named.insert(key, at);
        at
    }

    /// Forgets `owner` and every kernel, function or global named in it.
    fn unload(&mut self, owner: usize) {
        self.globals.retain(|(o, _), _| *o != owner);
        let gone: Vec<usize> = self
            .named
            .iter()
            .filter(|((o, _), _)| *o == owner)
            .map(|(_, &at)| at)
            .collect();
        for at in gone {
            self.live.remove(&at);
        }
        self.named.retain(|(o, _), _| *o != owner);
        self.live.remove(&owner);
    }
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

fn objects<R>(f: impl FnOnce(&mut Objects) -> R) -> R {
    f(OBJECTS.lock().get_or_insert_with(Objects::default))
}

/// Whether `image` starts as one of the formats cuda.h lists for `cuModuleLoadData` ("a cubin or
/// PTX or fatbin file ... passed as text strings, or ... a pointer to a cubin or fatbin"): an ELF
/// cubin, a fat binary (its header, or the `__fatBinC_Wrapper_t` that points at one), or PTX text.
unsafe fn is_image(image: *const c_void) -> bool {
    const ELF: [u8; 4] = *b"\x7fELF";
    /// `FATBIN_MAGIC` and `FATBINC_MAGIC` (fatbinary_section.h), little-endian.
    const FATBIN: [u8; 4] = 0xBA55_ED50u32.to_le_bytes();
    const FATBINC_WRAPPER: [u8; 4] = 0x4662_43B1u32.to_le_bytes();
    // SAFETY: every format is at least 4 bytes long; the caller passes an image.
    let head = unsafe { std::ptr::read_unaligned(image.cast::<[u8; 4]>()) };
    head == ELF
        || head == FATBIN
        || head == FATBINC_WRAPPER
        || head
            .iter()
            .all(|b| b.is_ascii_graphic() || b.is_ascii_whitespace())
}

unsafe fn load(out: *mut *mut c_void, image: *const c_void, library: bool) -> CUresult {
    if out.is_null() || image.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // A module is loaded into the current context (CUDA_ERROR_INVALID_CONTEXT without one); a
    // library is context-independent (cuda.h), so it needs only the driver initialised.
    if !library {
        try_cu!(current());
    } else {
        try_cu!(crate::state().map(drop));
    }
    // SAFETY: checked non-null; the caller passes an image.
    if !unsafe { is_image(image) } {
        return CUDA_ERROR_INVALID_IMAGE;
    }
    let handle = objects(|o| {
        let module = o.add(Object::Module);
        if library {
            o.add(Object::Library { module })
        } else {
            module
        }
    });
    // SAFETY: checked non-null.
    unsafe { *out = handle as *mut c_void };
    CUDA_SUCCESS
}

unsafe fn load_file(out: *mut *mut c_void, path: *const c_char, library: bool) -> CUresult {
    if path.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated path.
    let path = unsafe { CStr::from_ptr(path) }.to_string_lossy();
    match std::fs::read(&*path) {
        Ok(image) if image.len() >= 4 => {
            // SAFETY: `image` outlives the call and is at least 4 bytes.
            unsafe { load(out, image.as_ptr().cast(), library) }
        }
        Ok(_) => CUDA_ERROR_INVALID_IMAGE,
        Err(_) => CUDA_ERROR_FILE_NOT_FOUND,
    }
}

/// `cuModuleLoad`: "Takes a filename fname and loads the corresponding module module into the
/// current context"; CUDA_ERROR_FILE_NOT_FOUND when it cannot be read.
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoad(module: *mut *mut c_void, fname: *const c_char) -> CUresult {
    // SAFETY: same contract.
    unsafe { load_file(module, fname, false) }
}

/// `cuModuleLoadData`: "Takes a pointer image and loads the corresponding module module into the
/// current context".
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(
    module: *mut *mut c_void,
    image: *const c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { load(module, image, false) }
}

/// `cuModuleLoadDataEx`: as cuModuleLoadData, with JIT options (ignored: nothing is compiled).
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    _num_options: c_uint,
    _options: *mut c_int,
    _option_values: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { load(module, image, false) }
}

/// `cuModuleLoadFatBinary`: "Takes a pointer fatCubin and loads the corresponding module".
#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    module: *mut *mut c_void,
    fat_cubin: *const c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { load(module, fat_cubin, false) }
}

/// `cuModuleUnload`: "Unloads a module hmod from the current context"; its functions go with it.
#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> CUresult {
    unload(module, |o| matches!(o, Object::Module))
}

fn unload(handle: *mut c_void, is: impl Fn(&Object) -> bool) -> CUresult {
    objects(|o| {
        let Some(object) = o.live.get(&(handle as usize)) else {
            return CUDA_ERROR_INVALID_HANDLE;
        };
        if !is(object) {
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if let Object::Library { module } = *object {
            o.unload(module);
        }
        o.unload(handle as usize);
        CUDA_SUCCESS
    })
}

/// `cuModuleGetLoadingMode`: "Query lazy loading mode": lazy unless `CUDA_MODULE_LOADING=EAGER`
/// (lazy is the default since CUDA 12.2; CUDA C Programming Guide, Lazy Loading).
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut c_int) -> CUresult {
    if mode.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let eager = std::env::var("CUDA_MODULE_LOADING").is_ok_and(|m| m == "EAGER");
    // SAFETY: checked non-null.
    unsafe { *mode = if eager { EAGER_LOADING } else { LAZY_LOADING } };
    CUDA_SUCCESS
}

/// A name argument, or CUDA_ERROR_INVALID_VALUE for NULL.
unsafe fn name_arg<'a>(out: *mut *mut c_void, name: *const c_char) -> Result<&'a CStr, CUresult> {
    if out.is_null() || name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: checked non-null; the caller passes a NUL-terminated name.
    Ok(unsafe { CStr::from_ptr(name) })
}

/// `cuModuleGetFunction`: "Returns in *hfunc the handle of the function of name name located in
/// module hmod".
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    function: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> CUresult {
    // SAFETY: same contract.
    let name = try_cu!(unsafe { name_arg(function, name) });
    let module = module as usize;
    let found = objects(|o| match o.live.get(&module) {
        Some(Object::Module) => Ok(o.named(module, name, || function_of(module, name))),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    });
    // SAFETY: checked non-null by name_arg.
    unsafe { *function = try_cu!(found) as *mut c_void };
    CUDA_SUCCESS
}

fn function_of(module: usize, name: &CStr) -> Object {
    Object::Function {
        module,
        name: name.to_owned(),
        set: HashMap::new(),
    }
}

/// `cuLibraryLoadData`: "Load a library with specified code and options" (cubin, fatbin or PTX;
/// the options are ignored).
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadData(
    library: *mut *mut c_void,
    code: *const c_void,
    _jit_options: *mut c_int,
    _jit_option_values: *mut *mut c_void,
    _num_jit_options: c_uint,
    _library_options: *mut c_int,
    _library_option_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { load(library, code, true) }
}

/// `cuLibraryLoadFromFile`: as cuLibraryLoadData, from a file.
#[no_mangle]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    library: *mut *mut c_void,
    file_name: *const c_char,
    _jit_options: *mut c_int,
    _jit_option_values: *mut *mut c_void,
    _num_jit_options: c_uint,
    _library_options: *mut c_int,
    _library_option_values: *mut *mut c_void,
    _num_library_options: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { load_file(library, file_name, true) }
}

/// `cuLibraryUnload`: "Unloads the library specified with library"; its kernels go with it.
#[no_mangle]
pub extern "C" fn cuLibraryUnload(library: *mut c_void) -> CUresult {
    unload(library, |o| matches!(o, Object::Library { .. }))
}

/// `cuLibraryGetKernel`: "Returns in pKernel the handle of the kernel with name name located in
/// library library".
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetKernel(
    kernel: *mut *mut c_void,
    library: *mut c_void,
    name: *const c_char,
) -> CUresult {
    // SAFETY: same contract.
    let name = try_cu!(unsafe { name_arg(kernel, name) });
    let library = library as usize;
    let found = objects(|o| match o.live.get(&library) {
        Some(Object::Library { .. }) => Ok(o.named(library, name, || Object::Kernel {
            library,
            name: name.to_owned(),
        })),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    });
    // SAFETY: checked non-null by name_arg.
    unsafe { *kernel = try_cu!(found) as *mut c_void };
    CUDA_SUCCESS
}

/// `cuLibraryGetModule`: "Returns in pMod the module handle associated with the current context
/// located in library library".
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetModule(
    module: *mut *mut c_void,
    library: *mut c_void,
) -> CUresult {
    if module.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    try_cu!(current());
    let found = objects(|o| match o.live.get(&(library as usize)) {
        Some(&Object::Library { module }) => Ok(module),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    });
    // SAFETY: checked non-null.
    unsafe { *module = try_cu!(found) as *mut c_void };
    CUDA_SUCCESS
}

/// `cuKernelGetFunction`: "Returns in pFunc the handle of the function for the requested kernel
/// kernel and the current context": the function of that name in the library's module.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetFunction(
    function: *mut *mut c_void,
    kernel: *mut c_void,
) -> CUresult {
    if function.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    try_cu!(current());
    let found = objects(|o| match o.live.get(&(kernel as usize)) {
        Some(Object::Kernel { .. }) => kernel_function(o, kernel as usize),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    });
    // SAFETY: checked non-null.
    unsafe { *function = try_cu!(found) as *mut c_void };
    CUDA_SUCCESS
}

/// The function of kernel `kernel`: the one of that name in its library's module.
fn kernel_function(o: &mut Objects, kernel: usize) -> Result<usize, CUresult> {
    let Some(Object::Kernel { library, name }) = o.live.get(&kernel) else {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    };
    let (library, name) = (*library, name.clone());
    let Some(&Object::Library { module }) = o.live.get(&library) else {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    };
    Ok(o.named(module, &name, || function_of(module, &name)))
}

/// What a function's code reports for an attribute the caller did not set: a kernel of the fake
/// device (compute capability 8.6, as `cuDeviceGetAttribute` says) that uses no memory of its own.
fn default_attribute(attribute: c_int) -> c_int {
    match attribute {
        0 => 1024,   // MAX_THREADS_PER_BLOCK
        4 => 16,     // NUM_REGS
        5 | 6 => 86, // PTX_VERSION, BINARY_VERSION: major * 10 + minor
        9 => -1,     // PREFERRED_SHARED_MEMORY_CARVEOUT: no preference
        _ => 0,      // sizes, cache mode, dynamic shared memory, cluster attributes
    }
}

/// The function a handle names (a CUkernel stands for its function in the current context, as
/// cuda.h lets launch and attribute calls take either).
fn with_function<R>(
    handle: *mut c_void,
    f: impl FnOnce(&mut HashMap<c_int, c_int>, &CStr) -> R,
) -> Result<R, CUresult> {
    objects(|o| {
        let at = match o.live.get(&(handle as usize)) {
            Some(Object::Function { .. }) => handle as usize,
            Some(Object::Kernel { .. }) => kernel_function(o, handle as usize)?,
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        match o.live.get_mut(&at) {
            Some(Object::Function { set, name, .. }) => Ok(f(set, name)),
            _ => Err(CUDA_ERROR_INVALID_HANDLE),
        }
    })
}

unsafe fn get_attribute(value: *mut c_int, attribute: c_int, handle: *mut c_void) -> CUresult {
    if value.is_null() || !(0..ATTRIBUTE_MAX).contains(&attribute) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let v = try_cu!(with_function(handle, |set, _| {
        set.get(&attribute)
            .copied()
            .unwrap_or_else(|| default_attribute(attribute))
    }));
    // SAFETY: checked non-null.
    unsafe { *value = v };
    CUDA_SUCCESS
}

fn set_attribute(handle: *mut c_void, attribute: c_int, value: c_int) -> CUresult {
    // The attributes before MAX_DYNAMIC_SHARED_SIZE_BYTES are read-only properties of the code.
    if !(MAX_DYNAMIC_SHARED_SIZE_BYTES..ATTRIBUTE_MAX).contains(&attribute) {
        return CUDA_ERROR_INVALID_VALUE;
    }
    try_cu!(with_function(handle, |set, _| set.insert(attribute, value)));
    CUDA_SUCCESS
}

/// `cuFuncGetAttribute`: "Returns in *pi the integer value of the attribute attrib on the kernel
/// given by hfunc".
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    function: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_attribute(value, attribute, function) }
}

/// `cuFuncSetAttribute`: "This function sets the attributes of a function"; only the settable
/// ones (dynamic shared memory, carveout, cluster attributes).
#[no_mangle]
pub extern "C" fn cuFuncSetAttribute(
    function: *mut c_void,
    attribute: c_int,
    value: c_int,
) -> CUresult {
    set_attribute(function, attribute, value)
}

/// `cuKernelGetAttribute`: "Returns information about a kernel" on device `dev`.
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetAttribute(
    value: *mut c_int,
    attribute: c_int,
    kernel: *mut c_void,
    _dev: CUdevice,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_attribute(value, attribute, kernel) }
}

/// `cuKernelSetAttribute`: "Sets information about a kernel" (the fake has one device's worth).
#[no_mangle]
pub extern "C" fn cuKernelSetAttribute(
    attribute: c_int,
    value: c_int,
    kernel: *mut c_void,
    _dev: CUdevice,
) -> CUresult {
    set_attribute(kernel, attribute, value)
}

/// `cuFuncSetCacheConfig`: "Sets the preferred cache configuration for a device function" (a
/// preference: nothing to change in the fake).
#[no_mangle]
pub extern "C" fn cuFuncSetCacheConfig(function: *mut c_void, _config: c_int) -> CUresult {
    with_function(function, |_, _| CUDA_SUCCESS).unwrap_or_else(|e| e)
}

/// `cuKernelSetCacheConfig`: as cuFuncSetCacheConfig, for a kernel on a device.
#[no_mangle]
pub extern "C" fn cuKernelSetCacheConfig(
    kernel: *mut c_void,
    _config: c_int,
    _dev: CUdevice,
) -> CUresult {
    with_function(kernel, |_, _| CUDA_SUCCESS).unwrap_or_else(|e| e)
}

unsafe fn get_name(out: *mut *const c_char, handle: *mut c_void) -> CUresult {
    if out.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // The name lives as long as its function (the handle map keeps it until the unload).
    let name = try_cu!(with_function(handle, |_, name| name.as_ptr()));
    // SAFETY: checked non-null.
    unsafe { *out = name };
    CUDA_SUCCESS
}

/// `cuFuncGetName`: "Returns the function name for a CUfunction handle".
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetName(
    name: *mut *const c_char,
    function: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_name(name, function) }
}

/// `cuKernelGetName`: "Returns the function name for a CUkernel handle".
#[no_mangle]
pub unsafe extern "C" fn cuKernelGetName(
    name: *mut *const c_char,
    kernel: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_name(name, kernel) }
}

/// `cuFuncGetModule`: "Returns in *hmod the handle of the module that function hfunc is located in".
#[no_mangle]
pub unsafe extern "C" fn cuFuncGetModule(
    module: *mut *mut c_void,
    function: *mut c_void,
) -> CUresult {
    if module.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let found = objects(|o| match o.live.get(&(function as usize)) {
        Some(&Object::Function { module, .. }) => Ok(module),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    });
    // SAFETY: checked non-null.
    unsafe { *module = try_cu!(found) as *mut c_void };
    CUDA_SUCCESS
}

/// Size the fake gives every global variable: it cannot read a variable's size from the image.
const GLOBAL_BYTES: u64 = 256;

/// The global variable containing `ptr`: its start and size (memsets and copies may target one).
pub fn global_at(ptr: u64) -> Option<(u64, u64)> {
    objects(|o| crate::containing(o.globals.values().map(|&at| (at, GLOBAL_BYTES)), ptr))
}

unsafe fn get_global(
    ptr: *mut u64,
    bytes: *mut usize,
    owner: *mut c_void,
    name: *const c_char,
    library: bool,
) -> CUresult {
    if name.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    try_cu!(current());
    // SAFETY: checked non-null; the caller passes a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(name) };
    let owner = owner as usize;
    let found = objects(|o| {
        let module = match o.live.get(&owner) {
            Some(&Object::Library { module }) if library => module,
            Some(Object::Module) if !library => owner,
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        };
        let key = (module, name.to_owned());
        if let Some(&at) = o.globals.get(&key) {
            return Ok(at);
        }
        // Addresses are never reused, like handles.
        let at = GLOBALS_BASE + o.next_global * GLOBAL_BYTES;
        o.next_global += 1;
        o.globals.insert(key, at);
        Ok(at)
    });
    let at = try_cu!(found);
    // SAFETY: each written only when non-null ("dptr ... bytes ... if NULL, it is ignored").
    unsafe {
        if !ptr.is_null() {
            *ptr = at;
        }
        if !bytes.is_null() {
            *bytes = GLOBAL_BYTES as usize;
        }
    }
    CUDA_SUCCESS
}

/// `cuModuleGetGlobal_v2`: "Returns in *dptr and *bytes the base pointer and size of the global
/// of name name located in module hmod"; both outputs optional.
#[no_mangle]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    ptr: *mut u64,
    bytes: *mut usize,
    module: *mut c_void,
    name: *const c_char,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_global(ptr, bytes, module, name, false) }
}

/// `cuLibraryGetGlobal`: "Returns in *dptr and *bytes the base pointer and size of the global with
/// name name for the requested library library and the current context".
#[no_mangle]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    ptr: *mut u64,
    bytes: *mut usize,
    library: *mut c_void,
    name: *const c_char,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { get_global(ptr, bytes, library, name, true) }
}
