//! The advertised devices: each GPU split into `split` kubelet devices `<UUID>::<k>`, their health,
//! and the node inventory built from them.

use crate::api;
use crate::backend::{is_critical_xid, Gpu};
use std::time::{Duration, Instant};
use vgpu_core::inventory::{DeviceInfo, NodeInventory};

/// Kubelet's health strings (`pluginapi.Healthy`, `pluginapi.Unhealthy`).
pub const HEALTHY: &str = "Healthy";
/// See [`HEALTHY`].
pub const UNHEALTHY: &str = "Unhealthy";

/// The kubelet device ID of share `k` of the GPU `uuid`.
pub fn device_id(uuid: &str, k: u32) -> String {
    format!("{uuid}::{k}")
}

/// The GPU UUID of a kubelet device ID (`<UUID>::<k>`); a bare UUID (whole-device mode) is itself.
pub fn uuid_of(id: &str) -> &str {
    match id.rsplit_once("::") {
        Some((uuid, k)) if k.bytes().all(|b| b.is_ascii_digit()) && !k.is_empty() => uuid,
        _ => id,
    }
}

/// Scaling and split settings that shape what is advertised.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// kubelet devices per GPU.
    pub split: u32,
    /// Factor on each card's memory (oversubscription above 1).
    pub memory_scaling: f64,
    /// Factor on each card's 100 % of cores.
    pub core_scaling: f64,
}

/// The node's GPUs and their health.
#[derive(Debug, Clone)]
pub struct DeviceState {
    /// The GPUs, in index order (MIG-enabled ones left out).
    pub gpus: Vec<Gpu>,
    /// Vendor tag of the backend.
    pub vendor: &'static str,
    healthy: Vec<bool>,
    /// When each GPU last had a critical XID, a failure event or a failed probe.
    last_bad: Vec<Option<Instant>>,
    /// Failed probes in a row per GPU.
    failures: Vec<u32>,
}

/// Transient probe failures in a row (timeouts, unknown errors) that turn a healthy GPU Unhealthy;
/// a probe that says the GPU is gone does so at once.
pub const TRANSIENT_FAILURES: u32 = 3;

impl DeviceState {
    /// All GPUs healthy; MIG-enabled cards are dropped (their memory belongs to MIG instances).
    pub fn new(gpus: Vec<Gpu>, vendor: &'static str) -> Self {
        let gpus: Vec<Gpu> = gpus.into_iter().filter(|g| !g.mig).collect();
        let n = gpus.len();
        Self {
            gpus,
            vendor,
            healthy: vec![true; n],
            last_bad: vec![None; n],
            failures: vec![0; n],
        }
    }

    /// Whether GPU `uuid` is healthy (`None`: not ours).
    pub fn is_healthy(&self, uuid: &str) -> Option<bool> {
        let i = self.gpus.iter().position(|g| g.uuid == uuid)?;
        Some(self.healthy[i])
    }

