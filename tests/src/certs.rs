//! Test certificate authorities and serving certificates, generated with rcgen per test.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose, SanType};
use std::path::{Path, PathBuf};

/// A CA and a serving certificate signed by it, as PEM.
pub struct TestPki {
    /// CA certificate (PEM).
    pub ca_pem: String,
    /// Serving certificate (PEM).
    pub cert_pem: String,
    /// Serving key (PEM).
    pub key_pem: String,
    /// CA key (PEM), to sign client certificates.
    ca_key_pem: String,
}

/// A client certificate and its key, as PEM.
pub struct ClientCert {
    /// Certificate (PEM).
    pub cert_pem: String,
    /// Key (PEM).
    pub key_pem: String,
}

impl TestPki {
    /// A new CA and a leaf for `localhost`, `127.0.0.1` and the given extra DNS names.
    pub fn new(extra_dns: &[&str]) -> TestPki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "vgpu test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let leaf_key = KeyPair::generate().unwrap();
        let mut names = vec!["localhost".to_string()];
        names.extend(extra_dns.iter().map(|s| s.to_string()));
        let mut leaf = CertificateParams::new(names).unwrap();
        leaf.subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        leaf.distinguished_name
            .push(DnType::CommonName, "vgpu test server");
        let leaf_cert = leaf.signed_by(&leaf_key, &issuer).unwrap();
        TestPki {
            ca_pem: ca_cert.pem(),
            cert_pem: leaf_cert.pem(),
            key_pem: leaf_key.serialize_pem(),
            ca_key_pem: issuer.key().serialize_pem(),
        }
    }

    /// Writes `ca.crt`, `tls.crt` and `tls.key` into `dir` and returns their paths.
    pub fn write(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let ca = dir.join("ca.crt");
        let cert = dir.join("tls.crt");
        let key = dir.join("tls.key");
        std::fs::write(&ca, &self.ca_pem).unwrap();
        std::fs::write(&cert, &self.cert_pem).unwrap();
        std::fs::write(&key, &self.key_pem).unwrap();
        (ca, cert, key)
    }

    /// DER of the serving certificate, to compare with what a server presents.
    pub fn leaf_der(&self) -> Vec<u8> {
        rustls_pemfile::certs(&mut self.cert_pem.as_bytes())
            .next()
            .unwrap()
            .unwrap()
            .as_ref()
            .to_vec()
    }

    /// A client certificate (EKU clientAuth) for `common_name`, signed by this CA, as the API
    /// server's admission kubeconfig would hold.
    pub fn client_cert(&self, common_name: &str) -> ClientCert {
        let ca_key = KeyPair::from_pem(&self.ca_key_pem).unwrap();
        let issuer = rcgen::Issuer::from_ca_cert_pem(&self.ca_pem, ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap();
        ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// A rustls client config that trusts only this CA.
    pub fn client_config(&self) -> rustls::ClientConfig {
        trusting(&[self])
    }
}

/// A rustls client config that trusts exactly the CAs of `pkis` (a client that sees a rotation to
/// a new CA trusts both during the overlap, as a caBundle with two certificates does).
pub fn trusting(pkis: &[&TestPki]) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for p in pkis {
        for c in rustls_pemfile::certs(&mut p.ca_pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
    }
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth()
}

/// A rustls client config that trusts `server`'s CA and presents `client`.
pub fn presenting(server: &TestPki, client: &ClientCert) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pemfile::certs(&mut server.ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let chain = rustls_pemfile::certs(&mut client.cert_pem.as_bytes())
        .map(|c| c.unwrap())
        .collect();
    let key = rustls_pemfile::private_key(&mut client.key_pem.as_bytes())
        .unwrap()
        .unwrap();
    rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap()
}
