//! The HTTP surface: paths, query parameters and verbs mapped onto the store, in Kubernetes JSON.
//!
//! Paths follow "API concepts: resource URIs": `/api/v1/...` for the core group,
//! `/apis/GROUP/VERSION/...` otherwise; `namespaces/NS/PLURAL[/NAME[/SUBRESOURCE]]` for namespaced
//! types and `PLURAL[/NAME[/SUBRESOURCE]]` for cluster-scoped ones or lists across all namespaces.
//! Verbs: GET (get, list, `watch=true`), POST (create; `pods/NAME/binding`), PUT (update), PATCH,
//! DELETE. `dryRun=All` validates without persisting ("Dry-run").

use crate::faults::{Effect, RequestRecord};
use crate::resources::{lookup, ResourceType};
use crate::selector::Selector;
use crate::status::ApiError;
use crate::store::WatchParams;
use crate::Shared;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error(e: &ApiError) -> Response {
    json_response(e.code, &e.to_status())
}

/// What a path names.
struct Target {
    rt: ResourceType,
    ns: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let s = |x: &&str| x.to_string();
    let t = |rt, ns: Option<&&str>, name: Option<&&str>, sub: Option<&&str>| Target {
        rt,
        ns: ns.map(s),
        name: name.map(s),
        sub: sub.map(s),
    };
    Some(match rest {
        // A namespace object itself, and its status/finalize subresources.
        ["namespaces", name] => t(
            lookup(group, version, "namespaces", false),
            None,
            Some(name),
            None,
        ),
        ["namespaces", name, sub @ ("status" | "finalize")] => t(
            lookup(group, version, "namespaces", false),
            None,
            Some(name),
            Some(sub),
        ),
        ["namespaces", ns, plural, tail @ ..] if tail.len() <= 2 => t(
            lookup(group, version, plural, true),
            Some(ns),
            tail.first(),
            tail.get(1),
        ),
        [plural, tail @ ..] if tail.len() <= 2 => t(
            lookup(group, version, plural, false),
            None,
            tail.first(),
            tail.get(1),
        ),
        _ => return None,
    })
}

