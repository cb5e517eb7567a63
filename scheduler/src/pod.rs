//! Reading the parts of a Pod object the extender needs: its vGPU request and GPU preferences, and
//! for pods already placed, the assignment annotation.

use k8s_openapi::api::core::v1::{Container, Pod};
use thiserror::Error;
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::assignment::PodAssignment;
use vgpu_core::placement::{ContainerRequest, PodRequest, Policy, PolicyError};
use vgpu_core::request::{ContainerKind, ContainerResources, RequestError, RequestPolicy};

use crate::extender::{ContainerView, Name, PodView};
use vgpu_core::placement::host::HostRequest;
use vgpu_core::quantity::parse_ceil;

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
    let req = request_of(all, policy, default_node, default_gpu, |k| {
        annotations.and_then(|a| a.get(k)).map(String::as_str)
    })?;
    Ok(req.map(|r| PodRequest {
        host: host_request(pod),
        ..r
    }))
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
    let req = request_of(all, policy, default_node, default_gpu, |k| {
        annotations.and_then(|a| a.get(k))
    })?;
    Ok(req.map(|r| PodRequest {
        host: host_request_view(pod),
        ..r
    }))
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

/// One container's CPU (milli) and memory (bytes) requests, as kube-scheduler reads them: a
/// value it could not read counts as 0 (the API server has validated every pod it serves).
fn cpu_mem<'q>(requests: impl Iterator<Item = (&'q str, &'q str)>) -> [u64; 2] {
    let mut out = [0u64; 2];
    for (name, q) in requests {
        match name {
            "cpu" => out[0] = parse_ceil(q, 3).unwrap_or(0),
            "memory" => out[1] = parse_ceil(q, 0).unwrap_or(0),
            _ => {}
        }
    }
    out
}

/// A pod's CPU and memory request as kube-scheduler counts it (`k8s.io/component-helpers/
/// resource/helpers.go` `PodRequests`): the sum over app containers and sidecars (init containers
/// with `restartPolicy: Always`), or, when larger, the largest step of the init sequence (an init
/// container plus the sidecars started before it), plus `spec.overhead`. Memory in MiB, rounded up.
fn pod_host(
    apps: impl Iterator<Item = [u64; 2]>,
    inits: impl Iterator<Item = ([u64; 2], bool)>,
    overhead: [u64; 2],
) -> HostRequest {
    let add = |a: [u64; 2], b: [u64; 2]| [a[0].saturating_add(b[0]), a[1].saturating_add(b[1])];
    let max = |a: [u64; 2], b: [u64; 2]| [a[0].max(b[0]), a[1].max(b[1])];
    let mut sum = apps.fold([0, 0], add);
    let (mut sidecars, mut init) = ([0u64; 2], [0u64; 2]);
    for (r, sidecar) in inits {
        let step = if sidecar {
            sum = add(sum, r);
            sidecars = add(sidecars, r);
            sidecars
        } else {
            add(r, sidecars)
        };
        init = max(init, step);
    }
    let total = add(max(sum, init), overhead);
    HostRequest {
        cpu_milli: total[0],
        mem_mib: total[1].div_ceil(1 << 20),
    }
}

/// [`pod_host`] of a Pod object.
pub fn host_request(pod: &Pod) -> HostRequest {
    let Some(spec) = &pod.spec else {
        return HostRequest::default();
    };
    let of = |c: &Container| {
        cpu_mem(
            c.resources
                .iter()
                .flat_map(|r| r.requests.iter().flatten())
                .map(|(k, v)| (k.as_str(), v.0.as_str())),
        )
    };
    let overhead = cpu_mem(
        spec.overhead
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_str())),
    );
    pod_host(
        spec.containers.iter().map(of),
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| (of(c), c.restart_policy.as_deref() == Some("Always"))),
        overhead,
    )
}

/// [`host_request`] of the pruned read of an extender call.
pub fn host_request_view(pod: &PodView<'_>) -> HostRequest {
    let Some(spec) = &pod.spec else {
        return HostRequest::default();
    };
    let of = |c: &ContainerView<'_>| {
        cpu_mem(
            c.resources
                .iter()
                .flat_map(|r| r.requests.iter().flatten())
                .map(|(k, v)| (k.as_str(), v.0.as_ref())),
        )
    };
    let overhead = cpu_mem(
        spec.overhead
            .iter()
            .flatten()
            .map(|(k, v)| (k.as_str(), v.0.as_ref())),
    );
    pod_host(
        spec.containers.iter().map(of),
        spec.init_containers.iter().flatten().map(|c| {
            let sidecar = c.restart_policy.as_ref().map(Name::as_str) == Some("Always");
            (of(c), sidecar)
        }),
        overhead,
    )
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

    /// kube-scheduler's pod request: app containers and sidecars summed, the largest init step
    /// if larger, plus overhead; memory rounded up to MiB; the extender's pruned read agrees.
    #[test]
    fn host_request_counts_as_kube_scheduler() {
        let v = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {
                "initContainers": [
                    {"name": "setup", "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}},
                    {"name": "mesh", "restartPolicy": "Always",
                        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}},
                    {"name": "late", "resources": {"requests": {"cpu": "5800m"}}}
                ],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "1", "memory": "1000000"}}},
                    {"name": "b", "resources": {"requests": {"cpu": "250m", "memory": "2Gi"}}},
                    {"name": "c"}
                ],
                "overhead": {"cpu": "100m", "memory": "64Mi"}
            }
        });
        // Apps + sidecar: 1.75 CPU; init steps: setup 6, late 5.8 + 0.5 sidecar = 6.3 CPU.
        // Memory: apps 2 GiB + 1000000 B + 512 MiB sidecar > the init steps.
        let want = HostRequest {
            cpu_milli: 6300 + 100,
            mem_mib: (2048 + 512 + 1 + 64) as u64,
        };
        assert_eq!(host_request(&pod(v.clone())), want);
        let text = v.to_string();
        let view: PodView<'_> = serde_json::from_str(&text).unwrap();
        assert_eq!(host_request_view(&view), want);
        // Nothing asked, nothing counted; unreadable values count as 0.
        assert_eq!(host_request(&pod(json!({}))), HostRequest::default());
        let odd = pod(json!({"spec": {"containers": [
            {"name": "a", "resources": {"requests": {"cpu": "lots", "memory": "1Mi"}}}]}}));
        assert_eq!(
            host_request(&odd),
            HostRequest {
                cpu_milli: 0,
                mem_mib: 1
            }
        );
    }
}
