//! Serving a certificate that is replaced while the server runs.
//!
//! [`ReloadingCert`] is a rustls certificate resolver: every new TLS handshake takes the current
//! pair, and connections already open keep the keys they negotiated, so a rotation drops nothing.
//! [`ReloadingCert::watch`] reloads when the files change. It watches the *directories* holding
//! them, not the files: a Kubernetes Secret volume updates by writing a new timestamped directory and
//! atomically renaming the `..data` symlink over the old one, which no watch on the old file (or its
//! old target) would see. A pair that does not load — half written, mismatched key, garbage — is
//! refused with a log line and the old pair keeps serving.

use crate::inspect::{certified_key, InspectError};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use thiserror::Error;

/// The pair could not be (re)loaded.
#[derive(Debug, Error)]
pub enum ReloadError {
    /// A file could not be read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The files do not make a usable pair.
    #[error("{cert} + {key}: {source}")]
    Pair {
        /// Certificate file.
        cert: PathBuf,
        /// Key file.
        key: PathBuf,
        /// The cause.
        #[source]
        source: InspectError,
    },
    /// The watcher could not be set up.
    #[error("watching {path}: {source}")]
    Watch {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: notify::Error,
    },
}

/// A certificate resolver whose pair can be swapped at run time.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
    /// The PEM texts last loaded, so an event that changed nothing does not count as a reload.
    loaded: Mutex<(String, String)>,
    generation: AtomicU64,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .field("key_path", &self.key_path)
            .field("generation", &self.generation())
            .finish()
    }
}

fn read(path: &Path) -> Result<String, ReloadError> {
    std::fs::read_to_string(path).map_err(|source| ReloadError::Read {
        path: path.into(),
        source,
    })
}

impl ReloadingCert {
    /// Loads the pair; fails if it is not usable (the server should not start without one).
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ReloadingCert>, ReloadError> {
        let (cert, key) = (read(cert_path)?, read(key_path)?);
        let ck = certified_key(&cert, &key).map_err(|source| ReloadError::Pair {
            cert: cert_path.into(),
            key: key_path.into(),
            source,
        })?;
        Ok(Arc::new(ReloadingCert {
            cert_path: cert_path.into(),
            key_path: key_path.into(),
            current: RwLock::new(Arc::new(ck)),
            loaded: Mutex::new((cert, key)),
            generation: AtomicU64::new(0),
        }))
    }

    /// Reads the files again and swaps the pair in if it changed and loads; `Ok(false)` when the
    /// files hold what is already served. On error the current pair stays.
    pub fn reload(&self) -> Result<bool, ReloadError> {
        let (cert, key) = (read(&self.cert_path)?, read(&self.key_path)?);
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.0 == cert && loaded.1 == key {
            return Ok(false);
        }
        let ck = certified_key(&cert, &key).map_err(|source| ReloadError::Pair {
            cert: self.cert_path.clone(),
            key: self.key_path.clone(),
            source,
        })?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(ck);
        *loaded = (cert, key);
        self.generation.fetch_add(1, Ordering::SeqCst);
        Ok(true)
    }

    /// How many times a new pair was swapped in.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// The leaf certificate now served (DER).
    pub fn current_leaf(&self) -> Vec<u8> {
        let ck = self
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        ck.cert
            .first()
            .map(|c| c.as_ref().to_vec())
            .unwrap_or_default()
    }

    /// Reloads whenever something changes in the directories of the two files. Keep the returned
    /// watcher alive as long as reloading should happen.
    pub fn watch(self: &Arc<Self>) -> Result<CertWatcher, ReloadError> {
        use notify::Watcher;
        let me = Arc::clone(self);
        // One directory change is often several events (a Secret volume swaps `..data` in three
        // steps; a deleted directory sends one per file): warn once per distinct failure.
        let mut repeats = RepeatFilter::default();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            match event {
                Err(e) => {
                    if repeats.first(&e.to_string()) {
                        tracing::warn!(error = %e, "certificate watch error; keeping the current certificate");
                    }
                    return;
                }
                Ok(e) if !changes_content(&e.kind) => return,
                Ok(_) => {}
            }
            match me.reload() {
                Ok(true) => {
                    repeats.clear();
                    tracing::info!(cert = %me.cert_path.display(), generation = me.generation(), "serving a new certificate")
                }
                Ok(false) => repeats.clear(),
                Err(e) => {
                    if repeats.first(&e.to_string()) {
                        tracing::warn!(error = %e, "new certificate refused; the current one keeps serving")
                    }
                }
            }
        })
        .map_err(|source| ReloadError::Watch { path: self.cert_path.clone(), source })?;
        let mut dirs: Vec<PathBuf> = [&self.cert_path, &self.key_path]
            .iter()
            .map(|p| {
                p.parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(|| PathBuf::from("."))
            })
            .collect();
        dirs.dedup();
        for dir in dirs {
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            watcher
                .watch(&dir, notify::RecursiveMode::NonRecursive)
                .map_err(|source| ReloadError::Watch {
                    path: dir.clone(),
                    source,
                })?;
        }
        Ok(CertWatcher { _watcher: watcher })
    }
}

