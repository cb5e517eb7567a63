//! The HTTP surface: `POST /mutate`, `POST /validate`, `GET /healthz`, `GET /readyz`, `GET /metrics`.
//!
//! Every well-formed review gets a review back, whatever the decision; only bodies that are not
//! reviews get 400, and bodies over [`MAX_BODY_BYTES`] get 413 before they are read whole.

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

use crate::admission::{AdmissionRequest, AdmissionResponse, ReviewOut};
use crate::metrics::{AdmissionLabels, Metrics};
use crate::mutate::{mutate_pod, mutate_view, MutateError, MutateSettings, Mutation};
use crate::podview::PodView;
use crate::validate::{ValidateSettings, Validator};

/// Largest review body accepted: the API server's own request limit is 3 MiB.
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// Mutation settings.
    pub mutate: MutateSettings,
    /// The validating decision and its view of the cluster.
    pub validator: Validator,
    /// Counters and histograms served at `/metrics`.
    pub metrics: Arc<Metrics>,
}

impl AppState {
    /// State with fresh metrics and an offline validator (policy rules only, no quota).
    pub fn new(mutate: MutateSettings) -> AppState {
        let metrics = Arc::new(Metrics::new());
        let settings = ValidateSettings {
            policy: mutate.policy.clone(),
            ..ValidateSettings::default()
        };
        AppState {
            mutate,
            validator: Validator::offline(settings, metrics.clone()),
            metrics,
        }
    }

    /// State with a given validator, sharing `metrics` with it.
    pub fn with_validator(
        mutate: MutateSettings,
        validator: Validator,
        metrics: Arc<Metrics>,
    ) -> AppState {
        AppState {
            mutate,
            validator,
            metrics,
        }
    }
}

/// The router, without a listener: tests drive it with `oneshot`.
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Health and metrics alone (`--health-listen`): plain HTTP for the kubelet's probes and
/// Prometheus, which present no client certificate when the admission port requires one. No
/// admission endpoint is reachable here.
pub fn health_app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// A 400 for a body that is not a review, as a metav1.Status.
fn bad_request(message: String) -> Response {
    let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": "BadRequest", "code": 400});
    (StatusCode::BAD_REQUEST, Json(status)).into_response()
}

/// OpenMetrics when the scraper asks for it (Prometheus does), the classic text format otherwise.
async fn metrics(State(state): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    use vgpu_core::exposition;
    let accept = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok());
    let text = state.metrics.scrape(|| state.validator.refresh_metrics());
    let (content_type, body) = exposition::negotiate(accept, text);
    ([(axum::http::header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Ready while the validator's caches hold a complete LIST and their watches are healthy (always,
/// without API access); the 503 body names each cache that is not and why.
async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    match state.validator.readiness() {
        Ok(()) => (StatusCode::OK, "ok").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
    }
}

async fn validate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match AdmissionRequest::from_review_bytes(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(endpoint = "validate", decision = "bad-request", error = %e, "admission");
            state.metrics.admission(
                AdmissionLabels {
                    endpoint: "validate",
                    decision: "bad-request",
                    reason: "not-a-review",
                },
                started.elapsed(),
            );
            return bad_request(e.to_string());
        }
    };
    let (response, decision) = state.validator.decide(&request).await;
    let allowed = response.allowed;
    state.metrics.admission(
        AdmissionLabels {
            endpoint: "validate",
            decision: if allowed { "allowed" } else { "denied" },
            reason: decision,
        },
        started.elapsed(),
    );
    tracing::info!(
        endpoint = "validate",
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or(""),
        pod = request.object_name(),
        decision,
        allowed,
        message = response.status.as_ref().map(|s| s.message.as_str()).unwrap_or(""),
        duration_us = started.elapsed().as_micros() as u64,
        "admission"
    );
    review_response(&response.into_review())
}

