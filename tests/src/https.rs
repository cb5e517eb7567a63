//! A small HTTPS client for tests: one TLS connection per call, verifying the server against a test
//! CA, HTTP/1.1.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::Arc;

/// Response status and body.
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as JSON (panics with the body shown if it is not).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One kept-alive HTTP/1.1 connection over TLS: requests reuse it until it fails.
pub struct Connection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// DER of the certificate the server presented in this connection's handshake.
    pub peer_leaf: Vec<u8>,
}

/// Opens a TLS connection to `addr` as `localhost`, trusting only `tls`'s roots.
pub async fn connect(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> std::io::Result<Connection> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(tls);
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    let stream = connector.connect(name, tcp).await?;
    let peer_leaf = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default();
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    Ok(Connection { sender, peer_leaf })
}

impl Connection {
    /// Whether the server has closed this connection (or it failed).
    pub fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }

    /// Sends one request on this connection and reads the whole reply.
    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> std::io::Result<Reply> {
        self.sender.ready().await.map_err(std::io::Error::other)?;
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(std::io::Error::other)?;
        let resp = self
            .sender
            .send_request(req)
            .await
            .map_err(std::io::Error::other)?;
        let status = resp.status().as_u16();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes()
            .to_vec();
        Ok(Reply { status, body })
    }
}

/// Sends `body` to `https://localhost:<port><path>` on a new connection, trusting only `tls`'s roots.
pub async fn request(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    method: &str,
    path: &str,
    body: Vec<u8>,
) -> std::io::Result<Reply> {
    connect(addr, tls).await?.send(method, path, body).await
}

/// A TLS stream to `addr` as `localhost` with nothing sent yet, for tests that speak raw bytes.
pub async fn raw_tls(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").map_err(std::io::Error::other)?;
    tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
}
