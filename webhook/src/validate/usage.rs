//! What one pod holds, in the three units a quota can limit: vGPUs, MiB of device memory
//! (GPUs x MiB per GPU) and percent of cores (GPUs x cores), plus the facts quota scopes select on.
//!
//! A pod that the scheduler has placed carries its real per-GPU amounts in the assignment
//! annotation, which then wins. A pod not yet placed with a percentage request counts against the
//! largest card in the node inventory: it may land there, so that is the most it can hold.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::assignment::PodAssignment;
use vgpu_core::request::{Memory, RequestPolicy, VgpuRequest};

use crate::pod::{self, ShapeError};

/// One vGPU pod as cached: its identity and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedPod {
    /// metadata.name.
    pub name: String,
    /// metadata.uid.
    pub uid: String,
    /// What it holds.
    pub usage: PodUsage,
}

/// Cores of a slice with no core limit: it may use the whole card, so it counts as 100.
pub const UNLIMITED_CORES_COUNT_AS: u64 = 100;

/// The pod facts `ResourceQuota` scopes look at.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScopeFacts {
    /// `spec.activeDeadlineSeconds` is set (scope `Terminating`).
    pub terminating: bool,
    /// No container requests or limits cpu or memory (QoS class BestEffort).
    pub best_effort: bool,
    /// `spec.priorityClassName`, empty when unset.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub priority_class: String,
}

/// One container's share, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceCount {
    /// vGPUs.
    pub gpus: u64,
    /// MiB per vGPU.
    pub mib_per_gpu: u64,
    /// Cores per vGPU, as counted (unlimited counts as 100).
    pub cores_per_gpu: u64,
}

/// What a pod's vGPU containers hold.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodUsage {
    /// One entry per vGPU container.
    pub slices: Vec<SliceCount>,
    /// Scope facts.
    #[serde(flatten)]
    pub facts: ScopeFacts,
}

/// The three quota-limited amounts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Amounts {
    /// vGPUs.
    pub gpus: u64,
    /// MiB (GPUs x MiB).
    pub mib: u64,
    /// Cores (GPUs x percent).
    pub cores: u64,
}

impl std::ops::AddAssign for Amounts {
    fn add_assign(&mut self, o: Amounts) {
        self.gpus = self.gpus.saturating_add(o.gpus);
        self.mib = self.mib.saturating_add(o.mib);
        self.cores = self.cores.saturating_add(o.cores);
    }
}

impl PodUsage {
    /// Totals over the containers.
    pub fn amounts(&self) -> Amounts {
        let mut a = Amounts::default();
        for s in &self.slices {
            a += Amounts {
                gpus: s.gpus,
                mib: s.gpus.saturating_mul(s.mib_per_gpu),
                cores: s.gpus.saturating_mul(s.cores_per_gpu),
            };
        }
        a
    }

    /// Whether the pod holds any vGPU.
    pub fn is_vgpu(&self) -> bool {
        !self.slices.is_empty()
    }

    /// `2 GPUs x 4096 + 1 GPU x 2048`, for messages; `per` picks MiB or cores.
    pub fn breakdown(&self, per: impl Fn(&SliceCount) -> u64) -> String {
        let parts: Vec<String> = self
            .slices
            .iter()
            .map(|s| {
                let unit = if s.gpus == 1 { "GPU" } else { "GPUs" };
                format!("{} {unit} x {}", s.gpus, per(s))
            })
            .collect();
        parts.join(" + ")
    }
}

/// Reads a pod's usage. `largest_card_mib` resolves percentage requests of pods not yet placed
/// (0 when no inventory is known: the percentage then counts as 0 MiB, and the log says so).
pub fn pod_usage(
    pod: &Value,
    policy: &RequestPolicy,
    largest_card_mib: u64,
) -> Result<PodUsage, UsageError> {
    let containers = pod::containers(pod)?;
    let mut requests: Vec<(String, VgpuRequest)> = Vec::new();
    for c in &containers {
        if let Some(r) = policy
            .parse_container(&c.resources)
            .map_err(|e| UsageError::Request(e.to_string()))?
        {
            requests.push((c.resources.name.clone(), r));
        }
    }
    let assignment = pod
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(ASSIGNMENT))
        .and_then(Value::as_str)
        .and_then(|s| PodAssignment::decode(s).ok());
    let slices = requests
        .iter()
        .map(|(name, r)| {
            let cores = |c: u32| {
                if c == 0 {
                    UNLIMITED_CORES_COUNT_AS
                } else {
                    u64::from(c)
                }
            };
            if let Some(ca) = assignment.as_ref().and_then(|a| a.container(name)) {
                if let Some(d) = ca.devices.first() {
                    // Placed: the real amounts (the scheduler gives every vGPU of a container the same).
                    return SliceCount {
                        gpus: ca.devices.len() as u64,
                        mib_per_gpu: ca
                            .devices
                            .iter()
                            .map(|d| d.memory_mib)
                            .max()
                            .unwrap_or(d.memory_mib),
                        cores_per_gpu: ca.devices.iter().map(|d| cores(d.cores)).max().unwrap_or(0),
                    };
                }
            }
            SliceCount {
                gpus: u64::from(r.gpus),
                mib_per_gpu: match r.memory {
                    Memory::Mib(m) => m,
                    Memory::Percent(_) => r.mib_per_gpu(largest_card_mib),
                },
                cores_per_gpu: cores(r.cores),
            }
        })
        .collect();
    Ok(PodUsage {
        slices,
        facts: scope_facts(pod),
    })
}

