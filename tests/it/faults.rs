//! API-server faults under the real binaries: watches cut mid-stream, watches answered 410
//! Expired, LISTs failing with 500 or answering slowly. The webhook's validate caches recover from
//! each (the decisions made meanwhile stay correct, the quota is never overshot) and `/readyz`
//! says when a cache is not current; the scheduler's caches recover too; the device plugin keeps
//! serving the kubelet while its node patches fail, and the inventory lands soon after they stop.

use serde_json::{json, Value};
use std::time::Duration;
use vgpu_tests::https;

use crate::validate::{cluster, gpu_pod, Cluster, NS};

/// A ResourceQuota with one vGPU key in any namespace.
fn quota_in(ns: &str, name: &str, gpumem: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": {"limits.nvidia.com/gpumem": gpumem.to_string()}}})
}

fn pod_in(ns: &str, name: &str, mib: u64) -> Value {
    let mut p = gpu_pod(name, 1, mib);
    p["metadata"]["namespace"] = json!(ns);
    p
}

const T: Duration = Duration::from_secs(20);

impl Cluster {
    /// GET `path` of a replica: status and body.
    async fn get(&self, replica: usize, path: &str) -> (u16, String) {
        let r = https::request(
            self.webhooks[replica].1,
            self.tls.clone(),
            "GET",
            path,
            vec![],
        )
        .await
        .unwrap();
        (r.status, String::from_utf8_lossy(&r.body).into_owned())
    }

    async fn readyz(&self, replica: usize) -> (u16, String) {
        self.get(replica, "/readyz").await
    }

    /// The replica's `/metrics` text.
    async fn metrics(&self, replica: usize) -> String {
        let (status, text) = self.get(replica, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        text
    }

    /// Polls `/readyz` until its status is `code`; returns the body.
    async fn wait_readyz(&self, replica: usize, code: u16) -> String {
        vgpu_tests::wait_for_async(T, &format!("/readyz {code}"), || async {
            let (status, body) = self.readyz(replica).await;
            (status == code).then_some(body)
        })
        .await
    }

    /// Every watch of the replicas is open (3 each: quotas, pods, nodes).
    async fn wait_watches(&self) {
        let want = 3 * self.webhooks.len();
        vgpu_tests::wait_for_async(T, "every watch open", || async {
            (self.api.watch_count() == want).then_some(())
        })
        .await;
    }

    /// A dry-run decision, and whether it came from the caches alone (no LIST of the namespace's
    /// quotas or pods went to the API for it).
    async fn decision(&self, pod: &Value) -> (Value, bool) {
        let ns = pod["metadata"]["namespace"].as_str().unwrap().to_string();
        self.api.clear_requests();
        let r = self.validate(0, pod, true).await;
        let fallback = self
            .api
            .requests()
            .into_iter()
            .any(|q| q.path.starts_with(&format!("/api/v1/namespaces/{ns}/")));
        (r, !fallback)
    }

    /// Polls dry-run decisions until one comes from the caches alone and refuses by `quota`.
    async fn wait_cache_denies(&self, pod: &Value, quota: &str) {
        vgpu_tests::wait_for_async(T, &format!("the cache to know {quota}"), || async {
            let (r, from_cache) = self.decision(pod).await;
            let msg = r["status"]["message"].as_str().unwrap_or("").to_string();
            (from_cache && r["allowed"] == false && msg.contains(quota)).then_some(())
        })
        .await;
    }

    fn log_has(&self, replica: usize, needles: &[&str]) -> bool {
        self.webhooks[replica]
            .0
            .output()
            .iter()
            .any(|l| needles.iter().all(|n| l.contains(n)))
    }
}

/// One replica through each watch fault in turn. After each, a quota created while the fault
/// was on must be seen by the cache (a decision with no fallback LIST refuses by it), and
/// `/readyz` must be 200 again; while a cache cannot be rebuilt, `/readyz` is 503 naming it and
/// decisions are taken from fresh LISTs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_caches_recover_from_watch_faults_and_readyz_follows() {
    let c = cluster(vec![quota_in(NS, "gpu-quota", 8192)], 1, 60).await;
    c.wait_watches().await;

