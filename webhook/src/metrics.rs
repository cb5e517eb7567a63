//! Prometheus metrics of the admission service, served at `GET /metrics` (text exposition format,
//! on the same TLS listener: the webhook has no plaintext port).
//!
//! Names follow the Prometheus conventions: a `vgpu_webhook_` prefix, base units (seconds),
//! `_total` on counters. Label values come from small fixed sets (endpoint, decision, reason), never
//! from request content, so a hostile client cannot blow up the series count; the quota gauges
//! carry one series per ResourceQuota key vgpu enforces (objects an administrator wrote).

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::time::Duration;

/// Labels of one admission outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `mutate` or `validate`.
    pub endpoint: &'static str,
    /// `allowed`, `denied` or `bad-request`.
    pub decision: &'static str,
    /// Why, in one word (`patched`, `no-vgpu`, `skipped`, `unchanged`, `invalid`, `quota`, ...).
    pub reason: &'static str,
}

/// Labels naming an endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    /// `mutate` or `validate`.
    pub endpoint: &'static str,
}

/// Labels of an outcome that either worked or did not.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or `error` (`conflict` too, for reservations).
    pub result: &'static str,
}

/// Labels naming one of the validator's caches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `resourcequotas`, `pods` or `nodes`.
    pub cache: &'static str,
}

/// Labels of one enforced ResourceQuota key.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// The quota's namespace.
    pub namespace: String,
    /// The ResourceQuota's name.
    pub quota: String,
    /// The `spec.hard` key as written (`requests.nvidia.com/gpumem`).
    pub resource: String,
}

/// Every metric of the webhook, and the registry that exposes them.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    admissions: Family<AdmissionLabels, Counter>,
    duration: Family<EndpointLabels, Histogram>,
    quota_reservations: Family<ResultLabels, Counter>,
    event_writes: Family<ResultLabels, Counter>,
    quota_retries: Family<ResultLabels, Counter>,
    cache_synced: Family<CacheLabels, Gauge>,
    quota_used: Family<QuotaLabels, Gauge>,
    quota_hard: Family<QuotaLabels, Gauge>,
    /// Serialises scrapes: each rebuilds the quota gauges before encoding, and one scrape must not
    /// encode between another's clear and refill.
    scrape: std::sync::Mutex<()>,
}

