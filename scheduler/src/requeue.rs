//! kube-scheduler asked again for the pods this extender turned away on a view older than its own.
//!
//! kube-scheduler records an extender's rejection as the pseudo-plugin `Extender`, which it retries
//! on every Node and Pod event (`pkg/scheduler/framework/runtime/framework.go`,
//! `defaultEnqueueExtension`). Both watch the same API server, but not in step: when kube-scheduler
//! gets the event that made room (a pod deleted, a cordon lifted) before this extender does, its
//! retry meets the older view here, is turned away again, and waits for the next Node or Pod event.
//! On the real cluster a pod waited 16.6 s after its GPU's cordon was lifted (the device plugin's
//! next heartbeat), where other runs took 0.6 s. So when a change that may make room on a node
//! reaches this extender shortly after it turned a pod away, it writes the time into the Node's
//! annotation [`ROOM_CHANGED`]: a Node event kube-scheduler sees after this extender's view holds
//! the change.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vgpu_core::annotations::ROOM_CHANGED;

/// How long after turning a pod away a change may have raced it: more than the two watches ever
/// lag each other.
pub const RACE_WINDOW: Duration = Duration::from_secs(10);
/// Nodes waiting for their annotation; beyond it changes are dropped (the next one asks again).
const QUEUE: usize = 1024;

/// When the extender last turned a pod away, and the writer of the asks.
pub struct Requeue {
    start: Instant,
    /// Milliseconds after `start` of the last pod turned away, plus one (0: none yet).
    turned_away: AtomicU64,
    writer: Option<mpsc::Sender<String>>,
}

impl Requeue {
    /// Notes rejections, asks nothing (no API: tests, benchmarks).
    pub fn disabled() -> Requeue {
        Requeue {
            start: Instant::now(),
            turned_away: AtomicU64::new(0),
            writer: None,
        }
    }

    /// Starts the writer on the runtime.
    pub fn start(client: kube::Client) -> Requeue {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write(Api::all(client), rx));
        Requeue {
            writer: Some(tx),
            ..Requeue::disabled()
        }
    }

    /// The filter found no node for a pod.
    pub fn turned_away(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.turned_away
            .store(ms.saturating_add(1), Ordering::Relaxed);
    }

    /// Whether a pod was turned away within [`RACE_WINDOW`] before now.
    pub fn raced(&self) -> bool {
        match self.turned_away.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
                now.saturating_sub(at - 1) <= RACE_WINDOW.as_millis() as u64
            }
        }
    }

    /// This extender's view now holds a change that may make room on `node`: asks kube-scheduler
    /// to retry when a pod was turned away shortly before.
    pub fn room_changed(&self, node: &str) {
        if let Some(w) = &self.writer {
            if self.raced() {
                let _ = w.try_send(node.to_string());
            }
        }
    }
}

/// Writes the annotation on each node asked for, every node once per batch of asks.
async fn write(nodes: Api<Node>, mut asks: mpsc::Receiver<String>) {
    while let Some(first) = asks.recv().await {
        let mut batch = BTreeSet::from([first]);
        while let Ok(more) = asks.try_recv() {
            batch.insert(more);
        }
        for node in batch {
            let now = vgpu_core::time::now_rfc3339_micros();
            let patch = serde_json::json!({"metadata": {"annotations": {ROOM_CHANGED: now}}});
            match nodes
                .patch(&node, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => {
                    tracing::debug!(%node, "asked kube-scheduler to retry the pods turned away")
                }
                Err(error) => {
                    tracing::warn!(%node, %error, "could not ask kube-scheduler to retry the pods turned away")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_change_soon_after_a_pod_was_turned_away_asks() {
        let r = Requeue::disabled();
        assert!(!r.raced(), "no pod turned away yet");
        r.turned_away();
        assert!(r.raced());
        let long_ago = Requeue {
            start: Instant::now() - RACE_WINDOW - Duration::from_secs(1),
            turned_away: AtomicU64::new(1),
            writer: None,
        };
        assert!(!long_ago.raced());
    }
}
