//! Keeps the pod cache in step with this node's vGPU pods: a kube-rs watcher with the field selector
//! `spec.nodeName=<node>` and the webhook's label, so the API server sends nothing else.

use crate::plugin::Shared;
use crate::pods::PodEntry;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use std::sync::Arc;

/// Watches forever (the watcher retries with backoff on errors).
pub async fn run(shared: Arc<Shared>, api: kube::Api<Pod>) {
    let node = shared.settings.node_name.clone();
    let cfg = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(vgpu_core::annotations::MANAGED_SELECTOR);
    let mut stream =
        kube::runtime::WatchStreamExt::default_backoff(watcher::watcher(api, cfg)).boxed();
    let mut relist: Vec<PodEntry> = Vec::new();
    // When the current (re-)list began: Allocate may write a record for a pod that list missed.
    let mut listed_at = std::time::SystemTime::now();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(p)) => {
                if let Some(e) = PodEntry::from_pod(&p, &node) {
                    shared.with_pods(|c| c.upsert(e));
                }
            }
            Ok(Event::Delete(p)) => {
                if let Some(uid) = p.metadata.uid.as_deref() {
                    shared.with_pods(|c| c.remove(uid));
                    let gone = uid.to_string();
                    crate::metrics::forget_pods(&shared.settings.host_dir, |u| u != gone);
                }
            }
            Ok(Event::Init) => {
                relist.clear();
                listed_at = std::time::SystemTime::now();
            }
            Ok(Event::InitApply(p)) => relist.extend(PodEntry::from_pod(&p, &node)),
            Ok(Event::InitDone) => {
                let entries = std::mem::take(&mut relist);
                let uids: std::collections::HashSet<String> =
                    entries.iter().map(|e| e.uid.clone()).collect();
                shared.with_pods(|c| c.replace_all(entries));
                crate::metrics::forget_pods_listed_at(
                    &shared.settings.host_dir,
                    |u| uids.contains(u),
                    Some(listed_at),
                );
                tracing::info!(pods = uids.len(), "pod cache synced");
            }
            Err(e) => tracing::warn!(error = %e, "pod watch error; retrying"),
        }
    }
}
