//! The validating admission decision (`POST /validate`): policy rules, then tenant quota.
//!
//! Order and cost: a pod that requests no vGPU is allowed at once; policy rules need nothing but
//! the pod; quota needs the namespace's ResourceQuotas (cached) and, only where a vGPU quota
//! applies, one reservation round-trip to the API ([`ledger`]). So the webhook keeps admitting
//! pods that need no quota lookup while the API is unreachable, and fails closed for namespaces
//! that have a vGPU quota.

pub mod cache;
pub mod claim;
pub mod events;
pub mod ledger;
pub mod ledger_namespace;
pub mod policy;
pub mod quota;
pub mod retry;
pub mod usage;

use kube::api::{Api, ApiResource, DynamicObject, ObjectMeta, PostParams};
use serde_json::Value;
use std::collections::HashMap;
use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vgpu_core::request::RequestPolicy;

use crate::admission::{AdmissionRequest, AdmissionResponse};
use crate::metrics::Metrics;
use cache::ClusterCache;
use events::{EventRecorder, Rejection, REASON_POLICY, REASON_QUOTA};
use ledger::{Attempt, Ledger};
use ledger_namespace::LedgerNamespace;
use policy::PolicyRules;
use quota::Quota;
use retry::Retries;

/// Default lifetime of a reservation whose pod has not shown up in the pod cache.
pub const DEFAULT_RESERVATION_TTL: Duration = Duration::from_secs(60);
/// How long an admission keeps retrying ledger conflicts; under the webhook's 5 s timeout.
pub const RESERVE_DEADLINE: Duration = Duration::from_secs(4);

/// Everything the validation depends on besides the pod and the cluster.
#[derive(Debug, Clone)]
pub struct ValidateSettings {
    /// Resource names and defaults.
    pub policy: RequestPolicy,
    /// Policy rules.
    pub rules: PolicyRules,
    /// Reservation lifetime.
    pub reservation_ttl: Duration,
    /// Namespace of the ledger ConfigMaps (the webhook's own).
    pub ledger_namespace: String,
    /// DRA mode: claims of class `gpu.vgpu.io` count against the quota too.
    pub dra: bool,
}

impl Default for ValidateSettings {
    fn default() -> Self {
        Self {
            policy: RequestPolicy::default(),
            rules: PolicyRules::default(),
            reservation_ttl: DEFAULT_RESERVATION_TTL,
            ledger_namespace: "vgpu-system".into(),
            dra: false,
        }
    }
}

/// The validating webhook's state.
pub struct Validator {
    settings: ValidateSettings,
    cache: Arc<ClusterCache>,
    client: Option<kube::Client>,
    events: EventRecorder,
    /// Controllers refused for quota, asked to retry when room may have appeared.
    retries: Arc<Retries>,
    metrics: Arc<Metrics>,
    /// Where the ledgers live, and what is known to be wrong there.
    ledger_namespace: Arc<LedgerNamespace>,
    /// One admission per namespace at a time within this replica: conflicts then only come from
    /// other replicas.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl std::fmt::Debug for Validator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validator")
            .field("settings", &self.settings)
            .field("connected", &self.client.is_some())
            .field("ready", &self.ready())
            .finish_non_exhaustive()
    }
}

/// A decision with its one-word label for logs and metrics.
pub type Decision = (AdmissionResponse, &'static str);

/// A review that passed the checks that need only the object.
#[derive(Clone)]
struct Admissible<'r> {
    /// The pod or claim.
    pod: &'r Value,
    namespace: String,
    dry_run: bool,
    /// What a refusal's Event is about when the object has no controller.
    fallback: events::ObjectRef,
    /// What it would hold; `None`: computed from the pod by [`Validator::incoming`].
    usage: Option<usage::PodUsage>,
    /// A DRA pod's ResourceClaimTemplates, whose claims' usage is read in [`Validator::quota`].
    /// Such a pod is only checked, never reserved: its claims are reserved as the claim
    /// controller makes them.
    templates: Vec<String>,
}

