//! The pod as the mutation reads it: [`PodView`], with its strings borrowed.
//!
//! There are two ways in, and both give the same view of the same pod:
//!
//! - [`PodView::from_value`] reads a `serde_json::Value`. It keeps the rules the mutation has
//!   always had for odd shapes: a `metadata`, `labels`, `resources` or `env` that is not an object
//!   (or array) counts as absent, and a `spec`, container list, container or resource map of the
//!   wrong type is a [`ShapeError`] naming the field.
//! - Deserialising a `PodView` straight from the request body is the fast read `/mutate` tries
//!   first. It takes only well-formed pods: each field it reads has the type a valid Pod gives it,
//!   and no key it reads is repeated. On anything else it fails, and the caller falls back to the
//!   `Value` read, so that odd bodies are answered exactly as before. Everything it skips is
//!   checked the way `Value` checks it (`Skip`: string escapes and UTF-8, number range, depth),
//!   so a body is taken here only if the `Value` read takes it too.
//!
//! Resource maps are kept sorted by name, the order a `Value` map has, so the two reads give equal
//! views (a unit test checks this, and the `admission_mutate` fuzz target checks that the answers
//! are equal).

use json_patch::jsonptr::{PointerBuf, Token};
use serde::de::{DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::{Number, Value};
use std::fmt;
use vgpu_core::annotations::{INJECTED, MANAGED_LABEL};
use vgpu_core::borrowed::Name;
use vgpu_core::request::{ContainerKind, ContainerResources};

use crate::pod::{self, PodContainer, ShapeError};
use crate::pruned::Skip;

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

// ---- The fast read: well-formed pods only (see the module documentation). ----

/// Keys of one object seen so far, so that a repeated one fails the read (a `Value` keeps the
/// last of them; the fallback read does that).
#[derive(Default)]
struct Seen(u8);

impl Seen {
    fn first<E: Error>(&mut self, bit: u8) -> Result<(), E> {
        if self.0 & (1 << bit) != 0 {
            return Err(E::custom("repeated key"));
        }
        self.0 |= 1 << bit;
        Ok(())
    }
}

/// `expecting` of the fast read's visitors.
macro_rules! expecting {
    ($what:literal) => {
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str($what)
        }
    };
}

impl<'de> Deserialize<'de> for PodView<'de> {
    /// The fast read: fails on any pod that is not well-formed (see the module documentation).
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(PodVisitor)
    }
}

struct PodVisitor;

impl<'de> Visitor<'de> for PodVisitor {
    type Value = PodView<'de>;
    expecting!("a pod object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PodView<'de>, A::Error> {
        let mut seen = Seen::default();
        let mut metadata = None;
        let mut spec = SpecFields::default();
        while let Some(key) = map.next_key::<Name<'de>>()? {
            match key.as_str() {
                "metadata" => {
                    seen.first(0)?;
                    metadata = Some(map.next_value::<MetaView<'de>>()?);
                }
                "spec" => {
                    seen.first(1)?;
                    spec = map.next_value()?;
                }
                _ => skip(&mut map)?,
            }
        }
        let [init, app, ephemeral] = spec.lists;
        Ok(PodView {
            metadata,
            scheduler_name: spec.scheduler_name,
            runtime_class_name: spec.runtime_class_name,
            containers: init.into_iter().chain(app).chain(ephemeral).collect(),
        })
    }
}

/// Checks and drops the value of a key the fast read does not keep.
fn skip<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    map.next_value::<Skip>().map(drop)
}

impl<'de> Deserialize<'de> for MetaView<'de> {
    /// The fast read of `metadata`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MetaVisitor)
    }
}

struct MetaVisitor;

impl<'de> Visitor<'de> for MetaVisitor {
    type Value = MetaView<'de>;
    expecting!("a metadata object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MetaView<'de>, A::Error> {
        let mut seen = Seen::default();
        let mut meta = MetaView::default();
        while let Some(key) = map.next_key::<Name<'de>>()? {
            match key.as_str() {
                "name" => {
                    seen.first(0)?;
                    meta.name = Some(map.next_value()?);
                }
                "generateName" => {
                    seen.first(1)?;
                    meta.generate_name = Some(map.next_value()?);
                }
                "labels" => {
                    seen.first(2)?;
                    meta.labels = Some(map.next_value_seed(OneKey(MANAGED_LABEL))?);
                }
                "annotations" => {
                    seen.first(3)?;
                    meta.annotations = Some(map.next_value_seed(OneKey(INJECTED))?);
                }
                _ => skip(&mut map)?,
            }
        }
        Ok(meta)
    }
}

