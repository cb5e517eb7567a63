//! Deciding what an existing certificate set needs: nothing, a new serving certificate, or a new CA
//! (and with it a new serving certificate). Pure: the stores read and write, this only decides.

use crate::inspect::{certified_key, parse_cert, signed_by};
use crate::pki::{new_ca, new_leaf, Pem, PkiError, Subject};
use std::time::{Duration, SystemTime};

/// What is there now; a part that is missing or unreadable is `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Existing {
    /// CA certificate and key.
    pub ca: Option<Pem>,
    /// Serving certificate and key.
    pub leaf: Option<Pem>,
}

/// A complete set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pki {
    /// CA certificate and key.
    pub ca: Pem,
    /// Serving certificate and key.
    pub leaf: Pem,
}

/// What the set should be.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Names the serving certificate must carry.
    pub subject: Subject,
    /// Validity of a new serving certificate.
    pub leaf_days: u32,
    /// Validity of a new CA.
    pub ca_days: u32,
    /// Renew what expires within this.
    pub renew_before: Duration,
}

/// The decision, with the reason an operator reads in the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Everything is valid, covers the names and is far from expiry.
    Keep,
    /// The CA is fine; the serving certificate must be replaced.
    NewLeaf(String),
    /// The CA must be replaced (which invalidates the serving certificate too).
    NewCa(String),
}

/// Decides what `existing` needs to satisfy `wanted` at `now`.
pub fn decide(existing: &Existing, wanted: &Wanted, now: SystemTime) -> Decision {
    let horizon = crate::unix_seconds(now + wanted.renew_before);
    let Some(ca) = &existing.ca else {
        return Decision::NewCa("no CA yet".into());
    };
    let ca_info = match parse_cert(&ca.cert) {
        Ok(i) if i.is_ca => i,
        Ok(_) => return Decision::NewCa("ca.crt is not a CA certificate".into()),
        Err(e) => return Decision::NewCa(format!("ca.crt unreadable: {e}")),
    };
    if let Err(e) = certified_key(&ca.cert, &ca.key) {
        return Decision::NewCa(format!("ca.key does not belong to ca.crt: {e}"));
    }
    if ca_info.not_after <= horizon {
        return Decision::NewCa(format!(
            "CA expires at {} (within the renewal window)",
            ca_info.not_after
        ));
    }
    let Some(leaf) = &existing.leaf else {
        return Decision::NewLeaf("no serving certificate yet".into());
    };
    let info = match parse_cert(&leaf.cert) {
        Ok(i) => i,
        Err(e) => return Decision::NewLeaf(format!("tls.crt unreadable: {e}")),
    };
    if let Err(e) = certified_key(&leaf.cert, &leaf.key) {
        return Decision::NewLeaf(format!("tls.key does not belong to tls.crt: {e}"));
    }
    if !signed_by(&info, &ca_info) {
        return Decision::NewLeaf("tls.crt is not signed by ca.crt".into());
    }
    if info.not_after <= horizon {
        return Decision::NewLeaf(format!(
            "serving certificate expires at {} (within the renewal window)",
            info.not_after
        ));
    }
    if let Some(missing) = wanted
        .subject
        .dns_names()
        .into_iter()
        .find(|d| !info.dns.contains(d))
    {
        return Decision::NewLeaf(format!("serving certificate lacks the name {missing}"));
    }
    if let Some(ip) = wanted
        .subject
        .extra_ips
        .iter()
        .find(|ip| !info.ips.contains(ip))
    {
        return Decision::NewLeaf(format!("serving certificate lacks the address {ip}"));
    }
    Decision::Keep
}

