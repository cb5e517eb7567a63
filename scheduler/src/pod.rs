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

/// The parts of a pod the extender reads, from a whole Pod object (watches, bind) or from the
/// pruned read of an extender call ([`PodView`]): [`pod_request`] and [`host_request`] read
/// either through this, so both forms give the same request and the same errors.
pub trait PodSource {
    /// A container of the pod.
    type Container: ContainerSource;
    /// `metadata.namespace` and `metadata.name` (empty when missing).
    fn key(&self) -> Key<'_>;
    /// `metadata.uid`.
    fn uid(&self) -> Option<&str>;
    /// `metadata.creationTimestamp`, Unix seconds (0 when missing or unreadable).
    fn created(&self) -> i64;
    /// The annotation `key`.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// `spec.initContainers`, in order.
    fn init_containers(&self) -> impl Iterator<Item = &Self::Container>;
    /// `spec.containers`, in order.
    fn containers(&self) -> impl Iterator<Item = &Self::Container>;
    /// `spec.overhead`, name to quantity.
    fn overhead(&self) -> impl Iterator<Item = (&str, &str)>;
}

/// The parts of a container the extender reads.
pub trait ContainerSource {
    /// `name`.
    fn name(&self) -> &str;
    /// `resources.limits`, name to quantity.
    fn limits(&self) -> impl Iterator<Item = (&str, &str)>;
    /// `resources.requests`, name to quantity.
    fn requests(&self) -> impl Iterator<Item = (&str, &str)>;
    /// Whether it is a sidecar (`restartPolicy: Always`, init containers only).
    fn is_sidecar(&self) -> bool;
}

/// A pod's `namespace/name`, for logs and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    /// `metadata.namespace`.
    pub namespace: &'a str,
    /// `metadata.name`.
    pub name: &'a str,
}

impl std::fmt::Display for Key<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl PodSource for Pod {
    type Container = Container;
    fn key(&self) -> Key<'_> {
        Key {
            namespace: self.metadata.namespace.as_deref().unwrap_or(""),
            name: self.metadata.name.as_deref().unwrap_or(""),
        }
    }
    fn uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }
    fn created(&self) -> i64 {
        self.metadata
            .creation_timestamp
            .as_ref()
            .map_or(0, |t| t.0.as_second())
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()?
            .get(key)
            .map(String::as_str)
    }
    fn init_containers(&self) -> impl Iterator<Item = &Container> {
        self.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
    }
    fn containers(&self) -> impl Iterator<Item = &Container> {
        self.spec.iter().flat_map(|s| s.containers.iter())
    }
    fn overhead(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spec
            .iter()
            .flat_map(|s| s.overhead.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
    }
}

impl ContainerSource for Container {
    fn name(&self) -> &str {
        &self.name
    }
    fn limits(&self) -> impl Iterator<Item = (&str, &str)> {
        self.resources
            .iter()
            .flat_map(|r| r.limits.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
    }
    fn requests(&self) -> impl Iterator<Item = (&str, &str)> {
        self.resources
            .iter()
            .flat_map(|r| r.requests.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_str()))
    }
    fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }
}

impl<'a> PodSource for PodView<'a> {
    type Container = ContainerView<'a>;
    fn key(&self) -> Key<'_> {
        let meta = self.metadata.as_ref();
        Key {
            namespace: meta
                .and_then(|m| m.namespace.as_ref())
                .map_or("", Name::as_str),
            name: meta.and_then(|m| m.name.as_ref()).map_or("", Name::as_str),
        }
    }
    fn uid(&self) -> Option<&str> {
        self.metadata.as_ref()?.uid.as_ref().map(Name::as_str)
    }
    fn created(&self) -> i64 {
        self.metadata
            .as_ref()
            .and_then(|m| m.creation_timestamp.as_ref())
            .and_then(|t| vgpu_core::time::parse_rfc3339(t.as_str()).ok())
            .map_or(0, |s| i64::try_from(s).unwrap_or(i64::MAX))
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.as_ref()?.annotations.as_ref()?.get(key)
    }
    fn init_containers(&self) -> impl Iterator<Item = &ContainerView<'a>> {
        self.spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten())
    }
    fn containers(&self) -> impl Iterator<Item = &ContainerView<'a>> {
        self.spec.iter().flat_map(|s| s.containers.iter())
    }
    fn overhead(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spec
            .iter()
            .flat_map(|s| s.overhead.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_ref()))
    }
}

impl ContainerSource for ContainerView<'_> {
    fn name(&self) -> &str {
        self.name.as_str()
    }
    fn limits(&self) -> impl Iterator<Item = (&str, &str)> {
        self.resources
            .iter()
            .flat_map(|r| r.limits.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_ref()))
    }
    fn requests(&self) -> impl Iterator<Item = (&str, &str)> {
        self.resources
            .iter()
            .flat_map(|r| r.requests.iter().flatten())
            .map(|(k, v)| (k.as_str(), v.0.as_ref()))
    }
    fn is_sidecar(&self) -> bool {
        self.restart_policy.as_ref().map(Name::as_str) == Some("Always")
    }
}

fn resources(c: &impl ContainerSource, kind: ContainerKind) -> ContainerResources {
    let owned = |(k, v): (&str, &str)| (k.to_string(), v.to_string());
    ContainerResources {
        limits: c.limits().map(owned).collect(),
        requests: c.requests().map(owned).collect(),
        ..ContainerResources::new(c.name(), kind)
    }
}

/// The pod's vGPU request, or `None` when no container asks for a vGPU.
pub fn pod_request(
    pod: &impl PodSource,
    policy: &RequestPolicy,
    default_node: Policy,
    default_gpu: Policy,
) -> Result<Option<PodRequest>, PodError> {
    let all: Vec<ContainerResources> = pod
        .init_containers()
        .map(|c| resources(c, ContainerKind::Init))
        .chain(pod.containers().map(|c| resources(c, ContainerKind::App)))
        .collect();
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
    let req =
        PodRequest::from_annotations(containers, |k| pod.annotation(k), default_node, default_gpu)?;
    Ok(Some(PodRequest {
        host: host_request(pod),
        ..req
    }))
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
pub fn host_request(pod: &impl PodSource) -> HostRequest {
    let add = |a: [u64; 2], b: [u64; 2]| [a[0].saturating_add(b[0]), a[1].saturating_add(b[1])];
    let max = |a: [u64; 2], b: [u64; 2]| [a[0].max(b[0]), a[1].max(b[1])];
    let mut sum = pod
        .containers()
        .map(|c| cpu_mem(c.requests()))
        .fold([0, 0], add);
    let (mut sidecars, mut init) = ([0u64; 2], [0u64; 2]);
    for c in pod.init_containers() {
        let r = cpu_mem(c.requests());
        let step = if c.is_sidecar() {
            sum = add(sum, r);
            sidecars = add(sidecars, r);
            sidecars
        } else {
            add(r, sidecars)
        };
        init = max(init, step);
    }
    let total = add(max(sum, init), cpu_mem(pod.overhead()));
    HostRequest {
        cpu_milli: total[0],
        mem_mib: total[1].div_ceil(1 << 20),
    }
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
        assert_eq!(p.key().to_string(), "ns/p");
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
        assert_eq!(host_request(&view), want);
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
