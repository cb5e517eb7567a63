//! Race-free quota across webhook replicas: a reservation ledger with optimistic concurrency.
//!
//! Kubernetes' own quota admission serialises admissions by compare-and-swap on the quota object's
//! `resourceVersion`. vgpu does the same on one ConfigMap per tenant namespace
//! (`vgpu-quota-<namespace>`, in the webhook's own namespace, where tenants cannot write). An
//! admission reads the ledger, computes usage = the namespace's cached vGPU pods + the ledger's
//! reservations for pods not in the cache yet, checks every quota, and writes its own reservation
//! back with the `resourceVersion` it read. A concurrent writer (another replica) makes that write
//! fail with 409 Conflict, and the admission starts over from a fresh read, so two admissions can
//! never both spend the same headroom.
//!
//! A reservation counts until its pod has existed or provably never will:
//! - its pod shows up in this replica's pod cache (then the pod counts), and once seen the
//!   reservation never counts again, even after the pod is deleted or finishes, so a delete frees
//!   its share as soon as the watch delivers it;
//! - another pod holds its name (names are unique in a namespace: this creation failed);
//! - it expires (`ttl`). This is the only end for a pod that a later admission step refused
//!   (Kubernetes' own ResourceQuota runs after the validating webhooks, and other validating
//!   webhooks run in parallel with ours for up to 30 s each): the API server sends a webhook no
//!   word of what happened after its answer, so until the TTL nothing distinguishes such a pod from
//!   one still on its way through the admission chain. A dry run never reserves.
//!
//! Expired reservations are dropped at the next write.
//!
//! A replica that finds a reservation's pod in its cache shortens the reservation to a grace of
//! [`CONFIRMED_GRACE_MS`] (it has done its job; the ledger stays small) and notes the pod's uid as
//! confirmed until the reservation's own expiry. A replica whose pod watch lags further behind
//! than the grace would otherwise count neither the pod nor its reservation: before counting, each
//! replica checks that its cache has every confirmed pod, and when one is missing
//! ([`Attempt::CacheBehind`]) it decides from a fresh LIST of the namespace's pods instead.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::quota::{self, Exceeded, Quota};
use super::usage::{Amounts, CachedPod, PodUsage};

/// Key of the ledger in the ConfigMap's data.
pub const DATA_KEY: &str = "reservations";

/// How long a reservation still counts, on replicas that do not cache its pod yet, once this
/// replica has seen the pod (watch lag between replicas is well under this).
pub const CONFIRMED_GRACE_MS: u64 = 5_000;

/// Name of the ledger ConfigMap of a tenant namespace.
pub fn ledger_name(namespace: &str) -> String {
    format!("vgpu-quota-{namespace}")
}

/// One admitted pod not yet known to be in the pod cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reservation {
    /// The pod's uid (the API server assigns it before validating admission).
    pub uid: String,
    /// The pod's name.
    pub pod: String,
    /// Unix milliseconds after which it no longer counts.
    pub expires_ms: u64,
    /// What it holds.
    pub usage: PodUsage,
}

/// A pod some replica has found in its cache, so its reservation was shortened to the grace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Confirmed {
    /// The pod's uid.
    pub uid: String,
    /// Unix milliseconds: the reservation's own expiry, until which a replica that has not seen
    /// the pod knows its cache is behind.
    pub until_ms: u64,
}

/// The ledger's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// Reservations, oldest first.
    pub reservations: Vec<Reservation>,
    /// Pods found in some replica's cache, whose reservations were shortened (absent in ledgers
    /// written before this field: such a replica drops it, and the grace alone applies).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirmed: Vec<Confirmed>,
}

impl Ledger {
    /// Reads the ConfigMap's data; a missing or unreadable entry is an empty ledger (the worst
    /// case is that reservations younger than the TTL are forgotten, as after a restart).
    pub fn from_configmap(cm: &Value) -> Ledger {
        cm.pointer("/data")
            .and_then(|d| d.get(DATA_KEY))
            .and_then(Value::as_str)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default()
    }

    /// The ConfigMap body (without metadata).
    pub fn to_data(&self) -> Value {
        json!({ DATA_KEY: serde_json::to_string(self).unwrap_or_default() })
    }
}

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The outcome of one attempt on a ledger snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The pod fits: write this ledger (with its reservation added) back.
    Write(Ledger),
    /// The pod is already reserved (the API server retried the call): admit, write nothing.
    AlreadyReserved,
    /// A quota would be exceeded.
    Exceeded(Exceeded),
    /// This replica's cache lacks a pod another replica has confirmed (its watch lags more than
    /// the grace): decide again from a fresh LIST of the namespace's pods.
    CacheBehind,
}

