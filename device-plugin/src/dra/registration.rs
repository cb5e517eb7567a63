//! Registration with the kubelet's plugin watcher, and the sockets the kubelet calls.
//!
//! The kubelet watches `plugins_registry/` (pkg/kubelet/pluginmanager) for sockets; for each it
//! calls `Registration.GetInfo` (pluginregistration v1), checks the type (`DRAPlugin`), the name
//! (the driver) and the supported versions (`v1.DRAPlugin`, `v1beta1.DRAPlugin`), then dials the
//! returned endpoint for the DRA service and reports with `NotifyRegistrationStatus`. A restarted
//! kubelet walks the directory again; a restarted plugin makes its socket anew, which the watcher
//! sees as a new plugin. While a driver is unregistered the kubelet may delete its ResourceSlices
//! after a grace period; [`super::slices::run`] puts them back.

use super::authority;
use super::prepare::{Dra, ServiceV1, ServiceV1beta1};
use super::registration_api as reg;
use super::DRIVER;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::UnixListener;
use tonic::transport::Server;
use tonic::{Request, Response, Status};

/// The plugin type the kubelet's DRA manager handles.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA services we serve, as the registration names them (k8s.io/kubelet/pkg/apis/dra/*/types.go).
pub const SUPPORTED_VERSIONS: [&str; 2] = ["v1.DRAPlugin", "v1beta1.DRAPlugin"];
/// How often the sockets are checked (someone removing them means the kubelet can no longer reach
/// us: they are made again).
const CHECK: Duration = Duration::from_secs(2);

/// Where the sockets go.
#[derive(Debug, Clone)]
pub struct Sockets {
    /// The kubelet's plugin registry (`/var/lib/kubelet/plugins_registry`).
    pub registry_dir: PathBuf,
    /// The kubelet's plugin directory (`/var/lib/kubelet/plugins`); ours is `<dir>/gpu.vgpu.io`.
    pub plugins_dir: PathBuf,
}

impl Sockets {
    /// The registration socket.
    pub fn registration(&self) -> PathBuf {
        self.registry_dir.join(format!("{DRIVER}-reg.sock"))
    }

    /// The DRA service socket.
    pub fn service(&self) -> PathBuf {
        self.plugins_dir.join(DRIVER).join("dra.sock")
    }
}

/// The Registration service.
struct Registration {
    endpoint: String,
    registered: tokio::sync::watch::Sender<bool>,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.get_ref();
        self.registered.send_replace(s.plugin_registered);
        if s.plugin_registered {
            tracing::info!(driver = DRIVER, "registered with the kubelet");
        } else {
            tracing::error!(driver = DRIVER, error = %s.error, "the kubelet refused the registration");
        }
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Connections accepted on `listener`, each relayed through [`authority::relay`] (see there why).
fn relayed(
    listener: UnixListener,
) -> impl futures::Stream<Item = std::io::Result<authority::Conn>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = match listener.accept().await {
            Ok((client, _)) => {
                let (ours, server) = tokio::io::duplex(64 * 1024);
                tokio::spawn(authority::relay(client, ours));
                Ok(authority::Conn(server))
            }
            Err(e) => Err(e),
        };
        Some((next, listener))
    })
}

fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // A socket left by a killed plugin: nobody listens on it any more.
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path)
}

/// Serves the DRA service and the registration until `shutdown` resolves, then removes both
/// sockets. The service socket is bound before the registration one, so the kubelet never finds a
/// registration whose endpoint is not there yet. `registered` follows the kubelet's last
/// NotifyRegistrationStatus.
pub async fn serve(
    dra: Arc<Dra>,
    sockets: Sockets,
    registered: tokio::sync::watch::Sender<bool>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    tokio::pin!(shutdown);
    let service = sockets.service();
    let registration = sockets.registration();
    loop {
        let svc_listener = bind(&service)?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let svc = tokio::spawn(
            Server::builder()
                .add_service(super::api_v1::dra_plugin_server::DraPluginServer::new(
                    ServiceV1(dra.clone()),
                ))
                .add_service(super::api_v1beta1::dra_plugin_server::DraPluginServer::new(
                    ServiceV1beta1(dra.clone()),
                ))
                .add_service(
                    super::health_api::dra_resource_health_server::DraResourceHealthServer::new(
                        super::health::HealthService(dra.shared()),
                    ),
                )
                .serve_with_incoming_shutdown(relayed(svc_listener), stopped(stop_rx.clone())),
        );
        let reg_listener = bind(&registration)?;
        let regs = tokio::spawn(
            Server::builder()
                .add_service(reg::registration_server::RegistrationServer::new(
                    Registration {
                        endpoint: service.display().to_string(),
                        registered: registered.clone(),
                    },
                ))
                .serve_with_incoming_shutdown(relayed(reg_listener), stopped(stop_rx)),
        );
        tracing::info!(service = %service.display(), registration = %registration.display(), "serving");
        let stop = loop {
            tokio::select! {
                () = &mut shutdown => break true,
                () = tokio::time::sleep(CHECK) => {
                    if !service.exists() || !registration.exists() {
                        tracing::warn!("a socket was removed; serving anew");
                        break false;
                    }
                }
            }
        };
        let _ = stop_tx.send(true);
        for task in [svc, regs] {
            let _ = tokio::time::timeout(Duration::from_secs(1), task).await;
        }
        if stop {
            let _ = std::fs::remove_file(&registration);
            let _ = std::fs::remove_file(&service);
            tracing::info!("sockets removed");
            return Ok(());
        }
    }
}
