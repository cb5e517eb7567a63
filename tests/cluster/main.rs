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
mod journey;
mod kube;
mod parts;

use kube::Cluster;

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
    fixtures::check_against_the_real_components(&cluster);
    let mut parts = parts::Parts::prepare(&cluster);
    image::build_and_import(parts.tmp.path());
    parts.start_device_plugin();
    parts.start_scheduler();
    parts.start_webhook();
    let mut j = journey::Journey::new(&mut parts);
    j.run();
    faults::run(&mut j);
    j.cleanup();
    report(&format!("passed in {:.0?}", started.elapsed()));
}
