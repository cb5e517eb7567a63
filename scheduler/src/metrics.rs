//! Prometheus metrics of the extender, served at `GET /metrics` on the metrics port.
//!
//! `vgpu_scheduler_*` count the extender's own work. `vgpu_device_*` are the placement view of every
//! GPU (what the scheduler has given out, by node and UUID), refreshed at each scrape from the
//! cache; they are the names docs/install.md's metrics contract and the Grafana dashboard use.
//! Label values are verbs, fixed outcome words, node names and GPU UUIDs, never request content.

use prometheus_client::encoding::{text::encode, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::cache::Cluster;
use crate::readiness::{Feed, Readiness};

/// Labels of one extender call.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
    /// `ok`, `error` (answered with an error) or `bad-request` (body not understood).
    pub result: &'static str,
}

/// Labels naming a verb.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// `filter`, `prioritize` or `bind`.
    pub verb: &'static str,
}

/// Labels of a bind outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BindLabels {
    /// `bound`, `no-fit`, `pod-error` or `binding-failed`.
    pub result: &'static str,
}

/// Labels of a node state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeStateLabels {
    /// `ready`, `stale` or `no-inventory`.
    pub state: &'static str,
}

/// Labels of one watch's cache.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeedLabels {
    /// `nodes` or `pods` ([`Feed::label`]).
    pub feed: &'static str,
}

/// Labels of one GPU.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceLabels {
    /// Node name.
    pub node: String,
    /// GPU UUID.
    pub uuid: String,
}

/// Every metric of the extender.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    cache_synced: Family<FeedLabels, Gauge>,
    calls: Family<CallLabels, Counter>,
    duration: Family<VerbLabels, Histogram>,
    binds: Family<BindLabels, Counter>,
    nodes: Family<NodeStateLabels, Gauge>,
    assumed: Gauge,
    host_pods: Gauge,
    mem_allocated: Family<DeviceLabels, Gauge>,
    mem_limit: Family<DeviceLabels, Gauge>,
    cores_ratio: Family<DeviceLabels, Gauge<f64, AtomicU64>>,
    healthy: Family<DeviceLabels, Gauge>,
}

