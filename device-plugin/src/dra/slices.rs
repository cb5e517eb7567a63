//! This node's ResourceSlice: one device per physical GPU, shared as consumable capacity, and the
//! loop that keeps it published.
//!
//! The shapes come from the real API (`resource.k8s.io/v1`, k8s-openapi's `v1_36` types; KEP-5075
//! "Consumable capacity"): a device with `allowMultipleAllocations: true` may be allocated to many
//! requests, each consuming part of every capacity; a capacity's `requestPolicy` says what a
//! request that names no amount consumes (`default`) and which amounts are valid
//! (`validRange {min, max, step}`, a request rounded up to the step). `memory` is the card's
//! memory (after `--memory-scaling`) in bytes with 1 MiB steps and the whole card as the default,
//! as a HAMi pod without `nvidia.com/gpumem` gets the whole card; `cores` is 100 (after
//! `--core-scaling`) in whole percents, 0 by default (no SM limit), as HAMi's `gpucores`.
//!
//! The pool is the node (one slice, `resourceSliceCount: 1`); its generation goes up whenever the
//! devices change (health, a rediscovered card), so the scheduler drops what it had. An unhealthy
//! GPU stays listed with a `NoSchedule` taint (device taints, beta in 1.36): claims already on it
//! keep running, new ones go elsewhere, and `kubectl get resourceslice -o yaml` says why.

use super::{CORES, DRIVER, MEMORY, UNHEALTHY_TAINT};
use crate::devices::{DeviceState, Shape};
use crate::plugin::Shared;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Device, DeviceAttribute, DeviceCapacity,
    DeviceTaint, ResourcePool, ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ListParams, PostParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The annotation that carries a digest of the devices a slice was written with: the API server
/// rewrites quantities in its own canonical form and adds taint times, so the plugin compares what
/// it would write with what it wrote, not with what it reads back.
pub const DIGEST_ANNOTATION: &str = "gpu.vgpu.io/devices-digest";

/// How often the slice is checked even when nothing was heard (a missed watch event, a slice
/// deleted while the watch reconnected).
const RESYNC: Duration = Duration::from_secs(60);

/// The device name of the GPU with NVML index `index` (a DNS label, as the API requires).
pub fn device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The slice's name for `node`: one per node, so the plugin finds its own after a restart.
pub fn slice_name(node: &str) -> String {
    format!("{node}-{DRIVER}")
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn int(i: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(i)),
        ..Default::default()
    }
}

/// A driver version as a semantic version when it is one (`550.54.15`), so CEL can compare it
/// (`device.attributes["gpu.vgpu.io"].driverVersion.isGreaterThan(semver("550.0.0"))`), else as
/// a string.
fn version(v: &str) -> DeviceAttribute {
    let parts: Vec<&str> = v.split('.').collect();
    let semver = parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (p.len() == 1 || !p.starts_with('0'))
        });
    if semver {
        DeviceAttribute {
            version: Some(v.to_string()),
            ..Default::default()
        }
    } else {
        string(v)
    }
}

fn capacity(value: String, default: String, range: CapacityRequestPolicyRange) -> DeviceCapacity {
    DeviceCapacity {
        value: Quantity(value),
        request_policy: Some(CapacityRequestPolicy {
            default: Some(Quantity(default)),
            valid_range: Some(range),
            valid_values: None,
        }),
    }
}

