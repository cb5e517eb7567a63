//! The node inventory (`vgpu.io/node-devices`) and heartbeat (`vgpu.io/node-heartbeat`)
//! annotations, patched on start, on every health change and every heartbeat interval, and
//! retried soon (1 s, doubling up to the interval) after a failed patch; and the Node's capacity
//! of the resources only vgpu-scheduler places by ([`capacity`]), written when the Node lacks it.

use crate::plugin::Shared;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vgpu_core::annotations::{NODE_DEVICES, NODE_HEARTBEAT};
use vgpu_core::inventory::NodeInventory;
use vgpu_core::time::format_rfc3339;

/// The merge patch that writes both annotations.
pub fn patch_body(inv: &NodeInventory, unix_secs: u64) -> serde_json::Value {
    serde_json::json!({"metadata": {"annotations": {
        NODE_DEVICES: inv.encode(),
        NODE_HEARTBEAT: format_rfc3339(unix_secs),
    }}})
}

/// Patches the node once; the Node as the API server wrote it.
pub async fn patch(api: &Api<Node>, node: &str, inv: &NodeInventory) -> Result<Node, kube::Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(patch_body(inv, now)),
    )
    .await
}

/// The names of the resources a vGPU container asks for besides the device count, which only
/// vgpu-scheduler places by (the chart's `ignoredByScheduler` managed resources).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SliceResources {
    /// MiB of one GPU (`nvidia.com/gpumem`).
    pub memory: String,
    /// Percent of one GPU's memory (`nvidia.com/gpumem-percentage`).
    pub memory_percentage: String,
    /// Percent of one GPU's cores (`nvidia.com/gpucores`).
    pub cores: String,
}

/// The Node capacity of each [`SliceResources`] name and of HAMi's `nvidia.com/priority`: at
/// least the sum of what the pods vgpu-scheduler can place on these GPUs ask (a container asks per
/// GPU, so its request is at most what it holds on one of them): the GPUs' memory, 100 % and their
/// cores each, and one priority per device the kubelet can hand out.
///
/// Why a Node advertises them: kube-scheduler requeues a pod that NodeResourcesFit found short of
/// `nvidia.com/gpu` on a Node's allocatable rising only when its queueing hint finds the whole pod
/// fits that Node (`noderesources/fit.go` `isSchedulableAfterNodeChange` -> `isFit` -> `Fits`,
/// which passes no ignored resources, so the extender's `ignoredByScheduler` names count there).
/// While no Node advertised `nvidia.com/gpumem`, a vGPU pod waiting for a device plugin to start
/// or a split count to rise waited for kube-scheduler's 5 min flush of unschedulable pods. The
/// kubelet keeps capacity it did not set and copies it to allocatable (`nodestatus/setters.go`
/// `MachineInfo`: "avoid blindly overwriting the capacity in case opaque resources are being
/// advertised"); its admission checks pods against them from then on (it dropped the names a
/// Node does not advertise, `lifecycle/predicate.go` `removeMissingExtendedResources`), which
/// these totals always pass.
pub fn capacity(inv: &NodeInventory, names: &SliceResources) -> BTreeMap<String, u64> {
    let d = &inv.devices;
    let gpus = d.len() as u64;
    BTreeMap::from([
        (names.memory.clone(), d.iter().map(|g| g.memory_mib).sum()),
        (names.memory_percentage.clone(), 100 * gpus),
        (
            names.cores.clone(),
            d.iter().map(|g| u64::from(g.cores)).sum(),
        ),
        (
            vgpu_core::env::TASK_PRIORITY_RESOURCE.to_string(),
            d.iter().map(|g| u64::from(g.split)).sum(),
        ),
    ])
}

/// The status patch that sets `want` (a `None` value removes the name).
pub fn capacity_patch(want: &BTreeMap<String, Option<u64>>) -> serde_json::Value {
    let capacity: serde_json::Map<String, serde_json::Value> = want
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.map(|v| v.to_string().into()).unwrap_or_default(),
            )
        })
        .collect();
    serde_json::json!({"status": {"capacity": capacity}})
}

/// Whether `node` already advertises `want`.
fn advertises(node: &Node, want: &BTreeMap<String, u64>) -> bool {
    let have = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    want.iter().all(|(k, v)| {
        have.and_then(|c| c.get(k))
            .is_some_and(|q| q.0 == v.to_string())
    })
}

/// Writes `want` into the Node's capacity (status subresource).
async fn advertise(
    api: &Api<Node>,
    node: &str,
    want: &BTreeMap<String, Option<u64>>,
) -> Result<(), kube::Error> {
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(capacity_patch(want)),
    )
    .await
    .map(drop)
}

