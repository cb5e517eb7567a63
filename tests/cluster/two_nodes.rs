//! Step 11: both modes in one cluster, on two real nodes. The kube-local second node (`vm-2`, its
//! own kubelet and containerd) joins; `vm` runs the device plugin, `vm-2` the DRA plugin (in
//! node 2's mount namespace, so it registers with node 2's kubelet and writes node 2's CDI specs).
//! A pod written for HAMi runs on `vm` in a device-plugin namespace and on `vm-2` in a DRA
//! namespace, each capped at what it asked; one gpumem quota counts a device-plugin pod on `vm` and
//! a DRA pod on `vm-2` together and refuses the next of either kind. Node 2 leaves at the end.

use crate::dra::{capped_in, dra_pod, template, HOLD};
use crate::kube::{Cluster, WAIT};
use crate::parts::Parts;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Device-plugin mode namespace with a gpumem quota of 8192 MiB.
pub const NS_DP: &str = "vgpu-tier-two";
/// DRA mode namespace.
pub const NS_DRA: &str = "vgpu-tier-two-dra";
/// Node 2's mount namespace (kube-local's `node2-up.sh`).
const NODE2_MOUNT_NS: &str = "/run/kube-local/node2/ns/mnt";
/// Node 2's containerd.
const NODE2_CONTAINERD: &str = "/run/kube-local/node2/containerd/containerd.sock";
/// Node 2's one GPU.
const NODE2_GPU: &str = "GPU-c1a55e00-0000-4000-8000-000000000002";

