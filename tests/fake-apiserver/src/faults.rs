//! Fault injection and the request log.
//!
//! A fault makes the next N matching requests fail with an HTTP code (as the API server does under
//! load: 429 TooManyRequests, 500, 503, 504 Timeout, each with a `metav1.Status` body), wait
//! before being served (a slow etcd or an overloaded server), or, for watches, be answered with a
//! 410 Expired ERROR event. Requests match by method, path substring and Kubernetes verb (`list`
//! and `watch` are both `GET` on a collection; the verb tells them apart, as the API server's
//! RBAC and audit log do). Every request is logged before faults apply, so tests can assert what
//! a client sent even when it was refused.
//!
//! Open watches are broken with [`crate::FakeApiServer::drop_watches`] (the connection is cut
//! mid-stream) or ended cleanly with [`crate::FakeApiServer::close_watches`] (as `timeoutSeconds`
//! ends them); both live in [`crate::store`].

use std::time::Duration;

/// One request as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path without the query.
    pub path: String,
    /// Raw query string.
    pub query: String,
    /// Content-Type header.
    pub content_type: String,
    /// Body as text.
    pub body: String,
}

impl RequestRecord {
    /// Whether this is a watch request.
    pub fn is_watch(&self) -> bool {
        self.query
            .split('&')
            .any(|kv| kv == "watch=true" || kv == "watch=1")
    }
}

/// What a matching request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Wait, then serve normally.
    Delay,
    /// Wait, then fail with this HTTP code and a `metav1.Status` body.
    Fail(u16),
    /// (Watches) answer 200 with one ERROR event carrying a 410 `Expired` Status and end the
    /// stream: what the watch cache sends when the requested resourceVersion is older than it
    /// keeps ("Efficient detection of changes": the client must re-list).
    ExpireWatch,
}

/// A rule: which requests, how many, what happens.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Method to match (`None` = any).
    pub method: Option<String>,
    /// Kubernetes verb to match: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`
    /// (`None` = any).
    pub verb: Option<String>,
    /// Substring the path must contain (`None` = any).
    pub path_contains: Option<String>,
    /// How many more requests it applies to (`usize::MAX`: until [`Faults::clear`]).
    pub remaining: usize,
    /// What happens.
    pub effect: Effect,
    /// Wait before answering.
    pub delay: Duration,
}

impl Fault {
    fn matches(&self, method: &str, verb: &str, path: &str) -> bool {
        self.remaining > 0
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self.verb.as_deref().is_none_or(|v| v == verb)
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
            // Only a watch can be answered with a watch event.
            && (self.effect != Effect::ExpireWatch || verb == "watch")
    }
}

/// What to do with one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// Wait this long first.
    pub delay: Duration,
    /// Then do this.
    pub effect: Effect,
}

impl Outcome {
    const SERVE: Outcome = Outcome {
        delay: Duration::ZERO,
        effect: Effect::Delay,
    };
}

/// The fault rules and the "down" switch.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<Fault>,
    down: Option<u16>,
}

/// The Kubernetes verb of a request (as RBAC and the audit log name it), from its method, whether
/// the path names one object, and the `watch` query parameter.
pub fn verb(method: &str, names_object: bool, watch: bool) -> &'static str {
    match (method, names_object) {
        ("GET", false) if watch => "watch",
        ("GET", false) => "list",
        ("GET", true) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

impl Faults {
    /// Adds a rule; rules are tried in the order added.
    pub fn add(&mut self, f: Fault) {
        self.rules.push(f);
    }

    /// Every request fails with `code` until called again with `None`.
    pub fn set_down(&mut self, code: Option<u16>) {
        self.down = code;
    }

    /// Forgets every rule and the "down" switch.
    pub fn clear(&mut self) {
        self.rules.clear();
        self.down = None;
    }

    /// Consumes the first matching rule.
    pub fn take(&mut self, method: &str, verb: &str, path: &str) -> Outcome {
        if let Some(code) = self.down {
            return Outcome {
                delay: Duration::ZERO,
                effect: Effect::Fail(code),
            };
        }
        self.rules.retain(|f| f.remaining > 0);
        match self
            .rules
            .iter_mut()
            .find(|f| f.matches(method, verb, path))
        {
            Some(f) => {
                // `usize::MAX` means "until cleared".
                if f.remaining != usize::MAX {
                    f.remaining -= 1;
                }
                Outcome {
                    delay: f.delay,
                    effect: f.effect,
                }
            }
            None => Outcome::SERVE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(method: Option<&str>, verb: Option<&str>, n: usize, effect: Effect) -> Fault {
        Fault {
            method: method.map(Into::into),
            verb: verb.map(Into::into),
            path_contains: Some("configmaps".into()),
            remaining: n,
            effect,
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn rules_consume_in_order() {
        let mut f = Faults::default();
        f.add(fault(Some("PUT"), None, 1, Effect::Fail(409)));
        assert_eq!(f.take("GET", "list", "/api/v1/configmaps"), Outcome::SERVE);
        let p = "/api/v1/namespaces/a/configmaps/x";
        assert_eq!(f.take("put", "update", p).effect, Effect::Fail(409));
        assert_eq!(f.take("PUT", "update", p), Outcome::SERVE);
        f.set_down(Some(503));
        assert_eq!(f.take("GET", "get", "/").effect, Effect::Fail(503));
        f.clear();
        assert_eq!(f.take("GET", "get", "/"), Outcome::SERVE);
    }

    #[test]
    fn verbs_tell_lists_from_watches_and_expiry_applies_to_watches_only() {
        assert_eq!(verb("GET", false, true), "watch");
        assert_eq!(verb("GET", false, false), "list");
        assert_eq!(verb("GET", true, false), "get");
        let mut f = Faults::default();
        f.add(fault(None, None, 1, Effect::ExpireWatch));
        f.add(fault(None, Some("list"), usize::MAX, Effect::Fail(500)));
        let p = "/api/v1/configmaps";
        assert_eq!(f.take("GET", "list", p).effect, Effect::Fail(500));
        assert_eq!(f.take("GET", "watch", p).effect, Effect::ExpireWatch);
        assert_eq!(f.take("GET", "watch", p), Outcome::SERVE);
        for _ in 0..3 {
            assert_eq!(f.take("GET", "list", p).effect, Effect::Fail(500));
        }
        f.clear();
        assert_eq!(f.take("GET", "list", p), Outcome::SERVE);
    }
}
