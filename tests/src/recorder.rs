//! A tiny HTTP(S) server that records the JSON bodies a real component sends and answers each path
//! with a canned reply: how the real-cluster tier captures what kube-scheduler and the API server
//! send, to pin the doubles to it (tests/fixtures/).

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

/// The reply for one request: path and body in, JSON out.
pub type Reply = dyn Fn(&str, &Value) -> Value + Send + Sync;

/// A recording server; runs until the process ends.
pub struct Recorder {
    /// Where it listens.
    pub addr: SocketAddr,
    calls: Arc<Mutex<Vec<(String, Value)>>>,
}

impl Recorder {
    /// Starts on 127.0.0.1: plain HTTP, or HTTPS with `tls` (a PEM certificate chain and key).
    pub fn start(tls: Option<(&str, &str)>, reply: Box<Reply>) -> Recorder {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind recorder");
        let addr = listener.local_addr().expect("recorder address");
        let calls = Arc::new(Mutex::new(Vec::new()));
        let config = tls.map(|(cert, key)| Arc::new(server_config(cert, key)));
        let (c, reply) = (calls.clone(), Arc::new(reply));
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (c, reply, config) = (c.clone(), reply.clone(), config.clone());
                std::thread::spawn(move || {
                    let _ = match config {
                        Some(config) => {
                            let conn = match rustls::ServerConnection::new(config) {
                                Ok(conn) => conn,
                                Err(_) => return,
                            };
                            serve(rustls::StreamOwned::new(conn, stream), &c, &**reply)
                        }
                        None => serve(stream, &c, &**reply),
                    };
                });
            }
        });
        Recorder { addr, calls }
    }

    /// The calls so far, as (path, body).
    pub fn calls(&self) -> Vec<(String, Value)> {
        self.calls.lock().unwrap().clone()
    }

    /// The first body sent to `path`, if any.
    pub fn first(&self, path: &str) -> Option<Value> {
        self.calls()
            .into_iter()
            .find(|(p, _)| p == path)
            .map(|(_, b)| b)
    }
}

fn server_config(cert: &str, key: &str) -> rustls::ServerConfig {
    let certs = rustls_pemfile::certs(&mut cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = rustls_pemfile::private_key(&mut key.as_bytes())
        .expect("key PEM")
        .expect("a key");
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("server certificate")
}

/// Serves HTTP/1.1 requests on one connection until the peer closes it.
fn serve<S: Read + Write>(
    stream: S,
    calls: &Mutex<Vec<(String, Value)>>,
    reply: &Reply,
) -> std::io::Result<()> {
    let mut r = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let path = line
            .split_whitespace()
            .nth(1)
            .unwrap_or("/")
            .split('?')
            .next()
            .unwrap_or("/")
            .to_string();
        let mut length = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h)? == 0 {
                return Ok(());
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0u8; length];
        r.read_exact(&mut body)?;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer = reply(&path, &body).to_string();
        calls.lock().unwrap().push((path, body));
        let w = r.get_mut();
        write!(
            w,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{answer}",
            answer.len()
        )?;
        w.flush()?;
    }
}
