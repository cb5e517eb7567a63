//! Where a certificate set lives: a directory (`ca.crt ca.key tls.crt tls.key`, keys 0600, each file
//! replaced atomically) or a `kubernetes.io/tls` Secret (same keys).
//!
//! `ca.key` is kept beside the CA so a later run can renew only the serving certificate; a new CA
//! would invalidate every caBundle already injected.

use crate::pki::Pem;
use crate::plan::{Existing, Pki};
use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// File and Secret keys.
pub const CA_CERT: &str = "ca.crt";
/// CA private key.
pub const CA_KEY: &str = "ca.key";
/// Serving certificate.
pub const TLS_CERT: &str = "tls.crt";
/// Serving key.
pub const TLS_KEY: &str = "tls.key";

/// A store could not be read or written.
#[derive(Debug, Error)]
pub enum StoreError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The API call failed.
    #[error("Secret {namespace}/{name}: {source}")]
    Api {
        /// Secret namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The manifest could not be rendered.
    #[error("rendering the Secret: {0}")]
    Render(#[from] serde_yaml::Error),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, StoreError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(path)(e)),
    }
}

fn pair(cert: Option<String>, key: Option<String>) -> Option<Pem> {
    Some(Pem {
        cert: cert?,
        key: key?,
    })
}

/// Reads what a directory holds; missing files are `None`, unreadable ones an error.
pub fn read_dir(dir: &Path) -> Result<Existing, StoreError> {
    let f = |n: &str| read_optional(&dir.join(n));
    Ok(Existing {
        ca: pair(f(CA_CERT)?, f(CA_KEY)?),
        leaf: pair(f(TLS_CERT)?, f(TLS_KEY)?),
    })
}

/// Writes `contents` to `path` through a temporary file and a rename, so a reader (the webhook's
/// reloader) never sees half a file.
fn write_atomic(path: &Path, contents: &str, mode: u32) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io(&tmp))?;
    f.write_all(contents.as_bytes()).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// Writes a set into a directory (created if needed). The key is written before the certificate so
/// that a reloader that sees the new certificate finds its key already there.
pub fn write_dir(dir: &Path, pki: &Pki) -> Result<(), StoreError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    write_atomic(&dir.join(CA_KEY), &pki.ca.key, 0o600)?;
    write_atomic(&dir.join(CA_CERT), &pki.ca.cert, 0o644)?;
    write_atomic(&dir.join(TLS_KEY), &pki.leaf.key, 0o600)?;
    write_atomic(&dir.join(TLS_CERT), &pki.leaf.cert, 0o644)
}

/// The Secret holding a set.
pub fn secret(name: &str, namespace: &str, pki: &Pki) -> Secret {
    let data: BTreeMap<String, ByteString> = [
        (TLS_CERT, &pki.leaf.cert),
        (TLS_KEY, &pki.leaf.key),
        (CA_CERT, &pki.ca.cert),
        (CA_KEY, &pki.ca.key),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
    .collect();
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "vgpu-certs".to_string(),
            )])),
            ..ObjectMeta::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The Secret as a YAML manifest (`kubectl apply -f -`).
pub fn secret_manifest(name: &str, namespace: &str, pki: &Pki) -> Result<String, StoreError> {
    let mut value = serde_json::to_value(secret(name, namespace, pki))
        .map_err(|e| StoreError::Render(serde::ser::Error::custom(e)))?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("apiVersion".into(), "v1".into());
        obj.insert("kind".into(), "Secret".into());
    }
    Ok(serde_yaml::to_string(&value)?)
}

/// Reads what a Secret holds (none if it does not exist).
fn existing_of(secret: &Secret) -> Existing {
    let get = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
    };
    Existing {
        ca: pair(get(CA_CERT), get(CA_KEY)),
        leaf: pair(get(TLS_CERT), get(TLS_KEY)),
    }
}

/// A Secret-backed store: read with its resourceVersion, write back with it, so two jobs racing
/// (an install and an upgrade) cannot both replace the set: the loser gets 409 Conflict.
pub struct SecretStore {
    api: Api<Secret>,
    name: String,
    namespace: String,
    current: Option<Secret>,
}

