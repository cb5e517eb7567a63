//! Reading the parts of a pod object that vGPU admission needs, straight from its JSON.
//!
//! The webhook works on `serde_json::Value` rather than a typed Pod because the patch must address
//! exactly what is (and is not) present in the object the API server sent: an absent `env` needs an
//! `add` of the whole array, an existing one needs element operations at the right index.

use serde_json::Value;
use thiserror::Error;
use vgpu_core::request::{ContainerKind, ContainerResources};

/// The object is not shaped like a Pod.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{path}: {problem}")]
pub struct ShapeError {
    /// JSON path of the offending field (`spec.containers[1].resources.limits`).
    pub path: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

/// One container as found in the pod.
#[derive(Debug, Clone)]
pub struct PodContainer<'a> {
    /// Its resources, as strings.
    pub resources: ContainerResources,
    /// Index within its list.
    pub index: usize,
    /// The container object itself.
    pub json: &'a Value,
}

const KINDS: [ContainerKind; 3] = [
    ContainerKind::Init,
    ContainerKind::App,
    ContainerKind::Ephemeral,
];

/// All containers of the pod: init containers, then app containers, then ephemeral ones.
pub fn containers(pod: &Value) -> Result<Vec<PodContainer<'_>>, ShapeError> {
    let spec = match pod.get("spec") {
        Some(Value::Object(_)) => &pod["spec"],
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(_) => {
            return Err(ShapeError {
                path: "spec".into(),
                problem: "expected an object",
            })
        }
    };
    let mut out = Vec::new();
    for kind in KINDS {
        let list = match spec.get(kind.field()) {
            None | Some(Value::Null) => continue,
            Some(Value::Array(list)) => list,
            Some(_) => {
                return Err(ShapeError {
                    path: format!("spec.{}", kind.field()),
                    problem: "expected an array",
                })
            }
        };
        for (index, c) in list.iter().enumerate() {
            let path = || format!("spec.{}[{index}]", kind.field());
            if !c.is_object() {
                return Err(ShapeError {
                    path: path(),
                    problem: "expected an object",
                });
            }
            let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
            let mut resources = ContainerResources::new(name, kind);
            if let Some(r) = c.get("resources").filter(|r| !r.is_null()) {
                resources.limits =
                    quantity_map(r.get("limits"), || format!("{}.resources.limits", path()))?;
                resources.requests = quantity_map(r.get("requests"), || {
                    format!("{}.resources.requests", path())
                })?;
            }
            out.push(PodContainer {
                resources,
                index,
                json: c,
            });
        }
    }
    Ok(out)
}

/// A resource map: quantities are strings on the wire; bare JSON numbers are accepted as their
/// decimal text, since the Quantity type in client libraries reads them that way too.
fn quantity_map(
    v: Option<&Value>,
    path: impl Fn() -> String,
) -> Result<Vec<(String, String)>, ShapeError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(m)) => m
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                _ => Err(ShapeError {
                    path: format!("{}[{k}]", path()),
                    problem: "expected a quantity string",
                }),
            })
            .collect(),
        Some(_) => Err(ShapeError {
            path: path(),
            problem: "expected an object",
        }),
    }
}

/// A string field at `path` (object keys), if present.
pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_all_kinds_in_order() {
        let pod = json!({"spec": {
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": 2}}}],
            "initContainers": [{"name": "i"}],
            "ephemeralContainers": [{"name": "e"}]
        }});
        let cs = containers(&pod).unwrap();
        let names: Vec<_> = cs.iter().map(|c| c.resources.name.as_str()).collect();
        assert_eq!(names, ["i", "a", "e"]);
        assert_eq!(
            cs[1].resources.limits,
            vec![
                ("cpu".to_string(), "2".to_string()),
                ("nvidia.com/gpu".into(), "1".into())
            ]
        );
        assert_eq!(
            (cs[1].resources.kind, cs[1].index),
            (Some(ContainerKind::App), 0)
        );
        assert_eq!(
            (cs[0].resources.kind, cs[0].index),
            (Some(ContainerKind::Init), 0)
        );
    }

    #[test]
    fn names_the_bad_field() {
        let e = containers(&json!({"spec": {"containers": {}}})).unwrap_err();
        assert_eq!(e.to_string(), "spec.containers: expected an array");
        let e = containers(
            &json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {"x": true}}}]}}),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "spec.containers[0].resources.limits[x]: expected a quantity string"
        );
        assert!(containers(&json!({})).unwrap().is_empty());
    }
}
