//! Reading a pod object for the mutating decision without building a JSON tree of all of it.
//!
//! The mutation ([`crate::mutate`]) reads a handful of paths of the pod: `metadata.name`,
//! `metadata.generateName`, one label, one annotation, `spec.schedulerName`,
//! `spec.runtimeClassName`, and per container its `name`, `resources.limits`,
//! `resources.requests` and `env` entries (`name`, `value`, `valueFrom`). [`PrunedPod`]
//! deserialises exactly those into a [`Value`] and passes over everything else (images, probes,
//! volumes, managed fields, the `kubectl apply` annotation ...) without allocating, so the decision
//! on the pruned value is the decision on the whole pod.
//!
//! Whatever is skipped is still checked the way [`Value`] checks it (string escapes and UTF-8,
//! number ranges, nesting depth), so a body is accepted here exactly when it would be accepted as a
//! whole `Value`. Where the object holds something of an unexpected type at one of the paths read
//! (a string where `spec` should be an object, say), that part is kept whole, so the mutation sees
//! and reports the same shape error.

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Map, Number, Value};
use std::fmt;
use vgpu_core::annotations::{INJECTED, MANAGED_LABEL};
use vgpu_core::borrowed::Name;

/// A pod object with only the fields the mutation reads (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct PrunedPod(pub Value);

impl<'de> Deserialize<'de> for PrunedPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Node::Pod.deserialize(d).map(PrunedPod)
    }
}

/// Where in the pod a value sits, and so which of its keys are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Node {
    /// Kept whole.
    Full,
    Pod,
    Metadata,
    /// A string map of which one key is read.
    OnlyKey(&'static str),
    Spec,
    Containers,
    Container,
    Resources,
    Env,
    EnvVar,
}

impl Node {
    /// The node of `key` within this object node; `None`: skipped.
    fn child(self, key: &str) -> Option<Node> {
        Some(match (self, key) {
            (Node::Pod, "metadata") => Node::Metadata,
            (Node::Pod, "spec") => Node::Spec,
            (Node::Metadata, "name" | "generateName") => Node::Full,
            (Node::Metadata, "labels") => Node::OnlyKey(MANAGED_LABEL),
            (Node::Metadata, "annotations") => Node::OnlyKey(INJECTED),
            (Node::OnlyKey(k), key) if k == key => Node::Full,
            (Node::Spec, "schedulerName" | "runtimeClassName") => Node::Full,
            (Node::Spec, "containers" | "initContainers" | "ephemeralContainers") => {
                Node::Containers
            }
            (Node::Container, "name") => Node::Full,
            (Node::Container, "resources") => Node::Resources,
            (Node::Container, "env") => Node::Env,
            (Node::Resources, "limits" | "requests") => Node::Full,
            (Node::EnvVar, "name" | "value" | "valueFrom") => Node::Full,
            _ => return None,
        })
    }