    // 1. Every watch cut mid-stream: kube-rs reads the unfinished body as a resumable end and
    //    re-watches from its version; nothing is missed, no re-list is needed.
    c.api.clear_requests();
    c.api.drop_watches();
    c.api.create(quota_in("team-b", "quota-b", 1024)).unwrap();
    c.wait_watches().await;
    c.wait_cache_denies(&pod_in("team-b", "b1", 4096), "quota-b")
        .await;
    assert_eq!(c.readyz(0).await, (200, "ok".to_string()));

    // 2. The next watch of each cache answered 410 Expired (after a clean end, as at the
    //    server's timeout): the cache is marked unsynced and rebuilt from a fresh LIST.
    c.api.expire_next_watches(None, 3);
    c.api.close_watches();
    c.api.create(quota_in("team-c", "quota-c", 1024)).unwrap();
    c.wait_cache_denies(&pod_in("team-c", "c1", 4096), "quota-c")
        .await;
    assert!(
        c.log_has(0, &["resourcequotas", "cache marked unsynced", "Expired"]),
        "the 410 was seen"
    );
    // Log lines are written in batches (every 50 ms): wait for the second sync line.
    let synced = vgpu_tests::wait_for_async(T, "the quota cache's second sync line", || async {
        let n = c.webhooks[0]
            .0
            .output()
            .iter()
            .filter(|l| l.contains("list synced") && l.contains("resourcequotas"))
            .count();
        (n >= 2).then_some(n)
    })
    .await;
    assert_eq!(synced, 2, "the quota cache re-listed after 410");
    c.wait_readyz(0, 200).await;

    // 3. Watches and cluster-wide LISTs of quotas fail with 500 until cleared: the quota cache
    //    cannot be rebuilt, /readyz says so, and decisions LIST the namespace afresh (the
    //    namespaced LIST still works), so they stay exact.
    c.api
        .fail_verb("watch", Some("/api/v1/resourcequotas"), usize::MAX, 500);
    c.api
        .fail_verb("list", Some("/api/v1/resourcequotas"), usize::MAX, 500);
    c.api.close_watches();
    let body = c.wait_readyz(0, 503).await;
    assert!(
        body.starts_with("caches not synced: resourcequotas: watch failing for ")
            && body.contains("500"),
        "{body}"
    );
    // The same state as a metric, for alerts: the quota cache alone is out.
    let text = c.metrics(0).await;
    for want in [
        "vgpu_webhook_cache_synced{cache=\"resourcequotas\"} 0",
        "vgpu_webhook_cache_synced{cache=\"pods\"} 1",
        "vgpu_webhook_cache_synced{cache=\"nodes\"} 1",
    ] {
        assert!(text.contains(want), "missing {want} in\n{text}");
    }
    c.api.create(quota_in("team-d", "quota-d", 4096)).unwrap();
    let d: Vec<Value> = (0..3)
        .map(|i| pod_in("team-d", &format!("d{i}"), 2048))
        .collect();
    let mut admitted = 0;
    for p in &d {
        c.api.clear_requests();
        let r = c.validate(0, p, false).await;
        admitted += usize::from(r["allowed"] == true);
        assert!(
            c.api
                .requests()
                .iter()
                .any(|q| q.path == "/api/v1/namespaces/team-d/resourcequotas"),
            "decided from a fresh LIST"
        );
    }
    assert_eq!(admitted, 2, "4096 MiB hold two 2048 MiB pods, not three");
    assert_eq!(
        c.wait_readyz(0, 503).await.split(';').count(),
        1,
        "only quotas"
    );
    c.api.clear_faults();
    c.wait_readyz(0, 200).await;
    assert!(c
        .metrics(0)
        .await
        .contains("vgpu_webhook_cache_synced{cache=\"resourcequotas\"} 1"));
    c.wait_cache_denies(&pod_in("team-d", "d9", 2048), "quota-d")
        .await;

    // 4. A slow LIST: the pod cache's re-list (after a 410) takes 2 s; /readyz is 503 meanwhile,
    //    then 200 without anything else done.
    c.api
        .delay_verb("list", Some("/api/v1/pods"), 1, Duration::from_secs(2));
    c.api.expire_next_watches(Some("/api/v1/pods"), 1);
    c.api.close_watches();
    let body = c.wait_readyz(0, 503).await;
    assert!(body.starts_with("caches not synced: pods: "), "{body}");
    c.wait_readyz(0, 200).await;

