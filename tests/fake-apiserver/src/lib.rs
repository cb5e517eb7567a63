//! A test double of kube-apiserver: real HTTPS on `127.0.0.1:0`, Kubernetes JSON, list and watch
//! with resourceVersion and bookmarks, create/get/update/patch/delete with 409 Conflict on a stale
//! resourceVersion, status subresources, and fault injection.
//!
//! Usage: `let api = FakeApiServer::start().await?;` (or `start_blocking()` from sync code, which
//! runs the server on its own runtime), then `api.write_kubeconfig(&path)?` and point the code
//! under test at that file (`kube::Config::from_custom_kubeconfig`, or a binary's `--kubeconfig`),
//! so kube-rs runs its real HTTP, TLS and watch code. Seed and inspect objects without HTTP with
//! [`FakeApiServer::create`], [`FakeApiServer::get`] and [`FakeApiServer::list`]; break things with
//! [`FakeApiServer::fail_next`], [`FakeApiServer::fail_matching`], [`FakeApiServer::delay_matching`],
//! [`FakeApiServer::set_down`] and [`FakeApiServer::compact`] (watches from older versions then
//! get 410), or per Kubernetes verb with [`FakeApiServer::fail_verb`],
//! [`FakeApiServer::delay_verb`] and [`FakeApiServer::expire_next_watches`]; cut open watches
//! with [`FakeApiServer::drop_watches`]; assert on traffic with [`FakeApiServer::requests`].
//! Any `group/version/plural` can be stored; the known core types (pods, namespaces, nodes, resourcequotas, events, configmaps,
//! secrets, leases, webhook configurations) get their real kind, scope and status subresource.
//! Each behaviour cites the Kubernetes API documentation it copies in the module that has it:
//! [`store`] (versions, conflicts, watch semantics), [`http`] (paths, verbs, dry-run),
//! [`selector`], [`patch`], [`status`], [`faults`].

pub mod faults;
pub mod http;
pub mod patch;
pub mod resources;
pub mod selector;
pub mod status;
pub mod store;
mod tls;
pub mod validation;

use base64::Engine;
use faults::{Effect, Fault, Faults, RequestRecord};
use serde_json::{json, Value};
use status::ApiError;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use store::Store;

/// The token written into the kubeconfig (the double accepts any credentials).
pub const TOKEN: &str = "fake-apiserver-token";

/// State the handlers share.
pub struct Shared {
    store: Mutex<Store>,
    faults: Mutex<Faults>,
    log: Mutex<Vec<RequestRecord>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn store(&self) -> MutexGuard<'_, Store> {
        lock(&self.store)
    }
    fn faults(&self) -> MutexGuard<'_, Faults> {
        lock(&self.faults)
    }
    fn log(&self, r: RequestRecord) {
        lock(&self.log).push(r);
    }
}

/// Start-up failure.
#[derive(Debug)]
pub struct StartError(pub String);

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "fake apiserver: {}", self.0)
    }
}

impl std::error::Error for StartError {}

/// How to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Serve HTTPS (default) or plain HTTP.
    pub tls: bool,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            tls: true,
            bookmark_interval: Duration::from_millis(500),
        }
    }
}

