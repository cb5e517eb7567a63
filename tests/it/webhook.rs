//! The real `vgpu-webhook` binary over real TLS: each pod shape is sent as the API server sends it,
//! the returned patch is applied with json-patch, and the resulting pod is checked.

use base64::Engine as _;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use vgpu_tests::certs::TestPki;
use vgpu_tests::https;
use vgpu_tests::process::Running;

struct Webhook {
    proc: Running,
    _dir: tempfile::TempDir,
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
}

impl Webhook {
    fn start(extra: &[&str]) -> Webhook {
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::new(&[]);
        let (_, cert, key) = pki.write(dir.path());
        let (proc, addr) = vgpu_tests::process::start_webhook(&cert, &key, extra);
        Webhook {
            proc,
            _dir: dir,
            addr,
            tls: Arc::new(pki.client_config()),
        }
    }

    async fn post(&self, path: &str, body: Vec<u8>) -> https::Reply {
        https::request(self.addr, self.tls.clone(), "POST", path, body)
            .await
            .unwrap()
    }

    /// Sends a review for `object` and returns the response part.
    async fn review(&self, operation: &str, kind: &str, object: &Value) -> Value {
        let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "uid-1", "kind": {"group": if kind == "Pod" { "" } else { "apps" }, "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a", "operation": operation, "object": object, "dryRun": false}});
        let reply = self.post("/mutate", review.to_string().into_bytes()).await;
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        let body = reply.json();
        assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(body["kind"], "AdmissionReview");
        assert_eq!(body["response"]["uid"], "uid-1", "uid must be echoed");
        body["response"].clone()
    }

    /// Mutates a pod and returns it with the patch applied (and the response).
    async fn mutate(&self, pod: &Value) -> (Value, Value) {
        let resp = self.review("CREATE", "Pod", pod).await;
        assert_eq!(resp["allowed"], true, "{resp}");
        let mut out = pod.clone();
        if let Some(p) = resp.get("patch").and_then(Value::as_str) {
            assert_eq!(resp["patchType"], "JSONPatch");
            let bytes = base64::engine::general_purpose::STANDARD.decode(p).unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
            json_patch::patch(&mut out, &patch)
                .unwrap_or_else(|e| panic!("patch does not apply: {e}\n{patch:?}"));
        }
        (out, resp)
    }
}

fn pod(containers: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team-a"}, "spec": {"containers": containers}})
}

