//! Fault injection and the request log.
//!
//! A fault makes the next N matching requests fail with an HTTP code (as the API server does under
//! load: 429 TooManyRequests, 500, 503, 504 Timeout, each with a `metav1.Status` body) or wait
//! before being served. Every request is logged before faults apply, so tests can assert what a
//! client sent even when it was refused.

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

/// A rule: which requests, how many, what happens.
#[derive(Debug, Clone)]
pub struct Fault {
    /// Method to match (`None` = any).
    pub method: Option<String>,
    /// Substring the path must contain (`None` = any).
    pub path_contains: Option<String>,
    /// How many more requests it applies to.
    pub remaining: usize,
    /// HTTP code to fail with; `None` to only delay.
    pub code: Option<u16>,
    /// Wait before answering.
    pub delay: Duration,
}

impl Fault {
    fn matches(&self, method: &str, path: &str) -> bool {
        self.remaining > 0
            && self
                .method
                .as_deref()
                .is_none_or(|m| m.eq_ignore_ascii_case(method))
            && self
                .path_contains
                .as_deref()
                .is_none_or(|p| path.contains(p))
    }
}

/// The fault rules and the "down" switch.
#[derive(Debug, Default)]
pub struct Faults {
    rules: Vec<Fault>,
    down: Option<u16>,
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

    /// Consumes the first matching rule: (delay, code to fail with).
    pub fn take(&mut self, method: &str, path: &str) -> (Duration, Option<u16>) {
        if let Some(code) = self.down {
            return (Duration::ZERO, Some(code));
        }
        match self.rules.iter_mut().find(|f| f.matches(method, path)) {
            Some(f) => {
                f.remaining -= 1;
                (f.delay, f.code)
            }
            None => (Duration::ZERO, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_consume_in_order() {
        let mut f = Faults::default();
        f.add(Fault {
            method: Some("PUT".into()),
            path_contains: Some("configmaps".into()),
            remaining: 1,
            code: Some(409),
            delay: Duration::ZERO,
        });
        assert_eq!(f.take("GET", "/api/v1/configmaps").1, None);
        assert_eq!(
            f.take("put", "/api/v1/namespaces/a/configmaps/x").1,
            Some(409)
        );
        assert_eq!(f.take("PUT", "/api/v1/namespaces/a/configmaps/x").1, None);
        f.set_down(Some(503));
        assert_eq!(f.take("GET", "/").1, Some(503));
    }
}