/// A running fake API server; stops when dropped.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: Option<String>,
    handle: axum_server::Handle<SocketAddr>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl FakeApiServer {
    /// Starts an HTTPS server on the current tokio runtime.
    pub async fn start() -> Result<FakeApiServer, StartError> {
        Self::start_with(Options::default()).await
    }

    /// Starts a server on a runtime of its own, for synchronous tests and benchmarks.
    pub fn start_blocking() -> Result<FakeApiServer, StartError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| StartError(e.to_string()))?;
        let mut s = rt.block_on(Self::start_with(Options::default()))?;
        s.runtime = Some(rt);
        Ok(s)
    }

    /// Starts with options on the current tokio runtime.
    pub async fn start_with(opts: Options) -> Result<FakeApiServer, StartError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            faults: Mutex::new(Faults::default()),
            log: Mutex::new(Vec::new()),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.set_nonblocking(true).map(|_| l))
            .map_err(|e| StartError(format!("bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| StartError(e.to_string()))?;
        let app = axum::Router::new()
            .fallback(http::handle)
            .with_state(shared.clone());
        let handle = axum_server::Handle::new();
        let ca_pem = if opts.tls {
            let (ca, cfg) = tls::server_config().map_err(|e| StartError(e.0))?;
            let server = axum_server::from_tcp_rustls(
                listener,
                axum_server::tls_rustls::RustlsConfig::from_config(cfg),
            )
            .map_err(|e| StartError(e.to_string()))?
            .handle(handle.clone());
            tokio::spawn(server.serve(app.into_make_service()));
            Some(ca)
        } else {
            let server = axum_server::from_tcp(listener)
                .map_err(|e| StartError(e.to_string()))?
                .handle(handle.clone());
            tokio::spawn(server.serve(app.into_make_service()));
            None
        };
        let weak = Arc::downgrade(&shared);
        let every = opts.bookmark_interval;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match weak.upgrade() {
                    Some(s) => s.store().send_bookmarks(),
                    None => return,
                }
            }
        });
        Ok(FakeApiServer {
            shared,
            addr,
            ca_pem,
            handle,
            runtime: None,
        })
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT` (or `http://`).
    pub fn url(&self) -> String {
        let scheme = if self.ca_pem.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The CA certificate (PEM) that signed the serving certificate, when serving HTTPS.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca_pem.as_deref()
    }

    /// A kubeconfig for this server (JSON, which is valid YAML), default namespace `default`.
    pub fn kubeconfig(&self) -> Value {
        let mut cluster = json!({"server": self.url()});
        if let Some(ca) = &self.ca_pem {
            cluster["certificate-authority-data"] =
                base64::engine::general_purpose::STANDARD.encode(ca).into();
        }
        json!({"apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": "default"}}],
            "current-context": "fake"})
    }

    /// Writes [`FakeApiServer::kubeconfig`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig().to_string())
    }

    /// Creates an object from its `apiVersion`/`kind`/`metadata.namespace`, as a POST would.
    pub fn create(&self, obj: Value) -> Result<Value, ApiError> {
        let api_version = obj["apiVersion"].as_str().unwrap_or("v1").to_string();
        let kind = obj["kind"].as_str().unwrap_or("").to_string();
        let rt = resources::by_kind(&api_version, &kind);
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        self.shared.store().create(&rt, &ns, obj, false)
    }

    /// Reads an object (`api_version` as in objects, `plural` as in URLs; `""` for cluster scope).
    pub fn get(&self, api_version: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let rt = resources::by_plural(api_version, plural);
        self.shared.store().get(&rt, ns, name).ok()
    }

    /// All objects of a type, in one namespace or (`None`) all.
    pub fn list(&self, api_version: &str, plural: &str, ns: Option<&str>) -> Vec<Value> {
        let rt = resources::by_plural(api_version, plural);
        let none = selector::Selector::default();
        self.shared
            .store()
            .list(&rt, ns, &none, &none, 0, None)
            .map(|p| p.items)
            .unwrap_or_default()
    }

    /// Merge-patches an object (as `PATCH` with `application/merge-patch+json`, status included).
    pub fn merge_patch(
        &self,
        api_version: &str,
        plural: &str,
        ns: &str,
        name: &str,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        let rt = resources::by_plural(api_version, plural);
        let mut store = self.shared.store();
        let body = patch.to_string();
        let out = store.patch(
            &rt,
            ns,
            name,
            "application/merge-patch+json",
            body.as_bytes(),
            false,
            false,
        )?;
        if rt.has_status && patch.get("status").is_some() {
            return store.patch(
                &rt,
                ns,
                name,
                "application/merge-patch+json",
                body.as_bytes(),
                true,
                false,
            );
        }
        Ok(out)
    }

    /// Deletes an object.
    pub fn delete(
        &self,
        api_version: &str,
        plural: &str,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let rt = resources::by_plural(api_version, plural);
        self.shared.store().delete(&rt, ns, name, &json!({}), false)
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version()
    }

    /// Drops the watch history: watches from any older version get 410 Expired.
    pub fn compact(&self) {
        self.shared.store().compact();
    }

    /// Keeps at most `n` changes for watch replay.
    pub fn set_history_limit(&self, n: usize) {
        self.shared.store().set_history_limit(n);
    }

    /// Ends every open watch (clients re-watch from their last version).
    pub fn close_watches(&self) {
        self.shared.store().close_watches();
    }

    /// Cuts every open watch's connection mid-stream (clients see a read error, then re-watch).
    pub fn drop_watches(&self) {
        self.shared.store().drop_watches();
    }

    /// Number of open watches.
    pub fn watch_count(&self) -> usize {
        self.shared.store().watch_count()
    }

    /// The next `n` requests of any kind fail with `code`.
    pub fn fail_next(&self, n: usize, code: u16) {
        self.fail_matching(None, None, n, code);
    }

    /// The next `n` requests with this method (any if `None`) and path substring fail with `code`.
    pub fn fail_matching(
        &self,
        method: Option<&str>,
        path_contains: Option<&str>,
        n: usize,
        code: u16,
    ) {
        self.add_fault(
            method,
            None,
            path_contains,
            n,
            Effect::Fail(code),
            Duration::ZERO,
        );
    }

    /// The next `n` matching requests wait `delay` before being served.
    pub fn delay_matching(
        &self,
        method: Option<&str>,
        path_contains: Option<&str>,
        n: usize,
        delay: Duration,
    ) {
        self.add_fault(method, None, path_contains, n, Effect::Delay, delay);
    }

    /// The next `n` requests of a Kubernetes verb (`list`, `watch`, `get`, `patch`, ...) on a
    /// path containing `path_contains` fail with `code` (`n = usize::MAX`: until
    /// [`FakeApiServer::clear_faults`]). `list` and `watch` are both `GET` on a collection; the
    /// verb tells them apart.
    pub fn fail_verb(&self, verb: &str, path_contains: Option<&str>, n: usize, code: u16) {
        self.add_fault(
            None,
            Some(verb),
            path_contains,
            n,
            Effect::Fail(code),
            Duration::ZERO,
        );
    }

    /// The next `n` requests of a verb wait `delay` before being served (a slow etcd, an
    /// overloaded server).
    pub fn delay_verb(&self, verb: &str, path_contains: Option<&str>, n: usize, delay: Duration) {
        self.add_fault(None, Some(verb), path_contains, n, Effect::Delay, delay);
    }

    /// The next `n` watches on a path containing `path_contains` are answered with a 410
    /// Expired ERROR event, as when their resourceVersion is older than the server keeps.
    pub fn expire_next_watches(&self, path_contains: Option<&str>, n: usize) {
        self.add_fault(
            None,
            Some("watch"),
            path_contains,
            n,
            Effect::ExpireWatch,
            Duration::ZERO,
        );
    }

    /// Forgets every fault rule and the [`FakeApiServer::set_down`] switch.
    pub fn clear_faults(&self) {
        self.shared.faults().clear();
    }

    fn add_fault(
        &self,
        method: Option<&str>,
        verb: Option<&str>,
        path_contains: Option<&str>,
        n: usize,
        effect: Effect,
        delay: Duration,
    ) {
        self.shared.faults().add(Fault {
            method: method.map(str::to_string),
            verb: verb.map(str::to_string),
            path_contains: path_contains.map(str::to_string),
            remaining: n,
            effect,
            delay,
        });
    }

    /// While `Some(code)`, every request fails with it (an unreachable or broken control plane).
    pub fn set_down(&self, code: Option<u16>) {
        self.shared.faults().set_down(code);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.shared.log).clone()
    }

    /// Forgets the request log.
    pub fn clear_requests(&self) {
        lock(&self.shared.log).clear();
    }

    /// Stops listening and closes connections (clients then see connection errors).
    pub fn shutdown(&self) {
        self.handle.shutdown();
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.handle.shutdown();
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}
