//! Load-test harness for `/mutate`: requests/s and latency percentiles over TLS with keep-alive, at
//! N concurrent connections, against the real `vgpu-webhook` binary and, as the baseline in the same
//! run, a bare rustls + hyper server that answers every request with a fixed body.
//!
//! ```text
//! cargo build --release --workspace --bins
//! target/release/vgpu-loadtest --connections 64 --seconds 10
//! # p99 of real requests beside 1000 idle connections (issue 9), baseline: none idle
//! target/release/vgpu-loadtest --connections 4 --seconds 10 --idle-connections 1000
//! target/release/vgpu-loadtest --rounds 3 --webhook old/vgpu-webhook --webhook target/release/vgpu-webhook
//! # latency at a fixed 20k requests/s in all (open loop), below saturation
//! target/release/vgpu-loadtest --rate 20000 --seconds 10
//! # what handler CPU alone costs: hello servers that spin, or read the body as JSON, first
//! target/release/vgpu-loadtest --rounds 3 --baseline plain,spin:2.5,json-skim,json-value
//! # client and servers on their own cores, so that the client does not preempt the server
//! target/release/vgpu-loadtest --server-cpus 1 --client-cpus 0
//! # the webhook logging JSON lines, as the chart runs it (the default is text)
//! VGPU_WEBHOOK_LOG_FORMAT=json target/release/vgpu-loadtest
//! ```
//!
//! Both servers run as separate processes with the same TLS settings (TLS 1.3, HTTP/1.1); the client
//! is this process. On a small machine client and servers share the cores (unless pinned apart with
//! `--server-cpus`/`--client-cpus`), so the ratio between the two servers is the meaningful number,
//! not the absolute rate.

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
use rustls::pki_types::ServerName;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vgpu_tests::certs::TestPki;