/// What a ResourceClaim of class `gpu.vgpu.io` holds (DRA mode, docs/dra.md "Quota"): per
/// request, `count` GPUs x its `memory` and `cores` (no memory: the whole card, counted as the
/// largest card until allocated; no cores: 100), the largest of a request's `firstAvailable`
/// alternatives; once allocated, each share's `consumedCapacity`. `None` when it asks nothing of
/// the class. Scope facts are a pod's; a claim has none of them.
pub fn claim_usage(claim: &Value, largest_card_mib: u64) -> Option<PodUsage> {
    use vgpu_core::dra::{CLASS, CORES, MEMORY};
    let quantity = |q: &Value| {
        q.as_str()
            .and_then(|t| vgpu_core::quantity::parse_integer(t).ok())
    };
    let cores = |c: u64| if c == 0 { UNLIMITED_CORES_COUNT_AS } else { c };
    let results: Vec<&Value> = claim["status"]["allocation"]["devices"]["results"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["driver"] == CLASS)
        .collect();
    let slices: Vec<SliceCount> = if !results.is_empty() {
        results
            .iter()
            .map(|r| SliceCount {
                gpus: 1,
                mib_per_gpu: quantity(&r["consumedCapacity"][MEMORY])
                    .map_or(largest_card_mib, |b| b.div_ceil(1 << 20)),
                cores_per_gpu: cores(quantity(&r["consumedCapacity"][CORES]).unwrap_or(0)),
            })
            .collect()
    } else {
        let mut out = Vec::new();
        for r in claim["spec"]["devices"]["requests"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let alternatives: Vec<&Value> = if r["exactly"].is_object() {
                vec![&r["exactly"]]
            } else {
                r["firstAvailable"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .collect()
            };
            let largest = alternatives
                .into_iter()
                .filter(|a| a["deviceClassName"] == CLASS)
                .map(|a| {
                    // The same reading the claim's admission checked; a request it could not
                    // read (admitted before an upgrade) counts as a whole card.
                    let (memory, asked_cores) = vgpu_core::dra::asked("", a).unwrap_or_default();
                    SliceCount {
                        gpus: a["count"].as_u64().unwrap_or(1),
                        mib_per_gpu: memory.map_or(largest_card_mib, |b| b.div_ceil(1 << 20)),
                        cores_per_gpu: cores(asked_cores.unwrap_or(0)),
                    }
                })
                .max_by_key(|s| (s.gpus.saturating_mul(s.mib_per_gpu), s.gpus));
            out.extend(largest);
        }
        out
    };
    (!slices.is_empty()).then(|| PodUsage {
        slices,
        facts: ScopeFacts::default(),
    })
}

/// Whether a claim of class `gpu.vgpu.io` asks for every matching GPU (`allocationMode: All`),
/// which no quota can count before allocation.
pub fn asks_all_gpus(claim: &Value) -> bool {
    vgpu_core::dra::requests("ResourceClaim", claim)
        .iter()
        .any(|(_, r)| r["allocationMode"] == "All")
}

/// The pod's scope facts.
pub fn scope_facts(pod: &Value) -> ScopeFacts {
    let spec = pod.get("spec");
    let terminating = spec
        .and_then(|s| s.get("activeDeadlineSeconds"))
        .is_some_and(|v| !v.is_null());
    let priority_class = spec
        .and_then(|s| s.get("priorityClassName"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // QoS BestEffort: no cpu or memory in any container's requests or limits.
    let best_effort = !["containers", "initContainers"].iter().any(|field| {
        spec.and_then(|s| s.get(*field))
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    ["requests", "limits"].iter().any(|k| {
                        c.pointer(&format!("/resources/{k}"))
                            .and_then(Value::as_object)
                            .is_some_and(|m| m.contains_key("cpu") || m.contains_key("memory"))
                    })
                })
            })
    });
    ScopeFacts {
        terminating,
        best_effort,
        priority_class,
    }
}

