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
