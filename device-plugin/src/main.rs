//! `vgpu-device-plugin`: discovers GPUs, serves the kubelet device plugin API, watches health and
//! this node's vGPU pods, publishes the node inventory and `/metrics`, until SIGTERM. With
//! `--mode=dra` it is the kubelet DRA plugin of driver `gpu.vgpu.io` instead (docs/dra.md).

use anyhow::Context;
use clap::{Parser, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use vgpu_device_plugin::allocate::{preload_contents, LIB_NAME, PRELOAD_NAME};
use vgpu_device_plugin::backend::{dcu::DcuBackend, nvidia::NvidiaBackend, DeviceBackend};
use vgpu_device_plugin::devices::{DeviceState, Shape};
use vgpu_device_plugin::dra;
use vgpu_device_plugin::kubelet::PluginEndpoint;
use vgpu_device_plugin::plugin::{Settings, Shared};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// A kubelet device plugin (`nvidia.com/gpu`), placed by vgpu-scheduler.
    DevicePlugin,
    /// A kubelet DRA plugin (driver `gpu.vgpu.io`), placed by kube-scheduler (docs/dra.md).
    Dra,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Backend {
    /// NVIDIA GPUs through NVML.
    Nvidia,
    /// AMD/Hygon DCU cards from sysfs.
    Dcu,
}

/// Kubelet device plugin for fractional GPUs.
#[derive(Debug, Parser)]
#[command(version, args_override_self = true)]
struct Cli {
    /// How this node's GPUs are offered: one mode per node.
    #[arg(long, value_enum, default_value_t = Mode::DevicePlugin)]
    mode: Mode,
    /// DRA mode: the kubelet's plugin registry directory.
    #[arg(long, default_value = "/var/lib/kubelet/plugins_registry")]
    kubelet_registry_dir: PathBuf,
    /// DRA mode: the kubelet's plugin directory (our socket is `<dir>/gpu.vgpu.io/dra.sock`).
    #[arg(long, default_value = "/var/lib/kubelet/plugins")]
    kubelet_plugins_dir: PathBuf,
    /// DRA mode: where the CDI specs of prepared claims go (the container runtime reads it).
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: PathBuf,
    /// DRA mode: the CDI kind of the GPU vendor's own spec, e.g. `nvidia.com/gpu` (from
    /// `nvidia-ctk cdi generate --device-name-strategy=uuid`); each allocated GPU is also named
    /// `<kind>=<uuid>`, so the runtime adds its device nodes and driver libraries. Empty: not named.
    #[arg(long, default_value = "")]
    gpu_cdi_kind: String,
    /// Copy the preload library to this host directory and exit (the DaemonSet's init step).
    #[arg(long, value_name = "DIR")]
    install_lib: Option<PathBuf>,
    /// The library `--install-lib` copies.
    #[arg(long, default_value = "/usr/lib/vgpu/libvgpu.so")]
    lib_source: PathBuf,
    /// kubelet devices advertised per GPU (the most containers sharing one GPU).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    split_count: u32,
    /// Factor on each GPU's memory in the inventory (above 1 oversubscribes).
    #[arg(long, default_value_t = 1.0)]
    memory_scaling: f64,
    /// Factor on each GPU's 100 % of cores in the inventory.
    #[arg(long, default_value_t = 1.0)]
    core_scaling: f64,
    /// The kubelet's device-plugin directory.
    #[arg(long, default_value = "/var/lib/kubelet/device-plugins")]
    device_plugin_dir: PathBuf,
    /// Our socket's file name in the device-plugin directory.
    #[arg(long, default_value = "vgpu-nvidia.sock")]
    socket_name: String,
    /// Host directory with libvgpu.so, ld.so.preload and per-container accounting directories
    /// (mounted at the same path in this container).
    #[arg(long, default_value = "/usr/local/vgpu")]
    host_dir: PathBuf,
    /// Where GPUs come from.
    #[arg(long, value_enum, default_value_t = Backend::Nvidia)]
    backend: Backend,
    /// NVML library to load (default: the system's libnvidia-ml.so.1).
    #[arg(long)]
    nvml_lib: Option<String>,
    /// sysfs root for the DCU backend.
    #[arg(long, default_value = "/sys")]
    sysfs_root: PathBuf,
    /// Extended resource to register.
    #[arg(long, default_value = "nvidia.com/gpu")]
    resource_name: String,
    /// The kubelet's PodResources socket, asked which pod it is admitting when several pending
    /// pods could be the one (empty: never asked, the oldest is answered).
    #[arg(long, default_value = vgpu_device_plugin::admitting::DEFAULT_SOCKET)]
    pod_resources_socket: String,
    /// The per-GPU memory resource (MiB), advertised in the Node's capacity.
    #[arg(long, default_value = "nvidia.com/gpumem")]
    resource_mem: String,
    /// The per-GPU memory percentage resource, advertised in the Node's capacity.
    #[arg(long, default_value = "nvidia.com/gpumem-percentage")]
    resource_mem_percentage: String,
    /// The per-GPU cores resource (percent), advertised in the Node's capacity.
    #[arg(long, default_value = "nvidia.com/gpucores")]
    resource_cores: String,
    /// Address of the /metrics listener.
    #[arg(long, default_value = "0.0.0.0:9394")]
    metrics_listen: std::net::SocketAddr,
    /// Answer Allocate for pods without an assignment with whole devices and no limits.
    #[arg(long)]
    allow_unscheduled: bool,
    /// When the core limit applies to containers that do not set GPU_CORE_UTILIZATION_POLICY
    /// (HAMi's gpuCorePolicy): force (always), default (only while another container uses the
    /// GPU), disable (never).
    #[arg(long, default_value = "force", value_parser = parse_core_policy)]
    gpu_core_policy: vgpu_core::env::CorePolicy,
    /// Namespaces whose pods may lift a limit with CUDA_DISABLE_CONTROL=true or their own
    /// GPU_CORE_UTILIZATION_POLICY other than force (comma list; the validating webhook's
    /// policy.disableControlNamespaces should say the same).
    #[arg(long, value_delimiter = ',')]
    disable_control_namespaces: Vec<String>,
    /// This node's name.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Seconds between node heartbeats.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    heartbeat_seconds: u64,
    /// Quiet seconds (no critical XID, failure event or failed probe) after which an unhealthy
    /// device that answers a probe turns healthy again.
    #[arg(long, default_value_t = 300)]
    xid_recovery_seconds: u64,
    /// Seconds between health probes of every device (NVML: a handle by UUID and a memory query).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    health_probe_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let shutdown = vgpu_serve::shutdown_signal().context("installing the SIGTERM handler")?;
    let cli = Cli::parse();
    let _log_guard = vgpu_serve::logging::init(vgpu_serve::logging::LogFormat::Text);
    if let Some(dir) = &cli.install_lib {
        return install_lib(&cli.lib_source, dir);
    }
    for (name, v) in [
        ("--memory-scaling", cli.memory_scaling),
        ("--core-scaling", cli.core_scaling),
    ] {
        anyhow::ensure!(
            v.is_finite() && v > 0.0,
            "{name} must be a positive number, got {v}"
        );
    }
    let node_name = cli
        .node_name
        .clone()
        .context("--node-name or NODE_NAME is required")?;
    let _ = rustls::crypto::ring::default_provider().install_default();

    let backend: Arc<dyn DeviceBackend> = match cli.backend {
        Backend::Nvidia => Arc::new(NvidiaBackend::load(cli.nvml_lib.as_deref())?),
        Backend::Dcu => Arc::new(DcuBackend::new(&cli.sysfs_root)),
    };
    let gpus = backend.devices().context("discovering devices")?;
    tracing::info!(
        count = gpus.len(),
        vendor = backend.vendor(),
        "devices found"
    );
    std::fs::create_dir_all(&cli.host_dir)
        .with_context(|| format!("creating {}", cli.host_dir.display()))?;
    let preload = cli.host_dir.join(PRELOAD_NAME);
    std::fs::write(&preload, preload_contents())
        .with_context(|| format!("writing {}", preload.display()))?;

    let client = kube::Client::try_default()
        .await
        .context("connecting to the API server")?;
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::all(client.clone());
    let settings = Settings {
        node_name: node_name.clone(),
        shape: Shape {
            split: cli.split_count,
            memory_scaling: cli.memory_scaling,
            core_scaling: cli.core_scaling,
        },
        host_dir: cli.host_dir.clone(),
        allow_unscheduled: cli.allow_unscheduled,
        core_policy: cli.gpu_core_policy,
        disable_control_namespaces: cli.disable_control_namespaces.clone(),
        pod_resources: (!cli.pod_resources_socket.is_empty()).then(|| {
            vgpu_device_plugin::admitting::Lister {
                socket: PathBuf::from(&cli.pod_resources_socket),
                resource: cli.resource_name.clone(),
            }
        }),
    };
    let slice_resources = vgpu_device_plugin::inventory::SliceResources {
        memory: cli.resource_mem.clone(),
        memory_percentage: cli.resource_mem_percentage.clone(),
        cores: cli.resource_cores.clone(),
    };
    let shared = Shared::new(
        settings,
        DeviceState::new(gpus, backend.vendor()),
        Some(pods.clone()),
    );

    tokio::spawn(vgpu_device_plugin::health::run(
        shared.clone(),
        backend.clone(),
        vgpu_device_plugin::health::HealthSettings {
            quiet: Duration::from_secs(cli.xid_recovery_seconds),
            probe_every: Duration::from_secs(cli.health_probe_seconds),
        },
    ));
    if cli.mode == Mode::DevicePlugin {
        tokio::spawn(vgpu_device_plugin::watch::run(shared.clone(), pods));
        // The inventory tells vgpu-scheduler where device-plugin pods may go: a DRA node
        // publishes a ResourceSlice instead, and no inventory.
        tokio::spawn(vgpu_device_plugin::inventory::run(
            shared.clone(),
            kube::Api::all(client.clone()),
            Duration::from_secs(cli.heartbeat_seconds),
            slice_resources.clone(),
        ));
    }
    let listener = tokio::net::TcpListener::bind(cli.metrics_listen)
        .await
        .with_context(|| format!("binding {}", cli.metrics_listen))?;
    tracing::info!(addr = %listener.local_addr()?, "metrics listening");
    let router = vgpu_device_plugin::metrics::router(shared.clone(), Some(backend.clone()));
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });

    if cli.mode == Mode::Dra {
        let (registered, on_registered) = tokio::sync::watch::channel(false);
        tokio::spawn(dra::slices::run(
            shared.clone(),
            client.clone(),
            backend.driver_version(),
            on_registered,
        ));
        let plugin = dra::prepare::Dra::new(
            shared,
            Some(client),
            dra::prepare::DraSettings {
                cdi_dir: cli.cdi_dir,
                gpu_cdi_kind: (!cli.gpu_cdi_kind.is_empty()).then_some(cli.gpu_cdi_kind),
            },
        );
        dra::registration::serve(
            plugin,
            dra::registration::Sockets {
                registry_dir: cli.kubelet_registry_dir,
                plugins_dir: cli.kubelet_plugins_dir,
            },
            registered,
            async {
                shutdown.await;
                tracing::info!("shutting down");
            },
        )
        .await
        .context("serving the DRA plugin")?;
        tracing::info!("stopped");
        return Ok(());
    }
    let node_name = shared.settings.node_name.clone();
    vgpu_device_plugin::kubelet::serve(
        shared,
        PluginEndpoint {
            dir: cli.device_plugin_dir,
            socket: cli.socket_name,
            resource: cli.resource_name,
        },
        async {
            shutdown.await;
            tracing::info!("shutting down");
        },
    )
    .await?;
    // The Node keeps no capacity for a plugin that left (DRA mode, uninstall).
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client);
    if let Err(e) =
        vgpu_device_plugin::inventory::withdraw(&nodes, &node_name, &slice_resources).await
    {
        tracing::warn!(error = %e, "removing the slice resources from the Node's capacity failed");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Copies the library atomically (write beside, then rename), so a container starting meanwhile
/// never maps a half-written file.
fn install_lib(source: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let target = dir.join(LIB_NAME);
    let tmp = dir.join(format!(".{LIB_NAME}.tmp"));
    std::fs::copy(source, &tmp)
        .with_context(|| format!("copying {} to {}", source.display(), tmp.display()))?;
    std::fs::rename(&tmp, &target).with_context(|| format!("renaming to {}", target.display()))?;
    std::fs::write(dir.join(PRELOAD_NAME), preload_contents())
        .with_context(|| format!("writing {}", dir.join(PRELOAD_NAME).display()))?;
    tracing::info!(target = %target.display(), "library installed");
    Ok(())
}

fn parse_core_policy(s: &str) -> Result<vgpu_core::env::CorePolicy, String> {
    vgpu_core::env::CorePolicy::parse(s).map_err(|e| e.to_string())
}
