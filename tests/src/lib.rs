//! Support shared by every test in `tests/`: finding the real binaries, running them as child
//! processes that die with the test, temporary directories, polling with a deadline, and test
//! certificates.
//!
//! The doubles themselves (fake libcuda, fake NVML, fake kubelet, fake API server) live in their own
//! crates beside this one so that each can be loaded the way the real thing is (a cdylib through
//! `dlopen`, a server on a socket).

pub mod admission;
pub mod certs;
pub mod fixtures;
pub mod helm;
pub mod https;
pub mod kube_scheduler;
pub mod net;
pub mod process;
pub mod recorder;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The cargo target directory's profile folder (`target/debug`), derived from the running test
/// executable (`target/debug/deps/integration-…`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

/// Builds every binary and library of the workspace once per test process, so tests always run the
/// code they were compiled with (cargo only builds a package's own binaries for its tests).
///
/// `--tests` is not for the test targets: it makes cargo resolve features the way `cargo test
/// --workspace` does (dev-dependencies' features included), so this build reuses the artifacts the
/// test run just made instead of compiling a second copy of every dependency.
pub fn ensure_built() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = std::process::Command::new(cargo);
        cmd.args(["build", "--workspace", "--bins", "--lib", "--tests"]);
        // Cargo gives a test process the variables it sets for a compiling crate (CARGO_MANIFEST_DIR,
        // CARGO_PKG_*, OUT_DIR, ...). Build scripts that read them (ring's reads CARGO_MANIFEST_DIR)
        // are tracked on them, so passing them on would make this build recompile half the tree.
        for (key, _) in std::env::vars_os() {
            let key = key.to_string_lossy();
            if key.starts_with("CARGO_PKG_")
                || key.starts_with("CARGO_BIN_")
                || key.starts_with("CARGO_MANIFEST_")
                || matches!(
                    key.as_ref(),
                    "CARGO_CRATE_NAME"
                        | "CARGO_PRIMARY_PACKAGE"
                        | "CARGO_TARGET_TMPDIR"
                        | "OUT_DIR"
                        | "CARGO_RUSTC_CURRENT_DIR"
                )
            {
                cmd.env_remove(key.as_ref());
            }
        }
        if profile_dir().ends_with("release") {
            cmd.arg("--release");
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("workspace root");
        let status = cmd
            .current_dir(workspace)
            .status()
            .expect("run cargo build");
        assert!(status.success(), "cargo build --workspace failed: {status}");
    });
}

/// Path of a workspace binary (`vgpu-webhook`), built if needed.
pub fn binary(name: &str) -> PathBuf {
    ensure_built();
    let p = profile_dir().join(name);
    assert!(
        p.exists(),
        "binary {} not found after cargo build",
        p.display()
    );
    p
}

/// Path of a workspace cdylib by crate name (`fake_cuda` -> `libfake_cuda.so`), built if needed.
pub fn cdylib(crate_name: &str) -> PathBuf {
    ensure_built();
    let p = profile_dir().join(format!("lib{crate_name}.so"));
    assert!(
        p.exists(),
        "library {} not found after cargo build",
        p.display()
    );
    p
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Polls `f` every few milliseconds until it returns `Some` or `timeout` passes.
pub fn wait_for<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Async twin of [`wait_for`].
pub async fn wait_for_async<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Raises this process's soft open-file limit to the hard one, so a test can hold a thousand
/// connections under a 1024 default soft limit. Returns the soft limit now.
pub fn raise_nofile_limit() -> u64 {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let cur = getrlimit(Resource::Nofile);
    let target = cur.maximum.unwrap_or(1 << 20);
    if cur.current.is_some_and(|c| c < target) {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(target),
                maximum: cur.maximum,
            },
        )
        .expect("raise RLIMIT_NOFILE");
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

/// The checks `tests/python/driver_checks.py` prints, in order (`ok NAME`): the in-process suite
/// (tests/it/python.rs) and the real-cluster tier expect all of them.
pub const PYTHON_DRIVER_CHECKS: &[&str] = &[
    "init",
    "device",
    "cuMemAlloc",
    "streams",
    "cuMemAllocAsync",
    "pools",
    "pool-reserve",
    "vmm-device",
    "vmm-mapped",
    "vmm-segments",
    "vmm-export",
    "vmm-host",
    "managed",
    "modules",
];

/// The checks `tests/python/runtime_checks.py` prints, in order (the suite and the tier).
pub const PYTHON_RUNTIME_CHECKS: &[&str] = &[
    "runtime-init",
    "runtime-malloc",
    "runtime-malloc-async",
    "runtime-managed",
];

/// The checks `tests/python/cupy_checks.py` prints, in order.
pub const PYTHON_CUPY_CHECKS: &[&str] = &["cupy-init", "cupy-pool", "cupy-async-pool"];

/// The checks `tests/python/nvml_checks.py` prints, in order.
pub const PYTHON_NVML_CHECKS: &[&str] = &[
    "nvml-init",
    "nvml-memory",
    "nvml-processes",
    "nvml-processes-v1",
];

/// The checks `tests/python/torch_checks.py` prints, in order, with cudaMalloc segments and with
/// `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`.
pub const PYTHON_TORCH_CHECKS: &[&str] = &["torch-init", "torch-allocator", "torch-kernels"];
pub const PYTHON_TORCH_EXPANDABLE_CHECKS: &[&str] = &[
    "torch-expandable-init",
    "torch-expandable-allocator",
    "torch-expandable-kernels",
];
