//! The real-cluster tier: vgpu's parts against a real Kubernetes (kube-apiserver, kube-scheduler,
//! kubelet, containerd), only the GPU replaced by the fake NVML and fake libcuda.
//!
//! Runs when `VGPU_CLUSTER` names a disposable single-node cluster on this machine (a kube-local
//! install, `../shared/kube/up.sh --node`); otherwise it prints how to enable it and passes, unless
//! `VGPU_REQUIRE_CLUSTER` is set (CI). docs/cluster-tests.md says what each step proves.
//!
//! One test, its steps in order: they share one cluster, and each builds on the state the previous
//! one left (a pod running, a quota half used). Every assertion names the step and the part whose
//! answer disagreed.

mod faults;
mod fixtures;
mod image;
mod install;
mod journey;
mod kube;
mod parts;

use kube::Cluster;

/// Runs `cmd`, panicking with its output when it fails; its stdout.
pub fn sh(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Prints a line of the tier's report even when the test passes (libtest captures `eprintln!`,
/// not writes to the stderr handle itself).
pub fn report(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "cluster tier: {line}");
}

#[test]
fn real_cluster() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let started = std::time::Instant::now();
    install::clean_slate(&cluster);
    fixtures::check_against_the_real_components(&cluster);
    let work = tempfile::Builder::new()
        .prefix("vgpu-cluster-")
        .tempdir()
        .expect("tempdir");
    image::build_and_import(work.path());
    {
        // The parts as host processes, then (dropped) gone before the Helm install.
        let mut parts = parts::Parts::prepare(&cluster);
        parts.start_device_plugin();
        parts.start_scheduler();
        parts.start_webhook();
        let mut j = journey::Journey::new(&mut parts);
        j.run();
        faults::run(&mut j);
        j.cleanup();
    }
    install::run(&cluster, work.path());
    report(&format!("passed in {:.0?}", started.elapsed()));
}
