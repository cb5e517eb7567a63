//! A pod written for HAMi (`nvidia.com/gpu`, `nvidia.com/gpumem`, `nvidia.com/gpumem-percentage`,
//! `nvidia.com/gpucores`, the GPU type and UUID annotations) rewritten as a DRA pod of class
//! `gpu.vgpu.io`: a pure function from the pod to a JSON patch and the ResourceClaimTemplates the
//! patched pod names. docs/dra.md ("Pods written for HAMi") has the table this implements.
//!
//! Each vGPU container (init containers too) gets its own pod claim, `vgpu-<container>`, made by
//! kube-scheduler's claim controller from a template named after its shape
//! (`vgpu-1x4096mi-30c-<hash>`): pods that ask the same share the template, so a Deployment of 100
//! replicas makes one template, not 100. The extended resources and the limit variables the
//! preload library reads leave the container (the claim's CDI spec sets them at prepare).
//!
//! Shapes: `resource.k8s.io/v1` `ResourceClaimTemplateSpec.spec.devices` (`requests[]` with
//! `exactly` or `firstAvailable`, `constraints[].matchAttribute`), `core/v1` `PodResourceClaim`
//! `{name, resourceClaimTemplateName}` and `ResourceClaim` `{name}` in a container's
//! `resources.claims` (k8s-openapi `v1_36`).

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation};
use serde_json::{json, Value};
use thiserror::Error;
use vgpu_core::annotations::{GPU_POLICY, NODE_POLICY};
use vgpu_core::dra::CLASS;
use vgpu_core::env;
use vgpu_core::placement::{GpuFilter, NameList, PodRequest, Policy};
use vgpu_core::request::{ContainerKind, Memory, RequestError, RequestPolicy, VgpuRequest};

use crate::pod::{self, ShapeError};

/// The label on every template the webhook makes (the sweeper deletes only these).
pub const GENERATED_LABEL: &str = "vgpu.io/generated";
/// The annotation that tells which container became which claim, for `kubectl describe`.
pub const CONVERTED: &str = "vgpu.io/dra-converted";
/// The request's name inside a generated template.
pub const REQUEST: &str = "gpu";

/// Why a pod cannot become a DRA pod: it is refused, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ConvertError {
    /// A container's vGPU request is invalid (422).
    #[error(transparent)]
    Request(#[from] RequestError),
    /// The object is not a pod (400).
    #[error("object is not a valid Pod: {0}")]
    Shape(#[from] ShapeError),
    /// A valid HAMi request with no DRA equivalent here (422).
    #[error("{field}: {why}")]
    Unmappable {
        /// The field at fault.
        field: String,
        /// Why, and what to write instead.
        why: String,
    },
}

/// What becomes of the pod.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conversion {
    /// Operations to apply; empty when the pod asks no vGPU.
    pub patch: Patch,
    /// The templates the patched pod names, as objects to create (without namespace).
    pub templates: Vec<Value>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
}

/// The vGPU containers of `pod` as `(container, request)`; errors name the container.
fn wanted<'p>(
    pod: &'p Value,
    policy: &RequestPolicy,
) -> Result<Vec<(pod::PodContainer<'p>, VgpuRequest)>, ConvertError> {
    let mut out = Vec::new();
    for c in pod::containers(pod)? {
        if let Some(r) = policy.parse_container(&c.resources)? {
            out.push((c, r));
        }
    }
    Ok(out)
}

/// Whether converting `pod` needs the published GPUs' memory sizes (a `gpumem-percentage` below
/// 100 becomes one alternative per size).
pub fn needs_card_sizes(pod: &Value, policy: &RequestPolicy) -> bool {
    wanted(pod, policy).is_ok_and(|w| {
        w.iter()
            .any(|(_, r)| matches!(r.memory, Memory::Percent(p) if p < 100))
    })
}

