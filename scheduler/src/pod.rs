//! Reading the parts of a Pod object the extender needs: its vGPU request and GPU preferences, and
//! for pods already placed, the assignment annotation.

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::assignment::PodAssignment;
use vgpu_core::placement::{ContainerRequest, PodRequest, Policy, PolicyError};
use vgpu_core::request::{ContainerKind, ContainerResources, RequestError, RequestPolicy};

use crate::extender::{ContainerView, PodView};

/// A pod whose vGPU request cannot be read.
#[derive(Debug, Error)]
pub enum PodError {
    /// A container's resources are wrong.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A policy annotation names no policy.
    #[error(transparent)]
    Policy(#[from] PolicyError),
}

fn resources(c: &Container, kind: ContainerKind) -> ContainerResources {
    let mut r = ContainerResources::new(c.name.clone(), kind);
    if let Some(res) = &c.resources {
        for (k, v) in res.limits.iter().flatten() {
            r.limits.push((k.clone(), v.0.clone()));
        }
        for (k, v) in res.requests.iter().flatten() {
            r.requests.push((k.clone(), v.0.clone()));
        }
    }
    r
}

/// The pod's vGPU request, or `None` when no container asks for a vGPU.
pub fn pod_request(
    pod: &Pod,
    policy: &RequestPolicy,
    default_node: Policy,
    default_gpu: Policy,
) -> Result<Option<PodRequest>, PodError> {
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let all: Vec<ContainerResources> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| resources(c, ContainerKind::Init))
        .chain(
            spec.containers
                .iter()
                .map(|c| resources(c, ContainerKind::App)),
        )
        .collect();
    let annotations = pod.metadata.annotations.as_ref();
    request_of(all, policy, default_node, default_gpu, |k| {
        annotations.and_then(|a| a.get(k)).map(String::as_str)
    })
}

fn resources_view(c: &ContainerView<'_>, kind: ContainerKind) -> ContainerResources {
    let mut r = ContainerResources::new(c.name.as_str(), kind);
    if let Some(res) = &c.resources {
        for (k, v) in res.limits.iter().flatten() {
            r.limits.push((k.as_str().to_string(), v.0.to_string()));
        }
        for (k, v) in res.requests.iter().flatten() {
            r.requests.push((k.as_str().to_string(), v.0.to_string()));
        }
    }
    r
}

/// [`pod_request`] from the pruned read of an extender call: the same request, the same errors.
pub fn pod_request_view(
    pod: &PodView<'_>,
    policy: &RequestPolicy,
    default_node: Policy,
    default_gpu: Policy,
) -> Result<Option<PodRequest>, PodError> {
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    let all: Vec<ContainerResources> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| resources_view(c, ContainerKind::Init))
        .chain(
            spec.containers
                .iter()
                .map(|c| resources_view(c, ContainerKind::App)),
        )
        .collect();
    let annotations = pod.metadata.as_ref().and_then(|m| m.annotations.as_ref());
    request_of(all, policy, default_node, default_gpu, |k| {
        annotations.and_then(|a| a.get(k))
    })
}

fn request_of<'a>(
    all: Vec<ContainerResources>,
    policy: &RequestPolicy,
    default_node: Policy,
    default_gpu: Policy,
    annotation: impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<PodRequest>, PodError> {
    let parsed = policy.parse_pod(&all)?;
    if parsed.is_empty() {
        return Ok(None);
    }
    let containers = parsed
        .into_iter()
        .map(|(c, request)| ContainerRequest {
            name: c.name.clone(),
            request,
        })
        .collect();
    let req = PodRequest::from_annotations(containers, annotation, default_node, default_gpu)?;
    Ok(Some(req))
}

/// `namespace/name`, for logs and messages.
pub fn key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// The assignment annotation of a pod, if it has a readable one.
pub fn assignment(pod: &Pod) -> Option<Result<PodAssignment, vgpu_core::annotations::CodecError>> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ASSIGNMENT))
        .map(|s| PodAssignment::decode(s))
}

/// Whether a pod has finished, so its GPUs are free again (phase Succeeded or Failed, as the
/// kubelet reports when every container has terminated for good).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use vgpu_core::request::Memory;

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn reads_init_then_app_containers_and_annotations() {
        let p = pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": {
                "nvidia.com/use-gputype": "A100", "hami.io/gpu-scheduler-policy": "binpack"}},
            "spec": {
                "initContainers": [{"name": "prep", "resources": {"limits": {"nvidia.com/gpumem-percentage": "50"}}}],
                "containers": [
                    {"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"},
                        "requests": {"nvidia.com/gpu": "2"}}},
                    {"name": "side", "resources": {"limits": {"cpu": "1"}}}
                ]}
        }));
        let r = pod_request(
            &p,
            &RequestPolicy::default(),
            Policy::Binpack,
            Policy::Spread,
        )
        .unwrap()
        .unwrap();
        let names: Vec<_> = r.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["prep", "main"]);
        assert_eq!(r.containers[0].request.memory, Memory::Percent(50));
        assert_eq!(r.containers[1].request.gpus, 2);
        assert_eq!(r.filter.use_types.entries(), ["a100"]);
        assert_eq!(r.gpu_policy, Policy::Binpack);
        assert_eq!(r.node_policy, Policy::Binpack);
        assert_eq!(key(&p), "ns/p");
    }

    #[test]
    fn no_vgpu_is_none_and_bad_input_names_the_field() {
        let p = pod(json!({"spec": {"containers": [{"name": "c"}]}}));
        assert!(pod_request(
            &p,
            &RequestPolicy::default(),
            Policy::Binpack,
            Policy::Spread
        )
        .unwrap()
        .is_none());
        let p = pod(json!({"spec": {"containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpucores": "101"}}}]}}));
        let e = pod_request(
            &p,
            &RequestPolicy::default(),
            Policy::Binpack,
            Policy::Spread,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "container \"c\": nvidia.com/gpucores: 101 is out of range 0-100"
        );
        let p = pod(
            json!({"metadata": {"annotations": {"hami.io/node-scheduler-policy": "x"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}),
        );
        let e = pod_request(
            &p,
            &RequestPolicy::default(),
            Policy::Binpack,
            Policy::Spread,
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("hami.io/node-scheduler-policy"),
            "{e}"
        );
    }

    #[test]
    fn terminal_phases() {
        assert!(is_terminal(&pod(json!({"status": {"phase": "Succeeded"}}))));
        assert!(is_terminal(&pod(json!({"status": {"phase": "Failed"}}))));
        assert!(!is_terminal(&pod(json!({"status": {"phase": "Running"}}))));
        assert!(!is_terminal(&pod(json!({}))));
    }
}
