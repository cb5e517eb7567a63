//! admission.k8s.io/v1 AdmissionReview: the request we read and the response we write.
//!
//! Only the fields vgpu needs are modelled; unknown fields are ignored, as the API server may add
//! more. Responses are small values with constructors in the style of kube-core's
//! `AdmissionResponse`: [`AdmissionResponse::allow`], `.deny(..)`, `.with_patch(..)`,
//! `.into_review()`. The patch is written as a base64 string, which is what the API server
//! documents and expects (kube-rs issue #1781: its own type serialises bytes as a number array).

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use thiserror::Error;

/// The only review version we speak (`admissionReviewVersions: [v1]`).
pub const API_VERSION: &str = "admission.k8s.io/v1";

/// A review that cannot be answered at all: the HTTP call itself is bad (400).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ReviewError {
    /// The body is not JSON of the AdmissionReview shape.
    #[error("body is not an AdmissionReview: {0}")]
    Json(#[source] serde_json::Error),
    /// `apiVersion`/`kind` are not `admission.k8s.io/v1` `AdmissionReview`.
    #[error("unsupported review {api_version}/{kind}; this webhook speaks {API_VERSION} AdmissionReview")]
    Version {
        /// What was sent.
        api_version: String,
        /// What was sent.
        kind: String,
    },
    /// No `request`.
    #[error("AdmissionReview has no request")]
    NoRequest,
    /// No or empty `request.uid`: the answer could not be matched to the call.
    #[error("request.uid is missing or empty")]
    NoUid,
}

/// The review envelope, as received.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewIn {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    request: Option<AdmissionRequest>,
}

/// group/version/kind of the reviewed object.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    #[serde(default)]
    pub version: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
}

/// What the API server asks us to admit. Both endpoints read a request this one way: the object
/// whole, as a `Value` (the mutation borrows a [`crate::podview::PodView`] from it).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    /// Identifies this call; echoed in the response.
    #[serde(default)]
    pub uid: String,
    /// Kind of the object.
    #[serde(default)]
    pub kind: GroupVersionKind,
    /// Subresource (`status`, `binding`, ...), if the call is on one.
    #[serde(default)]
    pub sub_resource: Option<String>,
    /// Object name; may be empty at CREATE when generateName is used.
    #[serde(default)]
    pub name: Option<String>,
    /// Namespace of the object.
    #[serde(default)]
    pub namespace: Option<String>,
    /// CREATE, UPDATE, DELETE or CONNECT.
    #[serde(default)]
    pub operation: String,
    /// The object as it would be stored.
    #[serde(default)]
    pub object: Option<Value>,
    /// Whether this is a dry run (no side effects allowed).
    #[serde(default)]
    pub dry_run: Option<bool>,
    /// The object as it was before an UPDATE (absent for CREATE).
    #[serde(default)]
    pub old_object: Option<Value>,
    /// Who made the request, as the API server authenticated them.
    #[serde(default)]
    pub user_info: UserInfo,
}

/// authentication.k8s.io/v1 UserInfo of the requester (only what we read).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name, e.g. `system:serviceaccount:vgpu-system:vgpu-scheduler`.
    #[serde(default)]
    pub username: String,
}

/// The request of a review, if the envelope is one this webhook answers.
fn check_review(review: ReviewIn) -> Result<AdmissionRequest, ReviewError> {
    if review.api_version != API_VERSION || review.kind != "AdmissionReview" {
        return Err(ReviewError::Version {
            api_version: review.api_version,
            kind: review.kind,
        });
    }
    let request = review.request.ok_or(ReviewError::NoRequest)?;
    if request.uid.is_empty() {
        return Err(ReviewError::NoUid);
    }
    Ok(request)
}

impl AdmissionRequest {
    /// Reads a review body and returns its request, or why the body cannot be answered.
    pub fn from_review_bytes(body: &[u8]) -> Result<AdmissionRequest, ReviewError> {
        check_review(serde_json::from_slice(body).map_err(ReviewError::Json)?)
    }

    /// Whether the request is for a Pod of the core group (not one of its subresources).
    pub fn is_pod(&self) -> bool {
        self.kind.kind == "Pod" && self.kind.group.is_empty() && self.sub_resource.is_none()
    }

    /// The object of a CREATE that the handler decides (`handled`: the kind is its own), or why
    /// there is nothing to decide ([`NotDecided::answer`] gives the answer).
    pub fn created(&self, handled: bool) -> Result<&Value, NotDecided> {
        if !handled || self.operation != "CREATE" || self.sub_resource.is_some() {
            return Err(NotDecided::Skipped);
        }
        self.object.as_ref().ok_or(NotDecided::NoObject)
    }

    /// `metadata.name`, falling back to `metadata.generateName` and then the request's name, for logs.
    pub fn object_name(&self) -> &str {
        let from_pod = self
            .object
            .as_ref()
            .and_then(|o| o.get("metadata"))
            .and_then(|m| {
                m.get("name")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .or_else(|| m.get("generateName").and_then(Value::as_str))
            });
        from_pod.or(self.name.as_deref()).unwrap_or("")
    }
}