fn env_of(c: &Value) -> Vec<(String, String)> {
    c["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or("").to_string(),
                        e["value"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn vgpu_env(c: &Value) -> Vec<(String, String)> {
    env_of(c)
        .into_iter()
        .filter(|(n, _)| n.starts_with("CUDA_DEVICE_"))
        .collect()
}

fn pair(n: &str, v: &str) -> (String, String) {
    (n.to_string(), v.to_string())
}

#[tokio::test]
async fn mutates_gpu_pod_shapes() {
    let wh = Webhook::start(&["--runtime-class", "vgpu"]);

    // 1. limits-only, single container, no env/labels/annotations.
    let (p, _) = wh.mutate(&pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}}}]))).await;
    assert_eq!(p["spec"]["schedulerName"], "vgpu-scheduler");
    assert_eq!(p["spec"]["runtimeClassName"], "vgpu");
    assert_eq!(p["metadata"]["labels"]["vgpu.io/managed"], "true");
    let marker: Value = serde_json::from_str(
        p["metadata"]["annotations"]["vgpu.io/injected"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        marker,
        json!({"v": 1, "c": {"c": {"gpus": 1, "memMiB": 4096, "cores": 30}}})
    );
    let c = &p["spec"]["containers"][0];
    assert_eq!(
        vgpu_env(c),
        [
            pair("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
            pair("CUDA_DEVICE_SM_LIMIT", "30")
        ]
    );
    for section in ["limits", "requests"] {
        assert_eq!(
            c["resources"][section],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}),
            "{section}"
        );
    }
    // 2. the same pod again (already mutated): no patch at all.
    let resp = wh.review("CREATE", "Pod", &p).await;
    assert_eq!(resp["allowed"], true);
    assert!(
        resp.get("patch").is_none(),
        "already mutated pod got a patch: {resp}"
    );

    // 3. requests-only: limits are added to match.
    let (p, _) = wh.mutate(&pod(json!([{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2Gi"}}}]))).await;
    let c = &p["spec"]["containers"][0];
    assert_eq!(
        c["resources"]["limits"],
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2147483648", "nvidia.com/gpucores": "0"})
    );
    assert_eq!(
        c["resources"]["requests"]["nvidia.com/gpumem"], "2Gi",
        "user's spelling of an equal quantity is kept"
    );
    assert_eq!(
        vgpu_env(c),
        [
            pair("CUDA_DEVICE_MEMORY_LIMIT", "2147483648m"),
            pair("CUDA_DEVICE_SM_LIMIT", "0")
        ]
    );

    // 4. multi-container: only the GPU container changes.
    let (p, _) = wh.mutate(&pod(json!([
        {"name": "sidecar", "resources": {"limits": {"cpu": "1"}}, "env": [{"name": "X", "value": "1"}]},
        {"name": "gpu", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    ]))).await;
    assert_eq!(env_of(&p["spec"]["containers"][0]), [pair("X", "1")]);
    assert_eq!(
        p["spec"]["containers"][0]["resources"],
        json!({"limits": {"cpu": "1"}})
    );
    assert_eq!(
        vgpu_env(&p["spec"]["containers"][1]),
        [pair("CUDA_DEVICE_SM_LIMIT", "0")],
        "whole card: no memory limit env (its MiB are known at placement)"
    );
    assert_eq!(
        p["spec"]["containers"][1]["resources"]["limits"]["nvidia.com/gpumem-percentage"],
        "100"
    );

    // 5. init containers are covered too.
    let mut with_init =
        pod(json!([{"name": "main", "resources": {"limits": {"nvidia.com/gpumem": "1000"}}}]));
    with_init["spec"]["initContainers"] = json!([{"name": "warmup", "resources": {"limits": {"nvidia.com/gpumem-percentage": "25"}}}]);
    let (p, _) = wh.mutate(&with_init).await;
    assert_eq!(
        vgpu_env(&p["spec"]["initContainers"][0]),
        [pair("CUDA_DEVICE_SM_LIMIT", "0")]
    );
    assert_eq!(
        p["spec"]["initContainers"][0]["resources"]["limits"]["nvidia.com/gpumem-percentage"],
        "25"
    );
    assert_eq!(
        vgpu_env(&p["spec"]["containers"][0])[0],
        pair("CUDA_DEVICE_MEMORY_LIMIT", "1000m")
    );
    let marker = p["metadata"]["annotations"]["vgpu.io/injected"]
        .as_str()
        .unwrap();
    assert!(
        marker.contains("\"warmup\"") && marker.contains("\"main\""),
        "{marker}"
    );

    // 6. existing env, labels and annotations are kept; user-set reserved variables are replaced.
    let mut existing = pod(
        json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "512"}},
        "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}, {"name": "KEEP", "value": "y"},
                {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80g"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}]}]),
    );
    existing["metadata"]["labels"] = json!({"app": "x"});
    existing["metadata"]["annotations"] = json!({"team": "a"});
    let (p, _) = wh.mutate(&existing).await;
    assert_eq!(
        p["metadata"]["labels"],
        json!({"app": "x", "vgpu.io/managed": "true"})
    );
    assert_eq!(p["metadata"]["annotations"]["team"], "a");
    assert_eq!(
        env_of(&p["spec"]["containers"][0]),
        [
            pair("CUDA_DEVICE_MEMORY_LIMIT", "512m"),
            pair("KEEP", "y"),
            pair("CUDA_DEVICE_SM_LIMIT", "0")
        ]
    );

    // 7. only gpucores: one GPU, whole card.
    let (p, _) = wh
        .mutate(&pod(
            json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpucores": "50"}}}]),
        ))
        .await;
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"],
        json!({"nvidia.com/gpucores": "50", "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "100"})
    );

    // 8. resources with an empty limits map and absent requests.
    let (p, _) = wh.mutate(&pod(json!([{"name": "c", "resources": {"limits": {}, "requests": {"nvidia.com/gpu": "1"}}}]))).await;
    assert_eq!(
        p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"],
        "1"
    );

    // 9. a pod that already has a runtime class keeps it.
    let mut rc = pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
    rc["spec"]["runtimeClassName"] = json!("nvidia");
    let (p, resp) = wh.mutate(&rc).await;
    assert_eq!(p["spec"]["runtimeClassName"], "nvidia");
    assert_eq!(resp["warnings"].as_array().map(Vec::len), Some(1));
}

#[tokio::test]
async fn leaves_alone_what_is_not_a_new_gpu_pod() {
    let wh = Webhook::start(&[]);

    // 10. foreign scheduler: left alone, with a warning, but still limited.
    let mut foreign = pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
    foreign["spec"]["schedulerName"] = json!("volcano");
    let (p, resp) = wh.mutate(&foreign).await;
    assert_eq!(p["spec"]["schedulerName"], "volcano");
    assert!(
        resp["warnings"][0].as_str().unwrap().contains("volcano"),
        "{resp}"
    );
    assert!(
        p["spec"].get("runtimeClassName").is_none(),
        "no runtime class configured"
    );

    // 11. non-GPU pod: allowed, no patch.
    let resp = wh
        .review(
            "CREATE",
            "Pod",
            &pod(json!([{"name": "c", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}])),
        )
        .await;
    assert_eq!(resp, json!({"uid": "uid-1", "allowed": true}));

    // 12. non-Pod object, even one whose template asks for GPUs.
    let deploy = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}});
    assert_eq!(
        wh.review("CREATE", "Deployment", &deploy).await,
        json!({"uid": "uid-1", "allowed": true})
    );

    // 13. UPDATE of a GPU pod: not ours to change.
    let gpu = pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
    assert_eq!(
        wh.review("UPDATE", "Pod", &gpu).await,
        json!({"uid": "uid-1", "allowed": true})
    );

    // 14. gpu: 0 alone asks for nothing.
    let zero = pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "0"}}}]));
    assert_eq!(
        wh.review("CREATE", "Pod", &zero).await,
        json!({"uid": "uid-1", "allowed": true})
    );
}

