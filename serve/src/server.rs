//! The serving loop: accept, TLS handshake under a deadline, HTTP/1.1 or HTTP/2 (by ALPN), and a
//! watchdog per connection that enforces the header and idle timeouts.
//!
//! hyper's own `header_read_timeout` is not used: hyper starts it whenever it waits for a request
//! head, so on an idle keep-alive connection it fires after the header timeout, not the idle one.
//! Here the header clock starts at the first byte of a request and stops when its head is parsed
//! (the service is called); the idle clock runs while no request is in flight and none has begun.
//! On HTTP/2 only the idle clock runs: frames such as the PINGs that client-go sends every 30 s on
//! idle connections are not requests, and a HEADERS frame is parsed whole or not at all.

use axum::body::Body;
use axum::http::{Request, Response};
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tower::ServiceExt;

use crate::body::{declared_length, read_limited, refusal};

/// Limits every connection is served under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// A TLS handshake, or a request head from its first byte, must finish within this.
    pub header_read_timeout: Duration,
    /// A request body must be received whole within this (408 otherwise).
    pub body_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed.
    pub idle_timeout: Duration,
    /// Largest request body (413 beyond).
    pub max_body: usize,
    /// How long open connections get to finish at shutdown, or after being told to close.
    pub shutdown_grace: Duration,
    /// Once shutdown is asked, how long to go on serving (new connections too) before stopping:
    /// the time the cluster takes to stop sending here (a terminating pod's endpoint is removed,
    /// but clients keep their pooled connections). Meanwhile HTTP/1.1 answers carry
    /// `Connection: close`, so clients retire their keep-alive connections after a response
    /// instead of meeting one closed under their next request (a broken pipe, which an API
    /// server reports as a failed admission).
    pub shutdown_delay: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_body: 3 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(10),
            shutdown_delay: Duration::ZERO,
        }
    }
}

/// Serves `router` on `listener` (over TLS when `tls` is given) until `shutdown` resolves, then
/// stops accepting, asks every connection to finish and waits up to the shutdown grace for them.
///
/// Errors accepting a connection (EMFILE when descriptors run out) are logged and retried after a
/// short pause, never fatal. Failed handshakes (plain HTTP on the TLS port, TLS 1.0/1.1, a missing
/// or untrusted client certificate) are logged at debug level: a hostile client must not be able
/// to flood the log.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let limits = Arc::new(limits);
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (drain_tx, drain_rx) = watch::channel(false);
    // Every connection task holds a clone; when all are gone, recv() returns None.
    let (open_tx, mut open_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    let mut drain_until: Option<Instant> = None;
    loop {
        let (tcp, peer) = tokio::select! {
            _ = &mut shutdown, if drain_until.is_none() => {
                if limits.shutdown_delay.is_zero() {
                    break;
                }
                tracing::info!(delay = ?limits.shutdown_delay, "shutting down: serving on while clients move away");
                let _ = drain_tx.send(true);
                drain_until = Some(Instant::now() + limits.shutdown_delay);
                continue;
            }
            _ = tokio::time::sleep_until(drain_until.unwrap_or_else(Instant::now)), if drain_until.is_some() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (router, limits, stop, open, drain) = (
            router.clone(),
            limits.clone(),
            stop_rx.clone(),
            open_tx.clone(),
            drain_rx.clone(),
        );
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let _open = open;
            let Some(acceptor) = acceptor else {
                return connection(tcp, false, router, limits, stop, drain).await;
            };
            match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
                    connection(stream, h2, router, limits, stop, drain).await
                }
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake refused"),
                Err(_) => tracing::debug!(%peer, "TLS handshake not finished in time"),
            }
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    drop(open_tx);
    let grace = limits.shutdown_grace + Duration::from_secs(1);
    let _ = tokio::time::timeout(grace, open_rx.recv()).await;
    Ok(())
}

/// What the watchdog knows about one connection, updated by the reader and the service.
#[derive(Debug)]
struct Activity {
    origin: Instant,
    /// Requests whose head was parsed and whose response is not yet produced.
    in_flight: AtomicUsize,
    /// Milliseconds since `origin` when the current request head began; `NONE` if none.
    head_since: AtomicU64,
    /// Milliseconds since `origin` when the last request finished (or the connection opened).
    last_done: AtomicU64,
    /// A refusal (413, 408) went out with the request body still on the wire: linger at close.
    linger: std::sync::atomic::AtomicBool,
}