impl SecretStore {
    /// Reads the Secret `namespace/name`.
    pub async fn read(
        client: kube::Client,
        namespace: &str,
        name: &str,
    ) -> Result<(SecretStore, Existing), StoreError> {
        let api: Api<Secret> = Api::namespaced(client, namespace);
        let err = |source| StoreError::Api {
            namespace: namespace.into(),
            name: name.into(),
            source,
        };
        let current = api.get_opt(name).await.map_err(err)?;
        let existing = current.as_ref().map(existing_of).unwrap_or_default();
        Ok((
            SecretStore {
                api,
                name: name.into(),
                namespace: namespace.into(),
                current,
            },
            existing,
        ))
    }

    /// Creates or replaces the Secret with `pki`.
    pub async fn write(&self, pki: &Pki) -> Result<(), StoreError> {
        let err = |source| StoreError::Api {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            source,
        };
        let mut new = secret(&self.name, &self.namespace, pki);
        match &self.current {
            None => {
                self.api
                    .create(&PostParams::default(), &new)
                    .await
                    .map_err(err)?;
            }
            Some(old) => {
                new.metadata.resource_version = old.metadata.resource_version.clone();
                self.api
                    .replace(&self.name, &PostParams::default(), &new)
                    .await
                    .map_err(err)?;
            }
        }
        Ok(())
    }
}

/// Base64 of a PEM, as a caBundle wants it.
pub fn ca_bundle(ca_pem: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Subject;
    use crate::plan::{carry_out, decide, Wanted};
    use std::os::unix::fs::PermissionsExt;
    use std::time::SystemTime;

    fn pki() -> Pki {
        let w = Wanted {
            subject: Subject {
                service: "s".into(),
                namespace: "n".into(),
                extra_dns: vec![],
                extra_ips: vec![],
            },
            leaf_days: 1,
            ca_days: 2,
            renew_before: crate::DAY,
        };
        let now = SystemTime::now();
        carry_out(
            &Existing::default(),
            &decide(&Existing::default(), &w, now),
            &w,
            now,
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn directory_round_trip_with_private_keys_0600() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_dir(dir.path()).unwrap(), Existing::default());
        let p = pki();
        write_dir(&dir.path().join("pki"), &p).unwrap();
        let back = read_dir(&dir.path().join("pki")).unwrap();
        assert_eq!(
            back,
            Existing {
                ca: Some(p.ca.clone()),
                leaf: Some(p.leaf.clone())
            }
        );
        for (name, mode) in [
            (CA_KEY, 0o600),
            (TLS_KEY, 0o600),
            (CA_CERT, 0o644),
            (TLS_CERT, 0o644),
        ] {
            let m = std::fs::metadata(dir.path().join("pki").join(name))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(m & 0o777, mode, "{name}");
        }
    }

    #[test]
    fn secret_manifest_is_a_tls_secret_with_the_set() {
        let p = pki();
        let yaml = secret_manifest("vgpu-webhook-tls", "vgpu-system", &p).unwrap();
        let v: serde_json::Value = serde_yaml::from_str(&yaml).unwrap();
        assert_eq!(v["kind"], "Secret");
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["type"], "kubernetes.io/tls");
        assert_eq!(v["metadata"]["namespace"], "vgpu-system");
        let data = v["data"].as_object().unwrap();
        let decoded = |k: &str| {
            String::from_utf8(
                base64::engine::general_purpose::STANDARD
                    .decode(data[k].as_str().unwrap())
                    .unwrap(),
            )
            .unwrap()
        };
        assert_eq!(decoded(TLS_CERT), p.leaf.cert);
        assert_eq!(decoded(CA_CERT), p.ca.cert);
        assert_eq!(
            existing_of(&secret("a", "b", &p)),
            Existing {
                ca: Some(p.ca),
                leaf: Some(p.leaf)
            }
        );
    }
}
