//! Command-line flags (each also readable from the environment), parsed low, then raised into the
//! settings the server runs with.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use vgpu_serve::parse_duration;
use vgpu_serve::tls::ClientAuth;
use vgpu_serve::Limits;

use crate::config::{ConfigError, ConfigFile};
use crate::mutate::MutateSettings;
use crate::validate::ValidateSettings;

/// Default listen address in a cluster.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:8443";
/// Listen address with `--dev`.
pub const DEV_LISTEN: &str = "127.0.0.1:8443";

pub use vgpu_serve::logging::LogFormat;

/// vgpu-webhook: the admission webhook that rewrites vGPU pods.
#[derive(Debug, Clone, Parser)]
#[command(name = "vgpu-webhook", version, about)]
pub struct Cli {
    /// Address to serve HTTPS on [default: 0.0.0.0:8443, or 127.0.0.1:8443 with --dev].
    #[arg(long, env = "VGPU_WEBHOOK_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// PEM certificate chain to serve.
    #[arg(
        long,
        env = "VGPU_WEBHOOK_TLS_CERT",
        required_unless_present = "dev",
        requires = "tls_key"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the certificate.
    #[arg(
        long,
        env = "VGPU_WEBHOOK_TLS_KEY",
        required_unless_present = "dev",
        requires = "tls_cert"
    )]
    pub tls_key: Option<PathBuf>,
    /// Scheduler name to give vGPU pods (the kube-scheduler profile running the vgpu extender).
    #[arg(
        long,
        env = "VGPU_WEBHOOK_SCHEDULER_NAME",
        default_value = "vgpu-scheduler"
    )]
    pub scheduler_name: String,
    /// RuntimeClass of the vGPU runtime, set on vGPU pods that name none.
    #[arg(long, env = "VGPU_WEBHOOK_RUNTIME_CLASS")]
    pub runtime_class: Option<String>,
    /// YAML file with resource names and defaults.
    #[arg(long, env = "VGPU_WEBHOOK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Local trial mode: a throwaway self-signed certificate on 127.0.0.1:8443, no cluster needed.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub dev: bool,
    /// Kubeconfig for the API server (quota, Events). Without it: in-cluster config when
    /// KUBERNETES_SERVICE_HOST is set, else $KUBECONFIG, else no API access (quota not enforced).
    #[arg(long, env = "VGPU_WEBHOOK_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the quota reservation ConfigMaps: the webhook's own.
    #[arg(long, env = "POD_NAMESPACE", default_value = "vgpu-system")]
    pub namespace: String,
    /// Seconds a quota reservation counts while its pod has not been seen (keep it above 30: the
    /// longest another validating webhook may hold the pod's creation).
    #[arg(long, env = "VGPU_WEBHOOK_RESERVATION_TTL", default_value_t = 60,
        value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub reservation_ttl: u64,
    /// PEM file of the CA(s) whose client certificates may connect: when set, every client must
    /// present a certificate that chains to it (the API server presents one through its admission
    /// kubeconfig); without it no client certificate is asked for.
    #[arg(long, env = "VGPU_WEBHOOK_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Also serve /healthz, /readyz and /metrics (only those) over plain HTTP here, for probes and
    /// scrapers that cannot present a client certificate when `--client-ca` is set.
    #[arg(long, env = "VGPU_WEBHOOK_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// A TLS handshake, or a request head from its first byte, must arrive within this
    /// (`10s`, `500ms`, `2m`); else the connection is closed.
    #[arg(long, env = "VGPU_WEBHOOK_HEADER_READ_TIMEOUT", default_value = "10s",
        value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// A request body must arrive whole within this; else 408 and the connection is closed.
    #[arg(long, env = "VGPU_WEBHOOK_BODY_READ_TIMEOUT", default_value = "30s",
        value_parser = parse_duration)]
    pub body_read_timeout: Duration,
    /// A keep-alive connection with no request for this long is closed.
    #[arg(long, env = "VGPU_WEBHOOK_IDLE_TIMEOUT", default_value = "90s",
        value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// At SIGTERM, go on serving this long (HTTP/1.1 answers then close their connections) before
    /// stopping: the API server keeps pooled connections to a terminating replica, and a
    /// connection closed under its next request fails that admission. `0s` stops at once.
    #[arg(long, env = "VGPU_WEBHOOK_SHUTDOWN_DELAY", default_value = "5s",
        value_parser = parse_duration)]
    pub shutdown_delay: Duration,
    /// DRA mode (docs/dra.md): serve `/mutate-dra`, which turns pods written for HAMi into DRA
    /// pods of class `gpu.vgpu.io`, and count those claims against the gpumem quota.
    #[arg(long, env = "VGPU_WEBHOOK_DRA")]
    pub dra: bool,
    /// DRA mode: a ResourceClaimTemplate the webhook made is deleted once no pod names it and no
    /// admission used it for this long.
    #[arg(long, env = "VGPU_WEBHOOK_DRA_TEMPLATE_IDLE", default_value = "10m",
        value_parser = parse_duration)]
    pub dra_template_idle: Duration,
    /// Log format.
    #[arg(
        long,
        env = "VGPU_WEBHOOK_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    pub log_format: LogFormat,
}

/// Where the certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Key.
        key: PathBuf,
    },
    /// Generated at start (`--dev`).
    SelfSigned,
}