/// Whether a pod no longer holds anything (phase Succeeded or Failed), as the quota controller
/// treats it.
pub fn is_terminal(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

/// A pod's usage cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    /// Not shaped like a pod.
    #[error("object is not a valid Pod: {0}")]
    Shape(#[from] ShapeError),
    /// An invalid vGPU request.
    #[error("{0}")]
    Request(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usage(pod: Value, largest: u64) -> PodUsage {
        pod_usage(&pod, &RequestPolicy::default(), largest).unwrap()
    }

    #[test]
    fn multiplies_gpus_by_memory_and_cores() {
        let u = usage(
            json!({"spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}}},
                {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}}},
                {"name": "cpu-only", "resources": {"limits": {"cpu": "1"}}}
            ]}}),
            0,
        );
        assert_eq!(
            u.amounts(),
            Amounts {
                gpus: 3,
                mib: 2 * 4096 + 2048,
                cores: 2 * 30 + 100
            }
        );
        assert_eq!(
            u.breakdown(|s| s.mib_per_gpu),
            "2 GPUs x 4096 + 1 GPU x 2048"
        );
        assert!(!u.facts.best_effort);
    }

    #[test]
    fn percentages_count_against_the_largest_card_until_placed() {
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"limits": {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}}}]}});
        assert_eq!(usage(pod.clone(), 81920).amounts().mib, 40960);
        let mut placed = pod;
        let a = PodAssignment::new(
            "n1",
            vec![vgpu_core::assignment::ContainerAssignment {
                name: "a".into(),
                devices: vec![vgpu_core::assignment::DeviceSlice {
                    uuid: "GPU-1".into(),
                    memory_mib: 7680,
                    cores: 20,
                    exclusive: false,
                }],
            }],
        );
        placed["metadata"] = json!({"annotations": {ASSIGNMENT: a.encode()}});
        let u = usage(placed, 81920);
        assert_eq!(
            u.amounts(),
            Amounts {
                gpus: 1,
                mib: 7680,
                cores: 20
            }
        );
    }

    #[test]
    fn scope_facts_follow_the_quota_controller() {
        let f = scope_facts(
            &json!({"spec": {"activeDeadlineSeconds": 60, "priorityClassName": "high",
            "containers": [{"name": "a"}]}}),
        );
        assert_eq!(
            f,
            ScopeFacts {
                terminating: true,
                best_effort: true,
                priority_class: "high".into()
            }
        );
        let f = scope_facts(
            &json!({"spec": {"initContainers": [{"name": "i", "resources": {"requests": {"memory": "1Gi"}}}],
            "containers": [{"name": "a"}]}}),
        );
        assert!(!f.best_effort && !f.terminating);
        assert!(is_terminal(&json!({"status": {"phase": "Succeeded"}})));
        assert!(is_terminal(&json!({"status": {"phase": "Failed"}})));
        assert!(!is_terminal(&json!({"status": {"phase": "Pending"}})));
    }

    #[test]
    fn a_claim_counts_its_shares_or_what_it_was_allocated() {
        let claim = json!({"spec": {"devices": {"requests": [
            {"name": "a", "exactly": {"deviceClassName": "gpu.vgpu.io", "count": 2,
                "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}},
            {"name": "b", "firstAvailable": [
                {"name": "big", "deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"memory": "40960Mi"}}},
                {"name": "small", "deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"memory": "12Gi"}}}]},
            {"name": "whole", "exactly": {"deviceClassName": "gpu.vgpu.io"}},
            {"name": "other", "exactly": {"deviceClassName": "other.example.com", "count": 5}}]}}});
        let u = claim_usage(&claim, 24576).unwrap();
        assert_eq!(
            u.amounts(),
            Amounts {
                gpus: 4,
                mib: 2 * 4096 + 40960 + 24576,
                cores: 2 * 30 + 100 + 100
            }
        );
        let mut allocated = claim.clone();
        allocated["status"] = json!({"allocation": {"devices": {"results": [
            {"driver": "gpu.vgpu.io", "pool": "n", "device": "gpu-0", "request": "whole",
             "consumedCapacity": {"memory": "16Gi", "cores": "0"}},
            {"driver": "other.example.com", "pool": "n", "device": "x", "request": "other"}]}}});
        assert_eq!(
            claim_usage(&allocated, 24576).unwrap().amounts(),
            Amounts {
                gpus: 1,
                mib: 16384,
                cores: 100
            }
        );
        let foreign = json!({"spec": {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "other"}}]}}});
        assert_eq!(claim_usage(&foreign, 0), None);
        assert!(!asks_all_gpus(&claim));
        let all = json!({"spec": {"devices": {"requests": [{"name": "x", "exactly": {"deviceClassName": "gpu.vgpu.io", "allocationMode": "All"}}]}}});
        assert!(asks_all_gpus(&all));
    }
}