#[derive(Parser, Debug)]
#[command(about = "Load test of vgpu-webhook /mutate against a bare TLS hello server")]
struct Args {
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Measured seconds per server.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// Warm-up seconds per server (not measured).
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Client worker threads.
    #[arg(long, default_value_t = 2)]
    client_threads: usize,
    /// The vgpu-webhook binary [default: next to this one]; repeat it to compare builds (each is
    /// measured after the baseline in every round).
    #[arg(long)]
    webhook: Vec<PathBuf>,
    /// Rounds: baseline then every webhook, this many times over, so that a change in the machine's
    /// load shows in every server's numbers alike.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Review body to send [default: examples/admission-review.json].
    #[arg(long)]
    body: Option<PathBuf>,
    /// Log filter for the servers (RUST_LOG); `info` logs one line per admission, as in production.
    #[arg(long, default_value = "info")]
    server_log: String,
    /// Idle mode: measure the webhook alone, first as it is and then with this many idle TLS
    /// connections held open beside the load (the baseline is the first run, same process).
    #[arg(long, default_value_t = 0)]
    idle_connections: usize,
    /// Open-loop mode: send this many requests per second in all (spread evenly over the
    /// connections) instead of each connection sending back to back. Latency is then counted
    /// from when each request was due, not when it was sent, so a stalled server is not hidden
    /// by the client waiting for it (coordinated omission). Below the server's capacity this
    /// measures the latency of a loaded but not saturated server.
    #[arg(long)]
    rate: Option<f64>,
    /// Baseline servers, measured in every round before the webhooks; ratios are against the
    /// first. `plain`: answer at once. `spin:US`: first hold the worker US microseconds (a busy
    /// loop), as a handler's CPU would. `json-skim`: first check the body is JSON with serde_json,
    /// building nothing (`IgnoredAny`), the least any reader that refuses malformed JSON must do.
    /// `json-value`: first parse the body into a `serde_json::Value`. Shows what handler CPU alone,
    /// with nothing else of the webhook, does to throughput and p99 on this machine.
    #[arg(long, default_value = "plain", value_delimiter = ',')]
    baseline: Vec<Baseline>,
    /// CPUs the servers run on (`1`, `2-3`, `0,2`): each server process is started with this
    /// affinity (its runtime then starts one worker per CPU). With `--client-cpus` on other CPUs,
    /// client and server stop competing for the same cores, so the numbers are the server's alone.
    #[arg(long, value_parser = parse_cpus)]
    server_cpus: Option<CpuList>,
    /// CPUs this process (the client) runs on; see `--server-cpus`.
    #[arg(long, value_parser = parse_cpus)]
    client_cpus: Option<CpuList>,
    /// Internal: run the baseline hello server with these PEM files.
    #[arg(long, hide = true, num_args = 2, value_names = ["CERT", "KEY"])]
    serve_hello: Option<Vec<PathBuf>>,
    /// Internal: what the hello server does per request.
    #[arg(long, hide = true, default_value = "plain")]
    serve_baseline: Baseline,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Before any thread starts: threads take their creator's affinity.
    let client_cpus = match &args.client_cpus {
        Some(cpus) => {
            let set = cpu_set(&cpus.0);
            sched_setaffinity(None, &set).context("setting --client-cpus")?;
            set
        }
        None => sched_getaffinity(None).context("reading this process's CPU affinity")?,
    };
    let server_cpus = args.server_cpus.as_ref().map(|c| cpu_set(&c.0));
    let pin = Pin {
        server: server_cpus,
        client: client_cpus,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(files) = &args.serve_hello {
        return serve_hello(&files[0], &files[1], args.serve_baseline);
    }
    let dir = tempfile::tempdir()?;
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    let body = match &args.body {
        Some(p) => std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
        None => std::fs::read(vgpu_tests::repo_root().join("examples/admission-review.json"))?,
    };
    let me = std::env::current_exe()?;
    let webhooks = if args.webhook.is_empty() {
        vec![me.with_file_name("vgpu-webhook")]
    } else {
        args.webhook.clone()
    };

    let client_tls = Arc::new(http1_only(pki.client_config()));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads)
        .enable_all()
        .build()?;
    if args.idle_connections > 0 {
        let mut webhook_cmd = Command::new(&webhooks[0]);
        webhook_cmd
            .args(["--listen", "127.0.0.1:0", "--tls-cert"])
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key);
        return idle_mode(&rt, webhook_cmd, client_tls, &body, &args, &pin);
    }
    let mut failed = false;
    for round in 1..=args.rounds.max(1) {
        let mut servers = Vec::new();
        for baseline in &args.baseline {
            let mut hello_cmd = Command::new(&me);
            hello_cmd
                .arg("--serve-hello")
                .arg(&cert)
                .arg(&key)
                .arg(format!("--serve-baseline={baseline}"));
            servers.push((baseline.label(), hello_cmd, "/hello"));
        }
        for (i, webhook) in webhooks.iter().enumerate() {
            let mut cmd = Command::new(webhook);
            cmd.args(["--listen", "127.0.0.1:0", "--tls-cert"])
                .arg(&cert)
                .arg("--tls-key")
                .arg(&key);
            let name = if webhooks.len() == 1 {
                "vgpu-webhook /mutate".to_string()
            } else {
                format!("webhook #{} /mutate", i + 1)
            };
            servers.push((name, cmd, "/mutate"));
        }
        let mut results = Vec::new();
        for (name, cmd, path) in servers {
            let server = Server::start(cmd, &args.server_log, &pin)?;
            let r = rt.block_on(load(&server, client_tls.clone(), path, &body, &args))?;
            println!("{name:<22} {}", r.line());
            failed |= r.errors > 0;
            results.push((name, r));
            drop(server);
        }
        for (name, r) in &results[1..] {
            println!(
                "round {round}: ratio {name}/baseline: {:.3} (connections {}, {} s measured each)",
                r.rps / results[0].1.rps,
                args.connections,
                args.seconds
            );
        }
    }
    if failed {
        bail!("requests failed during the run");
    }
    Ok(())
}