const NONE: u64 = u64::MAX;

/// What the watchdog does at a deadline.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// A request head has been arriving for longer than the header timeout: cut.
    HeadTimeout,
    /// Nothing in flight for the idle timeout: close gracefully.
    Idle,
    /// Look again at this many milliseconds since `origin`.
    Recheck(u64),
}

impl Activity {
    fn new() -> Activity {
        Activity {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            head_since: AtomicU64::new(NONE),
            last_done: AtomicU64::new(0),
            linger: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn now_ms(&self) -> u64 {
        millis(self.origin.elapsed())
    }

    /// Bytes arrived: if no request is in flight, they begin a request head.
    ///
    /// Nothing here (nor at a request's start or end) wakes the watchdog: a change either moves
    /// its deadline later, which it finds when it looks at the earlier one, or starts the head
    /// clock, whose deadline is never sooner than the watchdog's next look (see [`next_look`]).
    /// A wake per request cost a poll of the connection and a timer entry, three times each.
    fn bytes_read(&self) {
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            // Err: a head is already being timed.
            let _ = self.head_since.compare_exchange(
                NONE,
                self.now_ms(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.head_since.store(NONE, Ordering::SeqCst);
        InFlight(self.clone())
    }

    fn verdict(&self, now: u64, limits: &Limits) -> Verdict {
        let head = self.head_since.load(Ordering::SeqCst);
        if head != NONE {
            let due = head.saturating_add(millis(limits.header_read_timeout));
            return if now >= due {
                Verdict::HeadTimeout
            } else {
                Verdict::Recheck(due)
            };
        }
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            // The body timeout and the handler bound a request; look again later.
            return Verdict::Recheck(now.saturating_add(millis(limits.idle_timeout)));
        }
        let due = self
            .last_done
            .load(Ordering::SeqCst)
            .saturating_add(millis(limits.idle_timeout));
        if now >= due {
            Verdict::Idle
        } else {
            Verdict::Recheck(due)
        }
    }
}

/// A request in flight; dropping it (the response is ready) restarts the idle clock.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let a = &self.0;
        a.last_done.store(a.now_ms(), Ordering::SeqCst);
        a.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How long, and how much, a closing HTTP/1 connection keeps reading (and discarding) after a
/// refusal, so a client still sending the body it was refused reads the 413 instead of a reset.
const LINGER: Duration = Duration::from_secs(5);

/// The connection's byte stream, telling [`Activity`] when bytes arrive (HTTP/1 only), and
/// lingering at close after a refusal.
///
/// Lingering close (as nginx's `lingering_close`): a 413 for a declared length is sent before the
/// body is read, and closing a socket with unread data makes the kernel answer with a reset, which
/// a client still writing sees as a broken pipe instead of the 413. So after a refusal, shutdown
/// sends our close (TLS close_notify, TCP FIN) and then reads and drops what the client still sends,
/// until it closes, [`LINGER`] passes or `linger_budget` bytes were dropped.
struct Tracked<IO> {
    io: IO,
    activity: Option<Arc<Activity>>,
    linger_budget: usize,
    write_shut: bool,
    drain: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Tracked<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            if let Some(a) = &self.activity {
                a.bytes_read();
            }
        }
        r
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Tracked<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_shut {
            match Pin::new(&mut this.io).poll_shutdown(cx) {
                Poll::Ready(Ok(())) => this.write_shut = true,
                other => return other,
            }
        }
        let linger = this
            .activity
            .as_ref()
            .is_some_and(|a| a.linger.load(Ordering::SeqCst));
        if !linger {
            return Poll::Ready(Ok(()));
        }
        let deadline = this
            .drain
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(LINGER)));
        let mut scratch = [0u8; 8192];
        while this.linger_budget > 0 && deadline.as_mut().poll(cx).is_pending() {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(())) if buf.filled().is_empty() => break,
                Poll::Ready(Ok(())) => {
                    this.linger_budget = this.linger_budget.saturating_sub(buf.filled().len());
                }
                Poll::Ready(Err(_)) => break,
            }
        }
        Poll::Ready(Ok(()))
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// Reads the body under the limits, then hands the request to the router.
async fn respond(req: Request<Incoming>, router: Router, limits: Arc<Limits>) -> Response<Body> {
    let version = req.version();
    let declared = declared_length(req.headers());
    let (parts, body) = req.into_parts();
    match read_limited(body, declared, limits.max_body, limits.body_read_timeout).await {
        Ok(bytes) => match router
            .oneshot(Request::from_parts(parts, Body::from(bytes)))
            .await
        {
            Ok(r) => r,
            Err(never) => match never {},
        },
        Err(e) => {
            tracing::debug!(error = %e, path = %parts.uri.path(), "request body refused");
            refusal(&e, version)
        }
    }
}

