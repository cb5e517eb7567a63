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
use kube::api::{Api, PostParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::exposition;
use vgpu_core::placement::live::LiveFrag;
use vgpu_core::placement::{PlaceBuf, PodRequest, Policy, Standing};
use vgpu_core::request::RequestPolicy;

use crate::cache::{Cluster, FailMemo, StandingMemo};
use crate::extender::{
    node_name, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    HostPriority, HostPriorityList, Name, NodeList,
};
use crate::metrics::Metrics;
use crate::pod::{self, PodSource};
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
    /// Asks kube-scheduler to retry pods turned away on a view older than its own.
    pub requeue: crate::requeue::Requeue,
    /// The pods turned away lately: room goes to the oldest that fits first.
    waiting: Mutex<waiting::WaitingPods>,
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
    /// State with an empty cache; with a client, on a tokio runtime (the requeue writer starts).
    pub fn new(settings: Settings, client: Option<kube::Client>) -> AppState {
        let mut cluster = Cluster::new(settings.heartbeat_timeout, settings.assume_ttl);
        cluster.set_typical_pods(settings.typical_pods.clone());
        AppState {
            cluster: RwLock::new(cluster),
            settings,
            metrics: Metrics::new(),
            readiness: Readiness::default(),
            scores: Mutex::new(HashMap::new()),
            slot_hints: Mutex::new(Vec::new()),
            standings: Mutex::new(StandingMemo::default()),
            dra: std::sync::OnceLock::new(),
            waiting: Mutex::default(),
            requeue: match &client {
                Some(c) => crate::requeue::Requeue::start(c.clone()),
                None => crate::requeue::Requeue::disabled(),
            },
            client,
        }
    }

    /// Whether both watches have a complete LIST since their last failure.
    pub fn ready(&self) -> bool {
        self.readiness.ready()
    }

    fn request(&self, pod: &impl PodSource) -> Result<Option<PodRequest>, pod::PodError> {
        pod::pod_request(
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

    /// Holds room for the oldest pods turned away lately that are older than this pod (`order`:
    /// its creation and name) and fit now, each on its best node among those kube-scheduler last
    /// offered it ([`waiting`]); a pod that already holds room keeps it.
    fn hold_for_older(&self, order: impl FnOnce() -> (i64, String), now: u64) {
        let ahead = {
            let waiting = lock(&self.waiting);
            if waiting.is_empty() {
                return;
            }
            waiting.ahead_of(&order(), now)
        };
        for (uid, w) in ahead {
            if read(&self.cluster).is_assumed(&uid) {
                continue;
            }
            let names: Vec<&str> = w.nodes.iter().map(String::as_str).collect();
            let mut passed: Vec<&str> = Vec::new();
            let mut scores: Vec<u32> = Vec::new();
            let mut ranks: Vec<i64> = Vec::new();
            self.scan(
                &w.request,
                &names,
                now,
                |n, s| {
                    passed.push(n);
                    scores.push(s.score);
                    ranks.push(s.rank);
                },
                |_, _| {},
            );
            keep_best(&mut passed, &mut scores, &ranks);
            self.hold(Some(&uid), &w.request, passed.first().copied(), now);
        }
    }

    /// A pod was bound or deleted: it waits no more.
    pub fn no_longer_waiting(&self, uid: &str) {
        lock(&self.waiting).forget(uid);
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

    /// The filter's decision, written once for both forms of the call: which of `names` fit the
    /// pod (with `choose_node`, the best alone), and why the others do not; told to `out` in
    /// candidate order. `now` is Unix seconds.
    fn decide_filter<'n>(
        &self,
        pod: &impl PodSource,
        names: &[&'n str],
        now: u64,
        out: &mut impl Verdicts<'n>,
    ) {
        let req = match self.request(pod) {
            Ok(Some(r)) => r,
            // Not a vGPU pod: every node is fine as far as GPUs go.
            Ok(None) => return names.iter().for_each(|n| out.pass(n)),
            // No node can change a malformed request.
            Err(e) => {
                let mut msg = String::new();
                for n in names {
                    use std::fmt::Write;
                    msg.clear();
                    let _ = write!(msg, "{n}: {e}");
                    out.unresolvable(n, &msg);
                }
                return;
            }
        };
        let uid = pod.uid();
        self.release(uid);
        let order = || (pod.created(), pod.key().to_string());
        if self.settings.choose_node {
            self.hold_for_older(order, now);
        }
        let mut passed: Vec<&str> = Vec::with_capacity(names.len());
        let mut scores: Vec<u32> = Vec::with_capacity(names.len());
        let mut ranks: Vec<i64> = Vec::with_capacity(names.len());
        let mut generation = self.scan(
            &req,
            names,
            now,
            |n, s| {
                passed.push(n);
                scores.push(s.score);
                ranks.push(s.rank);
            },
            |n, why| out.fail(n, why),
        );
        if self.settings.choose_node {
            keep_best(&mut passed, &mut scores, &ranks);
            self.hold(uid, &req, passed.first().copied(), now);
            generation = read(&self.cluster).generation();
        }
        passed.iter().for_each(|n| out.pass(n));
        if passed.is_empty() {
            self.requeue.turned_away();
        }
        if let Some(uid) = uid {
            let mut waiting = lock(&self.waiting);
            if passed.is_empty() {
                waiting.turned_away(
                    uid,
                    waiting::Waiting {
                        order: order(),
                        request: req.clone(),
                        nodes: names.iter().map(|n| n.to_string()).collect(),
                        at: now,
                    },
                );
            } else {
                waiting.forget(uid);
            }
            drop(waiting);
            self.remember(uid, Memo::new(req, generation, &passed, scores));
        }
    }

    /// The prioritize decision, written once for both forms of the call: a score 0..=10 per
    /// candidate under the pod's node policy (0 for a pod that asks no vGPU), the pod's last
    /// filter's scores when it scored exactly these nodes and nothing changed.
    fn decide_priorities<'n>(
        &self,
        pod: &impl PodSource,
        names: &[&'n str],
        now: u64,
        mut out: impl FnMut(&'n str, u32),
    ) {
        match self.request(pod) {
            Ok(Some(req)) => self.priorities(&req, pod.uid(), names, now, out),
            _ => names.iter().for_each(|n| out(n, 0)),
        }
    }

    /// The filter verb over typed arguments: which candidate nodes fit the pod, and why the
    /// others do not. `now` is Unix seconds.
    pub fn filter(&self, args: &ExtenderArgs, now: u64) -> ExtenderFilterResult {
        let Some(pod) = &args.pod else {
            return ExtenderFilterResult {
                error: "extender args carry no Pod (kube-scheduler sends the Go field names Pod, Nodes, NodeNames)".into(),
                ..ExtenderFilterResult::default()
            };
        };
        let _span = tracing::info_span!("filter", pod = %pod.key()).entered();
        let names = candidates(args);
        let mut out = TypedVerdicts::default();
        self.decide_filter(pod, &names, now, &mut out);
        out.into_result(args)
    }

    /// The filter verb from and to JSON, as the HTTP handler serves it: names borrowed from the
    /// body, the pod read only for what placement needs, the answer written straight out. Bodies
    /// with whole Node objects (or no pod) are served by [`AppState::filter`]. `Err` is the 400
    /// message for a body that is not `ExtenderArgs`.
    pub fn filter_json(&self, body: &[u8], now: u64) -> Result<Answer, String> {
        let Some((pod, names)) = lean_args(body) else {
            let args: ExtenderArgs = serde_json::from_slice(body)
                .map_err(|e| format!("body is not ExtenderArgs JSON: {e}"))?;
            let r = self.filter(&args, now);
            return Ok(Answer {
                error: !r.error.is_empty(),
                body: serde_json::to_vec(&r).map_err(|e| e.to_string())?,
            });
        };
        let _span = tracing::info_span!("filter", pod = %pod.key()).entered();
        let names: Vec<&str> = names.iter().map(Name::as_str).collect();
        let mut out = JsonVerdicts::new(names.len());
        self.decide_filter(&pod, &names, now, &mut out);
        Ok(Answer {
            body: out.finish(),
            error: false,
        })
    }

    /// The prioritize verb over typed arguments.
    pub fn prioritize(&self, args: &ExtenderArgs, now: u64) -> HostPriorityList {
        let Some(pod) = &args.pod else {
            return Vec::new();
        };
        let _span = tracing::info_span!("prioritize", pod = %pod.key()).entered();
        let names = candidates(args);
        let mut out = Vec::with_capacity(names.len());
        self.decide_priorities(pod, &names, now, |n, score| {
            out.push(HostPriority {
                host: n.to_string(),
                score: i64::from(score),
            })
        });
        out
    }

    /// The prioritize verb from and to JSON (see [`AppState::filter_json`]).
    pub fn prioritize_json(&self, body: &[u8], now: u64) -> Result<Answer, String> {
        let Some((pod, names)) = lean_args(body) else {
            let args: ExtenderArgs = serde_json::from_slice(body)
                .map_err(|e| format!("body is not ExtenderArgs JSON: {e}"))?;
            return Ok(Answer {
                body: serde_json::to_vec(&self.prioritize(&args, now))
                    .map_err(|e| e.to_string())?,
                error: false,
            });
        };
        let _span = tracing::info_span!("prioritize", pod = %pod.key()).entered();
        let names: Vec<&str> = names.iter().map(Name::as_str).collect();
        let mut out = answer::json_priorities(names.len());
        self.decide_priorities(&pod, &names, now, |n, score| {
            answer::push_priority(&mut out, n, score)
        });
        out.push(b']');
        Ok(Answer {
            body: out,
            error: false,
        })
    }

    /// The bind verb: place the pod on the chosen node (assumed under the lock) and create its
    /// Binding, which carries the assignment annotation: the API server copies a Binding's
    /// annotations onto the pod in the same write that sets `spec.nodeName`
    /// (`setPodNodeAndMetadata`, pkg/registry/core/pod/storage/storage.go), so the pod is never
    /// seen bound without its assignment, and a bind is one write (no pod update, so no
    /// admission review of one either). On failure the hold is dropped.
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
        // The UID is the write's precondition: a pod recreated under the same name is not bound.
        let mut metadata =
            json!({"name": args.pod_name, "namespace": args.pod_namespace, "uid": uid});
        if let Some(assignment) = &assignment {
            metadata["annotations"] = json!({ASSIGNMENT: assignment.encode()});
        }
        let binding = json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        });
        let bound: Result<serde_json::Value, _> = pods
            .create_subresource("binding", &args.pod_name, &PostParams::default(), &binding)
            .await;
        if let Err(e) = bound {
            if assignment.is_some() {
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
    /// Creating the Binding (with the assignment) failed; nothing was written.
    #[error("creating the binding: {0}")]
    Binding(String),
}

impl BindError {
    fn metric(&self) -> &'static str {
        match self {
            BindError::NoFit(_) => "no-fit",
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

/// `POST /dra/prioritize`: kube-scheduler's prioritize verb for DRA pods (every pod of vgpu's
/// profile reaches it; pods without a pending claim of our class get 0 everywhere), scored by
/// [`crate::claim_score`].
async fn dra_prioritize(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let args: ExtenderArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            s.metrics
                .call("dra-prioritize", "bad-request", started.elapsed());
            return bad_request(format!("body is not ExtenderArgs JSON: {e}"));
        }
    };
    let names = candidates(&args);
    let scores = match (&args.pod, s.dra.get()) {
        (Some(pod), Some(dra)) => {
            let _span = tracing::info_span!("dra-prioritize", pod = %pod.key()).entered();
            dra.scores(pod, &names, read(&s.cluster).typical_pods())
        }
        _ => vec![0; names.len()],
    };
    let out: HostPriorityList = names
        .iter()
        .zip(scores)
        .map(|(n, score)| HostPriority {
            host: n.to_string(),
            score: i64::from(score),
        })
        .collect();
    s.metrics.call("dra-prioritize", "ok", started.elapsed());
    Json(out).into_response()
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
        .route("/dra/prioritize", post(dra_prioritize))
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

mod answer;
pub mod waiting;
use answer::{lean_args, JsonVerdicts, TypedVerdicts, Verdicts};

#[cfg(test)]
mod tests;