/// p99 of real requests with `--idle-connections` idle TLS connections open, against the same
/// webhook process without them (measured first). The target (issue 9) is p99 < 10 ms.
fn idle_mode(
    rt: &tokio::runtime::Runtime,
    webhook_cmd: Command,
    tls: Arc<rustls::ClientConfig>,
    body: &[u8],
    args: &Args,
    pin: &Pin,
) -> anyhow::Result<()> {
    let limit = vgpu_tests::raise_nofile_limit();
    if limit < args.idle_connections as u64 + 256 {
        bail!(
            "open-file limit {limit} is too low for {} idle connections",
            args.idle_connections
        );
    }
    let server = Server::start(webhook_cmd, &args.server_log, pin)?;
    let base = rt.block_on(load(&server, tls.clone(), "/mutate", body, args))?;
    let idle = rt.block_on(async {
        let mut held = Vec::with_capacity(args.idle_connections);
        while held.len() < args.idle_connections {
            let batch: Vec<_> = (0..64.min(args.idle_connections - held.len()))
                .map(|_| {
                    let tls = tls.clone();
                    let addr = server.addr;
                    tokio::spawn(async move {
                        let tcp = tokio::net::TcpStream::connect(addr).await?;
                        let name =
                            ServerName::try_from("localhost").map_err(std::io::Error::other)?;
                        tokio_rustls::TlsConnector::from(tls)
                            .connect(name, tcp)
                            .await
                    })
                })
                .collect();
            for h in batch {
                held.push(h.await?.context("opening an idle connection")?);
            }
        }
        let r = load(&server, tls.clone(), "/mutate", body, args).await;
        drop(held);
        r
    })?;
    for (name, r) in [
        ("no idle connections", &base),
        ("with idle connections", &idle),
    ] {
        println!("{name:<22} {}", r.line());
    }
    println!(
        "p99 ratio idle/none: {:.3} ({} idle, {} busy connections, {} s measured each); target p99 < 10 ms: {}",
        idle.p99_ms / base.p99_ms.max(0.001),
        args.idle_connections,
        args.connections,
        args.seconds,
        if idle.p99_ms < 10.0 { "met" } else { "NOT met" }
    );
    if base.errors + idle.errors > 0 {
        bail!("requests failed during the run");
    }
    Ok(())
}

fn http1_only(mut cfg: rustls::ClientConfig) -> rustls::ClientConfig {
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg
}

/// CPU affinities: the servers' (when pinned) and this process's.
struct Pin {
    server: Option<CpuSet>,
    client: CpuSet,
}

/// CPU indexes, from a list as `taskset -c` takes it.
#[derive(Clone, Debug, PartialEq)]
struct CpuList(Vec<usize>);

/// A CPU list as `taskset -c` takes it: `0`, `1-3`, `0,2-3`.
fn parse_cpus(s: &str) -> Result<CpuList, String> {
    let bad = || {
        format!(
            "CPU list {s:?}: expected numbers and ranges such as 0,2-3 (below {})",
            CpuSet::MAX_CPU
        )
    };
    let mut out = Vec::new();
    for part in s.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = (
            a.trim().parse().map_err(|_| bad())?,
            b.trim().parse().map_err(|_| bad())?,
        );
        if a > b || b >= CpuSet::MAX_CPU {
            return Err(bad());
        }
        out.extend(a..=b);
    }
    Ok(CpuList(out))
}