/// A hyper server connection that can be asked to finish.
trait Graceful: Future<Output = hyper::Result<()>> {
    fn finish(self: Pin<&mut Self>);
}

impl<I, S> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: hyper::body::Body + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown()
    }
}

impl<I, S, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    S::ResBody: hyper::body::Body + Send + 'static,
    <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    <S::ResBody as hyper::body::Body>::Data: Send,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, S::ResBody>,
{
    fn finish(self: Pin<&mut Self>) {
        self.graceful_shutdown()
    }
}

async fn connection<IO>(
    io: IO,
    h2: bool,
    router: Router,
    limits: Arc<Limits>,
    stop: watch::Receiver<bool>,
    drain: watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked {
        io,
        activity: (!h2).then(|| activity.clone()),
        linger_budget: limits.max_body.saturating_mul(2),
        write_shut: false,
        drain: None,
    });
    let service = {
        let (activity, limits) = (activity.clone(), limits.clone());
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let in_flight = activity.request_started();
            let activity = activity.clone();
            let (router, limits) = (router.clone(), limits.clone());
            let draining = !h2 && *drain.borrow();
            async move {
                let mut resp = respond(req, router, limits).await;
                if draining {
                    resp.headers_mut().insert(
                        axum::http::header::CONNECTION,
                        axum::http::HeaderValue::from_static("close"),
                    );
                }
                if resp.headers().get(axum::http::header::CONNECTION)
                    == Some(&axum::http::HeaderValue::from_static("close"))
                {
                    activity.linger.store(true, Ordering::SeqCst);
                }
                drop(in_flight);
                Ok::<_, std::convert::Infallible>(resp)
            }
        })
    };
    if h2 {
        let mut b = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
        b.timer(TokioTimer::new());
        // No head clock on HTTP/2 (see the module documentation).
        watchdog(
            b.serve_connection(io, service),
            activity,
            &limits,
            false,
            stop,
        )
        .await;
    } else {
        let mut b = hyper::server::conn::http1::Builder::new();
        b.timer(TokioTimer::new()).header_read_timeout(None);
        watchdog(
            b.serve_connection(io, service),
            activity,
            &limits,
            true,
            stop,
        )
        .await;
    }
}

/// When the watchdog looks again after looking at `now`, given the verdict's `due` (both in ms
/// since `origin`).
///
/// Nobody wakes the watchdog when a request head begins, so with a head clock it looks at least
/// once per header timeout: a head that begins at `t >= now` is seen at the next look, at most at
/// `now + header timeout <= t + header timeout`, its deadline or before; from there it is timed
/// to the millisecond. (While a head is timed, `due` is already that soon.) An idle HTTP/1
/// connection is so looked at once per header timeout, 10 s by default.
fn next_look(now: u64, due: u64, limits: &Limits, head_clock: bool) -> u64 {
    if !head_clock {
        return due;
    }
    due.min(now.saturating_add(millis(limits.header_read_timeout)))
}

/// A duration in the watchdog's milliseconds (an absurdly long one stays below [`NONE`]).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(NONE - 1)
}