/// Carries out a decision: the new set, or `None` for [`Decision::Keep`].
pub fn carry_out(
    existing: &Existing,
    decision: &Decision,
    wanted: &Wanted,
    now: SystemTime,
) -> Result<Option<Pki>, PkiError> {
    let ca = match (decision, &existing.ca) {
        (Decision::Keep, _) => return Ok(None),
        (Decision::NewLeaf(_), Some(ca)) => ca.clone(),
        _ => new_ca(now, wanted.ca_days)?,
    };
    let leaf = new_leaf(&wanted.subject, &ca, now, wanted.leaf_days)?;
    Ok(Some(Pki { ca, leaf }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DAY;

    fn wanted() -> Wanted {
        Wanted {
            subject: Subject {
                service: "vgpu-webhook".into(),
                namespace: "vgpu-system".into(),
                extra_dns: vec![],
                extra_ips: vec![],
            },
            leaf_days: 365,
            ca_days: 3650,
            renew_before: DAY * 30,
        }
    }

    fn fresh(now: SystemTime) -> Pki {
        let w = wanted();
        let d = decide(&Existing::default(), &w, now);
        assert_eq!(d, Decision::NewCa("no CA yet".into()));
        carry_out(&Existing::default(), &d, &w, now)
            .unwrap()
            .unwrap()
    }

    fn existing(p: &Pki) -> Existing {
        Existing {
            ca: Some(p.ca.clone()),
            leaf: Some(p.leaf.clone()),
        }
    }

    #[test]
    fn a_fresh_set_is_kept_until_the_renewal_window() {
        let now = SystemTime::now();
        let pki = fresh(now);
        let w = wanted();
        assert_eq!(decide(&existing(&pki), &w, now), Decision::Keep);
        assert_eq!(decide(&existing(&pki), &w, now + DAY * 334), Decision::Keep);
        let later = now + DAY * 336;
        let d = decide(&existing(&pki), &w, later);
        assert!(
            matches!(&d, Decision::NewLeaf(r) if r.contains("expires")),
            "{d:?}"
        );
        // Renewing the leaf keeps the CA, so the caBundle in the cluster stays valid.
        let renewed = carry_out(&existing(&pki), &d, &w, later).unwrap().unwrap();
        assert_eq!(renewed.ca, pki.ca);
        assert_ne!(renewed.leaf, pki.leaf);
        assert_eq!(decide(&existing(&renewed), &w, later), Decision::Keep);
    }

    #[test]
    fn only_the_missing_or_wrong_part_is_replaced() {
        let now = SystemTime::now();
        let pki = fresh(now);
        let w = wanted();
        let no_leaf = Existing {
            ca: Some(pki.ca.clone()),
            leaf: None,
        };
        assert!(matches!(decide(&no_leaf, &w, now), Decision::NewLeaf(_)));

        let mut other_names = w.clone();
        other_names.subject.extra_dns = vec!["webhook.example".into()];
        assert!(matches!(decide(&existing(&pki), &other_names, now),
            Decision::NewLeaf(r) if r.contains("webhook.example")));

        let foreign = fresh(now);
        let mixed = Existing {
            ca: Some(pki.ca.clone()),
            leaf: Some(foreign.leaf.clone()),
        };
        assert!(
            matches!(decide(&mixed, &w, now), Decision::NewLeaf(r) if r.contains("not signed"))
        );

        let wrong_key = Existing {
            ca: Some(pki.ca.clone()),
            leaf: Some(Pem {
                cert: pki.leaf.cert.clone(),
                key: foreign.leaf.key.clone(),
            }),
        };
        assert!(
            matches!(decide(&wrong_key, &w, now), Decision::NewLeaf(r) if r.contains("tls.key"))
        );

        let expiring_ca = decide(&existing(&pki), &w, now + DAY * 3630);
        assert!(matches!(expiring_ca, Decision::NewCa(_)));
        let broken_ca = Existing {
            ca: Some(Pem {
                cert: "x".into(),
                key: pki.ca.key.clone(),
            }),
            leaf: None,
        };
        assert!(
            matches!(decide(&broken_ca, &w, now), Decision::NewCa(r) if r.contains("unreadable"))
        );
    }
}
