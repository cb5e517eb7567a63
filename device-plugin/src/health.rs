//! The health loop: XID events from the backend's thread turn devices Unhealthy at once; a device
//! whose last critical XID is older than the recovery window, and which the backend still lists,
//! turns Healthy again.

use crate::backend::{DeviceBackend, HealthEvent};
use crate::plugin::Shared;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often recovery is checked.
const TICK: Duration = Duration::from_millis(250);

/// Runs until the backend's event thread ends and the task is dropped.
pub async fn run(shared: Arc<Shared>, backend: Arc<dyn DeviceBackend>, recovery: Duration) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = backend.clone();
    std::thread::Builder::new()
        .name("health".into())
        .spawn(move || watcher.watch_health(tx))
        .ok();
    let mut tick = tokio::time::interval(TICK);
    let mut events_open = true;
    loop {
        tokio::select! {
            ev = rx.recv(), if events_open => match ev {
                Some(HealthEvent::Xid { uuid, xid }) => {
                    if shared.update_devices(|d| d.on_xid(&uuid, xid, Instant::now())) {
                        tracing::warn!(%uuid, xid, "critical XID: device unhealthy");
                    } else {
                        tracing::info!(%uuid, xid, "XID ignored (application error or already unhealthy)");
                    }
                }
                Some(HealthEvent::AllLost { reason }) => {
                    tracing::error!(%reason, "health events lost: all devices unhealthy");
                    shared.update_devices(|d| d.all_lost(Instant::now()));
                    events_open = false;
                }
                None => events_open = false,
            },
            _ = tick.tick() => {
                if shared.devices().plugin_devices(1).iter().all(|d| d.health == crate::devices::HEALTHY) {
                    continue;
                }
                let listed = backend.devices().unwrap_or_default();
                let recovered = shared.update_devices(|d| {
                    d.recover(Instant::now(), recovery, |g| listed.iter().any(|l| l.uuid == g.uuid))
                });
                if recovered {
                    tracing::info!("device(s) healthy again");
                }
            }
        }
    }
}
