//! The kube-scheduler extender v1 wire types (`k8s.io/kube-scheduler/extender/v1`), with the JSON
//! field names kube-scheduler writes and reads.
//!
//! Those Go types (staging/src/k8s.io/kube-scheduler/extender/v1/types.go) declare no json tags,
//! so Go's encoding/json names each field exactly as the Go field: `Pod`, `Nodes`, `NodeNames`,
//! `PodName`, `PodUID`, ... kube-scheduler's HTTPExtender (pkg/scheduler/extender.go, `send`)
//! marshals the args that way and decodes answers with encoding/json, whose field matching is
//! case-insensitive; we write the Go names too, so an answer reads the same to any decoder. The
//! bodies kube-scheduler v1.36 really sends are checked in under tests/fixtures/kube-scheduler/
//! and compared with a live kube-scheduler by the real-cluster tier.
//!
//! kube-scheduler sends `ExtenderArgs` to the filter and prioritize verbs. With
//! `nodeCacheCapable: true` (our chart) it sends only `NodeNames` (and `Nodes: null`) and expects
//! `NodeNames` back; otherwise it sends whole Node objects in `Nodes` and expects the passing ones
//! back in `Nodes`. Both are handled. Node objects are kept as raw JSON: the extender reads only
//! their names.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;
use std::collections::BTreeMap;

/// The body of a filter or prioritize call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled, whole.
    #[serde(rename = "Pod", default)]
    pub pod: Option<k8s_openapi::api::core::v1::Pod>,
    /// Candidate nodes, whole (when the extender is not node-cache capable).
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Candidate node names (when node-cache capable).
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
}

/// A `v1.NodeList`, items kept as JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// Passed through as received.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "apiVersion"
    )]
    pub api_version: Option<String>,
    /// Passed through as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Passed through as received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The nodes.
    #[serde(default)]
    pub items: Vec<Value>,
}

/// Node name to failure message: a JSON object on the wire, kept as pairs in candidate order
/// (building a sorted map of thousands of names cost more than the placement itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FailedNodesMap(pub Vec<(String, String)>);

impl FailedNodesMap {
    /// Adds a node's message.
    pub fn insert(&mut self, node: String, message: String) {
        self.0.push((node, message));
    }

    /// The message for a node.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, m)| m.as_str())
    }

    /// Whether no node failed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of failed nodes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
}

impl Serialize for FailedNodesMap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de> Deserialize<'de> for FailedNodesMap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = BTreeMap::<String, String>::deserialize(d)?;
        Ok(FailedNodesMap(m.into_iter().collect()))
    }
}

/// The answer to a filter call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// Passing nodes, whole (when asked with `Nodes`).
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Passing node names (when asked with `NodeNames`).
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
    /// Nodes that do not fit now, and why; preemption may free them.
    #[serde(
        default,
        rename = "FailedNodes",
        skip_serializing_if = "FailedNodesMap::is_empty"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that cannot fit whatever is preempted, and why.
    #[serde(
        default,
        rename = "FailedAndUnresolvableNodes",
        skip_serializing_if = "FailedNodesMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// A failure of the call itself.
    #[serde(rename = "Error", default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One node's score (0..=`MaxExtenderPriority`, 10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    #[serde(rename = "Host")]
    pub host: String,
    /// Score.
    #[serde(rename = "Score")]
    pub score: i64,
}

/// The answer to a prioritize call.
pub type HostPriorityList = Vec<HostPriority>;

/// The body of a bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "PodName")]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(rename = "PodNamespace")]
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// The node chosen.
    #[serde(rename = "Node")]
    pub node: String,
}

/// The answer to a bind call; an empty error means bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Why binding failed.
    #[serde(rename = "Error", default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The name of a node object (`metadata.name`).
pub fn node_name(node: &Value) -> Option<&str> {
    node.pointer("/metadata/name").and_then(Value::as_str)
}

pub use vgpu_core::borrowed::Name;

