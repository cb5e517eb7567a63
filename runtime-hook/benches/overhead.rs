//! Per-call cost the hook adds: cuLaunchKernel and cuMemAlloc_v2+cuMemFree_v2 straight into the fake
//! driver vs. through libvgpu.so's exports, in one process and one run. The bench runs itself once
//! per hook configuration (the hook reads its configuration once per process); each child measures
//! the direct calls and the hooked calls alternately, three rounds, and keeps each one's best round.
//!
//! ```text
//! cargo build --release -p vgpu-runtime-hook -p fake_cuda -p fake_nvml_util
//! mkdir -p $T/bench/nvml && cp $T/release/libfake_cuda.so $T/bench/libcuda.so.1
//! cp $T/release/libfake_nvml_util.so $T/bench/nvml/libnvidia-ml.so.1
//! LD_LIBRARY_PATH=$T/bench VGPU_BENCH_NVML=$T/bench/nvml CUDA_DEVICE_MEMORY_LIMIT=1g \
//!   CUDA_DEVICE_MEMORY_SHARED_CACHE=$T/bench/acct \
//!   cargo bench -p vgpu-runtime-hook --bench overhead -- $T/release/libvgpu.so
//! ```
//! (`$T` is the cargo target directory, as an absolute path.)
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

/// A hook configuration, run in its own process: (name, extra environment, needs the fake NVML).
type Variant = (&'static str, &'static [(&'static str, &'static str)], bool);

const VARIANTS: &[Variant] = &[
    ("no core limit", &[], false),
    // The throttle path runs; without NVML the bucket never gets a rate, so no launch waits.
    (
        "SM limit 50, no NVML",
        &[("CUDA_DEVICE_SM_LIMIT", "50")],
        false,
    ),
    // The watcher sets a rate from the fake NVML's utilization; the launch rate stays below it (the
    // fake GPU takes 5 ns a block), so no launch waits, and the prepaid tokens are bought in 1 ms
    // batches.
    (
        "SM limit 90, rate set",
        &[("CUDA_DEVICE_SM_LIMIT", "90"), ("FAKE_CUDA_BLOCK_NS", "5")],
        true,
    ),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hook_path = args
        .iter()
        .find(|a| a.ends_with(".so"))
        .expect("pass the path of libvgpu.so")
        .clone();
    if let Ok(v) = std::env::var("VGPU_BENCH_CHILD") {
        child(&hook_path, &v);
        return;
    }
    let nvml = std::env::var("VGPU_BENCH_NVML").ok();
    let lib_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    println!(
        "{:<22} {:>9} {:>9} {:>8} {:>7} | {:>9} {:>9} {:>8} {:>7}",
        "hook configuration",
        "launch",
        "direct",
        "added",
        "ratio",
        "alloc+fr",
        "direct",
        "added",
        "ratio"
    );
    for (name, vars, needs_nvml) in VARIANTS {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(&args).env("VGPU_BENCH_CHILD", name);
        if *needs_nvml {
            let Some(dir) = &nvml else {
                println!("{name:<22} skipped: set VGPU_BENCH_NVML to the fake NVML's directory");
                continue;
            };
            cmd.env("LD_LIBRARY_PATH", format!("{lib_path}:{dir}"));
        }
        for (k, v) in *vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{name}: {out:?}");
        let line = String::from_utf8_lossy(&out.stdout);
        let v: Vec<f64> = line
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        let (hl, dl, ha, da) = (v[0], v[1], v[2], v[3]);
        println!(
            "{name:<22} {hl:>9.1} {dl:>9.1} {:>8.1} {:>7.2} | {ha:>9.1} {da:>9.1} {:>8.1} {:>7.2}",
            hl - dl,
            hl / dl,
            ha - da,
            ha / da
        );
    }
    println!("(ns per call / per alloc+free pair; ratio = hooked / direct in the same process)");
}

/// Measures one configuration; prints "hooked_launch direct_launch hooked_alloc direct_alloc".
fn child(hook_path: &str, name: &str) {
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
        let p = std::ptr::null_mut();
        if name.contains("rate set") {
            // Let the watcher see utilization and set the bucket's rate (its period is 50 ms).
            let launch: Launch = sym(hook, "cuLaunchKernel");
            let t = Instant::now();
            while t.elapsed().as_millis() < 300 {
                launch(1 as _, 1, 1, 1, 1, 1, 1, 0, p, p as _, p as _);
            }
        }
        let mut best = [f64::MAX; 4];
        for _ in 0..3 {
            for (i, h) in [hook, real].into_iter().enumerate() {
                let launch: Launch = sym(h, "cuLaunchKernel");
                let alloc: Alloc = sym(h, "cuMemAlloc_v2");
                let free: Free = sym(h, "cuMemFree_v2");
                let l = per_call(n, || {
                    launch(1 as _, 1, 1, 1, 1, 1, 1, 0, p, p as _, p as _);
                });
                let a = per_call(n / 4, || {
                    let mut d = 0u64;
                    alloc(&mut d, 4096);
                    free(d);
                });
                best[i] = best[i].min(l);
                best[2 + i] = best[2 + i].min(a);
            }
        }
        println!("{} {} {} {}", best[0], best[1], best[2], best[3]);
    }
}