impl Validator {
    /// A validator without API access: policy rules only, no quota (nothing is known about quotas).
    pub fn offline(settings: ValidateSettings, metrics: Arc<Metrics>) -> Validator {
        warn_if_update_rule_is_off(&settings);
        Validator {
            ledger_namespace: LedgerNamespace::new(&settings.ledger_namespace),
            settings,
            cache: Arc::new(ClusterCache::default()),
            client: None,
            events: EventRecorder::disabled(metrics.clone()),
            retries: Arc::new(Retries::disabled(metrics.clone())),
            metrics,
            locks: Mutex::default(),
        }
    }

    /// A validator connected to the cluster: starts the cache watchers and the Event writer.
    pub fn connected(
        settings: ValidateSettings,
        client: kube::Client,
        metrics: Arc<Metrics>,
    ) -> Validator {
        warn_if_update_rule_is_off(&settings);
        let cache = Arc::new(ClusterCache::default());
        cache.keep_seen_for(settings.reservation_ttl);
        let retries = Arc::new(Retries::start(client.clone(), metrics.clone()));
        let room = retries.clone();
        cache::spawn_watchers(
            client.clone(),
            cache.clone(),
            settings.policy.clone(),
            settings.dra,
            Arc::new(move |namespace| room.room(namespace)),
        );
        let ledger_namespace = LedgerNamespace::new(&settings.ledger_namespace);
        ledger_namespace.spawn_check(client.clone());
        Validator {
            ledger_namespace,
            events: EventRecorder::start(client.clone(), metrics.clone()),
            retries,
            settings,
            cache,
            client: Some(client),
            metrics,
            locks: Mutex::default(),
        }
    }

    /// A validator over a given cache and client (tests, benchmarks).
    pub fn with_cache(
        settings: ValidateSettings,
        cache: Arc<ClusterCache>,
        client: Option<kube::Client>,
        metrics: Arc<Metrics>,
    ) -> Validator {
        Validator {
            events: match &client {
                Some(c) => EventRecorder::start(c.clone(), metrics.clone()),
                None => EventRecorder::disabled(metrics.clone()),
            },
            retries: Arc::new(Retries::disabled(metrics.clone())),
            ledger_namespace: LedgerNamespace::new(&settings.ledger_namespace),
            settings,
            cache,
            client,
            metrics,
            locks: Mutex::default(),
        }
    }

    /// Ready when there is no API to sync with, or every cache holds a complete LIST and its watch
    /// is healthy and the ledger namespace takes the webhook's writes.
    pub fn ready(&self) -> bool {
        self.readiness().is_ok()
    }

    /// `Ok` when [`Self::ready`], else why not (for `/readyz`'s body).
    pub fn readiness(&self) -> Result<(), String> {
        if self.client.is_none() {
            return Ok(());
        }
        let why: Vec<String> = [
            self.cache
                .unsynced_reason()
                .map(|why| format!("caches not synced: {why}")),
            self.ledger_namespace.problem(),
        ]
        .into_iter()
        .flatten()
        .collect();
        if why.is_empty() {
            Ok(())
        } else {
            Err(why.join("; "))
        }
    }

    /// Sets `vgpu_webhook_cache_synced` and the quota gauges from the caches, at each scrape;
    /// without API access there are no caches and no such series.
    pub fn refresh_metrics(&self) {
        if self.client.is_none() {
            return;
        }
        for (cache, synced) in self.cache.sync_states() {
            self.metrics.cache_synced(cache, synced);
        }
        let mut keys = Vec::new();
        for q in self.cache.all_quotas() {
            if q.unsupported.is_some() {
                continue;
            }
            let used = self.cache.with_pods(&q.namespace, |pods| {
                let mut a = usage::Amounts::default();
                for p in pods.iter().filter(|p| q.covers(&p.usage.facts)) {
                    a += p.usage.amounts();
                }
                a
            });
            for l in &q.limits {
                let labels = crate::metrics::QuotaLabels {
                    namespace: q.namespace.clone(),
                    quota: q.name.clone(),
                    resource: l.key.clone(),
                };
                keys.push((labels, l.resource.of(&used), l.hard));
            }
        }
        self.metrics.quotas(keys);
    }

    /// The cache (for readiness details and tests).
    pub fn cache(&self) -> &Arc<ClusterCache> {
        &self.cache
    }