    // 5. The API unreachable, then back: readiness comes back by itself.
    c.api.set_down(Some(503));
    c.api.close_watches();
    vgpu_tests::wait_for_async(T, "/readyz naming all three caches", || async {
        let (status, body) = c.readyz(0).await;
        (status == 503 && body.split("; ").count() == 3).then_some(())
    })
    .await;
    c.api.set_down(None);
    c.wait_readyz(0, 200).await;
    c.wait_watches().await;
}

/// Two replicas, 50 pods of 4096 MiB against 40960 MiB, admitted in waves while faults fire
/// without pause (watches cut and expired, LISTs failing and slow); what is admitted is created,
/// as the API server would. Never more than 10 admitted; once the faults stop, exactly 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn quota_is_never_overshot_while_watches_fail() {
    let c = cluster(vec![quota_in(NS, "gpu-quota", 40960)], 2, 60).await;
    c.wait_watches().await;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let storm = async {
        let mut round = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match round % 4 {
                0 => c.api.drop_watches(),
                1 => {
                    c.api.expire_next_watches(None, 6);
                    c.api.close_watches();
                }
                2 => c.api.fail_verb("list", None, 3, 500),
                _ => c
                    .api
                    .delay_verb("list", None, 2, Duration::from_millis(300)),
            }
            round += 1;
            // The pace of the storm, not a wait for a condition.
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        round
    };
    let waves = async {
        let mut admitted = 0usize;
        let mut refusals = Vec::new();
        for wave in 0..5 {
            let pods: Vec<Value> = (0..10)
                .map(|i| gpu_pod(&format!("w{wave}-{i}"), 1, 4096))
                .collect();
            let responses = c.validate_all(&pods).await;
            for (pod, r) in pods.iter().zip(&responses) {
                if r["allowed"] == true {
                    admitted += 1;
                    c.api.create(pod.clone()).unwrap();
                } else {
                    refusals.push(r["status"].clone());
                }
            }
            assert!(admitted <= 10, "wave {wave}: {admitted} admitted");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (admitted, refusals)
    };
    let (rounds, (mut admitted, refusals)) = tokio::join!(storm, waves);
    assert!(rounds >= 8, "the storm ran ({rounds} rounds)");
    c.api.clear_faults();
    for r in &refusals {
        let code = r["code"].as_u64().unwrap();
        let msg = r["message"].as_str().unwrap();
        assert!(
            (code == 403 && msg.starts_with("vgpu quota exceeded in namespace team-a"))
                || (code == 503 && msg.starts_with("vgpu quota cannot be checked")),
            "{r}"
        );
    }
    // Faults over: whatever the storm refused with 503 can be admitted now, up to exactly 10.
    for r in 0..2 {
        c.wait_readyz(r, 200).await;
    }
    let rest: Vec<Value> = (0..10)
        .map(|i| gpu_pod(&format!("late-{i}"), 1, 4096))
        .collect();
    let responses = c.validate_all(&rest).await;
    for (pod, r) in rest.iter().zip(&responses) {
        if r["allowed"] == true {
            admitted += 1;
            c.api.create(pod.clone()).unwrap();
        }
    }
    assert_eq!(admitted, 10, "exactly the quota once the API is sound");
    assert_eq!(c.api.list("v1", "pods", Some(NS)).len(), 10);
}

