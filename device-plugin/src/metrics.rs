//! `/metrics`: per-container usage read from the hook's accounting files, and per-device allocation
//! and health.
//!
//! Who a container is and which GPUs it got come from the allocation records ([`crate::records`]);
//! its usage from its accounting file, `<host-dir>/containers/<pod-uid>_<container>/vgpu.cache`.

use crate::backend::DeviceBackend;
use crate::plugin::Shared;
use crate::records::read_records;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use vgpu_core::accounting::Snapshot;

/// The accounting file's name in a container's directory.
pub const CACHE_FILE: &str = "vgpu.cache";

/// A container's labels: namespace, pod, container, device; in DRA mode also the claim (before
/// the container, which is then the claim's request).
type ContainerLabels = Vec<(&'static str, String)>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DeviceLabels {
    node: String,
    uuid: String,
}

type FGauge = Gauge<f64, AtomicU64>;

/// Renders the metrics as OpenMetrics text; `backend` adds the devices' utilization.
pub fn render(shared: &Shared, backend: Option<&dyn DeviceBackend>) -> String {
    let host_dir = &shared.settings.host_dir;
    let mut reg = Registry::default();
    let used = Family::<ContainerLabels, Gauge>::default();
    let limit = Family::<ContainerLabels, Gauge>::default();
    let peak = Family::<ContainerLabels, Gauge>::default();
    let launches = Family::<ContainerLabels, Counter>::default();
    let ooms = Family::<ContainerLabels, Counter>::default();
    let throttled = Family::<ContainerLabels, Counter<f64, AtomicU64>>::default();
    let dev_alloc = Family::<DeviceLabels, Gauge>::default();
    let dev_limit = Family::<DeviceLabels, Gauge>::default();
    let dev_cores = Family::<DeviceLabels, FGauge>::default();
    let dev_healthy = Family::<DeviceLabels, Gauge>::default();
    let dev_util = Family::<DeviceLabels, FGauge>::default();

    let records = read_records(host_dir);
    for r in &records {
        let file = host_dir
            .join(crate::allocate::CONTAINERS_DIR)
            .join(format!("{}_{}", r.uid, r.container))
            .join(CACHE_FILE);
        let snap = read_accounting(&file).and_then(|b| Snapshot::parse(&b).ok());
        for (i, d) in r.devices.iter().enumerate() {
            let mut l: ContainerLabels =
                vec![("namespace", r.namespace.clone()), ("pod", r.pod.clone())];
            if let Some(claim) = &r.claim {
                l.push(("claim", claim.clone()));
            }
            l.push(("container", r.container.clone()));
            l.push(("device", d.uuid.clone()));
            limit
                .get_or_create(&l)
                .set(i64::try_from(d.memory_mib << 20).unwrap_or(i64::MAX));
            let Some(s) = &snap else { continue };
            let peak_bytes: u64 = s
                .processes
                .iter()
                .map(|p| p.peak.get(i).copied().unwrap_or(0))
                .max()
                .unwrap_or(0);
            used.get_or_create(&l)
                .set(i64::try_from(s.used(i)).unwrap_or(i64::MAX));
            peak.get_or_create(&l)
                .set(i64::try_from(peak_bytes).unwrap_or(i64::MAX));
            // Launch, refusal and throttle meters are per process, not per device: reported on
            // the container's first device only, so that sums over devices stay right.
            if i == 0 {
                launches.get_or_create(&l).inc_by(s.launches());
                ooms.get_or_create(&l).inc_by(s.oom_refusals());
                let ns: u64 = s.processes.iter().map(|p| p.throttled_ns).sum();
                throttled.get_or_create(&l).inc_by(ns as f64 / 1e9);
            }
        }
    }
    let devices = shared.devices();
    let inv = devices.inventory(shared.settings.shape);
    for d in &inv.devices {
        let l = DeviceLabels {
            node: shared.settings.node_name.clone(),
            uuid: d.uuid.clone(),
        };
        let slices = records
            .iter()
            .flat_map(|r| &r.devices)
            .filter(|s| s.uuid == d.uuid);
        let (mib, cores) = slices.fold((0u64, 0u64), |(m, c), s| {
            (m + s.memory_mib, c + u64::from(s.cores))
        });
        dev_alloc
            .get_or_create(&l)
            .set(i64::try_from(mib << 20).unwrap_or(i64::MAX));
        dev_limit
            .get_or_create(&l)
            .set(i64::try_from(d.memory_mib << 20).unwrap_or(i64::MAX));
        dev_cores
            .get_or_create(&l)
            .set(cores as f64 / f64::from(d.cores.max(1)));
        dev_healthy.get_or_create(&l).set(i64::from(d.healthy));
        if let Some(u) = backend.and_then(|b| b.utilization(d.index)) {
            dev_util.get_or_create(&l).set(f64::from(u) / 100.0);
        }
    }
    reg.register(
        "vgpu_container_memory_used_bytes",
        "Device memory the container's processes hold now",
        used,
    );
    reg.register(
        "vgpu_container_memory_limit_bytes",
        "The container's device-memory limit",
        limit,
    );
    reg.register(
        "vgpu_container_memory_peak_bytes",
        "Largest allocation total of one of the container's processes",
        peak,
    );
    reg.register(
        "vgpu_container_kernel_launches",
        "Kernel launches by the container",
        launches,
    );
    reg.register(
        "vgpu_container_oom_refusals",
        "Allocations refused as over the limit",
        ooms,
    );
    reg.register(
        "vgpu_container_throttled_seconds",
        "Time kernel launches waited for the core limit",
        throttled,
    );
    reg.register(
        "vgpu_device_memory_allocated_bytes",
        "Device memory assigned to containers on this GPU",
        dev_alloc,
    );
    reg.register(
        "vgpu_device_memory_limit_bytes",
        "Device memory of this GPU after memory scaling",
        dev_limit,
    );
    reg.register(
        "vgpu_device_cores_allocated_ratio",
        "Core percentage assigned on this GPU over its scaled capacity",
        dev_cores,
    );
    reg.register(
        "vgpu_device_healthy",
        "1 when the GPU is healthy",
        dev_healthy,
    );
    reg.register(
        "vgpu_device_utilization_ratio",
        "Share of the last sample period the GPU was busy, as the vendor library reports it",
        dev_util,
    );
    let mut out = String::new();
    let _ = prometheus_client::encoding::text::encode(&mut out, &reg);
    out
}

