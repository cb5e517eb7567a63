//! The DevicePlugin gRPC service the kubelet calls.

use crate::allocate;
use crate::api;
use crate::api::device_plugin_server::DevicePlugin;
use crate::devices::{uuid_of, DeviceState, Shape};
use crate::pods::{PodCache, PodEntry};
use futures::Stream;
use k8s_openapi::api::core::v1::Pod;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

/// Settings the service answers by.
#[derive(Debug, Clone)]
pub struct Settings {
    /// This node's name.
    pub node_name: String,
    /// Split count and scaling.
    pub shape: Shape,
    /// Host directory with the library, the preload list and the per-container directories.
    pub host_dir: PathBuf,
    /// Answer Allocate for pods without an assignment (whole devices, no limits).
    pub allow_unscheduled: bool,
    /// The node's core-limit policy for containers that do not choose one.
    pub core_policy: vgpu_core::env::CorePolicy,
    /// Namespaces whose pods may lift a limit (`CUDA_DISABLE_CONTROL`, their own core policy).
    pub disable_control_namespaces: Vec<String>,
    /// Asked which pod the kubelet is admitting ([`crate::admitting`]); `None`: the oldest
    /// pending pod of the count is answered.
    pub pod_resources: Option<crate::admitting::Lister>,
}

/// State shared by the gRPC service, the health loop, the pod watcher and the inventory task.
pub struct Shared {
    /// Settings.
    pub settings: Settings,
    devices: Mutex<DeviceState>,
    /// The current ListAndWatch list; every change is sent to every stream.
    list: watch::Sender<Vec<api::Device>>,
    pods: Mutex<PodCache>,
    /// Lists this node's vGPU pods when the cache has no match (the watch may lag the kubelet).
    lister: Option<kube::Api<Pod>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// State for these devices; `lister` refreshes the pod cache on a miss.
    pub fn new(
        settings: Settings,
        devices: DeviceState,
        lister: Option<kube::Api<Pod>>,
    ) -> Arc<Self> {
        let (list, _) = watch::channel(devices.plugin_devices(settings.shape.split));
        Arc::new(Self {
            settings,
            devices: Mutex::new(devices),
            list,
            pods: Mutex::new(PodCache::default()),
            lister,
        })
    }

    /// Runs `f` on the device state and publishes the list if `f` reports a change.
    pub fn update_devices(&self, f: impl FnOnce(&mut DeviceState) -> bool) -> bool {
        let mut d = lock(&self.devices);
        let changed = f(&mut d);
        if changed {
            let list = d.plugin_devices(self.settings.shape.split);
            self.list.send_replace(list);
        }
        changed
    }

    /// A copy of the device state.
    pub fn devices(&self) -> DeviceState {
        lock(&self.devices).clone()
    }

    /// Runs `f` on the device state without copying it.
    pub fn with_devices<R>(&self, f: impl FnOnce(&DeviceState) -> R) -> R {
        f(&lock(&self.devices))
    }

    /// A receiver of the ListAndWatch list.
    pub fn subscribe(&self) -> watch::Receiver<Vec<api::Device>> {
        self.list.subscribe()
    }

    /// Runs `f` on the pod cache.
    pub fn with_pods<R>(&self, f: impl FnOnce(&mut PodCache) -> R) -> R {
        f(&mut lock(&self.pods))
    }

    async fn refresh_pods(&self) -> Result<(), kube::Error> {
        let Some(api) = &self.lister else {
            return Ok(());
        };
        let lp = kube::api::ListParams::default()
            .fields(&format!("spec.nodeName={}", self.settings.node_name))
            .labels(vgpu_core::annotations::MANAGED_SELECTOR);
        let list = api.list(&lp).await?;
        let node = &self.settings.node_name;
        let entries = list
            .items
            .iter()
            .filter_map(|p| PodEntry::from_pod(p, node))
            .collect();
        self.with_pods(|c| c.replace_all(entries));
        Ok(())
    }

    /// Records on the pod which containers were answered (`vgpu.io/allocated`), so a restarted
    /// plugin does not answer one twice. Best effort: the answer does not wait on a failed patch.
    async fn mark_allocated(&self, claim: &crate::pods::Claim) {
        let Some(api) = &self.lister else { return };
        let names = self.with_pods(|c| c.answered(&claim.uid)).join(",");
        let patch = serde_json::json!({"metadata": {"annotations": {
            vgpu_core::annotations::ALLOCATED: names,
        }}});
        let api: kube::Api<Pod> =
            kube::Api::namespaced(api.clone().into_client(), &claim.namespace);
        if let Err(e) = api
            .patch(
                &claim.name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(patch),
            )
            .await
        {
            tracing::warn!(pod = %format!("{}/{}", claim.namespace, claim.name), error = %e, "marking containers allocated failed");
        }
    }

    /// What the kubelet says of its pods (the PodResources API), when configured.
    async fn kubelet_pods(&self) -> Option<crate::admitting::KubeletPods> {
        self.settings.pod_resources.as_ref()?.list().await
    }