fn query_map(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => {
                match u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or(""), 16) {
                    Ok(v) => {
                        out.push(v);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The one handler: log, apply faults, dispatch.
pub async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let query = uri.query().unwrap_or("").to_string();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    shared.log(RequestRecord {
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        content_type: content_type.clone(),
        body: String::from_utf8_lossy(&body).into_owned(),
    });
    let q = query_map(&query);
    let target = parse_path(&path);
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = crate::faults::verb(
        method.as_str(),
        target.as_ref().is_some_and(|t| t.name.is_some()),
        watch,
    );
    let outcome = shared.faults().take(method.as_str(), verb, &path);
    if !outcome.delay.is_zero() {
        tokio::time::sleep(outcome.delay).await;
    }
    match outcome.effect {
        Effect::Delay => {}
        Effect::Fail(code) => return error(&ApiError::injected(code)),
        Effect::ExpireWatch => {
            let rv = q
                .get("resourceVersion")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            return watch_body(expired(rv), Duration::from_secs(60));
        }
    }
    if path == "/version" {
        // `GET /version`: the server's build, as `kubectl version` reads it.
        return json_response(
            200,
            &json!({"major": "1", "minor": "33",
            "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"}),
        );
    }
    let Some(target) = target else {
        return error(&ApiError {
            code: 404,
            reason: "NotFound",
            message: format!("the server could not find the requested resource ({path})"),
            details: None,
        });
    };
    match dispatch(&shared, &method, target, &q, &content_type, &body) {
        Ok(Reply::Object(code, v)) => json_response(code, &v),
        Ok(Reply::Watch(rx, timeout)) => watch_body(rx, timeout),
        Err(e) => error(&e),
    }
}

enum Reply {
    Object(u16, Value),
    Watch(
        tokio::sync::mpsc::UnboundedReceiver<crate::store::WatchEvent>,
        Duration,
    ),
}

fn selectors(q: &HashMap<String, String>) -> Result<(Selector, Selector), ApiError> {
    let l = Selector::labels(q.get("labelSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse labelSelector: {}", e.0)))?;
    let f = Selector::fields(q.get("fieldSelector").map_or("", String::as_str))
        .map_err(|e| ApiError::bad_request(format!("unable to parse fieldSelector: {}", e.0)))?;
    Ok((l, f))
}

fn dispatch(
    shared: &Shared,
    method: &Method,
    t: Target,
    q: &HashMap<String, String>,
    content_type: &str,
    body: &[u8],
) -> Result<Reply, ApiError> {
    let dry_run = q.get("dryRun").is_some_and(|v| v == "All");
    let ns = t.ns.clone().unwrap_or_default();
    let status_sub = t.sub.as_deref() == Some("status");
    let parse_body = || -> Result<Value, ApiError> {
        serde_json::from_slice(body).map_err(|e| ApiError::bad_request(format!("body: {e}")))
    };
    let mut store = shared.store();
    let created = |v: Value| Reply::Object(201, v);
    let ok = |v: Value| Reply::Object(200, v);
    match (method.as_str(), &t.name, t.sub.as_deref()) {
        ("GET", None, None) if q.get("watch").is_some_and(|w| w == "true" || w == "1") => {
            let (labels, fields) = selectors(q)?;
            let rv = q
                .get("resourceVersion")
                .filter(|v| !v.is_empty() && *v != "0")
                .map(|v| v.parse::<u64>())
                .transpose()
                .map_err(|_| ApiError::bad_request("invalid resourceVersion"))?;
            let params = WatchParams {
                namespace: t.ns.clone(),
                labels,
                fields,
                resource_version: rv,
                bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| v == "true"),
                send_initial_events: q.get("sendInitialEvents").is_some_and(|v| v == "true"),
            };
            // `timeoutSeconds` ends the watch; without it the server picks a random 30-60 min.
            let timeout = q
                .get("timeoutSeconds")
                .and_then(|s| s.parse().ok())
                .map_or(Duration::from_secs(1800), Duration::from_secs);
            match store.watch(&t.rt, params) {
                Ok(rx) => Ok(Reply::Watch(rx, timeout)),
                Err(e) if e.code == 410 => Ok(Reply::Watch(expired(rv.unwrap_or(0)), timeout)),
                Err(e) => Err(e),
            }
        }
        ("GET", None, None) => {
            let (labels, fields) = selectors(q)?;
            let limit = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(0);
            let page = store.list(
                &t.rt,
                t.ns.as_deref(),
                &labels,
                &fields,
                limit,
                q.get("continue").map(String::as_str),
            )?;
            let mut metadata = json!({"resourceVersion": page.resource_version.to_string()});
            if let Some(c) = page.continue_token {
                metadata["continue"] = c.into();
            }
            Ok(ok(
                json!({"apiVersion": t.rt.api_version(), "kind": format!("{}List", t.rt.kind),
                "metadata": metadata, "items": page.items}),
            ))
        }
        ("GET", Some(name), None | Some("status")) => Ok(ok(store.get(&t.rt, &ns, name)?)),
        ("POST", None, None) => Ok(created(store.create(&t.rt, &ns, parse_body()?, dry_run)?)),
        ("POST", Some(name), Some("binding")) if t.rt.plural == "pods" => {
            // pods/binding as `setPodNodeAndMetadata` (pkg/registry/core/pod/storage/storage.go):
            // sets spec.nodeName once (a bound pod answers 409 Conflict), with the Binding's UID
            // as a precondition, and copies the Binding's annotations and labels onto the pod in
            // the same write.
            let b = parse_body()?;
            let node = b
                .pointer("/target/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let pod = store.get(&t.rt, &ns, name)?;
            let want_uid = b.pointer("/metadata/uid").and_then(Value::as_str);
            let uid = pod.pointer("/metadata/uid").and_then(Value::as_str);
            if let (Some(want), Some(uid)) = (want_uid.filter(|u| !u.is_empty()), uid) {
                if want != uid {
                    return Err(ApiError {
                        code: 409,
                        reason: "Conflict",
                        message: format!(
                            "Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"
                        ),
                        details: None,
                    });
                }
            }
            if let Some(cur) = pod.pointer("/spec/nodeName").and_then(Value::as_str) {
                return Err(ApiError {
                    code: 409,
                    reason: "Conflict",
                    message: format!("pod {name} is already assigned to node \"{cur}\""),
                    details: None,
                });
            }
            let mut p = pod;
            p["spec"]["nodeName"] = node.into();
            for key in ["annotations", "labels"] {
                if let Some(Value::Object(add)) = b.pointer(&format!("/metadata/{key}")) {
                    if !p["metadata"][key].is_object() {
                        p["metadata"][key] = Value::Object(Default::default());
                    }
                    for (k, v) in add {
                        p["metadata"][key][k] = v.clone();
                    }
                }
            }
            let mut s = ApiError::invalid("").to_status();
            store.update(&t.rt, &ns, name, p, false, dry_run)?;
            s["status"] = "Success".into();
            s["code"] = 201.into();
            s["message"] = "".into();
            s["reason"] = "".into();
            Ok(created(s))
        }
        ("PUT", Some(name), None | Some("status")) => Ok(ok(store.update(
            &t.rt,
            &ns,
            name,
            parse_body()?,
            status_sub,
            dry_run,
        )?)),
        ("PATCH", Some(name), None | Some("status")) => Ok(ok(store.patch(
            &t.rt,
            &ns,
            name,
            content_type,
            body,
            status_sub,
            dry_run,
        )?)),
        ("DELETE", Some(name), None) => {
            let opts = if body.is_empty() {
                json!({})
            } else {
                parse_body()?
            };
            Ok(ok(store.delete(&t.rt, &ns, name, &opts, dry_run)?))
        }
        _ => Err(ApiError {
            code: 405,
            reason: "MethodNotAllowed",
            message: "the server does not allow this method on the requested resource".to_string(),
            details: None,
        }),
    }
}

/// A watch stream holding one ERROR event with a 410 Expired Status: an expired version is
/// reported inside the watch response, not as an HTTP error, the way the watch cache answers.
fn expired(rv: u64) -> tokio::sync::mpsc::UnboundedReceiver<crate::store::WatchEvent> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let _ = tx.send(crate::store::WatchEvent {
        kind: "ERROR",
        object: ApiError::gone(rv).to_status(),
    });
    rx
}

