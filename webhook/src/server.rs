//! The HTTP surface: `POST /mutate`, `POST /mutate-dra`, `POST /validate`, `GET /healthz`, `GET /readyz`, `GET /metrics`.
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
use crate::dra::DraMutator;
use crate::metrics::{AdmissionLabels, Metrics};
use crate::mutate::{mutate_pod, MutateError, MutateSettings};
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
    /// DRA mode's mutation (`/mutate-dra`).
    pub dra: DraMutator,
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
        let validator = Validator::offline(settings, metrics.clone());
        AppState {
            dra: DraMutator::new(
                mutate.policy.clone(),
                mutate.scheduler_name.clone(),
                None,
                validator.cache().clone(),
            ),
            mutate,
            validator,
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
            dra: DraMutator::new(
                mutate.policy.clone(),
                mutate.scheduler_name.clone(),
                None,
                validator.cache().clone(),
            ),
            mutate,
            validator,
            metrics,
        }
    }

    /// The same state with DRA mode's mutation given.
    pub fn with_dra(mut self, dra: DraMutator) -> AppState {
        self.dra = dra;
        self
    }
}

/// The router, without a listener: tests drive it with `oneshot`.
pub fn app(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/mutate-dra", post(mutate_dra))
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

/// The answer to a body that is not a review: counted, logged, 400.
fn not_a_review(
    state: &AppState,
    endpoint: &'static str,
    started: Instant,
    e: &dyn std::fmt::Display,
) -> Response {
    tracing::info!(endpoint, decision = "bad-request", error = %e, "admission");
    state.metrics.admission(
        AdmissionLabels {
            endpoint,
            decision: "bad-request",
            reason: "not-a-review",
        },
        started.elapsed(),
    );
    bad_request(e.to_string())
}

async fn validate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match AdmissionRequest::from_review_bytes(&body) {
        Ok(r) => r,
        Err(e) => return not_a_review(&state, "validate", started, &e),
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
    let request = match AdmissionRequest::from_review_bytes(&body) {
        Ok(r) => r,
        Err(e) => return not_a_review(&state, "mutate", started, &e),
    };
    let (response, decision) = decide_mutation(&request, &state.mutate);
    answer_mutation(&state, "mutate", started, &request, response, decision)
}

async fn mutate_dra(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = Instant::now();
    let request = match AdmissionRequest::from_review_bytes(&body) {
        Ok(r) => r,
        Err(e) => return not_a_review(&state, "mutate-dra", started, &e),
    };
    let (response, decision) = state.dra.decide(&request).await;
    answer_mutation(&state, "mutate-dra", started, &request, response, decision)
}

/// Counts and logs a mutating decision, and writes its review.
fn answer_mutation(
    state: &AppState,
    endpoint: &'static str,
    started: Instant,
    request: &AdmissionRequest,
    response: AdmissionResponse,
    decision: &'static str,
) -> Response {
    state.metrics.admission(
        AdmissionLabels {
            endpoint,
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
        endpoint,
        uid = %request.uid,
        namespace = request.namespace.as_deref().unwrap_or(""),
        pod = request.object_name(),
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
    let pod = match request.created(request.is_pod()) {
        Ok(pod) => pod,
        Err(e) => return e.answer(&request.uid),
    };
    let allow = AdmissionResponse::allow(&request.uid);
    match mutate_pod(pod, settings) {
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
    use http_body_util::BodyExt;
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

    /// Odd bodies and odd pods, each answered by the one read: what each is told.
    #[test]
    fn odd_shapes_get_an_answer_naming_what_is_wrong() {
        let settings = MutateSettings::default();
        let gpu = json!({"limits": {"nvidia.com/gpu": "1"}});
        let decided = |body: String| match AdmissionRequest::from_review_bytes(body.as_bytes()) {
            Ok(req) => {
                let (resp, label) = decide_mutation(&req, &settings);
                let msg = resp.status.as_ref().map(|s| (s.code, s.message.clone()));
                Ok((label, msg))
            }
            Err(e) => Err(e.to_string()),
        };
        // (object, decision, denial code and a word its message must contain)
        type Case = (serde_json::Value, &'static str, Option<(u16, &'static str)>);
        let cases: Vec<Case> = vec![
            (
                json!({"metadata": "x", "spec": {"containers": [{"name": "c", "resources": gpu}]}}),
                "patched",
                None,
            ),
            (
                json!({"spec": {"containers": {"name": "c"}}}),
                "invalid",
                Some((400, "spec.containers")),
            ),
            (
                json!({"spec": {"containers": [7]}}),
                "invalid",
                Some((400, "spec.containers[0]")),
            ),
            (
                json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": true}}}]}}),
                "invalid",
                Some((400, "nvidia.com/gpu")),
            ),
            (
                json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpucores": "150"}}}]}}),
                "invalid",
                Some((422, "nvidia.com/gpucores")),
            ),
            (
                json!({"spec": {"ephemeralContainers": [{"name": "e", "resources": gpu}], "containers": []}}),
                "invalid",
                Some((422, "ephemeral")),
            ),
            (json!({"spec": "nope"}), "invalid", Some((400, "spec"))),
            (json!({"spec": null}), "no-vgpu", None),
            (json!(null), "invalid", Some((400, "request.object"))),
            (json!([1, 2]), "no-vgpu", None),
        ];
        for (object, label, status) in cases {
            let got = decided(review(object.clone())).unwrap_or_else(|e| panic!("{object}: {e}"));
            assert_eq!(got.0, label, "{object}: {got:?}");
            match (status, got.1) {
                (None, None) => {}
                (Some((code, field)), Some((c, m))) => {
                    assert_eq!(c, code, "{object}: {m}");
                    assert!(m.contains(field), "{object}: {m} does not name {field}");
                }
                (want, got) => panic!("{object}: status {want:?} vs {got:?}"),
            }
        }
        // Not a review: the error says why.
        for (body, why) in [
            ("{not json".to_string(), "body is not an AdmissionReview"),
            (r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":""}}"#.into(), "request.uid is missing"),
            (review(json!({"status": 1})).replace("\"status\":1", "\"status\":1e400"), "body is not an AdmissionReview"),
        ] {
            let e = decided(body.clone()).expect_err(&body);
            assert!(e.contains(why), "{body}: {e}");
        }
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