    /// The node of the elements of this list node.
    fn element(self) -> Option<Node> {
        match self {
            Node::Containers => Some(Node::Container),
            Node::Env => Some(Node::EnvVar),
            _ => None,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Node {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        match self {
            Node::Full => Value::deserialize(d),
            node => d.deserialize_any(NodeVisitor(node)),
        }
    }
}

/// Builds the same [`Value`] as `Value`'s own visitor for everything but the objects and lists of
/// the paths read, whose other keys it skips.
struct NodeVisitor(Node);

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        self.0.deserialize(d)
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let Some(element) = self.0.element() else {
            return Value::deserialize(SeqAccessDeserializer::new(seq));
        };
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(element)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        if self.0.element().is_some() {
            return Value::deserialize(MapAccessDeserializer::new(map));
        }
        let mut out = Map::new();
        while let Some(Name(key)) = map.next_key()? {
            match self.0.child(&key) {
                // A repeated key replaces the earlier value, as in `Value`.
                Some(node) => {
                    let v = map.next_value_seed(node)?;
                    out.insert(key.into_owned(), v);
                }
                None => {
                    map.next_value::<Skip>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// Any JSON value, read and checked like [`Value`] (unlike `IgnoredAny`, which lets serde_json
/// skip strings without checking escapes), and dropped.
pub(crate) struct Skip;

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_none<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Skip, D::Error> {
        Skip::deserialize(d)
    }
    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Skip, A::Error> {
        while seq.next_element::<Skip>()?.is_some() {}
        Ok(Skip)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Skip, A::Error> {
        while map.next_entry::<Skip, Skip>()?.is_some() {}
        Ok(Skip)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn pruned(v: &Value) -> Value {
        serde_json::from_str::<PrunedPod>(&v.to_string()).unwrap().0
    }

    #[test]
    fn keeps_what_the_mutation_reads_and_nothing_else() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "generateName": "p-", "namespace": "ns",
                "labels": {"app": "x", "vgpu.io/managed": "true"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{\"a\":1}",
                    "vgpu.io/injected": "m"},
                "managedFields": [{"manager": "kubectl"}]},
            "spec": {"schedulerName": "s", "runtimeClassName": "r", "volumes": [{"name": "v"}],
                "containers": [{"name": "c", "image": "i", "args": ["a"],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": 2}, "claims": []},
                    "env": [{"name": "A", "value": "b"}, {"name": "B", "valueFrom": {"fieldRef": {}}}, 7]}],
                "initContainers": [{"name": "i", "image": "x"}],
                "ephemeralContainers": null},
            "status": {"phase": "Pending"}});
        assert_eq!(
            pruned(&pod),
            json!({"metadata": {"name": "p", "generateName": "p-",
                    "labels": {"vgpu.io/managed": "true"}, "annotations": {"vgpu.io/injected": "m"}},
                "spec": {"schedulerName": "s", "runtimeClassName": "r",
                    "containers": [{"name": "c",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": 2}},
                        "env": [{"name": "A", "value": "b"}, {"name": "B", "valueFrom": {"fieldRef": {}}}, 7]}],
                    "initContainers": [{"name": "i"}],
                    "ephemeralContainers": null}})
        );
    }

    #[test]
    fn unexpected_shapes_are_kept_whole() {
        for pod in [
            json!({"spec": "x"}),
            json!({"spec": [1, {"a": 2}]}),
            json!({"metadata": 5, "spec": {"containers": {"name": "c", "image": "i"}}}),
            json!({"spec": {"containers": [3, null, "s", [1]]}}),
            json!({"spec": {"containers": [{"resources": [1], "env": {"a": 1}}]}}),
            json!({"metadata": {"labels": [1], "annotations": "a"}}),
            json!({"spec": {"containers": [{"env": [[1], true, 1.5, -3]}]}}),
            json!(null),
            json!(17),
        ] {
            assert_eq!(pruned(&pod), pod, "{pod}");
        }
    }

    #[test]
    fn repeated_keys_keep_the_last_value_as_value_does() {
        let body = r#"{"spec": {"schedulerName": "a", "schedulerName": "b"}, "spec": {"runtimeClassName": "r"}}"#;
        let whole: Value = serde_json::from_str(body).unwrap();
        assert_eq!(serde_json::from_str::<PrunedPod>(body).unwrap().0, whole);
    }

    #[test]
    fn skipped_parts_are_checked_like_value() {
        for body in [
            r#"{"status": "\ud800"}"#,
            r#"{"status": 1e400}"#,
            "{\"status\": \"a\u{1}\"}",
            r#"{"spec": {"volumes": [{"x": "\q"}]}}"#,
        ] {
            assert!(serde_json::from_str::<Value>(body).is_err(), "{body}");
            assert!(serde_json::from_str::<PrunedPod>(body).is_err(), "{body}");
        }
        let bad_utf8 = b"{\"status\": \"\xff\"}";
        assert!(serde_json::from_slice::<Value>(bad_utf8).is_err());
        assert!(serde_json::from_slice::<PrunedPod>(bad_utf8).is_err());
        let deep = format!("{{\"status\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert!(serde_json::from_str::<PrunedPod>(&deep).is_err());
    }
}
