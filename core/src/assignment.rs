//! The assignment annotation (`vgpu.io/assignment`): which physical GPUs the scheduler gave each
//! container, and how much of each. The device plugin's Allocate reads it to build the container's
//! environment.
//!
//! Percentage requests are resolved to MiB by the scheduler against the chosen card, so the device
//! plugin and the hook only ever see absolute amounts.

use serde::{Deserialize, Serialize};

use crate::annotations::{decode_versioned, CodecError, ASSIGNMENT};

/// Current version of [`PodAssignment`].
pub const ASSIGNMENT_VERSION: u32 = 1;

/// Where a pod's vGPU containers were placed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodAssignment {
    /// Format version, [`ASSIGNMENT_VERSION`].
    pub version: u32,
    /// The node the pod was bound to.
    pub node: String,
    /// One entry per vGPU container, init containers first, in pod-spec order.
    pub containers: Vec<ContainerAssignment>,
}

/// The devices of one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAssignment {
    /// Container name.
    pub name: String,
    /// One slice per vGPU, each on a different physical GPU.
    pub devices: Vec<DeviceSlice>,
}

/// A share of one physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSlice {
    /// Vendor UUID of the GPU.
    pub uuid: String,
    /// Device memory in MiB.
    pub memory_mib: u64,
    /// SM percentage, 0 = unlimited.
    pub cores: u32,
    /// Whether the pod holds this GPU alone (`hami.io/gpu-scheduler-policy: mutex`): nothing
    /// else is placed on the GPU while the slice exists. Absent (false) in what 0.1 wrote.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
}

impl PodAssignment {
    /// An assignment of the current version.
    pub fn new(node: impl Into<String>, containers: Vec<ContainerAssignment>) -> Self {
        Self {
            version: ASSIGNMENT_VERSION,
            node: node.into(),
            containers,
        }
    }

    /// The devices of container `name`, if it was assigned any.
    pub fn container(&self, name: &str) -> Option<&ContainerAssignment> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The annotation value.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value.
    pub fn decode(s: &str) -> Result<Self, CodecError> {
        decode_versioned(ASSIGNMENT, "version", ASSIGNMENT_VERSION, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = r#"{"version":1,"node":"gpu-node-1","containers":[{"name":"main","devices":[{"uuid":"GPU-aaaa","memoryMib":4096,"cores":30},{"uuid":"GPU-bbbb","memoryMib":4096,"cores":30}]}]}"#;

    #[test]
    fn round_trip_and_v1() {
        let a = PodAssignment::decode(V1).unwrap();
        assert_eq!(a.container("main").map(|c| c.devices.len()), Some(2));
        assert!(a.container("other").is_none());
        assert_eq!(a.encode(), V1);
    }

    #[test]
    fn exclusive_slices_say_so_and_others_read_as_before() {
        let mut a = PodAssignment::decode(V1).unwrap();
        a.containers[0].devices[0].exclusive = true;
        let text = a.encode();
        assert!(text.contains(r#""cores":30,"exclusive":true}"#), "{text}");
        assert_eq!(PodAssignment::decode(&text).unwrap(), a);
    }

    #[test]
    fn refuses_newer_version_and_garbage() {
        assert!(matches!(
            PodAssignment::decode(r#"{"version":2,"node":"n","containers":[]}"#),
            Err(CodecError::UnsupportedVersion { found: 2, .. })
        ));
        assert!(PodAssignment::decode(r#"{"version":1}"#).is_err());
        assert!(PodAssignment::decode("[]").is_err());
    }

    proptest::proptest! {
        /// Whatever the scheduler writes, the device plugin reads back the same.
        #[test]
        fn any_assignment_round_trips(node in "\\PC{0,12}", containers in proptest::collection::vec(
            ("\\PC{0,8}", proptest::collection::vec(
                ("\\PC{0,12}", proptest::num::u64::ANY, proptest::num::u32::ANY, proptest::bool::ANY), 0..4)),
            0..4)) {
            let a = PodAssignment::new(node, containers.into_iter().map(|(name, devices)| {
                ContainerAssignment {
                    name,
                    devices: devices.into_iter().map(|(uuid, memory_mib, cores, exclusive)| DeviceSlice {
                        uuid, memory_mib, cores, exclusive,
                    }).collect(),
                }
            }).collect());
            proptest::prop_assert_eq!(PodAssignment::decode(&a.encode()).ok(), Some(a));
        }
    }
}
