//! Real CUDA user space from PyPI through `libvgpu.so`: NVIDIA's `cuda-bindings` (12.9 and 13.x,
//! the driver and runtime modules), `nvidia-ml-py`, CuPy and PyTorch, over the fake `libcuda.so.1`
//! and `libnvidia-ml.so.1`. The Python side is `tests/python/*.py`; each check prints `ok NAME`.
//!
//! The interpreters are virtual environments `.ci/install-tools` makes (`.ci/tools/cuda12`,
//! `.ci/tools/cuda13`, `.ci/tools/torch`), or `$VGPU_PYTHON_CUDA12`, `$VGPU_PYTHON_CUDA13`,
//! `$VGPU_PYTHON_TORCH`. Without them the tests say SKIPPED and pass, unless `VGPU_REQUIRE_PYTHON`
//! is set (CI): then a missing interpreter, like a missing entry point in the fakes, is a failure.

use std::path::PathBuf;
use std::process::Command;

/// The slice every check runs under, MiB.
const CAP_MIB: u64 = 1024;

/// An environment's interpreter and the driver version the fake then claims.
struct Python {
    exe: PathBuf,
    driver_version: &'static str,
}

/// The interpreter of environment `env` (`cuda12`, `cuda13`, `torch`: PyTorch's wheels are CUDA 13).
fn python(env: &str) -> Option<Python> {
    let exe = std::env::var_os(format!("VGPU_PYTHON_{}", env.to_uppercase()))
        .map(PathBuf::from)
        .unwrap_or_else(|| vgpu_tests::repo_root().join(format!(".ci/tools/{env}/bin/python")));
    if !exe.exists() {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PYTHON").is_none(),
            "VGPU_REQUIRE_PYTHON is set but {} does not exist; run .ci/install-tools",
            exe.display()
        );
        eprintln!(
            "SKIPPED: no Python environment {env} ({}); run .ci/install-tools",
            exe.display()
        );
        return None;
    }
    let driver_version = if env == "cuda12" { "12090" } else { "13000" };
    Some(Python {
        exe,
        driver_version,
    })
}

/// A directory with the fakes as the driver's and NVML's sonames, and the hook.
struct Fakes {
    dir: tempfile::TempDir,
    hook: PathBuf,
}

impl Fakes {
    fn new() -> Fakes {
        let dir = tempfile::tempdir().expect("tempdir");
        for (lib, soname) in [
            ("fake_cuda", "libcuda.so.1"),
            ("fake_nvml", "libnvidia-ml.so.1"),
        ] {
            std::fs::copy(vgpu_tests::cdylib(lib), dir.path().join(soname)).expect("copy fake");
        }
        Fakes {
            dir,
            hook: vgpu_tests::cdylib("vgpu"),
        }
    }

    /// Runs `script` under the hook with the slice: its stdout and stderr, or a panic naming the
    /// check that failed (the script's traceback).
    fn run(&self, py: &Python, script: &str, vars: &[(&str, &str)]) -> (String, String) {
        let cache = self
            .dir
            .path()
            .join(format!("acct-{script}-{}/vgpu.cache", vars.len()));
        let mut cmd = Command::new(&py.exe);
        cmd.arg(script_path(script))
            .arg(CAP_MIB.to_string())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", self.dir.path())
            .env("LD_PRELOAD", &self.hook)
            .env("FAKE_CUDA_DRIVER_VERSION", py.driver_version)
            .env("CUDA_DEVICE_MEMORY_LIMIT", format!("{CAP_MIB}m"))
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", &cache);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().expect("run python");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{script} under {} ({vars:?}) failed after:\n{stdout}\n{stderr}",
            py.exe.display()
        );
        (stdout, stderr)
    }
}

fn script_path(name: &str) -> PathBuf {
    vgpu_tests::repo_root().join("tests/python").join(name)
}

fn assert_checks(stdout: &str, want: &[&str], what: &str) {
    let done: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("ok "))
        .collect();
    assert_eq!(done, want, "{what}: the checks that passed");
}

fn driver_api_is_capped_on_every_path(major: u32) {
    let Some(py) = python(&format!("cuda{major}")) else {
        return;
    };
    let fakes = Fakes::new();
    for vars in [
        &[][..],
        // cuda-bindings then asks cuGetProcAddress for the per-thread default stream entries.
        &[("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")][..],
    ] {
        let (stdout, stderr) = fakes.run(&py, "driver_checks.py", vars);
        assert_checks(
            &stdout,
            vgpu_tests::PYTHON_DRIVER_CHECKS,
            &format!("cuda-bindings {major} {vars:?}"),
        );
        assert!(
            !stderr.contains("vgpu:"),
            "cuda-bindings {major}: the hook complained:\n{stderr}"
        );
    }
}

#[test]
fn cuda_bindings_12_driver_api_is_capped_on_every_path() {
    driver_api_is_capped_on_every_path(12);
}

#[test]
fn cuda_bindings_13_driver_api_is_capped_on_every_path() {
    driver_api_is_capped_on_every_path(13);
}

