//! Hostile clients against the real `vgpu-webhook` and `vgpu-scheduler` (extender API over HTTPS)
//! binaries, over real TCP and TLS: slow heads and bodies, idle keep-alive connections, oversized
//! bodies, old TLS versions, plain HTTP on the TLS port, client certificates, and a thousand idle
//! connections beside real requests.
//!
//! Both binaries serve through `vgpu_serve::serve`, so each behaviour is shown on both where the
//! difference matters (the listener's setup) and on the webhook alone where it is the shared loop.

use serde_json::json;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::certs::{presenting, TestPki};
use vgpu_tests::https;
use vgpu_tests::net::addr_after;
use vgpu_tests::process::Running;

/// Short limits, so each timeout shows within seconds.
const SHORT: [&str; 3] = [
    "--header-read-timeout=1s",
    "--body-read-timeout=2s",
    "--idle-timeout=2s",
];
const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Webhook,
    Scheduler,
}

/// A running server, the CA its certificate chains to, and one request it answers 200.
pub(crate) struct Target {
    pub(crate) proc: Running,
    pub(crate) addr: SocketAddr,
    pub(crate) pki: TestPki,
    pub(crate) path: &'static str,
    _api: Option<FakeApiServer>,
    _dir: tempfile::TempDir,
}

fn review() -> Vec<u8> {
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "hostile", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a", "operation": "CREATE", "dryRun": false,
        "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    .to_string()
    .into_bytes()
}

