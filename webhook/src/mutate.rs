//! The mutating admission decision for one pod: a pure function from the pod JSON to a JSON patch.
//!
//! The patch is computed as the difference between the pod and the state vGPU wants it in, so
//! applying it twice is harmless and mutating an already-mutated pod yields an empty patch — whether
//! the second call is a reinvocation (`reinvocationPolicy: IfNeeded`) or another webhook replica.
//! What it changes, for a pod with at least one vGPU container:
//!
//! - `spec.schedulerName` to ours, when empty or `default-scheduler` (another scheduler is kept, with
//!   a warning: the pod will not be placed on a GPU slice by vgpu);
//! - `spec.runtimeClassName`, when configured and unset;
//! - per vGPU container (init containers too), the defaulted vGPU resources in `limits` and
//!   `requests`, and the limits in its `env` as the preload library reads them (core's env
//!   contract): `CUDA_DEVICE_MEMORY_LIMIT` (MiB, `4096m`; only when the request names MiB: a
//!   percentage becomes MiB at placement) and `CUDA_DEVICE_SM_LIMIT`, once each, replacing any user
//!   value; every other variable the library reads is removed. The device plugin's Allocate writes
//!   the same names in the same form (and its read-only limits file, which the hook trusts), so the
//!   spec shows what the container is limited to and the hook finds the two sources agreeing;
//! - the `vgpu.io/managed` label and the `vgpu.io/injected` marker annotation.
//!
//! It never adds volumes: the device plugin mounts the preload library at Allocate, so pods keep
//! passing Pod Security "baseline".

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, ReplaceOperation};
use serde_json::{json, Map, Value};
use thiserror::Error;
use vgpu_core::annotations::{InjectedMarker, INJECTED, MANAGED_LABEL, MANAGED_VALUE};
use vgpu_core::borrowed::Name;
use vgpu_core::env;
use vgpu_core::quantity::parse_integer;
use vgpu_core::request::{Memory, RequestError, RequestPolicy, VgpuRequest};

use crate::pod::ShapeError;
use crate::podview::{ContainerView, PodView, Quantity};

/// Scheduler name that means "not chosen by the user".
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// Everything the mutation depends on besides the pod.
#[derive(Debug, Clone)]
pub struct MutateSettings {
    /// Resource names and defaults.
    pub policy: RequestPolicy,
    /// Our scheduler profile's name.
    pub scheduler_name: String,
    /// RuntimeClass of the vGPU runtime, if any.
    pub runtime_class: Option<String>,
}

impl Default for MutateSettings {
    fn default() -> Self {
        Self {
            policy: RequestPolicy::default(),
            scheduler_name: "vgpu-scheduler".into(),
            runtime_class: None,
        }
    }
}

/// Why a pod cannot be mutated: it gets `allowed: false`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MutateError {
    /// The vGPU request of a container is invalid (422).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The object is not a pod (400).
    #[error("object is not a valid Pod: {0}")]
    Shape(#[from] ShapeError),
}

/// The result for a pod that may be admitted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Mutation {
    /// Operations to apply; empty when nothing changes.
    pub patch: Patch,
    /// Warnings for the client.
    pub warnings: Vec<String>,
    /// Whether the pod requests vGPU at all.
    pub vgpu: bool,
}

/// Computes the patch for a pod.
pub fn mutate_pod(pod: &Value, settings: &MutateSettings) -> Result<Mutation, MutateError> {
    mutate_view(&PodView::from_value(pod)?, settings)
}

/// Computes the patch for a pod read as a [`PodView`] (what [`mutate_pod`] does after reading it).
fn mutate_view(pod: &PodView<'_>, settings: &MutateSettings) -> Result<Mutation, MutateError> {
    let mut wanted = Vec::new();
    for c in &pod.containers {
        if let Some(req) = settings.policy.parse_container(&c.resources)? {
            wanted.push((c, req));
        }
    }
    if wanted.is_empty() {
        return Ok(Mutation::default());
    }

    let mut ops = Ops::default();
    let mut warnings = Vec::new();
    metadata(pod, &wanted, &mut ops);
    scheduling(pod, settings, &mut ops, &mut warnings);
    for (c, req) in &wanted {
        warnings.extend(suffixed_gpumem_warning(c, req, &settings.policy));
    }
    for (c, req) in &wanted {
        let at = c.pointer();
        resources(c, &at, req, &settings.policy, &mut ops);
        environment(c, &at, req, &mut ops);
    }
    Ok(Mutation {
        patch: ops.into_patch(),
        warnings,
        vgpu: true,
    })
}

