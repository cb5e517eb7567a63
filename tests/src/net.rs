//! Small network helpers the integration tests share: a free port, the address a binary logs when
//! it starts listening, and a plain HTTP/1.1 request (kube-scheduler's extender client and a
//! Prometheus scrape both speak plain HTTP/1.1 to our servers).

use std::net::SocketAddr;

/// A TCP port that was free a moment ago on 127.0.0.1 (for flags that take a port, not `:0`).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port on 127.0.0.1: {e}"))
}

/// The socket address in a start-up log line of ours (`... addr=127.0.0.1:41234 ...`).
pub fn addr_after(line: &str) -> SocketAddr {
    line.split("addr=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.trim_matches('"').parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// One plain HTTP/1.1 request with a JSON content type on a new connection. A connection that
/// cannot be made or is cut before the answer gives status 0 (so callers can poll a server that is
/// still starting, or assert that one has stopped).
pub async fn http(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let Ok(stream) = tokio::net::TcpStream::connect(addr).await else {
        return (0, String::new());
    };
    let Ok((mut sender, conn)) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await
    else {
        return (0, String::new());
    };
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .unwrap_or_else(|e| panic!("bad request {method} {path}: {e}"));
    let Ok(resp) = sender.send_request(req).await else {
        return (0, String::new());
    };
    let status = resp.status().as_u16();
    let Ok(body) = resp.into_body().collect().await else {
        return (0, String::new());
    };
    (
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    )
}
