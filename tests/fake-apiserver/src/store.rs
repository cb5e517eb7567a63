//! The object store: every object as JSON under (type, namespace, name), one global
//! resourceVersion counter, a bounded change history for watches, and the open watches.
//!
//! Behaviours copied from "Kubernetes API Concepts" and "Resource versions":
//! - every write bumps one cluster-wide counter (etcd's revision) and stamps it as the object's
//!   `metadata.resourceVersion`; a write that changes nothing keeps the old version (no-op updates
//!   are not persisted);
//! - an update carrying a `resourceVersion` that is not the current one fails with 409 Conflict;
//!   an update without one is unconditional;
//! - a watch from version R replays every change after R; R older than the retained history
//!   ("compacted") gets 410 Expired; a watch without R (or R = "0") starts with synthetic ADDED
//!   events for the current objects;
//! - a watch with a selector sees an object that stops matching as DELETED and one that starts
//!   matching as ADDED (the watch cache's filtering);
//! - BOOKMARK events carry only `metadata.resourceVersion` and are sent only to watches that asked
//!   (`allowWatchBookmarks`); `sendInitialEvents` ends the synthetic ADDED events with a bookmark
//!   annotated `k8s.io/initial-events-end: "true"` (streaming lists, KEP-3157).
//!
//! Simplifications: lists are served from the current state, and a `continue` token resumes after
//! the last key of the previous page in the current state (the real server serves the snapshot the
//! first page was read at); deletes are immediate (no graceful deletion or finalizers); create
//! keeps a provided `.status` so tests can seed pods in any phase.

use crate::resources::ResourceType;
use crate::selector::Selector;
use crate::status::ApiError;
use base64::Engine;
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Internal event kind (never sent on the wire) that makes the HTTP layer cut a watch's
/// connection mid-stream.
pub const ABORT: &str = "ABORT";

/// One watch event as sent on the wire (`{"type": ..., "object": ...}`).
#[derive(Debug, Clone)]
pub struct WatchEvent {
    /// ADDED, MODIFIED, DELETED, BOOKMARK or ERROR.
    pub kind: &'static str,
    /// The object (or a Status for ERROR).
    pub object: Value,
}

struct Watcher {
    rt_id: String,
    api_version: String,
    kind: String,
    ns: Option<String>,
    labels: Selector,
    fields: Selector,
    bookmarks: bool,
    tx: UnboundedSender<WatchEvent>,
}

impl Watcher {
    fn wants(&self, rt_id: &str, ns: &str) -> bool {
        self.rt_id == rt_id && self.ns.as_deref().is_none_or(|n| n == ns)
    }

    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The event this watcher sees for a change, if any.
    fn event(&self, old: Option<&Value>, new: Option<&Value>) -> Option<WatchEvent> {
        let was = old.is_some_and(|o| self.matches(o));
        let is = new.is_some_and(|n| self.matches(n));
        let (kind, object) = match (was, is, new) {
            (false, true, Some(n)) => ("ADDED", n.clone()),
            (true, true, Some(n)) => ("MODIFIED", n.clone()),
            (true, false, Some(n)) => ("DELETED", n.clone()),
            (true, false, None) => ("DELETED", old.cloned().unwrap_or(Value::Null)),
            _ => return None,
        };
        Some(WatchEvent { kind, object })
    }
}

struct Change {
    rv: u64,
    rt_id: String,
    ns: String,
    old: Option<Value>,
    new: Option<Value>,
}

/// What a watch asks for.
#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    /// Namespace, or all.
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: Selector,
    /// Field selector.
    pub fields: Selector,
    /// `resourceVersion`; `None` for unset or "0".
    pub resource_version: Option<u64>,
    /// `allowWatchBookmarks`.
    pub bookmarks: bool,
    /// `sendInitialEvents`.
    pub send_initial_events: bool,
}

/// A page of a list.
#[derive(Debug, Clone)]
pub struct ListPage {
    /// Items in (namespace, name) order.
    pub items: Vec<Value>,
    /// The list's resourceVersion.
    pub resource_version: u64,
    /// Token for the next page, if any.
    pub continue_token: Option<String>,
}

type Key = (String, String, String);