/// Pure decision on one snapshot: prunes expired reservations, counts usage, checks quotas.
/// `seen(uid)` says whether a pod with that uid has been in the cache (it may be gone again).
pub fn attempt(
    namespace: &str,
    ledger: &Ledger,
    pods: &[CachedPod],
    quotas: &[Quota],
    incoming: &Reservation,
    now_ms: u64,
    seen: &dyn Fn(&str) -> bool,
) -> Attempt {
    let live: Vec<&Reservation> = ledger
        .reservations
        .iter()
        .filter(|r| r.expires_ms > now_ms)
        .collect();
    if live
        .iter()
        .any(|r| r.uid == incoming.uid && !incoming.uid.is_empty())
    {
        return Attempt::AlreadyReserved;
    }
    let confirmed: Vec<&Confirmed> = ledger
        .confirmed
        .iter()
        .filter(|c| c.until_ms > now_ms)
        .collect();
    if confirmed
        .iter()
        .any(|c| !seen(&c.uid) && !pods.iter().any(|p| p.uid == c.uid))
    {
        return Attempt::CacheBehind;
    }
    // Its pod is cached, or was and is gone, or another pod holds its name.
    let in_cache = |r: &Reservation| {
        seen(&r.uid)
            || pods
                .iter()
                .any(|p| (!r.uid.is_empty() && p.uid == r.uid) || p.name == r.pod)
    };
    let used = |q: &Quota| {
        let mut a = Amounts::default();
        for p in pods.iter().filter(|p| q.covers(&p.usage.facts)) {
            a += p.usage.amounts();
        }
        for r in live
            .iter()
            .filter(|r| !in_cache(r) && q.covers(&r.usage.facts))
        {
            a += r.usage.amounts();
        }
        a
    };
    if let Err(e) = quota::check(namespace, &incoming.usage, quotas, used) {
        return Attempt::Exceeded(e);
    }
    // A reservation whose pod this replica already caches has done its job: keep it only for a
    // short grace (other replicas' caches may lag), so that deleting the pod frees its share within
    // the grace instead of the whole TTL.
    let mut next = Ledger {
        reservations: Vec::with_capacity(live.len() + 1),
        confirmed: confirmed.into_iter().cloned().collect(),
    };
    for r in live {
        let mut r = r.clone();
        let grace = now_ms.saturating_add(CONFIRMED_GRACE_MS);
        if in_cache(&r) && r.expires_ms > grace {
            if !r.uid.is_empty() && !next.confirmed.iter().any(|c| c.uid == r.uid) {
                next.confirmed.push(Confirmed {
                    uid: r.uid.clone(),
                    until_ms: r.expires_ms,
                });
            }
            r.expires_ms = grace;
        }
        next.reservations.push(r);
    }
    next.reservations.push(incoming.clone());
    Attempt::Write(next)
}

