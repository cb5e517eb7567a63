//! Command-line flags (each also readable from the environment). The Helm chart passes
//! `--listen`, `--metrics-listen`, `--scheduler-name`, `--node-policy` and `--gpu-policy`; the API
//! client comes from `--kubeconfig`, `KUBECONFIG`, `~/.kube/config` or the in-cluster service account.

use clap::{Parser, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use vgpu_core::placement::Policy;

use crate::server::Settings;

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

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
    /// Node policy for pods without `hami.io/node-scheduler-policy`: binpack or spread.
    #[arg(long, env = "VGPU_SCHEDULER_NODE_POLICY", default_value = "binpack")]
    pub node_policy: Policy,
    /// GPU policy for pods without `hami.io/gpu-scheduler-policy`: binpack or spread.
    #[arg(long, env = "VGPU_SCHEDULER_GPU_POLICY", default_value = "spread")]
    pub gpu_policy: Policy,
    /// Leave out nodes whose device-plugin heartbeat is older than this many seconds.
    #[arg(long, env = "VGPU_SCHEDULER_HEARTBEAT_TIMEOUT", default_value_t = 120)]
    pub heartbeat_timeout_seconds: u64,
    /// Forget a bound pod not seen back from the API within this many seconds.
    #[arg(long, env = "VGPU_SCHEDULER_ASSUME_TTL", default_value_t = 300)]
    pub assume_ttl_seconds: u64,
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
    /// The decision settings.
    pub fn settings(&self) -> Settings {
        Settings {
            node_policy: self.node_policy,
            gpu_policy: self.gpu_policy,
            heartbeat_timeout: Duration::from_secs(self.heartbeat_timeout_seconds),
            assume_ttl: Duration::from_secs(self.assume_ttl_seconds),
            scheduler_name: self.scheduler_name.clone(),
            ..Settings::default()
        }
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
        ])
        .unwrap();
        assert_eq!(cli.metrics_listen.port(), 9395);
        let s = cli.settings();
        assert_eq!(
            (s.node_policy, s.gpu_policy),
            (Policy::Binpack, Policy::Spread)
        );
        let e = Cli::try_parse_from(["vgpu-scheduler", "--node-policy=fgd"]).unwrap_err();
        assert!(
            e.to_string().contains("is not one of binpack, spread"),
            "{e}"
        );
    }
}
