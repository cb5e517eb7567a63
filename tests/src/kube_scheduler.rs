//! kube-scheduler's side of the extender protocol, as the doubles play it: the bodies are the ones
//! kube-scheduler v1.36 sent (tests/fixtures/kube-scheduler/) with the caller's pod and nodes, the
//! answers are read the way its Go client reads them, and prioritize is called only when it is.

use crate::fixtures::{fill, load};
use serde_json::{json, Value};

/// The filter body for `pod` over `nodes` (an extender with `nodeCacheCapable: true`, as the chart
/// configures it).
pub fn filter_args(pod: &Value, nodes: &[&str]) -> Value {
    fill(
        &load("kube-scheduler/filter.json"),
        &[("Pod", pod.clone()), ("NodeNames", json!(nodes))],
    )
}

/// The prioritize body for `pod` over `nodes`.
pub fn prioritize_args(pod: &Value, nodes: &[&str]) -> Value {
    fill(
        &load("kube-scheduler/prioritize.json"),
        &[("Pod", pod.clone()), ("NodeNames", json!(nodes))],
    )
}

/// The bind body.
pub fn bind_args(namespace: &str, name: &str, uid: &Value, node: &str) -> Value {
    fill(
        &load("kube-scheduler/bind.json"),
        &[
            ("PodName", json!(name)),
            ("PodNamespace", json!(namespace)),
            ("PodUID", uid.clone()),
            ("Node", json!(node)),
        ],
    )
}

/// A field of an answer as kube-scheduler reads it: Go's encoding/json matches a struct field's
/// name case-insensitively (an exact match first).
pub fn field<'a>(answer: &'a Value, go_name: &str) -> &'a Value {
    let Some(m) = answer.as_object() else {
        return &Value::Null;
    };
    m.get(go_name)
        .or_else(|| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(go_name))
                .map(|(_, v)| v)
        })
        .unwrap_or(&Value::Null)
}

/// Whether kube-scheduler calls prioritize for this many feasible nodes: with a single one it
/// takes that node without scoring (pkg/scheduler/schedule_one.go, "When only one node after
/// predicate, just use it").
pub fn calls_prioritize(feasible: usize) -> bool {
    feasible > 1
}