fn cpu_set(cpus: &[usize]) -> CpuSet {
    let mut set = CpuSet::new();
    for &c in cpus {
        set.set(c);
    }
    set
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(mut cmd: Command, log: &str, pin: &Pin) -> anyhow::Result<Server> {
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("RUST_LOG", log);
        // A child takes the affinity of the thread that forks it: this one's, set to the
        // servers' CPUs for the spawn and back to the client's after.
        if let Some(set) = &pin.server {
            sched_setaffinity(None, set).context("setting --server-cpus")?;
        }
        let spawned = cmd.spawn().context("starting server");
        if pin.server.is_some() {
            sched_setaffinity(None, &pin.client).context("restoring the client's CPUs")?;
        }
        let mut child = spawned?;
        let stderr = child.stderr.take().context("no stderr")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Keep draining the log (one line per admission) so the server never blocks on the pipe.
        // Once the address is known the rest is discarded in bulk: split into lines, it cost this
        // process (which shares the cores with the server under test) a String per admission.
        std::thread::spawn(move || {
            let mut reader = BufReader::with_capacity(1 << 16, stderr);
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                if let Some(addr) = vgpu_tests::net::listening_addr(&line) {
                    let _ = tx.send(addr);
                    break;
                }
                line.clear();
            }
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
        });
        // From here on the child is owned by `Server`, so any failure below still kills it.
        let mut server = Server {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        };
        let addr = rx
            .recv_timeout(Duration::from_secs(20))
            .context("server did not report its address")?;
        server.addr = addr;
        Ok(server)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Outcome {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: usize,
    requests: usize,
    /// CPU time (user + system) per measured request of the server process and of this client,
    /// in microseconds: on a shared machine this moves far less with the load than req/s does.
    server_cpu_us: f64,
    client_cpu_us: f64,
}

impl Outcome {
    fn line(&self) -> String {
        format!(
            "{:>9.0} req/s  p50 {:>7.3} ms  p99 {:>7.3} ms  errors {}  ({} requests)  CPU/request: server {:.1} us, client {:.1} us",
            self.rps, self.p50_ms, self.p99_ms, self.errors, self.requests, self.server_cpu_us, self.client_cpu_us
        )
    }
}

/// User + system CPU seconds of a process so far, from `/proc/<pid>/stat` (proc(5): fields 14 and
/// 15, in clock ticks of USER_HZ, which is 100 on Linux); `None` where there is no such file.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: count from after it.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime + stime) as f64 / 100.0)
}

async fn load(
    server: &Server,
    tls: Arc<rustls::ClientConfig>,
    path: &'static str,
    body: &[u8],
    args: &Args,
) -> anyhow::Result<Outcome> {
    let addr = server.addr;
    let body = Bytes::copy_from_slice(body);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.warmup);
    let end = measure_from + Duration::from_secs_f64(args.seconds);
    let server_pid = server.child.id().to_string();
    let cpu = tokio::spawn(async move {
        let both = || (cpu_seconds(&server_pid), cpu_seconds("self"));
        tokio::time::sleep_until(measure_from.into()).await;
        let before = both();
        tokio::time::sleep_until(end.into()).await;
        (before, both())
    });
    // In open-loop mode each connection sends every `connections / rate` seconds, the
    // connections' schedules staggered evenly across one interval.
    let interval = args
        .rate
        .filter(|r| *r > 0.0)
        .map(|r| Duration::from_secs_f64(args.connections as f64 / r));
    let mut tasks = Vec::new();
    for i in 0..args.connections {
        let (tls, body) = (tls.clone(), body.clone());
        let pace = interval.map(|every| Pace {
            first: start + every.mul_f64(i as f64 / args.connections as f64),
            every,
        });
        tasks.push(tokio::spawn(async move {
            connection(addr, tls, path, body, measure_from, end, pace).await
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, err) = t.await?;
        latencies.extend(lat);
        errors += err;
    }
    latencies.sort_unstable();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0) as f64
            / 1000.0
    };
    let ((s0, c0), (s1, c1)) = cpu.await?;
    let per_request = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if !latencies.is_empty() => (b - a) * 1e6 / latencies.len() as f64,
        _ => f64::NAN,
    };
    Ok(Outcome {
        rps: latencies.len() as f64 / args.seconds,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
        requests: latencies.len(),
        server_cpu_us: per_request(s0, s1),
        client_cpu_us: per_request(c0, c1),
    })
}

/// When an open-loop connection's requests are due: `first`, then every `every`.
#[derive(Clone, Copy)]
struct Pace {
    first: Instant,
    every: Duration,
}