/// The store.
pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    history: VecDeque<Change>,
    history_limit: usize,
    compacted: u64,
    watchers: Vec<Watcher>,
    serial: u64,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            history_limit: 10_000,
            compacted: 1,
            watchers: Vec::new(),
            serial: 0,
        }
    }
}

fn parse_rv(v: &Value) -> Option<u64> {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
}

fn rv_string(v: &Value) -> Option<&str> {
    v.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

fn meta(obj: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable_meta(),
    }
}

#[allow(clippy::panic)]
fn unreachable_meta() -> ! {
    panic!("metadata was just set to an object")
}

fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    vgpu_core::time::format_rfc3339(secs)
}

impl Store {
    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Keeps at most `n` changes for watch replay.
    pub fn set_history_limit(&mut self, n: usize) {
        self.history_limit = n;
        self.trim();
    }

    /// Drops all retained history: any watch from an older version now gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    fn trim(&mut self) {
        while self.history.len() > self.history_limit {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
    }

    /// Records a change: bumps the version, stamps it, stores, tells the watches.
    fn commit(&mut self, rt: &ResourceType, ns: &str, name: &str, new: Option<Value>) -> Value {
        self.rv += 1;
        let rv = self.rv;
        let key = (rt.id(), ns.to_string(), name.to_string());
        let old = self.objects.remove(&key);
        let new = new.map(|mut n| {
            meta(&mut n).insert("resourceVersion".into(), rv.to_string().into());
            n
        });
        // A DELETED event carries the object as last seen, at the deletion's version.
        let deleted = old.clone().map(|mut o| {
            meta(&mut o).insert("resourceVersion".into(), rv.to_string().into());
            o
        });
        if let Some(n) = &new {
            self.objects.insert(key, n.clone());
        }
        let (old_ev, new_ev) = if new.is_some() {
            (old, new.clone())
        } else {
            (deleted.clone(), None)
        };
        let rt_id = rt.id();
        self.watchers.retain(|w| {
            if !w.wants(&rt_id, ns) {
                return !w.tx.is_closed();
            }
            match w.event(old_ev.as_ref(), new_ev.as_ref()) {
                Some(ev) => w.tx.send(ev).is_ok(),
                None => !w.tx.is_closed(),
            }
        });
        self.history.push_back(Change {
            rv,
            rt_id,
            ns: ns.to_string(),
            old: old_ev,
            new: new_ev,
        });
        self.trim();
        new.or(deleted).unwrap_or(Value::Null)
    }

