//! The extender's HTTP side: `POST /filter`, `/prioritize`, `/bind` for kube-scheduler (on the
//! localhost listener) and `GET /healthz`, `/readyz`, `/metrics` (on the metrics listener).
//!
//! A body that is not extender JSON is a client mistake: 400 with the reason, never a panic or 500.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::exposition;
use vgpu_core::placement::frag::LiveFrag;
use vgpu_core::placement::{PlaceBuf, PodRequest, Policy, Standing};
use vgpu_core::request::RequestPolicy;

use crate::cache::{Cluster, FailMemo, StandingMemo};
use crate::extender::{
    node_name, push_json_str, push_u32, ArgsView, ExtenderArgs, ExtenderBindingArgs,
    ExtenderBindingResult, ExtenderFilterResult, HostPriority, HostPriorityList, Name, NodeList,
    PodView,
};
use crate::metrics::Metrics;
use crate::pod;
use crate::readiness::Readiness;

/// How the extender decides.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Node policy for pods that choose none.
    pub node_policy: Policy,
    /// GPU policy for pods that choose none.
    pub gpu_policy: Policy,
    /// Resource names and defaults.
    pub request_policy: RequestPolicy,
    /// Nodes with an older device-plugin heartbeat are left out.
    pub heartbeat_timeout: Duration,
    /// An assumed pod not seen back from the API in this time is forgotten.
    pub assume_ttl: Duration,
    /// The kube-scheduler profile this extender serves (for logs).
    pub scheduler_name: String,
    /// The `fragmentation` and `gap-aware` policies' typical pods from a file; `None`: from the
    /// placed pods.
    pub typical_pods: Option<LiveFrag>,
    /// Filter passes only the best node for a vGPU pod (highest score, then the smallest name),
    /// so the pod's policy decides where it goes, as in HAMi and the simulator; `false` passes
    /// every node that fits and leaves the choice to kube-scheduler's scores and random ties.
    pub choose_node: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            node_policy: Policy::Binpack,
            gpu_policy: Policy::Spread,
            request_policy: RequestPolicy::default(),
            heartbeat_timeout: Duration::from_secs(120),
            assume_ttl: Duration::from_secs(300),
            scheduler_name: "vgpu-scheduler".into(),
            typical_pods: None,
            choose_node: true,
        }
    }
}

/// Keeps only the best of the passing nodes: the highest rank (`gap-aware`'s unclamped step,
/// else the score), ties to the smallest name (the simulator's and the published FGD
/// simulator's rule; kube-scheduler's own tie-break is random, which spreads pods that a packing
/// policy scores alike).
fn keep_best(passed: &mut Vec<&str>, scores: &mut Vec<u32>, ranks: &[i64]) {
    let best = (0..passed.len()).reduce(|b, i| {
        if ranks[i] > ranks[b] || (ranks[i] == ranks[b] && passed[i] < passed[b]) {
            i
        } else {
            b
        }
    });
    if let Some(b) = best {
        passed.swap(0, b);
        scores.swap(0, b);
        passed.truncate(1);
        scores.truncate(1);
    }
}

/// Scores kept between a pod's filter and its prioritize call.
const SCORE_CACHE_PODS: usize = 256;

/// A filter's scores, kept for the prioritize call of the same pod: valid for the same request,
/// the same candidate names in the same order, and the same cluster generation.
struct Memo {
    request: PodRequest,
    generation: u64,
    /// The passing names, concatenated; `ends[i]` is where name `i` ends.
    names: String,
    ends: Vec<u32>,
    scores: Vec<u32>,
}

impl Memo {
    fn new(request: PodRequest, generation: u64, passed: &[&str], scores: Vec<u32>) -> Memo {
        let mut names = String::with_capacity(passed.iter().map(|n| n.len()).sum());
        let mut ends = Vec::with_capacity(passed.len());
        for n in passed {
            names.push_str(n);
            ends.push(names.len() as u32);
        }
        Memo {
            request,
            generation,
            names,
            ends,
            scores,
        }
    }

    fn matches(&self, request: &PodRequest, generation: u64, names: &[&str]) -> bool {
        if self.generation != generation
            || self.ends.len() != names.len()
            || self.request != *request
        {
            return false;
        }
        let mut at = 0usize;
        names.iter().zip(&self.ends).all(|(n, &end)| {
            let ok = self.names.get(at..end as usize) == Some(*n);
            at = end as usize;
            ok
        })
    }
}

/// A JSON answer of the filter or prioritize verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The body.
    pub body: Vec<u8>,
    /// Whether it reports an error of the call (`error` set).
    pub error: bool,
}

/// Everything the handlers share.
pub struct AppState {
    /// What the extender knows.
    pub cluster: RwLock<Cluster>,
    /// How it decides.
    pub settings: Settings,
    /// Its metrics.
    pub metrics: Metrics,
    /// The API client for bind; `None` when serving without one (tests, benchmarks).
    pub client: Option<kube::Client>,
    /// Whether the watches' caches are whole (`/readyz`).
    pub readiness: Readiness,
    /// Pod UID to the hash of the node names its last filter passed, and their scores in order.
    scores: Mutex<HashMap<String, Memo>>,
    /// Dense slots of the last filter's names, by position: tried first by the next filter.
    slot_hints: Mutex<Vec<Option<u32>>>,
    /// Standings of recent pods under the table policies ([`StandingMemo`]).
    standings: Mutex<StandingMemo>,
    /// DRA mode's node scores (`--dra`), once its watches are started.
    pub dra: std::sync::OnceLock<crate::claim_score::DraScorer>,
}

/// Now, in Unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

