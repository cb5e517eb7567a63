//! AMD and Hygon DCU cards read from sysfs, the way the amdgpu driver exposes them: no vendor library.
//!
//! For each `<root>/class/drm/card<N>/device/` whose `vendor` is AMD (`0x1002`) or Hygon (`0x1d94`):
//! `mem_info_vram_total` (bytes), `unique_id` (hex, the card's serial; the UUID is `DCU-<unique_id>`),
//! `product_name` (optional), `numa_node` (`-1` when none) and the PCI address as the `device` link's
//! target name. Connector entries (`card0-DP-1`) are skipped. The root is `--sysfs-root` (default
//! `/sys`), so tests lay out a directory tree instead of a card.

use super::{BackendError, DeviceBackend, Gpu, HealthEvent};
use std::path::{Path, PathBuf};
use tokio::sync::mpsc::UnboundedSender;

/// PCI vendor ids of the cards this backend advertises.
pub const VENDORS: [&str; 2] = ["0x1002", "0x1d94"];

/// DCU cards from sysfs.
pub struct DcuBackend {
    root: PathBuf,
}

impl DcuBackend {
    /// A backend reading `<root>/class/drm`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

fn read(path: &Path) -> Result<String, BackendError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|source| BackendError::Sysfs {
            path: path.display().to_string(),
            source,
        })
}

impl DeviceBackend for DcuBackend {
    fn vendor(&self) -> &'static str {
        "dcu"
    }

    fn devices(&self) -> Result<Vec<Gpu>, BackendError> {
        let drm = self.root.join("class/drm");
        let entries = std::fs::read_dir(&drm).map_err(|source| BackendError::Sysfs {
            path: drm.display().to_string(),
            source,
        })?;
        let mut cards: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let n: u32 = name.strip_prefix("card")?.parse().ok()?;
                Some((n, e.path().join("device")))
            })
            .collect();
        cards.sort();
        let mut out = Vec::new();
        for (_, dev) in cards {
            let Ok(vendor) = read(&dev.join("vendor")) else {
                continue;
            };
            if !VENDORS.contains(&vendor.to_ascii_lowercase().as_str()) {
                continue;
            }
            let vram_path = dev.join("mem_info_vram_total");
            let vram = read(&vram_path)?;
            let bytes: u64 = vram.parse().map_err(|_| BackendError::SysfsValue {
                path: vram_path.display().to_string(),
                message: format!("{vram:?} is not a byte count"),
            })?;
            let uid_path = dev.join("unique_id");
            let uid = read(&uid_path)?;
            if uid.is_empty() {
                return Err(BackendError::SysfsValue {
                    path: uid_path.display().to_string(),
                    message: "empty unique id".into(),
                });
            }
            let numa = read(&dev.join("numa_node"))
                .ok()
                .and_then(|s| s.parse::<i64>().ok())
                .and_then(|n| u32::try_from(n).ok());
            let pci_bus_id = std::fs::canonicalize(&dev)
                .ok()
                .and_then(|p| p.file_name().map(|f| f.to_string_lossy().into_owned()))
                .filter(|s| s.contains(':'));
            out.push(Gpu {
                index: out.len() as u32,
                uuid: format!("DCU-{uid}"),
                model: read(&dev.join("product_name")).unwrap_or_else(|_| "DCU".into()),
                memory_mib: bytes >> 20,
                pci_bus_id,
                numa,
                mig: false,
            });
        }
        Ok(out)
    }

    fn utilization(&self, index: u32) -> Option<u32> {
        // amdgpu's `gpu_busy_percent`, in the same card order as `devices`.
        let gpus = self.devices().ok()?;
        let _ = gpus.get(index as usize)?;
        let drm = self.root.join("class/drm");
        let mut cards: Vec<u32> = std::fs::read_dir(&drm)
            .ok()?
            .filter_map(Result::ok)
            .filter_map(|e| {
                e.file_name()
                    .into_string()
                    .ok()?
                    .strip_prefix("card")?
                    .parse()
                    .ok()
            })
            .collect();
        cards.sort();
        cards.into_iter().find_map(|n| {
            let dev = drm.join(format!("card{n}/device"));
            let uid = read(&dev.join("unique_id")).ok()?;
            if format!("DCU-{uid}") != gpus[index as usize].uuid {
                return None;
            }
            read(&dev.join("gpu_busy_percent")).ok()?.parse().ok()
        })
    }

    fn watch_health(&self, _tx: UnboundedSender<HealthEvent>) {
        // sysfs has no event source for card errors; DCU devices stay as discovered.
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn card(root: &Path, n: u32, vendor: &str, vram: &str, uid: &str, numa: &str) {
        let dev = root.join(format!("class/drm/card{n}/device"));
        std::fs::create_dir_all(&dev).unwrap();
        for (f, v) in [
            ("vendor", vendor),
            ("mem_info_vram_total", vram),
            ("unique_id", uid),
            ("numa_node", numa),
            ("gpu_busy_percent", "37"),
        ] {
            std::fs::write(dev.join(f), format!("{v}\n")).unwrap();
        }
    }

    #[test]
    fn reads_cards_skips_other_vendors_and_connectors() {
        let t = tempfile::tempdir().unwrap();
        card(t.path(), 1, "0x1d94", "17163091968", "abcd0001", "1");
        card(t.path(), 0, "0x1002", "34359738368", "abcd0000", "-1");
        card(t.path(), 2, "0x10de", "1024", "x", "0");
        std::fs::create_dir_all(t.path().join("class/drm/card0-DP-1")).unwrap();
        let b = DcuBackend::new(t.path());
        let gpus = b.devices().unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].uuid, "DCU-abcd0000");
        assert_eq!(gpus[0].memory_mib, 32768);
        assert_eq!(gpus[0].numa, None);
        assert_eq!(gpus[1].index, 1);
        assert_eq!(gpus[1].memory_mib, 16368);
        assert_eq!(gpus[1].numa, Some(1));
        assert_eq!(b.utilization(1), Some(37));
        assert_eq!(b.vendor(), "dcu");
    }

    #[test]
    fn bad_vram_names_the_file() {
        let t = tempfile::tempdir().unwrap();
        card(t.path(), 0, "0x1002", "lots", "u", "0");
        let e = DcuBackend::new(t.path()).devices().unwrap_err().to_string();
        assert!(
            e.contains("mem_info_vram_total") && e.contains("lots"),
            "{e}"
        );
    }
}