    /// The decision for one review.
    pub async fn decide(&self, request: &AdmissionRequest) -> Decision {
        if request.kind.group == "resource.k8s.io" {
            return self.decide_claim(request).await;
        }
        let a = match self.precheck(request) {
            Continue(a) => a,
            Break(d) => return d,
        };
        let namespace = a.namespace.clone();
        let deadline = RESERVE_DEADLINE + Duration::from_millis(500);
        match tokio::time::timeout(deadline, self.quota(request, &a)).await {
            Ok(d) => d,
            Err(_) => (
                AdmissionResponse::allow(&request.uid).deny(
                    503,
                    "ServiceUnavailable",
                    format!("vgpu quota cannot be checked in namespace {namespace}: the Kubernetes API did not answer within {deadline:?}; pods under a vGPU quota are refused until it does"),
                ),
                "unavailable",
            ),
        }
    }

    /// A ResourceClaim or ResourceClaimTemplate ([`claim`]): refused when it asks class
    /// `gpu.vgpu.io` for what no published GPU can give, warned when only unhealthy GPUs can.
    async fn decide_claim(&self, request: &AdmissionRequest) -> Decision {
        let kind = request.kind.kind.as_str();
        let claim_kind = matches!(kind, "ResourceClaim" | "ResourceClaimTemplate");
        let object = match request.created(claim_kind) {
            Ok(object) => object,
            Err(e) => return e.answer(&request.uid),
        };
        let allow = AdmissionResponse::allow(&request.uid);
        if !claim::asks_for_us(kind, object) {
            return (allow, "no-vgpu");
        }
        let cards = match &self.client {
            None => None,
            Some(client) => match self.cache.published_cards_or_list(client).await {
                Ok(cards) => Some(cards),
                Err(why) => {
                    tracing::warn!(error = %why, "checking the claim without the published GPUs");
                    None
                }
            },
        };
        let warnings = match claim::check(kind, object, cards.as_deref()) {
            Err(why) => {
                return (
                    allow.deny(422, "Invalid", format!("vgpu: {why}")),
                    "invalid-claim",
                )
            }
            Ok(w) => w,
        };
        if kind != "ResourceClaim" || !self.settings.dra {
            return (allow.with_warnings(warnings), "claim");
        }
        // DRA mode: the claim holds GPU memory, counted against the namespace's quota like a pod.
        let namespace = namespace_of(request, object);
        if let Some(mib) = cards
            .iter()
            .flatten()
            .map(|c| c.memory.div_ceil(1 << 20))
            .max()
        {
            // A claim that asks no memory takes a whole card: count it as the largest published.
            self.cache.note_largest_published_card(mib);
        }
        let largest = self.cache.largest_card_mib().unwrap_or(0);
        let Some(held) = usage::claim_usage(object, largest) else {
            return (allow.with_warnings(warnings), "claim");
        };
        if usage::asks_all_gpus(object) {
            let quotas = self.cache.quotas(&namespace);
            if quotas
                .iter()
                .any(|q| q.unsupported.is_none() && !q.limits.is_empty() && q.covers(&held.facts))
            {
                return (
                    allow.deny(403, "Forbidden", format!("vgpu: spec.devices.requests: allocationMode All asks for every GPU of class {}, which the vGPU quota of namespace {namespace} cannot count; ask a count", claim::CLASS)),
                    "quota",
                );
            }
        }
        let a = Admissible {
            pod: object,
            fallback: events::ObjectRef {
                api_version: "resource.k8s.io/v1".into(),
                kind: "ResourceClaim".into(),
                namespace: namespace.clone(),
                name: request.object_name().to_string(),
                uid: String::new(),
            },
            namespace,
            dry_run: request.dry_run == Some(true),
            usage: Some(held),
            templates: Vec::new(),
        };
        let (response, label) = self.quota(request, &a).await;
        (response.with_warnings(warnings), label)
    }

