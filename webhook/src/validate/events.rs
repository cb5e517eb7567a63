//! Rejections as Kubernetes Events (events.k8s.io/v1), so `kubectl get events` and `kubectl
//! describe` of the pod's controller say why a pod was refused.
//!
//! Repeats are aggregated the way client-go's event recorder does for isomorphic events: the first
//! occurrence creates an Event, later ones raise its `series.count` (2 on the second, as client-go
//! writes it) and `series.lastObservedTime`. The Event's name is derived from what it is about and
//! its reason, so both webhook replicas update the same object; the update carries the
//! resourceVersion it read and is retried on 409 Conflict, so counts add up exactly. Writes run in
//! a background task fed by a bounded queue: an admission never waits for an Event, and a failed
//! write never changes a decision.

use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

use crate::metrics::Metrics;

/// Reason of a quota rejection.
pub const REASON_QUOTA: &str = "VGPUQuotaExceeded";
/// Reason of a policy rejection.
pub const REASON_POLICY: &str = "VGPUPolicyViolation";
/// `reportingController` of our Events.
pub const REPORTING_CONTROLLER: &str = "vgpu.io/webhook";
/// `reportingInstance`: the same for every replica, so their Events aggregate into one.
pub const REPORTING_INSTANCE: &str = "vgpu-webhook";
/// Queue length; beyond it Events are dropped (and counted as failed writes).
pub const QUEUE: usize = 4096;

/// What an Event is about (`regarding`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectRef {
    /// apiVersion of the object.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace (empty for a Namespace).
    pub namespace: String,
    /// Name.
    pub name: String,
    /// uid, when known.
    pub uid: String,
}

/// One rejection to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Namespace the Event goes to (the pod's).
    pub namespace: String,
    /// What it is about.
    pub regarding: ObjectRef,
    /// [`REASON_QUOTA`] or [`REASON_POLICY`].
    pub reason: &'static str,
    /// The message (the denial's text).
    pub note: String,
}

/// The refused pod itself, for a pod without a controller, in its namespace, where `kubectl get
/// events` lists it as `pod/<name>`. A refused creation never exists, so its Event carries the name
/// (or `generateName`) and no uid; a refused UPDATE's pod does, and its uid lets `kubectl describe
/// pod` (which selects events by uid) show it. (An Event about a cluster-scoped object such as the
/// Namespace must live in `default` or `kube-system`: the API server refuses it in the pod's
/// namespace with 422 `involvedObject.namespace: Invalid value: "": does not match
/// event.namespace`, pkg/apis/core/validation/events.go.)
pub fn pod_ref(request: &crate::admission::AdmissionRequest, namespace: &str) -> ObjectRef {
    let uid = match request.operation.as_str() {
        "UPDATE" => request
            .object
            .as_ref()
            .and_then(|o| o.pointer("/metadata/uid"))
            .and_then(Value::as_str)
            .unwrap_or_default(),
        _ => "",
    };
    ObjectRef {
        api_version: "v1".into(),
        kind: "Pod".into(),
        namespace: namespace.to_string(),
        name: request.object_name().to_string(),
        uid: uid.to_string(),
    }
}

