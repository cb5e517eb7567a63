//! Controllers whose pods were refused for quota, asked to try again when room may have appeared.
//!
//! A controller retries a refused pod creation on its work queue's backoff, not when the quota
//! changes: the ReplicaSet, StatefulSet and DaemonSet controllers call `AddRateLimited` after a
//! failed sync (`pkg/controller/replicaset/replica_set.go`, `processNextWorkItem`) on
//! `workqueue.DefaultTypedControllerRateLimiter`, 5 ms doubling per failure up to 1000 s
//! (client-go `util/workqueue/default_rate_limiters.go`); the Job controller 1 s doubling up to
//! 1 min (`pkg/controller/job/job_controller.go`, `DefaultJobApiBackOff`, `MaxJobApiBackOff`).
//! None of them watches ResourceQuotas, so a Deployment refused for ten minutes creates its pod up
//! to ten minutes after the quota is raised. Each syncs its object on any update of it
//! (`replica_set.go` `updateRS`: "it is safer to sync any time this function is triggered"; the
//! StatefulSet and DaemonSet controllers alike; a Job within its 1 s batch period), so when a quota
//! of a namespace changes, or one of its vGPU pods or claims goes away, the webhook writes the time
//! into one annotation ([`QUOTA_RETRY`]) of each owner it refused there.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use vgpu_core::annotations::QUOTA_RETRY;

use super::events::ObjectRef;
use crate::metrics::Metrics;

/// The controllers asked to retry: (apiVersion, kind, plural). Others (custom operators) are left
/// to their own retries: the webhook may not write to them.
const KINDS: &[(&str, &str, &str)] = &[
    ("apps/v1", "ReplicaSet", "replicasets"),
    ("apps/v1", "StatefulSet", "statefulsets"),
    ("apps/v1", "DaemonSet", "daemonsets"),
    ("batch/v1", "Job", "jobs"),
];

/// How long a refused owner is remembered without being refused again: longer than the longest
/// backoff above (1000 s), so an owner still retrying is refused, and so remembered, again first.
pub const KEEP: Duration = Duration::from_secs(1200);
/// Most owners remembered per namespace.
pub const MOST_PER_NAMESPACE: usize = 1024;
/// Asks waiting for the writer; beyond it they are dropped (counted as `error`).
const QUEUE: usize = 4096;

/// The owners refused for quota, by namespace.
#[derive(Debug, Default)]
pub struct Refusals {
    by_namespace: HashMap<String, HashMap<String, (ObjectRef, Instant)>>,
}

impl Refusals {
    /// Remembers the owner of a pod refused for quota at `now`; `false` for an owner the webhook
    /// does not ask (a kind not in [`KINDS`], no uid) or a namespace that holds
    /// [`MOST_PER_NAMESPACE`] already.
    pub fn note(&mut self, owner: &ObjectRef, now: Instant) -> bool {
        if owner.uid.is_empty() || resource(owner).is_none() {
            return false;
        }
        let refused = self
            .by_namespace
            .entry(owner.namespace.clone())
            .or_default();
        refused.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
        if refused.len() >= MOST_PER_NAMESPACE && !refused.contains_key(&owner.uid) {
            return false;
        }
        refused.insert(owner.uid.clone(), (owner.clone(), now));
        true
    }

    /// Room may have appeared in `namespace` (`None`: anywhere): the owners refused there within
    /// [`KEEP`], forgotten (a refusal after the retry remembers them again).
    pub fn take(&mut self, namespace: Option<&str>, now: Instant) -> Vec<ObjectRef> {
        let taken: Vec<HashMap<String, (ObjectRef, Instant)>> = match namespace {
            Some(ns) => self.by_namespace.remove(ns).into_iter().collect(),
            None => self.by_namespace.drain().map(|(_, m)| m).collect(),
        };
        taken
            .into_iter()
            .flat_map(HashMap::into_values)
            .filter(|(_, at)| now.duration_since(*at) < KEEP)
            .map(|(owner, _)| owner)
            .collect()
    }
}

/// The API resource of an owner the webhook asks to retry.
fn resource(owner: &ObjectRef) -> Option<ApiResource> {
    let &(api_version, kind, plural) = KINDS
        .iter()
        .find(|(v, k, _)| *v == owner.api_version && *k == owner.kind)?;
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    Some(ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    })
}

/// The refusals and the task that writes the asks (none without API access).
pub struct Retries {
    refusals: Mutex<Refusals>,
    writer: Option<mpsc::Sender<ObjectRef>>,
    metrics: Arc<Metrics>,
}

impl Retries {
    /// Remembers nothing, asks nothing (no API).
    pub fn disabled(metrics: Arc<Metrics>) -> Retries {
        Retries {
            refusals: Mutex::default(),
            writer: None,
            metrics,
        }
    }