/// Drives `conn` to its end, closing it at the header and idle timeouts and at shutdown; a
/// connection told to finish that has not within the shutdown grace is dropped.
async fn watchdog<C: Graceful>(
    conn: C,
    activity: Arc<Activity>,
    limits: &Limits,
    head_clock: bool,
    mut stop: watch::Receiver<bool>,
) {
    tokio::pin!(conn);
    let mut finishing: Option<Instant> = None;
    loop {
        let wake = match finishing {
            Some(since) => since + limits.shutdown_grace,
            None => {
                let now = activity.now_ms();
                match activity.verdict(now, limits) {
                    Verdict::Recheck(due) => {
                        activity.origin
                            + Duration::from_millis(next_look(now, due, limits, head_clock))
                    }
                    Verdict::HeadTimeout => {
                        tracing::debug!("request head not received in time; closing");
                        return;
                    }
                    Verdict::Idle => {
                        conn.as_mut().finish();
                        finishing = Some(Instant::now());
                        continue;
                    }
                }
            }
        };
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.changed(), if finishing.is_none() => {
                conn.as_mut().finish();
                finishing = Some(Instant::now());
            }
            _ = tokio::time::sleep_until(wake) => {
                if finishing.is_some() {
                    tracing::debug!("connection did not finish in time; dropping it");
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One HTTP/1.1 GET on a new connection: the response head.
    async fn get(addr: std::net::SocketAddr) -> std::io::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await?;
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await?;
        Ok(String::from_utf8_lossy(&buf[..n]).to_lowercase())
    }

    /// Asked to stop with a delay, the server goes on answering (new connections too), each
    /// HTTP/1.1 answer closing its connection, and stops when the delay is over.
    #[tokio::test]
    async fn a_shutdown_delay_keeps_serving_and_retires_keep_alive_connections() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/", axum::routing::get(|| async { "ok" }));
        let (tx, mut rx) = watch::channel(false);
        let limits = Limits {
            shutdown_delay: Duration::from_millis(600),
            ..Limits::default()
        };
        let server = tokio::spawn(serve(listener, None, router, limits, async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        let before = get(addr).await.unwrap();
        assert!(
            before.starts_with("http/1.1 200") && !before.contains("connection: close"),
            "{before}"
        );
        let asked = Instant::now();
        tx.send(true).unwrap();
        // Answered, and told to close, until the delay is over.
        let during = get(addr).await.unwrap();
        assert!(
            during.starts_with("http/1.1 200") && during.contains("connection: close"),
            "{during}"
        );
        server.await.unwrap().unwrap();
        assert!(asked.elapsed() >= Duration::from_millis(600));
        assert!(get(addr).await.is_err(), "still listening after the delay");
    }

    fn limits() -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(100),
            idle_timeout: Duration::from_millis(1000),
            ..Limits::default()
        }
    }

    #[test]
    fn the_head_clock_runs_from_the_first_byte_and_the_idle_clock_between_requests() {
        let a = Arc::new(Activity::new());
        let l = limits();
        assert_eq!(a.verdict(0, &l), Verdict::Recheck(1000));
        assert_eq!(a.verdict(1000, &l), Verdict::Idle);

        a.head_since.store(500, Ordering::SeqCst);
        assert_eq!(a.verdict(550, &l), Verdict::Recheck(600));
        assert_eq!(a.verdict(600, &l), Verdict::HeadTimeout);

        let req = a.request_started();
        assert_eq!(a.head_since.load(Ordering::SeqCst), NONE, "head parsed");
        assert_eq!(a.verdict(5000, &l), Verdict::Recheck(6000), "in flight");
        a.bytes_read();
        assert_eq!(a.head_since.load(Ordering::SeqCst), NONE, "body bytes");
        drop(req);
        let done = a.last_done.load(Ordering::SeqCst);
        assert_eq!(a.verdict(done + 999, &l), Verdict::Recheck(done + 1000));
        a.bytes_read();
        assert_ne!(a.head_since.load(Ordering::SeqCst), NONE, "next head");
    }

    /// Nothing wakes the watchdog when a head begins, so it must look again by the time the head
    /// could time out: at most one header timeout after any look (HTTP/1), and when the verdict
    /// says so only on HTTP/2, which has no head clock.
    #[test]
    fn the_watchdog_looks_again_before_an_unannounced_head_could_time_out() {
        let l = limits();
        // Idle at 0: the idle deadline is 1000, but a head beginning at 0 is due at 100.
        assert_eq!(next_look(0, 1000, &l, true), 100);
        assert_eq!(next_look(0, 1000, &l, false), 1000);
        // A head being timed (due 550) or an idle deadline sooner than a header timeout: as is.
        assert_eq!(next_look(500, 550, &l, true), 550);
        assert_eq!(next_look(950, 1000, &l, true), 1000);
        // In flight (verdict: look again an idle timeout later): still within a header timeout.
        let a = Arc::new(Activity::new());
        let _req = a.request_started();
        let Verdict::Recheck(due) = a.verdict(5000, &l) else {
            panic!("in flight is not a timeout");
        };
        assert_eq!(next_look(5000, due, &l, true), 5100);
    }
}
