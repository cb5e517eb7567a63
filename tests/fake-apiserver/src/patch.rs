//! PATCH bodies by content type ("Patch operations" in API concepts):
//! `application/json-patch+json` (RFC 6902), `application/merge-patch+json` (RFC 7386),
//! `application/strategic-merge-patch+json` and `application/apply-patch+yaml`.
//!
//! Strategic merge is simplified to what our components send: a merge patch in which lists of
//! objects that carry a `name` (containers, env, volumes) or `type` (conditions) merge item by item,
//! as their `patchMergeKey` says in the Kubernetes OpenAPI; `$patch` directives are not supported.
//! Server-side apply is approximated by a merge patch (no field managers or ownership conflicts).

use serde_json::Value;

/// A patch that cannot be applied; the API server answers 415 for an unknown type, 422 otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchError {
    /// Unknown or missing Content-Type.
    UnsupportedType(String),
    /// Body unreadable, or a JSON patch operation failed (`test` mismatch, missing path).
    Invalid(String),
}

/// Applies a patch body of the given content type to `target`.
pub fn apply(target: &mut Value, content_type: &str, body: &[u8]) -> Result<(), PatchError> {
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let patch: Value =
        serde_json::from_slice(body).map_err(|e| PatchError::Invalid(format!("body: {e}")))?;
    match ct {
        "application/json-patch+json" => {
            let p: json_patch::Patch = serde_json::from_value(patch)
                .map_err(|e| PatchError::Invalid(format!("json patch: {e}")))?;
            json_patch::patch(target, &p).map_err(|e| PatchError::Invalid(e.to_string()))
        }
        "application/merge-patch+json" | "application/apply-patch+yaml" => {
            json_patch::merge(target, &patch);
            Ok(())
        }
        "application/strategic-merge-patch+json" => {
            strategic(target, &patch);
            Ok(())
        }
        other => Err(PatchError::UnsupportedType(other.to_string())),
    }
}

fn merge_key(a: &[Value], b: &[Value]) -> Option<&'static str> {
    ["name", "type"].into_iter().find(|k| {
        !a.is_empty()
            && a.iter()
                .chain(b)
                .all(|v| v.get(k).is_some_and(Value::is_string))
    })
}

fn strategic(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let Value::Object(t) = target else { return };
    for (k, pv) in p {
        if pv.is_null() {
            t.remove(k);
            continue;
        }
        match (t.get_mut(k), pv) {
            (Some(Value::Array(ta)), Value::Array(pa)) => {
                if let Some(key) = merge_key(ta, pa) {
                    for item in pa {
                        let id = &item[key];
                        match ta.iter_mut().find(|x| &x[key] == id) {
                            Some(existing) => strategic(existing, item),
                            None => ta.push(item.clone()),
                        }
                    }
                } else {
                    *ta = pa.clone();
                }
            }
            (Some(tv), _) => strategic(tv, pv),
            (None, _) => {
                t.insert(k.clone(), pv.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn three_kinds() {
        let mut o = json!({"metadata": {"labels": {"a": "1"}}, "spec": {"containers": [
            {"name": "c", "image": "x"}, {"name": "d", "image": "y"}]}});
        apply(
            &mut o,
            "application/merge-patch+json",
            br#"{"metadata":{"labels":{"a":null,"b":"2"}}}"#,
        )
        .unwrap();
        assert_eq!(o["metadata"]["labels"], json!({"b": "2"}));
        apply(
            &mut o,
            "application/strategic-merge-patch+json",
            br#"{"spec":{"containers":[{"name":"d","image":"z"}]}}"#,
        )
        .unwrap();
        assert_eq!(o["spec"]["containers"][0]["image"], "x");
        assert_eq!(o["spec"]["containers"][1]["image"], "z");
        apply(&mut o, "application/json-patch+json",
            br#"[{"op":"test","path":"/metadata/labels/b","value":"2"},{"op":"add","path":"/x","value":1}]"#).unwrap();
        assert_eq!(o["x"], 1);
        assert!(matches!(
            apply(
                &mut o,
                "application/json-patch+json",
                br#"[{"op":"test","path":"/x","value":2}]"#
            ),
            Err(PatchError::Invalid(_))
        ));
        assert!(matches!(
            apply(&mut o, "text/plain", b"{}"),
            Err(PatchError::UnsupportedType(_))
        ));
    }
}