#[tokio::test]
async fn refuses_invalid_requests_naming_container_and_field() {
    let wh = Webhook::start(&[]);
    let cases = [
        (json!({"nvidia.com/gpucores": "150"}), "container \"train\": nvidia.com/gpucores: 150 is out of range 0-100"),
        (json!({"nvidia.com/gpumem": "abc"}), "container \"train\": nvidia.com/gpumem: \"abc\" is not a Kubernetes quantity"),
        (json!({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1024"}), "container \"train\": nvidia.com/gpu: 0 GPUs cannot carry nvidia.com/gpumem"),
        (json!({"nvidia.com/gpumem": "1024", "nvidia.com/gpumem-percentage": "50"}), "container \"train\": nvidia.com/gpumem and nvidia.com/gpumem-percentage are mutually exclusive; give one"),
        (json!({"nvidia.com/gpu": "500m"}), "container \"train\": nvidia.com/gpu: \"500m\" is not a whole number"),
    ];
    for (limits, message) in cases {
        // 15-19.
        let resp = wh
            .review(
                "CREATE",
                "Pod",
                &pod(json!([{"name": "ok"}, {"name": "train", "resources": {"limits": limits}}])),
            )
            .await;
        assert_eq!(resp["allowed"], false, "{resp}");
        assert_eq!(resp["status"]["code"], 422);
        assert_eq!(resp["status"]["reason"], "Invalid");
        assert_eq!(resp["status"]["message"], format!("vgpu: {message}"));
        assert!(resp.get("patch").is_none());
    }
    // 20. requests != limits.
    let resp = wh.review("CREATE", "Pod", &pod(json!([{"name": "train", "resources": {"limits": {"nvidia.com/gpumem": "2048"}, "requests": {"nvidia.com/gpumem": "1024"}}}]))).await;
    assert_eq!(resp["status"]["code"], 422);
    // 21. an ephemeral container that names a vGPU resource.
    let mut eph = pod(json!([{"name": "c"}]));
    eph["spec"]["ephemeralContainers"] =
        json!([{"name": "dbg", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]);
    let resp = wh.review("CREATE", "Pod", &eph).await;
    assert_eq!(resp["status"]["message"], "vgpu: container \"dbg\": nvidia.com/gpu: ephemeral containers cannot request vGPU resources");
}

#[tokio::test]
async fn bad_http_input_gets_4xx_never_5xx() {
    let wh = Webhook::start(&[]);
    let reply = wh.post("/mutate", b"{this is not json".to_vec()).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["reason"], "BadRequest");
    let no_uid = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"kind": {"kind": "Pod"}, "operation": "CREATE"}});
    let reply = wh.post("/mutate", no_uid.to_string().into_bytes()).await;
    assert_eq!(reply.status, 400);
    assert!(reply.json()["message"]
        .as_str()
        .unwrap()
        .contains("request.uid"));
    let reply = wh.post("/mutate", vec![b'x'; 3 * 1024 * 1024 + 1]).await;
    assert_eq!(reply.status, 413);
    let reply = https::request(wh.addr, wh.tls.clone(), "GET", "/healthz", vec![])
        .await
        .unwrap();
    assert_eq!(
        (reply.status, reply.body.as_slice()),
        (200, b"ok".as_slice())
    );
    // The server is still fine after all that.
    let (p, _) = wh
        .mutate(&pod(
            json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]),
        ))
        .await;
    assert_eq!(p["spec"]["schedulerName"], "vgpu-scheduler");
}

