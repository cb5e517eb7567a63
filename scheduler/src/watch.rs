//! Watches that feed the cache: node metadata (the inventory and heartbeat annotations live
//! there, so the lighter metadata watch suffices) and the vGPU pods, selected by the label the
//! mutating webhook stamps on them.
//!
//! kube-runtime's watcher lists, then watches from the list's resourceVersion, re-lists on 410
//! Gone, and backs off on errors. A re-list arrives as `Init`, `InitApply`..., `InitDone`; objects
//! not in it are dropped from the cache at `InitDone` (the way a reflector's store is replaced).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vgpu_core::annotations::{MANAGED_SELECTOR, NODE_DEVICES, NODE_HEARTBEAT};

use crate::pod;
use crate::server::AppState;

fn write(s: &AppState) -> std::sync::RwLockWriteGuard<'_, crate::cache::Cluster> {
    s.cluster.write().unwrap_or_else(|e| e.into_inner())
}

fn apply_node(s: &AppState, meta: &kube::api::ObjectMeta) -> Option<String> {
    let name = meta.name.clone()?;
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
    write(s).apply_node(&name, get(NODE_DEVICES), get(NODE_HEARTBEAT));
    Some(name)
}

/// Runs the node watch until the stream ends (never, in practice).
pub async fn nodes(client: kube::Client, state: Arc<AppState>) {
    let api: Api<PartialObjectMeta<Node>> = Api::all(client);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(n)) => {
                seen.extend(apply_node(&state, &n.metadata));
            }
            Ok(Event::InitDone) => {
                write(&state).retain_nodes(&seen);
                state.nodes_synced.store(true, Ordering::Relaxed);
                tracing::info!(nodes = seen.len(), "node list synced");
            }
            Ok(Event::Apply(n)) => {
                apply_node(&state, &n.metadata);
            }
            Ok(Event::Delete(n)) => {
                if let Some(name) = &n.metadata.name {
                    write(&state).delete_node(name);
                }
            }
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
    }
}

fn apply_pod(s: &AppState, p: &Pod) -> Option<String> {
    let uid = p.metadata.uid.clone()?;
    let assignment = match pod::assignment(p) {
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
            tracing::warn!(pod = %pod::key(p), error = %e, "unreadable assignment; not counted");
            None
        }
        None => None,
    };
    let node = p.spec.as_ref().and_then(|s| s.node_name.as_deref());
    write(s).apply_pod(&uid, node, assignment, pod::is_terminal(p));
    Some(uid)
}

/// Runs the vGPU pod watch until the stream ends (never, in practice).
pub async fn pods(client: kube::Client, state: Arc<AppState>) {
    let api: Api<Pod> = Api::all(client);
    let cfg = watcher::Config::default().labels(MANAGED_SELECTOR);
    let stream = watcher::watcher(api, cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(p)) => {
                seen.extend(apply_pod(&state, &p));
            }
            Ok(Event::InitDone) => {
                write(&state).retain_pods(&seen);
                state.pods_synced.store(true, Ordering::Relaxed);
                tracing::info!(pods = seen.len(), "vGPU pod list synced");
            }
            Ok(Event::Apply(p)) => {
                apply_pod(&state, &p);
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = &p.metadata.uid {
                    write(&state).delete_pod(uid);
                }
            }
            Err(e) => tracing::warn!(error = %e, "pod watch failed; retrying"),
        }
    }
}
