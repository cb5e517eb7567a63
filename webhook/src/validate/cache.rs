//! The webhook's view of the cluster: ResourceQuotas with vGPU keys, vGPU pods (by the label the
//! mutating webhook stamps) reduced to what quota needs, the largest card of the node inventory,
//! and in DRA mode the ResourceClaims of class `gpu.vgpu.io` (each counted like a pod: the quota
//! counts what a namespace's pods and claims hold together).
//!
//! Each is a [`Feed`] of the services' one watch loop ([`vgpu_serve::watch`]: a kube-runtime
//! watcher, LIST, then WATCH from its resourceVersion, re-LIST on 410 Gone), whose
//! `Init … InitDone` sequence replaces the cached set atomically. A watcher error
//! after the cache was complete marks it *unsynced* and restarts the watcher, so the cache is
//! rebuilt from a fresh LIST, as client-go's reflector re-lists after a failed watch: kube-runtime
//! re-watches from its last version without telling when that succeeded, so only a new
//! `InitDone` says the cache is whole again. Meanwhile decisions never rest on a cache that may
//! have missed events: the validator LISTs the namespace afresh. A clean end of a watch (the server's
//! timeout, or a connection cut mid-stream, which kube-rs reads as a resumable end) is no error:
//! the watcher re-watches from its version and misses nothing.

use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::runtime::watcher;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use vgpu_core::annotations::{MANAGED_SELECTOR, NODE_DEVICES};
use vgpu_core::inventory::NodeInventory;
use vgpu_core::request::RequestPolicy;
use vgpu_serve::watch::{watch_forever, Feed};

use super::quota::Quota;
use super::usage::{is_terminal, pod_usage, CachedPod};

/// Per-namespace maps, swapped whole at the end of a LIST.
type ByNamespace<T> = HashMap<String, Vec<T>>;

/// What the watchers keep. Cheap to share (`Arc`).
#[derive(Debug, Default)]
pub struct ClusterCache {
    quotas: RwLock<ByNamespace<Quota>>,
    pods: RwLock<ByNamespace<CachedPod>>,
    /// DRA mode's claims of class `gpu.vgpu.io`, as what they hold (`name` is
    /// `resourceclaim/<name>`, which no pod name can be).
    claims: RwLock<ByNamespace<CachedPod>>,
    /// DRA mode's published GPUs, by ResourceSlice name.
    slices: RwLock<HashMap<String, Vec<vgpu_core::dra::Card>>>,
    /// Largest card per node, MiB.
    cards: RwLock<HashMap<String, u64>>,
    quotas_synced: AtomicBool,
    pods_synced: AtomicBool,
    nodes_synced: AtomicBool,
    claims_synced: AtomicBool,
    slices_synced: AtomicBool,
    /// Whether claims are watched (DRA mode).
    dra: AtomicBool,
    /// Per cache, since when it has been unsynced after having been complete, and the last error.
    trouble: Mutex<HashMap<&'static str, Trouble>>,
    /// Every vGPU pod uid the pod watch has delivered, with when it was first seen: a quota
    /// reservation is over once its pod has existed, even after the pod is gone again.
    seen: Mutex<Seen>,
}

/// Uids of pods that have existed, kept for as long as a reservation can count.
#[derive(Debug)]
struct Seen {
    first_ms: HashMap<String, u64>,
    retention_ms: u64,
    pruned_ms: u64,
}

impl Default for Seen {
    fn default() -> Self {
        Seen {
            first_ms: HashMap::new(),
            // The longest --reservation-ttl; the validator sets its own.
            retention_ms: 3_600_000,
            pruned_ms: 0,
        }
    }
}

/// A watch that failed after its cache was complete.
#[derive(Debug, Clone)]
struct Trouble {
    since: Instant,
    error: String,
}

impl ClusterCache {
    /// Whether every cache holds a complete LIST (readiness).
    pub fn synced(&self) -> bool {
        self.sync_states().iter().all(|(_, synced)| *synced)
    }