/// Whether an event can mean new file contents. notify's inotify backend watches with a mask that
/// includes IN_OPEN and IN_CLOSE_NOWRITE, and a reload opens and reads both files: reloading on
/// those would fire the next event from the reload itself, a busy loop (about 15 000 reloads a
/// second, a whole core, on plain certificate files). Only writes, creations, renames, removals
/// and the catch-all kinds can change what the paths hold.
fn changes_content(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    use notify::EventKind;
    match kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// Remembers the last failure reported, so a failure repeated by a burst of events is reported
/// once; a success clears it.
#[derive(Debug, Default)]
struct RepeatFilter {
    last: Option<String>,
}

impl RepeatFilter {
    /// Whether `failure` differs from the last one reported (and records it).
    fn first(&mut self, failure: &str) -> bool {
        if self.last.as_deref() == Some(failure) {
            return false;
        }
        self.last = Some(failure.to_string());
        true
    }

    fn clear(&mut self) {
        self.last = None;
    }
}

/// Keeps a certificate watch running; dropping it stops reloading.
pub struct CertWatcher {
    _watcher: notify::RecommendedWatcher,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::Subject;
    use crate::plan::{carry_out, decide, Existing, Wanted};
    use std::time::{Duration, Instant, SystemTime};

    fn pki() -> crate::plan::Pki {
        let w = Wanted {
            subject: Subject {
                service: "s".into(),
                namespace: "n".into(),
                extra_dns: vec![],
                extra_ips: vec![],
            },
            leaf_days: 1,
            ca_days: 2,
            renew_before: Duration::ZERO,
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

    fn leaf_der(p: &crate::plan::Pki) -> Vec<u8> {
        crate::inspect::parse_cert(&p.leaf.cert).unwrap().der
    }

    fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_repeated_failure_is_reported_once_until_a_success() {
        let mut f = RepeatFilter::default();
        assert!(f.first("no such file: tls.crt"));
        assert!(!f.first("no such file: tls.crt"));
        assert!(f.first("key does not match"));
        assert!(f.first("no such file: tls.crt"));
        f.clear();
        assert!(f.first("no such file: tls.crt"));
    }

    #[test]
    fn refuses_a_broken_pair_and_keeps_serving_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (a, b) = (pki(), pki());
        std::fs::write(&c, &a.leaf.cert).unwrap();
        std::fs::write(&k, &a.leaf.key).unwrap();
        let r = ReloadingCert::load(&c, &k).unwrap();
        assert_eq!(r.current_leaf(), leaf_der(&a));
        assert!(!r.reload().unwrap(), "unchanged files are not a reload");

        std::fs::write(&c, &b.leaf.cert).unwrap(); // new cert, old key: mismatch
        assert!(matches!(r.reload(), Err(ReloadError::Pair { .. })));
        assert_eq!(r.current_leaf(), leaf_der(&a));
        std::fs::write(&k, &b.leaf.key).unwrap();
        assert!(r.reload().unwrap());
        assert_eq!(r.current_leaf(), leaf_der(&b));
        assert_eq!(r.generation(), 1);

        std::fs::write(&c, "garbage").unwrap();
        assert!(r.reload().is_err());
        assert_eq!(r.current_leaf(), leaf_der(&b));
    }

    /// The way the kubelet updates a Secret volume (pkg/volume/util/atomic_writer.go): the data lives
    /// in a timestamped directory, `..data` is a symlink to it, and the visible files are symlinks
    /// through `..data`. An update writes a new directory, creates `..data_tmp` and renames it over
    /// `..data`.
    #[test]
    fn follows_a_secret_volume_symlink_swap() {
        use std::os::unix::fs::symlink;
        let vol = tempfile::tempdir().unwrap();
        let v = vol.path();
        let (a, b) = (pki(), pki());
        let write_version = |name: &str, p: &crate::plan::Pki| {
            std::fs::create_dir(v.join(name)).unwrap();
            std::fs::write(v.join(name).join("tls.crt"), &p.leaf.cert).unwrap();
            std::fs::write(v.join(name).join("tls.key"), &p.leaf.key).unwrap();
        };
        write_version("..2026_01_01_00_00_00.1", &a);
        symlink("..2026_01_01_00_00_00.1", v.join("..data")).unwrap();
        symlink("..data/tls.crt", v.join("tls.crt")).unwrap();
        symlink("..data/tls.key", v.join("tls.key")).unwrap();

        let r = ReloadingCert::load(&v.join("tls.crt"), &v.join("tls.key")).unwrap();
        let _w = r.watch().unwrap();
        write_version("..2026_01_02_00_00_00.2", &b);
        symlink("..2026_01_02_00_00_00.2", v.join("..data_tmp")).unwrap();
        std::fs::rename(v.join("..data_tmp"), v.join("..data")).unwrap();
        wait_until("the new certificate", || r.current_leaf() == leaf_der(&b));
        assert_eq!(r.generation(), 1);
    }
}
