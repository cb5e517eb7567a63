//! Certificates for the vGPU services: generate a CA and a serving certificate for a Kubernetes
//! Service, decide what an existing set needs (nothing, a new leaf, or a new CA), and serve a
//! certificate that is reloaded when its files change.
//!
//! The binary `vgpu-certs` (src/main.rs) is the CLI over [`pki`], [`plan`], [`store`] and
//! [`inject`]; the services use [`reload`].

pub mod inject;
pub mod inspect;
pub mod pki;
pub mod plan;
pub mod reload;
pub mod store;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Seconds since the Unix epoch (certificate validity is second-granular).
pub(crate) fn unix_seconds(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// One day.
pub const DAY: Duration = Duration::from_secs(24 * 60 * 60);
