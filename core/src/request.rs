//! A pod's vGPU request, read container by container from its resource limits and requests.
//!
//! Kubernetes treats extended resources as non-overcommittable: when a container gives both a request
//! and a limit they must be equal, and a request alone is taken as the limit. We read the limit and fall
//! back to the request, and refuse a pair that differs, so a mistake is reported here rather than as an
//! opaque API-server error later. Ephemeral containers cannot hold resources at all; one that names a
//! vGPU resource is refused.

use crate::quantity::{parse_integer, QuantityError};
use crate::resources::{Defaults, ResourceNames};
use thiserror::Error;

/// Where a container sits in the pod spec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContainerKind {
    /// `spec.initContainers`
    Init,
    /// `spec.containers`
    App,
    /// `spec.ephemeralContainers`
    Ephemeral,
}

impl ContainerKind {
    /// The pod-spec field holding containers of this kind.
    pub fn field(self) -> &'static str {
        match self {
            ContainerKind::Init => "initContainers",
            ContainerKind::App => "containers",
            ContainerKind::Ephemeral => "ephemeralContainers",
        }
    }
}

/// The resource section of one container, as strings straight from the pod spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerResources {
    /// Container name.
    pub name: String,
    /// Where the container sits; `None` only in `Default`.
    pub kind: Option<ContainerKind>,
    /// `resources.limits`, name to quantity string.
    pub limits: Vec<(String, String)>,
    /// `resources.requests`, name to quantity string.
    pub requests: Vec<(String, String)>,
}

impl ContainerResources {
    /// A container with no resources.
    pub fn new(name: impl Into<String>, kind: ContainerKind) -> Self {
        Self {
            name: name.into(),
            kind: Some(kind),
            ..Self::default()
        }
    }

    /// Adds a limit (builder style, for tests and examples).
    pub fn limit(mut self, name: &str, value: &str) -> Self {
        self.limits.push((name.into(), value.into()));
        self
    }

    /// Adds a request (builder style, for tests and examples).
    pub fn request(mut self, name: &str, value: &str) -> Self {
        self.requests.push((name.into(), value.into()));
        self
    }

    fn limit_of(&self, name: &str) -> Option<&str> {
        self.limits
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn request_of(&self, name: &str) -> Option<&str> {
        self.requests
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Device memory asked for on each vGPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// A fixed amount, in MiB.
    Mib(u64),
    /// A share of whichever card the vGPU lands on, 1–100 %.
    Percent(u32),
}

/// One container's vGPU request, with defaults applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VgpuRequest {
    /// Number of vGPUs, each on a distinct physical GPU (>= 1).
    pub gpus: u32,
    /// Device memory per vGPU.
    pub memory: Memory,
    /// SM share per vGPU, 0–100; 0 is unlimited and 100 is the whole card, exclusively.
    pub cores: u32,
}

impl VgpuRequest {
    /// Device memory this request holds in total on cards of `card_mib` MiB: GPUs x MiB per GPU.
    /// Percentages resolve against the given card size, rounding down as the device plugin does.
    pub fn total_mib(&self, card_mib: u64) -> u64 {
        u64::from(self.gpus).saturating_mul(self.mib_per_gpu(card_mib))
    }

    /// Device memory per vGPU when the request names MiB; a percentage has none before it is
    /// placed on a card.
    pub fn memory_mib(&self) -> Option<u64> {
        match self.memory {
            Memory::Mib(m) => Some(m),
            Memory::Percent(_) => None,
        }
    }

