//! `/validate` of the real `vgpu-webhook` binary against the fake API server, reached through a
//! kubeconfig: tenant quota across two replicas, reservations that expire, policy rules, dry runs,
//! rejection Events and the API server going away.

use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::certs::TestPki;
use vgpu_tests::https;
use vgpu_tests::process::{start_webhook, Running};

pub(crate) const NS: &str = "team-a";
pub(crate) const LEDGER_NS: &str = "vgpu-system";
/// Reservation lifetime in the expiry test.
const RESERVATION_TTL_SECS: u64 = 8;

pub(crate) struct Cluster {
    pub(crate) api: FakeApiServer,
    _dir: tempfile::TempDir,
    pub(crate) webhooks: Vec<(Running, SocketAddr)>,
    pub(crate) tls: Arc<rustls::ClientConfig>,
}

/// A fake API server holding `objects`, and `replicas` webhooks connected to it, ready.
pub(crate) async fn cluster(objects: Vec<Value>, replicas: usize, ttl_secs: u64) -> Cluster {
    cluster_with(objects, replicas, ttl_secs, &[]).await
}

/// [`cluster`] with more webhook flags.
pub(crate) async fn cluster_with(
    objects: Vec<Value>,
    replicas: usize,
    ttl_secs: u64,
    extra: &[&str],
) -> Cluster {
    let api = FakeApiServer::start().await.unwrap();
    for o in objects {
        api.create(o).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    let tls = Arc::new(pki.client_config());
    let ttl = ttl_secs.to_string();
    let mut webhooks = Vec::new();
    for _ in 0..replicas {
        let kc = kubeconfig.to_str().unwrap();
        webhooks.push(start_webhook(
            &cert,
            &key,
            &[
                "--kubeconfig",
                kc,
                "--namespace",
                LEDGER_NS,
                "--reservation-ttl",
                &ttl,
            ]
            .into_iter()
            .chain(extra.iter().copied())
            .collect::<Vec<_>>(),
        ));
    }
    for (_, addr) in &webhooks {
        let addr = *addr;
        let tls = tls.clone();
        vgpu_tests::wait_for_async(Duration::from_secs(20), "webhook ready", || {
            let tls = tls.clone();
            async move {
                let r = https::request(addr, tls, "GET", "/readyz", vec![])
                    .await
                    .ok()?;
                (r.status == 200).then_some(())
            }
        })
        .await;
    }
    Cluster {
        api,
        _dir: dir,
        webhooks,
        tls,
    }
}

pub(crate) fn quota(name: &str, hard: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": NS}, "spec": {"hard": hard}})
}

pub(crate) fn gpu_pod(name: &str, gpus: u32, mib: u64) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"),
            "labels": {"vgpu.io/managed": "true"}},
        "spec": {"containers": [{"name": "train", "image": "i",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string(), "nvidia.com/gpumem": mib.to_string()}}}]}})
}

pub(crate) fn review(pod: &Value, dry_run: bool) -> Vec<u8> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    vgpu_tests::admission::pod_create_review(&format!("review-{name}"), pod, dry_run)
}

impl Cluster {
    pub(crate) async fn validate(&self, replica: usize, pod: &Value, dry_run: bool) -> Value {
        let addr = self.webhooks[replica].1;
        let reply = https::request(
            addr,
            self.tls.clone(),
            "POST",
            "/validate",
            review(pod, dry_run),
        )
        .await
        .unwrap();
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        reply.json()["response"].clone()
    }

