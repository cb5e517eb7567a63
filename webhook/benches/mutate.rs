#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! The mutate path without the network: parse an AdmissionReview, decide, serialise the response.
//! `cargo bench -p vgpu-webhook --bench mutate`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use vgpu_webhook::admission::AdmissionRequest;
use vgpu_webhook::mutate::MutateSettings;
use vgpu_webhook::server::decide_mutation;

const EXAMPLE: &str = include_str!("../../examples/admission-review.json");

/// What `/mutate` does: read the review, decide, write the answer.
fn full_path(body: &[u8], settings: &MutateSettings) -> Vec<u8> {
    let req = AdmissionRequest::from_review_bytes(body).unwrap_or_else(|e| panic!("{e}"));
    let (resp, _) = decide_mutation(&req, settings);
    let mut out = Vec::with_capacity(1024);
    resp.into_review().write_json(&mut out).unwrap_or_default();
    out
}

/// The example pod as the API server would really send it: defaulted fields, probes, volumes,
/// managed fields and the `kubectl apply` annotation (about 6 KiB).
fn realistic(example: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(example).unwrap_or_default();
    let pod = &mut v["request"]["object"];
    let applied = serde_json::to_string(&pod.clone()).unwrap_or_default();
    pod["metadata"]["annotations"] = serde_json::json!({
        "kubectl.kubernetes.io/last-applied-configuration": applied});
    pod["metadata"]["uid"] = serde_json::json!("0c2f8f55-4d36-4b1e-9b5c-2f4c3f0e1a77");
    pod["metadata"]["creationTimestamp"] = serde_json::json!("2026-12-03T10:00:00Z");
    pod["metadata"]["managedFields"] = serde_json::json!([{"manager": "kubectl-client-side-apply",
        "operation": "Update", "apiVersion": "v1", "time": "2026-12-03T10:00:00Z",
        "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {},
        "f:kubectl.kubernetes.io/last-applied-configuration": {}}, "f:labels": {".": {}, "f:app": {}}},
        "f:spec": {"f:containers": {"k:{\"name\":\"pytorch\"}": {".": {}, "f:env": {}, "f:image": {},
        "f:name": {}, "f:resources": {".": {}, "f:limits": {}, "f:requests": {}}}}}}}]);
    let spec = &mut pod["spec"];
    spec["restartPolicy"] = "Always".into();
    spec["terminationGracePeriodSeconds"] = 30.into();
    spec["dnsPolicy"] = "ClusterFirst".into();
    spec["serviceAccountName"] = "default".into();
    spec["securityContext"] = serde_json::json!({});
    spec["enableServiceLinks"] = true.into();
    spec["preemptionPolicy"] = "PreemptLowerPriority".into();
    spec["priority"] = 0.into();
    spec["tolerations"] = serde_json::json!([
        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]);
    spec["volumes"] = serde_json::json!([{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420,
        "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}]);
    let c = &mut spec["containers"][0];
    c["imagePullPolicy"] = "IfNotPresent".into();
    c["terminationMessagePath"] = "/dev/termination-log".into();
    c["terminationMessagePolicy"] = "File".into();
    c["command"] = serde_json::json!([
        "python",
        "-u",
        "train.py",
        "--epochs",
        "90",
        "--batch-size",
        "256"
    ]);
    c["ports"] = serde_json::json!([{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}]);
    c["readinessProbe"] = serde_json::json!({"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
        "initialDelaySeconds": 5, "periodSeconds": 10, "timeoutSeconds": 1, "successThreshold": 1, "failureThreshold": 3});
    c["volumeMounts"] = serde_json::json!([{"name": "kube-api-access-x7k2p", "readOnly": true,
        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]);
    v.to_string()
}

fn bench(c: &mut Criterion) {
    let settings = MutateSettings::default();
    let mut group = c.benchmark_group("mutate");
    group.throughput(Throughput::Elements(1));

    // Baseline in the same run: just parsing the JSON body into a Value.
    group.bench_function("baseline_parse_json_value", |b| {
        b.iter(|| {
            serde_json::from_slice::<serde_json::Value>(black_box(EXAMPLE.as_bytes()))
                .unwrap_or_default()
        })
    });
    let real = realistic(EXAMPLE);
    // A pod with eight GPU containers and user env to replace.
    let mut big: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap_or_default();
    let container = big["request"]["object"]["spec"]["containers"][0].clone();
    let mut cs = Vec::new();
    for i in 0..8 {
        let mut c = container.clone();
        c["name"] = serde_json::json!(format!("c{i}"));
        c["env"] = serde_json::json!([{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}, {"name": "A", "value": "b"}]);
        cs.push(c);
    }
    big["request"]["object"]["spec"]["containers"] = serde_json::Value::Array(cs);
    let big = big.to_string();
    for (pod, body) in [
        ("example_pod", EXAMPLE.as_bytes()),
        ("realistic_pod", real.as_bytes()),
        ("eight_containers", big.as_bytes()),
    ] {
        group.bench_function(format!("parse_decide_serialize/{pod}"), |b| {
            b.iter(|| full_path(black_box(body), &settings))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
