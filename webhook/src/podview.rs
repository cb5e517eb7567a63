//! The pod as the mutation reads it: [`PodView`], its strings borrowed from the review's
//! `serde_json::Value` (the one read of a request body, shared with `/validate`).
//!
//! [`PodView::from_value`] keeps the rules the mutation has always had for odd shapes: a
//! `metadata`, `labels`, `resources` or `env` that is not an object (or array) counts as absent,
//! and a `spec`, container list, container or resource map of the wrong type is a [`ShapeError`]
//! naming the field.

use json_patch::jsonptr::{PointerBuf, Token};
use serde_json::{Number, Value};
use vgpu_core::annotations::{INJECTED, MANAGED_LABEL};
use vgpu_core::borrowed::Name;
use vgpu_core::request::{ContainerKind, ContainerResources};

use crate::pod::{self, PodContainer, ShapeError};

/// What the mutation reads of a pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodView<'a> {
    /// `metadata`, when it is an object.
    pub metadata: Option<MetaView<'a>>,
    /// `spec.schedulerName`, when it is a string.
    pub scheduler_name: Option<Name<'a>>,
    /// `spec.runtimeClassName`, when it is a string.
    pub runtime_class_name: Option<Name<'a>>,
    /// Init containers, then app containers, then ephemeral containers.
    pub containers: Vec<ContainerView<'a>>,
}

/// What the mutation reads of `metadata`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetaView<'a> {
    /// `name`, when it is a string.
    pub name: Option<Name<'a>>,
    /// `generateName`, when it is a string.
    pub generate_name: Option<Name<'a>>,
    /// `labels`, when it is an object: the value of vgpu's managed label, when it is a string.
    pub labels: Option<Option<Name<'a>>>,
    /// `annotations`, when it is an object: the value of the injected marker, when a string.
    pub annotations: Option<Option<Name<'a>>>,
}

/// One container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView<'a> {
    /// Its name, kind and resources, as core reads a vGPU request from them.
    pub resources: ContainerResources,
    /// Where it sits.
    pub kind: ContainerKind,
    /// Its index within its list.
    pub index: usize,
    /// Whether `resources` is an object.
    pub resources_object: bool,
    /// `resources.limits`, when `resources` and it are objects; sorted by name.
    pub limits: Option<Vec<(Name<'a>, Quantity<'a>)>>,
    /// `resources.requests`, likewise.
    pub requests: Option<Vec<(Name<'a>, Quantity<'a>)>>,
    /// `env`, when it is an array.
    pub env: Option<Vec<EnvVarView<'a>>>,
}

impl ContainerView<'_> {
    /// JSON pointer of this container: `/spec/containers/0`.
    pub fn pointer(&self) -> PointerBuf {
        PointerBuf::from_tokens([
            Token::new("spec"),
            Token::new(self.kind.field()),
            Token::from(self.index),
        ])
    }
}

/// A resource quantity as the pod holds it: a string, or a bare JSON number.
#[derive(Debug, Clone, PartialEq)]
pub enum Quantity<'a> {
    /// A string, as quantities are written.
    Text(Name<'a>),
    /// A JSON number.
    Number(Number),
}

impl Quantity<'_> {
    /// The quantity's text (a number as its decimal text, the way client libraries read it).
    pub fn text(&self) -> String {
        match self {
            Quantity::Text(t) => t.as_str().to_string(),
            Quantity::Number(n) => n.to_string(),
        }
    }

    fn of(v: &Value) -> Option<Quantity<'_>> {
        match v {
            Value::String(s) => Some(Quantity::Text(Name::borrowed(s))),
            Value::Number(n) => Some(Quantity::Number(n.clone())),
            _ => None,
        }
    }
}

/// One `env` entry; for an entry that is not an object every field is absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EnvVarView<'a> {
    /// `name`, when it is a string.
    pub name: Option<Name<'a>>,
    /// `value`, when it is a string.
    pub value: Option<Name<'a>>,
    /// Whether the entry has a `valueFrom` (of any value, `null` included).
    pub value_from: bool,
}

impl<'a> PodView<'a> {
    /// Reads a pod held as a `Value`; fails only where the mutation cannot address the pod.
    pub fn from_value(pod: &'a Value) -> Result<Self, ShapeError> {
        let containers = pod::containers(pod)?
            .into_iter()
            .map(ContainerView::from_value)
            .collect();
        let string = |v: Option<&'a Value>| v.and_then(Value::as_str).map(Name::borrowed);
        let metadata = pod
            .get("metadata")
            .and_then(Value::as_object)
            .map(|m| MetaView {
                name: string(m.get("name")),
                generate_name: string(m.get("generateName")),
                labels: m
                    .get("labels")
                    .and_then(Value::as_object)
                    .map(|l| string(l.get(MANAGED_LABEL))),
                annotations: m
                    .get("annotations")
                    .and_then(Value::as_object)
                    .map(|a| string(a.get(INJECTED))),
            });
        let spec = pod.get("spec");
        Ok(PodView {
            metadata,
            scheduler_name: string(spec.and_then(|s| s.get("schedulerName"))),
            runtime_class_name: string(spec.and_then(|s| s.get("runtimeClassName"))),
            containers,
        })
    }

    /// `metadata.name`, or else `metadata.generateName` (for logs); a `name` that is empty counts
    /// as absent.
    pub fn name(&self) -> Option<&str> {
        let meta = self.metadata.as_ref()?;
        meta.name
            .as_ref()
            .map(Name::as_str)
            .filter(|s| !s.is_empty())
            .or(meta.generate_name.as_ref().map(Name::as_str))
    }
}

impl<'a> ContainerView<'a> {
    fn from_value(c: PodContainer<'a>) -> Self {
        let res = c.json.get("resources").and_then(Value::as_object);
        // `pod::containers` has checked that a map here holds only strings and numbers.
        let section = |name: &str| {
            let map = res?.get(name)?.as_object()?;
            Some(
                map.iter()
                    .filter_map(|(k, v)| Some((Name::borrowed(k), Quantity::of(v)?)))
                    .collect(),
            )
        };
        let env = c.json.get("env").and_then(Value::as_array).map(|list| {
            list.iter()
                .map(|e| EnvVarView {
                    name: e.get("name").and_then(Value::as_str).map(Name::borrowed),
                    value: e.get("value").and_then(Value::as_str).map(Name::borrowed),
                    value_from: e.get("valueFrom").is_some(),
                })
                .collect()
        });
        ContainerView {
            kind: c.resources.kind.unwrap_or(ContainerKind::App),
            index: c.index,
            resources_object: res.is_some(),
            limits: section("limits"),
            requests: section("requests"),
            env,
            resources: c.resources,
        }
    }
}
