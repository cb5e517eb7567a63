//! The real `vgpu-scheduler` binary against the fake API server (through a kubeconfig, so kube-rs
//! runs its real list/watch, patch and subresource code), driven the way kube-scheduler drives an
//! extender: `POST /filter`, `/prioritize`, `/bind` with extender v1 JSON over plain HTTP.
//!
//! Covers: inventory and heartbeat from node annotations (stale and missing nodes left out with a
//! reason), usage from vGPU pods' assignment annotations, bind writing the assignment then the
//! Binding, rollback when either API call fails, two pods in flight never given the same memory,
//! capacity freed when a pod is deleted, `/readyz` following the watches (unsynced after a failed
//! watch, ready again by itself after a re-list), and `/metrics` through promtool.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use vgpu_core::annotations::{
    ASSIGNMENT, DEVICE_CORDON, MANAGED_LABEL, NODE_DEVICES, NODE_HEARTBEAT, ROOM_CHANGED,
};
use vgpu_core::assignment::PodAssignment;
use vgpu_core::inventory::{DeviceInfo, NodeInventory};
use vgpu_core::time::format_rfc3339;
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::kube_scheduler;
use vgpu_tests::net::{addr_after, http};
use vgpu_tests::process::Running;

const WAIT: Duration = Duration::from_secs(20);

pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

pub(crate) fn node(name: &str, gpus: &[(&str, u64)], heartbeat: Option<u64>) -> Value {
    let inv = NodeInventory::new(
        gpus.iter()
            .enumerate()
            .map(|(i, (uuid, mib))| DeviceInfo {
                uuid: uuid.to_string(),
                index: i as u32,
                model: "NVIDIA A10".into(),
                memory_mib: *mib,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect(),
    );
    let mut ann = json!({NODE_DEVICES: inv.encode()});
    if let Some(t) = heartbeat {
        ann[NODE_HEARTBEAT] = format_rfc3339(t).into();
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann}})
}

