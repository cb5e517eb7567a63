//! The node inventory (`vgpu.io/node-devices`) and heartbeat (`vgpu.io/node-heartbeat`)
//! annotations, patched on start, on every health change and every heartbeat interval.

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

/// Patches on start, on every change of the device list and every `interval`; runs forever.
pub async fn run(shared: Arc<Shared>, api: Api<Node>, interval: Duration) {
    let mut changes = shared.subscribe();
    let mut tick = tokio::time::interval(interval);
    tick.tick().await; // the first tick is immediate
    loop {
        let inv = shared.devices().inventory(shared.settings.shape);
        match patch(&api, &shared.settings.node_name, &inv).await {
            Ok(()) => tracing::debug!("node inventory patched"),
            Err(e) => {
                tracing::warn!(error = %e, "patching the node inventory failed; retrying at the next heartbeat")
            }
        }
        tokio::select! {
            _ = tick.tick() => {}
            r = changes.changed() => if r.is_err() { return },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
