//! The API server's validation of the objects whose refusal vgpu's code relies on, with its exact
//! words. Pinned by tests/fixtures/apiserver/ (captured from kube-apiserver v1.36 by the
//! real-cluster tier) and checked against them in tests/fake-apiserver/tests/fixtures.rs.

use crate::status::ApiError;
use serde_json::Value;

/// `ValidateEventCreate` (pkg/apis/core/validation/events.go), the namespace rule: an Event about a
/// namespaced object lives in that object's namespace; one about a cluster-scoped object (its
/// `involvedObject`/`regarding` namespace empty) lives in `default`, or, for an Event with an
/// `eventTime` (every events.k8s.io/v1 Event), also in `kube-system`. Legacy Events (no
/// `eventTime`) must match the involved object's namespace exactly.
pub fn event(obj: &Value, namespace: &str, name: &str) -> Result<(), ApiError> {
    let involved = obj
        .get("regarding")
        .or_else(|| obj.get("involvedObject"))
        .and_then(|o| o.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let has_time = obj.get("eventTime").is_some_and(|t| !t.is_null());
    let ok = match (involved.is_empty(), has_time) {
        (true, true) => matches!(namespace, "default" | "kube-system"),
        (true, false) => matches!(namespace, "" | "default"),
        (false, true) => true,
        (false, false) => involved == namespace,
    };
    if ok {
        return Ok(());
    }
    let mut e = ApiError::invalid(format!(
        "Event {name:?} is invalid: involvedObject.namespace: Invalid value: {involved:?}: does not match event.namespace"
    ));
    e.details = Some((name.into(), "Event".into(), String::new()));
    Err(e)
}
