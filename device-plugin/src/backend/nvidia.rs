//! NVIDIA GPUs through NVML (nvml-wrapper, loaded at run time from `--nvml-lib` or the system's
//! `libnvidia-ml.so.1`).

use super::{BackendError, DeviceBackend, Gpu, HealthEvent};
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

impl DeviceBackend for NvidiaBackend {
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
            });
        }
        Ok(out)
    }

    fn utilization(&self, index: u32) -> Option<u32> {
        let d = self.nvml.device_by_index(index).ok()?;
        d.utilization_rates().ok().map(|u| u.gpu)
    }

    fn watch_health(&self, tx: UnboundedSender<HealthEvent>) {
        let lost = |reason: String| {
            let _ = tx.send(HealthEvent::AllLost { reason });
        };
        let mut set = match self.nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => return lost(format!("nvmlEventSetCreate: {e}")),
        };
        let count = self.nvml.device_count().unwrap_or(0);
        for index in 0..count {
            let Ok(d) = self.nvml.device_by_index(index) else {
                continue;
            };
            set = match d.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                Ok(s) => s,
                // Some boards do not support XID events; the set is released on error.
                Err(e) => {
                    tracing::warn!(index, error = %e.error, "XID events not supported; health not watched");
                    match self.nvml.create_event_set() {
                        Ok(s) => s,
                        Err(e) => return lost(format!("nvmlEventSetCreate: {e}")),
                    }
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
                        Err(e) => tracing::warn!(xid, error = %e, "XID on a device without a UUID"),
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(e) => return lost(format!("nvmlEventSetWait: {e}")),
            }
        }
    }
}
