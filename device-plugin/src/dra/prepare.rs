//! NodePrepareResources and NodeUnprepareResources (the kubelet's DRA plugin API, v1 and v1beta1).
//!
//! The kubelet sends claims by namespace, name and uid, batched; the answer has an entry for every
//! claim, each with its devices or its own error, so one bad claim never fails the others (an
//! error for the whole call makes the kubelet ignore the answer). Prepare reads the claim from the
//! API server, turns this node's part of its allocation into per-request slices
//! ([`super::claims`]), makes on the host what a device-plugin container gets
//! ([`crate::plugin::materialise`]: accounting dir, activity files, limits file), writes the CDI
//! spec ([`super::cdi`]) and records what it did in a checkpoint (`<host-dir>/dra/<uid>.json`).
//! Both calls are idempotent: a claim prepared before a restart answers from its checkpoint, and
//! unprepare removes whatever exists of a claim, by its uid, checkpoint or not.

use super::api_v1 as v1;
use super::api_v1beta1 as v1beta1;
use super::{cdi, claims, slices};
use crate::allocate::Runtime;
use crate::plugin::Shared;
use crate::records::AllocationRecord;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use tonic::{Request, Response, Status};
use vgpu_core::assignment::ContainerAssignment;

/// Host-directory subfolder with one checkpoint per prepared claim.
pub const CHECKPOINT_DIR: &str = "dra";

/// How DRA mode hands out devices, beyond what the device plugin's settings say.
#[derive(Debug, Clone)]
pub struct DraSettings {
    /// Where CDI specs go (`/var/run/cdi`: containerd reads it).
    pub cdi_dir: PathBuf,
    /// The CDI kind of the GPU vendor's own spec (`nvidia.com/gpu`, from `nvidia-ctk cdi generate
    /// --device-name-strategy=uuid`): each GPU is also named as `<kind>=<uuid>`, so the runtime
    /// adds the device nodes and driver libraries. `None`: only our edits (the GPU comes from the
    /// runtime's own configuration, or, in tests, from nowhere).
    pub gpu_cdi_kind: Option<String>,
}

/// What prepare did for one claim: the answer, kept so that a second prepare (a kubelet restart, a
/// plugin restart) gives the same one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim uid.
    pub uid: String,
    /// The devices answered.
    pub devices: Vec<PreparedDevice>,
}

/// One device of an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The request it serves.
    pub request: String,
    /// Its pool.
    pub pool: String,
    /// Its name in the pool.
    pub device: String,
    /// The CDI devices the runtime adds.
    pub cdi_device_ids: Vec<String>,
    /// The share's memory, MiB (what the allocation's `consumedCapacity` said).
    #[serde(default)]
    pub memory_mib: u64,
    /// The share's cores, percent.
    #[serde(default)]
    pub cores: u32,
}

impl From<&PreparedDevice> for v1::Device {
    fn from(d: &PreparedDevice) -> v1::Device {
        v1::Device {
            request_names: vec![d.request.clone()],
            pool_name: d.pool.clone(),
            device_name: d.device.clone(),
            cdi_device_ids: d.cdi_device_ids.clone(),
        }
    }
}

/// The DRA plugin's state: the node's devices and settings, the API client, where things go.
pub struct Dra {
    shared: Arc<Shared>,
    client: Option<kube::Client>,
    settings: DraSettings,
    /// Held from the over-commit check to the checkpoint, so two claims prepared at once are
    /// checked against each other.
    committing: std::sync::Mutex<()>,
}

impl Dra {
    /// A plugin serving `shared`'s devices; `client` reads claims (`None` in tests that prepare
    /// from checkpoints only).
    pub fn new(
        shared: Arc<Shared>,
        client: Option<kube::Client>,
        settings: DraSettings,
    ) -> Arc<Dra> {
        Arc::new(Dra {
            shared,
            client,
            settings,
            committing: std::sync::Mutex::new(()),
        })
    }

    /// The node's devices and settings.
    pub fn shared(&self) -> Arc<Shared> {
        self.shared.clone()
    }

    fn checkpoint_path(&self, uid: &str) -> PathBuf {
        self.shared
            .settings
            .host_dir
            .join(CHECKPOINT_DIR)
            .join(format!("{uid}.json"))
    }