async fn mutate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    // Well-formed pods, nearly all of them, are read as a view borrowed from the body; the others
    // are read as `Value`s and answered as they always were (see `podview`).
    if let Some(request) = AdmissionRequest::<PodView<'_>>::for_mutation_fast(&body) {
        let (response, decision) = decide_mutation_view(&request, &state.mutate);
        let name = request.object_name();
        return answer_mutation(&state, started, &request, name, response, decision);
    }
    let request = match AdmissionRequest::for_mutation(&body) {
        Ok(r) => r,
        Err(e) => {
            tracing::info!(endpoint = "mutate", decision = "bad-request", error = %e, "admission");
            state.metrics.admission(
                AdmissionLabels {
                    endpoint: "mutate",
                    decision: "bad-request",
                    reason: "not-a-review",
                },
                started.elapsed(),
            );
            return bad_request(e.to_string());
        }
    };
    let (response, decision) = decide_mutation(&request, &state.mutate);
    answer_mutation(
        &state,
        started,
        &request,
        request.object_name(),
        response,
        decision,
    )
}

/// Counts and logs a mutating decision, and writes its review.
fn answer_mutation<O>(
    state: &AppState,
    started: Instant,
    request: &AdmissionRequest<O>,
    name: &str,
    response: AdmissionResponse,
    decision: &'static str,
) -> Response {
    state.metrics.admission(
        AdmissionLabels {
            endpoint: "mutate",
            decision: if response.allowed {
                "allowed"
            } else {
                "denied"
            },
            reason: decision,
        },
        started.elapsed(),
    );
    tracing::info!(
        endpoint = "mutate",
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or(""),
        pod = name,
        decision,
        duration_us = started.elapsed().as_micros() as u64,
        "admission"
    );
    review_response(&response.into_review())
}