    /// The decision for one review on a fixed snapshot, without any API call: the steps of
    /// [`Self::decide`] with the cache's quotas and pods and `ledger` as the ledger read, as if the
    /// API answered at once and the validator were connected. Also returns the ledger a real
    /// admission would write (None when it writes nothing). For fuzzing and tests.
    pub fn decide_on_snapshot(
        &self,
        request: &AdmissionRequest,
        ledger: &Ledger,
        now_ms: u64,
    ) -> (Decision, Option<Ledger>) {
        let a = match self.precheck(request) {
            Continue(a) => a,
            Break(d) => return (d, None),
        };
        let allow = AdmissionResponse::allow(&request.uid);
        let quotas = self.cache.quotas(&a.namespace);
        let incoming = match self.incoming(request, &a, &quotas) {
            Continue(Some(r)) => r,
            Continue(None) => return ((allow, "no-quota"), None),
            Break(d) => return (d, None),
        };
        // The snapshot is the truth here, as a fresh LIST would be.
        let seen = self.seen_before_pods(ledger, true);
        let pods = self.cache.pods(&a.namespace);
        let seen = |uid: &str| seen.contains(uid);
        match ledger::attempt(
            &a.namespace,
            ledger,
            &pods,
            &quotas,
            &incoming,
            now_ms,
            &seen,
        ) {
            Attempt::AlreadyReserved => ((allow, "reserved"), None),
            Attempt::Exceeded(e) => (self.exceeded(request, &a, e), None),
            // Not with every confirmed pod counted as seen (above); were it so, the safe answer.
            Attempt::CacheBehind => (
                (
                    allow.deny(
                        503,
                        "ServiceUnavailable",
                        "vgpu quota: this replica's pod cache is behind; retry",
                    ),
                    "unavailable",
                ),
                None,
            ),
            Attempt::Write(_) if !a.templates.is_empty() => ((allow, "checked"), None),
            Attempt::Write(_) if a.dry_run => ((allow, "reserved"), None),
            Attempt::Write(next) => ((allow, "reserved"), Some(next)),
        }
    }