/// `YYYY-MM-DDTHH:MM:SS.ffffffZ`, the timestamp tracing-subscriber writes.
fn is_utc_micros_timestamp(s: &str) -> bool {
    s.len() == 27
        && s.bytes().enumerate().all(|(i, b)| match i {
            4 | 7 => b == b'-',
            10 => b == b'T',
            13 | 16 => b == b':',
            19 => b == b'.',
            26 => b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

/// One line per admission, with uid, namespace, pod, decision and duration, in the text format
/// and in the JSON format the chart runs (`--log-format json`).
#[tokio::test]
async fn each_admission_is_logged_once_with_its_fields() {
    let gpu_pod = pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]));
    for json_format in [false, true] {
        let extra: &[&str] = if json_format {
            &["--log-format", "json"]
        } else {
            &[]
        };
        let mut wh = Webhook::start(extra);
        wh.mutate(&gpu_pod).await;
        // A body that is not a review: logged after the admission, by the same writer, in order.
        assert_eq!(wh.post("/mutate", b"{not json".to_vec()).await.status, 400);
        let wait = std::time::Duration::from_secs(10);
        let bad = wh.proc.wait_for_line(wait, |l| l.contains("bad-request"));
        let lines: Vec<String> = wh
            .proc
            .output()
            .into_iter()
            .filter(|l| l.contains("uid-1"))
            .collect();
        assert_eq!(lines.len(), 1, "one line per admission: {lines:?}");
        let line = &lines[0];
        if json_format {
            let v: Value = serde_json::from_str(line).unwrap();
            assert!(
                is_utc_micros_timestamp(v["timestamp"].as_str().unwrap()),
                "{line}"
            );
            assert_eq!(v["level"], "INFO");
            assert_eq!(v["target"], "vgpu_webhook::server");
            assert_eq!(v["message"], "admission");
            assert_eq!(v["endpoint"], "mutate");
            assert_eq!(v["uid"], "uid-1");
            assert_eq!(v["namespace"], "team-a");
            assert_eq!(v["pod"], "p");
            assert_eq!(v["decision"], "patched");
            assert!(v["duration_us"].is_u64(), "{line}");
            let bad: Value = serde_json::from_str(&bad).unwrap();
            assert_eq!(
                (&bad["decision"], &bad["endpoint"]),
                (&json!("bad-request"), &json!("mutate"))
            );
        } else {
            let (stamp, rest) = line
                .split_at_checked(27)
                .unwrap_or_else(|| panic!("{line}"));
            assert!(is_utc_micros_timestamp(stamp), "{line}");
            let want = r#"  INFO vgpu_webhook::server: admission endpoint="mutate" uid=uid-1 namespace="team-a" pod="p" decision="patched" duration_us="#;
            assert!(rest.starts_with(want), "{line}");
            assert!(rest[want.len()..].parse::<u64>().is_ok(), "{line}");
            assert!(bad.contains(r#"decision="bad-request""#), "{bad}");
        }
    }
}

#[tokio::test]
async fn config_file_renames_resources_and_changes_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("vgpu.yaml");
    std::fs::write(
        &cfg,
        "resourceNames:\n  gpu: example.com/vgpu\ndefaults:\n  gpucores: 10\n",
    )
    .unwrap();
    let wh = Webhook::start(&[
        "--config",
        cfg.to_str().unwrap(),
        "--scheduler-name",
        "gpu-sched",
    ]);
    let (p, _) = wh
        .mutate(&pod(
            json!([{"name": "c", "resources": {"limits": {"example.com/vgpu": "1"}}}]),
        ))
        .await;
    assert_eq!(p["spec"]["schedulerName"], "gpu-sched");
    assert_eq!(
        vgpu_env(&p["spec"]["containers"][0]),
        [pair("CUDA_DEVICE_SM_LIMIT", "10")]
    );
    let resp = wh
        .review(
            "CREATE",
            "Pod",
            &pod(json!([{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}])),
        )
        .await;
    assert_eq!(
        resp,
        json!({"uid": "uid-1", "allowed": true}),
        "the old name is not a vGPU resource any more"
    );
}

#[test]
fn a_broken_config_file_stops_the_binary_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, "defaults:\n  gpucore: 1\n").unwrap();
    let out = Command::new(vgpu_tests::binary("vgpu-webhook"))
        .args(["--dev", "--listen", "127.0.0.1:0", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("unknown field `gpucore`"),
        "{err}"
    );
}

#[test]
fn the_example_review_is_patched() {
    let body =
        std::fs::read(vgpu_tests::repo_root().join("examples/admission-review.json")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let wh = Webhook::start(&[]);
        let reply = wh.post("/mutate", body).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["response"]["patchType"], "JSONPatch");
    });
}
