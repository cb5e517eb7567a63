//! DRA mode for pods written for HAMi (`POST /mutate-dra`, the chart sends it the pods of
//! namespaces labelled `vgpu.io/mode: dra`): the pod becomes a DRA pod of class `gpu.vgpu.io`
//! ([`convert`]) and the templates its claims come from are made ([`templates`]), except for a
//! dry run, which gets the same patch and makes nothing.

pub mod convert;
pub mod templates;

use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use vgpu_core::request::RequestPolicy;

use crate::admission::{AdmissionRequest, AdmissionResponse};
use crate::validate::cache::ClusterCache;
use convert::ConvertError;

/// The `/mutate-dra` decision's state.
#[derive(Clone)]
pub struct DraMutator {
    policy: RequestPolicy,
    scheduler: String,
    client: Option<kube::Client>,
    /// The validator's view of the cluster: the published GPUs' sizes come from its slice watch.
    cache: Arc<ClusterCache>,
}

impl std::fmt::Debug for DraMutator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraMutator")
            .field("connected", &self.client.is_some())
            .finish_non_exhaustive()
    }
}

impl DraMutator {
    /// A mutator that makes templates through `client` (`None`: refuses vGPU pods, as it could
    /// not make their templates), gives pods vgpu's scheduler profile `scheduler`, and reads the
    /// published GPUs from `cache` (the validator's).
    pub fn new(
        policy: RequestPolicy,
        scheduler: impl Into<String>,
        client: Option<kube::Client>,
        cache: Arc<ClusterCache>,
    ) -> DraMutator {
        DraMutator {
            policy,
            scheduler: scheduler.into(),
            client,
            cache,
        }
    }

    /// The decision for one review, with its one-word label.
    pub async fn decide(&self, request: &AdmissionRequest) -> (AdmissionResponse, &'static str) {
        let pod = match request.created(request.is_pod()) {
            Ok(pod) => pod,
            Err(e) => return e.answer(&request.uid),
        };
        let allow = AdmissionResponse::allow(&request.uid);
        let sizes = if convert::needs_card_sizes(pod, &self.policy) {
            match self.card_sizes().await {
                Ok(s) => s,
                Err(why) => return (allow.deny(503, "ServiceUnavailable", why), "unavailable"),
            }
        } else {
            Vec::new()
        };
        let c = match convert::convert(pod, &self.policy, &sizes, &self.scheduler) {
            Ok(c) if c.patch.0.is_empty() => return (allow, "no-vgpu"),
            Ok(c) => c,
            Err(e @ ConvertError::Shape(_)) => {
                return (
                    allow.deny(400, "BadRequest", format!("vgpu: {e}")),
                    "invalid",
                )
            }
            Err(e) => return (allow.deny(422, "Invalid", format!("vgpu: {e}")), "invalid"),
        };
        let namespace = request
            .namespace
            .clone()
            .or_else(|| {
                pod.pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .unwrap_or_default();
        if request.dry_run != Some(true) {
            let Some(client) = &self.client else {
                return (
                    allow.deny(503, "ServiceUnavailable", "vgpu: DRA mode needs the webhook's Kubernetes API access to make the pod's ResourceClaimTemplates"),
                    "unavailable",
                );
            };
            for t in &c.templates {
                let made = tokio::time::timeout(
                    Duration::from_secs(3),
                    templates::ensure(client, &namespace, t),
                )
                .await;
                let why = match made {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "the Kubernetes API did not answer within 3 s".to_string(),
                };
                return (
                    allow.deny(
                        503,
                        "ServiceUnavailable",
                        format!("vgpu: the pod's GPUs come from a ResourceClaimTemplate that cannot be made now: {why}"),
                    ),
                    "unavailable",
                );
            }
        }
        (
            allow.with_patch(&c.patch).with_warnings(c.warnings),
            "converted",
        )
    }

    /// The distinct memory sizes (bytes) of the published GPUs of class `gpu.vgpu.io`.
    async fn card_sizes(&self) -> Result<Vec<u64>, String> {
        let Some(client) = &self.client else {
            return Ok(Vec::new());
        };
        let cards = self.cache.published_cards_or_list(client).await.map_err(|why| {
            format!("vgpu: the GPUs' sizes (for nvidia.com/gpumem-percentage) cannot be read: {why}")
        })?;
        let mut sizes: Vec<u64> = cards.iter().map(|c| c.memory).collect();
        sizes.sort_unstable();
        sizes.dedup();
        Ok(sizes)
    }
}