    /// One object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&(rt.id(), ns.to_string(), name.to_string()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(&rt.group, &rt.plural, &rt.kind, name))
    }

    /// A page of objects of one type (`limit` 0 = all).
    pub fn list(
        &self,
        rt: &ResourceType,
        ns: Option<&str>,
        labels: &Selector,
        fields: &Selector,
        limit: usize,
        continue_token: Option<&str>,
    ) -> Result<ListPage, ApiError> {
        let id = rt.id();
        let mut start = (id.clone(), ns.unwrap_or("").to_string(), String::new());
        let mut exclusive = false;
        if let Some(token) = continue_token.filter(|t| !t.is_empty()) {
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(token)
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            let t: Value = serde_json::from_slice(&raw)
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            let rv = t["rv"].as_u64().unwrap_or(0);
            if rv < self.compacted {
                // "Continue tokens expire": 410 once the version they were taken at is compacted.
                return Err(ApiError::gone(rv));
            }
            start.1 = t["ns"].as_str().unwrap_or("").into();
            start.2 = t["name"].as_str().unwrap_or("").into();
            exclusive = true;
        }
        let mut items = Vec::new();
        let mut next = None;
        for ((tid, ons, oname), obj) in self.objects.range(start.clone()..) {
            if *tid != id || ns.is_some_and(|n| n != ons) {
                break;
            }
            if exclusive && (ons, oname) == (&start.1, &start.2) {
                continue;
            }
            if !(labels.matches(obj) && fields.matches(obj)) {
                continue;
            }
            if limit > 0 && items.len() == limit {
                let last: &Value = &items[items.len() - 1];
                let (lns, lname): (&Value, &Value) =
                    (&last["metadata"]["namespace"], &last["metadata"]["name"]);
                let t = json!({"rv": self.rv, "ns": lns.as_str().unwrap_or(""), "name": lname});
                next = Some(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(t.to_string()));
                break;
            }
            items.push(obj.clone());
        }
        Ok(ListPage {
            items,
            resource_version: self.rv,
            continue_token: next,
        })
    }

    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    /// Creates an object (POST to the collection).
    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        mut obj: Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("body is not a JSON object"));
        }
        if rv_string(&obj).is_some() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let body_ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        let serial = self.next_serial();
        let name = match obj.pointer("/metadata/name").and_then(Value::as_str) {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match obj.pointer("/metadata/generateName").and_then(Value::as_str) {
                // generateName: the server appends a random 5-character suffix.
                Some(g) if !g.is_empty() => format!("{g}{}", suffix(serial)),
                _ => {
                    return Err(ApiError::invalid(format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        rt.kind
                    )))
                }
            },
        };
        if rt.kind == "Event" {
            crate::validation::event(&obj, ns, &name)?;
        }
        if self
            .objects
            .contains_key(&(rt.id(), ns.to_string(), name.clone()))
        {
            return Err(ApiError::already_exists(
                &rt.group, &rt.plural, &rt.kind, &name,
            ));
        }
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.clone().into();
        let m = meta(&mut obj);
        m.insert("name".into(), name.clone().into());
        if rt.namespaced {
            m.insert("namespace".into(), ns.into());
        }
        m.insert(
            "uid".into(),
            format!("00000000-0000-4000-8000-{serial:012x}").into(),
        );
        m.insert("creationTimestamp".into(), now_rfc3339().into());
        m.entry("generation").or_insert(json!(1));
        if dry_run {
            return Ok(obj);
        }
        Ok(self.commit(rt, ns, &name, Some(obj)))
    }

    /// Replaces an object (PUT), or only its status when `status` is set.
    pub fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        status: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = self.get(rt, ns, name)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request("body is not a JSON object"));
        }
        if let Some(body_name) = obj.pointer("/metadata/name").and_then(Value::as_str) {
            if body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
        }
        if let Some(rv) = rv_string(&obj) {
            if Some(rv) != rv_string(&old) {
                return Err(ApiError::conflict(&rt.group, &rt.plural, &rt.kind, name));
            }
        }
        if rt.has_status {
            if status {
                let new_status = obj.get("status").cloned();
                obj = old.clone();
                match new_status {
                    Some(s) => obj["status"] = s,
                    None => {
                        if let Some(m) = obj.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            } else {
                match old.get("status") {
                    Some(s) => obj["status"] = s.clone(),
                    None => {
                        if let Some(m) = obj.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
        }
        obj["apiVersion"] = rt.api_version().into();
        obj["kind"] = rt.kind.clone().into();
        for field in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
        ] {
            match old.pointer(&format!("/metadata/{field}")) {
                Some(v) => {
                    meta(&mut obj).insert(field.into(), v.clone());
                }
                None => {
                    meta(&mut obj).remove(field);
                }
            }
        }
        if old.get("spec") != obj.get("spec") {
            let g = old.pointer("/metadata/generation").and_then(Value::as_i64);
            meta(&mut obj).insert("generation".into(), json!(g.unwrap_or(0) + 1));
        }
        meta(&mut obj).insert(
            "resourceVersion".into(),
            rv_string(&old).unwrap_or("").into(),
        );
        if obj == old || dry_run {
            return Ok(obj);
        }
        Ok(self.commit(rt, ns, name, Some(obj)))
    }

    /// Applies a patch (see [`crate::patch`]); a `resourceVersion` inside the patch is a
    /// precondition, as on update. Apply patches create a missing object.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        content_type: &str,
        body: &[u8],
        status: bool,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = match self.get(rt, ns, name) {
            Ok(o) => o,
            Err(e) if content_type.starts_with("application/apply-patch") => {
                let mut obj: Value = serde_json::from_slice(body)
                    .map_err(|e| ApiError::bad_request(format!("body: {e}")))?;
                let _ = e;
                meta(&mut obj).insert("name".into(), name.into());
                return self.create(rt, ns, obj, dry_run);
            }
            Err(e) => return Err(e),
        };
        let mut patched = old.clone();
        crate::patch::apply(&mut patched, content_type, body).map_err(|e| match e {
            crate::patch::PatchError::UnsupportedType(t) => ApiError {
                code: 415,
                reason: "UnsupportedMediaType",
                message: format!("the body of the request was in an unknown format: {t}"),
                details: None,
            },
            crate::patch::PatchError::Invalid(m) => ApiError::invalid(m),
        })?;
        if parse_rv(&patched).is_none() {
            meta(&mut patched).insert(
                "resourceVersion".into(),
                rv_string(&old).unwrap_or("").into(),
            );
        }
        self.update(rt, ns, name, patched, status, dry_run)
    }

    /// Deletes an object, honouring `preconditions` (uid, resourceVersion) from DeleteOptions.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        options: &Value,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let old = self.get(rt, ns, name)?;
        let pre = &options["preconditions"];
        let rv_ok = pre["resourceVersion"]
            .as_str()
            .is_none_or(|rv| Some(rv) == rv_string(&old));
        let uid_ok = pre["uid"]
            .as_str()
            .is_none_or(|u| Some(u) == old.pointer("/metadata/uid").and_then(Value::as_str));
        if !rv_ok || !uid_ok {
            return Err(ApiError::conflict(&rt.group, &rt.plural, &rt.kind, name));
        }
        if dry_run {
            return Ok(old);
        }
        Ok(self.commit(rt, ns, name, None))
    }

    /// Opens a watch; events arrive on the receiver until it is dropped.
    pub fn watch(
        &mut self,
        rt: &ResourceType,
        p: WatchParams,
    ) -> Result<UnboundedReceiver<WatchEvent>, ApiError> {
        let (tx, rx) = unbounded_channel();
        let w = Watcher {
            rt_id: rt.id(),
            api_version: rt.api_version(),
            kind: rt.kind.clone(),
            ns: p.namespace.clone(),
            labels: p.labels,
            fields: p.fields,
            bookmarks: p.bookmarks,
            tx,
        };
        match p.resource_version {
            Some(rv) if !p.send_initial_events => {
                if rv < self.compacted {
                    return Err(ApiError::gone(rv));
                }
                for c in self.history.iter().filter(|c| c.rv > rv) {
                    if w.wants(&c.rt_id, &c.ns) {
                        if let Some(ev) = w.event(c.old.as_ref(), c.new.as_ref()) {
                            let _ = w.tx.send(ev);
                        }
                    }
                }
            }
            _ => {
                for ((tid, ons, _), obj) in &self.objects {
                    if *tid == w.rt_id && w.ns.as_deref().is_none_or(|n| n == ons) && w.matches(obj)
                    {
                        let _ = w.tx.send(WatchEvent {
                            kind: "ADDED",
                            object: obj.clone(),
                        });
                    }
                }
                if p.send_initial_events && p.bookmarks {
                    let mut b = bookmark(&w, self.rv);
                    b.object["metadata"]["annotations"] =
                        json!({"k8s.io/initial-events-end": "true"});
                    let _ = w.tx.send(b);
                }
            }
        }
        self.watchers.push(w);
        Ok(rx)
    }

    /// Sends a BOOKMARK at the current version to every watch that allows them.
    pub fn send_bookmarks(&mut self) {
        let rv = self.rv;
        self.watchers
            .retain(|w| !w.bookmarks || w.tx.send(bookmark(w, rv)).is_ok());
    }

    /// Ends every open watch, as an API server restart or a load balancer idle timeout does;
    /// clients re-watch from the last version they saw.
    pub fn close_watches(&mut self) {
        self.watchers.clear();
    }

    /// Cuts every open watch's connection mid-stream, as an API server that crashes, or a load
    /// balancer that drops connections, does: clients see a read error, not a clean end.
    pub fn drop_watches(&mut self) {
        for w in self.watchers.drain(..) {
            let _ = w.tx.send(WatchEvent {
                kind: ABORT,
                object: Value::Null,
            });
        }
    }

    /// Number of open watches (closed ones are noticed on the next event).
    pub fn watch_count(&self) -> usize {
        self.watchers.iter().filter(|w| !w.tx.is_closed()).count()
    }
}

