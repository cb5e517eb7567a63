//! DRA mode's Pending reasons (`--dra`, docs/dra.md). kube-scheduler allocates claims
//! of class `gpu.vgpu.io` itself and, when it cannot, says only "cannot allocate all claims". For
//! each pod it has marked unschedulable whose claim of our class is not allocated, this says why
//! in an Event on the pod (`VGPUClaimUnallocatable`, shown by `kubectl describe pod`) when it is the
//! GPUs' free capacity: what the request needs and what each GPU has free now, from the driver's
//! ResourceSlices and the allocated claims (`vgpu_core::dra::unallocatable`).
//!
//! Three watches (ResourceSlices of the driver, ResourceClaims, pods not yet on a node) fill
//! reflector stores; after a change, and at least every [`RECHECK`], the pending pods are looked at
//! again. A pod gets a new Event only when its explanation changed.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Resource;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;
use vgpu_core::dra;

/// The Event's reason.
pub const REASON: &str = "VGPUClaimUnallocatable";
/// How often the pending pods are looked at without a change.
const RECHECK: Duration = Duration::from_secs(30);
/// Changes are gathered this long into one look.
const SETTLE: Duration = Duration::from_millis(500);

/// Whether kube-scheduler has tried `pod` and found no node (`PodScheduled` False, reason
/// `Unschedulable`).
fn unschedulable(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| {
            c.type_ == "PodScheduled"
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
        })
}

/// The names of `pod`'s claims: those it names, and those generated from its templates.
fn claim_names(pod: &Pod) -> Vec<String> {
    let mut out: Vec<String> = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|c| c.resource_claim_name.clone())
        .collect();
    out.extend(
        pod.status
            .as_ref()
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|c| c.resource_claim_name.clone()),
    );
    out
}

/// A pod's claim by the name the pod uses.
type Named<'a> = (String, &'a ResourceClaim);

/// `(pod, note)` for each unschedulable pod whose claim of our class has no room.
pub fn explain(
    pods: &[Arc<Pod>],
    claims: &[Arc<ResourceClaim>],
    slices: &[Arc<ResourceSlice>],
) -> Vec<(Arc<Pod>, String)> {
    let allocated = |c: &ResourceClaim| c.status.as_ref().is_some_and(|s| s.allocation.is_some());
    let by_name: HashMap<(&str, &str), &ResourceClaim> = claims
        .iter()
        .filter_map(|c| {
            let key = (
                c.metadata.namespace.as_deref()?,
                c.metadata.name.as_deref()?,
            );
            Some((key, c.as_ref()))
        })
        .collect();
    // The waiting claims first: every change to any claim or pending pod wakes the explainer, and
    // without a waiting claim nothing needs the slices or the claims as JSON.
    let mut waiting: Vec<(&Arc<Pod>, Vec<Named<'_>>)> = Vec::new();
    for pod in pods.iter().filter(|p| unschedulable(p)) {
        let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
        let unallocated: Vec<Named<'_>> = claim_names(pod)
            .into_iter()
            .filter_map(|name| {
                let c = *by_name.get(&(ns, name.as_str()))?;
                (!allocated(c)).then_some((name, c))
            })
            .collect();
        if !unallocated.is_empty() {
            waiting.push((pod, unallocated));
        }
    }
    if waiting.is_empty() {
        return Vec::new();
    }
    let slices: Vec<serde_json::Value> = slices.iter().map(|s| json(s.as_ref())).collect();
    let cards = dra::cards(&slices);
    let held_by: Vec<serde_json::Value> = claims
        .iter()
        .filter(|c| allocated(c))
        .map(|c| json(c.as_ref()))
        .collect();
    let held = dra::held(&held_by);
    waiting
        .into_iter()
        .filter_map(|(pod, unallocated)| {
            unallocated.into_iter().find_map(|(name, c)| {
                let why = dra::unallocatable(&json(c), &cards, &held)?;
                Some((pod.clone(), format!("claim {name}: {why}")))
            })
        })
        .collect()
}

/// A typed object as the JSON the shared model reads.
fn json<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The watches DRA mode reads: the driver's ResourceSlices, every ResourceClaim, the pods not
/// yet on a node. Shared by the explainer and the node scores ([`crate::claim_score`]).
#[derive(Clone)]
pub struct Stores {
    /// ResourceSlices of driver `gpu.vgpu.io`.
    pub slices: Store<ResourceSlice>,
    /// ResourceClaims.
    pub claims: Store<ResourceClaim>,
    /// Pods not yet on a node.
    pub pods: Store<Pod>,
    /// Woken on every event.
    changed: Arc<tokio::sync::Notify>,
    /// Bumped on every slice event, and on every claim event: what a model built from the
    /// stores is as of.
    slices_version: Arc<AtomicU64>,
    claims_version: Arc<AtomicU64>,
}

impl Stores {
    /// Starts the three watches.
    pub fn start(client: &kube::Client) -> Stores {
        let changed = Arc::new(tokio::sync::Notify::new());
        let slices_version = Arc::new(AtomicU64::new(0));
        let claims_version = Arc::new(AtomicU64::new(0));
        Stores {
            slices: store(
                Api::<ResourceSlice>::all(client.clone()),
                &format!("spec.driver={}", dra::CLASS),
                changed.clone(),
                Some(slices_version.clone()),
            ),
            claims: store(
                Api::<ResourceClaim>::all(client.clone()),
                "",
                changed.clone(),
                Some(claims_version.clone()),
            ),
            pods: store(
                Api::<Pod>::all(client.clone()),
                "spec.nodeName=",
                changed.clone(),
                None,
            ),
            changed,
            slices_version,
            claims_version,
        }
    }

    /// (slices, claims): each bumped on every event of its watch.
    pub fn versions(&self) -> (u64, u64) {
        (
            self.slices_version.load(Ordering::Acquire),
            self.claims_version.load(Ordering::Acquire),
        )
    }
}

/// A reflector store of `api`'s objects (filtered by `fields`), and a task that keeps it, wakes
/// `changed` and bumps `version` on every event.
fn store<K>(
    api: Api<K>,
    fields: &str,
    changed: Arc<tokio::sync::Notify>,
    version: Option<Arc<AtomicU64>>,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().fields(fields);
    let stream = reflector::reflector(writer, watcher(api, cfg)).default_backoff();
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::warn!(error = %e, "DRA watch; retrying");
            }
            if let Some(v) = &version {
                v.fetch_add(1, Ordering::AcqRel);
            }
            changed.notify_one();
        }
    });
    reader
}

