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

mod dra;
mod faults;
mod fixtures;
mod image;
mod install;
mod journey;
mod kube;
mod parts;
mod scale;
mod two_nodes;

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
    let python_image = image::build_and_import_python(work.path()).is_some();
    {
        // The parts as host processes, then (dropped) gone before the Helm install.
        let mut parts = parts::Parts::prepare(&cluster);
        parts.start_device_plugin();
        parts.start_scheduler();
        parts.start_webhook();
        let mut j = journey::Journey::new(&mut parts);
        j.python_image = python_image;
        j.run();
        faults::run(&mut j);
        j.cleanup();
        scale::tier_step(j.parts);
        dra::run(j.parts);
        two_nodes::run(j.parts, &work.path().join("probe.tar"));
    }
    install::run(&cluster, work.path());
    report(&format!("passed in {:.0?}", started.elapsed()));
}

/// The DRA journey alone (step 10 of `real_cluster`), for working on DRA mode:
/// `VGPU_CLUSTER=$HOME/kube-local cargo test -p vgpu-tests --test cluster dra_journey -- --ignored`.
#[test]
#[ignore = "a part of real_cluster; run with --ignored"]
fn dra_journey() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    install::clean_slate(&cluster);
    let work = tempfile::Builder::new()
        .prefix("vgpu-cluster-")
        .tempdir()
        .expect("tempdir");
    image::build_and_import(work.path());
    let mut parts = parts::Parts::prepare(&cluster);
    dra::run(&mut parts);
}

/// Both modes on two nodes alone (step 11 of `real_cluster`, after the DRA journey it follows):
/// `VGPU_CLUSTER=$HOME/kube-local VGPU_CLUSTER_SCRIPTS=../shared/kube cargo test -p vgpu-tests
/// --test cluster two_nodes_journey -- --ignored`.
#[test]
#[ignore = "a part of real_cluster; run with --ignored"]
fn two_nodes_journey() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    install::clean_slate(&cluster);
    let work = tempfile::Builder::new()
        .prefix("vgpu-cluster-")
        .tempdir()
        .expect("tempdir");
    image::build_and_import(work.path());
    let mut parts = parts::Parts::prepare(&cluster);
    let helm = vgpu_tests::helm::helm().expect("helm");
    parts.switch_chart(vgpu_tests::helm::Chart::render(
        &helm,
        "1.36.2",
        &["dra.enabled=true", "dra.gpuCdiKind="],
    ));
    parts.start_webhook();
    parts.start_scheduler();
    two_nodes::run(&mut parts, &work.path().join("probe.tar"));
}

/// The scale benchmark (docs/BENCHMARKS.md, "Scale through the real kube-scheduler"): run on
/// demand, in release, against the same disposable cluster as the tier:
///
/// ```sh
/// VGPU_CLUSTER=$HOME/kube-local cargo test --release -p vgpu-tests --test cluster \
///     scale_benchmark -- --ignored --nocapture
/// ```
///
/// `VGPU_SCALE_NODES` (5000), `VGPU_SCALE_VGPU_PODS` (10000), `VGPU_SCALE_PLAIN_PODS` (10000),
/// `VGPU_SCALE_DRA_PODS` (10000: claims of class `gpu.vgpu.io` from templates; every simulated
/// node also gets its DRA plugin's ResourceSlice),
/// `VGPU_SCALE_IN_FLIGHT` (32) size it; `VGPU_SCALE_FILL=1` adds vGPU pods until the cluster's
/// GPUs are asked for once over and reports the allocation reached against `vgpu-sim`'s; `VGPU_SCALE_QPS` and `VGPU_SCALE_BURST` set
/// kube-scheduler's clientConnection (the chart sets none: kube-scheduler's defaults, 50 and 100);
/// `VGPU_SCALE_CHART_SET` (`a=b,c=d`) renders the chart with other values.
/// It fails when a pod is not bound, a bind fails or a GPU is over-committed; the rates are
/// printed, not checked.
#[test]
#[ignore = "a benchmark: minutes, needs VGPU_CLUSTER; run with --ignored"]
fn scale_benchmark() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let env = |name: &str, default: usize| -> usize {
        std::env::var(name)
            .ok()
            .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}={v}: {e}")))
            .unwrap_or(default)
    };
    let mut connection = serde_json::Map::new();
    for (var, key) in [("VGPU_SCALE_QPS", "qps"), ("VGPU_SCALE_BURST", "burst")] {
        if std::env::var_os(var).is_some() {
            connection.insert(key.into(), serde_json::json!(env(var, 0)));
        }
    }
    let connection = serde_json::Value::Object(connection);
    let size = scale::Size {
        nodes: env("VGPU_SCALE_NODES", 5000),
        vgpu_pods: env("VGPU_SCALE_VGPU_PODS", 10_000),
        plain_pods: env("VGPU_SCALE_PLAIN_PODS", 10_000),
        dra_pods: env("VGPU_SCALE_DRA_PODS", 10_000),
        in_flight: env("VGPU_SCALE_IN_FLIGHT", 32),
        fill: env("VGPU_SCALE_FILL", 0) > 0,
        phase_limit: std::time::Duration::from_secs(env("VGPU_SCALE_PHASE_LIMIT_S", 600) as u64),
        client_connection: if connection.as_object().is_some_and(|c| !c.is_empty()) {
            connection.to_string()
        } else {
            scale::CHART_CONNECTION.into()
        },
    };
    let mut parts = parts::Parts::prepare(&cluster);
    if let Ok(sets) = std::env::var("VGPU_SCALE_CHART_SET") {
        // The chart rendered with other values (`scheduler.extender.chooseNode=false`).
        let sets: Vec<&str> = sets.split(',').collect();
        let helm = vgpu_tests::helm::helm().expect("helm");
        parts.chart = vgpu_tests::helm::Chart::render(&helm, "1.36.2", &sets);
    }
    parts.start_scheduler_with(&connection);
    parts.start_webhook();
    let report = scale::run(&parts, &size);
    let errors = report.errors();
    assert!(errors.is_empty(), "scale benchmark: {errors:#?}");
}
