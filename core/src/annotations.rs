//! Names of the labels and annotations vgpu writes, and the injected-marker codec.
//!
//! Every part that needs to find vGPU pods watches them with the label selector
//! [`MANAGED_SELECTOR`] instead of every pod in the cluster. The webhook stamps the label together with
//! [`INJECTED`], which records what it injected so that a reinvocation, or a second webhook replica, can
//! see the pod is already done.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

use crate::request::{Memory, VgpuRequest};

/// Label on every pod the webhook mutated.
pub const MANAGED_LABEL: &str = "vgpu.io/managed";
/// Value of [`MANAGED_LABEL`].
pub const MANAGED_VALUE: &str = "true";
/// Label selector that matches exactly the vGPU pods.
pub const MANAGED_SELECTOR: &str = "vgpu.io/managed=true";
/// Annotation recording what the mutating webhook injected (JSON, [`InjectedMarker`]).
pub const INJECTED: &str = "vgpu.io/injected";
/// Annotation with the scheduler's per-container GPU assignment (JSON, [`crate::assignment`]).
pub const ASSIGNMENT: &str = "vgpu.io/assignment";
/// Pod annotation the device plugin writes: the vGPU containers it has answered Allocate for, as a
/// comma-separated list of names, so a restarted plugin does not answer one twice.
pub const ALLOCATED: &str = "vgpu.io/allocated";
/// Node annotation with the device plugin's GPU inventory (JSON, [`crate::inventory`]).
pub const NODE_DEVICES: &str = "vgpu.io/node-devices";
/// Node annotation with the device plugin's last heartbeat (RFC 3339).
pub const NODE_HEARTBEAT: &str = "vgpu.io/node-heartbeat";
/// Node annotation naming GPUs that take no new pods (HAMi's `hami.io/device-cordon`, v2.10
/// `pkg/device/nvidia/device.go` `DeviceCordonAnnotation`: a comma list of GPU UUIDs; pods
/// already on them keep running).
pub const DEVICE_CORDON: &str = "hami.io/device-cordon";
/// Node annotation vgpu-scheduler writes (RFC 3339) when a change that may make room there reached
/// it just after it turned a pod away: a Node event that makes kube-scheduler retry that pod.
pub const ROOM_CHANGED: &str = "vgpu.io/room-changed";
/// On a ReplicaSet, StatefulSet, DaemonSet or Job whose pod the webhook refused for quota: when it
/// last asked the controller to try again because room may have appeared (RFC 3339).
pub const QUOTA_RETRY: &str = "vgpu.io/quota-retry";
/// Annotations only vgpu may set; a pod that sets them at CREATE is refused by the validating webhook.
pub const RESERVED_POD_ANNOTATIONS: &[&str] = &[ASSIGNMENT, ALLOCATED];

/// GPU types a pod may use (HAMi-compatible; comma list, case-insensitive).
pub const USE_GPU_TYPE: &str = "nvidia.com/use-gputype";
/// GPU types a pod must not use.
pub const NOUSE_GPU_TYPE: &str = "nvidia.com/nouse-gputype";
/// GPU UUIDs a pod may use.
pub const USE_GPU_UUID: &str = "nvidia.com/use-gpuuuid";
/// GPU UUIDs a pod must not use.
pub const NOUSE_GPU_UUID: &str = "nvidia.com/nouse-gpuuuid";
/// Node policy (binpack, spread, ...), HAMi-compatible.
pub const NODE_POLICY: &str = "hami.io/node-scheduler-policy";
/// GPU policy (binpack, spread, ...), HAMi-compatible.
pub const GPU_POLICY: &str = "hami.io/gpu-scheduler-policy";

/// Current version of [`InjectedMarker`].
pub const INJECTED_VERSION: u32 = 1;

/// What the webhook injected into each vGPU container, keyed by container name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedMarker {
    /// Format version, [`INJECTED_VERSION`].
    #[serde(rename = "v")]
    pub version: u32,
    /// Per container: the request it was given.
    #[serde(rename = "c")]
    pub containers: BTreeMap<String, InjectedContainer>,
}