    /// The GPU with this UUID.
    pub fn gpu(&self, uuid: &str) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.uuid == uuid)
    }

    /// Records an XID; returns whether the advertised health changed.
    pub fn on_xid(&mut self, uuid: &str, xid: u64, now: Instant) -> bool {
        if !is_critical_xid(xid) {
            return false;
        }
        let Some(i) = self.gpus.iter().position(|g| g.uuid == uuid) else {
            return false;
        };
        self.last_bad[i] = Some(now);
        std::mem::replace(&mut self.healthy[i], false)
    }

    /// Records a device failure that is not an XID (a failure event, or a probe that found the
    /// device gone); returns whether the advertised health changed.
    pub fn on_failure(&mut self, uuid: &str, now: Instant) -> bool {
        let Some(i) = self.gpus.iter().position(|g| g.uuid == uuid) else {
            return false;
        };
        self.failures[i] = self.failures[i].saturating_add(1);
        self.last_bad[i] = Some(now);
        std::mem::replace(&mut self.healthy[i], false)
    }

    /// Records a failed probe: a gone device (`lost`) turns Unhealthy at once, a transient failure
    /// after [`TRANSIENT_FAILURES`] in a row; an Unhealthy device's quiet time starts again. Returns
    /// whether the advertised health changed.
    pub fn on_probe_failed(&mut self, uuid: &str, lost: bool, now: Instant) -> bool {
        let Some(i) = self.gpus.iter().position(|g| g.uuid == uuid) else {
            return false;
        };
        self.failures[i] = self.failures[i].saturating_add(1);
        if !self.healthy[i] || lost || self.failures[i] >= TRANSIENT_FAILURES {
            self.last_bad[i] = Some(now);
            return std::mem::replace(&mut self.healthy[i], false);
        }
        false
    }

    /// Records a probe the device answered: an Unhealthy device whose last XID or failure is at
    /// least `quiet` old turns Healthy again. Returns whether the advertised health changed.
    pub fn on_probe_ok(&mut self, uuid: &str, now: Instant, quiet: Duration) -> bool {
        let Some(i) = self.gpus.iter().position(|g| g.uuid == uuid) else {
            return false;
        };
        self.failures[i] = 0;
        if self.healthy[i] || !self.quiet_for(i, now, quiet) {
            return false;
        }
        self.healthy[i] = true;
        true
    }

    fn quiet_for(&self, i: usize, now: Instant, quiet: Duration) -> bool {
        self.last_bad[i].is_none_or(|t| now.saturating_duration_since(t) >= quiet)
    }

    /// Unhealthy GPUs whose quiet time has passed: a successful probe would turn them Healthy.
    pub fn recovery_candidates(&self, now: Instant, quiet: Duration) -> Vec<Gpu> {
        (0..self.gpus.len())
            .filter(|&i| !self.healthy[i] && self.quiet_for(i, now, quiet))
            .map(|i| self.gpus[i].clone())
            .collect()
    }

    /// Marks every device unhealthy (events may have been missed on any of them); returns whether
    /// anything changed.
    pub fn all_lost(&mut self, now: Instant) -> bool {
        let mut changed = false;
        for i in 0..self.gpus.len() {
            self.last_bad[i] = Some(now);
            changed |= std::mem::replace(&mut self.healthy[i], false);
        }
        changed
    }

    /// Whether an advertised ID (`<UUID>::<k>` or a bare UUID) names one of our GPUs.
    pub fn knows(&self, id: &str) -> bool {
        let uuid = uuid_of(id);
        self.gpus.iter().any(|g| g.uuid == uuid)
    }

    /// The ListAndWatch device list.
    pub fn plugin_devices(&self, split: u32) -> Vec<api::Device> {
        let mut out = Vec::with_capacity(self.gpus.len() * split as usize);
        for (g, healthy) in self.gpus.iter().zip(&self.healthy) {
            let topology = g.numa.map(|n| api::TopologyInfo {
                nodes: vec![api::NumaNode { id: i64::from(n) }],
            });
            for k in 0..split {
                out.push(api::Device {
                    id: device_id(&g.uuid, k),
                    health: if *healthy { HEALTHY } else { UNHEALTHY }.to_string(),
                    topology: topology.clone(),
                });
            }
        }
        out
    }

    /// GPU `g`'s NVLinks by peer UUID: its links' remote bus ids matched to the node's GPUs
    /// (links to something else, an NVSwitch, are not counted).
    fn nvlinks_of(&self, g: &Gpu) -> std::collections::BTreeMap<String, u32> {
        let mut links = std::collections::BTreeMap::new();
        for bus in &g.nvlink_peers {
            let peer = self.gpus.iter().find(|p| {
                p.uuid != g.uuid
                    && p.pci_bus_id
                        .as_deref()
                        .is_some_and(|b| b.eq_ignore_ascii_case(bus))
            });
            if let Some(p) = peer {
                *links.entry(p.uuid.clone()).or_insert(0) += 1;
            }
        }
        links
    }

    /// The node inventory annotation's content.
    pub fn inventory(&self, shape: Shape) -> NodeInventory {
        NodeInventory::new(
            self.gpus
                .iter()
                .zip(&self.healthy)
                .map(|(g, healthy)| DeviceInfo {
                    uuid: g.uuid.clone(),
                    index: g.index,
                    model: g.model.clone(),
                    memory_mib: (g.memory_mib as f64 * shape.memory_scaling) as u64,
                    cores: (100.0 * shape.core_scaling) as u32,
                    split: shape.split,
                    numa: g.numa,
                    healthy: *healthy,
                    vendor: if self.vendor == "nvidia" {
                        String::new()
                    } else {
                        self.vendor.to_string()
                    },
                    nvlinks: self.nvlinks_of(g),
                })
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gpu(i: u32, numa: Option<u32>) -> Gpu {
        Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            model: "A100".into(),
            memory_mib: 40960,
            pci_bus_id: None,
            numa,
            mig: false,
            nvlink_peers: Vec::new(),
        }
    }

    #[test]
    fn ids_and_topology() {
        let s = DeviceState::new(vec![gpu(0, Some(1)), gpu(1, None)], "nvidia");
        let d = s.plugin_devices(3);
        assert_eq!(d.len(), 6);
        assert_eq!(d[0].id, "GPU-0::0");
        assert_eq!(d[2].id, "GPU-0::2");
        assert_eq!(d[0].topology.as_ref().unwrap().nodes[0].id, 1);
        assert!(d[3].topology.is_none());
        assert_eq!(uuid_of("GPU-0::2"), "GPU-0");
        assert_eq!(uuid_of("GPU-a::b::12"), "GPU-a::b");
        assert_eq!(uuid_of("GPU-0"), "GPU-0");
    }

    #[test]
    fn xid_flip_and_recovery() {
        let mut s = DeviceState::new(vec![gpu(0, None), gpu(1, None)], "nvidia");
        let t0 = Instant::now();
        assert!(!s.on_xid("GPU-0", 13, t0), "13 is an application error");
        assert!(s.on_xid("GPU-0", 79, t0));
        assert!(!s.on_xid("GPU-0", 79, t0), "already unhealthy");
        assert_eq!(s.is_healthy("GPU-0"), Some(false));
        assert_eq!(s.plugin_devices(1)[0].health, UNHEALTHY);
        assert_eq!(s.plugin_devices(1)[1].health, HEALTHY);
        let q = Duration::from_secs(10);
        assert!(s
            .recovery_candidates(t0 + Duration::from_secs(5), q)
            .is_empty());
        assert!(
            !s.on_probe_ok("GPU-0", t0 + Duration::from_secs(5), q),
            "not quiet yet"
        );
        // A failed probe after the window restarts the quiet time.
        assert!(!s.on_probe_failed("GPU-0", false, t0 + q));
        assert!(!s.on_probe_ok("GPU-0", t0 + q, q));
        let t1 = t0 + q + q;
        assert_eq!(s.recovery_candidates(t1, q).len(), 1);
        assert!(s.on_probe_ok("GPU-0", t1, q));
        assert_eq!(s.is_healthy("GPU-0"), Some(true));
        assert!(s.recovery_candidates(t1, q).is_empty());
    }

    #[test]
    fn lost_at_once_transient_after_a_run() {
        let mut s = DeviceState::new(vec![gpu(0, None), gpu(1, None)], "nvidia");
        let t = Instant::now();
        assert!(
            s.on_probe_failed("GPU-0", true, t),
            "gone: unhealthy at once"
        );
        for n in 1..TRANSIENT_FAILURES {
            assert!(!s.on_probe_failed("GPU-1", false, t), "transient #{n}");
        }
        // An answer in between resets the run.
        assert!(!s.on_probe_ok("GPU-1", t, Duration::ZERO));
        for _ in 1..TRANSIENT_FAILURES {
            assert!(!s.on_probe_failed("GPU-1", false, t));
        }
        assert!(s.on_probe_failed("GPU-1", false, t));
        assert_eq!(s.is_healthy("GPU-1"), Some(false));
        assert!(!s.on_failure("GPU-9", t), "not ours");
        assert!(!s.all_lost(t), "both already unhealthy");
        assert!(s.knows("GPU-1::3") && !s.knows("GPU-9::0"));
    }

    #[test]
    fn inventory_scales_and_drops_mig() {
        let mut mig = gpu(2, None);
        mig.mig = true;
        let s = DeviceState::new(vec![gpu(0, Some(0)), mig], "nvidia");
        let inv = s.inventory(Shape {
            split: 4,
            memory_scaling: 1.5,
            core_scaling: 2.0,
        });
        assert_eq!(inv.devices.len(), 1);
        assert_eq!(inv.devices[0].memory_mib, 61440);
        assert_eq!(inv.devices[0].cores, 200);
        assert_eq!(inv.devices[0].split, 4);
        assert_eq!(inv.devices[0].vendor, "");
    }
}
