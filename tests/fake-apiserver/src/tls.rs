//! A throwaway CA and a serving certificate for `127.0.0.1` and `localhost`, so clients verify the
//! double exactly as they verify a cluster (the CA goes into the kubeconfig's
//! `certificate-authority-data`).

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use std::sync::Arc;

/// Failure to build the certificates or the TLS config.
#[derive(Debug)]
pub struct TlsError(pub String);

/// CA PEM and the server config.
pub fn server_config() -> Result<(String, Arc<rustls::ServerConfig>), TlsError> {
    let e = |e: &dyn std::fmt::Display| TlsError(e.to_string());
    let ca_key = KeyPair::generate().map_err(|x| e(&x))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|x| e(&x))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "fake kube-apiserver CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key).map_err(|x| e(&x))?;
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = KeyPair::generate().map_err(|x| e(&x))?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).map_err(|x| e(&x))?;
    leaf.subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    leaf.distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    let cert = leaf.signed_by(&key, &issuer).map_err(|x| e(&x))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|x| e(&x))?
        .with_no_client_auth()
        .with_single_cert(
            vec![CertificateDer::from(cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|x| e(&x))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), Arc::new(cfg)))
}
