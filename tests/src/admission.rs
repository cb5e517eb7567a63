//! AdmissionReview bodies as the API server sends them to a webhook (admission.k8s.io/v1).

use serde_json::{json, Value};

/// The AdmissionReview the API server sends for a Pod CREATE of `pod` (its namespace and name are
/// read from its metadata), with request `uid` and `dryRun` as given.
pub fn pod_create_review(uid: &str, pod: &Value, dry_run: bool) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": pod["metadata"]["namespace"], "operation": "CREATE",
        "name": pod["metadata"]["name"], "dryRun": dry_run, "object": pod}})
    .to_string()
    .into_bytes()
}

/// The AdmissionReview the API server sends for a Pod UPDATE from `old` to `new` by `username`.
pub fn pod_update_review(
    uid: &str,
    old: &Value,
    new: &Value,
    username: &str,
    dry_run: bool,
) -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": new["metadata"]["namespace"], "operation": "UPDATE",
        "name": new["metadata"]["name"], "dryRun": dry_run,
        "userInfo": {"username": username, "groups": ["system:authenticated"]},
        "object": new, "oldObject": old}})
    .to_string()
    .into_bytes()
}