/// One keep-alive connection sending requests back to back, or when due under `pace`;
/// latencies in microseconds (from the due time under `pace`).
async fn connection(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    path: &'static str,
    body: Bytes,
    measure_from: Instant,
    end: Instant,
    pace: Option<Pace>,
) -> (Vec<u32>, usize) {
    let mut lat = Vec::with_capacity(100_000);
    let mut errors = 0;
    let connect = async {
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let stream = tokio_rustls::TlsConnector::from(tls)
            .connect(
                ServerName::try_from("localhost").map_err(std::io::Error::other)?,
                tcp,
            )
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok::<_, std::io::Error>(sender)
    };
    let Ok(mut sender) = connect.await else {
        return (lat, 1);
    };
    let mut due = pace.map(|p| p.first);
    loop {
        // Open loop: a request that is already due when the previous answer arrives goes at
        // once and its latency counts from when it was due (the server held it up); otherwise
        // the connection sleeps until it is due and counts from when it woke, since tokio's
        // timer wakes up to a millisecond late and that is the client's delay, not the server's.
        let t0 = match due {
            Some(at) if at >= end => break,
            Some(at) if Instant::now() >= at => at,
            Some(at) => {
                tokio::time::sleep_until(at.into()).await;
                Instant::now()
            }
            None => Instant::now(),
        };
        if t0 >= end {
            break;
        }
        if let (Some(at), Some(p)) = (due.as_mut(), pace) {
            *at += p.every;
        }
        let req = Request::post(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(body.clone()));
        let Ok(req) = req else {
            errors += 1;
            break;
        };
        let ok = match sender.send_request(req).await {
            Ok(resp) => resp.status().is_success() && resp.into_body().collect().await.is_ok(),
            Err(_) => false,
        };
        if !ok {
            errors += 1;
            break;
        }
        if t0 >= measure_from {
            lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
        }
    }
    (lat, errors)
}

/// `d` in microseconds as written back: whole nanoseconds, no float noise (`7.7`, not
/// `7.700000000000001`).
fn micros(d: Duration) -> String {
    let ns = d.as_nanos();
    let text = format!("{}.{:03}", ns / 1000, ns % 1000);
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// What a baseline hello server does with each request before it answers (`--baseline`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Baseline {
    Plain,
    Spin(Duration),
    JsonSkim,
    JsonValue,
}

impl Baseline {
    fn label(&self) -> String {
        match self {
            Baseline::Plain => "bare rustls hello".to_string(),
            Baseline::Spin(d) => format!("hello + {} us spin", micros(*d)),
            Baseline::JsonSkim => "hello + JSON skim".to_string(),
            Baseline::JsonValue => "hello + JSON Value".to_string(),
        }
    }

    /// The work itself; `false` when the body is not JSON (answered 400, like the webhook).
    fn work(&self, body: &[u8]) -> bool {
        match self {
            Baseline::Plain => true,
            Baseline::Spin(d) => {
                let begun = Instant::now();
                while begun.elapsed() < *d {
                    std::hint::spin_loop();
                }
                true
            }
            Baseline::JsonSkim => serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok(),
            Baseline::JsonValue => serde_json::from_slice::<serde_json::Value>(body).is_ok(),
        }
    }
}

impl std::fmt::Display for Baseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Baseline::Plain => f.write_str("plain"),
            Baseline::Spin(d) => write!(f, "spin:{}", micros(*d)),
            Baseline::JsonSkim => f.write_str("json-skim"),
            Baseline::JsonValue => f.write_str("json-value"),
        }
    }
}

impl std::str::FromStr for Baseline {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "plain" => Ok(Baseline::Plain),
            "json-skim" => Ok(Baseline::JsonSkim),
            "json-value" => Ok(Baseline::JsonValue),
            _ => {
                let bad = || {
                    format!("baseline {s:?}: expected plain, spin:MICROSECONDS (0, or 0.001 to 1e6), json-skim or json-value")
                };
                let us = s
                    .strip_prefix("spin:")
                    .and_then(|us| us.parse::<f64>().ok())
                    .filter(|us| us.is_finite() && *us >= 0.0 && *us <= 1e6)
                    .ok_or_else(bad)?;
                let d = Duration::from_nanos((us * 1e3).round() as u64);
                // A spin that rounds to no time at all was not what was asked for.
                if d.is_zero() && us > 0.0 {
                    return Err(bad());
                }
                Ok(Baseline::Spin(d))
            }
        }
    }
}

