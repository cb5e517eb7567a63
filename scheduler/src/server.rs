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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::exposition;
use vgpu_core::placement::{PodRequest, Policy};
use vgpu_core::request::RequestPolicy;

use crate::cache::Cluster;
use crate::extender::{
    node_name, ExtenderArgs, ExtenderBindingArgs, ExtenderBindingResult, ExtenderFilterResult,
    HostPriority, HostPriorityList, NodeList,
};
use crate::metrics::Metrics;
use crate::pod;

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
        }
    }
}

/// Scores kept between a pod's filter and its prioritize call.
const SCORE_CACHE_PODS: usize = 256;

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
    /// Whether the node watch has listed once.
    pub nodes_synced: AtomicBool,
    /// Whether the pod watch has listed once.
    pub pods_synced: AtomicBool,
    /// Pod UID to the hash of the node names its last filter passed, and their scores in order.
    scores: Mutex<HashMap<String, (u64, Vec<u32>)>>,
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
        AppState {
            cluster: RwLock::new(Cluster::new(
                settings.heartbeat_timeout,
                settings.assume_ttl,
            )),
            settings,
            metrics: Metrics::new(),
            client,
            nodes_synced: AtomicBool::new(false),
            pods_synced: AtomicBool::new(false),
            scores: Mutex::new(HashMap::new()),
        }
    }

    /// Whether both watches have listed once.
    pub fn ready(&self) -> bool {
        self.nodes_synced.load(Ordering::Relaxed) && self.pods_synced.load(Ordering::Relaxed)
    }

    fn request(&self, pod: &Pod) -> Result<Option<PodRequest>, pod::PodError> {
        pod::pod_request(
            pod,
            &self.settings.request_policy,
            self.settings.node_policy,
            self.settings.gpu_policy,
        )
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
            result.error = "extender args carry no pod".into();
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
        let mut passed: Vec<&str> = Vec::with_capacity(names.len());
        let mut scores: Vec<u32> = Vec::with_capacity(names.len());
        {
            let cluster = read(&self.cluster);
            let scorer = cluster.scorer(&req, now);
            for n in &names {
                match scorer.score(n) {
                    Ok(score) => {
                        passed.push(n);
                        scores.push(score);
                    }
                    Err(why) => {
                        result.failed_nodes.insert(n.to_string(), why);
                    }
                }
            }
        }
        if let Some(list) = &args.nodes {
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
            let hash = crate::cache::names_hash(passed.iter().copied());
            let mut cache = lock(&self.scores);
            if cache.len() >= SCORE_CACHE_PODS {
                cache.clear();
            }
            cache.insert(uid.to_string(), (hash, scores));
        }
        result
    }

    /// The prioritize verb: a score 0..=10 per candidate node under the pod's node policy; the
    /// scores of the pod's last filter when there is one.
    pub fn prioritize(&self, args: &ExtenderArgs, now: u64) -> HostPriorityList {
        let names = candidates(args);
        let Some(pod) = &args.pod else {
            return Vec::new();
        };
        let cached = pod
            .metadata
            .uid
            .as_deref()
            .and_then(|uid| lock(&self.scores).remove(uid));
        let req = match self.request(pod) {
            Ok(Some(r)) => r,
            _ => {
                return names
                    .iter()
                    .map(|n| HostPriority {
                        host: n.to_string(),
                        score: 0,
                    })
                    .collect()
            }
        };
        // The filter's scores, when asked about exactly the nodes it passed (the usual case).
        let cached = cached.and_then(|(hash, scores)| {
            (scores.len() == names.len() && hash == crate::cache::names_hash(names.iter().copied()))
                .then_some(scores)
        });
        let cluster = read(&self.cluster);
        let scorer = cluster.scorer(&req, now);
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let score = cached
                    .as_ref()
                    .map(|c| c[i])
                    .or_else(|| scorer.score(n).ok())
                    .unwrap_or(0);
                HostPriority {
                    host: n.to_string(),
                    score: i64::from(score),
                }
            })
            .collect()
    }

    /// The bind verb: place the pod on the chosen node (assumed under the lock), write its
    /// assignment annotation, then create the Binding; on any failure undo both.
    pub async fn bind(&self, args: &ExtenderBindingArgs) -> Result<(), BindError> {
        let client = self.client.clone().ok_or(BindError::NoClient)?;
        let pods: Api<Pod> = Api::namespaced(client, &args.pod_namespace);
        let pod = pods
            .get(&args.pod_name)
            .await
            .map_err(|e| BindError::Get(e.to_string()))?;
        if !args.pod_uid.is_empty() && pod.metadata.uid.as_deref() != Some(args.pod_uid.as_str()) {
            return Err(BindError::UidChanged);
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let req = self
            .request(&pod)
            .map_err(|e| BindError::Pod(e.to_string()))?;
        let mut annotated = false;
        if let Some(req) = &req {
            let assignment = write(&self.cluster)
                .assume(&uid, &args.node, req, unix_now(), Instant::now())
                .map_err(BindError::NoFit)?;
            let patch = json!({"metadata": {"annotations": {ASSIGNMENT: assignment.encode()}}});
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

async fn filter(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let args: ExtenderArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            s.metrics.call("filter", "bad-request", started.elapsed());
            return bad_request(format!("body is not ExtenderArgs JSON: {e}"));
        }
    };
    let r = s.filter(&args, unix_now());
    let result = if r.error.is_empty() { "ok" } else { "error" };
    s.metrics.call("filter", result, started.elapsed());
    Json(r).into_response()
}

async fn prioritize(State(s): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let args: ExtenderArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            s.metrics
                .call("prioritize", "bad-request", started.elapsed());
            return bad_request(format!("body is not ExtenderArgs JSON: {e}"));
        }
    };
    let r = s.prioritize(&args, unix_now());
    s.metrics.call("prioritize", "ok", started.elapsed());
    Json(r).into_response()
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
            ExtenderBindingResult {
                error: e.to_string(),
            }
        }
    };
    Json(r).into_response()
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
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(s): State<Arc<AppState>>) -> Response {
    if s.ready() {
        "ok".into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first list of nodes and vGPU pods",
        )
            .into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    s.metrics.refresh(&read(&s.cluster), unix_now());
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
            }]);
            write(&s.cluster).apply_node(node, Some(&inv.encode()), Some(&now));
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
        let args = json!({"pod": pod(json!({"nvidia.com/gpumem": "8192"})),
            "nodenames": ["big", "small", "gone"]});
        let (code, r) = call(extender_app(s.clone()), "/filter", args.clone()).await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["nodenames"], json!(["big"]));
        assert_eq!(
            r["failedNodes"]["small"],
            "small: no GPU with 8192 MiB free (largest 4096 MiB on GPU-small)"
        );
        assert_eq!(
            r["failedNodes"]["gone"],
            "gone: not known to the vGPU extender (no Node object seen)"
        );
        let (_, p) = call(
            extender_app(s.clone()),
            "/prioritize",
            json!({"pod": args["pod"], "nodenames": ["big"]}),
        )
        .await;
        // Binpack: half of the card's memory, no cores: a quarter used, score 3 of 10.
        assert_eq!(p, json!([{"host": "big", "score": 3}]));
        // Without a cached filter, prioritize computes the same.
        let (_, p) = call(
            extender_app(s),
            "/prioritize",
            json!({"pod": args["pod"], "nodenames": ["big", "small"]}),
        )
        .await;
        assert_eq!(
            p,
            json!([{"host": "big", "score": 3}, {"host": "small", "score": 0}])
        );
    }

    #[tokio::test]
    async fn filter_with_whole_nodes_returns_whole_nodes() {
        let s = state();
        let args = json!({"pod": pod(json!({"nvidia.com/gpumem": "8192"})),
            "nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [
                {"metadata": {"name": "big", "labels": {"a": "b"}}},
                {"metadata": {"name": "small"}}]}});
        let (_, r) = call(extender_app(s), "/filter", args).await;
        assert_eq!(
            r["nodes"]["items"],
            json!([{"metadata": {"name": "big", "labels": {"a": "b"}}}])
        );
        assert_eq!(r["nodes"]["kind"], "NodeList");
        assert!(r.get("nodenames").is_none());
        assert!(r["failedNodes"]["small"].is_string());
    }

    #[tokio::test]
    async fn non_vgpu_pods_pass_and_bad_requests_are_unresolvable() {
        let s = state();
        let (_, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"pod": pod(json!({"cpu": "1"})), "nodenames": ["big", "x"]}),
        )
        .await;
        assert_eq!(r["nodenames"], json!(["big", "x"]));
        let (_, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"pod": pod(json!({"nvidia.com/gpucores": "150"})), "nodenames": ["big"]}),
        )
        .await;
        assert_eq!(r["nodenames"], json!([]));
        assert_eq!(
            r["failedAndUnresolvableNodes"]["big"],
            "big: container \"main\": nvidia.com/gpucores: 150 is out of range 0-100"
        );
        // Whole nodes beyond axum's 2 MiB default are still read.
        let items: Vec<Value> = (0..600)
            .map(|i| json!({"metadata": {"name": format!("n{i}")}, "status": {"images": [{"names": ["x".repeat(4096)]}]}}))
            .collect();
        let (code, r) = call(
            extender_app(s.clone()),
            "/filter",
            json!({"pod": pod(json!({"cpu": "1"})), "nodes": {"items": items}}),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["nodes"]["items"].as_array().unwrap().len(), 600);
        let (code, body) = call(extender_app(s.clone()), "/filter", json!([1])).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        assert!(body.as_str().unwrap().contains("not ExtenderArgs JSON"));
        let (code, _) = call(extender_app(s.clone()), "/bind", json!({"podName": 3})).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        // Bind without an API client answers an error, not a crash.
        let (code, r) = call(
            extender_app(s),
            "/bind",
            json!({"podName": "p", "podNamespace": "ns", "podUID": "u", "node": "big"}),
        )
        .await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(r["error"], "no API client configured");
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
        s.nodes_synced.store(true, Ordering::Relaxed);
        s.pods_synced.store(true, Ordering::Relaxed);
        assert_eq!(get("/readyz").await.0, StatusCode::OK);
        let (_, ct, text) = get("/metrics").await;
        assert_eq!(ct.as_deref(), Some(exposition::PROMETHEUS_TEXT));
        assert!(
            text.contains("vgpu_scheduler_nodes{state=\"ready\"} 2"),
            "{text}"
        );
    }
}
