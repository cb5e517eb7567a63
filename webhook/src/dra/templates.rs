//! The ResourceClaimTemplates the conversion names ([`super::convert`]): made at admission when
//! missing, and deleted once no pod has used them for a while, so that nothing is left behind by a
//! pod refused after this webhook (by quota, another webhook), deleted, or never created.
//!
//! Templates are shared by every pod of a namespace that asks the same shape, so none can be owned
//! by a pod (a pod has no uid at mutating admission either). Instead each admission that uses a
//! template stamps `vgpu.io/last-used` on it (at most once a minute), and the sweeper deletes a
//! generated template that no pod names and that nobody used for `idle`, with the resourceVersion
//! it read as a precondition. An admission that raced the sweeper either stamped first (the delete
//! then fails its precondition) or finds the template gone when it stamps, and makes it again.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use thiserror::Error;

use super::convert::GENERATED_LABEL;

/// When an admission last used a generated template: seconds since the epoch.
pub const LAST_USED: &str = "vgpu.io/last-used";
/// An admission stamps a template whose stamp is older than this.
const STAMP_EVERY: u64 = 60;

/// A template could not be made or found.
#[derive(Debug, Error)]
#[error("ResourceClaimTemplate {namespace}/{name}: {source}")]
pub struct TemplateError {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The API's answer.
    #[source]
    pub source: kube::Error,
}

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Makes `template` in `namespace` unless it is there; stamps it as used.
pub async fn ensure(
    client: &kube::Client,
    namespace: &str,
    template: &Value,
) -> Result<(), TemplateError> {
    let name = template["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let err = |source| TemplateError {
        namespace: namespace.to_string(),
        name: name.clone(),
        source,
    };
    let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), namespace);
    if let Some(current) = api.get_opt(&name).await.map_err(err)? {
        let stamped = current
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LAST_USED))
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        if now_s().saturating_sub(stamped) < STAMP_EVERY {
            return Ok(());
        }
        let stamp = json!({"metadata": {"annotations": {LAST_USED: now_s().to_string()}}});
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&stamp))
            .await
        {
            Ok(_) => return Ok(()),
            // The sweeper deleted it after we read it: make it again.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(err(e)),
        }
    }
    let mut object = template.clone();
    object["metadata"]["annotations"] = json!({ LAST_USED: now_s().to_string() });
    let object: ResourceClaimTemplate =
        serde_json::from_value(object).map_err(|e| err(kube::Error::SerdeError(e)))?;
    match api.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        // Another replica (or admission) made it first.
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(err(e)),
    }
}

/// A generated template as the sweeper sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// resourceVersion, the delete's precondition.
    pub resource_version: String,
    /// Last use (or creation), seconds since the epoch.
    pub used_s: u64,
}

/// The templates to delete: not named by any pod of their namespace (`named`: namespace ->
/// template names its pods name), last used more than `idle` before `now_s`.
pub fn stale<'g>(
    generated: &'g [Generated],
    named: &BTreeMap<String, BTreeSet<String>>,
    idle: Duration,
    now_s: u64,
) -> Vec<&'g Generated> {
    generated
        .iter()
        .filter(|g| now_s.saturating_sub(g.used_s) > idle.as_secs())
        .filter(|g| named.get(&g.namespace).is_none_or(|n| !n.contains(&g.name)))
        .collect()
}

/// Deletes stale generated templates every `idle / 2` (at least every 5 s), forever.
pub fn spawn_sweeper(client: kube::Client, idle: Duration) {
    let every = (idle / 2).max(Duration::from_secs(5));
    tokio::spawn(async move {
        loop {
            // Not a test sleep: the sweeper's period.
            tokio::time::sleep(every).await;
            if let Err(e) = sweep(&client, idle).await {
                tracing::warn!(error = %e, "sweeping generated ResourceClaimTemplates");
            }
        }
    });
}

/// One sweep.
async fn sweep(client: &kube::Client, idle: Duration) -> Result<(), kube::Error> {
    let templates: Api<ResourceClaimTemplate> = Api::all(client.clone());
    let lp = ListParams::default().labels(&format!("{GENERATED_LABEL}=true"));
    let list = templates.list(&lp).await?;
    let generated: Vec<Generated> = list
        .items
        .iter()
        .map(|t| {
            let m = &t.metadata;
            let created = m
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second().max(0) as u64);
            Generated {
                namespace: m.namespace.clone().unwrap_or_default(),
                name: m.name.clone().unwrap_or_default(),
                resource_version: m.resource_version.clone().unwrap_or_default(),
                used_s: m
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(LAST_USED))
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(created),
            }
        })
        .collect();
    let now = now_s();
    let namespaces: BTreeSet<&str> = generated
        .iter()
        .filter(|g| now.saturating_sub(g.used_s) > idle.as_secs())
        .map(|g| g.namespace.as_str())
        .collect();
    let mut named: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ns in namespaces {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let set = named.entry(ns.to_string()).or_default();
        for p in pods.list(&ListParams::default()).await? {
            for c in p
                .spec
                .iter()
                .flat_map(|s| s.resource_claims.iter().flatten())
            {
                set.extend(c.resource_claim_template_name.clone());
            }
        }
    }
    for g in stale(&generated, &named, idle, now) {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &g.namespace);
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(g.resource_version.clone()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&g.name, &dp).await {
            Ok(_) => {
                tracing::info!(namespace = %g.namespace, template = %g.name, "deleted unused generated ResourceClaimTemplate")
            }
            // Used (stamped) or deleted meanwhile.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_means_unnamed_and_idle() {
        let g = |ns: &str, name: &str, used_s| Generated {
            namespace: ns.into(),
            name: name.into(),
            resource_version: "1".into(),
            used_s,
        };
        let all = [
            g("a", "t1", 0),
            g("a", "t2", 0),
            g("a", "t3", 990),
            g("b", "t1", 0),
        ];
        let named = BTreeMap::from([("a".to_string(), BTreeSet::from(["t2".to_string()]))]);
        let out: Vec<(&str, &str)> = stale(&all, &named, Duration::from_secs(60), 1000)
            .into_iter()
            .map(|g| (g.namespace.as_str(), g.name.as_str()))
            .collect();
        // t2 is named by a pod, t3 was used 10 s ago; b's t1 is named by no pod of b.
        assert_eq!(out, [("a", "t1"), ("b", "t1")]);
    }
}