    /// Sends every pod at once, spread over the replicas; returns the responses in pod order.
    pub(crate) async fn validate_all(&self, pods: &[Value]) -> Vec<Value> {
        let mut tasks = Vec::new();
        for (i, pod) in pods.iter().enumerate() {
            let addr = self.webhooks[i % self.webhooks.len()].1;
            let (tls, body) = (self.tls.clone(), review(pod, false));
            tasks.push(tokio::spawn(async move {
                let r = https::request(addr, tls, "POST", "/validate", body)
                    .await
                    .unwrap();
                assert_eq!(r.status, 200);
                r.json()["response"].clone()
            }));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap());
        }
        out
    }

    /// Our Events in the namespace: (regarding kind/name, reason, occurrences).
    fn events(&self) -> Vec<(String, String, u64)> {
        self.api
            .list("events.k8s.io/v1", "events", Some(NS))
            .iter()
            .map(|e| {
                (
                    format!(
                        "{}/{}",
                        e["regarding"]["kind"].as_str().unwrap(),
                        e["regarding"]["name"].as_str().unwrap()
                    ),
                    e["reason"].as_str().unwrap().to_string(),
                    e.pointer("/series/count")
                        .and_then(Value::as_u64)
                        .unwrap_or(1),
                )
            })
            .collect()
    }

    fn ledger(&self) -> Vec<Value> {
        let cm = self
            .api
            .get("v1", "configmaps", LEDGER_NS, &format!("vgpu-quota-{NS}"));
        cm.and_then(|cm| {
            cm.pointer("/data/reservations")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .map(|s| {
            serde_json::from_str::<Value>(&s).unwrap()["reservations"]
                .as_array()
                .unwrap()
                .clone()
        })
        .unwrap_or_default()
    }

    /// Waits until the Events of the namespace add up to `n` occurrences.
    async fn wait_for_events(&self, n: u64) -> Vec<(String, String, u64)> {
        vgpu_tests::wait_for_async(Duration::from_secs(20), "events to add up", || async {
            let ev = self.events();
            (ev.iter().map(|e| e.2).sum::<u64>() == n).then_some(ev)
        })
        .await
    }
}

pub(crate) fn allowed(responses: &[Value]) -> usize {
    responses.iter().filter(|r| r["allowed"] == true).count()
}

/// Two replicas, 50 concurrent 1 x 4096 MiB pods against 40960 MiB: exactly 10 admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_never_overshoot_the_quota() {
    let c = cluster(
        vec![quota(
            "gpu-quota",
            json!({"limits.nvidia.com/gpumem": "40960"}),
        )],
        2,
        60,
    )
    .await;
    let pods: Vec<Value> = (0..50)
        .map(|i| gpu_pod(&format!("p{i}"), 1, 4096))
        .collect();
    let responses = c.validate_all(&pods).await;
    assert_eq!(allowed(&responses), 10, "{responses:#?}");
    let denied: Vec<&Value> = responses.iter().filter(|r| r["allowed"] == false).collect();
    assert_eq!(denied.len(), 40);
    for d in &denied {
        assert_eq!(d["status"]["code"], 403);
        assert_eq!(d["status"]["reason"], "Forbidden");
        assert_eq!(
            d["status"]["message"],
            "vgpu quota exceeded in namespace team-a: ResourceQuota gpu-quota limits.nvidia.com/gpumem: requested 4096 MiB (1 GPU x 4096), used 40960, hard 40960"
        );
    }
    assert_eq!(c.ledger().len(), 10);
    // 40 rejections of pods without an owner: one Event about each refused pod, in its namespace.
    let events = c.wait_for_events(40).await;
    assert_eq!(events.len(), 40, "{events:?}");
    assert!(
        events
            .iter()
            .all(|(about, reason, n)| about.starts_with("Pod/p")
                && reason == "VGPUQuotaExceeded"
                && *n == 1),
        "{events:?}"
    );
}

