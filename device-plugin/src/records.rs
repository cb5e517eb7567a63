//! The allocation records: what Allocate (or a DRA prepare) answered for each container, kept at
//! `<host-dir>/allocations/<owner-uid>_<container>.json`, and their removal with the limits files
//! and accounting directories when the pod or claim is gone. `/metrics` labels a container's usage
//! from them ([`crate::metrics`]). The records live outside the directory mounted into the
//! container, so a tenant cannot change the labels its usage is reported under.

use crate::pods::Claim;
use serde::{Deserialize, Serialize};
use std::path::Path;
use vgpu_core::assignment::DeviceSlice;

/// Host-directory subfolder with the allocation records.
pub const ALLOCATIONS_DIR: &str = "allocations";

/// What Allocate answered for one container.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocationRecord {
    /// Pod uid.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// Devices in visible order.
    pub devices: Vec<DeviceSlice>,
    /// In DRA mode, the ResourceClaim's name (`container` is then the claim's request and `pod`
    /// the first pod it is reserved for). Absent in device-plugin mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
}

/// Writes the record of an answered Allocate (best effort: metrics only).
pub fn record_allocation(host_dir: &Path, claim: &Claim) {
    record(
        host_dir,
        &AllocationRecord {
            uid: claim.uid.clone(),
            namespace: claim.namespace.clone(),
            pod: claim.name.clone(),
            container: claim.container.name.clone(),
            devices: claim.container.devices.clone(),
            claim: None,
        },
    );
}

/// Writes an allocation record, `<uid>_<container>.json` (best effort: metrics only).
pub fn record(host_dir: &Path, rec: &AllocationRecord) {
    let dir = host_dir.join(ALLOCATIONS_DIR);
    let path = dir.join(format!("{}_{}.json", rec.uid, rec.container));
    let res = std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(&path, serde_json::to_vec(rec).unwrap_or_default()));
    if let Err(e) = res {
        tracing::warn!(path = %path.display(), error = %e, "writing allocation record");
    }
}

/// Removes the records, limits files and accounting directories of pods no longer on the node.
pub fn forget_pods(host_dir: &Path, keep: impl Fn(&str) -> bool) {
    forget_pods_listed_at(host_dir, keep, None);
}

/// [`forget_pods`] after a LIST that began at `listed_at`: a record written since then (an Allocate
/// for a pod the list could not contain yet) is kept whatever `keep` says.
pub fn forget_pods_listed_at(
    host_dir: &Path,
    keep: impl Fn(&str) -> bool,
    listed_at: Option<std::time::SystemTime>,
) {
    for rec in read_records(host_dir) {
        if keep(&rec.uid) {
            continue;
        }
        let name = format!("{}_{}", rec.uid, rec.container);
        let written =
            std::fs::metadata(host_dir.join(ALLOCATIONS_DIR).join(format!("{name}.json")))
                .and_then(|m| m.modified())
                .ok();
        // A second of margin: file times come from a coarser clock than SystemTime::now().
        let since = listed_at.map(|t| t - std::time::Duration::from_secs(1));
        if let (Some(since), Some(written)) = (since, written) {
            if written >= since {
                continue;
            }
        }
        let _ = std::fs::remove_file(host_dir.join(ALLOCATIONS_DIR).join(format!("{name}.json")));
        let _ = std::fs::remove_file(crate::allocate::limits_path(
            host_dir,
            &rec.uid,
            &rec.container,
        ));
        let _ = std::fs::remove_dir_all(host_dir.join(crate::allocate::CONTAINERS_DIR).join(name));
    }
}

/// Removes everything kept for `owner` (a pod's or a claim's uid): its records, limits files and
/// accounting directories, found by name (`<owner>_...`), so a half-made set goes too.
pub fn forget_owner(host_dir: &Path, owner: &str) {
    let prefix = format!("{owner}_");
    for sub in [
        ALLOCATIONS_DIR,
        crate::allocate::LIMITS_DIR,
        crate::allocate::CONTAINERS_DIR,
    ] {
        let Ok(entries) = std::fs::read_dir(host_dir.join(sub)) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            if !e.file_name().to_string_lossy().starts_with(&prefix) {
                continue;
            }
            let path = e.path();
            // Not followed: a container's directory is the container's to fill.
            let _ = match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
                _ => std::fs::remove_file(&path),
            };
        }
    }
}

/// All readable allocation records.
pub fn read_records(host_dir: &Path) -> Vec<AllocationRecord> {
    let Ok(entries) = std::fs::read_dir(host_dir.join(ALLOCATIONS_DIR)) else {
        return Vec::new();
    };
    let mut out: Vec<AllocationRecord> = entries
        .filter_map(Result::ok)
        .filter_map(|e| std::fs::read(e.path()).ok())
        .filter_map(|b| serde_json::from_slice(&b).ok())
        .collect();
    out.sort_by(|a, b| (&a.uid, &a.container).cmp(&(&b.uid, &b.container)));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::{Duration, SystemTime};

    fn write(host: &Path, uid: &str) {
        let rec = AllocationRecord {
            uid: uid.into(),
            namespace: "ns".into(),
            pod: "p".into(),
            container: "main".into(),
            devices: Vec::new(),
            claim: None,
        };
        std::fs::create_dir_all(host.join(ALLOCATIONS_DIR)).unwrap();
        std::fs::write(
            host.join(ALLOCATIONS_DIR).join(format!("{uid}_main.json")),
            serde_json::to_vec(&rec).unwrap(),
        )
        .unwrap();
        std::fs::create_dir_all(
            host.join(crate::allocate::CONTAINERS_DIR)
                .join(format!("{uid}_main")),
        )
        .unwrap();
    }

    /// A record written after the LIST began belongs to a pod that list could not show yet: the
    /// sweep after that list keeps it; an older record of a pod the list did not show goes.
    #[test]
    fn a_sweep_keeps_what_was_allocated_after_its_list_began() {
        let host = tempfile::tempdir().unwrap();
        write(host.path(), "new");
        let before = SystemTime::now() - Duration::from_secs(10);
        forget_pods_listed_at(host.path(), |_| false, Some(before));
        assert_eq!(read_records(host.path()).len(), 1);
        let after = SystemTime::now() + Duration::from_secs(10);
        forget_pods_listed_at(host.path(), |_| false, Some(after));
        assert!(read_records(host.path()).is_empty());
        assert!(!host
            .path()
            .join(crate::allocate::CONTAINERS_DIR)
            .join("new_main")
            .exists());
    }
}