fn lock<T>(l: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    l.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of the candidate nodes, from whichever form kube-scheduler sent.
fn candidates(args: &ExtenderArgs) -> Vec<&str> {
    match (&args.nodenames, &args.nodes) {
        (Some(names), _) => names.iter().map(String::as_str).collect(),
        (None, Some(list)) => list.items.iter().filter_map(node_name).collect(),
        (None, None) => Vec::new(),
    }
}

impl AppState {
    /// State with an empty cache.
    pub fn new(settings: Settings, client: Option<kube::Client>) -> AppState {
        let mut cluster = Cluster::new(settings.heartbeat_timeout, settings.assume_ttl);
        cluster.set_typical_pods(settings.typical_pods.clone());
        AppState {
            cluster: RwLock::new(cluster),
            settings,
            metrics: Metrics::new(),
            client,
            readiness: Readiness::default(),
            scores: Mutex::new(HashMap::new()),
            slot_hints: Mutex::new(Vec::new()),
            standings: Mutex::new(StandingMemo::default()),
            dra: std::sync::OnceLock::new(),
        }
    }

    /// Whether both watches have a complete LIST since their last failure.
    pub fn ready(&self) -> bool {
        self.readiness.ready()
    }

    fn request(&self, pod: &Pod) -> Result<Option<PodRequest>, pod::PodError> {
        pod::pod_request(
            pod,
            &self.settings.request_policy,
            self.settings.node_policy,
            self.settings.gpu_policy,
        )
    }

    fn request_view(&self, pod: &PodView<'_>) -> Result<Option<PodRequest>, pod::PodError> {
        pod::pod_request_view(
            pod,
            &self.settings.request_policy,
            self.settings.node_policy,
            self.settings.gpu_policy,
        )
    }

    /// Scores `req` on each node in `names` under one read lock, calling `pass` or `fail` (with the
    /// message) per node in order; returns the cluster generation it read.
    fn scan<'n>(
        &self,
        req: &PodRequest,
        names: &[&'n str],
        now: u64,
        mut pass: impl FnMut(&'n str, Standing),
        mut fail: impl FnMut(&'n str, &str),
    ) -> u64 {
        let mut hints = std::mem::take(&mut *lock(&self.slot_hints));
        hints.resize(names.len(), None);
        let cluster = read(&self.cluster);
        let scorer = cluster.scorer(req, now);
        let mut buf = PlaceBuf::default();
        let mut msg = String::new();
        let mut memo = FailMemo::default();
        let mut standings = lock(&self.standings);
        let slots = standings.slots(req, cluster.table_epoch());
        for (&n, hint) in names.iter().zip(hints.iter_mut()) {
            match scorer.standing_memo(n, hint, &mut buf, slots) {
                Ok(standing) => pass(n, standing),
                Err(f) => {
                    msg.clear();
                    scorer.write_fail_memo(&mut msg, n, &f, &mut memo);
                    fail(n, &msg);
                }
            }
        }
        let generation = cluster.generation();
        drop(cluster);
        *lock(&self.slot_hints) = hints;
        generation
    }

    /// With `choose_node`, holds the filter's choice for the pod at once: kube-scheduler binds
    /// asynchronously (`bindingCycle` runs in a goroutine, pkg/scheduler/schedule_one.go), so the
    /// next pod's filter comes before this pod's bind, and without the hold it is given the same
    /// GPUs and its bind fails (tests/cluster/scale.rs measured 30 % of binds failing at 5000
    /// nodes). The hold is an assumption like the bind's: the bind takes it over, a failed bind,
    /// the pod's deletion or the assume TTL drops it, and the pod's next filter replaces it.
    fn hold(&self, uid: Option<&str>, req: &PodRequest, best: Option<&str>, now: u64) {
        let (Some(uid), Some(node)) = (uid, best) else {
            return;
        };
        if let Err(e) = write(&self.cluster).assume(uid, node, req, now, Instant::now()) {
            // It fitted under the read lock a moment ago; a watch event came in between. The
            // bind checks again.
            tracing::debug!(%uid, %node, error = %e, "filter's choice no longer fits; not held");
        }
    }

    /// Drops an earlier hold of a pod that is being filtered again (its bind failed elsewhere,
    /// or kube-scheduler retried it): its own hold must not stand in its way.
    fn release(&self, uid: Option<&str>) {
        let Some(uid) = uid else { return };
        if self.settings.choose_node && read(&self.cluster).is_assumed(uid) {
            write(&self.cluster).forget(uid);
        }
    }

    /// Keeps a filter's scores for the prioritize call that follows.
    fn remember(&self, uid: &str, memo: Memo) {
        let mut cache = lock(&self.scores);
        if cache.len() >= SCORE_CACHE_PODS {
            cache.clear();
        }
        cache.insert(uid.to_string(), memo);
    }

    /// Scores for `names` (0 where the pod does not fit): the pod's filter's, when it scored exactly
    /// these nodes for the same request and the cluster has not changed since; else computed.
    fn priorities<'n>(
        &self,
        req: &PodRequest,
        uid: Option<&str>,
        names: &[&'n str],
        now: u64,
        mut out: impl FnMut(&'n str, u32),
    ) {
        let memo = uid.and_then(|u| lock(&self.scores).remove(u));
        let cluster = read(&self.cluster);
        if let Some(m) = memo.filter(|m| m.matches(req, cluster.generation(), names)) {
            for (&n, &score) in names.iter().zip(&m.scores) {
                out(n, score);
            }
            return;
        }
        drop(cluster);
        // Scored afresh: without the pod's own hold, which would count it twice.
        self.release(uid);
        let cluster = read(&self.cluster);
        let scorer = cluster.scorer(req, now);
        let mut buf = PlaceBuf::default();
        let mut hint = None;
        for &n in names {
            out(n, scorer.score_at(n, &mut hint, &mut buf).unwrap_or(0));
        }
    }

    /// The filter verb: which candidate nodes fit the pod, and why the others do not. `now` is
    /// Unix seconds.
    pub fn filter(&self, args: &ExtenderArgs, now: u64) -> ExtenderFilterResult {
        let names = candidates(args);
        let mut result = ExtenderFilterResult::default();
        let pass = |result: &mut ExtenderFilterResult, ok: &dyn Fn(&str) -> bool| {
            if let Some(list) = &args.nodes {
                result.nodes = Some(NodeList {
                    items: list
                        .items
                        .iter()
                        .filter(|n| node_name(n).is_some_and(ok))
                        .cloned()
                        .collect(),
                    ..list.clone_empty()
                });
            }
            if args.nodenames.is_some() || args.nodes.is_none() {
                result.nodenames = Some(
                    names
                        .iter()
                        .filter(|n| ok(n))
                        .map(|n| n.to_string())
                        .collect(),
                );
            }
        };
        let Some(pod) = &args.pod else {
            result.error = "extender args carry no Pod (kube-scheduler sends the Go field names Pod, Nodes, NodeNames)".into();
            return result;
        };
        let req = match self.request(pod) {
            Ok(Some(r)) => r,
            // Not a vGPU pod: every node is fine as far as GPUs go.
            Ok(None) => {
                pass(&mut result, &|_| true);
                return result;
            }
            // No node can change a malformed request.
            Err(e) => {
                for n in &names {
                    result
                        .failed_and_unresolvable_nodes
                        .insert(n.to_string(), format!("{n}: {e}"));
                }
                pass(&mut result, &|_| false);
                return result;
            }
        };
        let uid = pod.metadata.uid.as_deref();
        self.release(uid);
        let mut passed: Vec<&str> = Vec::with_capacity(names.len());
        let mut scores: Vec<u32> = Vec::with_capacity(names.len());
        let mut ranks: Vec<i64> = Vec::with_capacity(names.len());
        let mut generation = self.scan(
            &req,
            &names,
            now,
            |n, s| {
                passed.push(n);
                scores.push(s.score);
                ranks.push(s.rank);
            },
            |n, why| result.failed_nodes.insert(n.to_string(), why.to_string()),
        );
        if self.settings.choose_node {
            keep_best(&mut passed, &mut scores, &ranks);
            self.hold(uid, &req, passed.first().copied(), now);
            generation = read(&self.cluster).generation();
        }
        if let Some(list) = &args.nodes {
            // `passed` is in list order (the best node alone when choosing).
            let mut i = 0;
            let mut items = Vec::with_capacity(passed.len());
            for item in &list.items {
                if i < passed.len() && node_name(item) == Some(passed[i]) {
                    items.push(item.clone());
                    i += 1;
                }
            }
            result.nodes = Some(NodeList {
                items,
                ..list.clone_empty()
            });
        } else {
            result.nodenames = Some(passed.iter().map(|n| n.to_string()).collect());
        }
        if let Some(uid) = pod.metadata.uid.as_deref() {
            self.remember(uid, Memo::new(req, generation, &passed, scores));
        }
        result
    }

    /// The filter verb from and to JSON, as the HTTP handler serves it: names borrowed from the
    /// body, the pod read only for what placement needs, the answer written straight out. Bodies
    /// with whole Node objects (or no pod) are served by [`AppState::filter`]. `Err` is the 400
    /// message for a body that is not `ExtenderArgs`.
    pub fn filter_json(&self, body: &[u8], now: u64) -> Result<Answer, String> {
        let view: ArgsView<'_> = match serde_json::from_slice(body) {
            Ok(
                v @ ArgsView {
                    pod: Some(_),
                    nodes: None,
                    ..
                },
            ) => v,
            _ => return self.filter_whole(body, now),
        };
        let Some(pod) = &view.pod else {
            return self.filter_whole(body, now);
        };
        let names: Vec<&str> = view.nodenames.iter().flatten().map(Name::as_str).collect();
        let mut out = Vec::with_capacity(32 + names.len() * 16);
        out.extend_from_slice(b"{\"NodeNames\":[");
        let mut first = true;
        let mut passing = |out: &mut Vec<u8>, n: &str| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            push_json_str(out, n);
        };
        let mut failed: Vec<u8> = Vec::new();
        let mut fail = |n: &str, why: &str| {
            failed.push(if failed.is_empty() { b'{' } else { b',' });
            push_json_str(&mut failed, n);
            failed.push(b':');
            push_json_str(&mut failed, why);
        };
        let mut failed_key = "FailedNodes";
        match self.request_view(pod) {
            // Not a vGPU pod: every node is fine as far as GPUs go.
            Ok(None) => names.iter().for_each(|n| passing(&mut out, n)),
            // No node can change a malformed request.
            Err(e) => {
                failed_key = "FailedAndUnresolvableNodes";
                let mut msg = String::new();
                for n in &names {
                    use std::fmt::Write;
                    msg.clear();
                    let _ = write!(msg, "{n}: {e}");
                    fail(n, &msg);
                }
            }
            Ok(Some(req)) => {
                let mut passed: Vec<&str> = Vec::with_capacity(names.len());
                let mut scores: Vec<u32> = Vec::with_capacity(names.len());
                let mut ranks: Vec<i64> = Vec::with_capacity(names.len());
                self.release(pod.uid());
                let mut generation = self.scan(
                    &req,
                    &names,
                    now,
                    |n, s| {
                        passed.push(n);
                        scores.push(s.score);
                        ranks.push(s.rank);
                    },
                    &mut fail,
                );
                if self.settings.choose_node {
                    keep_best(&mut passed, &mut scores, &ranks);
                    self.hold(pod.uid(), &req, passed.first().copied(), now);
                    generation = read(&self.cluster).generation();
                }
                passed.iter().for_each(|n| passing(&mut out, n));
                if let Some(uid) = pod.uid() {
                    self.remember(uid, Memo::new(req, generation, &passed, scores));
                }
            }
        }
        out.push(b']');
        if !failed.is_empty() {
            failed.push(b'}');
            out.extend_from_slice(b",\"");
            out.extend_from_slice(failed_key.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(&failed);
        }
        out.push(b'}');
        Ok(Answer {
            body: out,
            error: false,
        })
    }

    fn filter_whole(&self, body: &[u8], now: u64) -> Result<Answer, String> {
        let args: ExtenderArgs = serde_json::from_slice(body)
            .map_err(|e| format!("body is not ExtenderArgs JSON: {e}"))?;
        let r = self.filter(&args, now);
        Ok(Answer {
            error: !r.error.is_empty(),
            body: serde_json::to_vec(&r).map_err(|e| e.to_string())?,
        })
    }

    /// The prioritize verb: a score 0..=10 per candidate node under the pod's node policy; the
    /// scores of the pod's last filter when it scored exactly these nodes and nothing changed.
    pub fn prioritize(&self, args: &ExtenderArgs, now: u64) -> HostPriorityList {
        let names = candidates(args);
        let Some(pod) = &args.pod else {
            return Vec::new();
        };
        let mut out = Vec::with_capacity(names.len());
        let mut push = |n: &str, score: u32| {
            out.push(HostPriority {
                host: n.to_string(),
                score: i64::from(score),
            })
        };
        match self.request(pod) {
            Ok(Some(req)) => self.priorities(&req, pod.metadata.uid.as_deref(), &names, now, push),
            _ => names.iter().for_each(|n| push(n, 0)),
        }
        out
    }

    /// The prioritize verb from and to JSON (see [`AppState::filter_json`]).
    pub fn prioritize_json(&self, body: &[u8], now: u64) -> Result<Answer, String> {
        let view: ArgsView<'_> = match serde_json::from_slice(body) {
            Ok(
                v @ ArgsView {
                    pod: Some(_),
                    nodes: None,
                    ..
                },
            ) => v,
            _ => {
                let args: ExtenderArgs = serde_json::from_slice(body)
                    .map_err(|e| format!("body is not ExtenderArgs JSON: {e}"))?;
                return Ok(Answer {
                    body: serde_json::to_vec(&self.prioritize(&args, now))
                        .map_err(|e| e.to_string())?,
                    error: false,
                });
            }
        };
        let names: Vec<&str> = view.nodenames.iter().flatten().map(Name::as_str).collect();
        let mut out = Vec::with_capacity(2 + names.len() * 32);
        out.push(b'[');
        let mut push = |n: &str, score: u32| {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"Host\":");
            push_json_str(&mut out, n);
            out.extend_from_slice(b",\"Score\":");
            push_u32(&mut out, score);
            out.push(b'}');
        };
        match view.pod.as_ref().map(|p| (p, self.request_view(p))) {
            Some((pod, Ok(Some(req)))) => self.priorities(&req, pod.uid(), &names, now, push),
            _ => names.iter().for_each(|n| push(n, 0)),
        }
        out.push(b']');
        Ok(Answer {
            body: out,
            error: false,
        })
    }

    /// The bind verb: place the pod on the chosen node (assumed under the lock), write its
    /// assignment annotation, then create the Binding; on any failure undo both.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<(), BindError> {
        let client = self.client.clone().ok_or(BindError::NoClient)?;
        let pods: Api<Pod> = Api::namespaced(client, &args.pod_namespace);
        // The filter's hold, when it chose this node: the pod need not be read again.
        let held = match args.pod_uid.as_str() {
            "" => None,
            uid => read(&self.cluster).assumed_on(uid, &args.node),
        };
        let (uid, assignment) = match held {
            Some(a) => (args.pod_uid.clone(), Some(a)),
            None => {
                let pod = pods
                    .get(&args.pod_name)
                    .await
                    .map_err(|e| BindError::Get(e.to_string()))?;
                if !args.pod_uid.is_empty()
                    && pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str())
                {
                    return Err(BindError::UidChanged);
                }
                let uid = pod.metadata.uid.clone().unwrap_or_default();
                let req = self
                    .request(&pod)
                    .map_err(|e| BindError::Pod(e.to_string()))?;
                let assignment = match &req {
                    Some(req) => Some(
                        write(&self.cluster)
                            .assume(&uid, &args.node, req, unix_now(), Instant::now())
                            .map_err(BindError::NoFit)?,
                    ),
                    None => None,
                };
                (uid, assignment)
            }
        };
        let mut annotated = false;
        if let Some(assignment) = assignment {
            // The UID makes the patch fail on a pod recreated under the same name (it is
            // immutable).
            let patch =
                json!({"metadata": {"uid": uid, "annotations": {ASSIGNMENT: assignment.encode()}}});
            if let Err(e) = pods
                .patch(
                    &args.pod_name,
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
            {
                write(&self.cluster).forget(&uid);
                return Err(BindError::Patch(e.to_string()));
            }
            annotated = true;
        }
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        });
        let bound: Result<serde_json::Value, _> = pods
            .create_subresource("binding", &args.pod_name, &PostParams::default(), &binding)
            .await;
        if let Err(e) = bound {
            if annotated {
                let undo = json!({"metadata": {"annotations": {ASSIGNMENT: null}}});
                if let Err(u) = pods
                    .patch(
                        &args.pod_name,
                        &PatchParams::default(),
                        &Patch::Merge(&undo),
                    )
                    .await
                {
                    tracing::error!(pod = %format!("{}/{}", args.pod_namespace, args.pod_name), error = %u,
                        "rolling back the assignment annotation failed; the next bind replaces it");
                }
                write(&self.cluster).forget(&uid);
            }
            return Err(BindError::Binding(e.to_string()));
        }
        Ok(())
    }
}