/// A ReplicaSet whose pod was refused for quota is asked to retry (one annotation, which makes its
/// controller sync at once) when the quota is raised, and again when a pod of the namespace goes
/// away; an owner the webhook may not write to (a custom kind) is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_refused_for_quota_is_asked_to_retry_when_room_may_have_appeared() {
    let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "train-7d9f", "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": "train"}}}});
    let c = cluster(
        vec![
            quota("gpu-quota", json!({"requests.nvidia.com/gpumem": "4096"})),
            rs,
            gpu_pod("holder", 1, 4096),
        ],
        1,
        60,
    )
    .await;
    let retried = || {
        c.api
            .get("apps/v1", "replicasets", NS, "train-7d9f")
            .and_then(|rs| {
                rs.pointer("/metadata/annotations/vgpu.io~1quota-retry")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
    };
    let owned = |name: &str, api_version: &str, kind: &str, owner: &str| {
        let mut pod = gpu_pod(name, 1, 1024);
        pod["metadata"]["ownerReferences"] = json!([{"apiVersion": api_version, "kind": kind,
            "name": owner, "uid": format!("uid-{owner}"), "controller": true}]);
        pod
    };
    let replica = |name: &str| owned(name, "apps/v1", "ReplicaSet", "train-7d9f");
    let refused = c.validate(0, &replica("train-a"), false).await;
    assert_eq!(refused["allowed"], false, "{refused}");
    let custom = c
        .validate(0, &owned("tf-a", "kubeflow.org/v1", "TFJob", "tf"), false)
        .await;
    assert_eq!(custom["allowed"], false, "{custom}");
    assert_eq!(retried(), None, "asked before any room appeared");

    c.api
        .merge_patch(
            "v1",
            "resourcequotas",
            NS,
            "gpu-quota",
            &json!({"spec": {"hard": {"requests.nvidia.com/gpumem": "5120"}}}),
        )
        .unwrap();
    let first = vgpu_tests::wait_for_async(
        Duration::from_secs(10),
        "the ReplicaSet asked to retry after the quota changed",
        || async { retried() },
    )
    .await;
    let patches = |c: &Cluster| {
        c.api
            .requests()
            .iter()
            .filter(|r| r.method == "PATCH")
            .map(|r| r.path.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        patches(&c),
        vec![format!(
            "/apis/apps/v1/namespaces/{NS}/replicasets/train-7d9f"
        )],
        "only the ReplicaSet is patched, once"
    );

    // Its retry fits; once asked it is forgotten, and refused again it is asked again when the
    // holder goes away.
    let fits = c.validate(0, &replica("train-b"), false).await;
    assert_eq!(fits["allowed"], true, "{fits}");
    let again = c.validate(0, &replica("train-c"), false).await;
    assert_eq!(again["allowed"], false, "{again}");
    c.api.delete("v1", "pods", NS, "holder").unwrap();
    vgpu_tests::wait_for_async(
        Duration::from_secs(10),
        "the ReplicaSet asked again after the pod went away",
        || async { retried().filter(|t| *t != first) },
    )
    .await;
    let metrics = https::request(c.webhooks[0].1, c.tls.clone(), "GET", "/metrics", vec![])
        .await
        .unwrap();
    let metrics = String::from_utf8_lossy(&metrics.body);
    assert!(
        metrics.contains("vgpu_webhook_quota_retries_total{result=\"ok\"} 2"),
        "{metrics}"
    );
}

/// Reservations of pods that never appear expire; pods that do appear keep counting.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_expire_unless_the_pod_appears() {
    // The TTL must outlast one batch of 50 admissions on a loaded CI machine: a reservation that
    // expires while its batch is still arriving frees its share early, as designed.
    let c = cluster(
        vec![quota("gpu-quota", json!({"nvidia.com/gpumem": "40960"}))],
        2,
        RESERVATION_TTL_SECS,
    )
    .await;
    let batch = |tag: &str| {
        (0..50)
            .map(|i| gpu_pod(&format!("{tag}{i}"), 1, 4096))
            .collect::<Vec<_>>()
    };
    let wait_expired = |c: &Cluster| {
        let latest = c
            .ledger()
            .iter()
            .filter_map(|r| r["expiresMs"].as_u64())
            .max()
            .unwrap_or(0);
        vgpu_tests::wait_for(
            Duration::from_secs(RESERVATION_TTL_SECS + 10),
            "reservations to expire",
            || {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64;
                (now > latest).then_some(())
            },
        );
    };
    // No pod is ever created: after expiry the whole quota is free again.
    let first = c.validate_all(&batch("a")).await;
    assert_eq!(allowed(&first), 10);
    wait_expired(&c);
    let second = c.validate_all(&batch("b")).await;
    assert_eq!(
        allowed(&second),
        10,
        "expired reservations must free the quota"
    );

    // Now the admitted pods are created: their usage counts from the pod cache after expiry.
    for (pod, r) in batch("b").iter().zip(&second) {
        if r["allowed"] == true {
            c.api.create(pod.clone()).unwrap();
        }
    }
    wait_expired(&c);
    let third = c.validate_all(&batch("c")).await;
    assert_eq!(allowed(&third), 0, "the ten created pods hold the quota");
    // A terminal pod frees its share.
    let done = c.api.list("v1", "pods", Some(NS))[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_string();
    c.api
        .merge_patch(
            "v1",
            "pods",
            NS,
            &done,
            &json!({"status": {"phase": "Succeeded"}}),
        )
        .unwrap();
    let r = vgpu_tests::wait_for_async(
        Duration::from_secs(10),
        "the finished pod to stop counting",
        || async {
            let r = c.validate(0, &gpu_pod("after-done", 1, 4096), true).await;
            (r["allowed"] == true).then_some(r)
        },
    )
    .await;
    assert_eq!(r["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_violations_are_refused_with_an_event_on_the_controller_and_dry_runs_leave_no_trace()
{
    let c = cluster(
        vec![quota(
            "gpu-quota",
            json!({"requests.nvidia.com/gpumem": "8192"}),
        )],
        1,
        60,
    )
    .await;
    let mut pod = gpu_pod("priv", 1, 4096);
    pod["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "ReplicaSet",
        "name": "train-7d9f", "uid": "rs-1", "controller": true}]);
    // Dry run: the same answer, no Event.
    let r = c.validate(0, &pod, true).await;
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(
        r["status"]["message"],
        "vgpu policy: container \"train\": a privileged container may not request vGPU: it could reach the GPU without the vGPU limits (rule denyPrivileged)"
    );
    for _ in 0..3 {
        assert_eq!(c.validate(0, &pod, false).await["allowed"], false);
    }
    let events = c.wait_for_events(3).await;
    assert_eq!(
        events,
        vec![(
            "ReplicaSet/train-7d9f".to_string(),
            "VGPUPolicyViolation".to_string(),
            3
        )]
    );

    // A dry run that fits reserves nothing; a real one does.
    assert_eq!(
        c.validate(0, &gpu_pod("dry", 1, 8192), true).await["allowed"],
        true
    );
    assert!(c.ledger().is_empty());
    assert_eq!(
        c.validate(0, &gpu_pod("real", 1, 8192), false).await["allowed"],
        true
    );
    assert_eq!(c.ledger().len(), 1);
    // Over quota as a dry run: refused, still no Event beyond the three.
    assert_eq!(
        c.validate(0, &gpu_pod("dry2", 1, 1), true).await["allowed"],
        false
    );
    assert_eq!(c.events().iter().map(|e| e.2).sum::<u64>(), 3);
    // The same pod again (the API server retrying a call) is not counted twice.
    assert_eq!(
        c.validate(0, &gpu_pod("real", 1, 8192), false).await["allowed"],
        true
    );
    assert_eq!(c.ledger().len(), 1);
}

/// The scheduler's assignment is what the device plugin hands out and what quota and placement
/// count; the managed label is how every cache finds the pod. A tenant with pod update rights
/// may change neither; the configured writers (the scheduler's and the device plugin's service
/// accounts) may.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_vgpu_service_accounts_may_change_the_assignment_or_the_label_at_update() {
    const SCHEDULER: &str = "system:serviceaccount:vgpu-system:vgpu-scheduler";
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        format!("policy:\n  annotationWriters: [\"{SCHEDULER}\"]\n"),
    )
    .unwrap();
    let c = cluster_with(vec![], 1, 60, &["--config", config.to_str().unwrap()]).await;
    let mut old = gpu_pod("train", 1, 4096);
    old["metadata"]["labels"] = json!({"vgpu.io/managed": "true", "app": "train"});
    let assigned = {
        let mut p = old.clone();
        p["metadata"]["annotations"] =
            json!({"vgpu.io/assignment": r#"{"v":1,"node":"n","containers":{}}"#});
        p
    };
    let update = |old: &Value, new: &Value, user: &str, dry_run: bool| {
        let body = vgpu_tests::admission::pod_update_review("u-1", old, new, user, dry_run);
        let (addr, tls) = (c.webhooks[0].1, c.tls.clone());
        async move {
            let r = https::request(addr, tls, "POST", "/validate", body)
                .await
                .unwrap();
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            r.json()["response"].clone()
        }
    };
    // The scheduler writes the assignment at bind.
    assert_eq!(
        update(&old, &assigned, SCHEDULER, false).await["allowed"],
        true
    );
    // A tenant may not forge it, change it, or drop it...
    let r = update(&old, &assigned, "alice", false).await;
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(
        r["status"]["message"],
        "vgpu policy: annotation vgpu.io/assignment is written only by the vgpu scheduler and device plugin (system:serviceaccount:vgpu-system:vgpu-scheduler); \"alice\" may not change it (rule denyReservedAnnotations, policy.annotationWriters)"
    );
    assert_eq!(
        update(&assigned, &old, "alice", false).await["allowed"],
        false
    );
    // ...nor remove the label that makes its usage count.
    let mut unlabelled = assigned.clone();
    unlabelled["metadata"]["labels"] = json!({"app": "train"});
    let r = update(&assigned, &unlabelled, "alice", true).await;
    assert_eq!(
        r["status"]["message"],
        "vgpu policy: label vgpu.io/managed is written only by the vgpu scheduler and device plugin (system:serviceaccount:vgpu-system:vgpu-scheduler); \"alice\" may not change it (rule denyReservedAnnotations, policy.annotationWriters)"
    );
    // Other labels and annotations stay the tenant's.
    let mut relabelled = assigned.clone();
    relabelled["metadata"]["labels"]["app"] = json!("eval");
    relabelled["metadata"]["annotations"]["team"] = json!("a");
    assert_eq!(
        update(&assigned, &relabelled, "alice", false).await["allowed"],
        true
    );
    // Two refusals, two occurrences of one Event (the dry run left none).
    assert_eq!(
        c.wait_for_events(2).await,
        vec![(
            "Pod/train".to_string(),
            "VGPUPolicyViolation".to_string(),
            2
        )]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_down_fails_closed_only_where_a_vgpu_quota_applies() {
    let c = cluster(
        vec![quota(
            "gpu-quota",
            json!({"limits.nvidia.com/gpumem": "40960"}),
        )],
        1,
        60,
    )
    .await;
    c.api.set_down(Some(503));
    let r = c.validate(0, &gpu_pod("p", 1, 4096), false).await;
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 503);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "vgpu quota cannot be checked in namespace team-a: the Kubernetes API is unavailable"
        ),
        "{msg}"
    );
    // No quota in this namespace: admitted without the API.
    let mut other = gpu_pod("q", 1, 4096);
    other["metadata"]["namespace"] = json!("team-b");
    assert_eq!(c.validate(0, &other, false).await["allowed"], true);
    // No vGPU at all: admitted.
    let mut plain = gpu_pod("r", 1, 1);
    plain["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "1"}});
    plain["spec"]["containers"][0]["env"] = json!([]);
    assert_eq!(c.validate(0, &plain, false).await["allowed"], true);
    // Back up: admitted again.
    c.api.set_down(None);
    assert_eq!(
        c.validate(0, &gpu_pod("p", 1, 4096), false).await["allowed"],
        true
    );
}

/// The API server's answer to a create in a namespace that does not exist (captured by the
/// real-cluster tier) reads as a missing ledger namespace, not an outage.
#[test]
fn the_api_servers_answer_for_a_missing_namespace_reads_as_such() {
    use vgpu_webhook::validate::ledger_namespace::LedgerFault;
    let captured = vgpu_tests::fixtures::load("apiserver/create-in-missing-namespace.json");
    let status: kube::core::Status =
        serde_json::from_value(captured["status"].clone()).expect("a Status");
    let namespace = captured["namespace"].as_str().expect("namespace");
    let error = kube::Error::Api(status.boxed());
    assert_eq!(
        LedgerFault::of(&error, namespace),
        Some(LedgerFault::Missing)
    );
    assert_eq!(LedgerFault::of(&error, "another"), None);
}