/// The devices of this node's slice, in index order.
pub fn devices(state: &DeviceState, shape: Shape, driver_version: Option<&str>) -> Vec<Device> {
    let inventory = state.inventory(shape);
    inventory
        .devices
        .iter()
        .map(|d| {
            let mut attributes = BTreeMap::from([
                ("uuid".to_string(), string(&d.uuid)),
                ("productName".to_string(), string(&d.model)),
                ("index".to_string(), int(d.index)),
            ]);
            if let Some(numa) = d.numa {
                attributes.insert("numaNode".into(), int(numa));
            }
            if let Some(v) = driver_version {
                attributes.insert("driverVersion".into(), version(v));
            }
            if let Some(bus) = state.gpu(&d.uuid).and_then(|g| g.pci_bus_id.clone()) {
                attributes.insert("pciBusID".into(), string(bus));
            }
            let memory = format!("{}Mi", d.memory_mib);
            let cores = d.cores.to_string();
            let capacity = BTreeMap::from([
                (
                    MEMORY.to_string(),
                    capacity(
                        memory.clone(),
                        memory.clone(),
                        CapacityRequestPolicyRange {
                            min: Quantity("1Mi".into()),
                            max: Some(Quantity(memory)),
                            step: Some(Quantity("1Mi".into())),
                        },
                    ),
                ),
                (
                    CORES.to_string(),
                    capacity(
                        cores.clone(),
                        "0".into(),
                        CapacityRequestPolicyRange {
                            min: Quantity("0".into()),
                            max: Some(Quantity(cores)),
                            step: Some(Quantity("1".into())),
                        },
                    ),
                ),
            ]);
            Device {
                name: device_name(d.index),
                allow_multiple_allocations: Some(true),
                attributes: Some(attributes),
                capacity: Some(capacity),
                taints: (!d.healthy).then(|| {
                    vec![DeviceTaint {
                        key: UNHEALTHY_TAINT.into(),
                        value: Some("true".into()),
                        effect: "NoSchedule".into(),
                        time_added: None,
                    }]
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// FNV-1a over the devices' JSON: stable across builds (std's hasher is not), enough to tell
/// "same devices" from "changed".
pub fn digest(devices: &[Device]) -> String {
    let bytes = serde_json::to_vec(devices).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The slice object for `node` (owned by its Node, so it goes when the Node does).
pub fn slice(
    node: &str,
    node_uid: Option<&str>,
    generation: i64,
    devices: Vec<Device>,
) -> ResourceSlice {
    let owner = node_uid.map(|uid| {
        vec![OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: node.into(),
            uid: uid.into(),
            controller: Some(true),
            ..Default::default()
        }]
    });
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(slice_name(node)),
            annotations: Some(BTreeMap::from([(
                DIGEST_ANNOTATION.to_string(),
                digest(&devices),
            )])),
            owner_references: owner,
            ..Default::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..Default::default()
        },
    }
}

/// What one reconcile did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The slice already said this.
    Unchanged,
    /// Created at this generation.
    Created(i64),
    /// Replaced at this generation.
    Updated(i64),
}

/// Publishes this node's slice: the plugin's only writer of ResourceSlices.
pub struct Publisher {
    api: Api<ResourceSlice>,
    node: String,
    node_uid: Option<String>,
    /// The highest generation this process has seen or written (a slice deleted by the kubelet
    /// comes back above it).
    generation: i64,
}

impl Publisher {
    /// A publisher for `node` (its uid: the slice's owner, when known).
    pub fn new(api: Api<ResourceSlice>, node: String, node_uid: Option<String>) -> Publisher {
        Publisher {
            api,
            node,
            node_uid,
            generation: 0,
        }
    }

    /// Makes the API hold exactly one slice of this driver for this node, with `devices`.
    pub async fn reconcile(&mut self, devices: Vec<Device>) -> Result<Outcome, kube::Error> {
        let want = digest(&devices);
        let name = slice_name(&self.node);
        let lp = ListParams::default()
            .fields(&format!("spec.nodeName={},spec.driver={DRIVER}", self.node));
        let existing = self.api.list(&lp).await?;
        let mut mine = None;
        for s in existing.items {
            self.generation = self.generation.max(s.spec.pool.generation);
            if s.metadata.name.as_deref() == Some(name.as_str()) {
                mine = Some(s);
            } else if let Some(other) = &s.metadata.name {
                // A slice of ours under another name (an older layout): one pool, one slice.
                self.api.delete(other, &Default::default()).await?;
            }
        }
        match mine {
            Some(s)
                if s.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(DIGEST_ANNOTATION))
                    == Some(&want)
                    && s.spec.pool.resource_slice_count == 1 =>
            {
                Ok(Outcome::Unchanged)
            }
            Some(s) => {
                self.generation += 1;
                let mut next = slice(
                    &self.node,
                    self.node_uid.as_deref(),
                    self.generation,
                    devices,
                );
                next.metadata.resource_version = s.metadata.resource_version;
                self.api
                    .replace(&name, &PostParams::default(), &next)
                    .await?;
                Ok(Outcome::Updated(self.generation))
            }
            None => {
                self.generation += 1;
                let next = slice(
                    &self.node,
                    self.node_uid.as_deref(),
                    self.generation,
                    devices,
                );
                self.api.create(&PostParams::default(), &next).await?;
                Ok(Outcome::Created(self.generation))
            }
        }
    }
}

/// Keeps the slice published until the process ends: once the kubelet has registered the plugin,
/// whenever device health changes, whenever the API reports a change to this node's slices of this
/// driver (the kubelet deletes a driver's slices when it stays unregistered), and every minute.
///
/// Not before the registration: a slice published earlier lets kube-scheduler place a pod whose
/// claim the kubelet then cannot prepare ("DRA driver gpu.vgpu.io is not registered"), and the
/// kubelet retries such a pod only after its back-off (seen on the real cluster: over a minute).
pub async fn run(
    shared: Arc<Shared>,
    client: kube::Client,
    driver_version: Option<String>,
    mut registered: tokio::sync::watch::Receiver<bool>,
) {
    if registered.wait_for(|r| *r).await.is_err() {
        return;
    }
    let node = shared.settings.node_name.clone();
    let node_uid = match Api::<Node>::all(client.clone()).get(&node).await {
        Ok(n) => n.metadata.uid,
        Err(e) => {
            tracing::warn!(%node, error = %e, "reading the Node for the slice's owner; publishing without one");
            None
        }
    };
    let api: Api<ResourceSlice> = Api::all(client);
    let mut publisher = Publisher::new(api.clone(), node.clone(), node_uid);
    let mut health = shared.subscribe();
    let cfg = kube::runtime::watcher::Config::default()
        .fields(&format!("spec.nodeName={node},spec.driver={DRIVER}"));
    let mut changes =
        kube::runtime::WatchStreamExt::default_backoff(kube::runtime::watcher::watcher(api, cfg))
            .boxed();
    loop {
        let devices =
            shared.with_devices(|d| devices(d, shared.settings.shape, driver_version.as_deref()));
        match publisher.reconcile(devices).await {
            Ok(Outcome::Unchanged) => {}
            Ok(o) => {
                tracing::info!(outcome = ?o, slice = %slice_name(&node), "resource slice published")
            }
            Err(e) => tracing::warn!(error = %e, "publishing the resource slice; retrying"),
        }
        tokio::select! {
            r = health.changed() => if r.is_err() { return },
            ev = changes.next() => match ev {
                // Our own writes come back here too: the next reconcile finds them unchanged.
                Some(Ok(_)) => {}
                Some(Err(e)) => tracing::warn!(error = %e, "resource slice watch; retrying"),
                None => return,
            },
            () = tokio::time::sleep(RESYNC) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::backend::Gpu;

    fn state() -> DeviceState {
        let gpu = |i: u32| Gpu {
            index: i,
            uuid: format!("GPU-{i}"),
            model: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib: 40960,
            pci_bus_id: Some(format!("00000000:0{i}:00.0")),
            numa: Some(i),
            mig: false,
            nvlink_peers: vec![],
        };
        DeviceState::new(vec![gpu(0), gpu(1)], "nvidia")
    }

    const SHAPE: Shape = Shape {
        split: 10,
        memory_scaling: 1.0,
        core_scaling: 1.0,
    };

    #[test]
    fn one_shared_device_per_gpu_with_hami_shaped_capacities() {
        let d = devices(&state(), SHAPE, Some("550.54.15"));
        assert_eq!(d.len(), 2);
        let g = &d[1];
        assert_eq!(g.name, "gpu-1");
        assert_eq!(g.allow_multiple_allocations, Some(true));
        let attrs = g.attributes.as_ref().unwrap();
        assert_eq!(attrs["uuid"].string.as_deref(), Some("GPU-1"));
        assert_eq!(
            attrs["productName"].string.as_deref(),
            Some("NVIDIA A100-SXM4-40GB")
        );
        assert_eq!(attrs["index"].int, Some(1));
        assert_eq!(attrs["numaNode"].int, Some(1));
        assert_eq!(attrs["driverVersion"].version.as_deref(), Some("550.54.15"));
        assert_eq!(
            attrs["pciBusID"].string.as_deref(),
            Some("00000000:01:00.0")
        );
        let cap = g.capacity.as_ref().unwrap();
        let mem = &cap["memory"];
        assert_eq!(mem.value.0, "40960Mi");
        let policy = mem.request_policy.as_ref().unwrap();
        // A request without `memory` takes the whole card; requests are whole MiB.
        assert_eq!(policy.default.as_ref().unwrap().0, "40960Mi");
        let range = policy.valid_range.as_ref().unwrap();
        assert_eq!(
            (
                range.min.0.as_str(),
                range.step.as_ref().unwrap().0.as_str()
            ),
            ("1Mi", "1Mi")
        );
        let cores = &cap["cores"];
        assert_eq!(cores.value.0, "100");
        let policy = cores.request_policy.as_ref().unwrap();
        assert_eq!(policy.default.as_ref().unwrap().0, "0");
        let range = policy.valid_range.as_ref().unwrap();
        assert_eq!(range.max.as_ref().unwrap().0, "100");
        assert!(g.taints.is_none());
        // A driver version that is not semver stays a string.
        let d = devices(&state(), SHAPE, Some("550.54"));
        let attrs = d[0].attributes.as_ref().unwrap();
        assert_eq!(attrs["driverVersion"].string.as_deref(), Some("550.54"));
    }

    #[test]
    fn an_unhealthy_gpu_is_tainted_and_changes_the_digest() {
        let mut s = state();
        let before = devices(&s, SHAPE, None);
        s.on_xid("GPU-0", 79, std::time::Instant::now());
        let after = devices(&s, SHAPE, None);
        let t = after[0].taints.as_ref().unwrap();
        assert_eq!(
            (t[0].key.as_str(), t[0].effect.as_str()),
            (UNHEALTHY_TAINT, "NoSchedule")
        );
        assert!(after[1].taints.is_none());
        assert_ne!(digest(&before), digest(&after));
        assert_eq!(digest(&after), digest(&devices(&s, SHAPE, None)));
    }

    #[test]
    fn the_slice_is_the_nodes_one_pool() {
        let s = slice("vm", Some("uid-1"), 3, devices(&state(), SHAPE, None));
        assert_eq!(s.metadata.name.as_deref(), Some("vm-gpu.vgpu.io"));
        assert_eq!(s.spec.driver, "gpu.vgpu.io");
        assert_eq!(s.spec.node_name.as_deref(), Some("vm"));
        assert_eq!(
            (
                s.spec.pool.name.as_str(),
                s.spec.pool.generation,
                s.spec.pool.resource_slice_count
            ),
            ("vm", 3, 1)
        );
        let owner = &s.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", "uid-1"));
    }
}