    /// The steps before quota, which need nothing but the pod: a review that passes them goes on
    /// to quota; the others are answered here.
    fn precheck<'r>(&self, request: &'r AdmissionRequest) -> ControlFlow<Decision, Admissible<'r>> {
        if request.is_pod() && request.operation == "UPDATE" {
            return Break(self.update(request));
        }
        let pod = match request.created(request.is_pod()) {
            Ok(pod) => pod,
            Err(e) => return Break(e.answer(&request.uid)),
        };
        let allow = AdmissionResponse::allow(&request.uid);
        let namespace = namespace_of(request, pod);
        let dry_run = request.dry_run == Some(true);
        let containers = match policy::vgpu_containers(pod, &self.settings.policy) {
            Ok(c) => c,
            Err(e) => return Break((allow.deny(422, "Invalid", format!("vgpu: {e}")), "invalid")),
        };
        if containers.is_empty() {
            let templates = self.dra_templates(pod);
            if templates.is_empty() {
                return Break((allow, "no-vgpu"));
            }
            return Continue(Admissible {
                fallback: events::pod_ref(request, &namespace),
                pod,
                namespace,
                dry_run,
                usage: None,
                templates,
            });
        }
        let largest = self.cache.largest_card_mib();
        if let Err(v) = policy::check(
            pod,
            &namespace,
            true,
            &containers,
            &self.settings.rules,
            largest,
        ) {
            return Break(self.policy_denial(request, pod, &namespace, dry_run, v));
        }
        Continue(Admissible {
            fallback: events::pod_ref(request, &namespace),
            pod,
            namespace,
            dry_run,
            usage: None,
            templates: Vec::new(),
        })
    }

    /// The ResourceClaimTemplates a pod's claims come from (DRA mode only; none otherwise).
    fn dra_templates(&self, pod: &Value) -> Vec<String> {
        if !self.settings.dra {
            return Vec::new();
        }
        pod.pointer("/spec/resourceClaims")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| c["resourceClaimTemplateName"].as_str())
            .map(str::to_string)
            .collect()
    }

    /// What the claims made from `templates` would hold (those of class `gpu.vgpu.io`; `None`
    /// when none is): read afresh, as the mutating webhook may have made one a moment ago. A
    /// template not there yet holds nothing (its claim is counted when it is made).
    async fn templates_usage(
        &self,
        client: &kube::Client,
        namespace: &str,
        templates: &[String],
        pod: &Value,
    ) -> Result<Option<usage::PodUsage>, kube::Error> {
        let api: Api<k8s_openapi::api::resource::v1::ResourceClaimTemplate> =
            Api::namespaced(client.clone(), namespace);
        let largest = self.cache.largest_card_mib().unwrap_or(0);
        let mut slices = Vec::new();
        for name in templates {
            let Some(t) = api.get_opt(name).await? else {
                continue;
            };
            // The template's claim spec, read as the claim it makes.
            let claim =
                serde_json::json!({"spec": serde_json::to_value(&t.spec.spec).unwrap_or_default()});
            if let Some(u) = usage::claim_usage(&claim, largest) {
                slices.extend(u.slices);
            }
        }
        Ok((!slices.is_empty()).then(|| usage::PodUsage {
            slices,
            facts: usage::scope_facts(pod),
        }))
    }

    /// A Pod UPDATE: only the reserved annotations and the managed label are checked
    /// ([`policy::check_update`]); quota does not change, as a pod's resources are immutable.
    fn update(&self, request: &AdmissionRequest) -> Decision {
        let allow = AdmissionResponse::allow(&request.uid);
        let (Some(pod), Some(old)) = (&request.object, &request.old_object) else {
            return (
                allow.deny(
                    400,
                    "BadRequest",
                    "vgpu: an UPDATE review needs request.object and request.oldObject",
                ),
                "invalid",
            );
        };
        let username = request.user_info.username.as_str();
        match policy::check_update(old, pod, username, &self.settings.rules) {
            Ok(()) => (allow, "update"),
            Err(v) => {
                let namespace = namespace_of(request, pod);
                let dry_run = request.dry_run == Some(true);
                self.policy_denial(request, pod, &namespace, dry_run, v)
            }
        }
    }

    /// The denial for a broken policy rule, with its Event (none for a dry run).
    fn policy_denial(
        &self,
        request: &AdmissionRequest,
        pod: &Value,
        namespace: &str,
        dry_run: bool,
        v: policy::Violation,
    ) -> Decision {
        if !dry_run {
            self.events.record(Rejection {
                namespace: namespace.to_string(),
                regarding: events::regarding(pod, namespace, events::pod_ref(request, namespace)),
                reason: REASON_POLICY,
                note: v.message.clone(),
            });
        }
        (
            AdmissionResponse::allow(&request.uid).deny(403, "Forbidden", v.message),
            "policy",
        )
    }

    /// The reservation the pod needs under `quotas`; None when no vGPU quota covers it.
    fn incoming(
        &self,
        request: &AdmissionRequest,
        a: &Admissible<'_>,
        quotas: &[Quota],
    ) -> ControlFlow<Decision, Option<ledger::Reservation>> {
        let allow = AdmissionResponse::allow(&request.uid);
        let pod = a.pod;
        let largest = self.cache.largest_card_mib().unwrap_or(0);
        let usage = match &a.usage {
            Some(u) => u.clone(),
            None if !a.templates.is_empty() => return Continue(None),
            None => match usage::pod_usage(pod, &self.settings.policy, largest) {
                Ok(u) => u,
                Err(e) => {
                    return Break((allow.deny(422, "Invalid", format!("vgpu: {e}")), "invalid"))
                }
            },
        };
        let applies = quotas
            .iter()
            .any(|q| q.unsupported.is_none() && !q.limits.is_empty() && q.covers(&usage.facts));
        if !applies {
            return Continue(None);
        }
        let uid = pod
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .unwrap_or(&request.uid);
        let name = match a.fallback.kind.as_str() {
            "ResourceClaim" => cache::claim_key(request.object_name()),
            _ => request.object_name().to_string(),
        };
        Continue(Some(ledger::reservation(
            uid,
            &name,
            usage,
            self.settings.reservation_ttl,
        )))
    }

    /// The denial for a quota the pod would exceed, with its Event (none for a dry run).
    fn exceeded(
        &self,
        request: &AdmissionRequest,
        a: &Admissible<'_>,
        e: quota::Exceeded,
    ) -> Decision {
        let namespace = a.namespace.as_str();
        if !a.dry_run {
            let regarding = events::regarding(a.pod, namespace, a.fallback.clone());
            self.retries.refused(&regarding);
            self.events.record(Rejection {
                namespace: namespace.to_string(),
                regarding,
                reason: REASON_QUOTA,
                note: e.message.clone(),
            });
        }
        (
            AdmissionResponse::allow(&request.uid).deny(403, "Forbidden", e.message),
            "quota",
        )
    }

    async fn quota(&self, request: &AdmissionRequest, a: &Admissible<'_>) -> Decision {
        let allow = AdmissionResponse::allow(&request.uid);
        let Some(client) = &self.client else {
            return (allow, "no-quota");
        };
        let namespace = a.namespace.as_str();
        let quotas = match self.quotas(client, namespace).await {
            Ok(q) => q,
            Err(message) => {
                return (
                    allow.deny(503, "ServiceUnavailable", message),
                    "unavailable",
                )
            }
        };
        let mut a = a.clone();
        if !a.templates.is_empty() {
            if quotas.is_empty() {
                return (allow, "no-quota");
            }
            match self
                .templates_usage(client, namespace, &a.templates, a.pod)
                .await
            {
                Ok(Some(u)) => a.usage = Some(u),
                Ok(None) => return (allow, "no-vgpu"),
                Err(e) => return (
                    allow.deny(503, "ServiceUnavailable", format!("vgpu quota cannot be checked in namespace {namespace}: the pod's ResourceClaimTemplates cannot be read ({e})")),
                    "unavailable",
                ),
            }
        }
        let a = &a;
        let incoming = match self.incoming(request, a, &quotas) {
            Continue(Some(r)) => r,
            Continue(None) => return (allow, "no-quota"),
            Break(d) => return d,
        };
        let largest = self.cache.largest_card_mib().unwrap_or(0);

        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(namespace.to_string()).or_default().clone()
        };
        let _serialised = lock.lock().await;
        let api: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            &self.settings.ledger_namespace,
            &cache::api_resource("ConfigMap", "configmaps"),
        );
        let name = ledger::ledger_name(namespace);
        let started = Instant::now();
        let unavailable = |e: &dyn std::fmt::Display| {
            (
                allow.clone().deny(
                    503,
                    "ServiceUnavailable",
                    format!("vgpu quota cannot be checked in namespace {namespace}: the Kubernetes API is unavailable ({e}); pods under a vGPU quota are refused until it is back"),
                ),
                "unavailable",
            )
        };
        // A ledger request refused for the ledger namespace's sake (missing, closed to the
        // webhook) is a setup fault to name, not an outage.
        let ledger_failed = |e: &kube::Error| {
            match self.ledger_namespace.fault_in(e) {
            Some(problem) => (
                allow.clone().deny(
                    503,
                    "ServiceUnavailable",
                    format!("vgpu quota cannot be checked in namespace {namespace}: {problem}; pods under a vGPU quota are refused until then"),
                ),
                "unavailable",
            ),
            None => unavailable(e),
        }
        };
        // Whether the pods come from a fresh LIST: after this replica found its cache behind.
        let mut listed = false;
        loop {
            let current = match api.get_opt(&name).await {
                Ok(c) => c,
                Err(e) => {
                    self.metrics.quota_reservation("error");
                    return ledger_failed(&e);
                }
            };
            let ledger = current
                .as_ref()
                .map(|c| Ledger::from_configmap(&cache::to_value(c)))
                .unwrap_or_default();
            let seen = self.seen_before_pods(&ledger, listed);
            let pods = match self.pods(client, namespace, largest, listed).await {
                Ok(p) => p,
                Err(e) => {
                    self.metrics.quota_reservation("error");
                    return unavailable(&e);
                }
            };
            match ledger::attempt(
                namespace,
                &ledger,
                &pods,
                &quotas,
                &incoming,
                ledger::now_ms(),
                &|uid| seen.contains(uid),
            ) {
                Attempt::AlreadyReserved => return (allow, "reserved"),
                Attempt::Exceeded(e) => return self.exceeded(request, a, e),
                Attempt::CacheBehind => {
                    self.metrics.quota_reservation("cache-behind");
                    tracing::info!(
                        namespace,
                        "pod cache behind another replica's; deciding from a fresh LIST"
                    );
                    listed = true;
                }
                // A DRA pod is only checked: its claims are reserved as they are made.
                Attempt::Write(_) if !a.templates.is_empty() => return (allow, "checked"),
                // A dry run writes nothing: the answer is what a real request would get now.
                Attempt::Write(_) if a.dry_run => return (allow, "reserved"),
                Attempt::Write(next) => {
                    let written = write_ledger(&api, &name, current, &next).await;
                    match written {
                        Ok(()) => {
                            self.metrics.quota_reservation("ok");
                            self.ledger_namespace.works();
                            return (allow, "reserved");
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            self.metrics.quota_reservation("conflict");
                            if started.elapsed() > RESERVE_DEADLINE {
                                return unavailable(
                                    &"too many concurrent admissions in this namespace",
                                );
                            }
                        }
                        Err(e) => {
                            self.metrics.quota_reservation("error");
                            return ledger_failed(&e);
                        }
                    }
                }
            }
        }
    }

    /// The namespace's quotas: from the cache when it is complete, else a fresh LIST. When the LIST
    /// fails too, a namespace the stale cache knows quotas for fails closed, and one it knows none
    /// for is admitted (a quota created during the outage is not seen: documented).
    async fn quotas(&self, client: &kube::Client, namespace: &str) -> Result<Vec<Quota>, String> {
        if self.cache.quotas_synced() {
            return Ok(self.cache.quotas(namespace));
        }
        match cache::list_quotas(client, namespace, &self.settings.policy).await {
            Ok(q) => Ok(q),
            Err(e) => {
                let stale = self.cache.quotas(namespace);
                if stale.is_empty() {
                    tracing::warn!(namespace, error = %e, "quota cache unsynced and LIST failed; namespace had no vGPU quota");
                    Ok(stale)
                } else {
                    Err(format!("vgpu quota cannot be checked in namespace {namespace}: the Kubernetes API is unavailable ({e}); pods under a vGPU quota are refused until it is back"))
                }
            }
        }
    }

    /// The ledger's reservations whose pods the cache has seen, read before the pods are: a pod
    /// seen then is in any snapshot or LIST taken after (or gone for good), so a reservation
    /// found done always finds its pod counted. (Read after, a pod arriving in between would be
    /// in neither.)
    ///
    /// With `listed` (the pods come from a fresh LIST, which holds every pod that exists), every
    /// confirmed pod counts as seen: one the LIST lacks is gone.
    fn seen_before_pods(&self, ledger: &Ledger, listed: bool) -> std::collections::HashSet<String> {
        let reserved = ledger.reservations.iter().map(|r| &r.uid);
        let confirmed = ledger.confirmed.iter().map(|c| &c.uid);
        let mut seen: std::collections::HashSet<String> = reserved
            .chain(confirmed.clone())
            .filter(|uid| self.cache.was_seen(uid))
            .cloned()
            .collect();
        if listed {
            seen.extend(confirmed.cloned());
        }
        seen
    }

    async fn pods(
        &self,
        client: &kube::Client,
        namespace: &str,
        largest: u64,
        listed: bool,
    ) -> Result<Vec<usage::CachedPod>, kube::Error> {
        if self.cache.pods_synced() && !listed {
            return Ok(self.cache.pods(namespace));
        }
        cache::list_pods(
            client,
            namespace,
            &self.settings.policy,
            largest,
            self.settings.dra,
        )
        .await
    }
}

