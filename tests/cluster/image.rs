//! The CUDA test image, made here without pulling anything: the probe (tests/hook/probe.c) linked
//! against the fake libcuda and fake NVML, installed as `libcuda.so.1` and `libnvidia-ml.so.1`
//! where the driver's libraries live, with the C libraries they need. Nothing of vgpu's is in it:
//! the container gets libvgpu.so, `/etc/ld.so.preload` and the limits file only from the device
//! plugin's Allocate.

use crate::kube::CONTAINERD_SOCKET;
use crate::sh;
use std::path::Path;
use std::process::Command;

/// The image's name (imported into containerd's k8s.io namespace; pods use `imagePullPolicy: Never`).
pub const PROBE_IMAGE: &str = "local/vgpu-probe:cluster-tier";
/// Where the driver's libraries live in the image (the loader's default multiarch directory).
const DRIVER_DIR: &str = "usr/lib/x86_64-linux-gnu";

/// Builds the probe image in `work` and imports it into the node's containerd.
pub fn build_and_import(work: &Path) {
    let script = vgpu_tests::repo_root().join("docker/local-images.sh");
    let root = work.join("rootfs");
    let driver = root.join(DRIVER_DIR);
    std::fs::create_dir_all(&driver).expect("mkdir rootfs");
    std::fs::create_dir_all(root.join("bin")).expect("mkdir rootfs/bin");
    std::fs::create_dir_all(root.join("tmp")).expect("mkdir rootfs/tmp");
    let cuda = driver.join("libcuda.so.1");
    let nvml = driver.join("libnvidia-ml.so.1");
    std::fs::copy(vgpu_tests::cdylib("fake_cuda"), &cuda).expect("copy fake libcuda");
    std::fs::copy(vgpu_tests::cdylib("fake_nvml"), &nvml).expect("copy fake NVML");
    // The fakes have no SONAME, so the probe records the names it is linked with: link against
    // `libcuda.so.1` itself (`-l:`), as a program built with the driver's libraries records it.
    let link = work.join("link");
    std::fs::create_dir_all(&link).expect("mkdir link");
    for (name, target) in [("libcuda.so.1", &cuda), ("libnvidia-ml.so.1", &nvml)] {
        let _ = std::fs::remove_file(link.join(name));
        std::os::unix::fs::symlink(target, link.join(name)).expect("symlink");
    }
    let probe = root.join("bin/probe");
    sh(Command::new("cc")
        .arg("-o")
        .arg(&probe)
        .arg(vgpu_tests::repo_root().join("tests/hook/probe.c"))
        .arg("-L")
        .arg(&link)
        .args([
            "-l:libcuda.so.1",
            "-l:libnvidia-ml.so.1",
            "-ldl",
            "-lpthread",
        ]));
    // The C libraries of the probe, the fakes and the hook the device plugin will mount.
    sh(Command::new(&script)
        .arg("libs")
        .arg(&root)
        .arg(&probe)
        .arg(&cuda)
        .arg(&nvml)
        .arg(vgpu_tests::cdylib("vgpu")));
    let archive = work.join("probe.tar");
    sh(Command::new(&script)
        .arg("rootfs")
        .arg(&root)
        .arg(PROBE_IMAGE)
        .arg(r#"{"Entrypoint":["/bin/probe"],"Env":["PATH=/bin"]}"#)
        .arg(&archive));
    sh(Command::new(&script)
        .arg("import")
        .arg(&archive)
        .env("CONTAINERD_ADDRESS", CONTAINERD_SOCKET));
}

/// The Python test image: the interpreter of `.ci/tools/cuda12` (NVIDIA's `cuda-bindings` 12.9 and
/// `nvidia-ml-py` from PyPI, what `.ci/install-tools` installs) with its standard library, those
/// packages, the fakes as the driver's libraries, and `tests/python/`'s checks in `/checks`. As the
/// probe image, nothing of vgpu's: the hook and the limits come from the device plugin.
pub const PYTHON_IMAGE: &str = "local/vgpu-python:cluster-tier";

/// Where the checks are in the Python image, and the site-packages it adds to the path.
pub const CHECKS_DIR: &str = "/checks";
const SITE_DIR: &str = "/opt/cuda12/site-packages";

/// Builds the Python image in `work` and imports it; `None` (with the reason printed) when this
/// machine has no `.ci/tools/cuda12` and `VGPU_REQUIRE_PYTHON` is not set.
pub fn build_and_import_python(work: &Path) -> Option<()> {
    let venv_python = vgpu_tests::repo_root().join(".ci/tools/cuda12/bin/python");
    if !venv_python.exists() {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PYTHON").is_none(),
            "VGPU_REQUIRE_PYTHON is set but {} does not exist; run .ci/install-tools",
            venv_python.display()
        );
        crate::report("real CUDA user space: SKIPPED (no .ci/tools/cuda12; run .ci/install-tools)");
        return None;
    }
    // The interpreter's own layout: its prefix (standard library), its site-packages (the
    // venv's), its real binary.
    let facts = sh(Command::new(&venv_python).args([
        "-c",
        "import os, sys, site; print(sys.base_prefix); print(site.getsitepackages()[0]); \
         print(os.path.realpath(sys.executable)); print('python%d.%d' % sys.version_info[:2])",
    ]));
    let facts: Vec<&str> = facts.lines().collect();
    let [prefix, site, exe, version] = facts[..] else {
        panic!("python image: unexpected interpreter facts {facts:?}");
    };
    let root = work.join("python-rootfs");
    let _ = std::fs::remove_dir_all(&root);
    let stdlib = format!("{prefix}/lib/{version}");
    std::fs::create_dir_all(root.join(stdlib.trim_start_matches('/'))).expect("mkdir stdlib");
    std::fs::create_dir_all(root.join(SITE_DIR.trim_start_matches('/'))).expect("mkdir site");
    std::fs::create_dir_all(root.join("tmp")).expect("mkdir tmp");
    std::fs::create_dir_all(root.join(CHECKS_DIR.trim_start_matches('/'))).expect("mkdir checks");
    let copy = |from: &str, to: &Path, excludes: &[&str]| {
        let mut tar = format!("tar -C {from} -cf -");
        for e in excludes {
            tar.push_str(&format!(" --exclude={e}"));
        }
        sh(Command::new("sh")
            .arg("-c")
            .arg(format!("{tar} . | tar -C {} -xf -", to.display())));
    };
    copy(
        &stdlib,
        &root.join(stdlib.trim_start_matches('/')),
        &[
            "./test",
            "./site-packages",
            "__pycache__",
            "./idlelib",
            "./tkinter",
            "./turtledemo",
            "./ensurepip",
            "./lib2to3",
            "./config-*",
            "./pydoc_data",
        ],
    );
    copy(
        site,
        &root.join(SITE_DIR.trim_start_matches('/')),
        // CuPy (and its numpy) run in the suite only; the pod runs cuda-bindings and NVML.
        &["__pycache__", "pip", "pip-*", "./cupy*", "./numpy*"],
    );
    let bin = root.join(exe.trim_start_matches('/'));
    std::fs::create_dir_all(bin.parent().expect("bin dir")).expect("mkdir bin");
    std::fs::copy(exe, &bin).expect("copy the interpreter");
    for check in [
        "checks.py",
        "driver_checks.py",
        "runtime_checks.py",
        "nvml_checks.py",
    ] {
        std::fs::copy(
            vgpu_tests::repo_root().join("tests/python").join(check),
            root.join(CHECKS_DIR.trim_start_matches('/')).join(check),
        )
        .expect("copy a check");
    }
    let driver = root.join(DRIVER_DIR);
    std::fs::create_dir_all(&driver).expect("mkdir driver dir");
    let cuda = driver.join("libcuda.so.1");
    let nvml = driver.join("libnvidia-ml.so.1");
    std::fs::copy(vgpu_tests::cdylib("fake_cuda"), &cuda).expect("copy fake libcuda");
    std::fs::copy(vgpu_tests::cdylib("fake_nvml"), &nvml).expect("copy fake NVML");
    // The C libraries of the interpreter, its extension modules, the packages' and the fakes'.
    let modules = sh(Command::new("find")
        .arg(&root)
        .args(["-name", "*.so", "-o", "-name", "*.so.*"]));
    // And what a package opens by name at run time: cuda-pathfinder dlopens libdl through ctypes.
    let libdl = sh(Command::new("sh")
        .arg("-c")
        .arg(r#"ldconfig -p | awk '$1 == "libdl.so.2" && /x86-64/ {print $NF; exit}'"#));
    let libdl = libdl.trim();
    assert!(
        !libdl.is_empty(),
        "python image: ldconfig does not know libdl.so.2"
    );
    let to = root.join(libdl.trim_start_matches('/'));
    std::fs::create_dir_all(to.parent().expect("lib dir")).expect("mkdir lib dir");
    std::fs::copy(libdl, &to).expect("copy libdl");
    let mut needs: Vec<String> = modules.lines().map(String::from).collect();
    needs.push(bin.display().to_string());
    needs.push(vgpu_tests::cdylib("vgpu").display().to_string());
    let script = vgpu_tests::repo_root().join("docker/local-images.sh");
    sh(Command::new(&script).arg("libs").arg(&root).args(&needs));
    let config = serde_json::json!({
        "Entrypoint": [exe],
        "Env": [format!("PYTHONHOME={prefix}"), format!("PYTHONPATH={SITE_DIR}"),
            "PYTHONDONTWRITEBYTECODE=1", "PATH=/bin"],
    });
    let archive = work.join("python.tar");
    sh(Command::new(&script)
        .arg("rootfs")
        .arg(&root)
        .arg(PYTHON_IMAGE)
        .arg(config.to_string())
        .arg(&archive));
    sh(Command::new(&script)
        .arg("import")
        .arg(&archive)
        .env("CONTAINERD_ADDRESS", CONTAINERD_SOCKET));
    Some(())
}