/// Why a handler answers a review without deciding it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotDecided {
    /// Not a kind, operation or subresource the handler decides: allowed.
    Skipped,
    /// A CREATE without its object: a 400.
    NoObject,
}

impl NotDecided {
    /// The answer to review `uid`, with its one-word label.
    pub fn answer(self, uid: &str) -> (AdmissionResponse, &'static str) {
        let allow = AdmissionResponse::allow(uid);
        match self {
            NotDecided::Skipped => (allow, "skipped"),
            NotDecided::NoObject => (
                allow.deny(400, "BadRequest", "vgpu: request.object is missing"),
                "invalid",
            ),
        }
    }
}

/// metav1.Status as carried in a denial.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Status {
    /// Always `Failure` for denials.
    pub status: &'static str,
    /// Human-readable reason, shown by kubectl.
    pub message: String,
    /// Machine-readable reason (`Invalid`, `Forbidden`, `BadRequest`).
    pub reason: &'static str,
    /// HTTP-style code (422, 403, 400).
    pub code: u16,
}

/// Our answer.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    /// Echo of the request uid.
    pub uid: String,
    /// The decision.
    pub allowed: bool,
    /// Denial details.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    /// `JSONPatch` when a patch is present.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    /// Base64 of the JSON patch.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
    /// Warnings shown to the client (kubectl prints them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    /// Allows the request unchanged.
    pub fn allow(uid: &str) -> Self {
        Self {
            uid: uid.to_string(),
            allowed: true,
            status: None,
            patch_type: None,
            patch: None,
            warnings: Vec::new(),
        }
    }

    /// Turns this into a denial with the given code and reason.
    pub fn deny(mut self, code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        self.allowed = false;
        self.patch = None;
        self.patch_type = None;
        self.status = Some(Status {
            status: "Failure",
            message: message.into(),
            reason,
            code,
        });
        self
    }

    /// Attaches a JSON patch; an empty patch attaches nothing.
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Self {
        if patch.0.is_empty() {
            return self;
        }
        // Serialising a Patch of Values cannot fail: it holds only strings and JSON values.
        let mut bytes = Vec::with_capacity(128 * patch.0.len());
        if serde_json::to_writer(&mut bytes, patch).is_err() {
            bytes.clear();
        }
        self.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
        self.patch_type = Some("JSONPatch");
        self
    }

    /// Adds warnings.
    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings.extend(warnings);
        self
    }

    /// Wraps the response into a full AdmissionReview body.
    pub fn into_review(self) -> ReviewOut {
        ReviewOut {
            api_version: API_VERSION,
            kind: "AdmissionReview",
            response: self,
        }
    }
}

/// The review we send back.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ReviewOut {
    /// Always [`API_VERSION`].
    pub api_version: &'static str,
    /// Always `AdmissionReview`.
    pub kind: &'static str,
    /// The answer.
    pub response: AdmissionResponse,
}

impl ReviewOut {
    /// Appends the review as JSON to `out`: the same bytes as `serde_json::to_writer`, but the
    /// base64 patch, most of the answer, is checked in one vectorised pass and copied as it is,
    /// instead of going through the escaping writer byte by byte (base64 has nothing to escape;
    /// a field that does is written by serde).
    pub fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        let r = &self.response;
        out.extend_from_slice(b"{\"apiVersion\":");
        serde_json::to_writer(&mut *out, self.api_version)?;
        out.extend_from_slice(b",\"kind\":");
        serde_json::to_writer(&mut *out, self.kind)?;
        out.extend_from_slice(b",\"response\":{\"uid\":");
        serde_json::to_writer(&mut *out, &r.uid)?;
        out.extend_from_slice(if r.allowed {
            b",\"allowed\":true"
        } else {
            b",\"allowed\":false"
        });
        if let Some(status) = &r.status {
            out.extend_from_slice(b",\"status\":");
            serde_json::to_writer(&mut *out, status)?;
        }
        if let Some(patch_type) = r.patch_type {
            out.extend_from_slice(b",\"patchType\":");
            serde_json::to_writer(&mut *out, patch_type)?;
        }
        if let Some(patch) = &r.patch {
            out.extend_from_slice(b",\"patch\":");
            // serde_json escapes exactly these bytes; a fold, not `any`, so that it vectorises.
            let needs_escape = patch.bytes().fold(false, |acc, b| {
                acc | (b < 0x20) | (b == b'"') | (b == b'\\')
            });
            if !needs_escape {
                out.push(b'"');
                out.extend_from_slice(patch.as_bytes());
                out.push(b'"');
            } else {
                serde_json::to_writer(&mut *out, patch)?;
            }
        }
        if !r.warnings.is_empty() {
            out.extend_from_slice(b",\"warnings\":");
            serde_json::to_writer(&mut *out, &r.warnings)?;
        }
        out.extend_from_slice(b"}}");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Shaped like a review the API server sends for `kubectl run` (trimmed user info).
    const REVIEW: &str = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1","resource":"pods"},"requestKind":{"group":"","version":"v1","kind":"Pod"},"namespace":"team-a","operation":"CREATE","userInfo":{"username":"alice","groups":["system:authenticated"]},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"train-","namespace":"team-a"},"spec":{"containers":[{"name":"c"}]}},"oldObject":null,"dryRun":false,"options":{"kind":"CreateOptions","apiVersion":"meta.k8s.io/v1"}}}"#;

