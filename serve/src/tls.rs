//! TLS for the services' listeners: rustls with TLS 1.3 and 1.2 only (a TLS 1.0 or 1.1 ClientHello
//! gets a `protocol_version` alert), ALPN h2 and http/1.1, a certificate reloaded when its files
//! change, and optionally a client certificate required and verified against a CA file.

use rcgen::{CertificateParams, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};
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
    /// The client CA file cannot be read.
    #[error("client CA {path}: {source}")]
    ClientCaRead {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The client CA file holds no usable CA certificate.
    #[error("client CA {path}: {reason}")]
    ClientCa {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
}

/// Who may connect: anyone (the API server's usual setup), or only clients presenting a
/// certificate that chains to a CA.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClientAuth {
    /// No client certificate is asked for.
    #[default]
    None,
    /// A client certificate is required and verified against the CA certificates in this PEM file
    /// (read once at start).
    Required(PathBuf),
}

/// The verifier for [`ClientAuth::Required`]: every CA certificate in the PEM file is a trust
/// anchor; a client without a certificate, or with one that does not chain to them (or has
/// expired, or is not for client authentication), fails the handshake.
pub fn client_verifier(ca: &Path) -> Result<Arc<dyn ClientCertVerifier>, TlsError> {
    let pem = std::fs::read(ca).map_err(|source| TlsError::ClientCaRead {
        path: ca.into(),
        source,
    })?;
    let bad = |reason: String| TlsError::ClientCa {
        path: ca.into(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        let cert = cert.map_err(|e| bad(format!("not PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(bad("no CERTIFICATE block".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| bad(e.to_string()))
}

/// A server config for a chain and key: TLS 1.3 and 1.2 only, no client auth.
pub fn server_config(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let mut cfg = builder(None)?.with_single_cert(chain, key)?;
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
pub fn reloading_server_config(
    cert: &Path,
    key: &Path,
    client: &ClientAuth,
) -> Result<Reloading, TlsError> {
    let verifier = match client {
        ClientAuth::None => None,
        ClientAuth::Required(ca) => Some(client_verifier(ca)?),
    };
    let resolver = ReloadingCert::load(cert, key)?;
    let watcher = resolver.watch()?;
    let as_resolver: Arc<dyn ResolvesServerCert> = resolver.clone();
    let mut cfg = builder(verifier)
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
    verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<rustls::ConfigBuilder<ServerConfig, rustls::server::WantsServerCert>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
    Ok(match verifier {
        Some(v) => versions.with_client_cert_verifier(v),
        None => versions.with_no_client_auth(),
    })
}

fn alpn() -> Vec<Vec<u8>> {
    vec![b"h2".to_vec(), b"http/1.1".to_vec()]
}

/// A throwaway self-signed certificate for `localhost` and `127.0.0.1` (`--dev`).
pub fn dev_server_config(client: &ClientAuth) -> Result<Arc<ServerConfig>, TlsError> {
    let verifier = match client {
        ClientAuth::None => None,
        ClientAuth::Required(ca) => Some(client_verifier(ca)?),
    };
    let key = KeyPair::generate().map_err(TlsError::Generate)?;
    let mut params =
        CertificateParams::new(vec!["localhost".to_string()]).map_err(TlsError::Generate)?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::IpAddr::from([127, 0, 0, 1])));
    let cert = params.self_signed(&key).map_err(TlsError::Generate)?;
    let key_der = PrivateKeyDer::try_from(key.serialize_der())
        .map_err(|e| TlsError::Generate(rcgen::Error::PemError(e.to_string())))?;
    let config_error = |source| TlsError::Config {
        cert: PathBuf::from("<dev>"),
        key: PathBuf::from("<dev>"),
        source,
    };
    let mut cfg = builder(verifier)
        .map_err(TlsError::Settings)?
        .with_single_cert(vec![cert.der().clone()], key_der)
        .map_err(config_error)?;
    cfg.alpn_protocols = alpn();
    Ok(Arc::new(cfg))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
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
        let served = reloading_server_config(&c, &k, &ClientAuth::None).unwrap();
        assert_eq!(
            served.config.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );

        let e = reloading_server_config(&c, &dir.path().join("missing"), &ClientAuth::None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("missing"), "{e}");
        std::fs::write(&k, "not pem").unwrap();
        assert!(matches!(
            reloading_server_config(&c, &k, &ClientAuth::None),
            Err(TlsError::Reload(ReloadError::Pair { .. }))
        ));
        let other = KeyPair::generate().unwrap();
        std::fs::write(&k, other.serialize_pem()).unwrap();
        assert!(matches!(
            reloading_server_config(&c, &k, &ClientAuth::None),
            Err(TlsError::Reload(ReloadError::Pair { .. }))
        ));
        assert!(dev_server_config(&ClientAuth::None).is_ok());
    }

    #[test]
    fn client_ca_files_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap();
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, ca.pem()).unwrap();
        assert!(client_verifier(&path).is_ok());

        let missing = client_verifier(&dir.path().join("none")).err().unwrap();
        assert!(missing.to_string().contains("none"), "{missing}");
        std::fs::write(&path, "no pem here").unwrap();
        let empty = client_verifier(&path).err().unwrap().to_string();
        assert!(empty.contains("no CERTIFICATE block"), "{empty}");
    }
}
