//! Watches that feed the cache: nodes (the inventory, heartbeat and GPU cordon annotations, and
//! `status.allocatable`) and every pod (vGPU pods' assignments; every pod's CPU and memory
//! request on its node, for the `gap-aware` host terms, as kube-scheduler's own cache counts
//! them). Objects are read and dropped: the cache keeps only what decisions need.
//!
//! kube-runtime's watcher lists, then watches from the list's resourceVersion, re-lists on 410
//! Gone, and backs off on errors. A re-list arrives as `Init`, `InitApply`..., `InitDone`; objects
//! not in it are dropped from the cache at `InitDone` (the way a reflector's store is replaced).
//! A watch that fails after its LIST was complete is started over from a fresh LIST, and the cache
//! counts as unsynced until that completes (readiness.rs says why).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_core::annotations::{DEVICE_CORDON, NODE_DEVICES, NODE_HEARTBEAT};
use vgpu_core::placement::host::HostLeft;
use vgpu_core::placement::GpuFilter;
use vgpu_core::quantity::parse_ceil;

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

/// A Node's `status.allocatable` CPU (milli, rounded up as `MilliValue`) and memory (MiB, rounded
/// down), as `NodeInfo.SetNode` reads it; `None` without both.
pub fn allocatable(node: &Node) -> Option<HostLeft> {
    let a = node.status.as_ref()?.allocatable.as_ref()?;
    let cpu = parse_ceil(&a.get("cpu")?.0, 3).ok()?;
    let mem = parse_ceil(&a.get("memory")?.0, 0).ok()?;
    Some(HostLeft {
        cpu_milli: cpu,
        mem_mib: mem >> 20,
        model: 0,
    })
}

fn apply_node(s: &AppState, node: &Node) -> Option<String> {
    let meta = &node.metadata;
    let name = meta.name.clone()?;
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
    let mut cluster = write(s);
    cluster.apply_node(
        &name,
        get(NODE_DEVICES),
        get(NODE_HEARTBEAT),
        get(DEVICE_CORDON),
    );
    cluster.apply_allocatable(&name, allocatable(node));
    Some(name)
}

/// Runs the node watch forever.
pub async fn nodes(client: kube::Client, state: Arc<AppState>) {
    let api: Api<Node> = Api::all(client);
    restarting(|| watch_nodes(&api, &state)).await
}

/// One node watcher from a fresh LIST until it fails after the LIST was complete.
async fn watch_nodes(api: &Api<Node>, state: &AppState) {
    let stream = watcher::watcher(api.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    let mut complete = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => seen.clear(),
            Ok(Event::InitApply(n)) => {
                seen.extend(apply_node(state, &n));
            }
            Ok(Event::InitDone) => {
                write(state).retain_nodes(&seen);
                state.readiness.listed(Feed::Nodes);
                complete = true;
                tracing::info!(nodes = seen.len(), "node list synced");
            }
            Ok(Event::Apply(n)) => {
                apply_node(state, &n);
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
    let terminal = pod::is_terminal(p);
    let annotations = p.metadata.annotations.as_ref();
    let types = GpuFilter::from_annotations(|k| annotations?.get(k).map(String::as_str));
    let mut cluster = write(s);
    cluster.apply_pod_host(&uid, node, pod::host_request(p), terminal);
    cluster.apply_pod_types(&uid, &types);
    cluster.apply_pod(&uid, node, assignment, terminal);
    Some(uid)
}

/// Runs the pod watch forever.
pub async fn pods(client: kube::Client, state: Arc<AppState>) {
    let api: Api<Pod> = Api::all(client);
    restarting(|| watch_pods(&api, &state)).await
}

/// One pod watcher from a fresh LIST until it fails after the LIST was complete.
async fn watch_pods(api: &Api<Pod>, state: &AppState) {
    let stream = watcher::watcher(api.clone(), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut seen = HashSet::new();
    let mut listed_from = std::time::Instant::now();
    let mut complete = false;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => {
                seen.clear();
                // The LIST is sent after this event (kube-runtime's watcher yields `Init` from its
                // empty state, then lists in `InitPage`), so its snapshot is newer than this.
                listed_from = std::time::Instant::now();
            }
            Ok(Event::InitApply(p)) => {
                seen.extend(apply_pod(state, &p));
            }
            Ok(Event::InitDone) => {
                write(state).retain_pods(&seen, listed_from);
                state.readiness.listed(Feed::Pods);
                complete = true;
                tracing::info!(pods = seen.len(), "pod list synced");
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn allocatable_reads_cpu_up_and_memory_down() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "7910m", "memory": "32780420Ki", "pods": "110"}}
        }))
        .unwrap();
        assert_eq!(
            allocatable(&node),
            Some(HostLeft {
                cpu_milli: 7910,
                mem_mib: 32012,
                model: 0
            })
        );
        let bare: Node =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "n"}})).unwrap();
        assert_eq!(allocatable(&bare), None);
    }
}
