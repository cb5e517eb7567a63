//! What a pod asks of placement, from its spec and annotations: [`PodRequest`], its containers,
//! and the GPU type and UUID lists ([`GpuFilter`]).

use super::*;

/// A comma list from an annotation: trimmed, lower-cased, empty entries dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameList(pub(super) Vec<String>);

impl NameList {
    /// Reads `a, B ,c` into `["a", "b", "c"]`.
    pub fn parse(s: &str) -> NameList {
        NameList(
            s.split(',')
                .map(|p| p.trim().to_ascii_lowercase())
                .filter(|p| !p.is_empty())
                .collect(),
        )
    }

    /// Whether the list has no entries.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The entries, lower-cased.
    pub fn entries(&self) -> &[String] {
        &self.0
    }

    pub(super) fn any_contained_in(&self, lower: &str) -> bool {
        self.0.iter().any(|t| lower.contains(t.as_str()))
    }

    pub(super) fn any_equal(&self, s: &str) -> bool {
        self.0.iter().any(|t| t.eq_ignore_ascii_case(s))
    }
}

/// Which GPUs a pod may use, from its annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFilter {
    /// `nvidia.com/use-gputype`: when not empty, the model must contain one entry.
    pub use_types: NameList,
    /// `nvidia.com/nouse-gputype`: the model must contain none.
    pub nouse_types: NameList,
    /// `nvidia.com/use-gpuuuid`: when not empty, the UUID must be one of these.
    pub use_uuids: NameList,
    /// `nvidia.com/nouse-gpuuuid`: the UUID must be none of these.
    pub nouse_uuids: NameList,
}

impl GpuFilter {
    /// The lists a pod's annotations give.
    pub fn from_annotations<'a>(annotation: impl Fn(&str) -> Option<&'a str>) -> GpuFilter {
        let list = |key| annotation(key).map(NameList::parse).unwrap_or_default();
        GpuFilter {
            use_types: list(USE_GPU_TYPE),
            nouse_types: list(NOUSE_GPU_TYPE),
            use_uuids: list(USE_GPU_UUID),
            nouse_uuids: list(NOUSE_GPU_UUID),
        }
    }

    /// Whether a model, lower-cased, passes the type lists.
    pub fn type_ok_lower(&self, model_lower: &str) -> bool {
        (self.use_types.is_empty() || self.use_types.any_contained_in(model_lower))
            && !self.nouse_types.any_contained_in(model_lower)
    }

    /// Whether the type lists say anything.
    #[inline]
    pub fn typed(&self) -> bool {
        !self.use_types.is_empty() || !self.nouse_types.is_empty()
    }

    #[inline]
    pub(super) fn uuids(&self) -> bool {
        !self.use_uuids.is_empty() || !self.nouse_uuids.is_empty()
    }

    pub(super) fn uuid_ok(&self, uuid: &str) -> bool {
        (self.use_uuids.is_empty() || self.use_uuids.any_equal(uuid))
            && !self.nouse_uuids.any_equal(uuid)
    }
}

/// One vGPU container of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerRequest {
    /// Container name.
    pub name: String,
    /// What it asks for.
    pub request: VgpuRequest,
}

/// Everything placement needs to know about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodRequest {
    /// The vGPU containers, init containers first, in pod-spec order.
    pub containers: Vec<ContainerRequest>,
    /// Which GPUs it may use.
    pub filter: GpuFilter,
    /// Node policy.
    pub node_policy: Policy,
    /// GPU policy: how GPUs are ordered.
    pub gpu_policy: Policy,
    /// Whether the GPU policy lists `mutex`: each GPU the pod gets holds nothing else.
    pub mutex: bool,
    /// Whether the GPU policy lists `topology-aware`.
    pub topology: bool,
    /// Whether the GPU policy lists `numa` (a container's GPUs on one NUMA node when one has
    /// enough).
    pub numa: bool,
    /// `nvidia.com/numa-bind: "true"`: a container's GPUs on one NUMA node, or the node fails.
    pub numa_bind: bool,
    /// The pod's CPU and memory request (the `gap-aware` measure's host terms read it).
    pub host: HostRequest,
}

impl PodRequest {
    /// A pod request from its containers and annotations; the policies default to the given ones
    /// when the pod does not choose.
    pub fn from_annotations<'a>(
        containers: Vec<ContainerRequest>,
        annotation: impl Fn(&str) -> Option<&'a str>,
        default_node: Policy,
        default_gpu: Policy,
    ) -> Result<PodRequest, PolicyError> {
        let node_policy = match annotation(NODE_POLICY) {
            None => default_node,
            Some(v) if v.trim().is_empty() => default_node,
            Some(v) => Policy::parse(v).ok_or_else(|| PolicyError {
                annotation: NODE_POLICY,
                word: v.to_string(),
                known: Policy::NAMES,
            })?,
        };
        let gpu = GpuPolicy::parse(annotation(GPU_POLICY).unwrap_or_default()).map_err(|word| {
            PolicyError {
                annotation: GPU_POLICY,
                word,
                known: GpuPolicy::NAMES,
            }
        })?;
        let numa_bind = match annotation(NUMA_BIND).map(str::trim) {
            None | Some("") => false,
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => true,
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => false,
            Some(v) => {
                return Err(PolicyError {
                    annotation: NUMA_BIND,
                    word: v.to_string(),
                    known: "true, false",
                })
            }
        };
        Ok(PodRequest {
            containers,
            filter: GpuFilter::from_annotations(&annotation),
            node_policy,
            gpu_policy: gpu.order.unwrap_or(default_gpu),
            mutex: gpu.mutex,
            topology: gpu.topology,
            numa: gpu.numa,
            numa_bind,
            host: HostRequest::default(),
        })
    }

    /// A pod of these containers with no GPU filter and the default policies.
    pub fn simple(containers: Vec<ContainerRequest>) -> PodRequest {
        PodRequest {
            containers,
            filter: GpuFilter::default(),
            node_policy: Policy::Binpack,
            gpu_policy: Policy::Spread,
            mutex: false,
            topology: false,
            numa: false,
            numa_bind: false,
            host: HostRequest::default(),
        }
    }
}