    /// The pod and container an Allocate of `ids` is for: among the pods the kubelet may be
    /// allocating; when the cache holds none of those (its watch lags the kubelet's), again after
    /// listing this node's pods; and when the kubelet still names none of ours, among all.
    async fn claim(&self, ids: &[String]) -> Result<crate::pods::Claim, Status> {
        let kubelet = self.kubelet_pods().await;
        let mut claim = self.with_pods(|c| c.claim(ids, kubelet.as_ref()));
        if claim.is_err() && self.lister.is_some() {
            if let Err(e) = self.refresh_pods().await {
                return Err(Status::unavailable(format!(
                    "listing this node's pods from the API server: {e}"
                )));
            }
            claim = self.with_pods(|c| c.claim(ids, kubelet.as_ref()));
        }
        if let (Err(e), Some(_)) = (&claim, &kubelet) {
            tracing::warn!(error = %e, "the kubelet is admitting none of the pods known here; answering the oldest");
            claim = self.with_pods(|c| c.claim(ids, None));
        }
        claim.map_err(|e| Status::failed_precondition(e.to_string()))
    }

    /// The GPUs to prefer for the next container of `count` devices: those assigned to the pod the
    /// kubelet may be allocating (looked up again after listing this node's pods when the cache
    /// holds none of those), else to the oldest pending pod.
    async fn hint(&self, count: usize) -> Option<Vec<String>> {
        let kubelet = self.kubelet_pods().await;
        let peek = |k: Option<&crate::admitting::KubeletPods>| {
            self.with_pods(|c| c.peek_assigned(count, k))
        };
        if let Some(hint) = peek(kubelet.as_ref()) {
            return Some(hint);
        }
        if kubelet.is_some() && self.refresh_pods().await.is_ok() {
            if let Some(hint) = peek(kubelet.as_ref()) {
                return Some(hint);
            }
        }
        peek(None)
    }

    /// Answers one container of an Allocate.
    pub async fn allocate_container(
        &self,
        ids: &[String],
    ) -> Result<api::ContainerAllocateResponse, Status> {
        if ids.is_empty() {
            return Err(Status::invalid_argument(
                "container request has no device IDs",
            ));
        }
        let unknown = self.with_devices(|d| ids.iter().find(|id| !d.knows(id)).cloned());
        if let Some(bad) = unknown {
            return Err(Status::invalid_argument(format!(
                "device ID {bad:?} is not one this plugin advertises"
            )));
        }
        match self.claim(ids).await {
            Ok(claim) => {
                let lift_allowed = self
                    .settings
                    .disable_control_namespaces
                    .contains(&claim.namespace);
                let runtime = allocate::Runtime::decide(
                    &claim.settings,
                    self.settings.core_policy,
                    lift_allowed,
                )
                .map_err(|e| {
                    Status::invalid_argument(format!(
                        "pod {}/{} container {:?}: {e}",
                        claim.namespace, claim.name, claim.container.name
                    ))
                })?;
                let answer = materialise(
                    &self.settings.host_dir,
                    &claim.uid,
                    &claim.container,
                    &runtime,
                )
                .map_err(Status::internal)?;
                let host = self.settings.host_dir.clone();
                let record_claim = claim.clone();
                let record = tokio::task::spawn_blocking(move || {
                    crate::records::record_allocation(&host, &record_claim)
                });
                self.mark_allocated(&claim).await;
                let _ = record.await;
                tracing::info!(pod = %format!("{}/{}", claim.namespace, claim.name), container = %claim.container.name, ?ids, "allocated");
                Ok(answer)
            }
            Err(e)
                if self.settings.allow_unscheduled
                    && e.code() == tonic::Code::FailedPrecondition =>
            {
                let mut uuids: Vec<String> = Vec::new();
                for id in ids {
                    let u = uuid_of(id).to_string();
                    if !uuids.contains(&u) {
                        uuids.push(u);
                    }
                }
                tracing::warn!(
                    ?ids,
                    "no assignment matched; whole devices without limits (--allow-unscheduled)"
                );
                Ok(allocate::unscheduled(&self.settings.host_dir, &uuids))
            }
            Err(e) => Err(e),
        }
    }

    /// GetPreferredAllocation for one container: shares of the GPUs the scheduler assigned to the
    /// next pod of this size ([`Shared::hint`]), else packed onto the fewest GPUs.
    pub async fn preferred(&self, req: &api::ContainerPreferredAllocationRequest) -> Vec<String> {
        let size = usize::try_from(req.allocation_size).unwrap_or(0);
        let mut chosen: Vec<String> = req.must_include_device_i_ds.clone();
        let mut used: Vec<String> = chosen.iter().map(|i| uuid_of(i).to_string()).collect();
        let pick = |uuid: &str, chosen: &mut Vec<String>, used: &mut Vec<String>| {
            if used.iter().any(|u| u == uuid) {
                return;
            }
            if let Some(id) = req
                .available_device_i_ds
                .iter()
                .find(|i| uuid_of(i) == uuid && !chosen.contains(i))
            {
                chosen.push(id.clone());
                used.push(uuid.to_string());
            }
        };
        let hint = self.hint(size).await;
        for uuid in hint.iter().flatten() {
            if chosen.len() >= size {
                break;
            }
            pick(uuid, &mut chosen, &mut used);
        }
        // Pack: GPUs with the fewest free shares first (the most used), one share per GPU.
        let mut free: Vec<(usize, String)> = Vec::new();
        for id in &req.available_device_i_ds {
            let u = uuid_of(id);
            match free.iter_mut().find(|(_, x)| x == u) {
                Some(e) => e.0 += 1,
                None => free.push((1, u.to_string())),
            }
        }
        free.sort();
        for (_, uuid) in free {
            if chosen.len() >= size {
                break;
            }
            pick(&uuid, &mut chosen, &mut used);
        }
        chosen.truncate(size.max(req.must_include_device_i_ds.len()));
        chosen
    }
}

