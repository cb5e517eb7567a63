//! Serving on the kubelet's device-plugin directory and registering with the kubelet.
//!
//! The kubelet (pkg/kubelet/cm/devicemanager) removes every socket in its device-plugin directory
//! when it starts and recreates `kubelet.sock`; a plugin must then recreate its own socket and
//! register again. We watch the directory with inotify (notify): a new `kubelet.sock`, or our own
//! socket disappearing, restarts the server and registration at once.

use crate::api;
use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::registration_client::RegistrationClient;
use crate::plugin::{options, Service, Shared};
use crate::unix::connect_unix;
use notify::{EventKind, RecursiveMode, Watcher};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::net::UnixListener;
use tonic::transport::Server;

/// The kubelet's registration socket, in the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The device plugin API version we speak.
pub const API_VERSION: &str = "v1beta1";
/// How often a failed registration is retried when nothing in the directory changes.
const RETRY: Duration = Duration::from_secs(5);
/// How long directory events are gathered into one restart.
const SETTLE: Duration = Duration::from_millis(100);
/// How long the old server may take to finish its connections before a restart goes on without
/// it: a ListAndWatch stream never ends by itself, so a graceful stop waits as long as the peer
/// keeps the connection (an old kubelet connection still open, a socket deleted under a live
/// kubelet). The old connections keep being served until their peer closes them.
const DRAIN: Duration = Duration::from_secs(1);

/// Why serving stopped.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum KubeletError {
    /// The socket could not be created.
    #[error("listening on {path}: {source}")]
    Listen {
        /// Socket path.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The directory cannot be watched.
    #[error("watching {path}: {source}")]
    Watch {
        /// The directory.
        path: String,
        /// The notify error.
        #[source]
        source: notify::Error,
    },
    /// Registration failed.
    #[error("registering with {path}: {message}")]
    Register {
        /// kubelet.sock path.
        path: String,
        /// What failed.
        message: String,
    },
}

/// Registers `endpoint` (a socket file name in `dir`) for `resource` with the kubelet.
pub async fn register(dir: &Path, endpoint: &str, resource: &str) -> Result<(), KubeletError> {
    let path = dir.join(KUBELET_SOCKET);
    let err = |message: String| KubeletError::Register {
        path: path.display().to_string(),
        message,
    };
    let channel = connect_unix(&path).await.map_err(|e| err(e.to_string()))?;
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: API_VERSION.into(),
            endpoint: endpoint.into(),
            resource_name: resource.into(),
            options: Some(options()),
        })
        .await
        .map_err(|s| err(format!("{}: {}", s.code(), s.message())))?;
    Ok(())
}

/// Where to serve and what to register.
#[derive(Debug, Clone)]
pub struct PluginEndpoint {
    /// The kubelet's device-plugin directory.
    pub dir: PathBuf,
    /// Our socket's file name in it.
    pub socket: String,
    /// Extended resource name to register.
    pub resource: String,
}

fn restart_worthy(ev: &notify::Event, kubelet: &Path, ours: &Path) -> bool {
    match ev.kind {
        EventKind::Create(_) => ev.paths.iter().any(|p| p == kubelet),
        // Our own removal before re-binding also shows up here, after the new socket exists.
        EventKind::Remove(_) => ev.paths.iter().any(|p| p == ours) && !ours.exists(),
        _ => false,
    }
}

/// Serves the plugin until `shutdown` resolves, then removes the socket.
pub async fn serve(
    shared: Arc<Shared>,
    ep: PluginEndpoint,
    shutdown: impl Future<Output = ()>,
) -> Result<(), KubeletError> {
    let (tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |res: notify::Result<notify::Event>| {
        if let Ok(ev) = res {
            let _ = tx.send(ev);
        }
    })
    .map_err(|source| KubeletError::Watch {
        path: ep.dir.display().to_string(),
        source,
    })?;
    watcher
        .watch(&ep.dir, RecursiveMode::NonRecursive)
        .map_err(|source| KubeletError::Watch {
            path: ep.dir.display().to_string(),
            source,
        })?;
    let ours = ep.dir.join(&ep.socket);
    let kubelet = ep.dir.join(KUBELET_SOCKET);
    tokio::pin!(shutdown);
    loop {
        let _ = std::fs::remove_file(&ours);
        let listener = UnixListener::bind(&ours).map_err(|source| KubeletError::Listen {
            path: ours.display().to_string(),
            source,
        })?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(
            Server::builder()
                .add_service(DevicePluginServer::new(Service(shared.clone())))
                .serve_with_incoming_shutdown(
                    tokio_stream::wrappers::UnixListenerStream::new(listener),
                    async {
                        let _ = stop_rx.await;
                    },
                ),
        );
        tracing::info!(socket = %ours.display(), "serving");
        let mut registered = false;
        let stop = loop {
            if !registered {
                match register(&ep.dir, &ep.socket, &ep.resource).await {
                    Ok(()) => {
                        registered = true;
                        tracing::info!(resource = %ep.resource, "registered with the kubelet");
                    }
                    Err(e) => tracing::warn!(error = %e, "registration failed; retrying"),
                }
            }
            tokio::select! {
                () = &mut shutdown => break true,
                ev = events.recv() => match ev {
                    Some(ev) if restart_worthy(&ev, &kubelet, &ours) => {
                        tracing::info!(?ev.kind, paths = ?ev.paths, "kubelet restarted or socket removed; re-registering");
                        // A kubelet restart is a burst (sockets removed, kubelet.sock created):
                        // take it as one restart.
                        tokio::time::sleep(SETTLE).await;
                        while events.try_recv().is_ok() {}
                        break false;
                    }
                    Some(_) => {}
                    None => break true,
                },
                () = tokio::time::sleep(RETRY), if !registered => {}
            }
        };
        let _ = stop_tx.send(());
        let mut server = server;
        if tokio::time::timeout(DRAIN, &mut server).await.is_err() {
            tracing::info!("old connections still open; serving the new socket without waiting");
        }
        if stop {
            let _ = std::fs::remove_file(&ours);
            tracing::info!(socket = %ours.display(), "socket removed");
            return Ok(());
        }
    }
}
