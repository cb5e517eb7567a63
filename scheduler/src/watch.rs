//! Watches that feed the cache: node metadata (the inventory, heartbeat and GPU cordon
//! annotations live there, so the lighter metadata watch suffices) and the vGPU pods, selected by the label the
//! mutating webhook stamps on them.
//!
//! kube-runtime's watcher lists, then watches from the list's resourceVersion, re-lists on 410
//! Gone, and backs off on errors. A re-list arrives as `Init`, `InitApply`..., `InitDone`; objects
//! not in it are dropped from the cache at `InitDone` (the way a reflector's store is replaced).
//! A watch that fails after its LIST was complete is started over from a fresh LIST, and the cache
//! counts as unsynced until that completes (readiness.rs says why).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_core::annotations::{DEVICE_CORDON, MANAGED_SELECTOR, NODE_DEVICES, NODE_HEARTBEAT};

use crate::pod;
use crate::readiness::Feed;
use crate::server::AppState;

/// Pause before a watch that failed after its LIST was complete starts over with a LIST; it
/// doubles on each restart up to [`RESTART_MAX`], and is back to this after a run that stayed
/// healthy for [`RESTART_RESET`]. (Failures of the LIST itself are retried by kube-runtime's own
/// backoff, 0.8 s doubling to 30 s.) The same schedule as the webhook's caches.
const RESTART_MIN: Duration = Duration::from_millis(250);
const RESTART_MAX: Duration = Duration::from_secs(30);
const RESTART_RESET: Duration = Duration::from_secs(60);

/// Runs `run` (one watcher from a fresh LIST until it fails) again and again, with backoff.
async fn restarting<F, Fut>(mut run: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut pause = RESTART_MIN;
    loop {
        let started = Instant::now();
        run().await;
        pause = if started.elapsed() > RESTART_RESET {
            RESTART_MIN
        } else {
            (pause * 2).min(RESTART_MAX)
        };
        // Not a test sleep: the backoff between two full LISTs of a failing watch.
        tokio::time::sleep(pause).await;
    }
}

/// Records a watcher error; whether the watcher must start over (it failed after its LIST was
/// complete, so events may have been missed).
fn failed(s: &AppState, feed: Feed, e: &watcher::Error, complete: bool) -> bool {
    s.readiness.failed(feed, e.to_string(), complete);
    if complete {
        tracing::warn!(watch = feed.name(), error = %e, "watch failed; cache marked unsynced, re-listing");
    } else {
        tracing::warn!(watch = feed.name(), error = %e, "listing failed; retrying");
    }
    complete
}

fn write(s: &AppState) -> std::sync::RwLockWriteGuard<'_, crate::cache::Cluster> {
    s.cluster.write().unwrap_or_else(|e| e.into_inner())
}

fn apply_node(s: &AppState, meta: &kube::api::ObjectMeta) -> Option<String> {
    let name = meta.name.clone()?;
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
    write(s).apply_node(
        &name,
        get(NODE_DEVICES),
        get(NODE_HEARTBEAT),
        get(DEVICE_CORDON),
    );
    Some(name)
}

/// Runs the node watch forever.
pub async fn nodes(client: kube::Client, state: Arc<AppState>) {
    let api: Api<PartialObjectMeta<Node>> = Api::all(client);
    restarting(|| watch_nodes(&api, &state)).await
}

/// One node watcher from a fresh LIST until it fails after the LIST was complete.
async fn watch_nodes(api: &Api<PartialObjectMeta<Node>>, state: &AppState) {
    let stream = watcher::watcher(api.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    let mut complete = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(n)) => {
                seen.extend(apply_node(state, &n.metadata));
            }
            Ok(Event::InitDone) => {
                write(state).retain_nodes(&seen);
                state.readiness.listed(Feed::Nodes);
                complete = true;
                tracing::info!(nodes = seen.len(), "node list synced");
            }
            Ok(Event::Apply(n)) => {
                apply_node(state, &n.metadata);
            }
            Ok(Event::Delete(n)) => {
                if let Some(name) = &n.metadata.name {
                    write(state).delete_node(name);
                }
            }
            Err(e) => {
                if failed(state, Feed::Nodes, &e, complete) {
                    return;
                }
            }
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

/// Runs the vGPU pod watch forever.
pub async fn pods(client: kube::Client, state: Arc<AppState>) {
    let api: Api<Pod> = Api::all(client);
    restarting(|| watch_pods(&api, &state)).await
}

/// One vGPU pod watcher from a fresh LIST until it fails after the LIST was complete.
async fn watch_pods(api: &Api<Pod>, state: &AppState) {
    let cfg = watcher::Config::default().labels(MANAGED_SELECTOR);
    let stream = watcher::watcher(api.clone(), cfg).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    let mut complete = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(p)) => {
                seen.extend(apply_pod(state, &p));
            }
            Ok(Event::InitDone) => {
                write(state).retain_pods(&seen);
                state.readiness.listed(Feed::Pods);
                complete = true;
                tracing::info!(pods = seen.len(), "vGPU pod list synced");
            }
            Ok(Event::Apply(p)) => {
                apply_pod(state, &p);
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = &p.metadata.uid {
                    write(state).delete_pod(uid);
                }
            }
            Err(e) => {
                if failed(state, Feed::Pods, &e, complete) {
                    return;
                }
            }
        }
    }
}