/// Latency buckets: admissions take tens of microseconds; the API server gives up at the
/// webhook's timeoutSeconds (at most 30 s).
const DURATION_BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 1.0, 5.0,
];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let admissions = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "vgpu_webhook_admissions",
            "Admission reviews answered, by endpoint, decision and reason",
            admissions.clone(),
        );
        let duration = Family::<EndpointLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        registry.register_with_unit(
            "vgpu_webhook_admission_duration",
            "Time from a review's body read to its answer",
            Unit::Seconds,
            duration.clone(),
        );
        let quota_reservations = Family::<ResultLabels, Counter>::default();
        registry.register(
            "vgpu_webhook_quota_reservations",
            "Reservations of tenant gpumem quota, by result",
            quota_reservations.clone(),
        );
        let event_writes = Family::<ResultLabels, Counter>::default();
        registry.register(
            "vgpu_webhook_event_writes",
            "Kubernetes Events written for rejections, by result",
            event_writes.clone(),
        );
        let quota_retries = Family::<ResultLabels, Counter>::default();
        registry.register(
            "vgpu_webhook_quota_retries",
            "Controllers whose pods were refused for quota asked to try again (annotation vgpu.io/quota-retry written) when room may have appeared, by result: ok, gone (the owner was deleted), error",
            quota_retries.clone(),
        );
        let cache_synced = Family::<CacheLabels, Gauge>::default();
        registry.register(
            "vgpu_webhook_cache_synced",
            "Whether this cache of the validating webhook holds a complete LIST and its watch is healthy (1) or not (0); /readyz is 503 while any is 0",
            cache_synced.clone(),
        );
        let quota_used = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "vgpu_webhook_quota_used",
            "What vgpu counts against a ResourceQuota key, the way it enforces it: GPUs, GPUs x MiB or GPUs x percent of the namespace's vGPU pods that exist (reservations of pods just admitted and not yet seen come on top at admission; Kubernetes' own count of requests.<name> sums per-container values, without the GPU factor)",
            quota_used.clone(),
        );
        let quota_hard = Family::<QuotaLabels, Gauge>::default();
        registry.register(
            "vgpu_webhook_quota_hard",
            "The ResourceQuota key's hard limit as vgpu enforces it",
            quota_hard.clone(),
        );
        Metrics {
            registry,
            admissions,
            duration,
            quota_reservations,
            event_writes,
            quota_retries,
            cache_synced,
            quota_used,
            quota_hard,
            scrape: std::sync::Mutex::new(()),
        }
    }

    /// A scrape: `refresh` sets the gauges computed from the caches, then the text exposition.
    pub fn scrape(&self, refresh: impl FnOnce()) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        refresh();
        self.encode()
    }

    /// Replaces the quota gauges with `(labels, used, hard)` per enforced key.
    pub fn quotas(&self, keys: impl IntoIterator<Item = (QuotaLabels, u64, u64)>) {
        self.quota_used.clear();
        self.quota_hard.clear();
        for (labels, used, hard) in keys {
            let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            self.quota_used.get_or_create(&labels).set(clamp(used));
            self.quota_hard.get_or_create(&labels).set(clamp(hard));
        }
    }

    /// Counts one answered review and its latency.
    pub fn admission(&self, labels: AdmissionLabels, took: Duration) {
        self.duration
            .get_or_create(&EndpointLabels {
                endpoint: labels.endpoint,
            })
            .observe(took.as_secs_f64());
        self.admissions.get_or_create(&labels).inc();
    }

    /// Counts one quota reservation attempt: `ok`, `conflict` (retried) or `error`.
    pub fn quota_reservation(&self, result: &'static str) {
        self.quota_reservations
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Counts one Event write.
    pub fn event_write(&self, ok: bool) {
        self.event_writes
            .get_or_create(&ResultLabels {
                result: if ok { "ok" } else { "error" },
            })
            .inc();
    }

    /// Counts one ask to retry after a quota refusal: `ok`, `gone` or `error`.
    pub fn quota_retry(&self, result: &'static str) {
        self.quota_retries
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Sets whether one of the validator's caches is synced.
    pub fn cache_synced(&self, cache: &'static str, synced: bool) {
        self.cache_synced
            .get_or_create(&CacheLabels { cache })
            .set(i64::from(synced));
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_show_up_under_conventional_names() {
        let m = Metrics::new();
        m.admission(
            AdmissionLabels {
                endpoint: "mutate",
                decision: "allowed",
                reason: "patched",
            },
            Duration::from_micros(70),
        );
        m.quota_reservation("ok");
        m.event_write(false);
        m.quota_retry("gone");
        m.cache_synced("pods", false);
        m.cache_synced("nodes", true);
        let text = m.encode();
        assert!(text.contains(
            "vgpu_webhook_admissions_total{endpoint=\"mutate\",decision=\"allowed\",reason=\"patched\"} 1"
        ), "{text}");
        assert!(text.contains("vgpu_webhook_admission_duration_seconds_bucket{le=\"0.0001\",endpoint=\"mutate\"} 1"), "{text}");
        assert!(
            text.contains("vgpu_webhook_admission_duration_seconds_count{endpoint=\"mutate\"} 1")
        );
        assert!(text.contains("vgpu_webhook_quota_reservations_total{result=\"ok\"} 1"));
        assert!(text.contains("vgpu_webhook_event_writes_total{result=\"error\"} 1"));
        assert!(text.contains("vgpu_webhook_quota_retries_total{result=\"gone\"} 1"));
        assert!(
            text.contains("vgpu_webhook_cache_synced{cache=\"pods\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("vgpu_webhook_cache_synced{cache=\"nodes\"} 1"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
    }
}