    /// Memory (MiB) and cores held per device by the claims prepared on this node, `except` one.
    fn committed(&self, except: &str) -> std::collections::HashMap<String, (u64, u64)> {
        let mut out = std::collections::HashMap::new();
        let dir = self.shared.settings.host_dir.join(CHECKPOINT_DIR);
        let Ok(entries) = std::fs::read_dir(dir) else {
            return out;
        };
        for e in entries.filter_map(Result::ok) {
            let Some(cp) = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<Checkpoint>(&b).ok())
            else {
                continue;
            };
            if cp.uid == except {
                continue;
            }
            for d in cp.devices {
                let held = out.entry(d.device).or_insert((0, 0));
                held.0 += d.memory_mib;
                held.1 += u64::from(d.cores);
            }
        }
        out
    }

    fn checkpoint(&self, uid: &str) -> Option<Checkpoint> {
        let bytes = std::fs::read(self.checkpoint_path(uid)).ok()?;
        let cp: Checkpoint = serde_json::from_slice(&bytes).ok()?;
        // The CDI spec lives on a tmpfs (/var/run): after a reboot the checkpoint outlives it,
        // and the claim is prepared again.
        (cp.uid == uid && cdi::spec_path(&self.settings.cdi_dir, uid).exists()).then_some(cp)
    }

    /// Prepares each claim; every claim gets an entry.
    pub async fn prepare(&self, claims: Vec<v1::Claim>) -> v1::NodePrepareResourcesResponse {
        let mut out = v1::NodePrepareResourcesResponse::default();
        for c in claims {
            let answer = match self.prepare_one(&c).await {
                Ok(devices) => v1::NodePrepareResourceResponse {
                    devices: devices.iter().map(v1::Device::from).collect(),
                    error: String::new(),
                },
                Err(error) => {
                    tracing::warn!(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid, %error, "prepare failed");
                    v1::NodePrepareResourceResponse {
                        devices: vec![],
                        error,
                    }
                }
            };
            out.claims.insert(c.uid.clone(), answer);
        }
        out
    }

    #[tracing::instrument(skip_all, fields(claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid))]
    async fn prepare_one(&self, c: &v1::Claim) -> Result<Vec<PreparedDevice>, String> {
        if c.uid.is_empty() || c.uid.contains(['/', '.']) {
            return Err(format!("claim uid {:?} is not a uid", c.uid));
        }
        if let Some(cp) = self.checkpoint(&c.uid) {
            tracing::info!("prepared before; answering from the checkpoint");
            return Ok(cp.devices);
        }
        let client = self
            .client
            .clone()
            .ok_or("no API client to read the claim with")?;
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(client, &c.namespace);
        let claim = api
            .get(&c.name)
            .await
            .map_err(|e| format!("reading resourceclaim {}/{}: {e}", c.namespace, c.name))?;
        if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) {
            return Err(format!(
                "resourceclaim {}/{} has uid {:?}, not {:?}: it was deleted and created again",
                c.namespace,
                c.name,
                claim.metadata.uid.as_deref().unwrap_or_default(),
                c.uid
            ));
        }
        self.prepare_allocated(c, &claim)
    }

    /// Prepare's work once the claim is read: this node's shares of its allocation checked
    /// against health, the host files made, the CDI spec written, the checkpoint kept.
    pub fn prepare_allocated(
        &self,
        c: &v1::Claim,
        claim: &ResourceClaim,
    ) -> Result<Vec<PreparedDevice>, String> {
        let node = self.shared.settings.node_name.clone();
        let state = self.shared.devices();
        let inventory = state.inventory(self.shared.settings.shape);
        let shares = claims::shares(claim, &node, &inventory.devices).map_err(|e| e.to_string())?;
        for s in &shares {
            for (name, slice) in &s.devices {
                if state.is_healthy(&slice.uuid) == Some(false) {
                    return Err(format!(
                        "device {name} ({}) is unhealthy (taint {} in ResourceSlice {}): delete the claim so that it is allocated again",
                        slice.uuid,
                        super::UNHEALTHY_TAINT,
                        slices::slice_name(&node)
                    ));
                }
            }
        }
        // The allocation comes from the claim's status, which kube-scheduler writes and tenants
        // must not (RBAC on resourceclaims/status): checked anyway against the card, with every
        // claim already prepared here, so a forged or stale allocation never over-commits a GPU.
        let _committing = self.committing.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = self.committed(&c.uid);
        for s in &shares {
            for (name, slice) in &s.devices {
                let Some(info) = inventory
                    .devices
                    .iter()
                    .find(|d| slices::device_name(d.index) == *name)
                else {
                    continue;
                };
                let h = held.entry(name.clone()).or_insert((0, 0));
                h.0 += slice.memory_mib;
                h.1 += u64::from(slice.cores);
                if h.0 > info.memory_mib || h.1 > u64::from(info.cores) {
                    return Err(format!(
                        "device {name} would hold {} MiB of its {} MiB and {} of its {} cores with this claim's share ({} MiB, {} cores) and the claims prepared on it: the allocation disagrees with the slice, so it is not prepared",
                        h.0, info.memory_mib, h.1, info.cores, slice.memory_mib, slice.cores
                    ));
                }
            }
        }
        let runtime = Runtime {
            core_policy: self.shared.settings.core_policy,
            ..Runtime::default()
        };
        let host_dir = &self.shared.settings.host_dir;
        let pod = claim
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.as_ref())
            .and_then(|r| r.iter().find(|r| r.resource == "pods"))
            .map(|r| r.name.clone())
            .unwrap_or_default();
        let mut answers = Vec::new();
        let mut devices = Vec::new();
        for s in &shares {
            let container = ContainerAssignment {
                name: s.key(),
                devices: s.devices.iter().map(|(_, d)| d.clone()).collect(),
            };
            let answer = crate::plugin::materialise(host_dir, &c.uid, &container, &runtime)?;
            crate::records::record(
                host_dir,
                &AllocationRecord {
                    uid: c.uid.clone(),
                    namespace: c.namespace.clone(),
                    pod: pod.clone(),
                    container: container.name.clone(),
                    devices: container.devices.clone(),
                    claim: Some(c.name.clone()),
                },
            );
            for (i, (name, slice)) in s.devices.iter().enumerate() {
                let mut ids = Vec::new();
                // One CDI device carries the whole request's edits (its limits are numbered by
                // the request's devices): named once, with the request's first device.
                if i == 0 {
                    ids.push(cdi::device_id(&c.uid, &s.key()));
                }
                if let Some(kind) = &self.settings.gpu_cdi_kind {
                    ids.push(format!("{kind}={}", slice.uuid));
                }
                devices.push(PreparedDevice {
                    request: s.request.clone(),
                    pool: node.clone(),
                    device: name.clone(),
                    cdi_device_ids: ids,
                    memory_mib: slice.memory_mib,
                    cores: slice.cores,
                });
            }
            answers.push((s.key(), answer));
        }
        cdi::write(&self.settings.cdi_dir, &c.uid, &cdi::spec(&c.uid, &answers))
            .map_err(|e| format!("writing the CDI spec: {e}"))?;
        let cp = Checkpoint {
            namespace: c.namespace.clone(),
            name: c.name.clone(),
            uid: c.uid.clone(),
            devices,
        };
        let path = self.checkpoint_path(&c.uid);
        crate::plugin::write_atomically(&path, &serde_json::to_vec(&cp).unwrap_or_default())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        tracing::info!(
            requests = shares.len(),
            devices = cp.devices.len(),
            "prepared"
        );
        Ok(cp.devices)
    }

    /// Unprepares each claim; every claim gets an entry.
    pub fn unprepare(&self, claims: Vec<v1::Claim>) -> v1::NodeUnprepareResourcesResponse {
        let mut out = v1::NodeUnprepareResourcesResponse::default();
        for c in claims {
            let _span = tracing::info_span!("unprepare", claim = %format!("{}/{}", c.namespace, c.name), uid = %c.uid).entered();
            let error = match self.unprepare_one(&c.uid) {
                Ok(()) => {
                    tracing::info!("unprepared");
                    String::new()
                }
                Err(e) => {
                    tracing::warn!(error = %e, "unprepare failed");
                    e.to_string()
                }
            };
            out.claims
                .insert(c.uid.clone(), v1::NodeUnprepareResourceResponse { error });
        }
        out
    }

    /// Unprepare's work for one claim: everything prepare made for `uid`, gone.
    pub fn unprepare_one(&self, uid: &str) -> Result<(), UnprepareError> {
        if uid.is_empty() || uid.contains(['/', '.']) {
            return Err(UnprepareError::NotAUid(uid.to_string()));
        }
        cdi::remove(&self.settings.cdi_dir, uid).map_err(UnprepareError::CdiSpec)?;
        crate::records::forget_owner(&self.shared.settings.host_dir, uid);
        match std::fs::remove_file(self.checkpoint_path(uid)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(UnprepareError::Checkpoint(e))
            }
            _ => Ok(()),
        }
    }
}

