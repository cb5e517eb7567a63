//! NVIDIA GPUs through NVML (nvml-wrapper, loaded at run time from `--nvml-lib` or the system's
//! `libnvidia-ml.so.1`).

use super::{BackendError, DeviceBackend, Gpu, HealthEvent, ProbeError};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::event::EventData;
use nvml_wrapper::Nvml;
use tokio::sync::mpsc::UnboundedSender;

/// The default library name, resolved by the dynamic loader.
pub const DEFAULT_LIB: &str = "libnvidia-ml.so.1";

/// How long one event wait blocks: short enough to notice a closed channel and to report an XID well
/// within a second.
const WAIT_MS: u32 = 200;

/// Pause after a failed wait before the event set is made again (a failed wait returns at once:
/// without a pause the thread would spin).
const REOPEN_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// NVML errors that say the device itself is gone, not that one call failed: nvml.h documents
/// `NVML_ERROR_GPU_IS_LOST` ("fallen off the bus or otherwise inaccessible"),
/// `NVML_ERROR_RESET_REQUIRED` and `NVML_ERROR_NOT_FOUND` (no device with that UUID).
fn device_gone(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::GpuLost | NvmlError::ResetRequired | NvmlError::NotFound
    )
}

/// NVML-backed devices.
pub struct NvidiaBackend {
    nvml: Nvml,
}

impl NvidiaBackend {
    /// Loads NVML from `lib` (a path or a library name) and initialises it.
    pub fn load(lib: Option<&str>) -> Result<Self, BackendError> {
        let path = lib.unwrap_or(DEFAULT_LIB);
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new(path))
            .init()
            .map_err(|source| BackendError::NvmlInit {
                lib: path.to_string(),
                source,
            })?;
        Ok(Self { nvml })
    }
}

fn nvml_err(call: &'static str, index: u32) -> impl FnOnce(NvmlError) -> BackendError {
    move |source| BackendError::Nvml {
        call,
        index,
        source,
    }
}

/// `NVML_NVLINK_MAX_LINKS` of nvml.h.
const NVLINK_MAX_LINKS: u32 = 18;

/// The remote PCI bus id of each active NVLink of `d`, over links 0..`NVML_NVLINK_MAX_LINKS` (18,
/// nvml.h) as HAMi reads them (`pkg/device/nvidia/links.go`): a device without NVLink answers
/// `NVML_ERROR_NOT_SUPPORTED` at link 0, which ends the walk with none.
fn nvlink_peers(d: &nvml_wrapper::Device<'_>) -> Vec<String> {
    let mut peers = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        let l = d.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {
                if let Ok(p) = l.remote_pci_info() {
                    peers.push(p.bus_id);
                }
            }
            Ok(false) => {}
            Err(_) => break,
        }
    }
    peers
}

impl DeviceBackend for NvidiaBackend {
    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn vendor(&self) -> &'static str {
        "nvidia"
    }

    fn devices(&self) -> Result<Vec<Gpu>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(nvml_err("nvmlDeviceGetCount", 0))?;
        let mut out = Vec::with_capacity(count as usize);
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(nvml_err("nvmlDeviceGetHandleByIndex", index))?;
            let memory = d
                .memory_info()
                .map_err(nvml_err("nvmlDeviceGetMemoryInfo", index))?;
            out.push(Gpu {
                index,
                uuid: d.uuid().map_err(nvml_err("nvmlDeviceGetUUID", index))?,
                model: d.name().map_err(nvml_err("nvmlDeviceGetName", index))?,
                memory_mib: memory.total >> 20,
                pci_bus_id: d.pci_info().ok().map(|p| p.bus_id),
                // Not supported on single-socket machines and older drivers: no hint then.
                numa: d.numa_node_id().ok(),
                // Not supported on pre-Ampere cards: no MIG.
                mig: d.mig_mode().map(|m| m.current == 1).unwrap_or(false),
                nvlink_peers: nvlink_peers(&d),
            });
        }
        Ok(out)
    }

    fn utilization(&self, index: u32) -> Option<u32> {
        let d = self.nvml.device_by_index(index).ok()?;
        d.utilization_rates().ok().map(|u| u.gpu)
    }

    fn watch_health(&self, tx: UnboundedSender<HealthEvent>) {
        // Like the NVIDIA device plugin, a failed wait reports every device (events may have been
        // missed); unlike it, the thread does not stay on a set that failed: it pauses, makes a new
        // set and registers again, so XIDs are seen again once NVML answers.
        while !tx.is_closed() {
            if let Err(reason) = self.watch_once(&tx) {
                let _ = tx.send(HealthEvent::EventsLost { reason });
                std::thread::sleep(REOPEN_PAUSE);
            }
        }
    }

    fn probe(&self, gpu: &Gpu) -> Result<(), ProbeError> {
        let fail = |call: &str, e: NvmlError| ProbeError {
            lost: device_gone(&e),
            message: format!("{call} on {}: {e}", gpu.uuid),
        };
        let d = self
            .nvml
            .device_by_uuid(gpu.uuid.as_str())
            .map_err(|e| fail("nvmlDeviceGetHandleByUUID", e))?;
        d.memory_info()
            .map_err(|e| fail("nvmlDeviceGetMemoryInfo", e))?;
        Ok(())
    }
}

impl NvidiaBackend {
    /// One event set's life: create, register every device for critical XIDs, wait until `tx`
    /// closes (`Ok`) or NVML fails (`Err` with the reason).
    fn watch_once(&self, tx: &UnboundedSender<HealthEvent>) -> Result<(), String> {
        let mut set = self
            .nvml
            .create_event_set()
            .map_err(|e| format!("nvmlEventSetCreate: {e}"))?;
        let count = self
            .nvml
            .device_count()
            .map_err(|e| format!("nvmlDeviceGetCount: {e}"))?;
        for index in 0..count {
            let d = match self.nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    // Its probe tells the health loop whether it is gone.
                    tracing::warn!(index, error = %e, "no handle for XID events");
                    continue;
                }
            };
            set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => s,
                // Some boards do not support XID events; the set is released on error.
                Err(e) => {
                    tracing::warn!(index, error = %e.error, "XID events not supported; health not watched");
                    self.nvml
                        .create_event_set()
                        .map_err(|e| format!("nvmlEventSetCreate: {e}"))?
                }
            };
        }
        while !tx.is_closed() {
            match set.wait(WAIT_MS) {
                Ok(EventData {
                    device, event_data, ..
                }) => {
                    let xid = match event_data {
                        Some(nvml_wrapper::enums::event::XidError::Value(v)) => v,
                        _ => 999,
                    };
                    match device.uuid() {
                        Ok(uuid) => {
                            let _ = tx.send(HealthEvent::Xid { uuid, xid });
                        }
                        // The NVIDIA plugin marks every device then; so do we.
                        Err(e) => return Err(format!("XID {xid} on a device without a UUID: {e}")),
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => return Err(format!("nvmlEventSetWait: {e}")),
            }
        }
        Ok(())
    }
}