/// Converts `pod`. `card_sizes`: the distinct `memory` capacities (bytes) of the published GPUs of
/// class `gpu.vgpu.io`, needed only when [`needs_card_sizes`]. `scheduler`: vgpu's profile, set
/// as the pod's scheduler (when it names none, or the default), so that vgpu scores the nodes for
/// its claims (docs/dra.md "Placement").
pub fn convert(
    pod: &Value,
    policy: &RequestPolicy,
    card_sizes: &[u64],
    scheduler: &str,
) -> Result<Conversion, ConvertError> {
    let wanted = wanted(pod, policy)?;
    if wanted.is_empty() {
        return Ok(Conversion::default());
    }
    let annotations = pod.pointer("/metadata/annotations");
    let annotation = |k: &str| annotations.and_then(|a| a.get(k)).and_then(Value::as_str);
    let request =
        PodRequest::from_annotations(Vec::new(), annotation, Policy::Binpack, Policy::Binpack)
            .map_err(|e| ConvertError::Unmappable {
                field: format!("metadata.annotations[{:?}]", e.annotation),
                why: e.to_string(),
            })?;
    let mut warnings = Vec::new();
    for key in [NODE_POLICY, GPU_POLICY] {
        if annotation(key).is_some_and(|v| !v.trim().is_empty()) {
            warnings.push(format!(
                "metadata.annotations[{key:?}] is not applied in DRA mode: kube-scheduler allocates the pod's GPUs"
            ));
        }
    }
    let selectors = selectors(&request.filter);
    let existing: Vec<&Value> = pod
        .pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default();

    let mut ops = Vec::new();
    let mut removals = Vec::new();
    let mut claims = Vec::new();
    let mut templates: Vec<Value> = Vec::new();
    let mut converted = Vec::new();
    for (c, r) in &wanted {
        let name = &c.resources.name;
        let kind = c.resources.kind.unwrap_or(ContainerKind::App);
        if kind == ContainerKind::Ephemeral {
            return Err(ConvertError::Unmappable {
                field: format!("spec.ephemeralContainers[{}].resources", c.index),
                why: "an ephemeral container cannot hold a claim".into(),
            });
        }
        let at = format!("/spec/{}/{}", kind.field(), c.index);
        let template = template(r, &selectors, request.numa_bind, card_sizes, &at)?;
        let template_name = template["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let claim = pod_claim_name(name);
        if let Some(e) = existing.iter().find(|e| e["name"] == claim.as_str()) {
            return Err(ConvertError::Unmappable {
                field: "spec.resourceClaims".into(),
                why: format!(
                    "the pod already has a claim named {claim:?} ({}), the name vgpu gives container {name:?}'s GPUs",
                    e["resourceClaimTemplateName"]
                        .as_str()
                        .or(e["resourceClaimName"].as_str())
                        .unwrap_or("?")
                ),
            });
        }
        for (section, map) in [
            ("limits", &c.json["resources"]["limits"]),
            ("requests", &c.json["resources"]["requests"]),
        ] {
            for key in policy.names.all() {
                if map.get(key).is_some() {
                    removals.push((pointer(&format!("{at}/resources/{section}"), key), 0));
                }
            }
        }
        for (i, e) in c.json["env"].as_array().into_iter().flatten().enumerate() {
            if e["name"].as_str().is_some_and(env::is_reserved) {
                removals.push((pointer(&format!("{at}/env"), &i.to_string()), i));
            }
        }
        let entry = json!({ "name": claim });
        match c.json["resources"]["claims"].as_array() {
            Some(_) => ops.push(add(pointer(&format!("{at}/resources/claims"), "-"), entry)),
            None => ops.push(add(
                pointer(&format!("{at}/resources"), "claims"),
                json!([entry]),
            )),
        }
        claims.push(json!({"name": claim, "resourceClaimTemplateName": template_name}));
        converted.push(format!("{name}={claim}/{template_name}"));
        if !templates
            .iter()
            .any(|t| t["metadata"]["name"] == template["metadata"]["name"])
        {
            templates.push(template);
        }
    }
    match pod.pointer("/spec/resourceClaims") {
        Some(Value::Array(_)) => {
            for c in claims {
                ops.push(add(pointer("/spec/resourceClaims", "-"), c));
            }
        }
        _ => ops.push(add(
            pointer("/spec", "resourceClaims"),
            Value::Array(claims),
        )),
    }
    match pod.pointer("/spec/schedulerName").and_then(Value::as_str) {
        None | Some("") | Some("default-scheduler") => ops.push(add(
            pointer("/spec", "schedulerName"),
            Value::String(scheduler.to_string()),
        )),
        Some(s) if s == scheduler => {}
        Some(other) => warnings.push(format!(
            "pod names scheduler {other:?}, so vgpu does not score the nodes for its GPUs"
        )),
    }
    let note = Value::String(converted.join(","));
    match annotations {
        Some(Value::Object(_)) => ops.push(add(pointer("/metadata/annotations", CONVERTED), note)),
        _ => match pod.get("metadata") {
            Some(Value::Object(_)) => ops.push(add(
                pointer("/metadata", "annotations"),
                json!({ CONVERTED: note }),
            )),
            _ => ops.push(add(
                pointer("", "metadata"),
                json!({"annotations": { CONVERTED: note }}),
            )),
        },
    }
    // Removals first, later array elements before earlier ones, then the additions.
    removals.sort_by_key(|r| std::cmp::Reverse(r.1));
    let mut all: Vec<PatchOperation> = removals
        .into_iter()
        .map(|(path, _)| PatchOperation::Remove(RemoveOperation { path }))
        .collect();
    all.extend(ops);
    Ok(Conversion {
        patch: Patch(all),
        templates,
        warnings,
    })
}

fn pointer(base: &str, last: &str) -> PointerBuf {
    let mut p = PointerBuf::parse(base).unwrap_or_default();
    p.push_back(last);
    p
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// `vgpu-<container>`, or `vgpu-<hash>` when that is longer than a DNS label (63) may be.
pub fn pod_claim_name(container: &str) -> String {
    let name = format!("vgpu-{container}");
    if name.len() <= 63 {
        name
    } else {
        format!("vgpu-{:08x}", fnv1a(container.as_bytes()) as u32)
    }
}

/// FNV-1a, 64 bits: a hash that stays the same across builds and replicas (std's does not
/// promise to), so every replica names a shape's template alike.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A CEL string list literal of `names` (already lower-cased by [`NameList`]).
fn cel_list(names: &NameList) -> String {
    let quoted: Vec<String> = names
        .entries()
        .iter()
        .map(|n| serde_json::to_string(n).unwrap_or_default())
        .collect();
    format!("[{}]", quoted.join(", "))
}

/// The CEL selectors for the pod's type and UUID lists, with HAMi's matching (docs/dra.md): a
/// type entry matches a model that contains it, a UUID entry one that equals it, both ignoring
/// case. (`lowerAscii` is in the strings library of Kubernetes' CEL environment.)
fn selectors(f: &GpuFilter) -> Vec<String> {
    let model = format!("device.attributes[\"{CLASS}\"].productName.lowerAscii()");
    let uuid = format!("device.attributes[\"{CLASS}\"].uuid.lowerAscii()");
    let mut out = Vec::new();
    if !f.use_types.is_empty() {
        out.push(format!(
            "{}.exists(t, {model}.contains(t))",
            cel_list(&f.use_types)
        ));
    }
    if !f.nouse_types.is_empty() {
        out.push(format!(
            "!{}.exists(t, {model}.contains(t))",
            cel_list(&f.nouse_types)
        ));
    }
    if !f.use_uuids.is_empty() {
        out.push(format!("{uuid} in {}", cel_list(&f.use_uuids)));
    }
    if !f.nouse_uuids.is_empty() {
        out.push(format!("!({uuid} in {})", cel_list(&f.nouse_uuids)));
    }
    out
}

fn mi(bytes: u64) -> String {
    format!("{}Mi", bytes >> 20)
}

/// The template for one container's request.
fn template(
    r: &VgpuRequest,
    selectors: &[String],
    numa_bind: bool,
    card_sizes: &[u64],
    at: &str,
) -> Result<Value, ConvertError> {
    let cel = |exprs: &[String]| -> Value {
        exprs
            .iter()
            .map(|e| json!({"cel": {"expression": e}}))
            .collect()
    };
    let one = |memory: Option<String>, extra: Option<String>| -> Value {
        let mut requests = serde_json::Map::new();
        if let Some(m) = memory {
            requests.insert("memory".into(), Value::String(m));
        }
        if r.cores > 0 {
            requests.insert("cores".into(), Value::String(r.cores.to_string()));
        }
        let mut exprs = selectors.to_vec();
        exprs.extend(extra);
        let mut out =
            json!({"deviceClassName": CLASS, "allocationMode": "ExactCount", "count": r.gpus});
        if !requests.is_empty() {
            out["capacity"] = json!({ "requests": requests });
        }
        if !exprs.is_empty() {
            out["selectors"] = cel(&exprs);
        }
        out
    };
    let (request, memory_word) = match r.memory {
        Memory::Mib(m) => (
            json!({"name": REQUEST, "exactly": one(Some(format!("{m}Mi")), None)}),
            format!("{m}mi"),
        ),
        Memory::Percent(100) => (
            json!({"name": REQUEST, "exactly": one(None, None)}),
            "card".to_string(),
        ),
        Memory::Percent(p) => {
            if card_sizes.is_empty() {
                return Err(ConvertError::Unmappable {
                    field: format!("{}.resources.limits[\"nvidia.com/gpumem-percentage\"]", dotted(at)),
                    why: format!(
                        "{p} % of a GPU becomes one alternative per GPU size, and no GPU of class {CLASS} is published yet; write nvidia.com/gpumem in MiB"
                    ),
                });
            }
            let mut sizes = card_sizes.to_vec();
            sizes.sort_unstable_by(|a, b| b.cmp(a));
            sizes.dedup();
            let alternatives: Vec<Value> = sizes
                .iter()
                .enumerate()
                .map(|(i, size)| {
                    let share = (size >> 20).saturating_mul(u64::from(p)) / 100;
                    let mut alt = one(
                        Some(format!("{share}Mi")),
                        Some(format!(
                            "device.capacity[\"{CLASS}\"].memory.compareTo(quantity(\"{}\")) == 0",
                            mi(*size)
                        )),
                    );
                    alt["name"] = Value::String(format!("size{i}"));
                    alt
                })
                .collect();
            (
                json!({"name": REQUEST, "firstAvailable": alternatives}),
                format!("{p}pct"),
            )
        }
    };
    let mut devices = json!({ "requests": [request] });
    if numa_bind && r.gpus > 1 {
        devices["constraints"] =
            json!([{"requests": [REQUEST], "matchAttribute": format!("{CLASS}/numaNode")}]);
    }
    let spec = json!({ "devices": devices });
    let hash = fnv1a(spec.to_string().as_bytes()) as u32;
    let cores = if r.cores > 0 {
        format!("-{}c", r.cores)
    } else {
        String::new()
    };
    let name = format!("vgpu-{}x{memory_word}{cores}-{hash:08x}", r.gpus);
    Ok(json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "vgpu-webhook", GENERATED_LABEL: "true"},
        },
        "spec": { "spec": spec },
    }))
}