/// A map of strings of which one key is kept: its value, when present.
struct OneKey(&'static str);

impl<'de> DeserializeSeed<'de> for OneKey {
    type Value = Option<Name<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OneKey {
    type Value = Option<Name<'de>>;
    expecting!("a map of strings");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = None;
        while let Some(key) = map.next_key::<Name<'de>>()? {
            if key.as_str() != self.0 {
                skip(&mut map)?;
            } else if kept.is_some() {
                return Err(A::Error::custom("repeated key"));
            } else {
                kept = Some(map.next_value()?);
            }
        }
        Ok(kept)
    }
}

/// The fast read of `spec`: the two names and the three container lists (in [`KINDS`] order).
#[derive(Default)]
struct SpecFields<'a> {
    scheduler_name: Option<Name<'a>>,
    runtime_class_name: Option<Name<'a>>,
    lists: [Vec<ContainerView<'a>>; 3],
}

/// The container lists, in the order [`PodView::containers`] holds them.
const KINDS: [ContainerKind; 3] = [
    ContainerKind::Init,
    ContainerKind::App,
    ContainerKind::Ephemeral,
];

impl<'de> Deserialize<'de> for SpecFields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(SpecVisitor)
    }
}

struct SpecVisitor;

impl<'de> Visitor<'de> for SpecVisitor {
    type Value = SpecFields<'de>;
    expecting!("a spec object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = Seen::default();
        let mut spec = SpecFields::default();
        while let Some(key) = map.next_key::<Name<'de>>()? {
            let list = KINDS.iter().position(|k| k.field() == key.as_str());
            match (key.as_str(), list) {
                (_, Some(i)) => {
                    seen.first(i as u8)?;
                    spec.lists[i] = map.next_value_seed(ContainerList(KINDS[i]))?;
                }
                ("schedulerName", _) => {
                    seen.first(3)?;
                    spec.scheduler_name = Some(map.next_value()?);
                }
                ("runtimeClassName", _) => {
                    seen.first(4)?;
                    spec.runtime_class_name = Some(map.next_value()?);
                }
                _ => skip(&mut map)?,
            }
        }
        Ok(spec)
    }
}

/// A list of containers of one kind.
struct ContainerList(ContainerKind);

impl<'de> DeserializeSeed<'de> for ContainerList {
    type Value = Vec<ContainerView<'de>>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ContainerList {
    type Value = Vec<ContainerView<'de>>;
    expecting!("a list of containers");
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(c) = seq.next_element_seed(OneContainer(self.0, out.len()))? {
            out.push(c);
        }
        Ok(out)
    }
}

/// One container, of this kind at this index.
struct OneContainer(ContainerKind, usize);

impl<'de> DeserializeSeed<'de> for OneContainer {
    type Value = ContainerView<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OneContainer {
    type Value = ContainerView<'de>;
    expecting!("a container object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = Seen::default();
        let mut name = Name::default();
        let mut resources = None;
        let mut env = None;
        while let Some(key) = map.next_key::<Name<'de>>()? {
            match key.as_str() {
                "name" => {
                    seen.first(0)?;
                    name = map.next_value()?;
                }
                "resources" => {
                    seen.first(1)?;
                    resources = Some(map.next_value::<ResourcesFields<'de>>()?);
                }
                "env" => {
                    seen.first(2)?;
                    env = Some(map.next_value::<Vec<EnvVarView<'de>>>()?);
                }
                _ => skip(&mut map)?,
            }
        }
        let resources_object = resources.is_some();
        let ResourcesFields { limits, requests } = resources.unwrap_or_default();
        let owned = |list: &Option<Vec<(Name<'_>, Quantity<'_>)>>| {
            list.iter()
                .flatten()
                .map(|(k, q)| (k.as_str().to_string(), q.text()))
                .collect()
        };
        let mut core = ContainerResources::new(name.as_str(), self.0);
        core.limits = owned(&limits);
        core.requests = owned(&requests);
        Ok(ContainerView {
            resources: core,
            kind: self.0,
            index: self.1,
            resources_object,
            limits,
            requests,
            env,
        })
    }
}

/// The fast read of `resources`.
#[derive(Default)]
struct ResourcesFields<'a> {
    limits: Option<Vec<(Name<'a>, Quantity<'a>)>>,
    requests: Option<Vec<(Name<'a>, Quantity<'a>)>>,
}

impl<'de> Deserialize<'de> for ResourcesFields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(ResourcesVisitor)
    }
}

