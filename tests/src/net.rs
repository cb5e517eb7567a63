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
    addr_field(line).unwrap_or_else(|| panic!("no address in {line:?}"))
}

/// The first `addr=` field of a text-format log line.
fn addr_field(line: &str) -> Option<SocketAddr> {
    line.split("addr=")
        .nth(1)?
        .split_whitespace()
        .next()?
        .trim_matches('"')
        .parse()
        .ok()
}

/// The address of a server's `listening` line: `listening addr=127.0.0.1:8443` in the text
/// format, or `"message":"listening"` with an `"addr"` field in the JSON format (`--log-format
/// json`, as the chart runs the webhook). Other lines with an address, such as the webhook's
/// `health endpoints served (plain HTTP) addr=...` logged before it, are not the one.
pub fn listening_addr(line: &str) -> Option<SocketAddr> {
    if let Some(at) = line.find(" listening addr=") {
        return addr_field(&line[at..]);
    }
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if value.get("message")?.as_str()? != "listening" {
        return None;
    }
    value.get("addr")?.as_str()?.parse().ok()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_address_is_read_from_text_and_json_log_lines() {
        let addr = |s: &str| s.parse::<SocketAddr>().ok();
        let text =
            "2026-12-06T02:25:03.351738Z  INFO vgpu_webhook: listening addr=127.0.0.1:41234\n";
        assert_eq!(listening_addr(text), addr("127.0.0.1:41234"));
        assert_eq!(
            listening_addr("hello listening addr=127.0.0.1:5\n"),
            addr("127.0.0.1:5")
        );
        let json = r#"{"timestamp":"2026-12-06T02:25:03Z","level":"INFO","message":"listening","addr":"127.0.0.1:8443","target":"vgpu_webhook"}"#;
        assert_eq!(listening_addr(json), addr("127.0.0.1:8443"));
        for other in [
            "2026-12-06T02:25:03Z  WARN vgpu_webhook: no Kubernetes API configured\n",
            r#"{"level":"WARN","message":"no Kubernetes API configured"}"#,
            r#"{"message":"listening","addr":7}"#,
            r#"{"message":"health endpoints served (plain HTTP)","addr":"127.0.0.1:9"}"#,
            "2026-12-06T02:25:03Z  INFO vgpu_webhook: health endpoints served (plain HTTP) addr=127.0.0.1:9",
            "",
        ] {
            assert_eq!(listening_addr(other), None, "{other:?}");
        }
        assert_eq!(
            addr_after("x addr=\"127.0.0.1:9\" y"),
            addr("127.0.0.1:9").unwrap()
        );
    }
}