/// The baseline: TLS like the webhook, HTTP/1.1 keep-alive, read the body, do the `baseline`'s
/// work with it, answer a fixed review.
fn serve_hello(
    cert: &std::path::Path,
    key: &std::path::Path,
    baseline: Baseline,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let cert_pem = std::fs::read(cert)?;
        let key_pem = std::fs::read(key)?;
        let chain = rustls_pemfile::certs(&mut cert_pem.as_slice()).collect::<Result<Vec<_>, _>>()?;
        let key = rustls_pemfile::private_key(&mut key_pem.as_slice())?.context("no key")?;
        let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        eprintln!("hello listening addr={}", listener.local_addr()?);
        loop {
            let (tcp, _) = listener.accept().await?;
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                let Ok(tls) = acceptor.accept(tcp).await else { return };
                let svc = hyper::service::service_fn(|req: Request<hyper::body::Incoming>| async move {
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    if !baseline.work(&body) {
                        let mut bad = hyper::Response::new(Full::new(Bytes::from_static(b"not JSON")));
                        *bad.status_mut() = hyper::StatusCode::BAD_REQUEST;
                        return Ok::<_, std::convert::Infallible>(bad);
                    }
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"x","allowed":true}}"#,
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_as_taskset_takes_them() {
        assert_eq!(parse_cpus("1"), Ok(CpuList(vec![1])));
        assert_eq!(parse_cpus("0,2-3"), Ok(CpuList(vec![0, 2, 3])));
        for bad in ["", "a", "3-1", "1-", "-1", "0,,1", "100000"] {
            assert!(parse_cpus(bad).unwrap_err().contains("CPU list"), "{bad}");
        }
        let set = cpu_set(&[0, 2]);
        assert!(set.is_set(0) && !set.is_set(1) && set.is_set(2));
    }

    /// Every flag parses through clap as declared (a value parser and a field type that disagree
    /// only fail when the flag is given).
    #[test]
    fn flags_parse() {
        use clap::CommandFactory;
        Args::command().debug_assert();
        let a = Args::try_parse_from([
            "vgpu-loadtest",
            "--server-cpus",
            "1",
            "--client-cpus",
            "0",
            "--baseline",
            "plain,spin:2.5,json-skim",
            "--rate",
            "1000",
        ])
        .unwrap();
        assert_eq!(a.server_cpus, Some(CpuList(vec![1])));
        assert_eq!(a.client_cpus, Some(CpuList(vec![0])));
        assert_eq!(a.baseline.len(), 3);
        assert_eq!(a.rate, Some(1000.0));
    }

    #[test]
    fn baselines_parse_print_and_do_their_work() {
        for text in [
            "plain",
            "spin:2.5",
            "spin:0",
            "spin:7.7",
            "spin:0.1",
            "spin:10",
            "json-skim",
            "json-value",
        ] {
            let b: Baseline = text.parse().unwrap();
            assert_eq!(b.to_string(), text);
            assert_eq!(b.to_string().parse::<Baseline>(), Ok(b));
        }
        assert_eq!(
            "spin:3".parse::<Baseline>(),
            Ok(Baseline::Spin(Duration::from_micros(3)))
        );
        assert_eq!(
            Baseline::Spin(Duration::from_micros(7)).label(),
            "hello + 7 us spin"
        );
        for bad in [
            "",
            "spin",
            "spin:",
            "spin:-1",
            "spin:NaN",
            "spin:inf",
            "spin:0.0001",
            "json",
            "Plain",
        ] {
            let err = bad.parse::<Baseline>().unwrap_err();
            assert!(err.contains("expected plain, spin:"), "{bad}: {err}");
        }
        let review = br#"{"kind":"AdmissionReview","request":{"uid":"u","object":{"spec":{}}}}"#;
        for b in [Baseline::JsonSkim, Baseline::JsonValue] {
            assert!(b.work(review), "{b}");
            assert!(!b.work(b"{\"kind\":"), "{b}");
            assert!(!b.work(b"\"\\x\""), "{b}: a bad escape");
        }
        assert!(Baseline::Plain.work(b"{"));
        let begun = Instant::now();
        assert!(Baseline::Spin(Duration::from_micros(200)).work(b""));
        assert!(begun.elapsed() >= Duration::from_micros(200));
    }
}
