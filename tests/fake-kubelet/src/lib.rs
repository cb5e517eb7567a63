//! Test double of the kubelet's device-plugin side (pkg/kubelet/cm/devicemanager): the Registration
//! server on `<dir>/kubelet.sock`, a DevicePlugin client that dials a plugin's socket, and the
//! PodResources server ([`FakePodResources`]), all real gRPC over unix sockets, generated from the
//! same public API definitions the plugin speaks.
#![allow(missing_docs)]

use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{UnixListener, UnixStream};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The PodResources API, v1.
pub mod podresources {
    tonic::include_proto!("v1");
}

use api::device_plugin_client::DevicePluginClient;
use api::registration_server::{Registration, RegistrationServer};

/// Versions the kubelet accepts (`pluginapi.SupportedVersions`).
pub const SUPPORTED_VERSIONS: [&str; 1] = ["v1beta1"];

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<api::RegisterRequest>>>);

#[tonic::async_trait]
impl Registration for Recorder {
    /// Like the kubelet's `Register`: an unsupported version is refused with an error, and the
    /// endpoint must be a file name in the device-plugin directory.
    async fn register(
        &self,
        req: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = req.into_inner();
        if !SUPPORTED_VERSIONS.contains(&r.version.as_str()) {
            return Err(Status::invalid_argument(format!(
                "requested API version {:?} is not supported by kubelet",
                r.version
            )));
        }
        if r.endpoint.contains('/') || r.endpoint.is_empty() {
            return Err(Status::invalid_argument(
                "endpoint must be a socket file name",
            ));
        }
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(r);
        Ok(Response::new(api::Empty {}))
    }
}

