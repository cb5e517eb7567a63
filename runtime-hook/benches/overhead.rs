//! Per-call cost the hook adds: cuLaunchKernel and cuMemAlloc_v2+cuMemFree_v2 straight into the fake
//! driver vs. through libvgpu.so's exports, in one process and one run.
//!
//! ```text
//! cargo build --release -p vgpu-runtime-hook -p fake_cuda
//! mkdir -p bench && cp target/release/libfake_cuda.so bench/libcuda.so.1
//! LD_LIBRARY_PATH=bench CUDA_DEVICE_MEMORY_LIMIT=1g CUDA_DEVICE_MEMORY_SHARED_CACHE=bench/acct \
//!   cargo bench -p vgpu-runtime-hook --bench overhead -- target/release/libvgpu.so
//! ```
#![allow(unsafe_code, clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::ffi::{c_int, c_uint, c_void, CString};
use std::time::Instant;

type Init = unsafe extern "C" fn(c_uint) -> c_int;
type Ctx = unsafe extern "C" fn(*mut *mut c_void, c_uint, c_int) -> c_int;
type Alloc = unsafe extern "C" fn(*mut u64, usize) -> c_int;
type Free = unsafe extern "C" fn(u64) -> c_int;
type Launch = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> c_int;

unsafe fn sym<T>(h: *mut c_void, name: &str) -> T {
    let n = CString::new(name).unwrap();
    // SAFETY (bench): the library exports `name` with signature T.
    let p = unsafe { libc::dlsym(h, n.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    unsafe { std::mem::transmute_copy(&p) }
}

fn per_call(n: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

fn main() {
    let hook_path = std::env::args()
        .skip(1)
        .find(|a| a.ends_with(".so"))
        .expect("pass the path of libvgpu.so");
    unsafe {
        let real = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW);
        assert!(
            !real.is_null(),
            "libcuda.so.1 (the fake) not on LD_LIBRARY_PATH"
        );
        let hp = CString::new(hook_path).unwrap();
        let hook = libc::dlopen(hp.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
        assert!(!hook.is_null(), "cannot load the hook");
        let mut ctx = std::ptr::null_mut();
        assert_eq!(sym::<Init>(hook, "cuInit")(0), 0);
        assert_eq!(sym::<Ctx>(real, "cuCtxCreate_v2")(&mut ctx, 0, 0), 0);
        let n = 2_000_000;
        let mut rows = Vec::new();
        for (what, h) in [("direct", real), ("hook", hook)] {
            let launch: Launch = sym(h, "cuLaunchKernel");
            let alloc: Alloc = sym(h, "cuMemAlloc_v2");
            let free: Free = sym(h, "cuMemFree_v2");
            let p = std::ptr::null_mut();
            let l = per_call(n, || {
                launch(1 as _, 1, 1, 1, 1, 1, 1, 0, p, p as _, p as _);
            });
            let a = per_call(n / 4, || {
                let mut d = 0u64;
                alloc(&mut d, 4096);
                free(d);
            });
            rows.push((what, l, a));
        }
        println!(
            "{:<8} {:>14} {:>20}",
            "path", "launch ns/call", "alloc+free ns/pair"
        );
        for (w, l, a) in &rows {
            println!("{w:<8} {l:>14.1} {a:>20.1}");
        }
        println!(
            "added    {:>14.1} {:>20.1}",
            rows[1].1 - rows[0].1,
            rows[1].2 - rows[0].2
        );
    }
}
