//! Keeps the pod cache in step with this node's vGPU pods: a [`Feed`] of the services' one watch
//! loop ([`vgpu_serve::watch`]) with the field selector `spec.nodeName=<node>` and the webhook's
//! label, so the API server sends nothing else.

use crate::plugin::Shared;
use crate::pods::PodEntry;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::SystemTime;
use vgpu_serve::watch::{watch_forever, Feed};

/// Watches forever.
pub async fn run(shared: Arc<Shared>, api: kube::Api<Pod>) {
    let node = shared.settings.node_name.clone();
    let cfg = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(vgpu_core::annotations::MANAGED_SELECTOR);
    let feed = Pods {
        shared,
        node,
        relist: Vec::new(),
        listed_at: SystemTime::now(),
    };
    watch_forever(api, cfg, "pods", feed).await
}

/// The pod cache's feed: the entries of the current LIST, and when it began (Allocate may write
/// a record for a pod that LIST missed).
struct Pods {
    shared: Arc<Shared>,
    node: String,
    relist: Vec<PodEntry>,
    listed_at: SystemTime,
}

impl Feed<Pod> for Pods {
    fn relist(&mut self) {
        self.relist.clear();
        self.listed_at = SystemTime::now();
    }
    fn listed(&mut self, pod: Pod) {
        self.relist.extend(PodEntry::from_pod(&pod, &self.node));
    }
    fn synced(&mut self) {
        let entries = std::mem::take(&mut self.relist);
        let uids: HashSet<String> = entries.iter().map(|e| e.uid.clone()).collect();
        self.shared.with_pods(|c| c.replace_all(entries));
        crate::records::forget_pods_listed_at(
            &self.shared.settings.host_dir,
            |u| uids.contains(u),
            Some(self.listed_at),
        );
    }
    fn applied(&mut self, pod: Pod) {
        if let Some(e) = PodEntry::from_pod(&pod, &self.node) {
            self.shared.with_pods(|c| c.upsert(e));
        }
    }
    fn deleted(&mut self, pod: Pod) {
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.shared.with_pods(|c| c.remove(uid));
            let gone = uid.to_string();
            crate::records::forget_pods(&self.shared.settings.host_dir, |u| u != gone);
        }
    }
}