/// A fake kubelet serving Registration in `dir`.
pub struct FakeKubelet {
    dir: PathBuf,
    registrations: Recorder,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeKubelet {
    /// Starts serving `<dir>/kubelet.sock` on the current runtime.
    pub async fn start(dir: &Path) -> std::io::Result<FakeKubelet> {
        let mut k = FakeKubelet {
            dir: dir.to_path_buf(),
            registrations: Recorder::default(),
            stop: None,
        };
        k.serve()?;
        Ok(k)
    }

    fn serve(&mut self) -> std::io::Result<()> {
        let path = self.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = RegistrationServer::new(self.registrations.clone());
        tokio::spawn(
            Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = rx.await;
                    },
                ),
        );
        self.stop = Some(tx);
        Ok(())
    }

    /// Restarts like the kubelet does: stops serving, removes every socket in the directory
    /// (the device manager deletes all plugin sockets on start), and serves a new `kubelet.sock`.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        for e in std::fs::read_dir(&self.dir)?.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        self.serve()
    }

    /// Dies like a SIGKILLed kubelet: stops serving, and leaves `kubelet.sock` on disk (a killed
    /// process does not unlink its socket file). [`Self::restart`] then starts a new one.
    pub fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops serving and removes kubelet.sock.
    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(self.dir.join("kubelet.sock"));
    }

    /// All registrations so far.
    pub fn registrations(&self) -> Vec<api::RegisterRequest> {
        self.registrations
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits until at least `n` registrations arrived; returns the `n`-th.
    pub async fn wait_registrations(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Option<api::RegisterRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = self.registrations().get(n - 1) {
                return Some(r.clone());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A client of the plugin that registered `endpoint`, as the kubelet dials it.
    pub async fn dial(&self, endpoint: &str) -> Result<PluginClient, tonic::transport::Error> {
        PluginClient::connect(&self.dir.join(endpoint)).await
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A pod `List` answers: (namespace, name, [(container, device ids)]).
pub type ListedPod<'a> = (&'a str, &'a str, &'a [(&'a str, &'a [&'a str])]);

/// The kubelet's PodResources server (`pkg/kubelet/apis/podresources`): `List` answers the pods
/// set with [`FakePodResources::set`], as the real one answers the pod manager's active pods with
/// the devices each container holds (a pod being admitted is there, its container without
/// devices; a pod not yet received is not).
pub struct FakePodResources {
    pods: Arc<Mutex<Vec<podresources::PodResources>>>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

#[derive(Clone)]
struct PodsServed {
    pods: Arc<Mutex<Vec<podresources::PodResources>>>,
    lists: Arc<std::sync::atomic::AtomicUsize>,
}

#[tonic::async_trait]
impl podresources::pod_resources_lister_server::PodResourcesLister for PodsServed {
    async fn list(
        &self,
        _: Request<podresources::ListPodResourcesRequest>,
    ) -> Result<Response<podresources::ListPodResourcesResponse>, Status> {
        self.lists
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pod_resources = self.pods.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Ok(Response::new(podresources::ListPodResourcesResponse {
            pod_resources,
        }))
    }
}

impl FakePodResources {
    /// Serves `path` on the current runtime, with no pods.
    pub fn start(path: &Path) -> std::io::Result<FakePodResources> {
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let served = PodsServed {
            pods: Arc::default(),
            lists: Arc::default(),
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(
            Server::builder()
                .add_service(
                    podresources::pod_resources_lister_server::PodResourcesListerServer::new(
                        served.clone(),
                    ),
                )
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = rx.await;
                    },
                ),
        );
        Ok(FakePodResources {
            pods: served.pods,
            lists: served.lists,
            _stop: tx,
        })
    }

    /// What `List` answers from now on, each container holding these ids of `resource`.
    pub fn set(&self, pods: &[ListedPod<'_>], resource: &str) {
        let pods = pods
            .iter()
            .map(|(ns, name, containers)| podresources::PodResources {
                name: (*name).into(),
                namespace: (*ns).into(),
                containers: containers
                    .iter()
                    .map(|(c, ids)| podresources::ContainerResources {
                        name: (*c).into(),
                        devices: vec![podresources::ContainerDevices {
                            resource_name: resource.into(),
                            device_ids: ids.iter().map(|i| i.to_string()).collect(),
                        }],
                    })
                    .collect(),
            })
            .collect();
        *self.pods.lock().unwrap_or_else(|e| e.into_inner()) = pods;
    }

    /// How many `List` calls were answered.
    pub fn lists(&self) -> usize {
        self.lists.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The kubelet's side of a DevicePlugin connection.
pub struct PluginClient {
    pub client: DevicePluginClient<Channel>,
}

impl PluginClient {
    /// Dials a plugin socket.
    pub async fn connect(path: &Path) -> Result<PluginClient, tonic::transport::Error> {
        let path = path.to_path_buf();
        let channel =
            Endpoint::from_static("http://localhost")
                .connect_with_connector(tower::service_fn(move |_| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?))
                    }
                }))
                .await?;
        Ok(PluginClient {
            client: DevicePluginClient::new(channel),
        })
    }

    /// Opens ListAndWatch.
    pub async fn list_and_watch(&mut self) -> Result<ListWatch, Status> {
        let s = self
            .client
            .list_and_watch(api::Empty {})
            .await?
            .into_inner();
        Ok(ListWatch(s))
    }

    /// One Allocate for one container (the kubelet allocates per container).
    pub async fn allocate(
        &mut self,
        ids: &[&str],
    ) -> Result<api::ContainerAllocateResponse, Status> {
        let r = self
            .client
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                }],
            })
            .await?
            .into_inner();
        r.container_responses
            .into_iter()
            .next()
            .ok_or_else(|| Status::internal("no container response"))
    }

    /// GetPreferredAllocation for one container.
    pub async fn preferred(
        &mut self,
        available: &[String],
        must: &[String],
        size: i32,
    ) -> Result<Vec<String>, Status> {
        let r = self
            .client
            .get_preferred_allocation(api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: available.to_vec(),
                    must_include_device_i_ds: must.to_vec(),
                    allocation_size: size,
                }],
            })
            .await?
            .into_inner();
        Ok(r.container_responses
            .into_iter()
            .next()
            .map(|c| c.device_i_ds)
            .unwrap_or_default())
    }
}

/// An open ListAndWatch stream.
pub struct ListWatch(tonic::Streaming<api::ListAndWatchResponse>);

impl ListWatch {
    /// The next list, within `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<Vec<api::Device>> {
        match tokio::time::timeout(timeout, self.0.message()).await {
            Ok(Ok(Some(r))) => Some(r.devices),
            _ => None,
        }
    }

    /// Reads lists until one satisfies `pred`, within `timeout` overall.
    pub async fn until(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&[api::Device]) -> bool,
    ) -> Option<Vec<api::Device>> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let d = self.next(left).await?;
            if pred(&d) {
                return Some(d);
            }
        }
    }
}