/// Why a bind failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    /// Serving without an API client.
    #[error("no API client configured")]
    NoClient,
    /// The pod could not be read.
    #[error("reading the pod: {0}")]
    Get(String),
    /// The pod was replaced since it was scheduled.
    #[error("the pod's UID changed since it was scheduled")]
    UidChanged,
    /// Its request cannot be read.
    #[error("{0}")]
    Pod(String),
    /// The node no longer has room (another pod took it since the filter).
    #[error("{0}")]
    NoFit(String),
    /// Writing the assignment failed.
    #[error("writing the assignment annotation: {0}")]
    Patch(String),
    /// Creating the Binding failed (assignment rolled back).
    #[error("creating the binding: {0}")]
    Binding(String),
}

impl BindError {
    fn metric(&self) -> &'static str {
        match self {
            BindError::NoFit(_) => "no-fit",
            BindError::Patch(_) => "patch-failed",
            BindError::Binding(_) => "binding-failed",
            BindError::NoClient | BindError::Get(_) | BindError::UidChanged | BindError::Pod(_) => {
                "pod-error"
            }
        }
    }
}

impl NodeList {
    fn clone_empty(&self) -> NodeList {
        NodeList {
            api_version: self.api_version.clone(),
            kind: self.kind.clone(),
            metadata: self.metadata.clone(),
            items: Vec::new(),
        }
    }
}