    #[test]
    fn parses_a_real_review() {
        let r = AdmissionRequest::from_review_bytes(REVIEW.as_bytes()).unwrap();
        assert_eq!(r.uid, "705ab4f5-6393-11e8-b7cc-42010a800002");
        assert_eq!(r.kind.kind, "Pod");
        assert_eq!(r.operation, "CREATE");
        assert_eq!(r.namespace.as_deref(), Some("team-a"));
        assert_eq!(r.object_name(), "train-");
        assert_eq!(r.dry_run, Some(false));
    }

    #[test]
    fn rejects_unanswerable_bodies() {
        assert!(matches!(
            AdmissionRequest::from_review_bytes(b"{"),
            Err(ReviewError::Json(_))
        ));
        let no_uid = REVIEW.replace("705ab4f5-6393-11e8-b7cc-42010a800002", "");
        assert!(matches!(
            AdmissionRequest::from_review_bytes(no_uid.as_bytes()),
            Err(ReviewError::NoUid)
        ));
        let v1beta1 = REVIEW.replace("admission.k8s.io/v1", "admission.k8s.io/v1beta1");
        assert!(matches!(
            AdmissionRequest::from_review_bytes(v1beta1.as_bytes()),
            Err(ReviewError::Version { .. })
        ));
        let no_req = r#"{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1"}"#;
        assert!(matches!(
            AdmissionRequest::from_review_bytes(no_req.as_bytes()),
            Err(ReviewError::NoRequest)
        ));
    }

    /// The hand-written answer is byte for byte what serde writes, for every optional field.
    #[test]
    fn write_json_is_what_serde_writes() {
        let patch = json_patch::Patch(vec![json_patch::PatchOperation::Add(
            json_patch::AddOperation {
                path: json_patch::jsonptr::PointerBuf::from_tokens(["spec", "schedulerName"]),
                value: serde_json::json!("vgpu-scheduler"),
            },
        )]);
        let mut odd = AdmissionResponse::allow("u");
        odd.patch = Some("not \"base64\"\n".into());
        let mut unicode = AdmissionResponse::allow("u");
        unicode.patch = Some("ünïcode\u{7f}/+=".into());
        let cases = [
            AdmissionResponse::allow("705ab4f5-6393-11e8-b7cc-42010a800002"),
            AdmissionResponse::allow("u\"\\\u{1}").with_patch(&patch),
            AdmissionResponse::allow("u")
                .with_patch(&patch)
                .with_warnings(vec!["a \"quoted\" warning".into(), "ünïcode".into()]),
            AdmissionResponse::allow("u").deny(422, "Invalid", "vgpu: container \"c\": bad"),
            odd,
            unicode,
        ];
        for response in cases {
            let review = response.into_review();
            let mut ours = Vec::new();
            review.write_json(&mut ours).unwrap();
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(&review).unwrap()
            );
        }
    }

    #[test]
    fn response_wire_format() {
        let patch: json_patch::Patch = serde_json::from_str(
            r#"[{"op":"add","path":"/spec/schedulerName","value":"vgpu-scheduler"}]"#,
        )
        .unwrap();
        let body = AdmissionResponse::allow("u1")
            .with_patch(&patch)
            .with_warnings(vec!["w".into()])
            .into_review();
        assert_eq!(
            serde_json::to_string(&body).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u1","allowed":true,"patchType":"JSONPatch","patch":"W3sib3AiOiJhZGQiLCJwYXRoIjoiL3NwZWMvc2NoZWR1bGVyTmFtZSIsInZhbHVlIjoidmdwdS1zY2hlZHVsZXIifV0=","warnings":["w"]}}"#
        );
        let denied = AdmissionResponse::allow("u2")
            .with_patch(&patch)
            .deny(422, "Invalid", "bad")
            .into_review();
        assert_eq!(
            serde_json::to_string(&denied).unwrap(),
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"u2","allowed":false,"status":{"status":"Failure","message":"bad","reason":"Invalid","code":422}}}"#
        );
        let empty = AdmissionResponse::allow("u3")
            .with_patch(&json_patch::Patch(vec![]))
            .into_review();
        assert_eq!(empty.response.patch, None);
    }
}
