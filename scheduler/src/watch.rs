//! Watches that feed the cache: nodes (the inventory, heartbeat and GPU cordon annotations, and
//! `status.allocatable`) and every pod (vGPU pods' assignments; every pod's CPU and memory
//! request on its node, for the `gap-aware` host terms, as kube-scheduler's own cache counts
//! them). Objects are read and dropped: the cache keeps only what decisions need.
//!
//! Both are [`Feed`]s of the services' one watch loop ([`vgpu_serve::watch`]): a re-list drops
//! what it did not carry at its end, and a watch that fails after its LIST was complete marks the
//! cache unsynced until the fresh LIST completes (readiness.rs says why).

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::watcher;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;
use vgpu_core::annotations::{DEVICE_CORDON, NODE_DEVICES, NODE_HEARTBEAT};
use vgpu_core::placement::host::HostLeft;
use vgpu_core::placement::GpuFilter;
use vgpu_core::quantity::parse_ceil;
use vgpu_serve::watch::{watch_forever, Feed};

use crate::pod;
use crate::readiness;
use crate::server::AppState;

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

/// Applies a Node; its name, and whether its GPUs, cordon or allocatable changed.
fn apply_node(s: &AppState, node: &Node) -> Option<(String, bool)> {
    let meta = &node.metadata;
    let name = meta.name.clone()?;
    let ann = meta.annotations.as_ref();
    let get = |k: &str| ann.and_then(|a| a.get(k)).map(String::as_str);
    let mut cluster = write(s);
    let gpus = cluster.apply_node(
        &name,
        get(NODE_DEVICES),
        get(NODE_HEARTBEAT),
        get(DEVICE_CORDON),
    );
    let host = cluster.apply_allocatable(&name, allocatable(node));
    Some((name, gpus || host))
}

/// Runs the node watch forever.
pub async fn nodes(client: kube::Client, state: Arc<AppState>) {
    let feed = Nodes {
        state,
        seen: HashSet::new(),
    };
    watch_forever(Api::all(client), watcher::Config::default(), "nodes", feed).await
}

/// The node cache's feed: the names of the current LIST, to drop the others at its end.
struct Nodes {
    state: Arc<AppState>,
    seen: HashSet<String>,
}

impl Feed<Node> for Nodes {
    fn relist(&mut self) {
        self.seen.clear();
    }
    fn listed(&mut self, node: Node) {
        self.seen
            .extend(apply_node(&self.state, &node).map(|(name, _)| name));
    }
    fn synced(&mut self) {
        write(&self.state).retain_nodes(&self.seen);
        self.state.readiness.listed(readiness::Feed::Nodes);
    }
    fn applied(&mut self, node: Node) {
        if let Some((name, true)) = apply_node(&self.state, &node) {
            self.state.requeue.room_changed(&name);
        }
    }
    fn deleted(&mut self, node: Node) {
        if let Some(name) = &node.metadata.name {
            write(&self.state).delete_node(name);
        }
    }
    fn failed(&mut self, error: &watcher::Error, complete: bool) {
        let feed = readiness::Feed::Nodes;
        self.state
            .readiness
            .failed(feed, error.to_string(), complete);
    }
}

fn apply_pod(s: &AppState, p: &Pod) -> Option<String> {
    let uid = p.metadata.uid.clone()?;
    let assignment = match pod::assignment(p) {
        Some(Ok(a)) => Some(a),
        Some(Err(e)) => {
            tracing::warn!(pod = %pod::PodSource::key(p), error = %e, "unreadable assignment; not counted");
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
    let feed = Pods {
        state,
        seen: HashSet::new(),
        listed_from: Instant::now(),
    };
    watch_forever(Api::all(client), watcher::Config::default(), "pods", feed).await
}

/// The pod cache's feed: the uids of the current LIST, and when it was asked for.
struct Pods {
    state: Arc<AppState>,
    seen: HashSet<String>,
    listed_from: Instant,
}

impl Pods {
    /// A pod that held room on its node (CPU and memory if not GPUs) let it go.
    fn room_on(&self, pod: &Pod) {
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
            self.state.requeue.room_changed(node);
        }
    }
}

impl Feed<Pod> for Pods {
    fn relist(&mut self) {
        self.seen.clear();
        // The LIST is sent after this (kube-runtime's watcher yields `Init` from its empty
        // state, then lists in `InitPage`), so its snapshot is newer than this.
        self.listed_from = Instant::now();
    }
    fn listed(&mut self, pod: Pod) {
        self.seen.extend(apply_pod(&self.state, &pod));
    }
    fn synced(&mut self) {
        write(&self.state).retain_pods(&self.seen, self.listed_from);
        self.state.readiness.listed(readiness::Feed::Pods);
    }
    fn applied(&mut self, pod: Pod) {
        apply_pod(&self.state, &pod);
        let terminal = pod::is_terminal(&pod);
        if terminal {
            self.room_on(&pod);
        }
        let bound = pod.spec.as_ref().is_some_and(|s| s.node_name.is_some());
        if let (true, Some(uid)) = (bound || terminal, &pod.metadata.uid) {
            self.state.no_longer_waiting(uid);
        }
    }
    fn deleted(&mut self, pod: Pod) {
        if let Some(uid) = &pod.metadata.uid {
            write(&self.state).delete_pod(uid);
            self.state.no_longer_waiting(uid);
        }
        self.room_on(&pod);
    }
    fn failed(&mut self, error: &watcher::Error, complete: bool) {
        let feed = readiness::Feed::Pods;
        self.state
            .readiness
            .failed(feed, error.to_string(), complete);
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
