//! `vgpu-webhook`: parses flags, sets up logging and TLS, and serves until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use std::time::Duration;
use vgpu_serve::tls::{self, ClientAuth};
use vgpu_webhook::cli::{CertSource, Cli};
use vgpu_webhook::dra::{templates, DraMutator};
use vgpu_webhook::metrics::Metrics;
use vgpu_webhook::server::{app, health_app, AppState};
use vgpu_webhook::validate::Validator;

/// mimalloc instead of the C library's allocator: an admission allocates and frees a few hundred
/// small objects (the parsed review, the patch, the response), and glibc's malloc/free were a fifth
/// of the webhook's CPU under load (`perf record`, docs/webhook.md "Benchmarks").
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let shutdown = vgpu_serve::shutdown_signal().context("installing the SIGTERM handler")?;
    let cli = Cli::parse();
    let _log_guard = vgpu_serve::logging::init(cli.log_format);
    // One crypto provider for the whole process (kube's client uses ring too).
    let _ = rustls::crypto::ring::default_provider().install_default();

    let settings = cli.settings()?;
    match vgpu_serve::raise_nofile_limit() {
        Ok(l) => tracing::debug!(before = l.before, now = l.now, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    // The watcher lives as long as main: certificate files are reloaded while we serve.
    let (tls_config, _cert_watcher) = match &settings.cert {
        CertSource::Files { cert, key } => {
            let reloading = tls::reloading_server_config(cert, key, &settings.client_auth)?;
            (reloading.config, Some(reloading.watcher))
        }
        CertSource::SelfSigned => (tls::dev_server_config(&settings.client_auth)?, None),
    };
    let metrics = Arc::new(Metrics::new());
    let client = kube_client(settings.kubeconfig.as_deref()).await?;
    if let (Some(client), Some(idle)) = (&client, settings.dra_template_idle) {
        templates::spawn_sweeper(client.clone(), idle);
    }
    let validator = match client.clone() {
        Some(client) => Validator::connected(settings.validate.clone(), client, metrics.clone()),
        None => {
            tracing::warn!("no Kubernetes API configured (--kubeconfig, in-cluster or $KUBECONFIG): quota is not enforced and no Events are written; policy rules still apply");
            Validator::offline(settings.validate.clone(), metrics.clone())
        }
    };
    let dra = DraMutator::new(
        settings.mutate.policy.clone(),
        settings.mutate.scheduler_name.clone(),
        client,
        validator.cache().clone(),
    );
    let state = Arc::new(
        AppState::with_validator(settings.mutate.clone(), validator, metrics).with_dra(dra),
    );
    let router = app(state.clone());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let health = match settings.health_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("listening on {addr}"))?;
            tracing::info!(addr = %listener.local_addr()?, "health endpoints served (plain HTTP)");
            let limits = vgpu_serve::Limits {
                max_body: 64 * 1024,
                ..settings.limits.clone()
            };
            Some(tokio::spawn(vgpu_serve::serve(
                listener,
                None,
                health_app(state.clone()),
                limits,
                until(stop_rx.clone()),
            )))
        }
        None => None,
    };

    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("listening on {}", settings.listen))?;
    let addr = listener.local_addr()?;
    if let ClientAuth::Required(ca) = &settings.client_auth {
        tracing::info!(client_ca = %ca.display(), "client certificates required");
    }
    tracing::info!(%addr, "listening");
    if settings.dev {
        println!(
            "vgpu-webhook (dev) on https://{addr}; try:\n  curl -sk https://{addr}/mutate -H 'Content-Type: application/json' --data @examples/admission-review.json"
        );
    }
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    vgpu_serve::serve(
        listener,
        Some(tls_config),
        router,
        settings.limits.clone(),
        until(stop_rx),
    )
    .await
    .with_context(|| format!("serving on {addr}"))?;
    if let Some(h) = health {
        h.await?.context("serving health")?;
    }
    Ok(())
}

/// The API client: `--kubeconfig`, else in-cluster, else `$KUBECONFIG`, else none.
async fn kube_client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Option<kube::Client>> {
    let path = match kubeconfig {
        Some(p) => Some(p.to_path_buf()),
        None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
            let config = kube::Config::incluster().context("in-cluster Kubernetes config")?;
            return Ok(Some(admission_client(config)?));
        }
        None => std::env::var_os("KUBECONFIG").map(std::path::PathBuf::from),
    };
    let Some(path) = path else {
        return Ok(None);
    };
    let kc = kube::config::Kubeconfig::read_from(&path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .with_context(|| format!("kubeconfig {}", path.display()))?;
    Ok(Some(admission_client(config)?))
}

/// An admission must answer within the webhook's timeoutSeconds, so the client does not retry
/// 429/503/504 for a minute on its own (kube's default): the decision fails closed instead.
fn admission_client(mut config: kube::Config) -> anyhow::Result<kube::Client> {
    config.default_retry = false;
    config.connect_timeout = Some(Duration::from_secs(2));
    kube::Client::try_from(config).context("Kubernetes client")
}