/// Why a claim could not be unprepared (the kubelet retries it).
#[derive(Debug, thiserror::Error)]
pub enum UnprepareError {
    /// The kubelet named no uid a claim can have.
    #[error("claim uid {0:?} is not a uid")]
    NotAUid(String),
    /// The claim's CDI spec stays.
    #[error("removing the CDI spec: {0}")]
    CdiSpec(#[source] std::io::Error),
    /// The claim's checkpoint stays.
    #[error("removing the checkpoint: {0}")]
    Checkpoint(#[source] std::io::Error),
}

/// The v1 service.
#[derive(Clone)]
pub struct ServiceV1(pub Arc<Dra>);

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for ServiceV1 {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        Ok(Response::new(self.0.prepare(req.into_inner().claims).await))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        Ok(Response::new(self.0.unprepare(req.into_inner().claims)))
    }
}

/// The v1beta1 service: the same messages under another package, so each is carried over by its
/// wire encoding.
#[derive(Clone)]
pub struct ServiceV1beta1(pub Arc<Dra>);

fn convert<A: prost::Message, B: prost::Message + Default>(a: &A) -> Result<B, Status> {
    B::decode(a.encode_to_vec().as_slice()).map_err(|e| Status::internal(e.to_string()))
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for ServiceV1beta1 {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let req: v1::NodePrepareResourcesRequest = convert(req.get_ref())?;
        Ok(Response::new(convert(&self.0.prepare(req.claims).await)?))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let req: v1::NodeUnprepareResourcesRequest = convert(req.get_ref())?;
        Ok(Response::new(convert(&self.0.unprepare(req.claims))?))
    }
}