fn filter_args() -> Vec<u8> {
    json!({"Pod": {"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "i"}]}},
        "NodeNames": ["n1"]})
    .to_string()
    .into_bytes()
}

impl Target {
    /// The request this target answers 200.
    pub(crate) fn body(&self) -> Vec<u8> {
        match self.path {
            "/mutate" => review(),
            _ => filter_args(),
        }
    }

    pub(crate) fn tls(&self) -> Arc<rustls::ClientConfig> {
        Arc::new(http1_only(self.pki.client_config()))
    }
}

fn http1_only(mut cfg: rustls::ClientConfig) -> rustls::ClientConfig {
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    cfg
}

/// Starts `kind` with a fresh certificate in `cert_dir` (or a new temp dir) and `extra` flags.
pub(crate) async fn start_in(
    kind: Kind,
    dir: tempfile::TempDir,
    cert: &std::path::Path,
    key: &std::path::Path,
    pki: TestPki,
    extra: &[&str],
) -> Target {
    match kind {
        Kind::Webhook => {
            let (proc, addr) = vgpu_tests::process::start_webhook(cert, key, extra);
            Target {
                proc,
                addr,
                pki,
                path: "/mutate",
                _api: None,
                _dir: dir,
            }
        }
        Kind::Scheduler => {
            let api = FakeApiServer::start().await.unwrap();
            let kubeconfig = dir.path().join("kubeconfig");
            api.write_kubeconfig(&kubeconfig).unwrap();
            let mut cmd = Command::new(vgpu_tests::binary("vgpu-scheduler"));
            cmd.args(["--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0"])
                .arg("--tls-cert")
                .arg(cert)
                .arg("--tls-key")
                .arg(key)
                .args(extra)
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .env_remove("KUBERNETES_SERVICE_HOST");
            let mut proc = Running::spawn("vgpu-scheduler", cmd);
            let line = proc.wait_for_line(WAIT, |l| l.contains("extender listening"));
            assert!(line.contains("tls=true"), "{line}");
            Target {
                proc,
                addr: addr_after(&line),
                pki,
                path: "/filter",
                _api: Some(api),
                _dir: dir,
            }
        }
    }
}

async fn start(kind: Kind, extra: &[&str]) -> Target {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    start_in(kind, dir, &cert, &key, pki, extra).await
}

/// Reads until the peer closes (EOF or an error) or `limit` passes; returns what was read and
/// whether it closed.
async fn read_until_closed(
    r: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: Duration,
) -> (Vec<u8>, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Sends `head` and then one byte of `trickle` every 100 ms until the server closes the
/// connection; returns what the server sent and when it closed, counted from the first byte.
async fn trickle(target: &Target, head: &[u8], trickle: u8) -> (Vec<u8>, Duration) {
    let stream = https::raw_tls(target.addr, target.tls()).await.unwrap();
    let (mut r, mut w) = tokio::io::split(stream);
    let started = Instant::now();
    w.write_all(head).await.unwrap();
    let reader = tokio::spawn(async move { read_until_closed(&mut r, WAIT).await });
    while !reader.is_finished() {
        assert!(started.elapsed() < WAIT, "the server never cut the client");
        tokio::time::sleep(Duration::from_millis(100)).await;
        if w.write_all(&[trickle]).await.is_err() || w.flush().await.is_err() {
            break;
        }
    }
    let (got, closed) = reader.await.unwrap();
    assert!(closed, "connection still open");
    (got, started.elapsed())
}

async fn slow_head_is_cut(kind: Kind) {
    let t = start(kind, &SHORT).await;
    let head = format!("POST {} HTTP/1.1\r\nHost: localhost\r\nX-Slow: ", t.path);
    let (got, after) = trickle(&t, head.as_bytes(), b'a').await;
    // hyper's own header timeout is off; the watchdog cuts without a response.
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(6),
        "{kind:?}: cut after {after:?}, header timeout is 1 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_cuts_a_request_head_sent_one_byte_at_a_time() {
    slow_head_is_cut(Kind::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_cuts_a_request_head_sent_one_byte_at_a_time() {
    slow_head_is_cut(Kind::Scheduler).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_body_gets_408_after_the_body_timeout() {
    let t = start(Kind::Webhook, &SHORT).await;
    let head = "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    let (got, after) = trickle(&t, head.as_bytes(), b' ').await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("request body not received within 2s"),
        "{text}"
    );
    assert!(
        after >= Duration::from_millis(1900) && after < Duration::from_secs(8),
        "cut after {after:?}, body timeout is 2 s"
    );
}

async fn idle_is_closed_busy_is_kept(kind: Kind) {
    let t = start(kind, &SHORT).await;
    let mut conn = https::connect(t.addr, t.tls()).await.unwrap();
    // Busy for longer than the idle timeout, with pauses shorter than it: never cut.
    let busy_until = Instant::now() + Duration::from_secs(3);
    let mut idle_from;
    loop {
        let r = conn.send("POST", t.path, t.body()).await.unwrap();
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        // The server's idle clock starts when it has answered, a little before this.
        idle_from = Instant::now();
        if idle_from >= busy_until {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    vgpu_tests::wait_for_async(WAIT, "the idle connection to be closed", || {
        let closed = conn.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    let after = idle_from.elapsed();
    assert!(
        after >= Duration::from_millis(1800) && after < Duration::from_secs(8),
        "{kind:?}: closed after {after:?} idle, idle timeout is 2 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_closes_idle_keep_alive_connections_only() {
    idle_is_closed_busy_is_kept(Kind::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_closes_idle_keep_alive_connections_only() {
    idle_is_closed_busy_is_kept(Kind::Scheduler).await;
}

async fn huge_content_length_is_refused_unread(kind: Kind) {
    let t = start(kind, &[]).await;
    let mut s = https::raw_tls(t.addr, t.tls()).await.unwrap();
    // 1 GiB announced, a few bytes sent: the answer comes without the rest.
    let head = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 1073741824\r\n\r\n{{\"a\":",
        t.path
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{kind:?}: {text}");
    assert!(
        text.contains("\"reason\":\"RequestEntityTooLarge\""),
        "{text}"
    );
    assert!(closed, "{kind:?}: the connection stays open after a 413");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_refuses_a_huge_content_length_before_reading_the_body() {
    huge_content_length_is_refused_unread(Kind::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_refuses_a_huge_content_length_before_reading_the_body() {
    huge_content_length_is_refused_unread(Kind::Scheduler).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_body_is_cut_just_past_3_mib() {
    const CHUNK: usize = 64 * 1024;
    const OFFERED: usize = 64 << 20;
    let t = start(Kind::Webhook, &[]).await;
    let s = https::raw_tls(t.addr, t.tls()).await.unwrap();
    let (mut r, mut w) = tokio::io::split(s);
    w.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let writer = {
        let sent = sent.clone();
        tokio::spawn(async move {
            let chunk = format!("{CHUNK:x}\r\n{}\r\n", " ".repeat(CHUNK));
            while sent.load(Ordering::SeqCst) < OFFERED {
                if w.write_all(chunk.as_bytes()).await.is_err() {
                    return;
                }
                sent.fetch_add(CHUNK, Ordering::SeqCst);
            }
            let _ = w.write_all(b"0\r\n\r\n").await;
        })
    };
    let (got, _) = read_until_closed(&mut r, WAIT).await;
    let sent_at_answer = sent.load(Ordering::SeqCst);
    writer.abort();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(
        sent_at_answer < OFFERED,
        "the answer came only after all {OFFERED} bytes were sent"
    );
}

/// A TLS 1.x ClientHello record (RFC 2246 / RFC 4346 §7.4.1.2) offering only `version`
/// (`[3, 1]` = TLS 1.0, `[3, 2]` = TLS 1.1): no supported_versions extension, no compression.
/// Besides the CBC suites of that era it offers ECDHE-ECDSA/RSA-AES128-GCM, which the server does
/// have, and a signature_algorithms extension (rustls answers a hello without one with
/// handshake_failure before it looks at the version), so the refusal is for the version alone.
fn legacy_client_hello(version: [u8; 2]) -> Vec<u8> {
    let suites: [u8; 12] = [
        0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x13, 0xc0, 0x14, 0x00, 0x2f, 0x00, 0x35,
    ];
    let mut body = Vec::new();
    body.extend_from_slice(&version);
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // session id
    body.extend_from_slice(&(suites.len() as u16).to_be_bytes());
    body.extend_from_slice(&suites);
    body.extend_from_slice(&[1, 0]); // compression: null
                                     // signature_algorithms (13): ecdsa_secp256r1_sha256, rsa_pkcs1_sha256, rsa_pkcs1_sha1.
    let sig_algs: [u8; 12] = [0, 13, 0, 8, 0, 6, 4, 3, 4, 1, 2, 1];
    body.extend_from_slice(&(sig_algs.len() as u16).to_be_bytes());
    body.extend_from_slice(&sig_algs);
    let mut hs = vec![1]; // client_hello
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut record = vec![0x16, 3, 1]; // handshake, record version TLS 1.0
    record.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    record.extend_from_slice(&hs);
    record
}

async fn old_tls_and_plain_http_are_refused(kind: Kind) {
    let t = start(kind, &[]).await;
    for version in [[3, 1], [3, 2]] {
        let mut s = tokio::net::TcpStream::connect(t.addr).await.unwrap();
        s.write_all(&legacy_client_hello(version)).await.unwrap();
        let (got, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
        assert!(closed, "{kind:?} {version:?}: still open");
        // An alert record (content type 21), fatal (2), protocol_version (70) — never a
        // ServerHello (a handshake record, 22).
        assert_eq!(got.first(), Some(&21), "{kind:?} {version:?}: {got:?}");
        assert_eq!(got.get(5..7), Some(&[2u8, 70][..]), "{kind:?}: {got:?}");
    }
    let mut s = tokio::net::TcpStream::connect(t.addr).await.unwrap();
    let plain = format!(
        "POST {} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{{}}",
        t.path
    );
    s.write_all(plain.as_bytes()).await.unwrap();
    let (got, closed) = read_until_closed(&mut s, Duration::from_secs(10)).await;
    assert!(closed, "{kind:?}: plain HTTP connection still open");
    assert!(
        !got.starts_with(b"HTTP/"),
        "{kind:?}: plain HTTP was answered: {}",
        String::from_utf8_lossy(&got)
    );
    // A real client still gets through.
    let r = https::request(t.addr, t.tls(), "POST", t.path, t.body())
        .await
        .unwrap();
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_refuses_tls_1_0_1_1_and_plain_http() {
    old_tls_and_plain_http_are_refused(Kind::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_refuses_tls_1_0_1_1_and_plain_http() {
    old_tls_and_plain_http_are_refused(Kind::Scheduler).await;
}

async fn client_certificates_are_verified(kind: Kind) {
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    // The CA that signs the API server's client certificate, and one that does not.
    let clients = TestPki::new(&[]);
    let strangers = TestPki::new(&[]);
    let client_ca = dir.path().join("client-ca.crt");
    std::fs::write(&client_ca, &clients.ca_pem).unwrap();
    let flag = format!("--client-ca={}", client_ca.display());
    let mut flags = vec![flag.as_str()];
    if kind == Kind::Webhook {
        flags.push("--health-listen=127.0.0.1:0");
    }
    let mut t = start_in(kind, dir, &cert, &key, pki, &flags).await;

    let send = |tls: rustls::ClientConfig| {
        let (addr, path, body) = (t.addr, t.path, t.body());
        async move { https::request(addr, Arc::new(http1_only(tls)), "POST", path, body).await }
    };
    let anonymous = send(t.pki.client_config()).await;
    assert!(
        anonymous.is_err(),
        "{kind:?}: answered a client without a certificate"
    );
    let stranger = send(presenting(&t.pki, &strangers.client_cert("kube-apiserver"))).await;
    assert!(
        stranger.is_err(),
        "{kind:?}: answered a certificate from another CA"
    );
    let r = send(presenting(&t.pki, &clients.client_cert("kube-apiserver")))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));

    if kind == Kind::Webhook {
        // Probes and scrapers without a certificate use the plain health port, which serves
        // nothing else.
        let line = t
            .proc
            .wait_for_line(WAIT, |l| l.contains("health endpoints served"));
        let health = addr_after(&line);
        for (req, want) in [
            ("GET /readyz HTTP/1.1", "HTTP/1.1 200"),
            ("GET /metrics HTTP/1.1", "HTTP/1.1 200"),
            ("POST /mutate HTTP/1.1", "HTTP/1.1 404"),
        ] {
            let mut s = tokio::net::TcpStream::connect(health).await.unwrap();
            let msg = format!(
                "{req}\r\nHost: localhost\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            s.write_all(msg.as_bytes()).await.unwrap();
            let (got, _) = read_until_closed(&mut s, Duration::from_secs(10)).await;
            let text = String::from_utf8_lossy(&got);
            assert!(text.starts_with(want), "{req}: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_requires_and_verifies_client_certificates() {
    client_certificates_are_verified(Kind::Webhook).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_requires_and_verifies_client_certificates() {
    client_certificates_are_verified(Kind::Scheduler).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_do_not_starve_real_requests() {
    const IDLE: usize = 1000;
    let limit = vgpu_tests::raise_nofile_limit();
    assert!(limit > IDLE as u64 + 100, "open-file limit {limit} too low");
    // Default timeouts: idle connections may stay 90 s.
    let t = start(Kind::Webhook, &[]).await;
    let mut idle = Vec::with_capacity(IDLE);
    while idle.len() < IDLE {
        let batch: Vec<_> = (0..50)
            .map(|_| tokio::spawn(https::raw_tls(t.addr, t.tls())))
            .collect();
        for h in batch {
            idle.push(h.await.unwrap().unwrap());
        }
    }
    // The server holds them all at once (one descriptor each).
    let fds = std::fs::read_dir(format!("/proc/{}/fd", t.proc.pid()))
        .unwrap()
        .count();
    assert!(fds > IDLE, "the webhook holds only {fds} descriptors");
    for i in 0..50 {
        let r = https::request(t.addr, t.tls(), "POST", t.path, t.body())
            .await
            .unwrap_or_else(|e| panic!("request {i} beside {IDLE} idle connections: {e}"));
        assert_eq!(r.status, 200);
        assert_eq!(r.json()["response"]["allowed"], true);
    }
    drop(idle);
}

/// An endless request body of 64 KiB frames (a client streaming without end).
struct Endless;

impl hyper::body::Body for Endless {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(
            bytes::Bytes::from_static(&[b' '; 64 * 1024]),
        ))))
    }
}

/// HTTP/2 (ALPN h2, what the API server's client usually negotiates) gets the same body limit and
/// idle timeout: a streamed body over 3 MiB is answered 413, an idle connection is closed (GOAWAY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_applies_the_limits_to_http2_too() {
    use http_body_util::BodyExt;
    let t = start(Kind::Webhook, &SHORT).await;
    let mut cfg = t.pki.client_config();
    cfg.alpn_protocols = vec![b"h2".to_vec()];
    let stream = https::raw_tls(t.addr, Arc::new(cfg)).await.unwrap();
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (mut h2, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);

    let req = |body| {
        hyper::Request::post("https://localhost/mutate")
            .header("content-type", "application/json")
            .body(body)
            .unwrap()
    };
    let ok = h2
        .send_request(req(
            http_body_util::Full::new(bytes::Bytes::from(review())).boxed()
        ))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let body = ok.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["response"]["allowed"], true);

    let big = h2
        .send_request(req(http_body_util::BodyExt::map_err(
            Endless,
            |never| match never {},
        )
        .boxed()))
        .await
        .unwrap();
    assert_eq!(big.status(), 413);

    let idle_from = Instant::now();
    vgpu_tests::wait_for_async(WAIT, "the idle HTTP/2 connection to be closed", || {
        let closed = h2.is_closed();
        async move { closed.then_some(()) }
    })
    .await;
    let after = idle_from.elapsed();
    assert!(
        after >= Duration::from_millis(1500) && after < Duration::from_secs(8),
        "closed after {after:?} idle, idle timeout is 2 s"
    );
}

/// A client that writes its whole oversized body before reading (hyper's client does) still reads
/// the 413: the server refuses on Content-Length and then lingers, reading and dropping the rest,
/// instead of closing on unread data (which makes the kernel reset the connection, a broken pipe
/// for the client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_body_sent_whole_still_gets_its_413_not_a_reset() {
    let t = start(Kind::Webhook, &[]).await;
    for i in 0..20 {
        let r = https::request(
            t.addr,
            t.tls(),
            "POST",
            "/mutate",
            vec![b' '; 3 * 1024 * 1024 + 1],
        )
        .await
        .unwrap_or_else(|e| panic!("attempt {i}: {e}"));
        assert_eq!(r.status, 413, "attempt {i}");
    }
}
