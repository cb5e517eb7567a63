//! Putting the CA into webhook configurations: set `clientConfig.caBundle` of every webhook in the
//! named Mutating/ValidatingWebhookConfigurations, through the API, only where it differs.
//!
//! The patch is a JSON patch that first tests `metadata.resourceVersion`, so a concurrent edit makes
//! it fail with a conflict instead of overwriting someone else's change; the caller retries.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::{Api, Patch, PatchParams};
use serde_json::{json, Value};
use thiserror::Error;

/// What happened to one configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The caBundle of this many webhooks was set.
    Patched {
        /// Configuration kind.
        kind: &'static str,
        /// How many webhooks changed.
        webhooks: usize,
    },
    /// Every webhook already carried the CA.
    Unchanged {
        /// Configuration kind.
        kind: &'static str,
    },
}

/// Which kind of webhook configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A MutatingWebhookConfiguration.
    Mutating,
    /// A ValidatingWebhookConfiguration.
    Validating,
}

impl Kind {
    /// The Kubernetes kind.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Mutating => "MutatingWebhookConfiguration",
            Kind::Validating => "ValidatingWebhookConfiguration",
        }
    }
}

/// The injection failed.
#[derive(Debug, Error)]
pub enum InjectError {
    /// No configuration of this kind has this name.
    #[error("no {kind} named {name}")]
    NotFound {
        /// Configuration kind.
        kind: &'static str,
        /// Configuration name.
        name: String,
    },
    /// An API call failed.
    #[error("{kind} {name}: {source}")]
    Api {
        /// Configuration kind.
        kind: &'static str,
        /// Configuration name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
}

/// The JSON patch that gives every webhook `bundle`, or `None` when all carry it already.
/// `webhooks` is the configuration's `webhooks` array as JSON; `resource_version` its version.
pub fn ca_bundle_patch(webhooks: &[Value], resource_version: &str, bundle: &str) -> Option<Value> {
    let mut ops =
        vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version})];
    for (i, w) in webhooks.iter().enumerate() {
        if w["clientConfig"]["caBundle"].as_str() == Some(bundle) {
            continue;
        }
        if w.get("clientConfig").is_none_or(Value::is_null) {
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig"), "value": {"caBundle": bundle}}));
        } else {
            // `add` on an object member replaces it when present (RFC 6902 §4.1).
            ops.push(json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}));
        }
    }
    (ops.len() > 1).then_some(Value::Array(ops))
}

async fn inject_one<K>(
    api: &Api<K>,
    kind: &'static str,
    name: &str,
    bundle: &str,
) -> Result<Option<Outcome>, InjectError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let err = |source| InjectError::Api {
        kind,
        name: name.into(),
        source,
    };
    let Some(obj) = api.get_opt(name).await.map_err(err)? else {
        return Ok(None);
    };
    let value = serde_json::to_value(&obj).unwrap_or(Value::Null);
    let webhooks = value["webhooks"].as_array().cloned().unwrap_or_default();
    let rv = value["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or_default();
    let Some(patch) = ca_bundle_patch(&webhooks, rv, bundle) else {
        return Ok(Some(Outcome::Unchanged { kind }));
    };
    let changed = patch.as_array().map_or(0, |a| a.len() - 1);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(|e| err(kube::Error::SerdeError(e)))?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .map_err(err)?;
    Ok(Some(Outcome::Patched {
        kind,
        webhooks: changed,
    }))
}

/// Injects `ca_pem` into the configuration of `kind` named `name`. The kind is the caller's to say:
/// looking a name up as both kinds needs `get` on both, and a least-privilege role grants each
/// configuration's own kind only, so the other lookup is a 403, not a 404.
pub async fn inject(
    client: kube::Client,
    kind: Kind,
    name: &str,
    ca_pem: &str,
) -> Result<Outcome, InjectError> {
    let bundle = crate::store::ca_bundle(ca_pem);
    let outcome = match kind {
        Kind::Mutating => {
            let api: Api<MutatingWebhookConfiguration> = Api::all(client);
            inject_one(&api, kind.name(), name, &bundle).await?
        }
        Kind::Validating => {
            let api: Api<ValidatingWebhookConfiguration> = Api::all(client);
            inject_one(&api, kind.name(), name, &bundle).await?
        }
    };
    outcome.ok_or_else(|| InjectError::NotFound {
        kind: kind.name(),
        name: name.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_only_webhooks_without_the_bundle_and_tests_the_version() {
        let hooks = vec![
            json!({"name": "a", "clientConfig": {"service": {"name": "s"}}}),
            json!({"name": "b", "clientConfig": {"caBundle": "CA"}}),
            json!({"name": "c"}),
        ];
        let p = ca_bundle_patch(&hooks, "42", "CA").unwrap();
        assert_eq!(
            p,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": "CA"},
                {"op": "add", "path": "/webhooks/2/clientConfig", "value": {"caBundle": "CA"}}
            ])
        );
        let mut doc = json!({"metadata": {"resourceVersion": "42"}, "webhooks": hooks});
        let patch: json_patch::Patch = serde_json::from_value(p).unwrap();
        json_patch::patch(&mut doc, &patch).unwrap();
        let hooks = doc["webhooks"].as_array().unwrap();
        assert!(hooks.iter().all(|w| w["clientConfig"]["caBundle"] == "CA"));
        assert_eq!(hooks[0]["clientConfig"]["service"]["name"], "s");
        assert_eq!(
            ca_bundle_patch(hooks, "43", "CA"),
            None,
            "second run is a no-op"
        );
    }
}
