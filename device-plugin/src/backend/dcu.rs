//! AMD and Hygon DCU cards read from sysfs, the way the amdgpu driver exposes them: no vendor library.
//!
//! For each `<root>/class/drm/card<N>/device/` whose `vendor` is AMD (`0x1002`) or Hygon (`0x1d94`):
//! `mem_info_vram_total` (bytes), `unique_id` (hex, the card's serial; the UUID is `DCU-<unique_id>`),
//! `product_name` (optional), `numa_node` (`-1` when none) and the PCI address as the `device` link's
//! target name. Connector entries (`card0-DP-1`) are skipped. The root is `--sysfs-root` (default
//! `/sys`), so tests lay out a directory tree instead of a card.
//!
//! Health: sysfs has no event source, so a thread polls every [`POLL`]. A card whose directory or
//! `unique_id` disappears (hot unplug, driver unbind) is reported failed; so is a card whose
//! uncorrectable RAS error count rises: amdgpu writes `ue: <n>` / `ce: <n>` into
//! `device/ras/<block>_err_count` (umc, gfx, sdma, ...) when RAS is enabled. Correctable counts
//! (`ce`) are not failures. A card without `ras/` is watched for presence only.

use super::{BackendError, DeviceBackend, Gpu, HealthEvent, ProbeError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// How often the health thread reads sysfs.
pub const POLL: Duration = Duration::from_millis(500);

/// PCI vendor ids of the cards this backend advertises.
pub const VENDORS: [&str; 2] = ["0x1002", "0x1d94"];

/// DCU cards from sysfs.
pub struct DcuBackend {
    root: PathBuf,
}

/// Every card's state when health watching began: what later polls are compared with.
pub struct HealthBaseline(Vec<Watched>);

impl HealthBaseline {
    /// Polls every [`POLL`] and sends what changed since the last look, until `tx` is closed.
    pub fn poll_until_closed(mut self, tx: &UnboundedSender<HealthEvent>) {
        while !tx.is_closed() {
            std::thread::sleep(POLL);
            for w in &mut self.0 {
                for ev in w.poll() {
                    let _ = tx.send(ev);
                }
            }
        }
    }
}

impl DcuBackend {
    /// Reads every card's presence and RAS error counts: the state health watching compares
    /// later polls with (an error counted before this is not a new failure).
    pub fn health_baseline(&self) -> Result<HealthBaseline, BackendError> {
        let watched = self
            .cards()?
            .into_iter()
            .map(|(dev, gpu)| Watched {
                ue: ras_uncorrectable(&dev),
                present: true,
                expected_uid: gpu.uuid.strip_prefix("DCU-").unwrap_or("").to_string(),
                uuid: gpu.uuid,
                dev,
            })
            .collect();
        Ok(HealthBaseline(watched))
    }

    /// A backend reading `<root>/class/drm`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The cards with their `device` directories, in card order.
    fn cards(&self) -> Result<Vec<(PathBuf, Gpu)>, BackendError> {
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
            let gpu = Gpu {
                index: out.len() as u32,
                uuid: format!("DCU-{uid}"),
                model: read(&dev.join("product_name")).unwrap_or_else(|_| "DCU".into()),
                memory_mib: bytes >> 20,
                pci_bus_id,
                numa,
                mig: false,
                nvlink_peers: Vec::new(),
            };
            out.push((dev, gpu));
        }
        Ok(out)
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
        Ok(self.cards()?.into_iter().map(|(_, g)| g).collect())
    }

    fn utilization(&self, index: u32) -> Option<u32> {
        // amdgpu's `gpu_busy_percent`, in the same card order as `devices`.
        let cards = self.cards().ok()?;
        let (dev, _) = cards.get(index as usize)?;
        read(&dev.join("gpu_busy_percent")).ok()?.parse().ok()
    }

    fn watch_health(&self, tx: UnboundedSender<HealthEvent>) {
        match self.health_baseline() {
            Ok(baseline) => baseline.poll_until_closed(&tx),
            Err(e) => {
                let _ = tx.send(HealthEvent::EventsLost {
                    reason: e.to_string(),
                });
            }
        }
    }

    fn probe(&self, gpu: &Gpu) -> Result<(), ProbeError> {
        let cards = self.cards().map_err(|e| ProbeError {
            lost: false,
            message: e.to_string(),
        })?;
        if cards.iter().any(|(_, g)| g.uuid == gpu.uuid) {
            Ok(())
        } else {
            Err(ProbeError {
                lost: true,
                message: format!("{} is gone from sysfs", gpu.uuid),
            })
        }
    }
}