/// Latency buckets: a filter over thousands of nodes takes milliseconds; a bind waits on two API
/// calls; kube-scheduler gives up at the extender's httpTimeout (30 s in the chart).
const DURATION_BUCKETS: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 0.5, 2.5, 10.0,
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
        let calls = Family::<CallLabels, Counter>::default();
        registry.register(
            "vgpu_scheduler_requests",
            "Extender calls answered, by verb and result",
            calls.clone(),
        );
        let duration = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        registry.register_with_unit(
            "vgpu_scheduler_request_duration",
            "Time from an extender call's body read to its answer",
            Unit::Seconds,
            duration.clone(),
        );
        let binds = Family::<BindLabels, Counter>::default();
        registry.register(
            "vgpu_scheduler_binds",
            "Bind calls by outcome",
            binds.clone(),
        );
        let nodes = Family::<NodeStateLabels, Gauge>::default();
        registry.register(
            "vgpu_scheduler_nodes",
            "Nodes known to the extender, by state",
            nodes.clone(),
        );
        let assumed = Gauge::default();
        registry.register(
            "vgpu_scheduler_assumed_pods",
            "Pods bound by the extender but not yet seen back from the API",
            assumed.clone(),
        );
        let host_pods = Gauge::default();
        registry.register(
            "vgpu_scheduler_host_pods",
            "Pods whose CPU and memory requests the extender counts on their nodes (every bound pod that has not finished)",
            host_pods.clone(),
        );
        let mem_allocated = Family::<DeviceLabels, Gauge>::default();
        registry.register_with_unit(
            "vgpu_device_memory_allocated",
            "Device memory given to pods on this GPU",
            Unit::Bytes,
            mem_allocated.clone(),
        );
        let mem_limit = Family::<DeviceLabels, Gauge>::default();
        registry.register_with_unit(
            "vgpu_device_memory_limit",
            "Device memory of this GPU that may be given out (after memory scaling)",
            Unit::Bytes,
            mem_limit.clone(),
        );
        let cores_ratio = Family::<DeviceLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "vgpu_device_cores_allocated_ratio",
            "Share of this GPU's cores given to pods (0 to 1)",
            cores_ratio.clone(),
        );
        let healthy = Family::<DeviceLabels, Gauge>::default();
        registry.register(
            "vgpu_device_healthy",
            "Whether the device plugin reports this GPU healthy (1) or not (0)",
            healthy.clone(),
        );
        let cache_synced = Family::<FeedLabels, Gauge>::default();
        registry.register(
            "vgpu_scheduler_cache_synced",
            "Whether this watch's cache holds a complete LIST since its last failure (1) or not (0); /readyz is 503 while any is 0",
            cache_synced.clone(),
        );
        Metrics {
            registry,
            cache_synced,
            calls,
            duration,
            binds,
            nodes,
            assumed,
            host_pods,
            mem_allocated,
            mem_limit,
            cores_ratio,
            healthy,
        }
    }

    /// Counts one answered call and its latency.
    pub fn call(&self, verb: &'static str, result: &'static str, took: Duration) {
        self.duration
            .get_or_create(&VerbLabels { verb })
            .observe(took.as_secs_f64());
        self.calls.get_or_create(&CallLabels { verb, result }).inc();
    }

    /// Counts one bind outcome.
    pub fn bind(&self, result: &'static str) {
        self.binds.get_or_create(&BindLabels { result }).inc();
    }

    /// Sets the gauges from the cache; `now` is Unix seconds.
    pub fn refresh(&self, cluster: &Cluster, now: u64) {
        let c = cluster.node_counts(now);
        for (state, n) in [
            ("ready", c.ready),
            ("stale", c.stale),
            ("no-inventory", c.no_inventory),
        ] {
            self.nodes
                .get_or_create(&NodeStateLabels { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.assumed
            .set(i64::try_from(cluster.assumed()).unwrap_or(i64::MAX));
        self.host_pods
            .set(i64::try_from(cluster.host_pods()).unwrap_or(i64::MAX));
        // Rebuilt from scratch so GPUs that went away disappear.
        self.mem_allocated.clear();
        self.mem_limit.clear();
        self.cores_ratio.clear();
        self.healthy.clear();
        const MIB: u64 = 1 << 20;
        let bytes = |mib: u64| i64::try_from(mib.saturating_mul(MIB)).unwrap_or(i64::MAX);
        for g in cluster.gpus() {
            let l = DeviceLabels {
                node: g.node,
                uuid: g.uuid,
            };
            self.mem_allocated.get_or_create(&l).set(bytes(g.used_mib));
            self.mem_limit.get_or_create(&l).set(bytes(g.memory_mib));
            let ratio = if g.cores == 0 {
                0.0
            } else {
                f64::from(g.used_cores) / f64::from(g.cores)
            };
            self.cores_ratio.get_or_create(&l).set(ratio);
            self.healthy.get_or_create(&l).set(i64::from(g.healthy));
        }
    }

    /// Sets `vgpu_scheduler_cache_synced` from the watches' states.
    pub fn refresh_readiness(&self, readiness: &Readiness) {
        for feed in Feed::ALL {
            self.cache_synced
                .get_or_create(&FeedLabels { feed: feed.label() })
                .set(i64::from(readiness.synced(feed)));
        }
    }

    /// The OpenMetrics text of every metric.
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
    use vgpu_core::inventory::{DeviceInfo, NodeInventory};

    #[test]
    fn names_follow_the_contract() {
        let m = Metrics::new();
        m.call("filter", "ok", Duration::from_micros(300));
        m.bind("bound");
        let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(60));
        let inv = NodeInventory::new(vec![DeviceInfo {
            uuid: "GPU-a".into(),
            index: 0,
            model: "NVIDIA T4".into(),
            memory_mib: 1024,
            cores: 100,
            split: 4,
            numa: None,
            healthy: true,
            vendor: String::new(),
            nvlinks: Default::default(),
        }]);
        c.apply_node(
            "n1",
            Some(&inv.encode()),
            Some(&vgpu_core::time::format_rfc3339(100)),
            None,
        );
        m.refresh(&c, 100);
        let readiness = Readiness::default();
        readiness.listed(Feed::Pods);
        m.refresh_readiness(&readiness);
        let text = m.encode();
        for want in [
            "vgpu_scheduler_cache_synced{feed=\"nodes\"} 0",
            "vgpu_scheduler_cache_synced{feed=\"pods\"} 1",
            "vgpu_scheduler_requests_total{verb=\"filter\",result=\"ok\"} 1",
            "vgpu_scheduler_request_duration_seconds_count{verb=\"filter\"} 1",
            "vgpu_scheduler_binds_total{result=\"bound\"} 1",
            "vgpu_scheduler_nodes{state=\"ready\"} 1",
            "vgpu_scheduler_assumed_pods 0",
            "vgpu_device_memory_limit_bytes{node=\"n1\",uuid=\"GPU-a\"} 1073741824",
            "vgpu_device_memory_allocated_bytes{node=\"n1\",uuid=\"GPU-a\"} 0",
            "vgpu_device_cores_allocated_ratio{node=\"n1\",uuid=\"GPU-a\"} 0.0",
            "vgpu_device_healthy{node=\"n1\",uuid=\"GPU-a\"} 1",
        ] {
            assert!(text.contains(want), "missing {want} in\n{text}");
        }
    }
}
