//! Label and field selectors, as the list and watch query parameters `labelSelector` and
//! `fieldSelector` take them.
//!
//! Label selector syntax follows "Labels and Selectors" (equality-based `=`, `==`, `!=`; set-based
//! `in`, `notin`, `key`, `!key`; requirements joined by `,` are ANDed). Field selectors follow "Field
//! Selectors": `=`, `==`, `!=` on dotted field paths (`metadata.name`, `spec.nodeName`,
//! `status.phase`); a field that is absent compares as the empty string, as the API server does.

use serde_json::Value;

/// A parse failure; the API server answers these with 400 BadRequest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError(pub String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed selector: every requirement must hold. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    reqs: Vec<Req>,
    field: bool,
}

/// Splits on commas that are not inside parentheses (`a in (x,y),b`).
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn set_values(rest: &str) -> Result<Vec<String>, SelectorError> {
    let inner = rest
        .trim()
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(format!("expected (values) in {rest:?}")))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl Selector {
    /// Parses a label selector.
    pub fn labels(s: &str) -> Result<Selector, SelectorError> {
        Self::parse(s, false)
    }

    /// Parses a field selector.
    pub fn fields(s: &str) -> Result<Selector, SelectorError> {
        Self::parse(s, true)
    }

    fn parse(s: &str, field: bool) -> Result<Selector, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                Req::Ne(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if field {
                return Err(SelectorError(format!(
                    "invalid field selector requirement {part:?}"
                )));
            } else if let Some((k, rest)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set_values(rest)?)
            } else if let Some((k, rest)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set_values(rest)?)
            } else if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else {
                Req::Exists(part.into())
            };
            reqs.push(req);
        }
        Ok(Selector { reqs, field })
    }

    /// Whether the selector has no requirements.
    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    fn lookup(&self, obj: &Value, key: &str) -> Option<String> {
        let v = if self.field {
            key.split('.').try_fold(obj, |v, seg| v.get(seg))
        } else {
            obj.pointer("/metadata/labels").and_then(|l| l.get(key))
        };
        match v {
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Null) | None => None,
            Some(other) => Some(other.to_string()),
        }
    }

    /// Whether `obj` satisfies every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|r| {
            // Field selectors treat a missing field as "": `spec.nodeName=` selects unscheduled pods.
            let get = |k: &str| {
                let v = self.lookup(obj, k);
                if self.field {
                    Some(v.unwrap_or_default())
                } else {
                    v
                }
            };
            match r {
                Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
                Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
                Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
                Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
                Req::Exists(k) => get(k).is_some(),
                Req::NotExists(k) => get(k).is_none(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_forms() {
        let o = json!({"metadata": {"labels": {"app": "web", "tier": "fe"}}});
        for (s, want) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (db, web)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing notin (x)", true),
            ("!missing", true),
        ] {
            assert_eq!(Selector::labels(s).unwrap().matches(&o), want, "{s}");
        }
    }

    #[test]
    fn field_forms() {
        let o =
            json!({"metadata": {"name": "p", "namespace": "a"}, "status": {"phase": "Running"}});
        assert!(Selector::fields("metadata.name=p").unwrap().matches(&o));
        assert!(Selector::fields("spec.nodeName=").unwrap().matches(&o));
        assert!(
            Selector::fields("status.phase!=Succeeded,status.phase!=Failed")
                .unwrap()
                .matches(&o)
        );
        assert!(Selector::fields("bogus").is_err());
    }
}