    /// Starts the writer on the runtime.
    pub fn start(client: kube::Client, metrics: Arc<Metrics>) -> Retries {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write(client, rx, metrics.clone()));
        Retries {
            refusals: Mutex::default(),
            writer: Some(tx),
            metrics,
        }
    }

    /// A pod of `owner` was refused for quota.
    pub fn refused(&self, owner: &ObjectRef) {
        if self.writer.is_some() {
            self.lock().note(owner, Instant::now());
        }
    }

    /// Room may have appeared in `namespace` (`None`: anywhere, after a watch listed afresh).
    pub fn room(&self, namespace: Option<&str>) {
        let Some(writer) = &self.writer else { return };
        for owner in self.lock().take(namespace, Instant::now()) {
            if writer.try_send(owner).is_err() {
                self.metrics.quota_retry("error");
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Refusals> {
        self.refusals.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Writes each ask: a merge patch of the one annotation (RBAC `patch` on the four kinds).
async fn write(client: kube::Client, mut asks: mpsc::Receiver<ObjectRef>, metrics: Arc<Metrics>) {
    while let Some(owner) = asks.recv().await {
        let Some(resource) = resource(&owner) else {
            continue;
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &owner.namespace, &resource);
        let patch = json!({"metadata": {"annotations": {QUOTA_RETRY: vgpu_core::time::now_rfc3339_micros()}}});
        let result = match api
            .patch(&owner.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => "ok",
            Err(kube::Error::Api(e)) if e.code == 404 => "gone",
            Err(error) => {
                tracing::warn!(kind = %owner.kind, namespace = %owner.namespace, name = %owner.name,
                    %error, "could not ask the controller to retry after a quota refusal");
                "error"
            }
        };
        metrics.quota_retry(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(kind: &str, api_version: &str, ns: &str, name: &str) -> ObjectRef {
        ObjectRef {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: ns.into(),
            name: name.into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn the_owners_refused_in_a_namespace_are_taken_once() {
        let mut r = Refusals::default();
        let t = Instant::now();
        let rs = owner("ReplicaSet", "apps/v1", "a", "web");
        let job = owner("Job", "batch/v1", "a", "train");
        let other = owner("StatefulSet", "apps/v1", "b", "db");
        assert!(r.note(&rs, t));
        assert!(r.note(&rs, t), "a repeat refusal refreshes the same entry");
        assert!(r.note(&job, t));
        assert!(r.note(&other, t));
        let mut taken = r.take(Some("a"), t);
        taken.sort_by(|x, y| x.name.cmp(&y.name));
        assert_eq!(taken, vec![job, rs]);
        assert!(
            r.take(Some("a"), t).is_empty(),
            "taken owners are forgotten"
        );
        assert_eq!(r.take(None, t), vec![other]);
    }

    #[test]
    fn only_controllers_the_webhook_may_write_to_are_remembered() {
        let mut r = Refusals::default();
        let t = Instant::now();
        assert!(!r.note(&owner("TFJob", "kubeflow.org/v1", "a", "x"), t));
        assert!(!r.note(&owner("ReplicaSet", "extensions/v1beta1", "a", "x"), t));
        let mut no_uid = owner("ReplicaSet", "apps/v1", "a", "x");
        no_uid.uid.clear();
        assert!(!r.note(&no_uid, t));
        assert!(r.note(&owner("DaemonSet", "apps/v1", "a", "x"), t));
        assert_eq!(
            resource(&owner("Job", "batch/v1", "a", "x")).map(|r| (r.group, r.version, r.plural)),
            Some(("batch".into(), "v1".into(), "jobs".into()))
        );
    }

    #[test]
    fn an_owner_not_refused_for_longer_than_the_longest_backoff_is_forgotten() {
        let mut r = Refusals::default();
        let t = Instant::now();
        r.note(&owner("ReplicaSet", "apps/v1", "a", "old"), t);
        r.note(&owner("ReplicaSet", "apps/v1", "a", "new"), t + KEEP);
        let taken = r.take(Some("a"), t + KEEP);
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].name, "new");
    }

    #[test]
    fn a_namespace_remembers_a_bounded_number_of_owners() {
        let mut r = Refusals::default();
        let t = Instant::now();
        for i in 0..MOST_PER_NAMESPACE {
            assert!(r.note(&owner("Job", "batch/v1", "a", &format!("j{i}")), t));
        }
        assert!(!r.note(&owner("Job", "batch/v1", "a", "one-more"), t));
        assert!(
            r.note(&owner("Job", "batch/v1", "a", "j0"), t),
            "a known one refreshes"
        );
        assert_eq!(r.take(None, t).len(), MOST_PER_NAMESPACE);
    }
}