/// A quantity as k8s-openapi reads one: a string, or a JSON number kept as its decimal text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuantityView<'a>(pub Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for QuantityView<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = QuantityView<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a quantity")
            }
            fn visit_borrowed_str<E: serde::de::Error>(
                self,
                v: &'de str,
            ) -> Result<Self::Value, E> {
                Ok(QuantityView(Cow::Borrowed(v)))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(QuantityView(Cow::Owned(v.to_string())))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(QuantityView(Cow::Owned(v.to_string())))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(QuantityView(Cow::Owned(v.to_string())))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(QuantityView(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_any(V)
    }
}

/// The pod annotations placement reads (GPU type and UUID lists, policies, NUMA binding); the others are
/// skipped without being copied. A key given twice keeps its last value, as a map would.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AnnotationsView<'a>(pub Vec<(&'static str, Name<'a>)>);

/// The annotation keys [`AnnotationsView`] keeps.
const READ_ANNOTATIONS: [&str; 7] = [
    vgpu_core::annotations::USE_GPU_TYPE,
    vgpu_core::annotations::NOUSE_GPU_TYPE,
    vgpu_core::annotations::USE_GPU_UUID,
    vgpu_core::annotations::NOUSE_GPU_UUID,
    vgpu_core::annotations::NODE_POLICY,
    vgpu_core::annotations::GPU_POLICY,
    vgpu_core::placement::NUMA_BIND,
];

impl AnnotationsView<'_> {
    /// The value of a kept annotation.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for AnnotationsView<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = AnnotationsView<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a map of strings")
            }
            fn visit_map<M: serde::de::MapAccess<'de>>(
                self,
                mut m: M,
            ) -> Result<Self::Value, M::Error> {
                let mut out: Vec<(&'static str, Name<'de>)> = Vec::new();
                while let Some(k) = m.next_key::<Name<'de>>()? {
                    // Values are strings in a valid Pod; the skipped ones are checked to be.
                    let v: Name<'de> = m.next_value()?;
                    if let Some(key) = READ_ANNOTATIONS.iter().find(|a| **a == k.as_str()) {
                        out.retain(|(k, _)| k != key);
                        out.push((key, v));
                    }
                }
                Ok(AnnotationsView(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// `metadata` as far as the extender reads it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MetaView<'a> {
    /// `metadata.name`.
    #[serde(borrow, default)]
    pub name: Option<Name<'a>>,
    /// `metadata.namespace`.
    #[serde(borrow, default)]
    pub namespace: Option<Name<'a>>,
    /// `metadata.uid`.
    #[serde(borrow, default)]
    pub uid: Option<Name<'a>>,
    /// `metadata.creationTimestamp` (RFC 3339): older waiting pods go first.
    #[serde(borrow, default, rename = "creationTimestamp")]
    pub creation_timestamp: Option<Name<'a>>,
    /// The annotations placement reads.
    #[serde(borrow, default)]
    pub annotations: Option<AnnotationsView<'a>>,
}

/// `resources` of a container.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ResourcesView<'a> {
    /// `resources.limits`.
    #[serde(borrow, default)]
    pub limits: Option<BTreeMap<Name<'a>, QuantityView<'a>>>,
    /// `resources.requests`.
    #[serde(borrow, default)]
    pub requests: Option<BTreeMap<Name<'a>, QuantityView<'a>>>,
}

/// A container's name and resources.
#[derive(Debug, Clone, Deserialize)]
pub struct ContainerView<'a> {
    /// `name` (empty when missing, as k8s-openapi reads it).
    #[serde(borrow, default)]
    pub name: Name<'a>,
    /// `resources`.
    #[serde(borrow, default)]
    pub resources: Option<ResourcesView<'a>>,
    /// `restartPolicy` (init containers: `Always` makes a sidecar).
    #[serde(borrow, default, rename = "restartPolicy")]
    pub restart_policy: Option<Name<'a>>,
}

/// `spec` as far as the extender reads it.
#[derive(Debug, Clone, Deserialize)]
pub struct SpecView<'a> {
    /// `spec.initContainers`.
    #[serde(borrow, default, rename = "initContainers")]
    pub init_containers: Option<Vec<ContainerView<'a>>>,
    /// `spec.containers` (none when missing, as k8s-openapi reads it).
    #[serde(borrow, default)]
    pub containers: Vec<ContainerView<'a>>,
    /// `spec.overhead`.
    #[serde(borrow, default)]
    pub overhead: Option<BTreeMap<Name<'a>, QuantityView<'a>>>,
}

/// The pod of an extender call, reading only what the decision needs (every other field is
/// skipped unparsed: kube-scheduler sends pods the API server has validated).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodView<'a> {
    /// `metadata`.
    #[serde(borrow, default)]
    pub metadata: Option<MetaView<'a>>,
    /// `spec`.
    #[serde(borrow, default)]
    pub spec: Option<SpecView<'a>>,
}

/// [`ExtenderArgs`] read for the filter and prioritize verbs: names borrowed from the body, the pod
/// pruned to [`PodView`]. Whole `nodes` are only noticed (that form is served from
/// [`ExtenderArgs`]).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ArgsView<'a> {
    /// The pod.
    #[serde(rename = "Pod", borrow, default)]
    pub pod: Option<PodView<'a>>,
    /// Whether whole nodes were sent.
    #[serde(rename = "Nodes", default)]
    pub nodes: Option<serde::de::IgnoredAny>,
    /// Candidate node names.
    #[serde(rename = "NodeNames", borrow, default)]
    pub nodenames: Option<Vec<Name<'a>>>,
}