/// The tonic service.
#[derive(Clone)]
pub struct Service(pub Arc<Shared>);

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut rx = self.0.subscribe();
        rx.mark_changed();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            rx.changed().await.ok()?;
            let devices = rx.borrow_and_update().clone();
            Some((Ok(api::ListAndWatchResponse { devices }), rx))
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            let device_i_ds = self.0.preferred(c).await;
            tracing::info!(
                available = c.available_device_i_ds.len(),
                must_include = ?c.must_include_device_i_ds,
                size = c.allocation_size,
                preferred = ?device_i_ds,
                "preferred allocation"
            );
            container_responses.push(api::ContainerPreferredAllocationResponse { device_i_ds });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        req: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let mut container_responses = Vec::new();
        for c in &req.get_ref().container_requests {
            container_responses.push(self.0.allocate_container(&c.devices_ids).await?);
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// The options this plugin registers with.
pub fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

/// Creates a container's accounting directory, writable by every user: the plugin cannot know which
/// uid the container's processes run as (`runAsUser`, the image's `USER`, or several), the kubelet
/// neither creates nor chowns device-plugin mounts, and `fsGroup` does not reach them. The
/// directory is mounted into that one container only (at `/tmp/vgpu`), so the mode opens it to
/// that container's users and to host root; sticky, as `/tmp`, so one user cannot remove
/// another's file.
/// Makes on the host what an answer for `container` mounts (its accounting directory, each GPU's
/// activity file, its limits file) and returns the answer: Allocate's work for one container, and
/// DRA mode's for one request of a claim (`owner` is the pod's or the claim's uid). Idempotent.
pub fn materialise(
    host_dir: &std::path::Path,
    owner: &str,
    container: &vgpu_core::assignment::ContainerAssignment,
    runtime: &allocate::Runtime,
) -> Result<api::ContainerAllocateResponse, String> {
    let dir = allocate::container_dir(host_dir, owner, &container.name);
    create_accounting_dir(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for d in &container.devices {
        let path = allocate::activity_path(host_dir, &d.uuid);
        create_activity_file(&path).map_err(|e| format!("creating {}: {e}", path.display()))?;
    }
    let answer = allocate::assigned(host_dir, owner, container, runtime);
    // The hook trusts this file over the environment; without it the container must not start,
    // so a failed write fails the whole answer.
    let limits = allocate::limits_path(host_dir, owner, &container.name);
    write_atomically(&limits, allocate::limits_contents(&answer).as_bytes())
        .map_err(|e| format!("writing {}: {e}", limits.display()))?;
    Ok(answer)
}

fn create_accounting_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    // create_dir_all is subject to the umask; the mode is set explicitly.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o1777))
}

/// Creates a GPU's activity file, laid out, open to every container user (0666), unless it exists:
/// containers already on the GPU have it mapped, so it is never replaced. Written under a
/// temporary name and linked into place, so nobody maps a file without its header.
fn create_activity_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // A file with another layout (a damaged one, or not ours) is no use to anyone: it is replaced,
    // and containers that start from now on share the new one.
    let replace = match std::fs::symlink_metadata(path) {
        Err(_) => false,
        Ok(m)
            if m.is_file()
                && m.len() == vgpu_core::activity::FILE_BYTES as u64
                && activity_header_ok(path) =>
        {
            return Ok(())
        }
        Ok(_) => true,
    };
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".new.{}.{n}", std::process::id()));
    std::fs::write(&tmp, vgpu_core::activity::initial_bytes())?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o666))?;
    if replace {
        tracing::warn!(path = %path.display(), "GPU activity file has another layout; replaced");
        return std::fs::rename(&tmp, path);
    }
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Whether the file at `path` starts with the activity header (only the header is read: this runs
/// at every Allocate).
fn activity_header_ok(path: &std::path::Path) -> bool {
    use std::io::Read;
    let mut head = [0u8; vgpu_core::activity::HEADER_CHECK_BYTES];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut head))
        .is_ok_and(|()| vgpu_core::activity::header_bytes_ok(&head))
}

/// Writes `bytes` to `path` so that a reader sees the old file or the whole new one (a container
/// that starts while the plugin is writing must never read half a limits file): a temporary file in
/// the same directory, then rename.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no directory"))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp",
        path.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default()
    ));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
