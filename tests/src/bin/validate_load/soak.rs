//! The soak: steady `/mutate` + `/validate` load against the real webhook for a fixed time, with
//! pods created and deleted in the API meanwhile (so the pod watch and the caches keep working),
//! and the webhook process's RSS and descriptor count sampled from /proc. Exits with an error
//! when a request failed or got a wrong answer, when RSS grew beyond the tolerance between the
//! first window after warm-up and the last window, or when descriptors grew.

use anyhow::Context;
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::https;

use crate::{pod, review, rss_mib, Args};

/// One sample of the webhook process.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at_s: f64,
    rss_mib: f64,
    fds: usize,
}

fn fd_count(pid: u32) -> Option<usize> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count())
}

#[derive(Default)]
struct Tally {
    requests: AtomicU64,
    errors: AtomicU64,
    reconnects: AtomicU64,
    first_errors: Mutex<Vec<String>>,
}

impl Tally {
    fn error(&self, what: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_errors.lock().unwrap_or_else(|p| p.into_inner());
        if first.len() < 10 {
            first.push(what);
        }
    }
}

/// What one request should get.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Expect {
    /// Mutated: allowed with a JSON patch.
    Patched,
    Allowed,
    /// Refused with this HTTP code inside the review.
    Denied(u16),
}

fn check(reply: &https::Reply, expect: Expect) -> Result<(), String> {
    if reply.status != 200 {
        return Err(format!("HTTP {}", reply.status));
    }
    let r = reply.json()["response"].clone();
    let ok = match expect {
        Expect::Patched => {
            r["allowed"] == true && r["patch"].as_str().is_some_and(|p| !p.is_empty())
        }
        Expect::Allowed => r["allowed"] == true,
        Expect::Denied(code) => r["allowed"] == false && r["status"]["code"] == code,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("expected {expect:?}, got {r}"))
    }
}