/// One card the health thread watches.
struct Watched {
    uuid: String,
    expected_uid: String,
    dev: PathBuf,
    /// Uncorrectable error count per RAS block at the last poll.
    ue: HashMap<String, u64>,
    /// Whether the card was there at the last poll (a failure is reported once per departure).
    present: bool,
}

impl Watched {
    fn poll(&mut self) -> Vec<HealthEvent> {
        let mut out = Vec::new();
        let here = read(&self.dev.join("unique_id")).is_ok_and(|u| u == self.expected_uid);
        if !here {
            if self.present {
                out.push(HealthEvent::Failed {
                    uuid: self.uuid.clone(),
                    reason: format!("{} is gone from sysfs", self.dev.display()),
                });
            }
            self.present = false;
            return out;
        }
        self.present = true;
        let now = ras_uncorrectable(&self.dev);
        for (block, n) in &now {
            let before = self.ue.get(block).copied().unwrap_or(0);
            if *n > before {
                out.push(HealthEvent::Failed {
                    uuid: self.uuid.clone(),
                    reason: format!("RAS {block}: uncorrectable errors {before} -> {n}"),
                });
            }
        }
        self.ue = now;
        out
    }
}

/// The `ue:` count of every `<dev>/ras/<block>_err_count` file (amdgpu's format: a `ue: <n>` line
/// and a `ce: <n>` line); empty without RAS.
pub fn ras_uncorrectable(dev: &Path) -> HashMap<String, u64> {
    let Ok(entries) = std::fs::read_dir(dev.join("ras")) else {
        return HashMap::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let block = name.strip_suffix("_err_count")?.to_string();
            let text = std::fs::read_to_string(e.path()).ok()?;
            let ue = text.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "ue").then(|| v.trim().parse::<u64>().ok())?
            })?;
            Some((block, ue))
        })
        .collect()
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
    fn health_polls_ras_and_presence() {
        let t = tempfile::tempdir().unwrap();
        card(t.path(), 0, "0x1d94", "1024", "c0", "0");
        card(t.path(), 1, "0x1d94", "1024", "c1", "0");
        let ras = t.path().join("class/drm/card0/device/ras");
        std::fs::create_dir_all(&ras).unwrap();
        std::fs::write(ras.join("umc_err_count"), "ue: 0\nce: 4\n").unwrap();
        std::fs::write(ras.join("features"), "feature mask: 0x3fff\n").unwrap();
        let b = DcuBackend::new(t.path());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        // The baseline is read before the files change (in a thread of its own it could read the
        // changed counts as the baseline and never report them).
        let baseline = b.health_baseline().unwrap();
        let watcher = std::thread::spawn(move || baseline.poll_until_closed(&tx));
        // The next event, within a deadline (a missed change fails the test instead of hanging it).
        let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<HealthEvent>| {
            let deadline = std::time::Instant::now() + 20 * POLL;
            loop {
                match rx.try_recv() {
                    Ok(ev) => return ev,
                    Err(e) if std::time::Instant::now() >= deadline => {
                        panic!("no health event within {:?}: {e}", 20 * POLL)
                    }
                    Err(_) => std::thread::sleep(POLL / 10),
                }
            }
        };
        // Correctable errors are not failures; an uncorrectable one is.
        std::fs::write(ras.join("umc_err_count"), "ue: 0\nce: 9\n").unwrap();
        std::fs::write(ras.join("umc_err_count"), "ue: 2\nce: 9\n").unwrap();
        assert_eq!(
            next(&mut rx),
            HealthEvent::Failed {
                uuid: "DCU-c0".into(),
                reason: "RAS umc: uncorrectable errors 0 -> 2".into()
            }
        );
        // Card 1 unbound from the driver: its directory goes.
        std::fs::remove_dir_all(t.path().join("class/drm/card1")).unwrap();
        match next(&mut rx) {
            HealthEvent::Failed { uuid, reason } => {
                assert_eq!(uuid, "DCU-c1");
                assert!(reason.contains("gone from sysfs"), "{reason}");
            }
            e => panic!("{e:?}"),
        }
        let b = DcuBackend::new(t.path());
        let gpus = b.devices().unwrap();
        assert!(b.probe(&gpus[0]).is_ok());
        let mut gone = gpus[0].clone();
        gone.uuid = "DCU-c1".into();
        assert!(b.probe(&gone).unwrap_err().lost);
        drop(rx);
        watcher.join().unwrap();
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