fn bookmark(w: &Watcher, rv: u64) -> WatchEvent {
    WatchEvent {
        kind: "BOOKMARK",
        object: json!({"apiVersion": w.api_version, "kind": w.kind,
            "metadata": {"resourceVersion": rv.to_string()}}),
    }
}

fn suffix(serial: u64) -> String {
    // The API server uses 5 random characters from "bcdfghjklmnpqrstvwxz2456789".
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = serial.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..5)
        .map(|_| {
            let c = ALPHABET[(x % ALPHABET.len() as u64) as usize] as char;
            x /= ALPHABET.len() as u64;
            c
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::by_plural;

    #[test]
    fn create_update_conflict_delete() {
        let mut s = Store::default();
        let cm = by_plural("v1", "configmaps");
        let o = s
            .create(
                &cm,
                "a",
                json!({"metadata": {"name": "x"}, "data": {"k": "1"}}),
                false,
            )
            .unwrap();
        let rv = o["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let mut stale = o.clone();
        stale["data"]["k"] = "2".into();
        let o2 = s
            .update(&cm, "a", "x", stale.clone(), false, false)
            .unwrap();
        assert_ne!(o2["metadata"]["resourceVersion"], rv.as_str());
        let err = s.update(&cm, "a", "x", stale, false, false).unwrap_err();
        assert_eq!((err.code, err.reason), (409, "Conflict"));
        // A no-op update keeps the version.
        let o3 = s.update(&cm, "a", "x", o2.clone(), false, false).unwrap();
        assert_eq!(
            o3["metadata"]["resourceVersion"],
            o2["metadata"]["resourceVersion"]
        );
        let err = s
            .create(&cm, "a", json!({"metadata": {"name": "x"}}), false)
            .unwrap_err();
        assert_eq!(err.reason, "AlreadyExists");
        s.delete(&cm, "a", "x", &json!({}), false).unwrap();
        assert_eq!(s.get(&cm, "a", "x").unwrap_err().code, 404);
    }

    #[test]
    fn watch_replay_selectors_and_gone() {
        let mut s = Store::default();
        let pods = by_plural("v1", "pods");
        let start = s.resource_version();
        s.create(
            &pods,
            "a",
            json!({"metadata": {"name": "p", "labels": {"x": "1"}}}),
            false,
        )
        .unwrap();
        s.patch(
            &pods,
            "a",
            "p",
            "application/merge-patch+json",
            br#"{"metadata":{"labels":{"x":"2"}}}"#,
            false,
            false,
        )
        .unwrap();
        let mut rx = s
            .watch(
                &pods,
                WatchParams {
                    labels: Selector::labels("x=1").unwrap(),
                    resource_version: Some(start),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(rx.try_recv().unwrap().kind, "ADDED");
        assert_eq!(rx.try_recv().unwrap().kind, "DELETED");
        s.set_history_limit(0);
        assert_eq!(
            s.watch(
                &pods,
                WatchParams {
                    resource_version: Some(start),
                    ..Default::default()
                }
            )
            .unwrap_err()
            .code,
            410
        );
    }

    #[test]
    fn pages() {
        let mut s = Store::default();
        let cm = by_plural("v1", "configmaps");
        for i in 0..5 {
            s.create(
                &cm,
                "a",
                json!({"metadata": {"name": format!("c{i}")}}),
                false,
            )
            .unwrap();
        }
        let none = Selector::default();
        let p1 = s.list(&cm, Some("a"), &none, &none, 2, None).unwrap();
        assert_eq!(p1.items.len(), 2);
        let p2 = s
            .list(
                &cm,
                Some("a"),
                &none,
                &none,
                2,
                p1.continue_token.as_deref(),
            )
            .unwrap();
        assert_eq!(p2.items[0]["metadata"]["name"], "c2");
        let p3 = s
            .list(
                &cm,
                Some("a"),
                &none,
                &none,
                2,
                p2.continue_token.as_deref(),
            )
            .unwrap();
        assert_eq!(p3.items.len(), 1);
        assert!(p3.continue_token.is_none());
    }
}