    /// Device memory per vGPU on a card of `card_mib` MiB.
    #[inline]
    pub fn mib_per_gpu(&self, card_mib: u64) -> u64 {
        match self.memory {
            Memory::Mib(m) => m,
            Memory::Percent(p) => card_mib.saturating_mul(u64::from(p)) / 100,
        }
    }
}

/// Why a container's vGPU request is invalid. Always names the container; names the resource where
/// one resource is at fault.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("container {container:?}: {kind}")]
pub struct RequestError {
    /// The container at fault.
    pub container: String,
    /// What is wrong.
    pub kind: RequestErrorKind,
}

/// The ways a vGPU request can be wrong.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum RequestErrorKind {
    /// A value is not a whole-number quantity.
    #[error("{resource}: {source}")]
    Quantity {
        /// Resource name.
        resource: String,
        /// The parse failure.
        #[source]
        source: QuantityError,
    },
    /// A value is outside its allowed range.
    #[error("{resource}: {value} is out of range {min}-{max}")]
    OutOfRange {
        /// Resource name.
        resource: String,
        /// Parsed value.
        value: u64,
        /// Smallest allowed value.
        min: u64,
        /// Largest allowed value.
        max: u64,
    },
    /// Request and limit differ; extended resources cannot be overcommitted.
    #[error("{resource}: request {request} differs from limit {limit} (extended resources need requests == limits)")]
    RequestLimitMismatch {
        /// Resource name.
        resource: String,
        /// The request as written.
        request: String,
        /// The limit as written.
        limit: String,
    },
    /// `gpu: 0` together with memory or cores.
    #[error("{resource}: 0 GPUs cannot carry {other}")]
    ZeroGpus {
        /// The gpu resource name.
        resource: String,
        /// The other resource given.
        other: String,
    },
    /// gpumem and gpumem-percentage together.
    #[error("{gpumem} and {percentage} are mutually exclusive; give one")]
    MemoryTwice {
        /// The gpumem resource name.
        gpumem: String,
        /// The gpumem-percentage resource name.
        percentage: String,
    },
    /// An ephemeral container names a vGPU resource.
    #[error("{resource}: ephemeral containers cannot request vGPU resources")]
    Ephemeral {
        /// Resource name.
        resource: String,
    },
}

/// Resource names plus defaults: everything needed to read a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestPolicy {
    /// The resource names.
    pub names: ResourceNames,
    /// The defaults.
    pub defaults: Defaults,
}

/// Limits of the values a request may hold.
const MAX_GPUS: u64 = 128;
const MAX_PERCENT: u64 = 100;

impl RequestPolicy {
    /// Reads one container. `Ok(None)` means it asks for no vGPU (none of the names appear, or only
    /// `gpu: 0`).
    pub fn parse_container(
        &self,
        c: &ContainerResources,
    ) -> Result<Option<VgpuRequest>, RequestError> {
        let err = |kind| RequestError {
            container: c.name.clone(),
            kind,
        };
        let n = &self.names;

        if c.kind == Some(ContainerKind::Ephemeral) {
            if let Some(name) = n
                .all()
                .into_iter()
                .find(|r| c.limit_of(r).or(c.request_of(r)).is_some())
            {
                return Err(err(RequestErrorKind::Ephemeral {
                    resource: name.to_string(),
                }));
            }
            return Ok(None);
        }

        let value = |resource: &str, min: u64, max: u64| -> Result<Option<u64>, RequestError> {
            let limit = c.limit_of(resource);
            let request = c.request_of(resource);
            let parse = |s: &str| {
                parse_integer(s).map_err(|source| {
                    err(RequestErrorKind::Quantity {
                        resource: resource.to_string(),
                        source,
                    })
                })
            };
            let v = match (limit, request) {
                (None, None) => return Ok(None),
                (Some(l), None) => parse(l)?,
                (None, Some(r)) => parse(r)?,
                (Some(l), Some(r)) => {
                    let (lv, rv) = (parse(l)?, parse(r)?);
                    if lv != rv {
                        return Err(err(RequestErrorKind::RequestLimitMismatch {
                            resource: resource.to_string(),
                            request: r.to_string(),
                            limit: l.to_string(),
                        }));
                    }
                    lv
                }
            };
            if v < min || v > max {
                return Err(err(RequestErrorKind::OutOfRange {
                    resource: resource.to_string(),
                    value: v,
                    min,
                    max,
                }));
            }
            Ok(Some(v))
        };

        let gpus = value(&n.gpu, 0, MAX_GPUS)?;
        let mem = value(&n.gpumem, 1, u64::MAX)?;
        let pct = value(&n.gpumem_percentage, 1, MAX_PERCENT)?;
        let cores = value(&n.gpucores, 0, MAX_PERCENT)?;

        if mem.is_some() && pct.is_some() {
            return Err(err(RequestErrorKind::MemoryTwice {
                gpumem: n.gpumem.clone(),
                percentage: n.gpumem_percentage.clone(),
            }));
        }
        let other = [
            (mem, &n.gpumem),
            (pct, &n.gpumem_percentage),
            (cores, &n.gpucores),
        ]
        .into_iter()
        .find_map(|(v, name)| v.map(|_| name.clone()));
        let gpus = match (gpus, other) {
            (None, None) | (Some(0), None) => return Ok(None),
            (Some(0), Some(other)) => {
                return Err(err(RequestErrorKind::ZeroGpus {
                    resource: n.gpu.clone(),
                    other,
                }));
            }
            (Some(g), _) => g,
            (None, Some(_)) => u64::from(self.defaults.gpu),
        };
        let memory = match (mem, pct) {
            (Some(m), _) => Memory::Mib(m),
            (None, Some(p)) => Memory::Percent(p as u32),
            (None, None) => Memory::Percent(self.defaults.gpumem_percentage),
        };
        Ok(Some(VgpuRequest {
            gpus: gpus as u32,
            memory,
            cores: cores.map_or(self.defaults.gpucores, |c| c as u32),
        }))
    }