/// Writes the ledger: create when it did not exist, else replace with the resourceVersion read
/// (the compare-and-swap).
/// Says at start that pod UPDATEs are not checked when no annotation writers are configured.
fn warn_if_update_rule_is_off(settings: &ValidateSettings) {
    if settings.rules.deny_reserved_annotations && !policy::update_rule_enforced(&settings.rules) {
        tracing::warn!("policy.annotationWriters is empty: pod UPDATEs that change vgpu.io/assignment, vgpu.io/allocated or the vgpu.io/managed label are not refused; list the scheduler's and the device plugin's ServiceAccounts (system:serviceaccount:<namespace>:<name>) to refuse them");
    }
}

/// The request's namespace, else the object's.
fn namespace_of(request: &AdmissionRequest, pod: &Value) -> String {
    request
        .namespace
        .clone()
        .or_else(|| {
            pod.pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

async fn write_ledger(
    api: &Api<DynamicObject>,
    name: &str,
    current: Option<DynamicObject>,
    next: &Ledger,
) -> Result<(), kube::Error> {
    let pp = PostParams::default();
    match current {
        None => {
            let mut obj = DynamicObject::new(name, &configmap_resource());
            obj.metadata = ObjectMeta {
                name: Some(name.to_string()),
                labels: Some(
                    [(
                        "app.kubernetes.io/managed-by".to_string(),
                        "vgpu-webhook".to_string(),
                    )]
                    .into(),
                ),
                ..ObjectMeta::default()
            };
            obj.data = serde_json::json!({"data": next.to_data()});
            api.create(&pp, &obj).await.map(|_| ())
        }
        Some(mut obj) => {
            obj.data["data"] = next.to_data();
            api.replace(name, &pp, &obj).await.map(|_| ())
        }
    }
}

fn configmap_resource() -> ApiResource {
    cache::api_resource("ConfigMap", "configmaps")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;
    use vgpu_core::resources::ResourceNames;

    fn review(ns: &str, uid: &str, limits: Value, dry_run: bool) -> AdmissionRequest {
        let body = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE", "namespace": ns, "dryRun": dry_run,
                "object": {"metadata": {"name": uid, "uid": uid},
                    "spec": {"containers": [{"name": "c", "resources": {"limits": limits}}]}}}});
        AdmissionRequest::from_review_bytes(body.to_string().as_bytes()).unwrap()
    }

    #[tokio::test]
    async fn snapshot_decision_matches_quota_and_writes_the_reservation() {
        let cache = Arc::new(ClusterCache::default());
        cache.load_quotas([Quota::from_object(
            &json!({"metadata": {"name": "q", "namespace": "a"},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "8192"}}}),
            &ResourceNames::default(),
        )
        .unwrap()]);
        cache.load_pods([]);
        cache.load_cards([("n".to_string(), 16384)]);
        let v = Validator::with_cache(
            ValidateSettings::default(),
            cache,
            None,
            Arc::new(Metrics::new()),
        );
        let four = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"});
        let held = Ledger {
            reservations: vec![ledger::reservation(
                "held",
                "held",
                usage::pod_usage(
                    &json!({"spec": {"containers": [{"name": "c", "resources": {"limits": four}}]}}),
                    &RequestPolicy::default(),
                    16384,
                )
                .unwrap(),
                Duration::from_secs(60),
            )],
            confirmed: Vec::new(),
        };
        let now = ledger::now_ms();
        // Fits next to one 4096 reservation: admitted, and the ledger to write holds both.
        let ((r, label), next) =
            v.decide_on_snapshot(&review("a", "p1", four.clone(), false), &held, now);
        assert!(r.allowed);
        assert_eq!(label, "reserved");
        let uids: Vec<_> = next
            .unwrap()
            .reservations
            .into_iter()
            .map(|r| r.uid)
            .collect();
        assert_eq!(uids, ["held", "p1"]);
        // A dry run gets the same answer and writes nothing.
        let (d, next) = v.decide_on_snapshot(&review("a", "p1", four.clone(), true), &held, now);
        assert_eq!(d.1, "reserved");
        assert!(next.is_none());
        // 8192 more does not fit: the quota denial names the quota.
        let big = json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"});
        let ((r, label), next) = v.decide_on_snapshot(&review("a", "p2", big, false), &held, now);
        assert_eq!((r.allowed, label), (false, "quota"));
        assert_eq!(r.status.as_ref().map(|s| s.code), Some(403));
        assert!(next.is_none());
        // No quota in namespace b; and without an API client `decide` checks no quota at all.
        let ((_, label), _) =
            v.decide_on_snapshot(&review("b", "p3", four.clone(), false), &held, now);
        assert_eq!(label, "no-quota");
        assert_eq!(
            v.decide(&review("a", "p1", four, false)).await.1,
            "no-quota"
        );
        // Policy is answered before quota, the same on both paths.
        let bad = review("a", "p4", json!({"nvidia.com/gpucores": "150"}), false);
        let (snap, _) = v.decide_on_snapshot(&bad, &held, now);
        assert_eq!(snap.1, "invalid");
        assert_eq!(v.decide(&bad).await, snap);
    }
}