/// A reservation for a pod, valid for `ttl`.
pub fn reservation(uid: &str, pod: &str, usage: PodUsage, ttl: Duration) -> Reservation {
    Reservation {
        uid: uid.to_string(),
        pod: pod.to_string(),
        expires_ms: now_ms().saturating_add(ttl.as_millis() as u64),
        usage,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::usage::{ScopeFacts, SliceCount};
    use serde_json::json;
    use vgpu_core::resources::ResourceNames;

    fn usage(mib: u64) -> PodUsage {
        PodUsage {
            slices: vec![SliceCount {
                gpus: 1,
                mib_per_gpu: mib,
                cores_per_gpu: 100,
            }],
            facts: ScopeFacts::default(),
        }
    }

    fn res(uid: &str, mib: u64, expires_ms: u64) -> Reservation {
        Reservation {
            uid: uid.into(),
            pod: format!("pod-{uid}"),
            expires_ms,
            usage: usage(mib),
        }
    }

    fn quotas(hard: u64) -> Vec<Quota> {
        vec![Quota::from_object(
            &json!({"metadata": {"name": "q", "namespace": "ns"}, "spec": {"hard": {"limits.nvidia.com/gpumem": hard.to_string()}}}),
            &ResourceNames::default(),
        )
        .unwrap()]
    }

    #[test]
    fn reservations_count_until_the_pod_is_cached_or_they_expire() {
        let ledger = Ledger {
            reservations: vec![res("a", 4096, 2_000), res("b", 4096, 500)],
            confirmed: Vec::new(),
        };
        let q = quotas(8192);
        // At t=100 both count: no room for a third 4096.
        assert!(matches!(
            attempt("ns", &ledger, &[], &q, &res("c", 4096, 9_000), 100, &|_| {
                false
            }),
            Attempt::Exceeded(_)
        ));
        // At t=1000 "b" has expired: it is dropped, and "c" fits.
        let Attempt::Write(next) = attempt(
            "ns",
            &ledger,
            &[],
            &q,
            &res("c", 4096, 9_000),
            1_000,
            &|_| false,
        ) else {
            panic!("should fit");
        };
        let uids: Vec<_> = next.reservations.iter().map(|r| r.uid.as_str()).collect();
        assert_eq!(uids, ["a", "c"]);
        // A reservation whose pod is in the cache is not counted twice.
        let pods = [CachedPod {
            name: "pod-a".into(),
            uid: "a".into(),
            usage: usage(4096),
        }];
        assert!(
            matches!(attempt("ns", &ledger, &pods, &q, &res("c", 4096, 9_000), 100, &|_| false), Attempt::Exceeded(e) if e.used == 8192)
        );
        assert_eq!(
            attempt(
                "ns",
                &ledger,
                &pods,
                &q,
                &res("a", 4096, 9_000),
                100,
                &|_| false
            ),
            Attempt::AlreadyReserved
        );
    }

    #[test]
    fn a_reservation_ends_when_its_pod_has_existed_even_once_it_is_gone() {
        let ledger = Ledger {
            reservations: vec![res("a", 8192, 9_000)],
            confirmed: Vec::new(),
        };
        let q = quotas(8192);
        // Pod "a" not seen yet: its reservation holds the whole quota.
        assert!(matches!(
            attempt("ns", &ledger, &[], &q, &res("c", 4096, 9_000), 100, &|_| {
                false
            }),
            Attempt::Exceeded(_)
        ));
        // Seen and already deleted (not in the cache any more): nothing counts.
        assert!(matches!(
            attempt("ns", &ledger, &[], &q, &res("c", 4096, 9_000), 100, &|u| u
                == "a"),
            Attempt::Write(_)
        ));
        // Another pod holds its name: this creation failed, only that pod counts.
        let other = [CachedPod {
            name: "pod-a".into(),
            uid: "z".into(),
            usage: usage(1024),
        }];
        assert!(matches!(
            attempt(
                "ns",
                &ledger,
                &other,
                &q,
                &res("c", 4096, 9_000),
                100,
                &|_| false
            ),
            Attempt::Write(_)
        ));
    }

    /// Replica A caches the pod of a reservation and shortens it to the grace; replica B's pod
    /// watch lags more than the grace. Without the confirmed list B would count neither the pod
    /// nor its reservation and admit past the quota (the `Write` this test refused before the
    /// fix); with it B finds its cache behind, and from a fresh LIST it counts the pod.
    #[test]
    fn a_replica_whose_cache_lags_past_the_grace_does_not_undercount() {
        let q = quotas(8192);
        let p = res("p", 8192, 60_000);
        let ledger = Ledger {
            reservations: vec![p.clone()],
            confirmed: Vec::new(),
        };
        let cached = [CachedPod {
            name: "p".into(),
            uid: "p".into(),
            usage: p.usage.clone(),
        }];
        // A: the pod is cached; its reservation is shortened and the pod noted as confirmed.
        let Attempt::Exceeded(_) =
            attempt("ns", &ledger, &cached, &q, &res("x", 1, 60_000), 0, &|_| {
                false
            })
        else {
            panic!("A: the quota is full");
        };
        let small = quotas(16384);
        let Attempt::Write(after_a) = attempt(
            "ns",
            &ledger,
            &cached,
            &small,
            &res("a2", 1, 60_000),
            0,
            &|_| false,
        ) else {
            panic!("A: room for a2");
        };
        assert_eq!(after_a.reservations[0].expires_ms, CONFIRMED_GRACE_MS);
        assert_eq!(
            after_a.confirmed,
            vec![Confirmed {
                uid: "p".into(),
                until_ms: 60_000
            }]
        );
        // B, past the grace, its cache without p: behind, not a write.
        let later = CONFIRMED_GRACE_MS + 1_000;
        let b = attempt(
            "ns",
            &after_a,
            &[],
            &q,
            &res("b", 4096, 90_000),
            later,
            &|_| false,
        );
        assert!(matches!(b, Attempt::CacheBehind), "{b:?}");
        // B from a fresh LIST (p in it, confirmed pods counted as seen): p counts.
        let b = attempt(
            "ns",
            &after_a,
            &cached,
            &q,
            &res("b", 4096, 90_000),
            later,
            &|u| u == "p",
        );
        assert!(matches!(b, Attempt::Exceeded(_)), "{b:?}");
        // Once the reservation's own expiry has passed, the confirmation is dropped too.
        let Attempt::Write(end) = attempt(
            "ns",
            &after_a,
            &cached,
            &small,
            &res("c", 1, 90_000),
            60_001,
            &|u| u == "p",
        ) else {
            panic!("room for c");
        };
        assert!(end.confirmed.is_empty(), "{:?}", end.confirmed);
    }

    #[test]
    fn ledger_round_trips_and_tolerates_garbage() {
        let l = Ledger {
            reservations: vec![res("a", 1, 2)],
            confirmed: Vec::new(),
        };
        let cm = json!({"data": l.to_data()});
        assert_eq!(Ledger::from_configmap(&cm), l);
        assert_eq!(
            Ledger::from_configmap(&json!({"data": {DATA_KEY: "{"}})),
            Ledger::default()
        );
        assert_eq!(ledger_name("team-a"), "vgpu-quota-team-a");
    }
}