/// Explains waiting claims until the process ends.
pub async fn run(client: kube::Client, instance: String, stores: Stores) {
    let Stores {
        slices,
        claims,
        pods,
        changed,
        ..
    } = stores;
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "vgpu-scheduler".into(),
            instance: Some(instance),
        },
    );
    let mut said: HashMap<String, String> = HashMap::new();
    loop {
        tokio::select! {
            () = changed.notified() => tokio::time::sleep(SETTLE).await,
            () = tokio::time::sleep(RECHECK) => {}
        }
        let found = explain(&pods.state(), &claims.state(), &slices.state());
        let live: std::collections::HashSet<String> = pods
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        said.retain(|uid, _| live.contains(uid));
        for (pod, note) in found {
            let Some(uid) = pod.metadata.uid.clone() else {
                continue;
            };
            if said.get(&uid) == Some(&note) {
                continue;
            }
            let span = tracing::info_span!(
                "explain",
                pod = %format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                )
            );
            let event = Event {
                type_: EventType::Warning,
                reason: REASON.into(),
                note: Some(note.clone()),
                action: "Allocate".into(),
                secondary: None,
            };
            let posted = recorder
                .publish(&event, &pod.object_ref(&()))
                .instrument(span.clone())
                .await;
            let _enter = span.enter();
            match posted {
                Ok(()) => {
                    tracing::info!(%note, "explained");
                    said.insert(uid, note);
                }
                Err(e) => tracing::warn!(error = %e, "posting the explanation"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unschedulable_pod_whose_claim_has_no_room_is_explained() {
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "vm-gpu.vgpu.io"},
            "spec": {"driver": "gpu.vgpu.io", "nodeName": "vm",
                "pool": {"name": "vm", "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "24Gi"}, "cores": {"value": "100"}}}]}
        }))
        .unwrap();
        let claim = |name: &str, memory: &str, allocated: bool| -> ResourceClaim {
            let mut c = json!({"metadata": {"name": name, "namespace": "ml"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io",
                    "capacity": {"requests": {"memory": memory, "cores": "10"}}}}]}}});
            if allocated {
                c["status"] = json!({"allocation": {"devices": {"results": [{"driver": "gpu.vgpu.io",
                    "pool": "vm", "device": "gpu-0", "request": "gpu",
                    "consumedCapacity": {"memory": memory, "cores": "10"}}]}}});
            }
            serde_json::from_value(c).unwrap()
        };
        let pod = |name: &str, claim: &str, unschedulable: bool| -> Pod {
            let mut p = json!({"metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
                "spec": {"containers": [], "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
                "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": claim}]}});
            if unschedulable {
                p["status"]["conditions"] =
                    json!([{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]);
            }
            serde_json::from_value(p).unwrap()
        };
        let claims = vec![
            Arc::new(claim("held", "8Gi", true)),
            Arc::new(claim("big", "20Gi", false)),
            Arc::new(claim("small", "1Gi", false)),
        ];
        let pods = vec![
            Arc::new(pod("waits", "big", true)),
            Arc::new(pod("fits", "small", true)),
            Arc::new(pod("not-tried-yet", "big", false)),
        ];
        let found = explain(&pods, &claims, &[Arc::new(slice)]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0.metadata.name.as_deref(), Some("waits"));
        assert_eq!(
            found[0].1,
            "claim big: spec.devices.requests[0].exactly needs 20480 MiB and 10 cores of one GPU of class gpu.vgpu.io; free now: vm/gpu-0 16384 MiB and 90 cores free"
        );
    }
}