/// The node inventory patch failing with 500 from the start: the plugin still registers, lists
/// its devices and answers Allocate from the assignment; the annotations are absent while the
/// patches fail and land within seconds once they stop, well before the next heartbeat (30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_serves_while_node_patches_fail_and_catches_up() {
    use vgpu_core::annotations::{ASSIGNMENT, MANAGED_LABEL, NODE_DEVICES, NODE_HEARTBEAT};
    use vgpu_core::assignment::{ContainerAssignment, DeviceSlice, PodAssignment};
    use vgpu_core::inventory::NodeInventory;
    const NODE: &str = "gpu-node-1";
    const GPU: &str = "GPU-00000000-0000-0000-0000-000000000000";

    let tmp = tempfile::tempdir().unwrap();
    let dp_dir = tmp.path().join("device-plugins");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let nvml = tmp.path().join("nvml.json");
    let gpus =
        json!({"gpus": [{"uuid": GPU, "name": "NVIDIA A100-PCIE-40GB", "memoryMib": 40960}]});
    std::fs::write(&nvml, gpus.to_string()).unwrap();
    let api = vgpu_fake_apiserver::FakeApiServer::start().await.unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))
        .unwrap();
    // 500 InternalError: kube's client does not retry it on its own (it does retry 503s).
    api.fail_verb(
        "patch",
        Some(&format!("/api/v1/nodes/{NODE}")),
        usize::MAX,
        500,
    );
    let kubelet = vgpu_fake_kubelet::FakeKubelet::start(&dp_dir)
        .await
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = std::process::Command::new(vgpu_tests::binary("vgpu-device-plugin"));
    cmd.arg(format!(
        "--nvml-lib={}",
        vgpu_tests::cdylib("fake_nvml").display()
    ))
    .arg(format!("--device-plugin-dir={}", dp_dir.display()))
    .arg(format!("--host-dir={}", tmp.path().join("vgpu").display()))
    .arg("--split-count=2")
    .arg(format!("--metrics-listen=127.0.0.1:{port}"))
    .arg("--heartbeat-seconds=30")
    // Not the machine's own kubelet.
    .arg("--pod-resources-socket=")
    .env("NODE_NAME", NODE)
    .env("KUBECONFIG", &kubeconfig)
    .env("FAKE_NVML_CONFIG", &nvml)
    .env("RUST_LOG", "info");
    let plugin = vgpu_tests::process::Running::spawn("vgpu-device-plugin", cmd);

    let r = kubelet.wait_registrations(1, T).await.expect("registered");
    let mut c = vgpu_tests::wait_for_async(T, "dialing the plugin", || async {
        kubelet.dial(&r.endpoint).await.ok()
    })
    .await;
    let devices = c.list_and_watch().await.unwrap().next(T).await.unwrap();
    assert_eq!(devices.len(), 2);
    // Allocate still answers from the assignment (its pod patch is not a node patch).
    let a = PodAssignment::new(
        NODE,
        vec![ContainerAssignment {
            name: "main".into(),
            devices: vec![DeviceSlice {
                uuid: GPU.into(),
                memory_mib: 4096,
                cores: 30,
                exclusive: false,
            }],
        }],
    );
    api.create(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "labels": {MANAGED_LABEL: "true"},
            "annotations": {ASSIGNMENT: a.encode()}},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "cuda"}]},
        "status": {"phase": "Pending"}}))
        .unwrap();
    let answer = c.allocate(&[&format!("{GPU}::0")]).await.unwrap();
    assert_eq!(answer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
    assert_eq!(answer.envs["CUDA_DEVICE_SM_LIMIT_0"], "30");

    let failed_patches = || {
        api.requests()
            .iter()
            .filter(|q| q.method == "PATCH" && q.path.ends_with(NODE))
            .count()
    };
    // Retried soon, not at the heartbeat: a second attempt within seconds.
    vgpu_tests::wait_for_async(T, "a retried node patch", || async {
        (failed_patches() >= 2).then_some(())
    })
    .await;
    let annotations = |api: &vgpu_fake_apiserver::FakeApiServer| {
        api.get("v1", "nodes", "", NODE)
            .map(|n| n["metadata"]["annotations"].clone())
            .unwrap_or(Value::Null)
    };
    assert!(annotations(&api).get(NODE_DEVICES).is_none());

    api.clear_faults();
    // The deadline (20 s) is shorter than the heartbeat (30 s): only the quick retry lands it.
    let inv = vgpu_tests::wait_for_async(T, "the inventory to land", || async {
        let a = annotations(&api);
        a.get(NODE_HEARTBEAT)?;
        NodeInventory::decode(a.get(NODE_DEVICES)?.as_str()?).ok()
    })
    .await;
    assert_eq!(inv.devices.len(), 1);
    assert_eq!(inv.devices[0].uuid, GPU);
    // The line is written after the patch returns: wait for it rather than race it.
    vgpu_tests::wait_for_async(T, "the recovery log line", || async {
        plugin
            .output()
            .iter()
            .any(|l| l.contains("node inventory patched after failures"))
            .then_some(())
    })
    .await;
}