fn bad_request(msg: String) -> Response {
    (StatusCode::BAD_REQUEST, msg).into_response()
}

fn json(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn filter(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    match s.filter_json(&body, unix_now()) {
        Ok(a) => {
            let result = if a.error { "error" } else { "ok" };
            s.metrics.call("filter", result, started.elapsed());
            json(a.body)
        }
        Err(msg) => {
            s.metrics.call("filter", "bad-request", started.elapsed());
            bad_request(msg)
        }
    }
}

async fn prioritize(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    match s.prioritize_json(&body, unix_now()) {
        Ok(a) => {
            s.metrics.call("prioritize", "ok", started.elapsed());
            json(a.body)
        }
        Err(msg) => {
            s.metrics
                .call("prioritize", "bad-request", started.elapsed());
            bad_request(msg)
        }
    }
}

async fn bind(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let args: ExtenderBindingArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            s.metrics.call("bind", "bad-request", started.elapsed());
            return bad_request(format!("body is not ExtenderBindingArgs JSON: {e}"));
        }
    };
    let pod = format!("{}/{}", args.pod_namespace, args.pod_name);
    let r = match s.bind(&args).await {
        Ok(()) => {
            tracing::info!(%pod, node = %args.node, "bound");
            s.metrics.bind("bound");
            s.metrics.call("bind", "ok", started.elapsed());
            ExtenderBindingResult::default()
        }
        Err(e) => {
            tracing::warn!(%pod, node = %args.node, error = %e, "bind failed");
            s.metrics.bind(e.metric());
            s.metrics.call("bind", "error", started.elapsed());
            bind_failure(&e)
        }
    };
    Json(r).into_response()
}