    /// Reads every container; the first invalid one fails the whole pod.
    pub fn parse_pod<'a>(
        &self,
        containers: impl IntoIterator<Item = &'a ContainerResources>,
    ) -> Result<Vec<(&'a ContainerResources, VgpuRequest)>, RequestError> {
        let mut out = Vec::new();
        for c in containers {
            if let Some(r) = self.parse_container(c)? {
                out.push((c, r));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ContainerKind::*;

    const GPU: &str = "nvidia.com/gpu";
    const MEM: &str = "nvidia.com/gpumem";
    const PCT: &str = "nvidia.com/gpumem-percentage";
    const CORES: &str = "nvidia.com/gpucores";

    fn parse(c: ContainerResources) -> Result<Option<VgpuRequest>, RequestError> {
        RequestPolicy::default().parse_container(&c)
    }

    fn req(gpus: u32, memory: Memory, cores: u32) -> Option<VgpuRequest> {
        Some(VgpuRequest {
            gpus,
            memory,
            cores,
        })
    }

    #[test]
    fn reads_limits_and_applies_defaults() {
        let c = ContainerResources::new("a", App)
            .limit(GPU, "2")
            .limit(MEM, "4096")
            .limit(CORES, "30");
        assert_eq!(parse(c), Ok(req(2, Memory::Mib(4096), 30)));
        // Only gpumem: one GPU, unlimited cores.
        assert_eq!(
            parse(ContainerResources::new("a", App).limit(MEM, "4k")),
            Ok(req(1, Memory::Mib(4000), 0))
        );
        // Only gpu: whole card.
        assert_eq!(
            parse(ContainerResources::new("a", App).limit(GPU, "1")),
            Ok(req(1, Memory::Percent(100), 0))
        );
        // Only cores.
        assert_eq!(
            parse(ContainerResources::new("a", App).limit(CORES, "25")),
            Ok(req(1, Memory::Percent(100), 25))
        );
        assert_eq!(
            parse(ContainerResources::new("a", Init).limit(PCT, "50")),
            Ok(req(1, Memory::Percent(50), 0))
        );
    }

    #[test]
    fn falls_back_to_requests_and_checks_equality() {
        let c = ContainerResources::new("a", App)
            .request(GPU, "1")
            .request(MEM, "1Ki");
        assert_eq!(parse(c), Ok(req(1, Memory::Mib(1024), 0)));
        // "1k" and "1000" are the same quantity.
        let same = ContainerResources::new("a", App)
            .limit(MEM, "1k")
            .request(MEM, "1000");
        assert_eq!(parse(same), Ok(req(1, Memory::Mib(1000), 0)));
        let differ = ContainerResources::new("a", App)
            .limit(MEM, "2048")
            .request(MEM, "1024");
        let e = parse(differ).unwrap_err();
        assert_eq!(
            e.to_string(),
            "container \"a\": nvidia.com/gpumem: request 1024 differs from limit 2048 (extended resources need requests == limits)"
        );
    }

    #[test]
    fn no_vgpu_is_none() {
        assert_eq!(
            parse(ContainerResources::new("a", App).limit("cpu", "500m")),
            Ok(None)
        );
        assert_eq!(
            parse(ContainerResources::new("a", App).limit(GPU, "0")),
            Ok(None)
        );
        assert_eq!(parse(ContainerResources::new("dbg", Ephemeral)), Ok(None));
    }

    #[test]
    fn every_error_names_container_and_resource() {
        let cases = [
            (ContainerResources::new("t", App).limit(CORES, "150"), "container \"t\": nvidia.com/gpucores: 150 is out of range 0-100"),
            (ContainerResources::new("t", App).limit(MEM, "abc"), "container \"t\": nvidia.com/gpumem: \"abc\" is not a Kubernetes quantity"),
            (ContainerResources::new("t", App).limit(GPU, "500m"), "container \"t\": nvidia.com/gpu: \"500m\" is not a whole number"),
            (ContainerResources::new("t", App).limit(GPU, "0").limit(MEM, "1024"), "container \"t\": nvidia.com/gpu: 0 GPUs cannot carry nvidia.com/gpumem"),
            (ContainerResources::new("t", App).limit(MEM, "1024").limit(PCT, "50"), "container \"t\": nvidia.com/gpumem and nvidia.com/gpumem-percentage are mutually exclusive; give one"),
            (ContainerResources::new("t", App).limit(PCT, "0"), "container \"t\": nvidia.com/gpumem-percentage: 0 is out of range 1-100"),
            (ContainerResources::new("t", App).limit(MEM, "0"), "container \"t\": nvidia.com/gpumem: 0 is out of range 1-18446744073709551615"),
            (ContainerResources::new("t", App).limit(GPU, "-1"), "container \"t\": nvidia.com/gpu: \"-1\" is negative"),
            (ContainerResources::new("dbg", Ephemeral).limit(GPU, "1"), "container \"dbg\": nvidia.com/gpu: ephemeral containers cannot request vGPU resources"),
        ];
        for (c, want) in cases {
            assert_eq!(parse(c).unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn configured_names_and_defaults() {
        let mut policy = RequestPolicy::default();
        policy.names.gpu = "example.com/vgpu".into();
        policy.defaults = Defaults {
            gpu: 2,
            gpumem_percentage: 50,
            gpucores: 10,
        };
        let c = ContainerResources::new("a", App).limit("example.com/vgpu", "1");
        assert_eq!(
            policy.parse_container(&c),
            Ok(req(1, Memory::Percent(50), 10))
        );
        let c = ContainerResources::new("a", App).limit(CORES, "20");
        assert_eq!(
            policy.parse_container(&c),
            Ok(req(2, Memory::Percent(50), 20))
        );
        // The default name is no longer special.
        let c = ContainerResources::new("a", App).limit(GPU, "1");
        assert_eq!(policy.parse_container(&c), Ok(None));
    }

    #[test]
    fn parse_pod_keeps_only_vgpu_containers_and_totals() {
        let cs = [
            ContainerResources::new("init", Init).limit(GPU, "1"),
            ContainerResources::new("side", App),
            ContainerResources::new("main", App)
                .limit(GPU, "2")
                .limit(MEM, "3000"),
        ];
        let got = RequestPolicy::default().parse_pod(&cs).unwrap();
        let names: Vec<_> = got.iter().map(|(c, _)| c.name.as_str()).collect();
        assert_eq!(names, ["init", "main"]);
        assert_eq!(got[1].1.total_mib(0), 6000);
        assert_eq!(got[0].1.total_mib(81920), 81920);
        let half = VgpuRequest {
            gpus: 2,
            memory: Memory::Percent(50),
            cores: 0,
        };
        assert_eq!(half.total_mib(24576), 24576);
        assert_eq!(half.mib_per_gpu(24577), 12288);
    }
}