pub(crate) fn pod(name: &str, mib: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "labels": {MANAGED_LABEL: "true"}},
        "spec": {"schedulerName": "vgpu-scheduler", "containers": [{"name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string()}}}]}})
}

pub(crate) struct Scheduler {
    proc: Running,
    api: SocketAddr,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

/// Starts the real binary on ephemeral ports against `api`, and waits for /readyz.
pub(crate) async fn start(api: &FakeApiServer, extra: &[&str]) -> Scheduler {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let mut cmd = Command::new(vgpu_tests::binary("vgpu-scheduler"));
    cmd.args([
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        "--scheduler-name=vgpu-scheduler",
        "--node-policy=binpack",
        "--gpu-policy=spread",
        "--heartbeat-timeout-seconds=600",
    ])
    .args(extra)
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .env_remove("KUBERNETES_SERVICE_HOST");
    let mut proc = Running::spawn("vgpu-scheduler", cmd);
    let api_addr = addr_after(&proc.wait_for_line(WAIT, |l| l.contains("extender listening")));
    let metrics = addr_after(&proc.wait_for_line(WAIT, |l| l.contains("metrics listening")));
    vgpu_tests::wait_for_async(WAIT, "/readyz", || async {
        (http(metrics, "GET", "/readyz", "").await.0 == 200).then_some(())
    })
    .await;
    Scheduler {
        proc,
        api: api_addr,
        metrics,
        _dir: dir,
    }
}

impl Scheduler {
    async fn call(&self, verb: &str, body: Value) -> Value {
        let (status, text) = http(self.api, "POST", verb, &body.to_string()).await;
        assert_eq!(status, 200, "{verb}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{verb}: {e}: {text}"))
    }

    pub(crate) async fn filter(&self, api: &FakeApiServer, pod: &str, nodes: &[&str]) -> Value {
        let p = api.get("v1", "pods", "team-a", pod).unwrap();
        self.call("/filter", kube_scheduler::filter_args(&p, nodes))
            .await
    }

    async fn bind(&self, api: &FakeApiServer, pod: &str, node: &str) -> Value {
        let p = api.get("v1", "pods", "team-a", pod).unwrap();
        self.call(
            "/bind",
            kube_scheduler::bind_args("team-a", pod, &p["metadata"]["uid"], node),
        )
        .await
    }
}

fn assignment(api: &FakeApiServer, pod: &str) -> Option<PodAssignment> {
    let p = api.get("v1", "pods", "team-a", pod).unwrap();
    p["metadata"]["annotations"][ASSIGNMENT]
        .as_str()
        .map(|s| PodAssignment::decode(s).unwrap())
}

fn node_name_of(api: &FakeApiServer, pod: &str) -> Option<String> {
    api.get("v1", "pods", "team-a", pod).unwrap()["spec"]["nodeName"]
        .as_str()
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_with_reasons_prioritizes_and_binds_with_the_assignment() {
    vgpu_tests::binary("vgpu-scheduler");
    let api = FakeApiServer::start().await.unwrap();
    let t = now();
    api.create(node(
        "gpu-1",
        &[("GPU-a1", 24576), ("GPU-a2", 24576)],
        Some(t),
    ))
    .unwrap();
    api.create(node("gpu-small", &[("GPU-ab12", 6144)], Some(t)))
        .unwrap();
    api.create(node("gpu-stale", &[("GPU-s", 24576)], Some(t - 3600)))
        .unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"}}))
        .unwrap();
    api.create(pod("train", 8192)).unwrap();
    let s = start(&api, &[]).await;

    let nodes = ["gpu-1", "gpu-small", "gpu-stale", "cpu-only", "unknown"];
    let r = s.filter(&api, "train", &nodes).await;
    assert_eq!(r["NodeNames"], json!(["gpu-1"]), "{r}");
    let failed = &r["FailedNodes"];
    assert_eq!(
        failed["gpu-small"],
        "gpu-small: no GPU with 8192 MiB free (largest 6144 MiB on GPU-ab12)"
    );
    assert!(
        failed["gpu-stale"]
            .as_str()
            .unwrap()
            .starts_with("gpu-stale: device-plugin heartbeat is 36"),
        "{failed}"
    );
    assert!(failed["cpu-only"]
        .as_str()
        .unwrap()
        .starts_with("cpu-only: no vGPU inventory"));
    assert_eq!(
        failed["unknown"],
        "unknown: not known to the vGPU extender (no Node object seen)"
    );

    let p = api.get("v1", "pods", "team-a", "train").unwrap();
    let scores = s
        .call(
            "/prioritize",
            kube_scheduler::prioritize_args(&p, &["gpu-1"]),
        )
        .await;
    assert_eq!(scores, json!([{"Host": "gpu-1", "Score": 1}]));

    api.clear_requests();
    let b = s.bind(&api, "train", "gpu-1").await;
    assert_eq!(b, json!({}), "bind failed: {b}");
    let a = assignment(&api, "train").unwrap();
    assert_eq!(a.node, "gpu-1");
    assert_eq!(a.containers.len(), 1);
    assert_eq!(a.containers[0].name, "main");
    assert_eq!(a.containers[0].devices[0].memory_mib, 8192);
    assert_eq!(a.containers[0].devices[0].uuid, "GPU-a1");
    assert_eq!(node_name_of(&api, "train").as_deref(), Some("gpu-1"));
    // One write: the Binding carries the assignment, so the pod is never bound without it.
    let writes: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.method != "GET")
        .collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0].method, "POST");
    assert_eq!(
        writes[0].path,
        "/api/v1/namespaces/team-a/pods/train/binding"
    );
    assert!(writes[0].body.contains(ASSIGNMENT), "{}", writes[0].body);

    // The next pod sees the first one's memory (spread puts it on the other GPU).
    api.create(pod("second", 20000)).unwrap();
    s.bind(&api, "second", "gpu-1").await;
    assert_eq!(
        assignment(&api, "second").unwrap().containers[0].devices[0].uuid,
        "GPU-a2"
    );
    api.create(pod("third", 20000)).unwrap();
    let r = s.filter(&api, "third", &["gpu-1"]).await;
    assert_eq!(
        r["FailedNodes"]["gpu-1"],
        "gpu-1: no GPU with 20000 MiB free (largest 16384 MiB on GPU-a1)"
    );

    // A deleted pod frees its GPU once the watch shows it.
    api.delete("v1", "pods", "team-a", "second").unwrap();
    vgpu_tests::wait_for_async(WAIT, "capacity freed by deletion", || async {
        s.filter(&api, "third", &["gpu-1"]).await["NodeNames"]
            .as_array()
            .is_some_and(|a| a.len() == 1)
            .then_some(())
    })
    .await;

    // A refreshed heartbeat brings the stale node back.
    api.merge_patch(
        "v1",
        "nodes",
        "",
        "gpu-stale",
        &json!({"metadata": {"annotations": {NODE_HEARTBEAT: format_rfc3339(now())}}}),
    )
    .unwrap();
    vgpu_tests::wait_for_async(WAIT, "stale node back", || async {
        let r = s.filter(&api, "third", &["gpu-stale"]).await;
        (r["NodeNames"] == json!(["gpu-stale"])).then_some(())
    })
    .await;

    // Metrics: promtool-clean, and the placement is visible per GPU.
    let (status, text) = http(s.metrics, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    if let Some(promtool) = crate::metrics::promtool() {
        assert_eq!(
            crate::metrics::promtool_complaints(promtool, &text),
            "",
            "{text}"
        );
    }
    for want in [
        r#"vgpu_scheduler_binds_total{result="bound"} 2"#,
        r#"vgpu_scheduler_requests_total{verb="bind",result="ok"} 2"#,
        r#"vgpu_device_memory_allocated_bytes{node="gpu-1",uuid="GPU-a1"} 8589934592"#,
        r#"vgpu_device_memory_limit_bytes{node="gpu-1",uuid="GPU-a1"} 25769803776"#,
        r#"vgpu_scheduler_nodes{state="no-inventory"} 1"#,
    ] {
        assert!(text.contains(want), "missing {want} in:\n{text}");
    }
    drop(s.proc);
}

/// HAMi's placement words through the real extender: the node's NVLinks and NUMA nodes from the
/// device plugin's inventory, `topology-aware` and `nvidia.com/numa-bind` from the pod, and the
/// node's `hami.io/device-cordon`.
/// A change that may make room (a cordon lifted) reaching the extender just after it turned a
/// pod away writes `vgpu.io/room-changed` on the Node: a Node event after the extender's view has
/// the change, so kube-scheduler's retry is not answered from the older view (`requeue.rs` unit
/// test: no pod turned away lately, nothing written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_racing_a_rejection_asks_kube_scheduler_again() {
    let api = FakeApiServer::start().await.unwrap();
    let mut n = node("nv", &[("GPU-a", 24576)], Some(now()));
    n["metadata"]["annotations"][DEVICE_CORDON] = "GPU-a".into();
    api.create(n).unwrap();
    let s = start(&api, &[]).await;
    let room_changed = || {
        api.get("v1", "nodes", "", "nv").and_then(|n| {
            n["metadata"]["annotations"][ROOM_CHANGED]
                .as_str()
                .map(str::to_string)
        })
    };
    let cordon = |value: Value| {
        api.merge_patch(
            "v1",
            "nodes",
            "",
            "nv",
            &json!({"metadata": {"annotations": {DEVICE_CORDON: value}}}),
        )
        .unwrap();
    };
    api.create(pod("waits", 1024)).unwrap();
    let r = s.filter(&api, "waits", &["nv"]).await;
    assert!(r["NodeNames"].as_array().is_none_or(Vec::is_empty), "{r}");
    assert_eq!(room_changed(), None, "written before any change");
    // Lifted just after the pod was turned away: asked again.
    cordon(Value::Null);
    vgpu_tests::wait_for_async(WAIT, "vgpu.io/room-changed on the Node", || async {
        room_changed()
    })
    .await;
    let r = s.filter(&api, "waits", &["nv"]).await;
    assert_eq!(r["NodeNames"], json!(["nv"]), "{r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topology_numa_and_cordon_from_hami_annotations() {
    vgpu_tests::binary("vgpu-scheduler");
    let api = FakeApiServer::start().await.unwrap();
    let mut n = node(
        "nv",
        &[
            ("GPU-a", 24576),
            ("GPU-b", 24576),
            ("GPU-c", 24576),
            ("GPU-d", 24576),
        ],
        Some(now()),
    );
    // a-b and c-d joined by two NVLinks each; a, b on NUMA node 0 and c, d on 1.
    let mut inv =
        NodeInventory::decode(n["metadata"]["annotations"][NODE_DEVICES].as_str().unwrap())
            .unwrap();
    for (i, d) in inv.devices.iter_mut().enumerate() {
        let peer = ["GPU-b", "GPU-a", "GPU-d", "GPU-c"][i];
        d.nvlinks.insert(peer.to_string(), 2);
        d.numa = Some(i as u32 / 2);
    }
    n["metadata"]["annotations"][NODE_DEVICES] = inv.encode().into();
    api.create(n).unwrap();
    let s = start(&api, &[]).await;
    let two = |name: &str, annotations: Value| {
        let mut p = pod(name, 1024);
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2".into();
        p["metadata"]["annotations"] = annotations;
        api.create(p).unwrap();
    };
    // A slice on GPU-c makes it binpack's first choice; binpack alone would pair it with GPU-a.
    api.create(pod("first", 8192)).unwrap();
    api.merge_patch(
        "v1",
        "pods",
        "team-a",
        "first",
        &json!({"metadata": {"annotations": {
        "hami.io/gpu-scheduler-policy": "binpack", "nvidia.com/use-gpuuuid": "GPU-c"}}}),
    )
    .unwrap();
    assert_eq!(s.bind(&api, "first", "nv").await, json!({}));
    two("plain", json!({"hami.io/gpu-scheduler-policy": "binpack"}));
    two(
        "linked",
        json!({"hami.io/gpu-scheduler-policy": "binpack,topology-aware", "nvidia.com/numa-bind": "true"}),
    );
    let gpus = |pod: &str| -> Vec<String> {
        let mut u: Vec<String> = assignment(&api, pod).unwrap().containers[0]
            .devices
            .iter()
            .map(|d| d.uuid.clone())
            .collect();
        u.sort();
        u
    };
    vgpu_tests::wait_for_async(WAIT, "the first pod in the extender's cache", || async {
        let r = s.filter(&api, "plain", &["nv"]).await;
        (r["NodeNames"] == json!(["nv"])).then_some(())
    })
    .await;
    assert_eq!(s.bind(&api, "linked", "nv").await, json!({}));
    assert_eq!(gpus("linked"), ["GPU-c", "GPU-d"]);
    // A NUMA-bound pod: with GPU-a and GPU-d cordoned, each NUMA node has one GPU left.
    two(
        "bound",
        json!({"nvidia.com/numa-bind": "true", "hami.io/gpu-scheduler-policy": "binpack"}),
    );
    let cordon = |uuids: Value| {
        let ann = json!({"metadata": {"annotations": {"hami.io/device-cordon": uuids}}});
        api.merge_patch("v1", "nodes", "", "nv", &ann).unwrap();
    };
    cordon(json!("GPU-a, GPU-d"));
    vgpu_tests::wait_for_async(WAIT, "the cordon in the extender's cache", || async {
        let r = s.filter(&api, "bound", &["nv"]).await;
        (r["FailedNodes"]["nv"]
            == "nv: 2 GPUs that fit on one NUMA node (nvidia.com/numa-bind) needed, only 1")
            .then_some(())
    })
    .await;
    cordon(Value::Null);
    vgpu_tests::wait_for_async(WAIT, "the cordon lifted", || async {
        let r = s.filter(&api, "bound", &["nv"]).await;
        (r["NodeNames"] == json!(["nv"])).then_some(())
    })
    .await;
    assert_eq!(s.bind(&api, "bound", "nv").await, json!({}));
    // Binpack: the fullest GPUs, c and d, on one NUMA node.
    assert_eq!(gpus("bound"), ["GPU-c", "GPU-d"]);
    drop(s.proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_in_flight_never_get_the_same_memory() {
    vgpu_tests::binary("vgpu-scheduler");
    let api = FakeApiServer::start().await.unwrap();
    api.create(node("n1", &[("GPU-only", 16384)], Some(now())))
        .unwrap();
    api.create(pod("a", 12288)).unwrap();
    api.create(pod("b", 12288)).unwrap();
    let s = start(&api, &[]).await;

    // kube-scheduler filters the next pod before it binds the last (its binding cycle runs in a
    // goroutine): the first filter holds its choice, so the second already sees that memory
    // taken. (Before the hold both passed and one bind failed: 30 % of the binds at 5000 nodes,
    // tests/cluster/scale.rs.)
    let fa = s.filter(&api, "a", &["n1"]).await;
    assert_eq!(fa["NodeNames"], json!(["n1"]));
    let fb = s.filter(&api, "b", &["n1"]).await;
    assert_eq!(fb["NodeNames"], json!([]));
    assert_eq!(
        fb["FailedNodes"]["n1"],
        "n1: no GPU with 12288 MiB free (largest 4096 MiB on GPU-only)"
    );
    // Binds that come anyway, both in flight together (API latency), still never give the same
    // memory twice.
    api.delay_matching(
        Some("POST"),
        Some("/binding"),
        2,
        Duration::from_millis(400),
    );
    let (ba, bb) = tokio::join!(s.bind(&api, "a", "n1"), s.bind(&api, "b", "n1"));
    let errors: Vec<&str> = [&ba, &bb]
        .iter()
        .filter_map(|r| r["Error"].as_str())
        .collect();
    assert_eq!(errors.len(), 1, "exactly one bind must fail: {ba} {bb}");
    assert_eq!(
        errors[0],
        "n1: no GPU with 12288 MiB free (largest 4096 MiB on GPU-only)"
    );
    let bound: Vec<&str> = ["a", "b"]
        .into_iter()
        .filter(|p| node_name_of(&api, p).is_some())
        .collect();
    assert_eq!(bound.len(), 1);
    let loser = if bound[0] == "a" { "b" } else { "a" };
    assert!(assignment(&api, loser).is_none());
    // kube-scheduler retries the loser: the filter now says why.
    let r = s.filter(&api, loser, &["n1"]).await;
    assert_eq!(r["NodeNames"], json!([]));
    drop(s.proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_binding_writes_nothing_and_frees_the_gpu() {
    vgpu_tests::binary("vgpu-scheduler");
    let api = FakeApiServer::start().await.unwrap();
    api.create(node("n1", &[("GPU-x", 16384)], Some(now())))
        .unwrap();
    api.create(pod("p", 16384)).unwrap();
    api.create(pod("q", 16384)).unwrap();
    let s = start(&api, &[]).await;

    // The Binding fails: nothing was written and the GPU is free for the next pod.
    api.fail_matching(Some("POST"), Some("/binding"), 1, 500);
    let r = s.bind(&api, "p", "n1").await;
    assert!(
        r["Error"]
            .as_str()
            .unwrap()
            .starts_with("creating the binding:"),
        "{r}"
    );
    assert!(assignment(&api, "p").is_none());
    assert!(node_name_of(&api, "p").is_none());
    assert!(!api.requests().iter().any(|r| r.method == "PATCH"));
    vgpu_tests::wait_for_async(WAIT, "capacity back after the failed bind", || async {
        (s.filter(&api, "q", &["n1"]).await["NodeNames"] == json!(["n1"])).then_some(())
    })
    .await;

    // The filter above held n1 for q. q is recreated under the same name before its bind: the
    // old q's bind does not bind the new one (refused by the Binding's UID precondition while
    // the hold stands, or by the extender's own UID check once the watch dropped it).
    let old_uid = api.get("v1", "pods", "team-a", "q").unwrap()["metadata"]["uid"].clone();
    api.delete("v1", "pods", "team-a", "q").unwrap();
    api.create(pod("q", 16384)).unwrap();
    let stale = s
        .call(
            "/bind",
            kube_scheduler::bind_args("team-a", "q", &old_uid, "n1"),
        )
        .await;
    assert!(
        stale["Error"]
            .as_str()
            .is_some_and(|e| e.contains("Precondition failed") || e.contains("UID changed")),
        "{stale}"
    );
    assert!(node_name_of(&api, "q").is_none());
    // Bound by its own UID, it binds (the failed attempts held nothing).
    assert_eq!(s.bind(&api, "q", "n1").await, json!({}));
    assert_eq!(node_name_of(&api, "q").as_deref(), Some("n1"));
    let (_, text) = http(s.metrics, "GET", "/metrics", "").await;
    for want in [
        r#"vgpu_scheduler_binds_total{result="binding-failed"} "#,
        r#"vgpu_scheduler_binds_total{result="bound"} 1"#,
    ] {
        assert!(text.contains(want), "missing {want} in:\n{text}");
    }
    drop(s.proc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_the_watches_and_recovers_by_itself() {
    vgpu_tests::binary("vgpu-scheduler");
    let api = FakeApiServer::start().await.unwrap();
    api.create(node("n1", &[("GPU-one", 8192)], Some(now())))
        .unwrap();
    api.create(pod("held", 8192)).unwrap();
    let s = start(&api, &[]).await;
    s.filter(&api, "held", &["n1"]).await;
    let b = s.bind(&api, "held", "n1").await;
    assert_eq!(b, json!({}), "bind failed: {b}");

    // The pod watch breaks and cannot be re-established: the cache may miss events, so /readyz
    // says which watch and why, while the node watch stays out of it.
    api.fail_verb("watch", Some("/api/v1/pods"), usize::MAX, 500);
    api.fail_verb("list", Some("/api/v1/pods"), usize::MAX, 500);
    api.close_watches();
    let why = vgpu_tests::wait_for_async(WAIT, "/readyz to fail", || async {
        let (status, body) = http(s.metrics, "GET", "/readyz", "").await;
        (status == 503).then_some(body)
    })
    .await;
    assert!(
        why.starts_with("cache not synced: vGPU pods: not listed since a failure (last error: "),
        "{why}"
    );
    assert!(why.contains("500"), "{why}");
    assert!(!why.contains("nodes"), "{why}");
    // The same state as a metric, for alerts.
    let (_, text) = http(s.metrics, "GET", "/metrics", "").await;
    assert!(
        text.contains("vgpu_scheduler_cache_synced{feed=\"pods\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("vgpu_scheduler_cache_synced{feed=\"nodes\"} 1"),
        "{text}"
    );

    // Meanwhile the held pod goes away; once the API server is back the watch re-lists by itself
    // and the cache is whole again: ready, and the freed memory is offered.
    api.delete("v1", "pods", "team-a", "held").unwrap();
    api.clear_faults();
    vgpu_tests::wait_for_async(WAIT, "/readyz to recover", || async {
        (http(s.metrics, "GET", "/readyz", "").await.0 == 200).then_some(())
    })
    .await;
    let (_, text) = http(s.metrics, "GET", "/metrics", "").await;
    assert!(
        text.contains("vgpu_scheduler_cache_synced{feed=\"pods\"} 1"),
        "{text}"
    );
    api.create(pod("next", 8192)).unwrap();
    let r = s.filter(&api, "next", &["n1"]).await;
    assert_eq!(r["NodeNames"], json!(["n1"]), "{r}");
    drop(s.proc);
}
