//! Making certificates: a CA, and a serving certificate for a Service signed by it (rcgen).

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::net::IpAddr;
use std::time::{Duration, SystemTime};
use thiserror::Error;

/// A certificate and its private key, PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    /// Certificate.
    pub cert: String,
    /// Private key (PKCS#8).
    pub key: String,
}

impl std::fmt::Debug for Pem {
    // Never print a private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("cert", &self.cert.len())
            .finish_non_exhaustive()
    }
}

/// What the serving certificate is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    /// Service name, e.g. `vgpu-webhook`.
    pub service: String,
    /// Service namespace, e.g. `vgpu-system`.
    pub namespace: String,
    /// Extra DNS names (`--dns`).
    pub extra_dns: Vec<String>,
    /// Extra IP addresses (`--ip`).
    pub extra_ips: Vec<IpAddr>,
}

impl Subject {
    /// The DNS names a client may use for the Service: `SVC`, `SVC.NS`, `SVC.NS.svc`,
    /// `SVC.NS.svc.cluster.local`, then the extras. The API server calls webhooks at `SVC.NS.svc`.
    pub fn dns_names(&self) -> Vec<String> {
        let (s, n) = (&self.service, &self.namespace);
        let mut names = vec![
            s.clone(),
            format!("{s}.{n}"),
            format!("{s}.{n}.svc"),
            format!("{s}.{n}.svc.cluster.local"),
        ];
        for d in &self.extra_dns {
            if !names.contains(d) {
                names.push(d.clone());
            }
        }
        names
    }
}

/// A certificate could not be made.
#[derive(Debug, Error)]
pub enum PkiError {
    /// rcgen refused the parameters or a key.
    #[error("{step}: {source}")]
    Rcgen {
        /// What was being done.
        step: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
}

fn rc(step: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Rcgen { step, source }
}

fn validity(params: &mut CertificateParams, now: SystemTime, days: u32) {
    // Backdate a little: clocks on nodes and the API server drift.
    let start = now.checked_sub(Duration::from_secs(300)).unwrap_or(now);
    params.not_before = start.into();
    params.not_after = (now + crate::DAY * days).into();
}

/// A new self-signed CA valid for `days` from `now`.
pub fn new_ca(now: SystemTime, days: u32) -> Result<Pem, PkiError> {
    let key = KeyPair::generate().map_err(rc("generating the CA key"))?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rc("CA parameters"))?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "vgpu CA");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    validity(&mut params, now, days);
    let cert = params
        .self_signed(&key)
        .map_err(rc("self-signing the CA"))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// A new serving certificate for `subject`, signed by `ca`, valid for `days` from `now`.
pub fn new_leaf(subject: &Subject, ca: &Pem, now: SystemTime, days: u32) -> Result<Pem, PkiError> {
    let ca_key = KeyPair::from_pem(&ca.key).map_err(rc("reading the CA key"))?;
    let issuer =
        Issuer::from_ca_cert_pem(&ca.cert, ca_key).map_err(rc("reading the CA certificate"))?;
    let key = KeyPair::generate().map_err(rc("generating the serving key"))?;
    let mut params =
        CertificateParams::new(subject.dns_names()).map_err(rc("serving certificate names"))?;
    params
        .subject_alt_names
        .extend(subject.extra_ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name.push(
        DnType::CommonName,
        format!("{}.{}.svc", subject.service, subject.namespace),
    );
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params, now, days);
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(rc("signing the serving certificate"))?;
    Ok(Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_cover_every_way_a_client_spells_the_service() {
        let s = Subject {
            service: "vgpu-webhook".into(),
            namespace: "vgpu-system".into(),
            extra_dns: vec!["vgpu-webhook".into(), "webhook.example".into()],
            extra_ips: vec![],
        };
        assert_eq!(
            s.dns_names(),
            [
                "vgpu-webhook",
                "vgpu-webhook.vgpu-system",
                "vgpu-webhook.vgpu-system.svc",
                "vgpu-webhook.vgpu-system.svc.cluster.local",
                "webhook.example"
            ]
        );
    }

    #[test]
    fn debug_never_prints_the_key() {
        let p = Pem {
            cert: "C".into(),
            key: "SECRET".into(),
        };
        assert!(!format!("{p:?}").contains("SECRET"));
    }
}
