//! What a ResourceClaim's allocation gives this node: per request, the GPUs and each one's share.
//!
//! kube-scheduler writes the allocation into the claim's status (`resource.k8s.io/v1`
//! `DeviceRequestAllocationResult`): per device, the request that asked for it (`parent/sub`
//! for a `firstAvailable` alternative), the driver, the pool, the device, and, for a device that
//! allows multiple allocations, `consumedCapacity` (every capacity, "even if the consumed amount is
//! zero") and the `shareID` of this share. Results of other drivers, or of our driver on another
//! node's pool, are not ours to prepare.

use super::{CORES, DRIVER, MEMORY};
use k8s_openapi::api::resource::v1::ResourceClaim;
use thiserror::Error;
use vgpu_core::assignment::DeviceSlice;
use vgpu_core::inventory::DeviceInfo;

const MIB: u64 = 1 << 20;

/// Why a claim cannot be prepared on this node. Each says what to look at in the claim.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The claim has no `status.allocation` (not allocated yet, or deallocated meanwhile).
    #[error("status.allocation is empty: the claim is not allocated")]
    NotAllocated,
    /// A result names a device this node does not have.
    #[error("status.allocation.devices.results[{index}]: device {device:?} is not a GPU of this node's pool {pool:?}")]
    UnknownDevice {
        /// The result's index.
        index: usize,
        /// Its device name.
        device: String,
        /// This node's pool.
        pool: String,
    },
    /// A result without `consumedCapacity`: the device was not allocated as a share.
    #[error("status.allocation.devices.results[{index}].consumedCapacity is missing: device {device:?} was not allocated as a share (does kube-scheduler run with DRAConsumableCapacity?)")]
    NotAShare {
        /// The result's index.
        index: usize,
        /// Its device name.
        device: String,
    },
    /// A consumed amount that is not a whole number of its unit.
    #[error("status.allocation.devices.results[{index}].consumedCapacity.{capacity}: {message}")]
    BadAmount {
        /// The result's index.
        index: usize,
        /// `memory` or `cores`.
        capacity: &'static str,
        /// What is wrong.
        message: String,
    },
    /// One request got two shares of one GPU: the container would see the card twice.
    #[error("request {request:?} got two shares of device {device:?}: ask for one device with the sum instead")]
    SameDeviceTwice {
        /// The request.
        request: String,
        /// The device.
        device: String,
    },
}

/// One request's GPUs, in allocation order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestShare {
    /// The request's name as the allocation gives it (`parent/sub` for a subrequest).
    pub request: String,
    /// `(device name, the share)` per GPU.
    pub devices: Vec<(String, DeviceSlice)>,
}

impl RequestShare {
    /// The request's name as a file-name and CDI-name part (`/` of a subrequest becomes `.`).
    pub fn key(&self) -> String {
        self.request.replace('/', ".")
    }
}

fn amount(
    consumed: &std::collections::BTreeMap<
        String,
        k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    >,
    index: usize,
    capacity: &'static str,
) -> Result<u64, ClaimError> {
    let bad = |message: String| ClaimError::BadAmount {
        index,
        capacity,
        message,
    };
    match consumed.get(capacity) {
        // "All capacity entries are included": an absent one is a scheduler that does not
        // know it, read as nothing consumed.
        None => Ok(0),
        Some(q) => vgpu_core::quantity::parse_integer(&q.0).map_err(|e| bad(e.to_string())),
    }
}

