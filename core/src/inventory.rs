//! The node inventory annotation (`vgpu.io/node-devices`): what the device plugin found on a node,
//! for the scheduler to place pods on.
//!
//! Memory and cores are already scaled (`--memory-scaling`, `--core-scaling`), so the scheduler
//! never needs to know the factors. The device plugin rewrites the annotation on start, on every health
//! change and with each heartbeat (`vgpu.io/node-heartbeat`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use crate::annotations::{decode_versioned, CodecError, NODE_DEVICES};

/// Current version of [`NodeInventory`].
pub const INVENTORY_VERSION: u32 = 1;

/// All vGPU-capable devices of one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    /// Format version, [`INVENTORY_VERSION`].
    pub version: u32,
    /// The devices, in index order.
    pub devices: Vec<DeviceInfo>,
}

/// One physical GPU as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceInfo {
    /// Vendor UUID (`GPU-…`).
    pub uuid: String,
    /// Index on the node, as the vendor library numbers it.
    pub index: u32,
    /// Model name as the vendor library reports it (`NVIDIA A100-SXM4-80GB`).
    pub model: String,
    /// Device memory in MiB, after memory scaling.
    pub memory_mib: u64,
    /// Compute capacity in percent of one card, after core scaling (100 unscaled).
    pub cores: u32,
    /// How many vGPUs may share this device (the device plugin's split count).
    pub split: u32,
    /// NUMA node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// Whether the device is fit to place work on.
    pub healthy: bool,
    /// Vendor type (`nvidia`, `dcu`); empty means nvidia for compatibility.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub vendor: String,
    /// Active NVLinks to the node's other GPUs: peer UUID -> links (NVML
    /// `nvmlDeviceGetNvLinkState` and `nvmlDeviceGetNvLinkRemotePciInfo_v2` over links
    /// 0..`NVML_NVLINK_MAX_LINKS`, the remote bus id matched to a GPU of the node). Empty (left
    /// out) for a GPU without NVLink, and in what 0.1 wrote.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub nvlinks: BTreeMap<String, u32>,
}

impl NodeInventory {
    /// An inventory of the current version.
    pub fn new(devices: Vec<DeviceInfo>) -> Self {
        Self {
            version: INVENTORY_VERSION,
            devices,
        }
    }

    /// The annotation value.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads an annotation value.
    pub fn decode(s: &str) -> Result<Self, CodecError> {
        decode_versioned(NODE_DEVICES, "version", INVENTORY_VERSION, s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Version 1 exactly as written; must keep parsing.
    const V1: &str = r#"{"version":1,"devices":[{"uuid":"GPU-aaaa","index":0,"model":"NVIDIA A100-SXM4-80GB","memoryMib":81920,"cores":100,"split":10,"numa":0,"healthy":true},{"uuid":"GPU-bbbb","index":1,"model":"NVIDIA A100-SXM4-80GB","memoryMib":81920,"cores":100,"split":10,"healthy":false}]}"#;

    #[test]
    fn round_trip_and_v1() {
        let inv = NodeInventory::decode(V1).unwrap();
        assert_eq!(inv.devices.len(), 2);
        assert_eq!(inv.devices[0].numa, Some(0));
        assert_eq!(inv.devices[1].numa, None);
        assert!(!inv.devices[1].healthy);
        assert_eq!(inv.encode(), V1);
        assert_eq!(NodeInventory::decode(&inv.encode()).unwrap(), inv);
    }

    #[test]
    fn refuses_newer_version() {
        let e = NodeInventory::decode(r#"{"version":9,"devices":[]}"#).unwrap_err();
        assert!(
            matches!(e, CodecError::UnsupportedVersion { found: 9, .. }),
            "{e}"
        );
    }

    proptest::proptest! {
        /// Whatever the device plugin writes, the scheduler reads back the same.
        #[test]
        fn any_inventory_round_trips(devices in proptest::collection::vec(
            ("\\PC{0,12}", proptest::num::u32::ANY, "\\PC{0,12}", proptest::num::u64::ANY,
             proptest::num::u32::ANY, proptest::num::u32::ANY,
             proptest::option::of(proptest::num::u32::ANY), proptest::bool::ANY, "\\PC{0,6}"),
            0..5)) {
            let inv = NodeInventory::new(devices.into_iter().map(
                |(uuid, index, model, memory_mib, cores, split, numa, healthy, vendor)| DeviceInfo {
                    uuid, index, model, memory_mib, cores, split, numa, healthy, vendor, nvlinks: Default::default(),
                }).collect());
            proptest::prop_assert_eq!(NodeInventory::decode(&inv.encode()).ok(), Some(inv));
        }

        /// Any text decodes or errors, never panics.
        #[test]
        fn any_text_decodes_or_errors(s in "\\PC{0,64}") {
            let _ = NodeInventory::decode(&s);
        }
    }
}
