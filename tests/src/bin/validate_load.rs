//! Scale check of `/validate`: the fake API server loaded like a large cluster (150 000 pods of
//! which 20 000 use vGPU, 2 000 namespaces with a gpumem quota), the real `vgpu-webhook` binary
//! connected to it through a kubeconfig. Prints the time to become ready, the webhook's resident
//! memory, and validate latency percentiles over one keep-alive TLS connection, next to `/healthz`
//! on the same connection as the baseline measured in the same run.
//!
//! ```text
//! cargo build --release --workspace --bins
//! target/release/vgpu-validate-load --requests 2000
//! ```
//!
//! With `--duration SECS` it is a soak instead (see docs/soak.md): steady `/mutate` + `/validate`
//! load on a few keep-alive connections while pods come and go in the API, sampling the webhook
//! process's resident memory (`/proc/PID/status` VmRSS) and open descriptors (`/proc/PID/fd`)
//! every `--sample-seconds`; it exits non-zero when any request failed or was answered wrongly,
//! when RSS in the last minute grew more than `--rss-tolerance` over the first minute after
//! warm-up, or when the descriptor count grew.
//!
//! ```text
//! target/release/vgpu-validate-load --pods 5000 --vgpu-pods 1000 --namespaces 200 --duration 600
//! ```

use anyhow::Context;
use clap::Parser;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::certs::TestPki;
use vgpu_tests::https;

#[path = "validate_load/soak.rs"]
mod soak;

#[derive(Parser, Debug)]
#[command(about = "Scale and latency check of vgpu-webhook /validate against the fake API server")]
struct Args {
    /// Pods in the cluster.
    #[arg(long, default_value_t = 150_000)]
    pods: usize,
    /// Of which use vGPU (carry the webhook's label).
    #[arg(long, default_value_t = 20_000)]
    vgpu_pods: usize,
    /// Namespaces, each with a gpumem quota.
    #[arg(long, default_value_t = 2_000)]
    namespaces: usize,
    /// Measured requests per kind.
    #[arg(long, default_value_t = 2_000)]
    requests: usize,
    /// Soak for this many seconds instead of measuring latency.
    #[arg(long)]
    duration: Option<u64>,
    /// Soak: seconds at the start not compared (caches fill, reservations reach their TTL).
    #[arg(long, default_value_t = 90)]
    warmup: u64,
    /// Soak: length of the first and last windows compared, seconds.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Soak: seconds between samples of RSS and descriptors.
    #[arg(long, default_value_t = 5)]
    sample_seconds: u64,
    /// Soak: concurrent keep-alive connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Soak: most RSS growth allowed, last window's mean over the first window's mean.
    #[arg(long, default_value_t = 0.10)]
    rss_tolerance: f64,
    /// Soak: most open descriptors allowed beyond the first window's maximum.
    #[arg(long, default_value_t = 2)]
    fd_slack: usize,
}

pub(crate) fn pod(ns: &str, name: &str, vgpu: bool) -> Value {
    let (labels, limits) = if vgpu {
        (
            json!({"app": "train", "vgpu.io/managed": "true"}),
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "cpu": "4", "memory": "16Gi"}),
        )
    } else {
        (json!({"app": "web"}), json!({"cpu": "1", "memory": "1Gi"}))
    };
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x".repeat(400)}},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", "image": "registry.invalid/app:1",
            "resources": {"limits": limits, "requests": limits}}]},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})
}

