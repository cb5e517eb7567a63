//! Per-call cost the hook adds: cuLaunchKernel and cuMemAlloc_v2+cuMemFree_v2 straight into the fake
//! driver vs. through libvgpu.so's exports, in one process and one run. The bench runs itself once
//! per hook configuration (the hook reads its configuration once per process) and per hook build
//! given (pass two `.so` paths to compare builds under the same load); each child pins itself to
//! one CPU, measures the direct calls and the hooked calls alternately in 101 short rounds of
//! thread CPU time, and reports the best round of each and the median difference.
//!
//! ```text
//! cargo build --release -p vgpu-runtime-hook -p fake_cuda -p fake_nvml
//! mkdir -p $T/bench/nvml && cp $T/release/libfake_cuda.so $T/bench/libcuda.so.1
//! cp $T/release/libfake_nvml.so $T/bench/nvml/libnvidia-ml.so.1
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

/// The calling thread's CPU time in ns: time the thread was descheduled (the machine is shared)
/// does not count.
fn cpu_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

fn per_call(n: u64, mut f: impl FnMut()) -> f64 {
    for _ in 0..n / 10 {
        f();
    }
    let t = cpu_ns();
    for _ in 0..n {
        f();
    }
    (cpu_ns() - t) as f64 / n as f64
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

/// Rounds each child measures, alternating direct and hooked calls (each round: `CALLS` launches,
/// `CALLS / 4` alloc+free pairs, after a warm-up of a tenth of that). Rounds are short (a few ms,
/// under one scheduler time slice) and many, so the best ones ran undisturbed on a shared machine.
const ROUNDS: usize = 101;
const CALLS: u64 = 100_000;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hooks: Vec<String> = args
        .iter()
        .filter(|a| a.ends_with(".so"))
        .cloned()
        .collect();
    assert!(
        !hooks.is_empty(),
        "pass the path of libvgpu.so (or several, to compare builds)"
    );
    if let Ok(v) = std::env::var("VGPU_BENCH_CHILD") {
        child(&hooks[0], &v);
        return;
    }
    let nvml = std::env::var("VGPU_BENCH_NVML").ok();
    let lib_path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    println!(
        "{:<22} {:>4} | {:>6} {:>6} {:>6} {:>6} {:>5} | {:>6} {:>6} {:>6} {:>6} {:>5}",
        "hook configuration",
        "hook",
        "launch",
        "direct",
        "added",
        "a.med",
        "ratio",
        "alloc",
        "direct",
        "added",
        "a.med",
        "ratio"
    );
    for (name, vars, needs_nvml) in VARIANTS {
        // Several builds of the hook: one child each, back to back, so they see the same load.
        for (i, hook) in hooks.iter().enumerate() {
            let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
            cmd.arg(hook).env("VGPU_BENCH_CHILD", name);
            if *needs_nvml {
                let Some(dir) = &nvml else {
                    println!(
                        "{name:<22} skipped: set VGPU_BENCH_NVML to the fake NVML's directory"
                    );
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
            let (hl, dl, ml, ha, da, ma) = (v[0], v[1], v[2], v[3], v[4], v[5]);
            println!(
                "{name:<22} {i:>4} | {hl:>6.1} {dl:>6.1} {:>6.1} {ml:>6.1} {:>5.2} | {ha:>6.1} {da:>6.1} {:>6.1} {ma:>6.1} {:>5.2}",
                hl - dl,
                hl / dl,
                ha - da,
                ha / da
            );
        }
    }
    println!(
        "(thread CPU ns per launch / per alloc+free pair, best of {ROUNDS} alternating rounds; added = \
         best hooked - best direct; a.med = median over the rounds of hooked - direct; ratio = best \
         hooked / best direct, same process)"
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Pins the calling thread to the CPU it runs on, so the rounds do not migrate between CPUs.
fn pin() {
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu >= 0 {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu as usize, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// Measures one configuration; prints "best_hooked_launch best_direct_launch median_added_launch
/// best_hooked_alloc best_direct_alloc median_added_alloc".
fn child(hook_path: &str, name: &str) {
    pin();
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
        let p = std::ptr::null_mut();
        if name.contains("rate set") {
            // Let the watcher see utilization and set the bucket's rate (its period is 50 ms).
            let launch: Launch = sym(hook, "cuLaunchKernel");
            let t = Instant::now();
            while t.elapsed().as_millis() < 300 {
                launch(1 as _, 1, 1, 1, 1, 1, 1, 0, p, p as _, p as _);
            }
        }
        // Per round: [hooked launch, direct launch, hooked alloc, direct alloc].
        let mut rounds: Vec<[f64; 4]> = Vec::new();
        for _ in 0..ROUNDS {
            let mut r = [0.0; 4];
            for (i, h) in [hook, real].into_iter().enumerate() {
                let launch: Launch = sym(h, "cuLaunchKernel");
                let alloc: Alloc = sym(h, "cuMemAlloc_v2");
                let free: Free = sym(h, "cuMemFree_v2");
                r[i] = per_call(CALLS, || {
                    launch(1 as _, 1, 1, 1, 1, 1, 1, 0, p, p as _, p as _);
                });
                r[2 + i] = per_call(CALLS / 4, || {
                    let mut d = 0u64;
                    alloc(&mut d, 4096);
                    free(d);
                });
            }
            rounds.push(r);
        }
        let col = |i: usize| rounds.iter().map(|r| r[i]).fold(f64::MAX, f64::min);
        let added = |i: usize| median(rounds.iter().map(|r| r[i] - r[i + 1]).collect());
        println!(
            "{} {} {} {} {} {}",
            col(0),
            col(1),
            added(0),
            col(2),
            col(3),
            added(2)
        );
    }
}