struct ResourcesVisitor;

impl<'de> Visitor<'de> for ResourcesVisitor {
    type Value = ResourcesFields<'de>;
    expecting!("a resources object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = Seen::default();
        let mut out = ResourcesFields::default();
        while let Some(key) = map.next_key::<Name<'de>>()? {
            match key.as_str() {
                "limits" => {
                    seen.first(0)?;
                    out.limits = Some(map.next_value_seed(QuantityMap)?);
                }
                "requests" => {
                    seen.first(1)?;
                    out.requests = Some(map.next_value_seed(QuantityMap)?);
                }
                _ => skip(&mut map)?,
            }
        }
        Ok(out)
    }
}

/// A resource map, sorted by name as a `Value` map is; a name given twice fails the read.
struct QuantityMap;

impl<'de> DeserializeSeed<'de> for QuantityMap {
    type Value = Vec<(Name<'de>, Quantity<'de>)>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for QuantityMap {
    type Value = Vec<(Name<'de>, Quantity<'de>)>;
    expecting!("a map of quantities");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::new();
        while let Some(entry) = map.next_entry::<Name<'de>, Quantity<'de>>()? {
            out.push(entry);
        }
        // Maps are mostly written sorted already (the API server serialises them sorted).
        if !out.is_sorted_by(|a, b| a.0 <= b.0) {
            out.sort_by(|a, b| a.0.cmp(&b.0));
        }
        if out.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(A::Error::custom("repeated resource name"));
        }
        Ok(out)
    }
}

impl<'de> Deserialize<'de> for Quantity<'de> {
    /// A string or a number; the number is the one a `Value` would hold.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(QuantityVisitor)
    }
}

struct QuantityVisitor;

impl<'de> Visitor<'de> for QuantityVisitor {
    type Value = Quantity<'de>;
    expecting!("a quantity");
    fn visit_borrowed_str<E: Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Quantity::Text(Name::borrowed(v)))
    }
    fn visit_str<E: Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Quantity::Text(Name(v.to_string().into())))
    }
    fn visit_u64<E: Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Quantity::Number(v.into()))
    }
    fn visit_i64<E: Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Quantity::Number(v.into()))
    }
    fn visit_f64<E: Error>(self, v: f64) -> Result<Self::Value, E> {
        Number::from_f64(v)
            .map(Quantity::Number)
            .ok_or_else(|| E::custom("not a finite number"))
    }
}

impl<'de> Deserialize<'de> for EnvVarView<'de> {
    /// The fast read of an `env` entry.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(EnvVarVisitor)
    }
}

struct EnvVarVisitor;

impl<'de> Visitor<'de> for EnvVarVisitor {
    type Value = EnvVarView<'de>;
    expecting!("an env entry object");
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = Seen::default();
        let mut out = EnvVarView::default();
        while let Some(key) = map.next_key::<Name<'de>>()? {
            match key.as_str() {
                "name" => {
                    seen.first(0)?;
                    out.name = Some(map.next_value()?);
                }
                "value" => {
                    seen.first(1)?;
                    out.value = Some(map.next_value()?);
                }
                "valueFrom" => {
                    seen.first(2)?;
                    skip(&mut map)?;
                    out.value_from = true;
                }
                _ => skip(&mut map)?,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fast(body: &str) -> Option<PodView<'_>> {
        serde_json::from_str::<PodView<'_>>(body).ok()
    }

