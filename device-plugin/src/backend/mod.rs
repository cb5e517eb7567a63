//! Where GPUs come from: a [`DeviceBackend`] enumerates a node's devices, reports their health and
//! utilization. Two implementations: [`nvidia::NvidiaBackend`] (NVML through nvml-wrapper) and
//! [`dcu::DcuBackend`] (AMD/Hygon DCU cards from sysfs, no vendor library).

pub mod dcu;
pub mod nvidia;

use thiserror::Error;
use tokio::sync::mpsc::UnboundedSender;

/// One physical GPU as a backend found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Index as the vendor library numbers it.
    pub index: u32,
    /// Vendor UUID (`GPU-…` for NVIDIA).
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Device memory in MiB, unscaled.
    pub memory_mib: u64,
    /// PCI bus id, when known.
    pub pci_bus_id: Option<String>,
    /// NUMA node, when the platform reports one.
    pub numa: Option<u32>,
    /// MIG mode enabled (such a card is advertised whole-card only by the NVIDIA plugin; we skip it).
    pub mig: bool,
    /// PCI bus id at the other end of each active NVLink (one entry per link).
    pub nvlink_peers: Vec<String>,
}

/// A health report from a backend's event source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HealthEvent {
    /// An XID on the device with this UUID (critical or not: the health loop filters).
    Xid {
        /// Device UUID.
        uuid: String,
        /// The XID code.
        xid: u64,
    },
    /// A device-specific failure that is not an XID (a DCU's uncorrectable RAS errors rising, a
    /// card gone from sysfs): the device turns Unhealthy.
    Failed {
        /// Device UUID.
        uuid: String,
        /// What was seen.
        reason: String,
    },
    /// The event source itself failed (the wait returned an error other than a timeout): events may
    /// have been missed on any device. The health loop probes every device.
    EventsLost {
        /// Why.
        reason: String,
    },
}

/// A device did not answer a health probe.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{message}")]
pub struct ProbeError {
    /// The device is gone (NVML_ERROR_GPU_IS_LOST, a reset is required, the card left sysfs): it
    /// turns Unhealthy at once. Otherwise the failure may be transient (a timeout, an unknown
    /// error), and only a run of them turns the device Unhealthy.
    pub lost: bool,
    /// What failed.
    pub message: String,
}

/// Why a backend call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BackendError {
    /// NVML could not be loaded or initialised.
    #[error("loading NVML from {lib}: {source}")]
    NvmlInit {
        /// Library path tried.
        lib: String,
        /// The NVML error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// An NVML call failed.
    #[error("NVML {call} on device {index}: {source}")]
    Nvml {
        /// Which call.
        call: &'static str,
        /// Device index.
        index: u32,
        /// The NVML error.
        #[source]
        source: nvml_wrapper::error::NvmlError,
    },
    /// A sysfs file could not be read.
    #[error("reading {path}: {source}")]
    Sysfs {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file held something unexpected.
    #[error("{path}: {message}")]
    SysfsValue {
        /// The file.
        path: String,
        /// What was wrong.
        message: String,
    },
}

/// A source of GPUs.
pub trait DeviceBackend: Send + Sync + 'static {
    /// Vendor tag written into the node inventory (`nvidia`, `dcu`).
    fn vendor(&self) -> &'static str;

    /// All devices, in index order.
    fn devices(&self) -> Result<Vec<Gpu>, BackendError>;

    /// The kernel driver's version (NVML's `nvmlSystemGetDriverVersion`), when the backend can
    /// tell: a device attribute in DRA mode.
    fn driver_version(&self) -> Option<String> {
        None
    }

    /// Compute utilization in percent of device `index`, when the backend can tell.
    fn utilization(&self, index: u32) -> Option<u32>;

    /// Reports health events on `tx` until `tx` is closed. Blocking: run it on its own thread. A
    /// backend without an event source returns at once.
    fn watch_health(&self, tx: UnboundedSender<HealthEvent>);

    /// Asks the device whether it answers, the way a workload would find out (NVML: a handle by
    /// UUID and a memory query). Blocking. The default looks the device up in [`Self::devices`].
    fn probe(&self, gpu: &Gpu) -> Result<(), ProbeError> {
        match self.devices() {
            Ok(list) if list.iter().any(|g| g.uuid == gpu.uuid) => Ok(()),
            Ok(_) => Err(ProbeError {
                lost: true,
                message: format!("{} is no longer listed", gpu.uuid),
            }),
            Err(e) => Err(ProbeError {
                lost: false,
                message: e.to_string(),
            }),
        }
    }
}

/// XIDs that are the application's fault, not the device's; the NVIDIA device plugin ignores the
/// same list: 13 (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped
/// processing), 45 (preemptive cleanup), 68 (video processor exception), 109 (context switch timeout).
pub const IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Whether an XID marks the device unhealthy.
pub fn is_critical_xid(xid: u64) -> bool {
    !IGNORED_XIDS.contains(&xid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_xids() {
        for x in IGNORED_XIDS {
            assert!(!is_critical_xid(x));
        }
        for x in [48, 63, 64, 74, 79, 94, 95, 999] {
            assert!(is_critical_xid(x), "{x}");
        }
    }
}
