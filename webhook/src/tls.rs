//! TLS for the admission endpoint: rustls with TLS 1.3 and 1.2 only, ALPN h2 and http/1.1.

use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::ResolvesServerCert;
use rustls::ServerConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use thiserror::Error;
use vgpu_certs::reload::{CertWatcher, ReloadError, ReloadingCert};

/// A certificate or key that cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    /// rustls refused the pair (key does not match, unsupported algorithm).
    #[error("certificate {cert} and key {key} cannot be used: {source}")]
    Config {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
    /// The certificate files cannot be served or watched.
    #[error(transparent)]
    Reload(#[from] ReloadError),
    /// rustls refused the protocol settings.
    #[error("TLS settings refused: {0}")]
    Settings(#[source] rustls::Error),
    /// Generating the development certificate failed.
    #[error("cannot generate a development certificate: {0}")]
    Generate(#[source] rcgen::Error),
}

/// A server config for a chain and key: TLS 1.3 and 1.2 only, no client auth.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut cfg = builder()?.with_single_cert(chain, key)?;
    cfg.alpn_protocols = alpn();
    Ok(Arc::new(cfg))
}

/// A certificate served from files and reloaded when they change: the live config, and the
/// watcher that must stay alive as long as reloading should happen.
pub struct Reloading {
    /// The server config; its resolver hands each new handshake the current pair.
    pub config: Arc<ServerConfig>,
    /// The resolver (exposed so callers can report its generation).
    pub cert: Arc<ReloadingCert>,
    /// Dropping this stops reloading.
    pub watcher: CertWatcher,
}

/// Serves `cert`/`key` and reloads them when they change on disk (a Secret volume's `..data`
/// symlink swap included). Connections already open keep the keys they negotiated, so a rotation
/// drops no in-flight or keep-alive request; a broken new pair is refused and the old one serves on.
pub fn reloading_server_config(cert: &Path, key: &Path) -> Result<Reloading, TlsError> {
    let resolver = ReloadingCert::load(cert, key)?;
    let watcher = resolver.watch()?;
    let as_resolver: Arc<dyn ResolvesServerCert> = resolver.clone();
    let mut cfg = builder()
        .map_err(TlsError::Settings)?
        .with_cert_resolver(as_resolver);
    cfg.alpn_protocols = alpn();
    Ok(Reloading {
        config: Arc::new(cfg),
        cert: resolver,
        watcher,
    })
}

fn builder(
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth())
}

fn alpn() -> Vec<Vec<u8>> {
    vec![b"h2".to_vec(), b"http/1.1".to_vec()]
}

/// A throwaway self-signed certificate for `localhost` and `127.0.0.1` (`--dev`).
pub fn dev_server_config() -> Result<Arc<ServerConfig>, TlsError> {
    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let mut params =
        CertificateParams::new(vec!["localhost".to_string()]).map_err(TlsError::Generate)?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    let cert = params.self_signed(&key).map_err(TlsError::Generate)?;
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Generate(rcgen::Error::PemError(e.to_string())))?;
    server_config(vec![cert.der().clone()], key_der).map_err(|source| TlsError::Config {
        cert: PathBuf::from("<dev>"),
        key: PathBuf::from("<dev>"),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_pairs_and_names_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        let served = reloading_server_config(&c, &k).unwrap();
        assert_eq!(
            served.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );

        let e = reloading_server_config(&c, &dir.path().join("missing"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::write(&k, "not pem").unwrap();
        assert!(matches!(
            reloading_server_config(&c, &k),
            Err(TlsError::Reload(ReloadError::Pair { .. }))
        ));
        let other = KeyPair::generate().unwrap();
        std::fs::write(&k, other.serialize_pem()).unwrap();
        assert!(matches!(
            reloading_server_config(&c, &k),
            Err(TlsError::Reload(ReloadError::Pair { .. }))
        ));
        assert!(dev_server_config().is_ok());
    }
}
