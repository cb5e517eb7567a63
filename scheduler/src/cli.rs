//! Command-line flags (each also readable from the environment). The Helm chart passes
//! `--listen`, `--metrics-listen`, `--scheduler-name`, `--node-policy` and `--gpu-policy`; the API
//! client comes from `--kubeconfig`, `KUBECONFIG`, `~/.kube/config` or the in-cluster service account.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use vgpu_core::placement::Policy;
use vgpu_core::request::RequestPolicy;
use vgpu_core::resources::ResourceNames;
use vgpu_serve::parse_duration;
use vgpu_serve::tls::ClientAuth;
use vgpu_serve::Limits;

use crate::server::Settings;

pub use vgpu_serve::logging::LogFormat;

/// vgpu-scheduler: kube-scheduler extender that places vGPU pods on physical GPUs.
#[derive(Debug, Clone, Parser)]
#[command(name = "vgpu-scheduler", version, about)]
pub struct Cli {
    /// Address of the extender API (filter, prioritize, bind); kube-scheduler runs beside it.
    #[arg(long, env = "VGPU_SCHEDULER_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(
        long,
        env = "VGPU_SCHEDULER_METRICS_LISTEN",
        default_value = "0.0.0.0:9395"
    )]
    pub metrics_listen: SocketAddr,
    /// The kube-scheduler profile this extender serves.
    #[arg(long, env = "VGPU_SCHEDULER_NAME", default_value = "vgpu-scheduler")]
    pub scheduler_name: String,
    /// Node policy for pods without `hami.io/node-scheduler-policy`: binpack, spread,
    /// fragmentation or gap-aware.
    #[arg(long, env = "VGPU_SCHEDULER_NODE_POLICY", default_value = "binpack")]
    pub node_policy: Policy,
    /// GPU policy for pods without `hami.io/gpu-scheduler-policy`: binpack, spread,
    /// fragmentation or gap-aware.
    #[arg(long, env = "VGPU_SCHEDULER_GPU_POLICY", default_value = "spread")]
    pub gpu_policy: Policy,
    /// JSON list of typical pod shapes (`[{"gpus": 1, "percent": 50, "count": 80}, ...]`) for the
    /// fragmentation and gap-aware policies; without it the table is built from the placed vGPU
    /// pods.
    #[arg(long, env = "VGPU_SCHEDULER_TYPICAL_PODS")]
    pub typical_pods: Option<PathBuf>,
    /// Filter passes only the best node for a vGPU pod (highest score of its node policy, then
    /// the smallest name), so the policy decides where the pod goes, as in HAMi. `false`: pass
    /// every node that fits and let kube-scheduler choose by its own scores (random on ties).
    #[arg(long, env = "VGPU_SCHEDULER_CHOOSE_NODE", default_value_t = true, action = clap::ArgAction::Set)]
    pub choose_node: bool,
    /// Leave out nodes whose device-plugin heartbeat is older than this many seconds.
    #[arg(long, env = "VGPU_SCHEDULER_HEARTBEAT_TIMEOUT", default_value_t = 120)]
    pub heartbeat_timeout_seconds: u64,
    /// Forget a bound pod not seen back from the API within this many seconds.
    #[arg(long, env = "VGPU_SCHEDULER_ASSUME_TTL", default_value_t = 300)]
    pub assume_ttl_seconds: u64,
    /// PEM certificate chain: serve the extender API over HTTPS (reloaded when the file changes).
    /// Without it the extender API is plain HTTP, for a kube-scheduler in the same pod.
    #[arg(long, env = "VGPU_SCHEDULER_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `--tls-cert`.
    #[arg(long, env = "VGPU_SCHEDULER_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM file of the CA(s) whose client certificates may call the extender API (needs
    /// `--tls-cert`): every client must present a certificate that chains to it.
    #[arg(long, env = "VGPU_SCHEDULER_CLIENT_CA", requires = "tls_cert")]
    pub client_ca: Option<PathBuf>,
    /// A TLS handshake, or a request head from its first byte, must arrive within this
    /// (`10s`, `500ms`, `2m`); else the connection is closed. Both listeners.
    #[arg(long, env = "VGPU_SCHEDULER_HEADER_READ_TIMEOUT", default_value = "10s",
        value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// A request body must arrive whole within this; else 408 and the connection is closed.
    #[arg(long, env = "VGPU_SCHEDULER_BODY_READ_TIMEOUT", default_value = "30s",
        value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// A keep-alive connection with no request for this long is closed.
    #[arg(long, env = "VGPU_SCHEDULER_IDLE_TIMEOUT", default_value = "90s",
        value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// Resource name of the vGPU count (the webhook's `resourceNames.gpu`).
    #[arg(
        long,
        env = "VGPU_SCHEDULER_RESOURCE_GPU",
        default_value = "nvidia.com/gpu"
    )]
    pub resource_gpu: String,
    /// Resource name of the memory per vGPU in MiB (`resourceNames.gpumem`).
    #[arg(
        long,
        env = "VGPU_SCHEDULER_RESOURCE_GPUMEM",
        default_value = "nvidia.com/gpumem"
    )]
    pub resource_gpumem: String,
    /// Resource name of the memory per vGPU as a percentage of the card (`resourceNames.gpumemPercentage`).
    #[arg(
        long,
        env = "VGPU_SCHEDULER_RESOURCE_GPUMEM_PERCENTAGE",
        default_value = "nvidia.com/gpumem-percentage"
    )]
    pub resource_gpumem_percentage: String,
    /// Resource name of the share of the card's SMs (`resourceNames.gpucores`).
    #[arg(
        long,
        env = "VGPU_SCHEDULER_RESOURCE_GPUCORES",
        default_value = "nvidia.com/gpucores"
    )]
    pub resource_gpucores: String,
    /// DRA mode (docs/dra.md): score the nodes for pods with claims of class gpu.vgpu.io
    /// (`/dra/prioritize`), and explain in an Event why a pod's claim cannot be allocated when it
    /// is the GPUs' free capacity; needs read access to ResourceSlices and ResourceClaims (the
    /// chart grants it with dra.enabled).
    #[arg(long, env = "VGPU_SCHEDULER_DRA")]
    pub dra: bool,
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config, then in-cluster).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Log format.
    #[arg(
        long,
        env = "VGPU_SCHEDULER_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