fn watch_body(
    rx: tokio::sync::mpsc::UnboundedReceiver<crate::store::WatchEvent>,
    timeout: Duration,
) -> Response {
    let deadline = tokio::time::Instant::now() + timeout;
    // A watch is one long response of newline-separated JSON events ("Efficient detection of
    // changes"); it ends at `timeoutSeconds` or after an ERROR event. An ABORT from the store
    // ends the body with an error, so the server cuts the connection without finishing the
    // response (no last chunk over HTTP/1.1, RST_STREAM over HTTP/2): what a client sees when
    // the API server process dies or a load balancer drops the connection.
    let stream = futures::stream::unfold(
        (rx, deadline, false),
        |(mut rx, deadline, done)| async move {
            if done {
                return None;
            }
            let ev = tokio::time::timeout_at(deadline, rx.recv())
                .await
                .ok()
                .flatten()?;
            if ev.kind == crate::store::ABORT {
                let cut = std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "watch dropped by fault injection",
                );
                return Some((Err(cut), (rx, deadline, true)));
            }
            let last = ev.kind == "ERROR";
            let mut line = json!({"type": ev.kind, "object": ev.object})
                .to_string()
                .into_bytes();
            line.push(b'\n');
            Some((Ok(Bytes::from(line)), (rx, deadline, last)))
        },
    );
    (
        StatusCode::OK,
        [("content-type", "application/json")],
        Body::from_stream(stream),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let t = parse_path("/api/v1/namespaces/a/pods/p/status").unwrap();
        assert_eq!(
            (
                t.rt.kind.as_str(),
                t.ns.as_deref(),
                t.name.as_deref(),
                t.sub.as_deref()
            ),
            ("Pod", Some("a"), Some("p"), Some("status"))
        );
        let t = parse_path("/api/v1/namespaces/a").unwrap();
        assert_eq!(
            (t.rt.kind.as_str(), t.name.as_deref()),
            ("Namespace", Some("a"))
        );
        let t = parse_path("/apis/events.k8s.io/v1/namespaces/a/events").unwrap();
        assert_eq!(
            (t.rt.api_version().as_str(), t.name),
            ("events.k8s.io/v1".to_string().as_str(), None)
        );
        let t = parse_path("/api/v1/pods").unwrap();
        assert!(t.ns.is_none() && t.name.is_none());
        assert!(parse_path("/healthz").is_none());
        assert_eq!(decode("a%3Db%2Cc+d"), "a=b,c d");
    }
}