/// Sends on the kept-alive connection; one reconnect when it was closed under us.
async fn send(
    conn: &mut Option<https::Connection>,
    addr: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
    tally: &Tally,
    path: &str,
    body: Vec<u8>,
) -> Result<https::Reply, String> {
    for attempt in 0..2 {
        if conn.is_none() {
            *conn = Some(
                https::connect(addr, tls.clone())
                    .await
                    .map_err(|e| format!("connect: {e}"))?,
            );
            if attempt > 0 {
                tally.reconnects.fetch_add(1, Ordering::Relaxed);
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        match c.send("POST", path, body.clone()).await {
            Ok(r) => return Ok(r),
            Err(e) if attempt == 0 => {
                eprintln!("soak: connection lost ({e}); reconnecting");
                *conn = None;
            }
            Err(e) => return Err(format!("{path}: {e}")),
        }
    }
    Err(format!("{path}: no connection"))
}

/// One connection's loop: mutate then validate a vGPU pod in a quota namespace, and in turn a
/// pod the policy refuses, a pod without vGPU, and a vGPU pod in a namespace without quota.
async fn client(id: usize, args: Arc<ClientArgs>, tally: Arc<Tally>, stop: Arc<AtomicBool>) {
    let mut conn = None;
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let ns = format!("team-{}", (i as usize * 7 + id) % args.namespaces);
        let name = format!("soak-{id}-{i}");
        let vgpu = pod(&ns, &name, true);
        let mut steps: Vec<(&str, Vec<u8>, Expect)> = vec![
            (
                "/mutate",
                review(&vgpu, &format!("m-{id}-{i}")),
                Expect::Patched,
            ),
            (
                "/validate",
                review(&vgpu, &format!("v-{id}-{i}")),
                Expect::Allowed,
            ),
        ];
        match i % 3 {
            0 => {
                let mut bad = pod(&ns, &format!("{name}-priv"), true);
                bad["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
                steps.push((
                    "/validate",
                    review(&bad, &format!("p-{id}-{i}")),
                    Expect::Denied(403),
                ));
            }
            1 => {
                let plain = pod(&ns, &format!("{name}-web"), false);
                steps.push((
                    "/validate",
                    review(&plain, &format!("w-{id}-{i}")),
                    Expect::Allowed,
                ));
            }
            _ => {
                let free = pod("no-quota", &format!("{name}-free"), true);
                steps.push((
                    "/validate",
                    review(&free, &format!("f-{id}-{i}")),
                    Expect::Allowed,
                ));
            }
        }
        for (path, body, expect) in steps {
            tally.requests.fetch_add(1, Ordering::Relaxed);
            match send(&mut conn, args.addr, &args.tls, &tally, path, body).await {
                Ok(reply) => {
                    if let Err(e) = check(&reply, expect) {
                        tally.error(format!("{path} {name}: {e}"));
                    }
                }
                Err(e) => {
                    tally.error(e);
                    conn = None;
                }
            }
        }
        i += 1;
    }
}

struct ClientArgs {
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    namespaces: usize,
}

/// Pods come and go in the API at a steady pace (about 10/s, 50 alive), as a cluster's do.
async fn churn(api: &FakeApiServer, namespaces: usize, stop: &AtomicBool) -> u64 {
    let mut alive = std::collections::VecDeque::new();
    let mut n = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let ns = format!("team-{}", n as usize % namespaces);
        let name = format!("churn-{n}");
        if api.create(pod(&ns, &name, true)).is_ok() {
            alive.push_back((ns, name));
        }
        if alive.len() > 50 {
            if let Some((ns, name)) = alive.pop_front() {
                let _ = api.delete("v1", "pods", &ns, &name);
            }
        }
        n += 1;
    }
    n
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.iter().sum::<f64>() / v.len() as f64
}

/// Runs the soak for `secs` seconds and judges it.
pub async fn run(
    args: &Args,
    secs: u64,
    api: &FakeApiServer,
    pid: u32,
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        secs >= args.warmup + 2 * args.window,
        "--duration {secs} must cover --warmup {} and two --window {} s",
        args.warmup,
        args.window
    );
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let cargs = Arc::new(ClientArgs {
        addr,
        tls,
        namespaces: args.namespaces.max(1),
    });
    let mut clients = Vec::new();
    for id in 0..args.connections {
        clients.push(tokio::spawn(client(
            id,
            cargs.clone(),
            tally.clone(),
            stop.clone(),
        )));
    }
    let started = Instant::now();
    let end = started + Duration::from_secs(secs);
    let sampler = async {
        let mut samples = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(args.sample_seconds.max(1)));
        let mut last_requests = 0u64;
        loop {
            tick.tick().await;
            let at_s = started.elapsed().as_secs_f64();
            let rss = rss_mib(pid).context("webhook process gone (no /proc/PID/status)")?;
            let fds = fd_count(pid).context("webhook process gone (no /proc/PID/fd)")?;
            let requests = tally.requests.load(Ordering::Relaxed);
            println!(
                "t={at_s:6.1}s rss={rss:7.1} MiB fds={fds:4} requests={requests} (+{}) errors={}",
                requests - last_requests,
                tally.errors.load(Ordering::Relaxed)
            );
            last_requests = requests;
            samples.push(Sample {
                at_s,
                rss_mib: rss,
                fds,
            });
            if Instant::now() >= end {
                stop.store(true, Ordering::Relaxed);
                return anyhow::Ok(samples);
            }
        }
    };
    let (samples, churned) = tokio::join!(sampler, churn(api, cargs.namespaces, &stop));
    stop.store(true, Ordering::Relaxed);
    let samples = samples?;
    for c in clients {
        c.await?;
    }
    let elapsed = started.elapsed().as_secs_f64();

    let (w0, w1) = (args.warmup as f64, (args.warmup + args.window) as f64);
    let last_from = elapsed - args.window as f64;
    let first: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at_s >= w0 && s.at_s < w1)
        .collect();
    let last: Vec<&Sample> = samples.iter().filter(|s| s.at_s >= last_from).collect();
    anyhow::ensure!(
        !first.is_empty() && !last.is_empty(),
        "no samples in a window"
    );
    let rss_first = mean(&first.iter().map(|s| s.rss_mib).collect::<Vec<_>>());
    let rss_last = mean(&last.iter().map(|s| s.rss_mib).collect::<Vec<_>>());
    let growth = rss_last / rss_first - 1.0;
    let fd_first = first.iter().map(|s| s.fds).max().unwrap_or(0);
    let fd_last = last.iter().map(|s| s.fds).max().unwrap_or(0);
    let requests = tally.requests.load(Ordering::Relaxed);
    let errors = tally.errors.load(Ordering::Relaxed);
    println!("\n| measure | value |\n|---|---|");
    println!(
        "| duration | {elapsed:.0} s ({} connections) |",
        args.connections
    );
    println!(
        "| requests (mutate + validate) | {requests} ({:.0}/s) |",
        requests as f64 / elapsed
    );
    println!("| errors (transport, non-200, wrong answer) | {errors} |");
    println!(
        "| reconnects | {} |",
        tally.reconnects.load(Ordering::Relaxed)
    );
    println!("| pods created and deleted in the API | {churned} |");
    println!("| RSS mean, first window ({w0:.0}-{w1:.0} s) | {rss_first:.1} MiB |");
    println!("| RSS mean, last window ({last_from:.0}-{elapsed:.0} s) | {rss_last:.1} MiB |");
    println!(
        "| RSS growth (limit {:.0} %) | {:+.1} % |",
        args.rss_tolerance * 100.0,
        growth * 100.0
    );
    println!("| open descriptors, max first / last window | {fd_first} / {fd_last} |");
    let mut failed = Vec::new();
    if errors > 0 {
        let first = tally
            .first_errors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .join("\n  ");
        failed.push(format!("{errors} errors, first:\n  {first}"));
    }
    if growth > args.rss_tolerance {
        failed.push(format!(
            "RSS grew {:.1} % (limit {:.0} %)",
            growth * 100.0,
            args.rss_tolerance * 100.0
        ));
    }
    if fd_last > fd_first + args.fd_slack {
        failed.push(format!(
            "open descriptors grew from {fd_first} to {fd_last} (slack {})",
            args.fd_slack
        ));
    }
    anyhow::ensure!(failed.is_empty(), "soak failed: {}", failed.join("; "));
    println!("\nsoak passed");
    Ok(())
}
