//! AdmissionReview bodies as the API server sends them to a webhook (admission.k8s.io/v1): the
//! review kube-apiserver v1.36 sent (tests/fixtures/apiserver/admission-validate.json), carrying
//! the caller's pod with its quantities in the canonical form the API server hands webhooks.

use crate::fixtures::{fill, load};
use serde_json::{json, Value};

/// The review the API server sent for a Pod CREATE, with `request` fields replaced.
fn review(fields: &[(&str, Value)]) -> Vec<u8> {
    let template = load("apiserver/admission-validate.json");
    let mut review = template.clone();
    review["request"] = fill(&template["request"], fields);
    review.to_string().into_bytes()
}

/// The AdmissionReview the API server sends for a Pod CREATE of `pod` (its namespace and name are
/// read from its metadata), with request `uid` and `dryRun` as given.
pub fn pod_create_review(uid: &str, pod: &Value, dry_run: bool) -> Vec<u8> {
    let pod = canonical(pod);
    review(&[
        ("uid", json!(uid)),
        ("namespace", pod["metadata"]["namespace"].clone()),
        ("name", pod["metadata"]["name"].clone()),
        ("dryRun", json!(dry_run)),
        ("object", pod),
    ])
}

/// The AdmissionReview the API server sends for a Pod UPDATE from `old` to `new` by `username`.
pub fn pod_update_review(
    uid: &str,
    old: &Value,
    new: &Value,
    username: &str,
    dry_run: bool,
) -> Vec<u8> {
    let new = canonical(new);
    review(&[
        ("uid", json!(uid)),
        ("namespace", new["metadata"]["namespace"].clone()),
        ("name", new["metadata"]["name"].clone()),
        ("operation", json!("UPDATE")),
        ("dryRun", json!(dry_run)),
        (
            "userInfo",
            json!({"username": username, "groups": ["system:authenticated"]}),
        ),
        (
            "options",
            json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
        ),
        ("oldObject", canonical(old)),
        ("object", new),
    ])
}

/// `pod` with every container's resource quantities in canonical form.
pub fn canonical(pod: &Value) -> Value {
    let mut pod = pod.clone();
    for list in ["initContainers", "containers"] {
        let Some(cs) = pod
            .pointer_mut(&format!("/spec/{list}"))
            .and_then(Value::as_array_mut)
        else {
            continue;
        };
        for c in cs {
            for section in ["limits", "requests"] {
                if let Some(m) = c
                    .pointer_mut(&format!("/resources/{section}"))
                    .and_then(Value::as_object_mut)
                {
                    for v in m.values_mut() {
                        let text = match v {
                            Value::String(s) => s.clone(),
                            Value::Number(n) => n.to_string(),
                            _ => continue,
                        };
                        *v = json!(canonical_quantity(&text));
                    }
                }
            }
        }
    }
    pod
}

/// A quantity as the API server hands it to webhooks, for plain decimal integers: apimachinery's
/// `resource.Quantity` keeps a string only when it is already canonical and otherwise writes the
/// largest decimal SI suffix that keeps the value exact (`2000` -> `2k`, `10240` stays, `3000000` ->
/// `3M`). Other spellings (suffixed, fractional) are returned as given.
pub fn canonical_quantity(text: &str) -> String {
    let Ok(mut n) = text.parse::<u64>() else {
        return text.to_string();
    };
    if n == 0 {
        return "0".into();
    }
    let mut suffix = "";
    for s in ["k", "M", "G", "T", "P", "E"] {
        if n % 1000 != 0 {
            break;
        }
        n /= 1000;
        suffix = s;
    }
    format!("{n}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As tests/fixtures/apiserver/admission-validate.json shows: `2000` arrived as `2k`.
    #[test]
    fn canonical_quantities_as_the_api_server_writes_them() {
        let fixture = load("apiserver/admission-validate.json");
        assert_eq!(
            fixture["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]
                ["nvidia.com/gpumem"],
            canonical_quantity("2000")
        );
        for (i, o) in [
            ("4096", "4096"),
            ("1000", "1k"),
            ("10240", "10240"),
            ("3000000", "3M"),
            ("1024", "1024"),
            ("0", "0"),
            ("4Gi", "4Gi"),
        ] {
            assert_eq!(canonical_quantity(i), o, "{i}");
        }
    }
}