    /// Each cache by name (`resourcequotas`, `pods`, `nodes`, in DRA mode `resourceclaims`) and
    /// whether it holds a complete LIST and its watch is healthy: `/readyz`'s clauses and the
    /// `vgpu_webhook_cache_synced` gauge.
    pub fn sync_states(&self) -> Vec<(&'static str, bool)> {
        let mut caches = vec![
            ("resourcequotas", &self.quotas_synced),
            ("pods", &self.pods_synced),
            ("nodes", &self.nodes_synced),
        ];
        if self.dra.load(Ordering::Acquire) {
            caches.push(("resourceclaims", &self.claims_synced));
            caches.push(("resourceslices", &self.slices_synced));
        }
        caches
            .into_iter()
            .map(|(what, synced)| (what, synced.load(Ordering::Acquire)))
            .collect()
    }

    /// Why the caches are not all complete, for `/readyz`: one clause per cache that is not, e.g.
    /// `pods: watch failing for 12 s (last error: ...)` or `nodes: initial list not complete`.
    /// `None` when [`Self::synced`].
    pub fn unsynced_reason(&self) -> Option<String> {
        let trouble = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        let clauses: Vec<String> = self
            .sync_states()
            .into_iter()
            .filter(|(_, synced)| !synced)
            .map(|(what, _)| match trouble.get(what) {
                Some(t) => format!(
                    "{what}: watch failing for {} s, re-listing (last error: {})",
                    t.since.elapsed().as_secs(),
                    t.error
                ),
                None => format!("{what}: initial list not complete"),
            })
            .collect();
        (!clauses.is_empty()).then(|| clauses.join("; "))
    }

    fn note_trouble(&self, what: &'static str, error: String) {
        let mut t = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        match t.get_mut(what) {
            Some(old) => old.error = error,
            None => {
                t.insert(
                    what,
                    Trouble {
                        since: Instant::now(),
                        error,
                    },
                );
            }
        }
    }

    fn trouble_known(&self, what: &'static str) -> bool {
        let t = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        t.contains_key(what)
    }

    fn clear_trouble(&self, what: &'static str) {
        let mut t = self.trouble.lock().unwrap_or_else(|p| p.into_inner());
        t.remove(what);
    }

    /// Whether the quota cache is complete.
    pub fn quotas_synced(&self) -> bool {
        self.quotas_synced.load(Ordering::Acquire)
    }

    /// Whether the pod cache (and in DRA mode the claim cache) is complete.
    pub fn pods_synced(&self) -> bool {
        self.pods_synced.load(Ordering::Acquire)
            && (!self.dra.load(Ordering::Acquire) || self.claims_synced.load(Ordering::Acquire))
    }

    /// Whether claims are counted (DRA mode).
    pub fn dra(&self) -> bool {
        self.dra.load(Ordering::Acquire)
    }

    /// The vGPU quotas of a namespace (possibly stale if not [`Self::quotas_synced`]).
    pub fn quotas(&self, namespace: &str) -> Vec<Quota> {
        read(&self.quotas)
            .get(namespace)
            .cloned()
            .unwrap_or_default()
    }

    /// Every namespace's vGPU quotas.
    pub fn all_quotas(&self) -> Vec<Quota> {
        read(&self.quotas).values().flatten().cloned().collect()
    }

    /// The non-terminal vGPU pods of a namespace, then its claims of class `gpu.vgpu.io`.
    pub fn pods(&self, namespace: &str) -> Vec<CachedPod> {
        let mut out = read(&self.pods).get(namespace).cloned().unwrap_or_default();
        out.extend(
            read(&self.claims)
                .get(namespace)
                .into_iter()
                .flatten()
                .cloned(),
        );
        out
    }