/// gpumem counts MiB (as in HAMi), so a suffixed quantity written the way memory limits are
/// written (`4Gi`) asks for far more than meant: 4 Gi MiB, which no card has. Admitted as asked
/// (it is a valid quantity), but the user is told what it means.
///
/// Only binary suffixes are the user's own: the API server hands webhooks quantities in canonical
/// form (apimachinery's `resource.Quantity`: a decimal value is written with the largest SI suffix
/// that keeps it exact), so a user's `2000` arrives as `2k` and a decimal suffix says nothing about
/// what was typed. A plain number is never canonicalised to a binary suffix.
fn suffixed_gpumem_warning(
    c: &ContainerView<'_>,
    req: &VgpuRequest,
    policy: &RequestPolicy,
) -> Option<String> {
    let Memory::Mib(mib) = req.memory else {
        return None;
    };
    let name = &policy.names.gpumem;
    let (_, text) = c
        .resources
        .limits
        .iter()
        .chain(&c.resources.requests)
        .find(|(n, _)| n == name)?;
    let suffixed = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
        .iter()
        .any(|s| text.ends_with(s));
    suffixed.then(|| {
        format!(
            "container {:?}: {name} counts MiB, so {text:?} asks for {mib} MiB per GPU; for 4 GiB write \"4096\"",
            c.resources.name
        )
    })
}

/// Patch operations in three groups, so indices stay valid: in-place replacements first, then
/// removals from the highest index down, then additions (which never shift earlier elements).
#[derive(Default)]
struct Ops {
    replace: Vec<PatchOperation>,
    remove: Vec<(PointerBuf, usize)>,
    add: Vec<PatchOperation>,
}

impl Ops {
    fn add(&mut self, path: PointerBuf, value: Value) {
        self.add
            .push(PatchOperation::Add(AddOperation { path, value }));
    }

    fn replace(&mut self, path: PointerBuf, value: Value) {
        self.replace
            .push(PatchOperation::Replace(ReplaceOperation { path, value }));
    }

    fn into_patch(mut self) -> Patch {
        let mut ops = self.replace;
        // Remove later elements first, so earlier indices still point where they did.
        self.remove.sort_by_key(|r| std::cmp::Reverse(r.1));
        ops.extend(
            self.remove
                .into_iter()
                .map(|(path, _)| PatchOperation::Remove(RemoveOperation { path })),
        );
        ops.extend(self.add);
        Patch(ops)
    }
}

fn ptr<'a>(tokens: impl IntoIterator<Item = &'a str>) -> PointerBuf {
    PointerBuf::from_tokens(tokens)
}

fn metadata(pod: &PodView<'_>, wanted: &[(&ContainerView<'_>, VgpuRequest)], ops: &mut Ops) {
    let marker =
        InjectedMarker::new(wanted.iter().map(|(c, r)| (c.resources.name.clone(), *r))).encode();
    let Some(meta) = &pod.metadata else {
        ops.add(
            ptr(["metadata"]),
            json!({"labels": {MANAGED_LABEL: MANAGED_VALUE}, "annotations": {INJECTED: marker}}),
        );
        return;
    };
    for (field, map, key, value) in [
        ("labels", &meta.labels, MANAGED_LABEL, MANAGED_VALUE),
        ("annotations", &meta.annotations, INJECTED, marker.as_str()),
    ] {
        match map {
            None => ops.add(ptr(["metadata", field]), json!({ key: value })),
            Some(current) if current.as_ref().map(Name::as_str) == Some(value) => {}
            Some(_) => ops.add(
                ptr(["metadata", field, key]),
                Value::String(value.to_string()),
            ),
        }
    }
}