/// What a rejection of this pod should be recorded against: its controller from ownerReferences,
/// else `fallback` (the pod itself, [`pod_ref`]).
pub fn regarding(pod: &Value, namespace: &str, fallback: ObjectRef) -> ObjectRef {
    let owners = pod
        .pointer("/metadata/ownerReferences")
        .and_then(Value::as_array);
    let controller = owners.and_then(|o| {
        o.iter()
            .find(|r| r.get("controller").and_then(Value::as_bool) == Some(true))
            .or_else(|| o.first())
    });
    match controller {
        Some(r) => {
            let s = |k: &str| {
                r.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            ObjectRef {
                api_version: s("apiVersion"),
                kind: s("kind"),
                namespace: namespace.to_string(),
                name: s("name"),
                uid: s("uid"),
            }
        }
        None => fallback,
    }
}

/// The Event's name: the object's name and a hash of what makes repeats the same, as a DNS
/// subdomain (lowercase hex).
pub fn event_name(r: &Rejection) -> String {
    // FNV-1a: stable across processes and releases (std's hasher is not).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in [
        r.regarding.kind.as_str(),
        r.regarding.namespace.as_str(),
        r.regarding.name.as_str(),
        r.regarding.uid.as_str(),
        r.reason,
    ] {
        for b in part.bytes().chain([0]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    // Cut to leave room for the suffix; a DNS label may not end in '-' or '.' (a real API server
    // refuses the Event then, 422, where the fake one would take it).
    let base: String = r.regarding.name.chars().take(200).collect();
    let base = base.trim_end_matches(['-', '.']);
    format!("{base}.vgpu-{h:016x}")
}

/// The Event object for the first occurrence (`count` > 1 when repeats were queued together).
pub fn new_event(r: &Rejection, count: u64, now: &str) -> Value {
    let mut ev = json!({
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": event_name(r), "namespace": r.namespace},
        "eventTime": now,
        "reportingController": REPORTING_CONTROLLER,
        "reportingInstance": REPORTING_INSTANCE,
        "action": "Admit",
        "reason": r.reason,
        "type": "Warning",
        "note": truncate(&r.note, 1024),
        "regarding": regarding_json(&r.regarding),
    });
    if count > 1 {
        ev["series"] = json!({"count": count, "lastObservedTime": now});
    }
    ev
}

/// How many occurrences an Event records.
pub fn occurrences(ev: &Value) -> u64 {
    ev.pointer("/series/count")
        .and_then(Value::as_u64)
        .unwrap_or(1)
}

fn regarding_json(o: &ObjectRef) -> Value {
    let mut v = json!({"apiVersion": o.api_version, "kind": o.kind, "name": o.name});
    if !o.namespace.is_empty() {
        v["namespace"] = json!(o.namespace);
    }
    if !o.uid.is_empty() {
        v["uid"] = json!(o.uid);
    }
    v
}

/// The Event API limits `note` to 1 kB.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Queues rejections for the writer task.
#[derive(Debug, Clone)]
pub struct EventRecorder {
    tx: Option<mpsc::Sender<Rejection>>,
    metrics: Arc<Metrics>,
}

impl EventRecorder {
    /// A recorder that writes nothing (no API configured).
    pub fn disabled(metrics: Arc<Metrics>) -> EventRecorder {
        EventRecorder { tx: None, metrics }
    }

    /// Starts the writer task.
    pub fn start(client: kube::Client, metrics: Arc<Metrics>) -> EventRecorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(writer(client, rx, metrics.clone()));
        EventRecorder {
            tx: Some(tx),
            metrics,
        }
    }

    /// Queues one rejection; never waits.
    pub fn record(&self, r: Rejection) {
        if let Some(tx) = &self.tx {
            if tx.try_send(r).is_err() {
                self.metrics.event_write(false);
                tracing::warn!("event queue full; rejection Event dropped");
            }
        }
    }
}

fn events_resource() -> ApiResource {
    ApiResource {
        group: "events.k8s.io".into(),
        version: "v1".into(),
        api_version: "events.k8s.io/v1".into(),
        kind: "Event".into(),
        plural: "events".into(),
    }
}

async fn writer(client: kube::Client, mut rx: mpsc::Receiver<Rejection>, metrics: Arc<Metrics>) {
    while let Some(first) = rx.recv().await {
        // Coalesce what is already queued: one write per Event, however many repeats.
        let mut batch: Vec<(Rejection, u64)> = vec![(first, 1)];
        while let Ok(r) = rx.try_recv() {
            let name = event_name(&r);
            match batch
                .iter_mut()
                .find(|(b, _)| event_name(b) == name && b.namespace == r.namespace)
            {
                Some((_, n)) => *n += 1,
                None => batch.push((r, 1)),
            }
        }
        for (r, n) in batch {
            let ok = write_event(&client, &r, n).await;
            metrics.event_write(ok.is_ok());
            if let Err(e) = ok {
                tracing::warn!(namespace = %r.namespace, reason = r.reason, error = %e, "writing Event failed");
            }
        }
    }
}

/// An Event could not be written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EventError {
    /// The API refused or could not be reached.
    #[error(transparent)]
    Api(#[from] kube::Error),
    /// The object did not serialise (a bug).
    #[error("event object: {0}")]
    Encode(#[from] serde_json::Error),
    /// Other writers kept winning.
    #[error("gave up after {0} conflicting updates")]
    Conflicts(u32),
}

/// Creates the Event or adds `n` to its series, retrying conflicts.
async fn write_event(client: &kube::Client, r: &Rejection, n: u64) -> Result<(), EventError> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &r.namespace, &events_resource());
    let name = event_name(r);
    const ATTEMPTS: u32 = 16;
    for _ in 0..ATTEMPTS {
        let now = vgpu_core::time::now_rfc3339_micros();
        match api.get_opt(&name).await? {
            None => {
                let obj: DynamicObject = serde_json::from_value(new_event(r, n, &now))?;
                match api.create(&PostParams::default(), &obj).await {
                    Ok(_) => return Ok(()),
                    // Another replica created it first: add to it.
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Some(mut existing) => {
                let count = occurrences(&super::cache::to_value(&existing)) + n;
                existing.data["series"] = json!({"count": count, "lastObservedTime": now});
                match api.replace(&name, &PostParams::default(), &existing).await {
                    Ok(_) => return Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Err(EventError::Conflicts(ATTEMPTS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rejection(kind: &str, name: &str) -> Rejection {
        Rejection {
            namespace: "team-a".into(),
            regarding: ObjectRef {
                api_version: "apps/v1".into(),
                kind: kind.into(),
                namespace: "team-a".into(),
                name: name.into(),
                uid: "u1".into(),
            },
            reason: REASON_QUOTA,
            note: "vgpu quota exceeded".into(),
        }
    }

    #[test]
    fn regarding_prefers_the_controller() {
        let fallback = ObjectRef {
            api_version: "v1".into(),
            kind: "ResourceQuota".into(),
            namespace: "team-a".into(),
            name: "gpu-quota".into(),
            uid: String::new(),
        };
        let pod = json!({"metadata": {"ownerReferences": [
            {"apiVersion": "v1", "kind": "Other", "name": "x", "uid": "0"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f", "uid": "rs-1", "controller": true}]}});
        let r = regarding(&pod, "team-a", fallback.clone());
        assert_eq!(
            (r.kind.as_str(), r.name.as_str(), r.uid.as_str()),
            ("ReplicaSet", "train-7d9f", "rs-1")
        );
        assert_eq!(regarding(&json!({}), "team-a", fallback.clone()), fallback);
    }

    #[test]
    fn event_shape_and_stable_names() {
        let r = rejection("ReplicaSet", "train-7d9f");
        let name = event_name(&r);
        assert!(
            name.starts_with("train-7d9f.vgpu-") && name.len() == "train-7d9f.vgpu-".len() + 16
        );
        assert_eq!(name, event_name(&r.clone()), "stable");
        // A long name cut where a label would end in '-' or '.' still makes a valid name.
        let long = rejection("Pod", &format!("{}-x", "a".repeat(199)));
        let cut = event_name(&long);
        assert!(
            cut.starts_with(&"a".repeat(199)) && cut[199..].starts_with(".vgpu-"),
            "{cut}"
        );
        let mut other = r.clone();
        other.reason = REASON_POLICY;
        assert_ne!(name, event_name(&other));
        let ev = new_event(&r, 1, "2026-12-03T12:00:00.000001Z");
        assert_eq!(ev["type"], "Warning");
        assert_eq!(ev["reason"], "VGPUQuotaExceeded");
        assert_eq!(ev["regarding"]["kind"], "ReplicaSet");
        assert_eq!(ev["reportingController"], REPORTING_CONTROLLER);
        assert!(ev.get("series").is_none());
        assert_eq!(occurrences(&ev), 1);
        assert_eq!(occurrences(&new_event(&r, 3, "t")), 3);
        let t = vgpu_core::time::now_rfc3339_micros();
        assert!(
            t.ends_with('Z') && t.len() == "2026-12-03T12:00:00.000001Z".len(),
            "{t}"
        );
    }
}
