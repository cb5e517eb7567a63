//! Reading existing certificates: validity, names, issuer, and whether a key belongs to one.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::IpAddr;
use thiserror::Error;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// What we need to know about a certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// DNS subject alternative names.
    pub dns: Vec<String>,
    /// IP subject alternative names.
    pub ips: Vec<IpAddr>,
    /// Whether it is a CA.
    pub is_ca: bool,
    /// The first certificate, DER.
    pub der: Vec<u8>,
}

/// A certificate or key could not be read, or they do not belong together.
#[derive(Debug, Error)]
pub enum InspectError {
    /// No PEM certificate block.
    #[error("no PEM certificate found")]
    NoCertificate,
    /// No PEM private key block.
    #[error("no PEM private key found")]
    NoKey,
    /// The PEM text is malformed.
    #[error("malformed PEM: {0}")]
    Pem(#[source] std::io::Error),
    /// The DER inside is not an X.509 certificate.
    #[error("not an X.509 certificate: {0}")]
    X509(String),
    /// The key is not one rustls can use, or does not match the certificate.
    #[error("key does not fit the certificate: {0}")]
    KeyMismatch(#[source] rustls::Error),
}

/// The certificate chain in a PEM text, in order.
pub fn chain(pem: &str) -> Result<Vec<CertificateDer<'static>>, InspectError> {
    let certs = rustls_pemfile::certs(&mut pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(InspectError::Pem)?;
    if certs.is_empty() {
        return Err(InspectError::NoCertificate);
    }
    Ok(certs)
}

/// The private key in a PEM text.
pub fn private_key(pem: &str) -> Result<PrivateKeyDer<'static>, InspectError> {
    rustls_pemfile::private_key(&mut pem.as_bytes())
        .map_err(InspectError::Pem)?
        .ok_or(InspectError::NoKey)
}

/// Reads the first certificate of a PEM text.
pub fn parse_cert(pem: &str) -> Result<CertInfo, InspectError> {
    let der = chain(pem)?.swap_remove(0);
    let (_, cert) =
        X509Certificate::from_der(der.as_ref()).map_err(|e| InspectError::X509(e.to_string()))?;
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(d) => dns.push((*d).to_string()),
                GeneralName::IPAddress(b) => {
                    if let Ok(v4) = <[u8; 4]>::try_from(*b) {
                        ips.push(IpAddr::from(v4));
                    } else if let Ok(v6) = <[u8; 16]>::try_from(*b) {
                        ips.push(IpAddr::from(v6));
                    }
                }
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        dns,
        ips,
        is_ca: cert.is_ca(),
        der: der.as_ref().to_vec(),
    })
}

/// Whether `leaf` carries a valid signature by `ca`'s key.
pub fn signed_by(leaf: &CertInfo, ca: &CertInfo) -> bool {
    let (Ok((_, leaf)), Ok((_, ca))) = (
        X509Certificate::from_der(&leaf.der),
        X509Certificate::from_der(&ca.der),
    ) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// The pair as rustls serves it; fails when the key is unusable or belongs to another certificate.
pub fn certified_key(
    cert_pem: &str,
    key_pem: &str,
) -> Result<rustls::sign::CertifiedKey, InspectError> {
    let provider = rustls::crypto::ring::default_provider();
    rustls::sign::CertifiedKey::from_der(chain(cert_pem)?, private_key(key_pem)?, &provider)
        .map_err(InspectError::KeyMismatch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::{new_ca, new_leaf, Subject};
    use std::time::SystemTime;

    fn subject() -> Subject {
        Subject {
            service: "s".into(),
            namespace: "n".into(),
            extra_dns: vec![],
            extra_ips: vec!["10.0.0.1".parse().unwrap()],
        }
    }

    #[test]
    fn reads_back_what_pki_made() {
        let now = SystemTime::now();
        let ca = new_ca(now, 10).unwrap();
        let leaf = new_leaf(&subject(), &ca, now, 2).unwrap();
        let (ci, li) = (
            parse_cert(&ca.cert).unwrap(),
            parse_cert(&leaf.cert).unwrap(),
        );
        assert!(ci.is_ca && !li.is_ca);
        assert_eq!(li.dns, ["s", "s.n", "s.n.svc", "s.n.svc.cluster.local"]);
        assert_eq!(li.ips, ["10.0.0.1".parse::<IpAddr>().unwrap()]);
        let now_s = crate::unix_seconds(now);
        assert_eq!(li.not_after, now_s + 2 * 86_400);
        assert!(li.not_before < now_s);
        assert!(signed_by(&li, &ci));
        assert!(!signed_by(
            &li,
            &parse_cert(&new_ca(now, 1).unwrap().cert).unwrap()
        ));
        certified_key(&leaf.cert, &leaf.key).unwrap();
        assert!(matches!(
            certified_key(&leaf.cert, &ca.key),
            Err(InspectError::KeyMismatch(_))
        ));
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(matches!(
            parse_cert("hello"),
            Err(InspectError::NoCertificate)
        ));
        assert!(matches!(private_key(""), Err(InspectError::NoKey)));
        let bad = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(matches!(parse_cert(bad), Err(InspectError::X509(_))));
    }
}