/// A container's accounting file, read as a tenant-controlled file: the directory is the container's
/// to write (mode 1777), so the path may be a symlink, a FIFO or a huge sparse file. Not followed,
/// opened without blocking, a regular file only, and never more than the layout's size.
fn read_accounting(path: &std::path::Path) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut buf = Vec::with_capacity(vgpu_core::accounting::FILE_BYTES);
    file.take(vgpu_core::accounting::FILE_BYTES as u64)
        .read_to_end(&mut buf)
        .ok()?;
    Some(buf)
}

/// The `/metrics` router.
pub fn router(
    shared: std::sync::Arc<Shared>,
    backend: Option<std::sync::Arc<dyn DeviceBackend>>,
) -> axum::Router {
    use axum::http::{header, HeaderMap};
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: HeaderMap| {
            let shared = shared.clone();
            let backend = backend.clone();
            async move {
                let om = render(&shared, backend.as_deref());
                let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
                let (content_type, body) = vgpu_core::exposition::negotiate(accept, om);
                ([(header::CONTENT_TYPE, content_type)], body)
            }
        }),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What a container can put at its accounting path: read without following, blocking or
    /// reading past the layout's size.
    #[test]
    fn the_accounting_file_is_read_as_a_tenants_file() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"host data").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert_eq!(read_accounting(&link), None);
        let fifo = dir.path().join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success());
        // A FIFO nobody writes: returns at once (a blocking read would hang this test).
        assert_eq!(read_accounting(&fifo), None);
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        assert_eq!(
            read_accounting(&big).map(|b| b.len()),
            Some(vgpu_core::accounting::FILE_BYTES)
        );
    }
}