/// Appends `n` to `out` in decimal, as `n.to_string()` would write it, without allocating (the
/// prioritize answer writes one per candidate node: 5000 small strings per decision before).
pub fn push_u32(out: &mut Vec<u8>, n: u32) {
    let mut digits = [0u8; 10];
    let mut at = digits.len();
    let mut n = n;
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Whether JSON would escape any byte of `b` (a control character, `"` or `\\`; DEL too, to be
/// safe). Checked 16 bytes at a time without stopping early, a loop the compiler vectorises: the
/// filter writes a failure message for most of thousands of nodes, and a byte-at-a-time check
/// was a sixth of a multi-GPU filter (`perf`, filter bench).
fn needs_escape(b: &[u8]) -> bool {
    let odd = |b: u8| (b < 0x20) | (b == b'"') | (b == b'\\') | (b == 0x7f);
    let mut chunks = b.chunks_exact(16);
    let mut any = false;
    for c in &mut chunks {
        any |= c.iter().fold(false, |acc, &b| acc | odd(b));
    }
    any || chunks.remainder().iter().any(|&b| odd(b))
}

/// Appends `s` to `out` as a JSON string.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    if !needs_escape(s.as_bytes()) {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Writing a str into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// Every odd byte at every position of strings around the 16-byte chunk size: the check
    /// finds it, and the output is serde_json's either way.
    #[test]
    fn push_json_str_writes_what_serde_writes() {
        let mut out = Vec::new();
        for len in 0..40 {
            let plain = "n".repeat(len);
            for at in 0..len {
                for odd in ['"', '\\', '\n', '\u{1}', '\u{1f}', '\u{7f}', 'é', ' '] {
                    let mut t: Vec<char> = plain.chars().collect();
                    t[at] = odd;
                    let t: String = t.into_iter().collect();
                    let slow = t
                        .bytes()
                        .any(|b| b < 0x20 || b == b'"' || b == b'\\' || b == 0x7f);
                    assert_eq!(needs_escape(t.as_bytes()), slow, "{t:?}");
                    out.clear();
                    push_json_str(&mut out, &t);
                    assert_eq!(out, serde_json::to_vec(&t).unwrap(), "{t:?}");
                }
            }
        }
    }

    #[test]
    fn push_u32_writes_what_to_string_writes() {
        let mut out = Vec::new();
        for n in [0, 1, 9, 10, 11, 99, 100, 4_294_967, u32::MAX - 1, u32::MAX]
            .into_iter()
            .chain(0..=1000)
        {
            out.clear();
            push_u32(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    /// Bodies as kube-scheduler's HTTPExtender writes them (Go's encoding/json with the
    /// extender/v1 struct tags).
    #[test]
    fn reads_and_writes_kube_scheduler_shapes() {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": []}},
            "NodeNames": ["n1", "n2"]
        }))
        .unwrap();
        assert_eq!(
            args.nodenames.as_deref(),
            Some(&["n1".to_string(), "n2".to_string()][..])
        );
        assert!(args.nodes.is_none());
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p"}},
            "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "n1"}}]}
        }))
        .unwrap();
        assert_eq!(node_name(&args.nodes.unwrap().items[0]), Some("n1"));

        let mut r = ExtenderFilterResult {
            nodenames: Some(vec!["n1".into()]),
            ..Default::default()
        };
        r.failed_nodes.insert("n2".into(), "no GPU".into());
        assert_eq!(
            serde_json::to_value(&r).unwrap(),
            json!({"NodeNames": ["n1"], "FailedNodes": {"n2": "no GPU"}})
        );
        r.failed_and_unresolvable_nodes
            .insert("n3".into(), "bad".into());
        r.error = "x".into();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["FailedAndUnresolvableNodes"], json!({"n3": "bad"}));
        assert_eq!(v["Error"], "x");

        let p: HostPriorityList = vec![HostPriority {
            host: "n1".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!([{"Host": "n1", "Score": 7}])
        );

        let b: ExtenderBindingArgs = serde_json::from_value(json!({
            "PodName": "p", "PodNamespace": "ns", "PodUID": "u1", "Node": "n1"
        }))
        .unwrap();
        assert_eq!(b.pod_uid, "u1");
        assert_eq!(
            serde_json::to_value(ExtenderBindingResult::default()).unwrap(),
            json!({})
        );
    }
}