    /// Calls `f` with what [`Self::pods`] returns, without copying the pods when the namespace
    /// has no claims.
    pub fn with_pods<R>(&self, namespace: &str, f: impl FnOnce(&[CachedPod]) -> R) -> R {
        let claims = read(&self.claims);
        let guard = read(&self.pods);
        let pods = guard.get(namespace).map(Vec::as_slice).unwrap_or_default();
        match claims.get(namespace) {
            None => f(pods),
            Some(c) => f(&[pods, c.as_slice()].concat()),
        }
    }

    /// The largest card any node reports, MiB; None when no inventory is known.
    pub fn largest_card_mib(&self) -> Option<u64> {
        read(&self.cards).values().copied().max()
    }

    /// Whether a vGPU pod with this uid has been in the cache (it may be gone again): its quota
    /// reservation has done its job.
    pub fn was_seen(&self, uid: &str) -> bool {
        !uid.is_empty()
            && self
                .seen
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .first_ms
                .contains_key(uid)
    }

    /// Keeps seen uids this long (at least the reservation TTL: a reservation can only refer to a
    /// pod created after it, and stops counting when it expires).
    pub fn keep_seen_for(&self, d: Duration) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retention_ms = d.as_millis() as u64;
    }

    /// Records pods (uids) as seen now.
    pub fn note_seen<'u>(&self, uids: impl IntoIterator<Item = &'u str>) {
        let now = super::ledger::now_ms();
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        for uid in uids.into_iter().filter(|u| !u.is_empty()) {
            if !seen.first_ms.contains_key(uid) {
                seen.first_ms.insert(uid.to_string(), now);
            }
        }
        // Prune at most once a minute: a full pass over the map.
        if now.saturating_sub(seen.pruned_ms) > 60_000 {
            let horizon = now.saturating_sub(seen.retention_ms);
            seen.first_ms.retain(|_, t| *t >= horizon);
            seen.pruned_ms = now;
        }
    }

    /// Replaces the quotas (tests and benchmarks load the cache without an API server).
    pub fn load_quotas(&self, quotas: impl IntoIterator<Item = Quota>) {
        let mut map: ByNamespace<Quota> = HashMap::new();
        for q in quotas {
            map.entry(q.namespace.clone()).or_default().push(q);
        }
        *write(&self.quotas) = map;
        self.quotas_synced.store(true, Ordering::Release);
    }

    /// Replaces the pods, as (namespace, pod).
    pub fn load_pods(&self, pods: impl IntoIterator<Item = (String, CachedPod)>) {
        let mut map: ByNamespace<CachedPod> = HashMap::new();
        for (ns, p) in pods {
            self.note_seen([p.uid.as_str()]);
            map.entry(ns).or_default().push(p);
        }
        *write(&self.pods) = map;
        self.pods_synced.store(true, Ordering::Release);
    }

    /// The GPUs of class `gpu.vgpu.io` the ResourceSlices publish; `None` until the slice watch
    /// holds a complete LIST (DRA mode only).
    pub fn published_cards(&self) -> Option<Vec<vgpu_core::dra::Card>> {
        self.slices_synced
            .load(Ordering::Acquire)
            .then(|| read(&self.slices).values().flatten().cloned().collect())
    }

    /// The published GPUs of class `gpu.vgpu.io`: the slice watch's when it is whole (a LIST of
    /// every slice per admission does not scale), else a LIST through `client` (2 s at most).
    /// `Err` names what could not be read.
    pub async fn published_cards_or_list(
        &self,
        client: &kube::Client,
    ) -> Result<Vec<vgpu_core::dra::Card>, String> {
        if let Some(cards) = self.published_cards() {
            return Ok(cards);
        }
        let api: Api<k8s_openapi::api::resource::v1::ResourceSlice> = Api::all(client.clone());
        let lp = ListParams::default().fields(&format!("spec.driver={}", vgpu_core::dra::CLASS));
        match tokio::time::timeout(Duration::from_secs(2), api.list(&lp)).await {
            Ok(Ok(list)) => {
                let slices: Vec<Value> = list
                    .items
                    .iter()
                    .filter_map(|s| serde_json::to_value(s).ok())
                    .collect();
                Ok(vgpu_core::dra::cards(&slices))
            }
            Ok(Err(e)) => Err(format!("listing ResourceSlices: {e}")),
            Err(_) => {
                Err("listing ResourceSlices: the Kubernetes API did not answer within 2 s".into())
            }
        }
    }

    /// Remembers the largest GPU the DRA plugins publish (MiB), beside the node inventory's.
    pub fn note_largest_published_card(&self, mib: u64) {
        write(&self.cards).insert(" ResourceSlices".to_string(), mib);
    }

    /// Replaces the claims, as (namespace, claim), and turns DRA mode on.
    pub fn load_claims(&self, claims: impl IntoIterator<Item = (String, CachedPod)>) {
        let mut map: ByNamespace<CachedPod> = HashMap::new();
        for (ns, c) in claims {
            self.note_seen([c.uid.as_str()]);
            map.entry(ns).or_default().push(c);
        }
        *write(&self.claims) = map;
        self.dra.store(true, Ordering::Release);
        self.claims_synced.store(true, Ordering::Release);
    }

    /// Replaces the node inventory, as (node, largest card MiB).
    pub fn load_cards(&self, cards: impl IntoIterator<Item = (String, u64)>) {
        *write(&self.cards) = cards.into_iter().collect();
        self.nodes_synced.store(true, Ordering::Release);
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A writer that panicked left a complete map behind (writes are single assignments).
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// The core/v1 resources the webhook reads.
pub fn api_resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The object as JSON (metadata and body together).
pub fn to_value(o: &DynamicObject) -> Value {
    let mut v = o.data.clone();
    if let (Some(m), Ok(meta)) = (v.as_object_mut(), serde_json::to_value(&o.metadata)) {
        m.insert("metadata".into(), meta);
    }
    v
}

/// Reduces a pod object to its cache entry; None for terminal or non-vGPU pods.
pub fn cached_pod(pod: &Value, policy: &RequestPolicy, largest_card_mib: u64) -> Option<CachedPod> {
    if is_terminal(pod) {
        return None;
    }
    let usage = pod_usage(pod, policy, largest_card_mib).ok()?;
    if !usage.is_vgpu() {
        return None;
    }
    let s = |p: &str| {
        pod.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some(CachedPod {
        name: s("/metadata/name"),
        uid: s("/metadata/uid"),
        usage,
    })
}

/// The cache entry's name for a claim: `resourceclaim/<name>`.
pub fn claim_key(name: &str) -> String {
    format!("resourceclaim/{name}")
}

/// Reduces a ResourceClaim to its cache entry; None when it asks nothing of class `gpu.vgpu.io`.
pub fn cached_claim(claim: &Value, largest_card_mib: u64) -> Option<CachedPod> {
    let usage = super::usage::claim_usage(claim, largest_card_mib)?;
    let s = |p: &str| {
        claim
            .pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some(CachedPod {
        name: claim_key(&s("/metadata/name")),
        uid: s("/metadata/uid"),
        usage,
    })
}

/// Largest card in a node's inventory annotation, MiB.
pub fn node_largest_card(node: &Value) -> Option<u64> {
    let text = node
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(NODE_DEVICES))
        .and_then(Value::as_str)?;
    let inv = NodeInventory::decode(text).ok()?;
    inv.devices.iter().map(|d| d.memory_mib).max()
}

/// Told where room for a refused pod may have appeared: the namespace of a quota that changed or
/// of a vGPU pod or claim that went away; `None` after a watch listed afresh (anywhere).
pub type OnRoom = Arc<dyn Fn(Option<&str>) + Send + Sync>;

/// Starts the watchers on the runtime (with `dra`, the claims' too); they run until the process
/// ends.
pub fn spawn_watchers(
    client: kube::Client,
    cache: Arc<ClusterCache>,
    policy: RequestPolicy,
    dra: bool,
    room: OnRoom,
) {
    if dra {
        cache.dra.store(true, Ordering::Release);
        let slices: Api<DynamicObject> = Api::all_with(client.clone(), &slices_resource());
        let c = cache.clone();
        tokio::spawn(run_watcher(
            slices,
            watcher::Config::default().fields(&format!("spec.driver={}", vgpu_core::dra::CLASS)),
            "resourceslices",
            move |change| {
                let cards = |v: &Value| vgpu_core::dra::cards(std::slice::from_ref(v));
                let mut map = write(&c.slices);
                match change {
                    Change::Replace(all) => {
                        *map = all
                            .iter()
                            .map(|((_, name), v)| (name.clone(), cards(v)))
                            .collect();
                    }
                    Change::Apply((_, name), v) => {
                        map.insert(name.clone(), cards(v));
                    }
                    Change::Delete((_, name)) => {
                        map.remove(name);
                    }
                }
                let largest = map
                    .values()
                    .flatten()
                    .map(|c| c.memory.div_ceil(1 << 20))
                    .max();
                drop(map);
                if let Some(mib) = largest {
                    c.note_largest_published_card(mib);
                }
            },
            cache.clone(),
            |c, v| c.slices_synced.store(v, Ordering::Release),
        ));
        let claims: Api<DynamicObject> = Api::all_with(client.clone(), &claims_resource());
        let c = cache.clone();
        let on_room = room.clone();
        tokio::spawn(run_watcher(
            claims,
            watcher::Config::default(),
            "resourceclaims",
            move |change| {
                let largest = c.largest_card_mib().unwrap_or(0);
                apply_namespaced(
                    &c.claims,
                    change,
                    &|v| cached_claim(v, largest),
                    |p: &CachedPod| p.name.strip_prefix("resourceclaim/").unwrap_or(&p.name),
                );
                note_uids(&c, change);
                if let Change::Delete((ns, _)) = change {
                    on_room(Some(ns));
                }
            },
            cache.clone(),
            |c, v| c.claims_synced.store(v, Ordering::Release),
        ));
    }
    let names = policy.names.clone();
    let quotas: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &api_resource("ResourceQuota", "resourcequotas"),
    );
    let c = cache.clone();
    let on_room = room.clone();
    let reduce_quota = move |v: &Value| {
        let q = Quota::from_object(v, &names)?;
        if let Some(why) = &q.unsupported {
            tracing::warn!(namespace = %q.namespace, quota = %q.name, reason = %why,
                "ResourceQuota not evaluated by vgpu");
        }
        Some(q)
    };
    tokio::spawn(run_watcher(
        quotas,
        watcher::Config::default(),
        "resourcequotas",
        move |change| {
            apply_namespaced(&c.quotas, change, &reduce_quota, |q: &Quota| {
                q.name.as_str()
            });
            // Any change: a raised or deleted quota, or its status recounted after pods left.
            on_room(match change {
                Change::Replace(_) => None,
                Change::Apply((ns, _), _) | Change::Delete((ns, _)) => Some(ns),
            });
        },
        cache.clone(),
        |c, v| c.quotas_synced.store(v, Ordering::Release),
    ));

    let pods: Api<DynamicObject> = Api::all_with(client.clone(), &api_resource("Pod", "pods"));
    let c = cache.clone();
    let cfg = watcher::Config::default().labels(MANAGED_SELECTOR);
    tokio::spawn(run_watcher(
        pods,
        cfg,
        "pods",
        move |change| {
            let largest = c.largest_card_mib().unwrap_or(0);
            apply_namespaced(
                &c.pods,
                change,
                &|v| cached_pod(v, &policy, largest),
                |p: &CachedPod| p.name.as_str(),
            );
            note_uids(&c, change);
            match change {
                Change::Replace(_) => room(None),
                Change::Delete((ns, _)) => room(Some(ns)),
                Change::Apply((ns, _), v) if super::usage::is_terminal(v) => room(Some(ns)),
                Change::Apply(..) => {}
            }
        },
        cache.clone(),
        |c, v| c.pods_synced.store(v, Ordering::Release),
    ));

    let nodes: Api<DynamicObject> = Api::all_with(client, &api_resource("Node", "nodes"));
    let c = cache.clone();
    tokio::spawn(run_watcher(
        nodes,
        watcher::Config::default(),
        "nodes",
        move |change| {
            let mut cards = write(&c.cards);
            match change {
                Change::Replace(all) => {
                    *cards = all
                        .iter()
                        .filter_map(|((_, name), v)| {
                            node_largest_card(v).map(|m| (name.clone(), m))
                        })
                        .collect()
                }
                Change::Apply((_, name), v) => match node_largest_card(v) {
                    Some(m) => {
                        cards.insert(name.clone(), m);
                    }
                    None => {
                        cards.remove(name);
                    }
                },
                Change::Delete((_, name)) => {
                    cards.remove(name);
                }
            }
        },
        cache,
        |c, v| c.nodes_synced.store(v, Ordering::Release),
    ));
}

/// After a change is applied: a uid seen is an object the cache holds (or held), so a decision
/// that finds its reservation done finds the object in its snapshot.
fn note_uids(cache: &ClusterCache, change: Change<'_>) {
    fn uid(v: &Value) -> Option<&str> {
        v.pointer("/metadata/uid").and_then(Value::as_str)
    }
    match change {
        Change::Replace(all) => cache.note_seen(all.iter().filter_map(|(_, v)| uid(v))),
        Change::Apply(_, v) => cache.note_seen(uid(v)),
        Change::Delete(_) => {}
    }
}

/// `resource.k8s.io/v1` ResourceSlices.
fn slices_resource() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceSlice".into(),
        plural: "resourceslices".into(),
    }
}

