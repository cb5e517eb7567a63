//! The node inventory (`vgpu.io/node-devices`) and heartbeat (`vgpu.io/node-heartbeat`)
//! annotations, patched on start, on every health change and every heartbeat interval, and
//! retried soon (1 s, doubling up to the interval) after a failed patch.

use crate::plugin::Shared;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::Api;
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

/// Patches the node once.
pub async fn patch(api: &Api<Node>, node: &str, inv: &NodeInventory) -> Result<(), kube::Error> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    api.patch(
        node,
        &PatchParams::default(),
        &Patch::Merge(patch_body(inv, now)),
    )
    .await?;
    Ok(())
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
pub async fn run(shared: Arc<Shared>, api: Api<Node>, interval: Duration) {
    let mut changes = shared.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.tick().await; // the first tick is immediate
    let mut failures = 0u32;
    loop {
        let inv = shared.devices().inventory(shared.settings.shape);
        match patch(&api, &shared.settings.node_name, &inv).await {
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