/// The scheduler's caches through a cut watch and a watch whose version was compacted away (410
/// on the retry): a node added meanwhile is filtered in, a node deleted meanwhile is filtered out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_caches_recover_from_a_dropped_watch_and_a_410() {
    use crate::scheduler::{node, now, pod, start};
    vgpu_tests::binary("vgpu-scheduler");
    let api = vgpu_fake_apiserver::FakeApiServer::start().await.unwrap();
    api.create(node("gpu-1", &[("GPU-a1", 24576)], Some(now())))
        .unwrap();
    api.create(pod("train", 8192)).unwrap();
    // Every fitting node passes, so the filter shows what the cache holds.
    let s = start(&api, &["--choose-node=false"]).await;
    let nodes = ["gpu-1", "gpu-2"];
    let r = s.filter(&api, "train", &nodes).await;
    assert_eq!(r["NodeNames"], json!(["gpu-1"]), "{r}");
    let watches = || async {
        vgpu_tests::wait_for_async(T, "node and pod watches", || async {
            (api.watch_count() == 2).then_some(())
        })
        .await
    };
    watches().await;

    // Cut mid-stream: the re-watch replays the node added meanwhile.
    api.drop_watches();
    api.create(node("gpu-2", &[("GPU-b1", 24576)], Some(now())))
        .unwrap();
    vgpu_tests::wait_for_async(T, "gpu-2 filtered in", || async {
        let r = s.filter(&api, "train", &nodes).await;
        (r["NodeNames"] == json!(["gpu-1", "gpu-2"])).then_some(())
    })
    .await;
    watches().await;

    // The re-watch fails once (500); the node is deleted and the history compacted before the
    // retry, which then gets 410 Expired and re-lists: the deleted node must be gone.
    let node_watches = || {
        api.requests()
            .iter()
            .filter(|r| r.is_watch() && r.path == "/api/v1/nodes")
            .count()
    };
    let before = node_watches();
    api.fail_verb("watch", Some("/api/v1/nodes"), 1, 500);
    api.close_watches();
    vgpu_tests::wait_for_async(T, "the failed re-watch", || async {
        (node_watches() > before).then_some(())
    })
    .await;
    api.delete("v1", "nodes", "", "gpu-1").unwrap();
    api.compact();
    let r = vgpu_tests::wait_for_async(T, "gpu-1 filtered out", || async {
        let r = s.filter(&api, "train", &nodes).await;
        (r["NodeNames"] == json!(["gpu-2"])).then_some(r)
    })
    .await;
    assert!(
        r["FailedNodes"]["gpu-1"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{r}"
    );
}

/// A 20 s run of the soak (`vgpu-validate-load --duration`, docs/soak.md): no request fails or is
/// answered wrongly, and the webhook's descriptors do not grow. Memory is not judged here (the
/// windows are too short to be past warm-up; the 10-minute run judges it), nor is any timing.
#[test]
fn short_soak_has_no_errors_and_no_descriptor_growth() {
    let mut cmd = std::process::Command::new(vgpu_tests::binary("vgpu-validate-load"));
    cmd.args([
        "--pods=500",
        "--vgpu-pods=100",
        "--namespaces=20",
        "--duration=20",
        "--warmup=4",
        "--window=6",
        "--sample-seconds=1",
        "--connections=2",
        "--rss-tolerance=100",
    ]);
    let mut run = vgpu_tests::process::Running::spawn("vgpu-validate-load", cmd);
    let status = run
        .wait_exit(Duration::from_secs(180))
        .expect("the soak ends");
    let out = run.output().join("\n");
    assert!(status.success(), "{out}");
    assert!(
        out.contains("| errors (transport, non-200, wrong answer) | 0 |"),
        "{out}"
    );
    assert!(out.contains("soak passed"), "{out}");
}