/// `resource.k8s.io/v1` ResourceClaims.
fn claims_resource() -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: "ResourceClaim".into(),
        plural: "resourceclaims".into(),
    }
}

/// (namespace, name).
type Key = (String, String);

/// What a watcher saw.
#[derive(Clone, Copy)]
enum Change<'a> {
    /// A complete LIST: everything else is gone.
    Replace(&'a [(Key, Value)]),
    /// One object added or modified.
    Apply(&'a Key, &'a Value),
    /// One object deleted.
    Delete(&'a Key),
}

/// Applies a change to a per-namespace cache, reducing objects with `reduce` (None: not kept).
fn apply_namespaced<T>(
    map: &RwLock<ByNamespace<T>>,
    change: Change<'_>,
    reduce: &dyn Fn(&Value) -> Option<T>,
    name_of: fn(&T) -> &str,
) {
    match change {
        Change::Replace(all) => {
            let mut fresh: ByNamespace<T> = HashMap::new();
            for ((ns, _), v) in all {
                if let Some(t) = reduce(v) {
                    fresh.entry(ns.clone()).or_default().push(t);
                }
            }
            *write(map) = fresh;
        }
        Change::Apply((ns, name), v) => {
            let reduced = reduce(v);
            let mut guard = write(map);
            let list = guard.entry(ns.clone()).or_default();
            list.retain(|t| name_of(t) != name);
            list.extend(reduced);
            if list.is_empty() {
                guard.remove(ns);
            }
        }
        Change::Delete((ns, name)) => {
            let mut guard = write(map);
            if let Some(list) = guard.get_mut(ns) {
                list.retain(|t| name_of(t) != name);
                if list.is_empty() {
                    guard.remove(ns);
                }
            }
        }
    }
}

/// Runs one watcher forever, handing each change to `apply`. Objects are not kept here: `apply`
/// reduces them to the few fields a decision reads, which keeps 20 000 pods small.
async fn run_watcher(
    api: Api<DynamicObject>,
    config: watcher::Config,
    what: &'static str,
    apply: impl Fn(Change<'_>) + Send + 'static,
    cache: Arc<ClusterCache>,
    set_synced: fn(&ClusterCache, bool),
) {
    let feed = Changes {
        what,
        apply,
        cache,
        set_synced,
        pending: Vec::new(),
    };
    watch_forever(api, config, what, feed).await
}

/// A cache's feed: each object slimmed at once (the full object is dropped before the next page
/// of a LIST arrives), a LIST handed over whole as [`Change::Replace`].
struct Changes<F> {
    what: &'static str,
    apply: F,
    cache: Arc<ClusterCache>,
    set_synced: fn(&ClusterCache, bool),
    pending: Vec<(Key, Value)>,
}

fn key(o: &DynamicObject) -> Key {
    (
        o.metadata.namespace.clone().unwrap_or_default(),
        o.metadata.name.clone().unwrap_or_default(),
    )
}

impl<F: Fn(Change<'_>) + Send> Feed<DynamicObject> for Changes<F> {
    fn relist(&mut self) {
        self.pending.clear();
    }
    fn listed(&mut self, o: DynamicObject) {
        self.pending.push((key(&o), slim(to_value(&o))));
    }
    fn synced(&mut self) {
        let all = std::mem::take(&mut self.pending);
        (self.apply)(Change::Replace(&all));
        (self.set_synced)(&self.cache, true);
        self.cache.clear_trouble(self.what);
    }
    fn applied(&mut self, o: DynamicObject) {
        (self.apply)(Change::Apply(&key(&o), &slim(to_value(&o))));
    }
    fn deleted(&mut self, o: DynamicObject) {
        (self.apply)(Change::Delete(&key(&o)));
    }
    fn failed(&mut self, error: &watcher::Error, complete: bool) {
        if complete {
            // Events may have been missed: decisions LIST afresh until the next complete LIST.
            (self.set_synced)(&self.cache, false);
            self.cache.note_trouble(self.what, error.to_string());
        } else if self.cache.trouble_known(self.what) {
            // The LIST (or the first watch) failed: kube-runtime retries it with backoff.
            self.cache.note_trouble(self.what, error.to_string());
        }
    }
}

/// Keeps only what a decision reads, so 20 000 pods (and the initial LIST's buffer) stay small:
/// name, namespace, uid and vgpu's own annotations; the quota's `hard` and scopes; the containers'
/// names and resources and the two scope fields of a pod spec; the phase; a claim's requests and
/// allocation; a ResourceSlice's driver, node, pool and devices.
fn slim(v: Value) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(m) = v.get("metadata").and_then(Value::as_object) {
        let mut meta = serde_json::Map::new();
        for k in ["name", "namespace", "uid"] {
            if let Some(x) = m.get(k) {
                meta.insert(k.into(), x.clone());
            }
        }
        if let Some(a) = m.get("annotations").and_then(Value::as_object) {
            let ours: serde_json::Map<String, Value> = a
                .iter()
                .filter(|(k, _)| k.starts_with("vgpu.io/"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            meta.insert("annotations".into(), Value::Object(ours));
        }
        out.insert("metadata".into(), Value::Object(meta));
    }
    if let Some(spec) = v.get("spec").and_then(Value::as_object) {
        let mut keep = serde_json::Map::new();
        for k in [
            "hard",
            "scopes",
            "scopeSelector",
            "activeDeadlineSeconds",
            "priorityClassName",
            "devices",
        ] {
            if let Some(x) = spec.get(k) {
                keep.insert(k.into(), x.clone());
            }
        }
        // A ResourceSlice: where its GPUs are.
        if spec.contains_key("driver") {
            for k in ["driver", "nodeName", "pool"] {
                if let Some(x) = spec.get(k) {
                    keep.insert(k.into(), x.clone());
                }
            }
        }
        for k in ["containers", "initContainers"] {
            if let Some(list) = spec.get(k).and_then(Value::as_array) {
                let slim_list = list
                    .iter()
                    .map(|c| {
                        let mut sc = serde_json::Map::new();
                        for f in ["name", "resources"] {
                            if let Some(x) = c.get(f) {
                                sc.insert(f.into(), x.clone());
                            }
                        }
                        Value::Object(sc)
                    })
                    .collect();
                keep.insert(k.into(), Value::Array(slim_list));
            }
        }
        out.insert("spec".into(), Value::Object(keep));
    }
    if let Some(phase) = v.pointer("/status/phase") {
        out.insert("status".into(), serde_json::json!({ "phase": phase }));
    }
    if let Some(allocation) = v.pointer("/status/allocation") {
        out.insert(
            "status".into(),
            serde_json::json!({ "allocation": allocation }),
        );
    }
    Value::Object(out)
}

/// LISTs a namespace's vGPU pods (with `dra`, then its claims) afresh (used when the pod or
/// claim cache is not synced).
pub async fn list_pods(
    client: &kube::Client,
    namespace: &str,
    policy: &RequestPolicy,
    largest_card_mib: u64,
    dra: bool,
) -> Result<Vec<CachedPod>, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), namespace, &api_resource("Pod", "pods"));
    let list = api
        .list(&ListParams::default().labels(MANAGED_SELECTOR))
        .await?;
    let mut out: Vec<CachedPod> = list
        .items
        .iter()
        .filter_map(|o| cached_pod(&to_value(o), policy, largest_card_mib))
        .collect();
    if dra {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), namespace, &claims_resource());
        let list = api.list(&ListParams::default()).await?;
        out.extend(
            list.items
                .iter()
                .filter_map(|o| cached_claim(&to_value(o), largest_card_mib)),
        );
    }
    Ok(out)
}