fn scheduling(
    pod: &PodView<'_>,
    settings: &MutateSettings,
    ops: &mut Ops,
    warnings: &mut Vec<String>,
) {
    match pod.scheduler_name.as_ref().map(Name::as_str) {
        None | Some("") | Some(DEFAULT_SCHEDULER) => {
            ops.add(
                ptr(["spec", "schedulerName"]),
                Value::String(settings.scheduler_name.clone()),
            );
        }
        Some(s) if s == settings.scheduler_name => {}
        Some(other) => warnings.push(format!(
            "pod names scheduler {other:?}, so vgpu-scheduler will not place its vGPU slice; \
             its GPU limits are enforced only if that scheduler writes vgpu's assignment"
        )),
    }
    if let Some(rc) = &settings.runtime_class {
        match pod.runtime_class_name.as_ref().map(Name::as_str) {
            None | Some("") => {
                ops.add(ptr(["spec", "runtimeClassName"]), Value::String(rc.clone()))
            }
            Some(s) if s == rc => {}
            Some(other) => warnings.push(format!(
                "pod sets runtimeClassName {other:?}; the vGPU runtime class {rc:?} was not applied"
            )),
        }
    }
}

/// The vGPU resources a request stands for, as resource name -> value.
fn desired_resources<'p>(req: &VgpuRequest, policy: &'p RequestPolicy) -> [(&'p str, u64); 3] {
    let n = &policy.names;
    let memory = match req.memory {
        Memory::Mib(m) => (n.gpumem.as_str(), m),
        Memory::Percent(p) => (n.gpumem_percentage.as_str(), u64::from(p)),
    };
    [
        (n.gpu.as_str(), u64::from(req.gpus)),
        memory,
        (n.gpucores.as_str(), u64::from(req.cores)),
    ]
}

/// The container's vGPU resources in `limits` and `requests`; `at` is the container's pointer.
fn resources(
    c: &ContainerView<'_>,
    at: &PointerBuf,
    req: &VgpuRequest,
    policy: &RequestPolicy,
    ops: &mut Ops,
) {
    let desired = desired_resources(req, policy);
    if !c.resources_object {
        let map: Map<String, Value> = desired
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        let mut path = at.clone();
        path.push_back("resources");
        ops.add(path, json!({"limits": map.clone(), "requests": map}));
        return;
    }
    for (section, current) in [("limits", &c.limits), ("requests", &c.requests)] {
        let mut missing = Map::new();
        for (name, value) in &desired {
            let present = current
                .iter()
                .flatten()
                .find(|(k, _)| k.as_str() == *name)
                .map(|(_, q)| match q {
                    Quantity::Text(s) => parse_integer(s.as_str()).ok(),
                    Quantity::Number(n) => n.as_u64(),
                });
            if present != Some(Some(*value)) {
                missing.insert(name.to_string(), Value::String(value.to_string()));
            }
        }
        if missing.is_empty() {
            continue;
        }
        let mut path = at.clone();
        path.push_back("resources");
        path.push_back(section);
        match current {
            None => ops.add(path, Value::Object(missing)),
            Some(_) => {
                for (name, value) in missing {
                    let mut p = path.clone();
                    p.push_back(name.as_str());
                    ops.add(p, value);
                }
            }
        }
    }
}

/// The limit variables a vGPU container's spec carries, with their values: the names and the form
/// the device plugin's Allocate writes too (`vgpu_core::env::container_limits`), so the hook finds
/// them agreeing with its limits file. A percentage of the card's memory has no MiB before
/// placement, so it gets no memory variable here (the device plugin writes it at Allocate).
pub(crate) fn desired_env(req: &VgpuRequest) -> Vec<(&'static str, String)> {
    env::container_limits(req.memory_mib(), Some(req.cores))
}

/// The preload library's variables in the container's `env` (`at` is the container's pointer): the
/// first occurrence of each wanted variable corrected in place, every other variable the library
/// reads (indexed limits, the accounting path, `VGPU_*`, duplicates) removed, the missing ones
/// appended.
fn environment(c: &ContainerView<'_>, at: &PointerBuf, req: &VgpuRequest, ops: &mut Ops) {
    let mut base = at.clone();
    base.push_back("env");
    let desired = desired_env(req);
    let entry = |name: &str, value: &str| json!({"name": name, "value": value});

    let Some(current) = &c.env else {
        ops.add(
            base,
            Value::Array(desired.iter().map(|(n, v)| entry(n, v)).collect()),
        );
        return;
    };
    let mut satisfied = vec![false; desired.len()];
    for (i, e) in current.iter().enumerate() {
        let Some(name) = e.name.as_ref().map(Name::as_str) else {
            continue;
        };
        if !env::is_reserved(name) {
            continue;
        }
        let mut at = base.clone();
        at.push_back(i);
        match desired.iter().position(|(n, _)| *n == name) {
            Some(d) if !satisfied[d] => {
                satisfied[d] = true;
                let same = e.value.as_ref().map(Name::as_str) == Some(desired[d].1.as_str())
                    && !e.value_from;
                if !same {
                    ops.replace(at, entry(desired[d].0, &desired[d].1));
                }
            }
            _ => ops.remove.push((at, i)),
        }
    }
    for ((name, value), done) in desired.iter().zip(satisfied) {
        if !done {
            let mut at = base.clone();
            at.push_back("-");
            ops.add(at, entry(name, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> MutateSettings {
        MutateSettings {
            runtime_class: Some("vgpu".into()),
            ..MutateSettings::default()
        }
    }

    fn apply(pod: &Value, m: &Mutation) -> Value {
        let mut out = pod.clone();
        json_patch::patch(&mut out, &m.patch).unwrap();
        out
    }

    #[test]
    fn bare_pod_gets_everything_and_is_idempotent() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpumem": "4096"}}}]}});
        let m = mutate_pod(&pod, &settings()).unwrap();
        let out = apply(&pod, &m);
        assert_eq!(out["spec"]["schedulerName"], "vgpu-scheduler");
        assert_eq!(out["spec"]["runtimeClassName"], "vgpu");
        assert_eq!(out["metadata"]["labels"]["vgpu.io/managed"], "true");
        let c = &out["spec"]["containers"][0];
        assert_eq!(
            c["resources"]["limits"],
            json!({"nvidia.com/gpumem": "4096", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"})
        );
        assert_eq!(
            c["resources"]["requests"],
            json!({"nvidia.com/gpumem": "4096", "nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"})
        );
        assert_eq!(
            c["env"],
            json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4096m"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}])
        );
        let again = mutate_pod(&out, &settings()).unwrap();
        assert!(again.patch.0.is_empty(), "{:?}", again.patch);
    }

    #[test]
    fn a_forged_injected_marker_changes_nothing() {
        // A tenant copies the marker of a mutated pod and raises its own limit: the patch is the diff
        // against the desired state, so the env is still corrected.
        let pod = json!({"metadata": {"labels": {"vgpu.io/managed": "true"}, "annotations": {
            "vgpu.io/injected": r#"{"v":1,"c":{"c":{"CUDA_DEVICE_MEMORY_LIMIT":"999g"}}}"#}},
            "spec": {"schedulerName": "vgpu-scheduler", "runtimeClassName": "vgpu", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "0"},
                          "requests": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "0"}},
            "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "999g"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]}]}});
        let out = apply(&pod, &mutate_pod(&pod, &settings()).unwrap());
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1024m"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}])
        );
    }

    #[test]
    fn user_env_is_replaced_and_removed_in_a_valid_order() {
        let pod = json!({"spec": {"containers": [{"name": "c",
        "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "1024"}},
        "env": [
            {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "99g"},
            {"name": "A", "value": "1"},
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
            {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/tmp/x"},
            {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
        ]}]}});
        let m = mutate_pod(&pod, &settings()).unwrap();
        let out = apply(&pod, &m);
        assert_eq!(
            out["spec"]["containers"][0]["env"],
            json!([
                {"name": "A", "value": "1"},
                {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
                {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "1024m"}
            ])
        );
        assert!(mutate_pod(&out, &settings()).unwrap().patch.0.is_empty());
    }

    #[test]
    fn percentage_omits_memory_limit_and_existing_quantities_count() {
        let pod = json!({"spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpu": "1k"},
                          "requests": {"nvidia.com/gpumem-percentage": "50"}}}]}});
        // 1k GPUs is out of range: a clear error, not a patch.
        let e = mutate_pod(&pod, &settings()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container \"c\": nvidia.com/gpu: 1000 is out of range 0-128"
        );
        let pod = json!({"spec": {"schedulerName": "default-scheduler", "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpumem-percentage": "50", "nvidia.com/gpu": "2"},
                          "requests": {"nvidia.com/gpumem-percentage": "50"}}}]}});
        let out = apply(&pod, &mutate_pod(&pod, &settings()).unwrap());
        let c = &out["spec"]["containers"][0];
        assert_eq!(
            c["env"],
            json!([{"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}])
        );
        assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], "2");
        assert_eq!(c["resources"]["requests"]["nvidia.com/gpu"], "2");
        assert_eq!(out["spec"]["schedulerName"], "vgpu-scheduler");
    }

    #[test]
    fn every_spelling_of_gpumem_and_every_container_kind_gets_its_limits() {
        // The API server hands a user's 2000 over as "2k"; "3Gi" counts MiB (a warning says so).
        for (text, want) in [("3000", "3000m"), ("2k", "2000m"), ("3Gi", "3221225472m")] {
            let pod = json!({"spec": {"initContainers": [{"name": "warmup",
                "resources": {"requests": {"nvidia.com/gpumem": text, "nvidia.com/gpucores": "20"}}}],
                "containers": [{"name": "main",
                "resources": {"limits": {"nvidia.com/gpumem": text}},
                "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "999999m"}]}]}});
            let out = apply(&pod, &mutate_pod(&pod, &settings()).unwrap());
            assert_eq!(
                out["spec"]["initContainers"][0]["env"],
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": want}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "20"}]),
                "{text}: a requests-only init container"
            );
            assert_eq!(
                out["spec"]["containers"][0]["env"],
                json!([{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": want}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]),
                "{text}: the user's value replaced"
            );
            let again = mutate_pod(&out, &settings()).unwrap();
            assert!(again.patch.0.is_empty(), "{text}: {:?}", again.patch);
        }
    }

    #[test]
    fn suffixed_gpumem_is_admitted_with_a_warning_saying_it_counts_mib() {
        // "2k" is how the API server hands over a user's 2000 (canonical form): no warning.
        let pod = json!({"spec": {"containers": [
            {"name": "big", "resources": {"limits": {"nvidia.com/gpumem": "4Gi"}}},
            {"name": "ok", "resources": {"limits": {"nvidia.com/gpumem": "4096"}}},
            {"name": "canonical", "resources": {"limits": {"nvidia.com/gpumem": "2k"}}}]}});
        let m = mutate_pod(&pod, &MutateSettings::default()).unwrap();
        assert_eq!(
            m.warnings,
            vec!["container \"big\": nvidia.com/gpumem counts MiB, so \"4Gi\" asks for 4294967296 MiB per GPU; for 4 GiB write \"4096\"".to_string()]
        );
        assert!(!m.patch.0.is_empty());
    }

    #[test]
    fn foreign_scheduler_and_runtime_class_are_kept_with_warnings() {
        let pod = json!({"spec": {"schedulerName": "volcano", "runtimeClassName": "kata", "containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let m = mutate_pod(&pod, &settings()).unwrap();
        let out = apply(&pod, &m);
        assert_eq!(out["spec"]["schedulerName"], "volcano");
        assert_eq!(out["spec"]["runtimeClassName"], "kata");
        assert_eq!(m.warnings.len(), 2);
        assert!(m.warnings[0].contains("\"volcano\""), "{:?}", m.warnings);
    }

    #[test]
    fn non_gpu_pod_is_untouched() {
        let pod =
            json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}});
        assert_eq!(mutate_pod(&pod, &settings()).unwrap(), Mutation::default());
    }

    #[test]
    fn escapes_resource_names_in_pointers() {
        let pod = json!({"metadata": {"labels": {"app": "x"}, "annotations": {}}, "spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}}, "env": []}]}});
        let m = mutate_pod(&pod, &settings()).unwrap();
        let paths: Vec<String> = m
            .patch
            .0
            .iter()
            .map(|op| match op {
                PatchOperation::Add(a) => a.path.to_string(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert!(
            paths.contains(&"/metadata/labels/vgpu.io~1managed".to_string()),
            "{paths:?}"
        );
        assert!(
            paths.contains(
                &"/spec/containers/0/resources/limits/nvidia.com~1gpumem-percentage".to_string()
            ),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"/spec/containers/0/resources/requests/nvidia.com~1gpu".to_string()),
            "{paths:?}"
        );
        let out = apply(&pod, &m);
        assert_eq!(
            out["metadata"]["labels"],
            json!({"app": "x", "vgpu.io/managed": "true"})
        );
    }
}