/// One container's injected request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InjectedContainer {
    /// vGPUs.
    pub gpus: u32,
    /// MiB per vGPU; absent for percentage requests.
    #[serde(rename = "memMiB", skip_serializing_if = "Option::is_none", default)]
    pub mem_mib: Option<u64>,
    /// Percentage of the card per vGPU; absent for MiB requests.
    #[serde(rename = "memPct", skip_serializing_if = "Option::is_none", default)]
    pub mem_pct: Option<u32>,
    /// SM percentage.
    pub cores: u32,
}

impl From<VgpuRequest> for InjectedContainer {
    fn from(r: VgpuRequest) -> Self {
        let (mem_mib, mem_pct) = match r.memory {
            Memory::Mib(m) => (Some(m), None),
            Memory::Percent(p) => (None, Some(p)),
        };
        Self {
            gpus: r.gpus,
            mem_mib,
            mem_pct,
            cores: r.cores,
        }
    }
}

/// A version-tagged annotation that cannot be read.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CodecError {
    /// Not JSON of the expected shape.
    #[error("annotation {annotation} is not valid: {source}")]
    Json {
        /// The annotation key.
        annotation: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// Written by a newer vgpu than this one.
    #[error("annotation {annotation} has version {found}; this build reads up to {supported}")]
    UnsupportedVersion {
        /// The annotation key.
        annotation: &'static str,
        /// The version found.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
}

/// Reads a JSON annotation carrying a version field named `field`, refusing newer versions.
pub(crate) fn decode_versioned<T: serde::de::DeserializeOwned>(
    annotation: &'static str,
    field: &str,
    supported: u32,
    s: &str,
) -> Result<T, CodecError> {
    #[derive(Deserialize)]
    struct Probe(serde_json::Map<String, serde_json::Value>);
    let json = |source| CodecError::Json { annotation, source };
    let probe: Probe = serde_json::from_str(s).map_err(json)?;
    let found = probe
        .0
        .get(field)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0);
    if found > u64::from(supported) {
        return Err(CodecError::UnsupportedVersion {
            annotation,
            found: u32::try_from(found).unwrap_or(u32::MAX),
            supported,
        });
    }
    serde_json::from_value(serde_json::Value::Object(probe.0)).map_err(json)
}

impl InjectedMarker {
    /// A marker for these containers.
    pub fn new(containers: impl IntoIterator<Item = (String, VgpuRequest)>) -> Self {
        Self {
            version: INJECTED_VERSION,
            containers: containers.into_iter().map(|(n, r)| (n, r.into())).collect(),
        }
    }

    /// The annotation value: compact JSON with sorted keys, so equal markers are equal strings.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value.
    pub fn decode(s: &str) -> Result<Self, CodecError> {
        decode_versioned(INJECTED, "v", INJECTED_VERSION, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A marker exactly as version 1 writes it; later versions must keep reading it.
    const V1: &str = r#"{"v":1,"c":{"main":{"gpus":2,"memMiB":4096,"cores":30},"prep":{"gpus":1,"memPct":100,"cores":0}}}"#;

    #[test]
    fn marker_round_trips_and_v1_parses() {
        let m = InjectedMarker::new([
            (
                "main".to_string(),
                VgpuRequest {
                    gpus: 2,
                    memory: Memory::Mib(4096),
                    cores: 30,
                },
            ),
            (
                "prep".to_string(),
                VgpuRequest {
                    gpus: 1,
                    memory: Memory::Percent(100),
                    cores: 0,
                },
            ),
        ]);
        assert_eq!(m.encode(), V1);
        assert_eq!(InjectedMarker::decode(V1).unwrap(), m);
    }

    #[test]
    fn marker_refuses_newer_and_garbage() {
        let e = InjectedMarker::decode(r#"{"v":2,"c":{}}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "annotation vgpu.io/injected has version 2; this build reads up to 1"
        );
        assert!(InjectedMarker::decode("{").is_err());
        assert!(InjectedMarker::decode(r#"{"v":1}"#).is_err());
    }
}