impl Cli {
    /// The decision settings (reading `--typical-pods`).
    pub fn settings(&self) -> Result<Settings, crate::typical::TypicalError> {
        Ok(Settings {
            node_policy: self.node_policy,
            gpu_policy: self.gpu_policy,
            heartbeat_timeout: Duration::from_secs(self.heartbeat_timeout_seconds),
            assume_ttl: Duration::from_secs(self.assume_ttl_seconds),
            scheduler_name: self.scheduler_name.clone(),
            request_policy: RequestPolicy {
                names: ResourceNames {
                    gpu: self.resource_gpu.clone(),
                    gpumem: self.resource_gpumem.clone(),
                    gpumem_percentage: self.resource_gpumem_percentage.clone(),
                    gpucores: self.resource_gpucores.clone(),
                },
                ..RequestPolicy::default()
            },
            typical_pods: match &self.typical_pods {
                Some(p) => Some(crate::typical::load(p)?),
                None => None,
            },
            choose_node: self.choose_node,
        })
    }
}

/// The extender API's TLS files, when it serves HTTPS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    /// Certificate chain.
    pub cert: PathBuf,
    /// Key.
    pub key: PathBuf,
    /// Client certificates asked for.
    pub client_auth: ClientAuth,
}

/// Largest body on the metrics listener, which serves only GETs.
pub const METRICS_MAX_BODY: usize = 64 * 1024;

impl Cli {
    /// TLS for the extender API, if `--tls-cert` and `--tls-key` were given.
    pub fn tls(&self) -> Option<Tls> {
        let (cert, key) = (self.tls_cert.clone()?, self.tls_key.clone()?);
        Some(Tls {
            cert,
            key,
            client_auth: match &self.client_ca {
                Some(ca) => ClientAuth::Required(ca.clone()),
                None => ClientAuth::None,
            },
        })
    }

    /// Connection limits: the extender API's, and the metrics listener's (same timeouts, a small
    /// body limit).
    pub fn limits(&self) -> (Limits, Limits) {
        let api = Limits {
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            idle_timeout: self.idle_timeout,
            max_body: crate::server::MAX_BODY,
            ..Limits::default()
        };
        let metrics = Limits {
            max_body: METRICS_MAX_BODY,
            ..api.clone()
        };
        (api, metrics)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// The arguments helm/vgpu/templates/scheduler.yaml writes, with the chart's defaults.
    #[test]
    fn accepts_the_charts_arguments() {
        let cli = Cli::try_parse_from([
            "vgpu-scheduler",
            "--listen=127.0.0.1:8080",
            "--metrics-listen=0.0.0.0:9395",
            "--scheduler-name=vgpu-scheduler",
            "--node-policy=binpack",
            "--gpu-policy=spread",
            "--choose-node=true",
        ])
        .unwrap();
        assert_eq!(cli.metrics_listen.port(), 9395);
        let s = cli.settings().unwrap();
        assert_eq!(
            (s.node_policy, s.gpu_policy),
            (Policy::Binpack, Policy::Spread)
        );
        assert_eq!(s.request_policy, RequestPolicy::default());
        assert!(s.choose_node);
        assert_eq!(cli.tls(), None);
        let (api, metrics) = cli.limits();
        assert_eq!(api.header_read_timeout, Duration::from_secs(10));
        assert_eq!(api.idle_timeout, Duration::from_secs(90));
        assert_eq!((api.max_body, metrics.max_body), (64 << 20, 64 * 1024));
        let off = Cli::try_parse_from(["vgpu-scheduler", "--choose-node=false"]).unwrap();
        assert!(!off.settings().unwrap().choose_node);
        let e = Cli::try_parse_from(["vgpu-scheduler", "--node-policy=fgd"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("is not one of binpack, spread, fragmentation"),
            "{e}"
        );
    }

    /// Renamed resources (the chart passes its resourceName values) reach the request parser.
    #[test]
    fn renamed_resources_reach_the_request_policy() {
        let cli = Cli::try_parse_from([
            "vgpu-scheduler",
            "--resource-gpu=example.com/vgpu",
            "--resource-gpumem=example.com/vgpu-memory",
            "--resource-gpumem-percentage=example.com/vgpu-memory-percentage",
            "--resource-gpucores=example.com/vgpu-cores",
        ])
        .unwrap();
        let names = cli.settings().unwrap().request_policy.names;
        assert_eq!(
            names,
            ResourceNames {
                gpu: "example.com/vgpu".into(),
                gpumem: "example.com/vgpu-memory".into(),
                gpumem_percentage: "example.com/vgpu-memory-percentage".into(),
                gpucores: "example.com/vgpu-cores".into(),
            }
        );
    }
}