fn script(scripts: &Path, name: &str, args: &[&str]) {
    let out = Command::new("bash")
        .arg(scripts.join(name))
        .args(args)
        .output()
        .expect("run a kube-local script");
    assert!(
        out.status.success(),
        "{name} {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Node 2 while it runs: stopped (`down.sh --node2`) when dropped, also when a step fails, so the
/// cluster is back to one node for the next run.
struct Node2 {
    scripts: PathBuf,
}

impl Node2 {
    fn up(scripts: &Path) -> Node2 {
        script(scripts, "node2-up.sh", &[]);
        Node2 {
            scripts: scripts.to_path_buf(),
        }
    }
}

impl Drop for Node2 {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(self.scripts.join("down.sh"))
            .arg("--node2")
            .output();
    }
}

/// SIGTERM, as the kubelet stops a DaemonSet pod: the plugin removes its sockets and exits.
fn stop_cleanly(mut plugin: crate::parts::DevicePlugin) {
    let _ = Command::new("kill")
        .args(["-TERM", &plugin.proc.pid().to_string()])
        .status();
    assert!(
        plugin
            .proc
            .wait_exit(std::time::Duration::from_secs(10))
            .is_some(),
        "node 2's DRA plugin did not stop at SIGTERM"
    );
}

fn ready(c: &Cluster, node: &str) -> bool {
    c.get(&["node", node]).is_some_and(|n| {
        n["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// The node a pod runs on.
fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

/// `vgpu_scheduler_requests_total{verb="dra-prioritize",result="ok"}` of the tier's
/// vgpu-scheduler (0 before the first call).
fn dra_prioritize_calls(parts: &Parts<'_>) -> u64 {
    let metrics = parts
        .scheduler
        .as_ref()
        .map(|s| s.metrics)
        .expect("vgpu-scheduler");
    let body = crate::journey::http_get(metrics, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    body.lines()
        .find_map(|l| {
            l.strip_prefix("vgpu_scheduler_requests_total{verb=\"dra-prioritize\",result=\"ok\"} ")
        })
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// The tier's report line, with the seconds since step 11 began.
fn report(line: &str) {
    crate::report(&format!("[{:>5.1} s] {line}", since_start().as_secs_f64()));
}

fn since_start() -> std::time::Duration {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed()
}

/// Step 11; `probe_archive`: the probe image's archive, imported into node 2's containerd.
pub fn run(parts: &mut Parts<'_>, probe_archive: &Path) {
    let c = parts.cluster;
    let step = "step 11 (both modes on two nodes)";
    let Some(scripts) = std::env::var_os("VGPU_CLUSTER_SCRIPTS").map(PathBuf::from) else {
        report(&format!("{step}: skipped (set VGPU_CLUSTER_SCRIPTS to the kube-local scripts, e.g. ../shared/kube)"));
        return;
    };
    let started = std::time::Instant::now();
    since_start();
    let node2 = format!("{}-2", c.node);
    // A registration socket left by a plugin killed in an earlier run would make node 2's kubelet
    // drop the new plugin's registration once when it replaces the socket (the kubelet
    // unregisters by driver name), failing a prepare in that moment; the plugin removes its
    // sockets when it stops cleanly, as below.
    let _ = std::fs::remove_file(
        c.dir
            .join("node2/host/var/lib/kubelet/plugins_registry/gpu.vgpu.io-reg.sock"),
    );
    let node2_up = Node2::up(&scripts);
    vgpu_tests::wait_for(WAIT, &format!("{step}: node {node2} Ready"), || {
        ready(c, &node2).then_some(())
    });
    let import = Command::new(vgpu_tests::repo_root().join("docker/local-images.sh"))
        .arg("import")
        .arg(probe_archive)
        .env("CONTAINERD_ADDRESS", NODE2_CONTAINERD)
        .output()
        .expect("import the probe image into node 2");
    assert!(import.status.success(), "{step}: {import:?}");
    report(&format!(
        "two nodes: {node2} joined in {:.0?}",
        started.elapsed()
    ));

    c.kubectl(&[
        "label",
        "node",
        &node2,
        "gpu=on",
        "vgpu.io/mode=dra",
        "--overwrite",
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    c.apply(&parts.chart.get("DeviceClass", "gpu.vgpu.io").to_string());
    let t = std::time::Instant::now();
    parts.start_device_plugin();
    report(&format!(
        "two nodes: device plugin on vm in {:.0?}",
        t.elapsed()
    ));
    let dra2 = parts.dra_plugin_on(&node2, NODE2_GPU, Path::new(NODE2_MOUNT_NS));
    let slice = format!("{node2}-gpu.vgpu.io");
    vgpu_tests::wait_for(WAIT, &format!("{step}: ResourceSlice {slice}"), || {
        let s = c.get(&["resourceslice", &slice])?;
        (s["spec"]["devices"][0]["attributes"]["uuid"]["string"] == NODE2_GPU).then_some(())
    });
    report(&format!(
        "two nodes: the DRA plugin on {node2} published {slice}"
    ));

    c.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_DP,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted", "vgpu": "enabled"}}},
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpumem", "namespace": NS_DP},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "8192"}}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_DRA,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted", "vgpu": "enabled",
                    "vgpu.io/mode": "dra"}}}]})
        .to_string(),
    );
    let hami = |name: &str, mib: u64| {
        crate::journey::probe_pod(
            name,
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()}),
            &HOLD,
        )
    };

    let step = "step 11a (a pod written for HAMi: device plugin on vm, DRA on vm-2)";
    c.create_in(NS_DP, hami("hami-dp", 4096))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    c.create_in(NS_DRA, hami("hami-dra", 2048))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    let dp = c.wait_running(NS_DP, "hami-dp", step);
    let on_dra = c.wait_running(NS_DRA, "hami-dra", step);
    assert_eq!(node_of(&dp), c.node, "{step}: hami-dp");
    assert_eq!(node_of(&on_dra), node2, "{step}: hami-dra");
    assert_eq!(
        on_dra["spec"]["containers"][0]["resources"]["claims"],
        json!([{"name": "vgpu-main"}]),
        "{step}: {on_dra}"
    );
    capped_in(c, NS_DP, "hami-dp", 4096, step);
    capped_in(c, NS_DRA, "hami-dra", 2048, step);
    report(&format!(
        "two nodes: the same HAMi pod spec ran in device-plugin mode on {} (4096 MiB) and in DRA mode on {node2} (2048 MiB), both capped",
        c.node
    ));

    let step = "step 11b (one gpumem quota over a device-plugin pod on vm and a DRA pod on vm-2)";
    let mut t = template("slice-2g", 2048, 0);
    t["metadata"]["namespace"] = json!(NS_DP);
    c.create(&t).unwrap_or_else(|e| panic!("{step}: {e}"));
    let mut claim_pod = dra_pod("claim-2g", "slice-2g", &HOLD);
    claim_pod["metadata"]["namespace"] = json!(NS_DP);
    c.create(&claim_pod)
        .unwrap_or_else(|e| panic!("{step}: 4096 + 2048 of 8192: {e}"));
    let running = c.wait_running(NS_DP, "claim-2g", step);
    assert_eq!(node_of(&running), node2, "{step}: claim-2g");
    let want = |mib: u64| {
        format!("vgpu quota exceeded in namespace {NS_DP}: ResourceQuota gpumem limits.nvidia.com/gpumem: requested {mib} MiB (1 GPU x {mib}), used 6144, hard 8192")
    };
    let err = c.create_in(NS_DP, hami("hami-dp-2", 4096)).expect_err(step);
    assert!(
        err.contains(&want(4096)),
        "{step}: the device-plugin pod: {err}"
    );
    let mut t = template("slice-4g", 4096, 0);
    t["metadata"]["namespace"] = json!(NS_DP);
    c.create(&t).unwrap_or_else(|e| panic!("{step}: {e}"));
    let mut big = dra_pod("claim-4g", "slice-4g", &HOLD);
    big["metadata"]["namespace"] = json!(NS_DP);
    let err = c.create(&big).expect_err(step);
    assert!(err.contains(&want(4096)), "{step}: the DRA pod: {err}");
    let note = vgpu_tests::wait_for(WAIT, &format!("{step}: claim-4g's Event"), || {
        c.events(NS_DP)
            .into_iter()
            .find(|(o, r, _)| o == "claim-4g" && r == "VGPUQuotaExceeded")
            .map(|(_, _, m)| m)
    });
    assert_eq!(note, want(4096), "{step}");
    report(&format!("two nodes: one quota over both modes: {note}"));

    let step = "step 11c (both nodes in DRA mode: vgpu-scheduler scores the nodes for a DRA pod)";
    let t = std::time::Instant::now();
    parts.stop_device_plugin();
    parts.start_dra_plugin();
    report(&format!(
        "two nodes: vm switched to DRA mode in {:.0?}",
        t.elapsed()
    ));
    let calls = || dra_prioritize_calls(parts);
    let before = calls();
    c.create_in(NS_DRA, hami("hami-dra-2", 2048))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    let t = std::time::Instant::now();
    let placed = c.wait_running(NS_DRA, "hami-dra-2", step);
    report(&format!(
        "two nodes: hami-dra-2 running in {:.0?}",
        t.elapsed()
    ));
    let after = calls();
    assert!(
        after > before,
        "{step}: kube-scheduler had two DRA nodes to choose from and did not ask vgpu-scheduler's /dra/prioritize ({before} -> {after} calls)"
    );
    report(&format!(
        "two nodes: with both in DRA mode, vgpu-scheduler scored the nodes for a DRA pod ({} call(s)); it runs on {}",
        after - before,
        node_of(&placed)
    ));

    let t = std::time::Instant::now();
    c.delete(&["namespace", NS_DP, NS_DRA]);
    report(&format!(
        "two nodes: namespaces deleted in {:.0?}",
        t.elapsed()
    ));
    stop_cleanly(dra2);
    parts.dra = None;
    let t = std::time::Instant::now();
    drop(node2_up);
    report(&format!("two nodes: {node2} down in {:.0?}", t.elapsed()));
    let t = std::time::Instant::now();
    c.delete(&["resourceslice", &slice]);
    c.delete(&["deviceclass", "gpu.vgpu.io"]);
    report(&format!(
        "two nodes: slice and class deleted in {:.0?}",
        t.elapsed()
    ));
    report(&format!("two nodes passed in {:.0?}", started.elapsed()));
}