/// Settings raised from the flags and the config file.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Listen address.
    pub listen: SocketAddr,
    /// Certificate.
    pub cert: CertSource,
    /// Mutation settings.
    pub mutate: MutateSettings,
    /// Validation settings.
    pub validate: ValidateSettings,
    /// Explicit kubeconfig, if any.
    pub kubeconfig: Option<PathBuf>,
    /// Whether `--dev` was given.
    pub dev: bool,
    /// Client certificates asked for.
    pub client_auth: ClientAuth,
    /// Plain-HTTP health and metrics listener, if any.
    pub health_listen: Option<SocketAddr>,
    /// Timeouts and the body limit of every connection.
    pub limits: Limits,
    /// DRA mode's template idle time; `None` when DRA mode is off.
    pub dra_template_idle: Option<Duration>,
}

impl Cli {
    /// Raises flags into settings, reading the config file.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let file = match &self.config {
            Some(p) => ConfigFile::load(p)?,
            None => ConfigFile::default(),
        };
        let default_listen = if self.dev { DEV_LISTEN } else { DEFAULT_LISTEN };
        let listen = self.listen.unwrap_or_else(|| {
            default_listen
                .parse()
                .unwrap_or(SocketAddr::from(([127, 0, 0, 1], 8443)))
        });
        let cert = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => CertSource::Files {
                cert: cert.clone(),
                key: key.clone(),
            },
            _ => CertSource::SelfSigned,
        };
        Ok(Settings {
            listen,
            cert,
            validate: ValidateSettings {
                policy: file.request_policy(),
                rules: file.policy.clone(),
                reservation_ttl: std::time::Duration::from_secs(self.reservation_ttl),
                ledger_namespace: self.namespace.clone(),
                dra: self.dra,
            },
            dra_template_idle: self.dra.then_some(self.dra_template_idle),
            kubeconfig: self.kubeconfig.clone(),
            mutate: MutateSettings {
                policy: file.request_policy(),
                scheduler_name: self.scheduler_name.clone(),
                runtime_class: self.runtime_class.clone().filter(|s| !s.is_empty()),
            },
            dev: self.dev,
            health_listen: self.health_listen,
            client_auth: match &self.client_ca {
                Some(ca) => ClientAuth::Required(ca.clone()),
                None => ClientAuth::None,
            },
            limits: Limits {
                header_read_timeout: self.header_read_timeout,
                body_read_timeout: self.body_read_timeout,
                idle_timeout: self.idle_timeout,
                max_body: crate::server::MAX_BODY_BYTES,
                shutdown_delay: self.shutdown_delay,
                ..Limits::default()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_needs_no_certificate_and_listens_locally() {
        let cli = Cli::try_parse_from(["vgpu-webhook", "--dev"]).unwrap();
        let s = cli.settings().unwrap();
        assert_eq!(s.listen.to_string(), DEV_LISTEN);
        assert_eq!(s.cert, CertSource::SelfSigned);
        assert_eq!(s.mutate.scheduler_name, "vgpu-scheduler");
    }

    #[test]
    fn production_needs_both_files() {
        assert!(Cli::try_parse_from(["vgpu-webhook"]).is_err());
        assert!(Cli::try_parse_from(["vgpu-webhook", "--tls-cert", "c"]).is_err());
        assert!(Cli::try_parse_from([
            "vgpu-webhook",
            "--dev",
            "--tls-cert",
            "c",
            "--tls-key",
            "k"
        ])
        .is_err());
        let cli = Cli::try_parse_from([
            "vgpu-webhook",
            "--tls-cert",
            "c",
            "--tls-key",
            "k",
            "--runtime-class",
            "nvidia",
            "--scheduler-name",
            "s",
        ])
        .unwrap();
        let s = cli.settings().unwrap();
        assert_eq!(s.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(
            s.cert,
            CertSource::Files {
                cert: "c".into(),
                key: "k".into()
            }
        );
        assert_eq!(s.mutate.runtime_class.as_deref(), Some("nvidia"));
        assert_eq!(s.mutate.scheduler_name, "s");
        assert_eq!(s.client_auth, ClientAuth::None);
        assert_eq!(s.limits.header_read_timeout, Duration::from_secs(10));
        assert_eq!(s.limits.body_read_timeout, Duration::from_secs(30));
        assert_eq!(s.limits.idle_timeout, Duration::from_secs(90));
        assert_eq!(s.limits.max_body, 3 << 20);
    }

    #[test]
    fn hostile_client_flags() {
        let cli = Cli::try_parse_from([
            "vgpu-webhook",
            "--dev",
            "--client-ca",
            "ca.crt",
            "--header-read-timeout",
            "500ms",
            "--body-read-timeout",
            "2s",
            "--idle-timeout",
            "1m",
            "--health-listen",
            "0.0.0.0:8081",
        ])
        .unwrap();
        let s = cli.settings().unwrap();
        assert_eq!(s.client_auth, ClientAuth::Required("ca.crt".into()));
        assert_eq!(s.limits.header_read_timeout, Duration::from_millis(500));
        assert_eq!(s.limits.body_read_timeout, Duration::from_secs(2));
        assert_eq!(s.limits.idle_timeout, Duration::from_secs(60));
        assert_eq!(s.health_listen.map(|a| a.port()), Some(8081));
        let e = Cli::try_parse_from(["vgpu-webhook", "--dev", "--idle-timeout", "0s"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not a duration"), "{e}");
    }

    #[test]
    fn config_file_errors_surface() {
        let cli = Cli::try_parse_from(["vgpu-webhook", "--dev", "--config", "/nonexistent.yaml"])
            .unwrap();
        assert!(cli
            .settings()
            .unwrap_err()
            .to_string()
            .contains("/nonexistent.yaml"));
    }
}
