//! `vgpu-scheduler`: parses flags, connects to the API server, starts the watches and serves the
//! extender and metrics listeners until SIGTERM or Ctrl-C.

use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use vgpu_scheduler::cli::Cli;
use vgpu_scheduler::server::{extender_app, metrics_app, AppState};
use vgpu_scheduler::watch;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let shutdown = vgpu_serve::shutdown_signal().context("installing the SIGTERM handler")?;
    let cli = Cli::parse();
    let _log_guard = vgpu_serve::logging::init(cli.log_format);
    // One crypto provider for the whole process (kube's client uses ring).
    let _ = rustls::crypto::ring::default_provider().install_default();

    let config = match &cli.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no kubeconfig and not in a cluster")?,
    };
    let client = kube::Client::try_from(config).context("building the API client")?;
    match vgpu_serve::raise_nofile_limit() {
        Ok(l) => tracing::debug!(before = l.before, now = l.now, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    // The watcher lives as long as main: certificate files are reloaded while we serve.
    let (tls_config, _cert_watcher) = match cli.tls() {
        Some(tls) => {
            let r =
                vgpu_serve::tls::reloading_server_config(&tls.cert, &tls.key, &tls.client_auth)?;
            (Some(r.config), Some(r.watcher))
        }
        None => (None, None),
    };
    let settings = cli.settings()?;
    let state = Arc::new(AppState::new(settings, Some(client.clone())));
    tokio::spawn(watch::nodes(client.clone(), state.clone()));
    if cli.dra {
        let stores = vgpu_scheduler::claims::Stores::start(&client);
        let _ = state
            .dra
            .set(vgpu_scheduler::claim_score::DraScorer::new(stores.clone()));
        let instance = std::env::var("POD_NAME").unwrap_or_else(|_| "vgpu-scheduler".into());
        tokio::spawn(vgpu_scheduler::claims::run(
            client.clone(),
            instance,
            stores,
        ));
    }
    tokio::spawn(watch::pods(client, state.clone()));

    let api = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("listening on {}", cli.listen))?;
    let metrics = tokio::net::TcpListener::bind(cli.metrics_listen)
        .await
        .with_context(|| format!("listening on {}", cli.metrics_listen))?;
    tracing::info!(addr = %api.local_addr()?, tls = tls_config.is_some(), scheduler = %cli.scheduler_name,
        node_policy = %cli.node_policy, gpu_policy = %cli.gpu_policy, "extender listening");
    tracing::info!(addr = %metrics.local_addr()?, "metrics listening");

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });
    let until = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let (api_limits, metrics_limits) = cli.limits();
    let serve_api = vgpu_serve::serve(
        api,
        tls_config,
        extender_app(state.clone()),
        api_limits,
        until(stop_rx.clone()),
    );
    let serve_metrics = vgpu_serve::serve(
        metrics,
        None,
        metrics_app(state),
        metrics_limits,
        until(stop_rx),
    );
    let (a, m) = tokio::join!(serve_api, serve_metrics);
    a.context("serving the extender API")?;
    m.context("serving metrics")?;
    Ok(())
}