/// The bind answer for a failure. kube-scheduler's `HTTPExtender.Bind` returns
/// `fmt.Errorf(result.Error)` (pkg/scheduler/extender.go), using the text as a format string, so
/// a `%` in it (`46% cores`) reached the pod's Events as `46%!c(MISSING)ores` on the real cluster;
/// doubled, it prints as one.
fn bind_failure(e: &BindError) -> ExtenderBindingResult {
    ExtenderBindingResult {
        error: e.to_string().replace('%', "%%"),
    }
}

/// Largest extender body accepted. With `nodeCacheCapable: false` kube-scheduler sends whole Node
/// objects (several KiB each), so thousands of nodes pass axum's 2 MiB default; the listener is on
/// localhost, for the kube-scheduler beside it.
pub const MAX_BODY: usize = 64 << 20;

/// The extender API (filter, prioritize, bind).
pub fn extender_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/filter", post(filter))
        .route("/prioritize", post(prioritize))
        .route("/bind", post(bind))
        .route("/dra/prioritize", post(crate::claim_score::prioritize))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok"
}

/// 200 while both watches' caches are whole; else 503 naming each that is not, and why.
async fn readyz(State(s): State<Arc<AppState>>) -> Response {
    match s.readiness.check() {
        Ok(()) => "ok".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn metrics(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    s.metrics.refresh(&read(&s.cluster), unix_now());
    s.metrics.refresh_readiness(&s.readiness);
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = exposition::negotiate(accept, s.metrics.encode());
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Health, readiness and metrics.
pub fn metrics_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::readiness::Feed;
    use http_body_util::BodyExt;
    use serde_json::Value;
    use tower::ServiceExt;
    use vgpu_core::inventory::{DeviceInfo, NodeInventory};

    fn state() -> Arc<AppState> {
        let s = AppState::new(Settings::default(), None);
        let now = vgpu_core::time::format_rfc3339(unix_now());
        for (node, free) in [("big", 16384u64), ("small", 4096)] {
            let inv = NodeInventory::new(vec![DeviceInfo {
                uuid: format!("GPU-{node}"),
                index: 0,
                model: "NVIDIA T4".into(),
                memory_mib: free,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            }]);
            write(&s.cluster).apply_node(node, Some(&inv.encode()), Some(&now), None);
        }
        Arc::new(s)
    }

    fn pod(limits: Value) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
            "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}})
    }

    async fn call(app: Router, path: &str, body: Value) -> (StatusCode, Value) {
        let req = axum::http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let resp = app.oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, v)
    }

    #[tokio::test]
    async fn filter_by_names_explains_failures_and_prioritize_scores() {
        let s = state();
        let args = json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})),
            "NodeNames": ["big", "small", "gone"]});
        let (code, r) = call(extender_app(s.clone()), "/filter", args.clone()).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["NodeNames"], json!(["big"]));
        assert_eq!(
            r["FailedNodes"]["small"],
            "small: no GPU with 8192 MiB free (largest 4096 MiB on GPU-small)"
        );
        assert_eq!(
            r["FailedNodes"]["gone"],
            "gone: not known to the vGPU extender (no Node object seen)"
        );
        let (_, p) = call(
            extender_app(s.clone()),
            "/prioritize",
            json!({"Pod": args["Pod"], "NodeNames": ["big"]}),
        )
        .await;
        // Binpack: half of the card's memory, no cores: a quarter used, score 3 of 10.
        assert_eq!(p, json!([{"Host": "big", "Score": 3}]));
        // Without a cached filter, prioritize computes the same.
        let (_, p) = call(
            extender_app(s),
            "/prioritize",
            json!({"Pod": args["Pod"], "NodeNames": ["big", "small"]}),
        )
        .await;
        assert_eq!(
            p,
            json!([{"Host": "big", "Score": 3}, {"Host": "small", "Score": 0}])
        );
    }

    #[tokio::test]
    async fn filter_with_whole_nodes_returns_whole_nodes() {
        let s = state();
        let args = json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})),
            "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [
                {"metadata": {"name": "big", "labels": {"a": "b"}}},
                {"metadata": {"name": "small"}}]}});
        let (_, r) = call(extender_app(s), "/filter", args).await;
        assert_eq!(
            r["Nodes"]["items"],
            json!([{"metadata": {"name": "big", "labels": {"a": "b"}}}])
        );
        assert_eq!(r["Nodes"]["kind"], "NodeList");
        assert!(r.get("NodeNames").is_none());
        assert!(r["FailedNodes"]["small"].is_string());
    }

    #[tokio::test]
    async fn non_vgpu_pods_pass_and_bad_requests_are_unresolvable() {
        let s = state();
        let (_, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"Pod": pod(json!({"cpu": "1"})), "NodeNames": ["big", "x"]}),
        )
        .await;
        assert_eq!(r["NodeNames"], json!(["big", "x"]));
        let (_, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"Pod": pod(json!({"nvidia.com/gpucores": "150"})), "NodeNames": ["big"]}),
        )
        .await;
        assert_eq!(r["NodeNames"], json!([]));
        assert_eq!(
            r["FailedAndUnresolvableNodes"]["big"],
            "big: container \"main\": nvidia.com/gpucores: 150 is out of range 0-100"
        );
        // Whole nodes beyond axum's 2 MiB default are still read.
        let items: Vec<Value> = (0..600)
            .map(|i| json!({"metadata": {"name": format!("n{i}")}, "status": {"images": [{"names": ["x".repeat(4096)]}]}}))
            .collect();
        let (code, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"Pod": pod(json!({"cpu": "1"})), "Nodes": {"items": items}}),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["Nodes"]["items"].as_array().unwrap().len(), 600);
        let (code, body) = call(extender_app(s.clone()), "/filter", json!([1])).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(body.as_str().unwrap().contains("not ExtenderArgs JSON"));
        let (code, _) = call(extender_app(s.clone()), "/bind", json!({"PodName": 3})).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        // Bind without an API client answers an error, not a crash.
        let (code, r) = call(
            extender_app(s),
            "/bind",
            json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "big"}),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["Error"], "no API client configured");
    }

    #[tokio::test]
    async fn health_ready_and_metrics() {
        let s = state();
        let get = |path: &'static str| {
            let s = s.clone();
            async move {
                let req = axum::http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap();
                let resp = metrics_app(s).oneshot(req).await.unwrap();
                let status = resp.status();
                let ct = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .map(|v| v.to_str().unwrap().to_string());
                let b = resp.into_body().collect().await.unwrap().to_bytes();
                (status, ct, String::from_utf8(b.to_vec()).unwrap())
            }
        };
        assert_eq!(get("/healthz").await.0, StatusCode::OK);
        assert_eq!(get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
        s.readiness.listed(Feed::Nodes);
        s.readiness.listed(Feed::Pods);
        assert_eq!(get("/readyz").await.0, StatusCode::OK);
        let (_, ct, text) = get("/metrics").await;
        assert_eq!(ct.as_deref(), Some(exposition::PROMETHEUS_TEXT));
        assert!(
            text.contains("vgpu_scheduler_nodes{state=\"ready\"} 2"),
            "{text}"
        );
    }

    fn inventory(gpus: &[(&str, u64)]) -> String {
        NodeInventory::new(
            gpus.iter()
                .enumerate()
                .map(|(i, (uuid, mib))| DeviceInfo {
                    uuid: uuid.to_string(),
                    index: i as u32,
                    model: if i % 2 == 0 {
                        "NVIDIA A100-SXM4-80GB"
                    } else {
                        "Tesla T4"
                    }
                    .into(),
                    memory_mib: *mib,
                    cores: 100,
                    split: 4,
                    numa: None,
                    healthy: true,
                    vendor: String::new(),
                    nvlinks: Default::default(),
                })
                .collect(),
        )
        .encode()
    }

    /// The JSON path (pruned read, answer written straight out) answers exactly what the typed
    /// path answers, for every form of body kube-scheduler or a client may send.
    #[test]
    fn json_answers_equal_the_typed_answers() {
        let s = state();
        let now = unix_now();
        let hb = vgpu_core::time::format_rfc3339(now);
        for n in 0..6 {
            let uuids: Vec<String> = (0..3).map(|i| format!("GPU-{n}-{i}")).collect();
            let gpus: Vec<(&str, u64)> = uuids.iter().map(|u| (u.as_str(), 24576)).collect();
            write(&s.cluster).apply_node(
                &format!("n{n}"),
                Some(&inventory(&gpus)),
                Some(&hb),
                None,
            );
        }
        write(&s.cluster).apply_node("bare", None, Some(&hb), None);
        let names = json!([
            "n0",
            "n1",
            "big",
            "small",
            "gone",
            "bare",
            "n\"q\\uote",
            "n2",
            "n3",
            "n4",
            "n5"
        ]);
        let annotated = |limits: Value, annotations: Value| {
            let mut p = pod(limits);
            p["metadata"]["annotations"] = annotations;
            p
        };
        let bodies = vec![
            json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})), "NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpumem": 20000, "nvidia.com/gpucores": "30"})), "NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"})), "NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpu": "9"})), "NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpucores": "150"})), "NodeNames": names}),
            json!({"Pod": pod(json!({"cpu": "1"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/use-gputype": "a100", "other": "x", "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": 1}"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/nouse-gputype": "A100,t4"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/use-gpuuuid": "GPU-3-1"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"hami.io/node-scheduler-policy": "nope"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), json!({"hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "binpack"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/numa-bind": "true", "hami.io/gpu-scheduler-policy": "binpack,topology-aware,mutex"})), "NodeNames": names}),
            json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/numa-bind": "perhaps"})), "NodeNames": names}),
            json!({"Pod": {"metadata": {"name": "p", "uid": "u2"}, "spec": {
                "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpumem": "30000"}}}],
                "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}, "requests": {"nvidia.com/gpu": "2"}}},
                    {"name": "b", "resources": {"requests": {"nvidia.com/gpumem": "24000"}}}]},
                "status": {"phase": "Pending"}}, "NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"})), "NodeNames": []}),
            json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"}))}),
            json!({"NodeNames": names}),
            json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"})), "Nodes": {"items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "small"}}]}}),
            json!({"Pod": {"metadata": {"uid": "u3"}}, "NodeNames": names}),
            json!({"Pod": {"spec": {}}, "NodeNames": names}),
            json!({"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}, "NodeNames": names}),
            json!({"Pod": {"spec": {"containers": null}}, "NodeNames": names}),
        ];
        for body in &bodies {
            let bytes = serde_json::to_vec(body).unwrap();
            let typed: ExtenderArgs = serde_json::from_value(body.clone()).unwrap();
            let want = serde_json::to_value(s.filter(&typed, now)).unwrap();
            let got = s.filter_json(&bytes, now).unwrap();
            let got_v: Value = serde_json::from_slice(&got.body).unwrap();
            assert_eq!(got_v, want, "{body}");
            let want = serde_json::to_value(s.prioritize(&typed, now)).unwrap();
            // The filter's scores stand in for prioritize when nothing changed.
            s.filter_json(&bytes, now).unwrap();
            let got: Value =
                serde_json::from_slice(&s.prioritize_json(&bytes, now).unwrap().body).unwrap();
            assert_eq!(got, want, "{body}");
        }
        // Not extender JSON: the same 400 message as the typed read gives.
        for bad in [
            &b"[1]"[..],
            b"{\"Pod\": 3}",
            b"{\"Pod\": {\"spec\": {\"containers\": 5}}}",
            b"{\"NodeNames\": [1]}",
            b"{",
        ] {
            let e = serde_json::from_slice::<ExtenderArgs>(bad).unwrap_err();
            assert_eq!(
                s.filter_json(bad, now).unwrap_err(),
                format!("body is not ExtenderArgs JSON: {e}")
            );
            assert!(s.prioritize_json(bad, now).is_err());
        }
    }

    /// kube-scheduler formats the bind error with Go's fmt: a percent sign is doubled.
    #[test]
    fn bind_errors_survive_go_formatting() {
        let e = BindError::NoFit("n1: no GPU with 46% cores free".into());
        assert_eq!(bind_failure(&e).error, "n1: no GPU with 46%% cores free");
    }

    /// Prioritize reuses the filter's scores only while they are still right: the same pod
    /// request, the same names in the same order, and no change to the cluster in between.
    #[test]
    fn prioritize_reuses_the_filter_only_while_nothing_changed() {
        let s = state();
        let now = unix_now();
        let p = pod(json!({"nvidia.com/gpumem": "4096"}));
        let body = |p: &Value, names: Value| {
            serde_json::to_vec(&json!({"Pod": p, "NodeNames": names})).unwrap()
        };
        let scores = |b: &[u8]| -> Value {
            serde_json::from_slice(&s.prioritize_json(b, now).unwrap().body).unwrap()
        };
        let f = body(&p, json!(["big", "small"]));
        s.filter_json(&f, now).unwrap();
        // Binpack: 4 GiB of 16 GiB is an eighth used (score 1), of 4 GiB half (score 5).
        assert_eq!(
            scores(&f),
            json!([{"Host": "big", "Score": 1}, {"Host": "small", "Score": 5}])
        );
        // A pod placed on "big" between filter and prioritize: the scores follow.
        s.filter_json(&f, now).unwrap();
        write(&s.cluster).apply_pod(
            "other",
            Some("big"),
            Some(vgpu_core::assignment::PodAssignment::new(
                "big",
                vec![vgpu_core::assignment::ContainerAssignment {
                    name: "c".into(),
                    devices: vec![vgpu_core::assignment::DeviceSlice {
                        uuid: "GPU-big".into(),
                        memory_mib: 8192,
                        cores: 0,
                        exclusive: false,
                    }],
                }],
            )),
            false,
        );
        assert_eq!(
            scores(&f),
            json!([{"Host": "big", "Score": 4}, {"Host": "small", "Score": 5}])
        );
        // The pod's policy changed between the calls: computed for the new request.
        s.filter_json(&f, now).unwrap();
        let mut spread = p.clone();
        spread["metadata"]["annotations"] = json!({"hami.io/node-scheduler-policy": "spread"});
        assert_eq!(
            scores(&body(&spread, json!(["big", "small"]))),
            json!([{"Host": "big", "Score": 6}, {"Host": "small", "Score": 5}])
        );
        // Other names, or another order: computed.
        s.filter_json(&f, now).unwrap();
        assert_eq!(
            scores(&body(&p, json!(["small", "big"]))),
            json!([{"Host": "small", "Score": 5}, {"Host": "big", "Score": 4}])
        );
    }

    /// Places a pod `u-<node>` holding `mib` and `cores` of GPU `uuid` on `node`.
    fn place_slice(s: &AppState, node: &str, uuid: &str, mib: u64, cores: u32) {
        write(&s.cluster).apply_pod(
            &format!("u-{node}"),
            Some(node),
            Some(vgpu_core::assignment::PodAssignment::new(
                node,
                vec![vgpu_core::assignment::ContainerAssignment {
                    name: "c".into(),
                    devices: vec![vgpu_core::assignment::DeviceSlice {
                        uuid: uuid.to_string(),
                        memory_mib: mib,
                        cores,
                        exclusive: false,
                    }],
                }],
            )),
            false,
        );
    }

    /// An extender with nodes `roomy` (an idle 10000 MiB card) and `tight` (that card with
    /// `used` percent taken), and the typical pods of `typical` (the `--typical-pods` JSON).
    fn two_node_state(typical: &[u8], used: u32) -> Arc<AppState> {
        let settings = Settings {
            typical_pods: Some(crate::typical::parse("t", typical).unwrap()),
            ..Settings::default()
        };
        let s = Arc::new(AppState::new(settings, None));
        let hb = vgpu_core::time::format_rfc3339(unix_now());
        for (node, used) in [("roomy", 0u32), ("tight", used)] {
            let uuid = format!("GPU-{node}");
            write(&s.cluster).apply_node(
                node,
                Some(&inventory(&[(&uuid, 10000)])),
                Some(&hb),
                None,
            );
            if used > 0 {
                place_slice(&s, node, &uuid, u64::from(used) * 100, used);
            }
        }
        s
    }

    /// `/prioritize` of a pod asking `percent` of a card's memory and cores, under node policy
    /// `policy`, over `roomy` and `tight`: their scores.
    async fn prioritize_two(s: &Arc<AppState>, policy: &str, percent: u32) -> (i64, i64) {
        let mut p = pod(json!({
            "nvidia.com/gpumem-percentage": percent.to_string(),
            "nvidia.com/gpucores": percent.to_string(),
        }));
        p["metadata"]["annotations"] = json!({"hami.io/node-scheduler-policy": policy});
        let body = json!({"Pod": p, "NodeNames": ["roomy", "tight"]});
        let (_, v) = call(extender_app(s.clone()), "/prioritize", body).await;
        let score = |i: usize| v[i]["Score"].as_i64().unwrap();
        (score(0), score(1))
    }

    /// With `choose_node` (the default) filter passes only the best node: the highest score, then
    /// the smallest name whatever the order kube-scheduler sends; without it, every node that
    /// fits. Both the JSON path and the whole-`nodes` path.
    #[tokio::test]
    async fn filter_chooses_the_best_node_unless_told_not_to() {
        let setup = |choose_node: bool| {
            let s = Arc::new(AppState::new(
                Settings {
                    choose_node,
                    ..Settings::default()
                },
                None,
            ));
            let hb = vgpu_core::time::format_rfc3339(unix_now());
            for node in ["n-b", "n-a", "n-used", "n-full"] {
                let uuid = format!("GPU-{node}");
                let inv = inventory(&[(&uuid, 10000)]);
                write(&s.cluster).apply_node(node, Some(&inv), Some(&hb), None);
                let used = match node {
                    "n-used" => 4000,
                    "n-full" => 9000,
                    _ => continue,
                };
                place_slice(&s, node, &uuid, used, 10);
            }
            s
        };
        let filter = |s: &Arc<AppState>, mib: u32, names: &[&str], whole: bool| {
            let p = pod(json!({"nvidia.com/gpumem": mib.to_string()}));
            let args = if whole {
                let items: Vec<Value> = names
                    .iter()
                    .map(|n| json!({"metadata": {"name": n}}))
                    .collect();
                json!({"Pod": p, "Nodes": {"metadata": {}, "items": items}})
            } else {
                json!({"Pod": p, "NodeNames": names})
            };
            let app = extender_app(s.clone());
            async move {
                let (_, r) = call(app, "/filter", args).await;
                if whole {
                    let names: Vec<Value> = r["Nodes"]["items"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|i| i["metadata"]["name"].clone())
                        .collect();
                    (Value::Array(names), r)
                } else {
                    (r["NodeNames"].clone(), r)
                }
            }
        };
        let on = setup(true);
        let all = ["n-b", "n-full", "n-a", "n-used"];
        for whole in [false, true] {
            // Binpack: n-used is the fullest that still fits 2000 MiB (n-full has 1000 left).
            let (names, r) = filter(&on, 2000, &all, whole).await;
            assert_eq!(names, json!(["n-used"]), "{r}");
            assert!(r["FailedNodes"]["n-full"].is_string(), "{r}");
            // 7000 MiB fits only the idle cards, equal scores: the smaller name, in any order.
            let (names, _) = filter(&on, 7000, &all, whole).await;
            assert_eq!(names, json!(["n-a"]));
            let (names, _) = filter(&on, 7000, &["n-a", "n-b"], whole).await;
            assert_eq!(names, json!(["n-a"]));
            // Nothing fits: nothing passes, every node says why.
            let (names, r) = filter(&on, 20000, &all, whole).await;
            assert_eq!(names, json!([]));
            assert_eq!(r["FailedNodes"].as_object().unwrap().len(), 4);
        }
        // Prioritize after a choosing filter: over the chosen node (the filter's memo), and over
        // any other list (computed): the chosen node's score is the best of them.
        let p = pod(json!({"nvidia.com/gpumem": "2000"}));
        let (names, _) = filter(&on, 2000, &all, false).await;
        let (_, one) = call(
            extender_app(on.clone()),
            "/prioritize",
            json!({"Pod": p, "NodeNames": names}),
        )
        .await;
        let (_, every) = call(
            extender_app(on.clone()),
            "/prioritize",
            json!({"Pod": p, "NodeNames": all}),
        )
        .await;
        let best = every
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h["Score"].as_i64().unwrap())
            .max();
        assert_eq!(one[0]["Host"], "n-used", "{one}");
        assert_eq!(one[0]["Score"].as_i64(), best, "{one} {every}");
        let off = setup(false);
        for whole in [false, true] {
            let (names, _) = filter(&off, 2000, &all, whole).await;
            assert_eq!(names, json!(["n-b", "n-a", "n-used"]));
        }
        // A pod without vGPU passes every node either way.
        let (_, r) = call(
            extender_app(on),
            "/filter",
            json!({"Pod": pod(json!({})), "NodeNames": all}),
        )
        .await;
        assert_eq!(r["NodeNames"], json!(all));
    }

    /// `fragmentation` through the extender's JSON: with a typical workload of half-card pods, a
    /// 10 % pod scores the node it leaves room for a half pod on above the one where it would
    /// strand the rest, where binpack prefers the fuller card.
    #[tokio::test]
    async fn fragmentation_policy_scores_differently_from_binpack() {
        let s = two_node_state(br#"[{"gpus": 1, "percent": 50, "count": 1}]"#, 45);
        let (roomy, tight) = prioritize_two(&s, "fragmentation", 10).await;
        assert!(roomy > tight, "{roomy} vs {tight}");
        let (roomy, tight) = prioritize_two(&s, "binpack", 10).await;
        assert!(roomy < tight, "{roomy} vs {tight}");
    }

    /// `gap-aware` through the extender's JSON: with twice as many 60 % pods as 40 % pods
    /// typical, a 40 % pod scores 5 on the idle card (it leaves a 60 % pod's room) and 0 on the
    /// card with a 60 % gap (it would leave 20 %, which nothing fills); a 60 % pod fills that gap
    /// losslessly.
    #[tokio::test]
    async fn gap_aware_policy_scores_through_the_extender() {
        let s = two_node_state(
            br#"[{"gpus": 1, "percent": 60, "count": 20}, {"gpus": 1, "percent": 40, "count": 10}]"#,
            40,
        );
        assert_eq!(prioritize_two(&s, "gap-aware", 40).await, (5, 0));
        assert_eq!(prioritize_two(&s, "gap-aware", 60).await.1, 5);
        let (roomy, tight) = prioritize_two(&s, "binpack", 40).await;
        assert!(roomy < tight, "{roomy} vs {tight}");
    }
}