    #[test]
    fn the_fast_read_is_the_value_read_for_well_formed_pods() {
        let gpu =
            json!({"nvidia.com/gpumem": "4Gi", "nvidia.com/gpu": 2, "cpu": 1.5, "memory": -3});
        let pods = [
            json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x", "vgpu.io/managed": "true"},
                "annotations": {"vgpu.io/injected": "m", "other": "{\"a\":1}"}, "managedFields": [{"a": [1, 2]}]},
                "spec": {"schedulerName": "s", "runtimeClassName": "r", "volumes": [{"name": "v"}],
                    "ephemeralContainers": [{"name": "e"}],
                    "containers": [{"name": "c", "image": "i", "resources": {"limits": gpu, "requests": {}, "claims": []},
                        "env": [{"name": "A", "value": "b"}, {"name": "B", "valueFrom": null},
                            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "9", "valueFrom": {"x": 1}}]},
                        {"name": "d"}],
                    "initContainers": [{"name": "i", "resources": {"requests": {"nvidia.com/gpucores": "30"}}}]},
                "status": {"phase": "Pending"}}),
            json!({"metadata": {"generateName": "g-", "labels": {}, "annotations": {}},
                "spec": {"containers": [{"resources": {}, "env": []}]}}),
            json!({"spec": {"containers": []}}),
            json!({"metadata": {"name": ""}}),
            json!({}),
        ];
        let first = PodView::from_value(&pods[0]).unwrap();
        let at: Vec<String> = first
            .containers
            .iter()
            .map(|c| c.pointer().to_string())
            .collect();
        assert_eq!(
            at,
            [
                "/spec/initContainers/0",
                "/spec/containers/0",
                "/spec/containers/1",
                "/spec/ephemeralContainers/0"
            ]
        );
        for pod in &pods {
            let body = pod.to_string();
            assert_eq!(
                fast(&body),
                Some(PodView::from_value(pod).unwrap()),
                "{body}"
            );
        }
        // Escaped strings are unescaped as a Value's are.
        let body = r#"{"metadata": {"na\u006de": "p\"q"}, "spec": {"containers": [{"name": "\u00e9", "resources": {"limits": {"nvidia.com\/gpu": "1"}}}]}}"#;
        let whole: Value = serde_json::from_str(body).unwrap();
        let view = fast(body).unwrap();
        assert_eq!(view, PodView::from_value(&whole).unwrap());
        assert_eq!(view.name(), Some("p\"q"));
        assert_eq!(
            view.containers[0].pointer().to_string(),
            "/spec/containers/0"
        );
        assert_eq!(
            view.containers[0].resources.limits,
            [("nvidia.com/gpu".to_string(), "1".to_string())]
        );
    }

    #[test]
    fn the_fast_read_refuses_what_it_does_not_read_as_value_does() {
        for body in [
            // Types a valid Pod does not have, at fields the mutation reads.
            r#"{"spec": "x"}"#,
            r#"{"spec": null}"#,
            r#"{"metadata": 5}"#,
            r#"{"metadata": {"labels": [1]}}"#,
            r#"{"metadata": {"labels": {"vgpu.io/managed": true}}}"#,
            r#"{"metadata": {"name": null}}"#,
            r#"{"spec": {"containers": {"name": "c"}}}"#,
            r#"{"spec": {"containers": [7]}}"#,
            r#"{"spec": {"containers": [{"name": 3}]}}"#,
            r#"{"spec": {"containers": [{"resources": [1]}]}}"#,
            r#"{"spec": {"containers": [{"resources": {"limits": {"x": true}}}]}}"#,
            r#"{"spec": {"containers": [{"env": {"a": 1}}]}}"#,
            r#"{"spec": {"containers": [{"env": [7]}]}}"#,
            r#"{"spec": {"containers": [{"env": [{"name": "A", "value": 1}]}]}}"#,
            r#"{"spec": {"schedulerName": 1}}"#,
            // Repeated keys (a Value keeps the last one).
            r#"{"spec": {}, "spec": {}}"#,
            r#"{"spec": {"schedulerName": "a", "schedulerName": "b"}}"#,
            r#"{"metadata": {"labels": {"vgpu.io/managed": "a", "vgpu.io/managed": "b"}}}"#,
            r#"{"spec": {"containers": [{"resources": {"limits": {"cpu": "1", "cpu": "2"}}}]}}"#,
            r#"{"spec": {"containers": [{"env": [{"name": "A", "name": "B"}]}]}}"#,
            // What a Value refuses in a skipped part.
            r#"{"status": "\ud800"}"#,
            r#"{"status": 1e400}"#,
            r#"{"spec": {"volumes": [{"x": "\q"}]}}"#,
            "[]",
            "null",
        ] {
            assert_eq!(fast(body), None, "{body}");
        }
        assert!(serde_json::from_slice::<PodView<'_>>(b"{\"status\": \"\xff\"}").is_err());
        let deep = format!("{{\"status\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(fast(&deep), None);
    }
}