/// This node's part of `claim`'s allocation: the results of driver `gpu.vgpu.io` in pool `pool`
/// (the node's name), grouped by request in allocation order; `devices` is the node's inventory,
/// whose device names are `slices::device_name(index)`.
pub fn shares(
    claim: &ResourceClaim,
    pool: &str,
    devices: &[DeviceInfo],
) -> Result<Vec<RequestShare>, ClaimError> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .ok_or(ClaimError::NotAllocated)?
        .devices
        .as_ref()
        .and_then(|d| d.results.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut out: Vec<RequestShare> = Vec::new();
    for (index, r) in results.iter().enumerate() {
        if r.driver != DRIVER || r.pool != pool {
            continue;
        }
        let info = devices
            .iter()
            .find(|d| super::slices::device_name(d.index) == r.device)
            .ok_or_else(|| ClaimError::UnknownDevice {
                index,
                device: r.device.clone(),
                pool: pool.to_string(),
            })?;
        let consumed = r
            .consumed_capacity
            .as_ref()
            .ok_or_else(|| ClaimError::NotAShare {
                index,
                device: r.device.clone(),
            })?;
        let bytes = amount(consumed, index, MEMORY)?;
        if bytes % MIB != 0 {
            return Err(ClaimError::BadAmount {
                index,
                capacity: MEMORY,
                message: format!("{bytes} bytes is not a whole number of MiB"),
            });
        }
        let cores =
            u32::try_from(amount(consumed, index, CORES)?).map_err(|_| ClaimError::BadAmount {
                index,
                capacity: CORES,
                message: "more than a card has".into(),
            })?;
        let slice = DeviceSlice {
            uuid: info.uuid.clone(),
            memory_mib: bytes / MIB,
            cores,
            exclusive: false,
        };
        match out.iter_mut().find(|s| s.request == r.request) {
            Some(s) if s.devices.iter().any(|(d, _)| *d == r.device) => {
                return Err(ClaimError::SameDeviceTwice {
                    request: r.request.clone(),
                    device: r.device.clone(),
                })
            }
            Some(s) => s.devices.push((r.device.clone(), slice)),
            None => out.push(RequestShare {
                request: r.request.clone(),
                devices: vec![(r.device.clone(), slice)],
            }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn inventory() -> Vec<DeviceInfo> {
        (0..2)
            .map(|i| DeviceInfo {
                uuid: format!("GPU-{i}"),
                index: i,
                model: "m".into(),
                memory_mib: 24576,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect()
    }

    /// A claim's status as kube-scheduler 1.36 wrote it on the real cluster (the tier's
    /// consumable-capacity experiment), plus a result of another driver.
    fn claim(results: serde_json::Value) -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "ns", "uid": "u1"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io"}}]}},
            "status": {"allocation": {"devices": {"results": results}}}
        }))
        .unwrap()
    }

    #[test]
    fn a_share_per_device_grouped_by_request() {
        let c = claim(json!([
            {"consumedCapacity": {"cores": "30", "memory": "4000Mi"}, "device": "gpu-1",
             "driver": "gpu.vgpu.io", "pool": "vm", "request": "gpu",
             "shareID": "08694b24-5a9b-4f62-9c0d-133cefcb1b26"},
            {"device": "nic-0", "driver": "net.example.com", "pool": "vm", "request": "nic"},
            {"consumedCapacity": {"cores": "0", "memory": "1Gi"}, "device": "gpu-0",
             "driver": "gpu.vgpu.io", "pool": "vm", "request": "gpu"},
            {"consumedCapacity": {"cores": "0", "memory": "1Gi"}, "device": "gpu-0",
             "driver": "gpu.vgpu.io", "pool": "other-node", "request": "gpu"}
        ]));
        let s = shares(&c, "vm", &inventory()).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].request, "gpu");
        let got: Vec<(&str, &str, u64, u32)> = s[0]
            .devices
            .iter()
            .map(|(n, d)| (n.as_str(), d.uuid.as_str(), d.memory_mib, d.cores))
            .collect();
        assert_eq!(
            got,
            vec![("gpu-1", "GPU-1", 4000, 30), ("gpu-0", "GPU-0", 1024, 0)]
        );
    }

    #[test]
    fn what_cannot_be_prepared_is_named() {
        let unallocated: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": "c"},
            "spec": {}
        }))
        .unwrap();
        assert_eq!(
            shares(&unallocated, "vm", &inventory()),
            Err(ClaimError::NotAllocated)
        );
        let r = |extra: serde_json::Value| {
            let mut v =
                json!({"device": "gpu-0", "driver": "gpu.vgpu.io", "pool": "vm", "request": "gpu"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            v
        };
        let e = shares(
            &claim(json!([r(
                json!({"device": "gpu-7", "consumedCapacity": {}})
            )])),
            "vm",
            &inventory(),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "status.allocation.devices.results[0]: device \"gpu-7\" is not a GPU of this node's pool \"vm\"");
        let e = shares(&claim(json!([r(json!({}))])), "vm", &inventory()).unwrap_err();
        assert!(matches!(e, ClaimError::NotAShare { index: 0, .. }), "{e}");
        let e = shares(
            &claim(json!([r(
                json!({"consumedCapacity": {"memory": "1000000"}})
            )])),
            "vm",
            &inventory(),
        )
        .unwrap_err();
        assert_eq!(e.to_string(), "status.allocation.devices.results[0].consumedCapacity.memory: 1000000 bytes is not a whole number of MiB");
        let share = r(json!({"consumedCapacity": {"memory": "1Gi"}}));
        let e = shares(&claim(json!([share.clone(), share])), "vm", &inventory()).unwrap_err();
        assert!(matches!(e, ClaimError::SameDeviceTwice { .. }), "{e}");
    }

    #[test]
    fn a_subrequest_key_is_a_file_name() {
        let s = RequestShare {
            request: "gpu/a100".into(),
            devices: vec![],
        };
        assert_eq!(s.key(), "gpu.a100");
    }
}