/// A review as `application/json`, as `axum::Json` writes it, into a buffer sized for it at once
/// (`Json` starts at 128 bytes and grows, copying, while the patch is written).
fn review_response(review: &ReviewOut) -> Response {
    let r = &review.response;
    let size = 160
        + r.uid.len()
        + r.patch.as_ref().map_or(0, String::len)
        + r.status.as_ref().map_or(0, |s| 64 + s.message.len())
        + r.warnings.iter().map(|w| 4 + w.len()).sum::<usize>();
    let mut buf = Vec::with_capacity(size);
    match review.write_json(&mut buf) {
        Ok(()) => {
            let mut resp = Response::new(axum::body::Body::from(buf));
            resp.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                axum::http::HeaderValue::from_static("application/json"),
            );
            resp
        }
        // What `axum::Json` answers when serialising fails (it cannot here: strings and numbers).
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The mutating decision for a parsed request, with a one-word label for logs and metrics.
pub fn decide_mutation(
    request: &AdmissionRequest,
    settings: &MutateSettings,
) -> (AdmissionResponse, &'static str) {
    decide(request, |pod| mutate_pod(pod, settings))
}

/// [`decide_mutation`] for a request read with [`AdmissionRequest::for_mutation_fast`].
pub fn decide_mutation_view(
    request: &AdmissionRequest<PodView<'_>>,
    settings: &MutateSettings,
) -> (AdmissionResponse, &'static str) {
    decide(request, |pod| mutate_view(pod, settings))
}

fn decide<O>(
    request: &AdmissionRequest<O>,
    mutate: impl FnOnce(&O) -> Result<Mutation, MutateError>,
) -> (AdmissionResponse, &'static str) {
    let allow = AdmissionResponse::allow(&request.uid);
    let is_pod = request.kind.kind == "Pod" && request.kind.group.is_empty();
    if !is_pod || request.operation != "CREATE" || request.sub_resource.is_some() {
        return (allow, "skipped");
    }
    let Some(pod) = &request.object else {
        return (
            allow.deny(400, "BadRequest", "vgpu: request.object is missing"),
            "invalid",
        );
    };
    match mutate(pod) {
        Ok(m) if !m.vgpu => (allow, "no-vgpu"),
        Ok(m) if m.patch.0.is_empty() => (allow.with_warnings(m.warnings), "unchanged"),
        Ok(m) => (
            allow.with_patch(&m.patch).with_warnings(m.warnings),
            "patched",
        ),
        Err(e @ MutateError::Request(_)) => {
            (allow.deny(422, "Invalid", format!("vgpu: {e}")), "invalid")
        }
        Err(e @ MutateError::Shape(_)) => (
            allow.deny(400, "BadRequest", format!("vgpu: {e}")),
            "invalid",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use base64::Engine as _;
    use http_body_util::BodyExt;
    use serde_json::Value;
    use tower::ServiceExt;

    fn router() -> Router {
        app(Arc::new(AppState::new(MutateSettings::default())))
    }

    async fn post(body: impl Into<Body>) -> (StatusCode, serde_json::Value) {
        let req = Request::post("/mutate")
            .header("content-type", "application/json")
            .body(body.into())
            .unwrap();
        let resp = router().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    fn review(object: serde_json::Value) -> String {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
            "namespace": "ns", "object": object}}).to_string()
    }

    /// The fast read on generated reviews (`generated_reviews`): it takes no body the whole
    /// read refuses, and answers every body it takes as the whole read does. Each patched pod is
    /// sent again, once as patched (an empty patch) and once slightly edited (in-place fixes).
    #[test]
    fn the_fast_read_answers_generated_reviews_as_the_whole_read() {
        let settings = MutateSettings {
            runtime_class: Some("vgpu".into()),
            ..MutateSettings::default()
        };
        let whole = |body: &str| match AdmissionRequest::from_review_bytes(body.as_bytes()) {
            Ok(req) => {
                let (resp, label) = decide_mutation(&req, &settings);
                let review = serde_json::to_string(&resp.into_review()).unwrap();
                Ok((review, label, req.object_name().to_string()))
            }
            Err(e) => Err(e.to_string()),
        };
        let mut labels = std::collections::BTreeMap::new();
        let mut check = |body: &str| {
            let expected = whole(body);
            if let Some(req) = AdmissionRequest::<PodView<'_>>::for_mutation_fast(body.as_bytes()) {
                let (resp, label) = decide_mutation_view(&req, &settings);
                let review = serde_json::to_string(&resp.into_review()).unwrap();
                *labels.entry(label).or_insert(0) += 1;
                let fast = Ok((review, label, req.object_name().to_string()));
                assert_eq!(fast, expected, "{body}");
            }
            expected
        };
        let mut g = crate::generated_reviews::Gen::new(0x9E37_79B9_7F4A_7C15);
        for _ in 0..3000 {
            let pod = g.pod();
            let body = g.review(&pod);
            let Ok((review, _, _)) = check(&body) else {
                continue;
            };
            let answer: Value = serde_json::from_str(&review).unwrap();
            let Some(patch) = answer["response"]["patch"].as_str() else {
                continue;
            };
            let patch = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .unwrap();
            let patch: json_patch::Patch = serde_json::from_slice(&patch).unwrap();
            let mut patched: Value = serde_json::from_str(&pod).unwrap();
            json_patch::patch(&mut patched, &patch).unwrap();
            let again = patched.to_string();
            let _ = check(&g.review(&again));
            let edited = again.replacen("\"0\"", "\"1\"", 1).replacen("m\"", "\"", 1);
            let _ = check(&g.review(&edited));
        }
        // The fast read took many bodies, of every outcome the mutation has.
        for label in ["no-vgpu", "patched", "unchanged", "invalid", "skipped"] {
            assert!(labels.get(label).is_some_and(|&n| n >= 10), "{labels:?}");
        }
    }

    #[tokio::test]
    async fn patches_a_gpu_pod() {
        let (status, body) = post(review(json!({"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})))
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["response"]["uid"], "u");
        assert_eq!(body["response"]["allowed"], true);
        assert_eq!(body["response"]["patchType"], "JSONPatch");
    }

    #[tokio::test]
    async fn invalid_request_is_a_422_review() {
        let (status, body) = post(review(json!({"spec": {"containers": [
            {"name": "c", "resources": {"limits": {"nvidia.com/gpucores": "150"}}}]}})))
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["response"]["allowed"], false);
        assert_eq!(body["response"]["status"]["code"], 422);
        assert_eq!(
            body["response"]["status"]["message"],
            "vgpu: container \"c\": nvidia.com/gpucores: 150 is out of range 0-100"
        );
    }

    #[tokio::test]
    async fn bad_bodies_are_400_and_413() {
        let (status, body) = post("{not json").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["reason"], "BadRequest");
        let (status, _) = post(vec![b' '; MAX_BODY_BYTES + 1]).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let (status, body) = post(review(json!({"spec": {"containers": 7}}))).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            body["response"]["status"]["message"],
            "vgpu: object is not a valid Pod: spec.containers: expected an array"
        );
    }

    /// The two reads `/mutate` uses (the fast one where it takes the body, else the pruned one)
    /// answer every body exactly as the whole read does.
    #[test]
    fn the_pruned_and_fast_reads_decide_as_the_whole_read() {
        let settings = MutateSettings {
            runtime_class: Some("vgpu".into()),
            ..MutateSettings::default()
        };
        let gpu = json!({"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4Gi"},
            "requests": {"nvidia.com/gpucores": 30}});
        let objects = [
            json!({"metadata": {"name": "p", "labels": {"a": "b"}, "annotations": {"x": "y"}},
                "spec": {"containers": [{"name": "c", "image": "i", "resources": gpu,
                    "env": [{"name": "CUDA_DEVICE_SM_LIMIT", "value": "99"}, {"name": "A", "value": "b"},
                        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "valueFrom": null}, 4]}],
                    "initContainers": [{"name": "i", "resources": {"limits": {"nvidia.com/gpumem-percentage": "50"}}}],
                    "schedulerName": "volcano", "runtimeClassName": "other", "volumes": [{"name": "v"}]}}),
            json!({"metadata": {"generateName": "g-", "labels": {"vgpu.io/managed": "true"},
                "annotations": {"vgpu.io/injected": "forged"}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}),
            json!({"metadata": "x", "spec": {"containers": [{"name": "c", "resources": gpu}]}}),
            json!({"spec": {"containers": {"name": "c"}}}),
            json!({"spec": {"containers": [7]}}),
            json!({"spec": {"containers": [{"name": 3, "resources": {"limits": [1]}}]}}),
            json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": true}}}]}}),
            json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpucores": "150"}}}]}}),
            json!({"spec": {"ephemeralContainers": [{"name": "e", "resources": gpu}], "containers": []}}),
            json!({"spec": "nope"}),
            json!({"spec": null}),
            json!(null),
            json!([1, 2]),
        ];
        let mut bodies: Vec<String> = objects.iter().map(|o| review(o.clone())).collect();
        bodies.push(
            review(json!({"spec": {"containers": [{"name": "c", "resources": gpu}]}}))
                .replace("\"Pod\"", "\"Deployment\""),
        );
        bodies.push(review(json!({"status": 1e300})).replace("1e300", "1e400"));
        bodies.push(review(json!({"status": "s"})).replace("\"s\"", "\"\\ud800\""));
        bodies.push(r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u","object":{"spec":{}},"object":{}}}"#.into());
        bodies.push(
            r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":""}}"#
                .into(),
        );
        bodies.push("{not json".into());
        let answer = |r: Result<AdmissionRequest, crate::admission::ReviewError>| match r {
            Ok(req) => {
                let (resp, label) = decide_mutation(&req, &settings);
                Ok((
                    serde_json::to_string(&resp.into_review()).unwrap(),
                    label,
                    req.object_name().to_string(),
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        let mut fast_reads = 0;
        for body in &bodies {
            let whole = answer(AdmissionRequest::from_review_bytes(body.as_bytes()));
            let pruned = answer(AdmissionRequest::for_mutation(body.as_bytes()));
            assert_eq!(pruned, whole, "{body}");
            if let Some(req) = AdmissionRequest::<PodView<'_>>::for_mutation_fast(body.as_bytes()) {
                fast_reads += 1;
                let (resp, label) = decide_mutation_view(&req, &settings);
                let fast = (
                    serde_json::to_string(&resp.into_review()).unwrap(),
                    label,
                    req.object_name().to_string(),
                );
                assert_eq!(Ok(fast), whole, "{body}");
            }
        }
        // The well-formed ones: the first two pods, the non-Pod kind, the empty spec, no spec.
        assert!(fast_reads >= 5, "{fast_reads}");
        let example = include_bytes!("../../examples/admission-review.json");
        assert!(AdmissionRequest::<PodView<'_>>::for_mutation_fast(example).is_some());
    }

    #[tokio::test]
    async fn the_health_app_has_no_admission_endpoint() {
        let app = health_app(Arc::new(AppState::new(MutateSettings::default())));
        let resp = app
            .clone()
            .oneshot(Request::get("/readyz").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let resp = app
            .oneshot(Request::post("/mutate").body(Body::from("{}")).unwrap())
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn health_endpoints() {
        for path in ["/healthz", "/readyz"] {
            let resp = router()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
        }
    }
}