/// The CREATE review of `pod` as the API server sends it: before any node or status.
pub(crate) fn review(pod: &Value, uid: &str) -> Vec<u8> {
    let mut pod = pod.clone();
    if let Some(spec) = pod["spec"].as_object_mut() {
        spec.remove("nodeName");
    }
    if let Some(p) = pod.as_object_mut() {
        p.remove("status");
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": pod["metadata"]["namespace"], "operation": "CREATE", "object": pod}})
    .to_string()
    .into_bytes()
}

pub(crate) fn rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn percentiles(mut v: Vec<Duration>) -> (f64, f64, f64) {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q) as usize).min(v.len() - 1)].as_secs_f64() * 1e6;
    (at(0.5), at(0.99), at(0.999))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api = FakeApiServer::start().await.context("fake API server")?;
    let load = Instant::now();
    for i in 0..args.namespaces {
        api.create(json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpu-quota", "namespace": format!("team-{i}")},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "100000000", "cpu": "1000"}}}))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    for i in 0..args.pods {
        let ns = format!("team-{}", i % args.namespaces);
        api.create(pod(&ns, &format!("p{i}"), i < args.vgpu_pods))
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    }
    println!(
        "loaded {} pods ({} vGPU), {} quotas in {:.1} s",
        args.pods,
        args.vgpu_pods,
        args.namespaces,
        load.elapsed().as_secs_f64()
    );
    let dir = tempfile::tempdir()?;
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    let started = Instant::now();
    let (proc, addr) = vgpu_tests::process::start_webhook(
        &cert,
        &key,
        &["--kubeconfig", kubeconfig.to_str().unwrap_or_default()],
    );
    let tls = Arc::new(pki.client_config());
    let mut conn = https::connect(addr, tls.clone()).await?;
    loop {
        if conn.send("GET", "/readyz", vec![]).await?.status == 200 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(300),
            "not ready after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "webhook ready (caches synced) {:.2} s after start",
        started.elapsed().as_secs_f64()
    );
    println!(
        "webhook RSS after sync: {:.1} MiB",
        rss_mib(proc.pid()).unwrap_or(-1.0)
    );
    if let Some(secs) = args.duration {
        drop(conn);
        return soak::run(&args, secs, &api, proc.pid(), addr, tls).await;
    }

    let mut results = Vec::new();
    for (label, path) in [
        ("baseline GET /healthz", "/healthz"),
        ("validate, quota namespace (ledger write)", "/validate"),
        ("validate, vGPU pod, namespace without quota", "/validate"),
        ("validate, non-vGPU pod", "/validate"),
    ] {
        let mut times = Vec::with_capacity(args.requests);
        for i in 0..(args.requests + args.requests / 10) {
            let body = match label {
                l if l.contains("ledger") => review(
                    &pod(
                        &format!("team-{}", i % args.namespaces),
                        &format!("new-{i}"),
                        true,
                    ),
                    &format!("r{i}"),
                ),
                l if l.contains("without quota") => {
                    review(&pod("no-quota", &format!("n{i}"), true), "u")
                }
                l if l.contains("non-vGPU") => review(&pod("team-1", &format!("w{i}"), false), "u"),
                _ => Vec::new(),
            };
            let method = if path == "/healthz" { "GET" } else { "POST" };
            let t = Instant::now();
            let reply = conn.send(method, path, body).await?;
            let took = t.elapsed();
            anyhow::ensure!(reply.status == 200, "{label}: HTTP {}", reply.status);
            if path == "/validate" {
                let allowed = reply.json()["response"]["allowed"] == true;
                anyhow::ensure!(
                    allowed,
                    "{label}: denied: {}",
                    String::from_utf8_lossy(&reply.body)
                );
            }
            // The first tenth warms up connections and caches.
            if i >= args.requests / 10 {
                times.push(took);
            }
        }
        let (p50, p99, p999) = percentiles(times);
        results.push((label, p50, p99, p999));
    }
    let base = results[0].2;
    println!("\n| request | p50 µs | p99 µs | p99.9 µs | p99 / baseline p99 |");
    println!("|---|---|---|---|---|");
    for (label, p50, p99, p999) in &results {
        println!(
            "| {label} | {p50:.0} | {p99:.0} | {p999:.0} | {:.2} |",
            p99 / base
        );
    }
    println!(
        "\nwebhook RSS at end: {:.1} MiB",
        rss_mib(proc.pid()).unwrap_or(-1.0)
    );
    Ok(())
}