#[test]
fn nvidia_ml_py_reports_the_slice() {
    let Some(py) = python("cuda12") else {
        return;
    };
    // Another tenant's process on the GPU: NVML lists it, the container must not see it.
    let (stdout, _) = Fakes::new().run(
        &py,
        "nvml_checks.py",
        &[("FAKE_NVML_CONFIG", r#"{"otherTenantUtilization": 10}"#)],
    );
    assert_checks(&stdout, vgpu_tests::PYTHON_NVML_CHECKS, "nvidia-ml-py");
}

/// The CUDA runtime (cudart, linked into cuda-bindings' runtime module as into CuPy and PyTorch)
/// over the fake: it asks the driver for its internal tables by UUID (`cuGetExportTable`,
/// undocumented; the fake's come from ZLUDA's public layouts), then allocates through the hook,
/// capped on each path. The tables it asks are pinned, so a cudart that asks for another shows
/// here.
#[test]
fn the_cuda_runtime_is_capped_on_every_path() {
    for (major, tables) in [(12, &CUDART_TABLES[..]), (13, &CUDART_13_5_TABLES[..])] {
        let Some(py) = python(&format!("cuda{major}")) else {
            continue;
        };
        let (stdout, stderr) =
            Fakes::new().run(&py, "runtime_checks.py", &[("FAKE_CUDA_TRACE", "1")]);
        assert_checks(
            &stdout,
            vgpu_tests::PYTHON_RUNTIME_CHECKS,
            &format!("cudart {major}"),
        );
        assert_eq!(
            export_tables_asked(&stderr),
            tables,
            "cudart {major}: the export tables it asks for"
        );
        assert!(
            !stderr.contains("vgpu:"),
            "cudart {major}: the hook complained:\n{stderr}"
        );
    }
}

/// The export tables a process asked for, as the fake's trace prints them.
fn export_tables_asked(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("fake-cuda: cuGetExportTable "))
        .collect()
}

/// What cudart 12.9 and 13.2 (PyTorch's) ask for.
const CUDART_TABLES: [&str; 7] = [
    "f8cff95121468b4eb9e2fb469e7c0dd9: NOT PROVIDED",
    "6bd5fb6c5bf4e74a8987d93912fd9df9: CUDART_INTERFACE",
    "a094798c2e742e7493f20800200c0a66: TOOLS_RUNTIME_CALLBACK_HOOKS",
    "42d85a8123f6cb478298f6e78a3aecdc: TOOLS_TLS",
    "c693336e1121df11a8c368f355d89593: CONTEXT_LOCAL_STORAGE",
    "263e88607cd2614392f6bbd5006dfa7e: CONTEXT_CHECKS",
    "d4082055bde6704b8d34ba123c66e1f2: INTEGRITY_CHECK",
];

/// What cudart 13.5 asks for: the tools context table too.
const CUDART_13_5_TABLES: [&str; 8] = [
    "f8cff95121468b4eb9e2fb469e7c0dd9: NOT PROVIDED",
    "6bd5fb6c5bf4e74a8987d93912fd9df9: CUDART_INTERFACE",
    "a094798c2e742e7493f20800200c0a66: TOOLS_RUNTIME_CALLBACK_HOOKS",
    "42d85a8123f6cb478298f6e78a3aecdc: TOOLS_TLS",
    "21318c60971432488ca641ff7324c8f2: TOOLS_CONTEXT",
    "c693336e1121df11a8c368f355d89593: CONTEXT_LOCAL_STORAGE",
    "263e88607cd2614392f6bbd5006dfa7e: CONTEXT_CHECKS",
    "d4082055bde6704b8d34ba123c66e1f2: INTEGRITY_CHECK",
];

/// CuPy (cupy-cuda12x, installed beside cuda-bindings 12.9; its cudart linked in): its default
/// pool and its stream-ordered pool are capped at the slice, and freeing their blocks gives the
/// memory back.
#[test]
fn cupy_is_capped() {
    let Some(py) = python("cuda12") else {
        return;
    };
    let (stdout, stderr) = Fakes::new().run(&py, "cupy_checks.py", &[]);
    assert_checks(&stdout, vgpu_tests::PYTHON_CUPY_CHECKS, "CuPy");
    assert!(
        !stderr.contains("vgpu:"),
        "CuPy: the hook complained:\n{stderr}"
    );
}

/// PyTorch (torch 2.15, CUDA 13 wheels, its own cudart 13.2): `torch.cuda.mem_get_info` shows the
/// slice and the caching allocator raises `OutOfMemoryError` past it, with cudaMalloc segments and
/// with expandable segments (cuMemCreate and cuMemMap into one reservation); its kernels load
/// through the library API and launch. What it asks of the driver at start (the export tables,
/// then every entry point its driver-API table names, NVML's out-of-memory report) comes with it.
#[test]
fn pytorch_is_capped() {
    let Some(py) = python("torch") else {
        return;
    };
    let fakes = Fakes::new();
    for (vars, want) in [
        (&[][..], vgpu_tests::PYTHON_TORCH_CHECKS),
        (
            &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")][..],
            vgpu_tests::PYTHON_TORCH_EXPANDABLE_CHECKS,
        ),
    ] {
        let vars = [vars, &[("FAKE_CUDA_TRACE", "1")]].concat();
        let (stdout, stderr) = fakes.run(&py, "torch_checks.py", &vars);
        assert_checks(&stdout, want, &format!("PyTorch {vars:?}"));
        assert_eq!(
            export_tables_asked(&stderr),
            CUDART_TABLES,
            "PyTorch's cudart 13.2: the export tables it asks for"
        );
        assert!(
            !stderr.contains("vgpu:"),
            "PyTorch: the hook complained:\n{stderr}"
        );
    }
}
