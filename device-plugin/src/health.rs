//! The health loop: what turns a device Unhealthy, and what turns it Healthy again.
//!
//! Unhealthy, at once: a critical XID from the backend's event thread, a failure event (a DCU's
//! uncorrectable RAS errors rising, a card leaving sysfs), or a probe that finds the device gone
//! (`NVML_ERROR_GPU_IS_LOST`, a reset required, no device with that UUID). After
//! [`crate::devices::TRANSIENT_FAILURES`] failed probes in a row of another kind (a timeout, an
//! unknown error). When the event source itself fails, every device is probed: those that fail turn
//! Unhealthy; if all of them answer, all turn Unhealthy anyway, as the NVIDIA device plugin does,
//! since XIDs may have been missed.
//!
//! Healthy again: NVML has no "recovered" event, so recovery needs two things: a quiet time
//! (`--xid-recovery-seconds` without a critical XID, a failure event or a failed probe) and then a
//! probe the device answers. Unhealthy devices whose quiet time has passed are probed every
//! [`TICK`]; every device is probed every `probe_every`, which is how a GPU that fell off the bus
//! without an XID is noticed, and how failures during the quiet time restart it.
//!
//! The NVIDIA device plugin, by contrast, never turns a device Healthy again (a restart of the
//! plugin does), and does not probe. We recover because a split GPU carries many small tenants,
//! and one transient XID taking a node's GPU out until someone restarts a DaemonSet pod costs more
//! here; the quiet time and the probe keep a device that keeps failing out.

use crate::backend::{DeviceBackend, Gpu, HealthEvent, ProbeError};
use crate::plugin::Shared;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often recovery candidates are probed.
pub const TICK: Duration = Duration::from_millis(250);

/// Health loop settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    /// Quiet time before an Unhealthy device may recover.
    pub quiet: Duration,
    /// How often every device is probed.
    pub probe_every: Duration,
}

/// Probes `gpus` on a blocking thread (NVML calls block, a lost GPU's for long).
async fn probe_all(
    backend: &Arc<dyn DeviceBackend>,
    gpus: Vec<Gpu>,
) -> Vec<(String, Result<(), ProbeError>)> {
    let b = backend.clone();
    tokio::task::spawn_blocking(move || {
        gpus.iter()
            .map(|g| (g.uuid.clone(), b.probe(g)))
            .collect::<Vec<_>>()
    })
    .await
    .unwrap_or_default()
}

/// Applies probe results; returns how many failed.
fn apply(shared: &Shared, results: &[(String, Result<(), ProbeError>)], quiet: Duration) -> usize {
    let now = Instant::now();
    let mut failed = 0;
    for (uuid, r) in results {
        match r {
            Ok(()) => {
                if shared.update_devices(|d| d.on_probe_ok(uuid, now, quiet)) {
                    tracing::info!(%uuid, "device answers after a quiet time: healthy again");
                }
            }
            Err(e) => {
                failed += 1;
                if shared.update_devices(|d| d.on_probe_failed(uuid, e.lost, now)) {
                    tracing::warn!(%uuid, error = %e, lost = e.lost, "probe failed: device unhealthy");
                } else {
                    tracing::debug!(%uuid, error = %e, "probe failed");
                }
            }
        }
    }
    failed
}

/// Runs until the task is dropped.
pub async fn run(shared: Arc<Shared>, backend: Arc<dyn DeviceBackend>, settings: HealthSettings) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let watcher = backend.clone();
    std::thread::Builder::new()
        .name("health".into())
        .spawn(move || watcher.watch_health(tx))
        .ok();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_full = Instant::now() + settings.probe_every;
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
                Some(HealthEvent::Failed { uuid, reason }) => {
                    if shared.update_devices(|d| d.on_failure(&uuid, Instant::now())) {
                        tracing::warn!(%uuid, %reason, "device failure: unhealthy");
                    }
                }
                Some(HealthEvent::EventsLost { reason }) => {
                    let gpus = shared.devices().gpus;
                    let results = probe_all(&backend, gpus).await;
                    if apply(&shared, &results, settings.quiet) == 0 {
                        tracing::error!(%reason, "health events lost and every device answers: all unhealthy until quiet");
                        shared.update_devices(|d| d.all_lost(Instant::now()));
                    } else {
                        tracing::error!(%reason, "health events lost: devices that failed their probe are unhealthy");
                    }
                }
                None => events_open = false,
            },
            _ = tick.tick() => {
                let now = Instant::now();
                let gpus = if now >= next_full {
                    next_full = now + settings.probe_every;
                    shared.devices().gpus
                } else {
                    shared.with_devices(|d| d.recovery_candidates(now, settings.quiet))
                };
                if gpus.is_empty() {
                    continue;
                }
                let results = probe_all(&backend, gpus).await;
                apply(&shared, &results, settings.quiet);
            }
        }
    }
}