/// Removes [`capacity`]'s names from the Node (the plugin leaves the node).
pub async fn withdraw(
    api: &Api<Node>,
    node: &str,
    names: &SliceResources,
) -> Result<(), kube::Error> {
    let gone = capacity(&NodeInventory::new(vec![]), names)
        .into_keys()
        .map(|k| (k, None))
        .collect();
    advertise(api, node, &gone).await
}

/// First pause before patching again after a failed patch; it doubles on each failure up to the
/// heartbeat interval, and a success resets it.
pub const RETRY_MIN: Duration = Duration::from_secs(1);

/// The pause after `failures` consecutive failed patches: 1 s, 2 s, 4 s ... capped at `interval`.
pub fn retry_after(failures: u32, interval: Duration) -> Duration {
    RETRY_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(interval)
}

/// Patches on start, on every change of the device list and every `interval`; runs forever. A
/// failed patch is retried after [`retry_after`] rather than at the next heartbeat: the
/// inventory (a health change above all) should reach the scheduler soon after the API is back,
/// and a heartbeat that lands late by a whole interval could make the scheduler think the node
/// lost its plugin.
pub async fn run(shared: Arc<Shared>, api: Api<Node>, interval: Duration, names: SliceResources) {
    let mut changes = shared.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.tick().await; // the first tick is immediate
    let mut failures = 0u32;
    loop {
        let inv = shared.devices().inventory(shared.settings.shape);
        let node = &shared.settings.node_name;
        let want = capacity(&inv, &names);
        let written = match patch(&api, node, &inv).await {
            Ok(n) if advertises(&n, &want) => Ok(()),
            Ok(_) => {
                let want = want.into_iter().map(|(k, v)| (k, Some(v))).collect();
                advertise(&api, node, &want).await
            }
            Err(e) => Err(e),
        };
        match written {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(failures, "node inventory patched after failures");
                }
                failures = 0;
                tracing::debug!("node inventory patched");
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(error = %e, retry_in = ?retry_after(failures, interval),
                    "patching the node inventory failed; retrying")
            }
        }
        let retry = async {
            match failures {
                0 => std::future::pending().await,
                n => tokio::time::sleep(retry_after(n, interval)).await,
            }
        };
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { return },
            _ = retry => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_one_second_up_to_the_heartbeat() {
        let hb = Duration::from_secs(30);
        let got: Vec<u64> = (1..=7).map(|n| retry_after(n, hb).as_secs()).collect();
        assert_eq!(got, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(retry_after(u32::MAX, hb), hb);
        assert_eq!(
            retry_after(3, Duration::from_secs(2)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn capacity_holds_every_placement_of_the_gpus() {
        let gpu = |memory_mib, cores| vgpu_core::inventory::DeviceInfo {
            uuid: "GPU-a".into(),
            index: 0,
            model: "NVIDIA A10".into(),
            memory_mib,
            cores,
            split: 10,
            numa: None,
            healthy: true,
            vendor: String::new(),
            nvlinks: Default::default(),
        };
        let names = SliceResources {
            memory: "nvidia.com/gpumem".into(),
            memory_percentage: "nvidia.com/gpumem-percentage".into(),
            cores: "nvidia.com/gpucores".into(),
        };
        let inv = NodeInventory::new(vec![gpu(24576, 100), gpu(49152, 200)]);
        let got = capacity(&inv, &names);
        let want: BTreeMap<String, u64> = [
            ("nvidia.com/gpumem", 73728),
            ("nvidia.com/gpumem-percentage", 200),
            ("nvidia.com/gpucores", 300),
            ("nvidia.com/priority", 20),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(got, want);
        let patch = capacity_patch(&got.iter().map(|(k, v)| (k.clone(), Some(*v))).collect());
        assert_eq!(patch["status"]["capacity"]["nvidia.com/gpumem"], "73728");
        let gone = capacity_patch(&got.into_keys().map(|k| (k, None)).collect());
        assert_eq!(
            gone["status"]["capacity"]["nvidia.com/gpucores"],
            serde_json::Value::Null
        );
        assert_eq!(
            gone["status"]["capacity"].as_object().map(|o| o.len()),
            Some(4)
        );
    }

    #[test]
    fn body_has_both_annotations() {
        let b = patch_body(&NodeInventory::new(vec![]), 0);
        assert_eq!(
            b["metadata"]["annotations"][NODE_HEARTBEAT],
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            b["metadata"]["annotations"][NODE_DEVICES],
            r#"{"version":1,"devices":[]}"#
        );
    }
}
