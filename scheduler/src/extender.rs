//! The kube-scheduler extender v1 wire types (`k8s.io/kube-scheduler/extender/v1`), with the JSON
//! field names kube-scheduler writes and reads.
//!
//! kube-scheduler sends `ExtenderArgs` to the filter and prioritize verbs. With
//! `nodeCacheCapable: true` (our chart) it sends only `nodenames` and expects `nodenames` back;
//! otherwise it sends whole Node objects in `nodes` and expects the passing ones back in `nodes`.
//! Both are handled. Node objects are kept as raw JSON: the extender reads only their names.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// The body of a filter or prioritize call.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ExtenderArgs {
    /// The pod being scheduled, whole.
    pub pod: Option<k8s_openapi::api::core::v1::Pod>,
    /// Candidate nodes, whole (when the extender is not node-cache capable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Candidate node names (when node-cache capable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    /// Passing nodes, whole (when asked with `nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<NodeList>,
    /// Passing node names (when asked with `nodenames`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodenames: Option<Vec<String>>,
    /// Nodes that do not fit now, and why; preemption may free them.
    #[serde(
        default,
        rename = "failedNodes",
        skip_serializing_if = "FailedNodesMap::is_empty"
    )]
    pub failed_nodes: FailedNodesMap,
    /// Nodes that cannot fit whatever is preempted, and why.
    #[serde(
        default,
        rename = "failedAndUnresolvableNodes",
        skip_serializing_if = "FailedNodesMap::is_empty"
    )]
    pub failed_and_unresolvable_nodes: FailedNodesMap,
    /// A failure of the call itself.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// One node's score (0..=`MaxExtenderPriority`, 10).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// Node name.
    pub host: String,
    /// Score.
    pub score: i64,
}

/// The answer to a prioritize call.
pub type HostPriorityList = Vec<HostPriority>;

/// The body of a bind call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// Pod name.
    #[serde(rename = "podName")]
    pub pod_name: String,
    /// Pod namespace.
    #[serde(rename = "podNamespace")]
    pub pod_namespace: String,
    /// Pod UID.
    #[serde(rename = "podUID")]
    pub pod_uid: String,
    /// The node chosen.
    pub node: String,
}

/// The answer to a bind call; an empty error means bound.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// Why binding failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
}

/// The name of a node object (`metadata.name`).
pub fn node_name(node: &Value) -> Option<&str> {
    node.pointer("/metadata/name").and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    /// Bodies as kube-scheduler's HTTPExtender writes them (Go's encoding/json with the
    /// extender/v1 struct tags).
    #[test]
    fn reads_and_writes_kube_scheduler_shapes() {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": []}},
            "nodenames": ["n1", "n2"]
        }))
        .unwrap();
        assert_eq!(
            args.nodenames.as_deref(),
            Some(&["n1".to_string(), "n2".to_string()][..])
        );
        assert!(args.nodes.is_none());
        let args: ExtenderArgs = serde_json::from_value(json!({
            "pod": {"metadata": {"name": "p"}},
            "nodes": {"metadata": {}, "items": [{"metadata": {"name": "n1"}}]}
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
            json!({"nodenames": ["n1"], "failedNodes": {"n2": "no GPU"}})
        );
        r.failed_and_unresolvable_nodes
            .insert("n3".into(), "bad".into());
        r.error = "x".into();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["failedAndUnresolvableNodes"], json!({"n3": "bad"}));
        assert_eq!(v["error"], "x");

        let p: HostPriorityList = vec![HostPriority {
            host: "n1".into(),
            score: 7,
        }];
        assert_eq!(
            serde_json::to_value(&p).unwrap(),
            json!([{"host": "n1", "score": 7}])
        );

        let b: ExtenderBindingArgs = serde_json::from_value(json!({
            "podName": "p", "podNamespace": "ns", "podUID": "u1", "node": "n1"
        }))
        .unwrap();
        assert_eq!(b.pod_uid, "u1");
        assert_eq!(
            serde_json::to_value(ExtenderBindingResult::default()).unwrap(),
            json!({})
        );
    }
}