/// LISTs a namespace's quotas afresh (used when the quota cache is not synced).
pub async fn list_quotas(
    client: &kube::Client,
    namespace: &str,
    policy: &RequestPolicy,
) -> Result<Vec<Quota>, kube::Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        namespace,
        &api_resource("ResourceQuota", "resourcequotas"),
    );
    let list = api.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .filter_map(|o| Quota::from_object(&to_value(o), &policy.names))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn unsynced_reason_names_each_incomplete_cache() {
        let c = ClusterCache::default();
        assert_eq!(
            c.unsynced_reason().as_deref(),
            Some("resourcequotas: initial list not complete; pods: initial list not complete; nodes: initial list not complete")
        );
        c.load_quotas([]);
        c.load_pods([]);
        c.load_cards([]);
        assert!(c.synced());
        assert_eq!(c.unsynced_reason(), None);
        c.pods_synced.store(false, Ordering::Release);
        c.note_trouble("pods", "connection refused".into());
        assert_eq!(
            c.unsynced_reason().as_deref(),
            Some("pods: watch failing for 0 s, re-listing (last error: connection refused)")
        );
        c.clear_trouble("pods");
        c.pods_synced.store(true, Ordering::Release);
        assert_eq!(c.unsynced_reason(), None);
    }

    #[test]
    fn slim_keeps_what_decisions_read() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"a": "b"},
            "managedFields": [{"x": 1}], "annotations": {"vgpu.io/assignment": "{}", "other": "x"}},
            "spec": {"priorityClassName": "high", "nodeName": "n", "containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}, "env": [{"name": "A"}]}]},
            "status": {"phase": "Running", "conditions": []}});
        assert_eq!(
            slim(pod),
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {"vgpu.io/assignment": "{}"}},
                "spec": {"priorityClassName": "high", "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
                "status": {"phase": "Running"}})
        );
        let quota = json!({"metadata": {"name": "q"}, "spec": {"hard": {"nvidia.com/gpu": "1"}, "scopes": ["BestEffort"]}});
        assert_eq!(slim(quota.clone()), quota);
        let slice = json!({"metadata": {"name": "vm-gpu.vgpu.io"}, "spec": {"driver": "gpu.vgpu.io",
            "nodeName": "vm", "pool": {"name": "vm", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "capacity": {"memory": {"value": "24Gi"}}}]}});
        assert_eq!(slim(slice.clone()), slice);
        assert_eq!(vgpu_core::dra::cards(&[slim(slice)])[0].node, "vm");
    }
}
