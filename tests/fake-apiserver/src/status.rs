//! Errors as the API server returns them: an HTTP code with a `metav1.Status` body whose `reason`
//! and `details` clients switch on ("API concepts: Status", `StatusReason` in apimachinery).

use serde_json::{json, Value};

/// A failed call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code (404, 409, 410, 422, ...).
    pub code: u16,
    /// `metav1.StatusReason` (`NotFound`, `Conflict`, `AlreadyExists`, `Expired`, `Invalid`).
    pub reason: &'static str,
    /// Human-readable message, worded like the API server's.
    pub message: String,
    /// `details.name` / `details.kind` / `details.group`.
    pub details: Option<(String, String, String)>,
}

impl ApiError {
    /// 404 `<plural> "<name>" not found`.
    pub fn not_found(group: &str, plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{name}\" not found", qualified(group, plural)),
            details: Some((name.into(), kind.into(), group.into())),
        }
    }

    /// 409 AlreadyExists on create of an existing name.
    pub fn already_exists(group: &str, plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{name}\" already exists", qualified(group, plural)),
            details: Some((name.into(), kind.into(), group.into())),
        }
    }

    /// 409 Conflict on a stale resourceVersion (optimistic concurrency, "Resource versions" in
    /// API concepts), with the API server's exact wording.
    pub fn conflict(group: &str, plural: &str, kind: &str, name: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; \
                 please apply your changes to the latest version and try again",
                qualified(group, plural)
            ),
            details: Some((name.into(), kind.into(), group.into())),
        }
    }

    /// 410 Expired: a watch or continue token older than the retained history ("Efficient
    /// detection of changes": clients must re-list).
    pub fn gone(rv: u64) -> ApiError {
        ApiError {
            code: 410,
            reason: "Expired",
            message: format!("too old resource version: {rv}"),
            details: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// 422 Invalid.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            code: 422,
            reason: "Invalid",
            message: message.into(),
            details: None,
        }
    }

    /// An injected failure with an arbitrary code.
    pub fn injected(code: u16) -> ApiError {
        let reason = match code {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            409 => "Conflict",
            403 => "Forbidden",
            _ => "Unknown",
        };
        ApiError {
            code,
            reason,
            message: format!("injected failure ({code})"),
            details: None,
        }
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code});
        if let Some((name, kind, group)) = &self.details {
            s["details"] = json!({"name": name, "kind": kind, "group": group});
        }
        s
    }
}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}
