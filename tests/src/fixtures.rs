//! Contract fixtures: what the real components sent and answered, captured from Kubernetes v1.36 by
//! the real-cluster tier (tests/cluster/fixtures.rs) and checked in under `tests/fixtures/`. The
//! doubles build their calls from these files, so a double cannot speak a dialect the real
//! component does not; the tier compares them with what the real components send now, and
//! `VGPU_UPDATE_FIXTURES=1` rewrites them from a live cluster.

use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// The fixtures directory.
pub fn dir() -> PathBuf {
    crate::repo_root().join("tests/fixtures")
}

/// A fixture file (`kube-scheduler/filter.json`), parsed.
pub fn load(name: &str) -> Value {
    let path = dir().join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// The JSON kind of a value, as a word.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The top-level shape of an object: each key with the kind of its value. Two bodies of the same
/// call have the same shape whatever pod or node they carry.
pub fn shape(v: &Value) -> Value {
    let m: Map<String, Value> = v
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), json!(kind(v))))
        .collect();
    Value::Object(m)
}

/// `template` with the value of each existing key in `fields` replaced: a body shaped exactly as
/// the fixture, carrying the caller's values. Panics when the fixture has no such key (the double
/// would otherwise invent a field the real component never sends).
pub fn fill(template: &Value, fields: &[(&str, Value)]) -> Value {
    let mut v = template.clone();
    for (k, value) in fields {
        let slot = v
            .get_mut(*k)
            .unwrap_or_else(|| panic!("the fixture has no field {k:?}: {template}"));
        *slot = value.clone();
    }
    v
}