/// `/spec/containers/0` as `spec.containers[0]`.
fn dotted(at: &str) -> String {
    let parts: Vec<&str> = at.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        [spec, kind, i] => format!("{spec}.{kind}[{i}]"),
        _ => at.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn apply(pod: &Value, c: &Conversion) -> Value {
        let mut out = pod.clone();
        json_patch::patch(&mut out, &c.patch).unwrap();
        out
    }

    #[test]
    fn a_hami_pod_becomes_one_claim_per_vgpu_container() {
        let pod = json!({"metadata": {"name": "p", "annotations": {"nvidia.com/use-gputype": "A10, h100"}},
            "spec": {"initContainers": [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}}}],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30", "cpu": "1"},
                "requests": {"nvidia.com/gpu": "2", "cpu": "1"}},
                "env": [{"name": "A", "value": "1"}, {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "99g"}, {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]},
                {"name": "side"}]}});
        let c = convert(&pod, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap();
        let out = apply(&pod, &c);
        let main = &out["spec"]["containers"][0];
        assert_eq!(main["resources"]["limits"], json!({"cpu": "1"}));
        assert_eq!(main["resources"]["requests"], json!({"cpu": "1"}));
        assert_eq!(main["resources"]["claims"], json!([{"name": "vgpu-main"}]));
        assert_eq!(main["env"], json!([{"name": "A", "value": "1"}]));
        assert_eq!(out["spec"]["schedulerName"], "vgpu-scheduler");
        assert_eq!(out["spec"]["containers"][1], json!({"name": "side"}));
        assert_eq!(
            out["spec"]["initContainers"][0]["resources"],
            json!({"limits": {}, "claims": [{"name": "vgpu-warm"}]})
        );
        let claims = out["spec"]["resourceClaims"].as_array().unwrap();
        assert_eq!(claims.len(), 2);
        assert_eq!(claims[0]["name"], "vgpu-warm");
        assert_eq!(claims[1]["name"], "vgpu-main");
        assert_eq!(c.templates.len(), 2);
        let t = &c.templates[1];
        let name = t["metadata"]["name"].as_str().unwrap();
        assert!(name.starts_with("vgpu-2x4096mi-30c-"), "{name}");
        assert_eq!(claims[1]["resourceClaimTemplateName"], name);
        let exactly = &t["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(exactly["deviceClassName"], "gpu.vgpu.io");
        assert_eq!(exactly["count"], 2);
        assert_eq!(
            exactly["capacity"]["requests"],
            json!({"memory": "4096Mi", "cores": "30"})
        );
        assert_eq!(
            exactly["selectors"][0]["cel"]["expression"],
            "[\"a10\", \"h100\"].exists(t, device.attributes[\"gpu.vgpu.io\"].productName.lowerAscii().contains(t))"
        );
        assert_eq!(
            out["metadata"]["annotations"][CONVERTED],
            format!(
                "warm=vgpu-warm/{},main=vgpu-main/{name}",
                c.templates[0]["metadata"]["name"].as_str().unwrap()
            )
        );
        // Converted, the pod asks no vGPU: a second call (reinvocation) changes nothing.
        let again = convert(&out, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap();
        assert!(again.patch.0.is_empty());
        // The same shape in another pod names the same template.
        let other = json!({"metadata": {"annotations": {"nvidia.com/use-gputype": "a10,H100"}},
            "spec": {"containers": [{"name": "x", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}}}]}});
        let o = convert(&other, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap();
        assert_eq!(o.templates[0]["metadata"]["name"], name);
    }

    #[test]
    fn whole_card_uuids_and_numa_bind_map_to_the_claim() {
        let pod = json!({"metadata": {"annotations": {"nvidia.com/use-gpuuuid": "GPU-A,gpu-b",
            "nvidia.com/nouse-gpuuuid": "GPU-C", "nvidia.com/nouse-gputype": "T4", "nvidia.com/numa-bind": "true",
            "hami.io/gpu-scheduler-policy": "spread"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}});
        let c = convert(&pod, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap();
        let t = &c.templates[0];
        assert!(t["metadata"]["name"]
            .as_str()
            .unwrap()
            .starts_with("vgpu-2xcard-"));
        let devices = &t["spec"]["spec"]["devices"];
        let exactly = &devices["requests"][0]["exactly"];
        assert!(exactly.get("capacity").is_none(), "{exactly}");
        let exprs: Vec<&str> = exactly["selectors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["cel"]["expression"].as_str().unwrap())
            .collect();
        assert_eq!(
            exprs,
            [
                "![\"t4\"].exists(t, device.attributes[\"gpu.vgpu.io\"].productName.lowerAscii().contains(t))",
                "device.attributes[\"gpu.vgpu.io\"].uuid.lowerAscii() in [\"gpu-a\", \"gpu-b\"]",
                "!(device.attributes[\"gpu.vgpu.io\"].uuid.lowerAscii() in [\"gpu-c\"])",
            ]
        );
        assert_eq!(
            devices["constraints"],
            json!([{"requests": ["gpu"], "matchAttribute": "gpu.vgpu.io/numaNode"}])
        );
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].contains("hami.io/gpu-scheduler-policy"));
    }

    #[test]
    fn a_percentage_becomes_one_alternative_per_gpu_size_or_a_refusal() {
        let pod = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem-percentage": "50"}}}]}});
        assert!(needs_card_sizes(&pod, &RequestPolicy::default()));
        let e = convert(&pod, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap_err();
        assert_eq!(e.to_string(), "spec.containers[0].resources.limits[\"nvidia.com/gpumem-percentage\"]: 50 % of a GPU becomes one alternative per GPU size, and no GPU of class gpu.vgpu.io is published yet; write nvidia.com/gpumem in MiB");
        let gi = 1u64 << 30;
        let c = convert(
            &pod,
            &RequestPolicy::default(),
            &[24 * gi, 80 * gi, 24 * gi],
            "vgpu-scheduler",
        )
        .unwrap();
        let alts = &c.templates[0]["spec"]["spec"]["devices"]["requests"][0]["firstAvailable"];
        assert_eq!(alts.as_array().unwrap().len(), 2);
        assert_eq!(alts[0]["name"], "size0");
        assert_eq!(alts[0]["capacity"]["requests"]["memory"], "40960Mi");
        assert_eq!(
            alts[0]["selectors"][0]["cel"]["expression"],
            "device.capacity[\"gpu.vgpu.io\"].memory.compareTo(quantity(\"81920Mi\")) == 0"
        );
        assert_eq!(alts[1]["capacity"]["requests"]["memory"], "12288Mi");
        let whole = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpumem-percentage": "100"}}}]}});
        assert!(!needs_card_sizes(&whole, &RequestPolicy::default()));
    }

    #[test]
    fn refusals_name_the_field() {
        let taken = json!({"spec": {"resourceClaims": [{"name": "vgpu-c", "resourceClaimName": "mine"}],
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let e = convert(&taken, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap_err();
        assert_eq!(e.to_string(), "spec.resourceClaims: the pod already has a claim named \"vgpu-c\" (mine), the name vgpu gives container \"c\"'s GPUs");
        let bad = json!({"metadata": {"annotations": {"nvidia.com/numa-bind": "maybe"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        let e = convert(&bad, &RequestPolicy::default(), &[], "vgpu-scheduler").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("metadata.annotations[\"nvidia.com/numa-bind\"]: "),
            "{e}"
        );
        let long = "c".repeat(60);
        assert_eq!(pod_claim_name(&long).len(), 13);
        assert_eq!(pod_claim_name("main"), "vgpu-main");
    }
}
