//! Resident memory of the extender's cache at scale: 5000 nodes x 8 GPUs with 20 000 vGPU pods
//! (what the cache held before the host terms), then the same with every pod's CPU and memory
//! counted as well, for 150 000 pods in all. Prints VmRSS growth of each, measured in this
//! process (the cache only; the watch streams objects page by page and drops them).
//!
//! `cargo run --release -p vgpu-scheduler --example cache_memory` (each case runs in a process of
//! its own, so that one's freed memory does not hide the other's).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;
use vgpu_core::assignment::{ContainerAssignment, DeviceSlice, PodAssignment};
use vgpu_core::inventory::{DeviceInfo, NodeInventory};
use vgpu_core::placement::host::{HostLeft, HostRequest};
use vgpu_scheduler::cache::Cluster;

const NODES: usize = 5000;
const GPUS: u32 = 8;
const VGPU_PODS: usize = 20_000;
const ALL_PODS: usize = 150_000;

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap()
}

fn uid(i: usize) -> String {
    // UIDs are 36-character strings in a real cluster.
    format!("{:08x}-0000-4000-8000-{:012x}", i, i * 7919)
}

/// The cluster with its vGPU pods; with `hosts`, every pod's request counted too.
fn build(hosts: bool) -> Cluster {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = vgpu_core::time::format_rfc3339(vgpu_scheduler::server::unix_now());
    for n in 0..NODES {
        let name = format!("node-{n:05}");
        let devices = (0..GPUS)
            .map(|i| DeviceInfo {
                uuid: format!("GPU-{n:05}-{i}-0000-0000-000000000000"),
                index: i,
                model: "NVIDIA A10".into(),
                memory_mib: 24576,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect();
        c.apply_node(
            &name,
            Some(&NodeInventory::new(devices).encode()),
            Some(&hb),
            None,
        );
        if hosts {
            let alloc = HostLeft {
                cpu_milli: 96_000,
                mem_mib: 786_432,
                model: 0,
            };
            c.apply_allocatable(&name, Some(alloc));
        }
    }
    for p in 0..ALL_PODS {
        let n = p % NODES;
        let node = format!("node-{n:05}");
        let host = HostRequest {
            cpu_milli: 500 * (1 + (p % 8) as u64),
            mem_mib: 1024 * (1 + (p % 16) as u64),
        };
        if hosts {
            c.apply_pod_host(&uid(p), Some(&node), host, false);
        }
        if p < VGPU_PODS {
            let a = PodAssignment::new(
                &node,
                vec![ContainerAssignment {
                    name: "main".into(),
                    devices: vec![DeviceSlice {
                        uuid: format!("GPU-{n:05}-{}-0000-0000-000000000000", p % 8),
                        memory_mib: 2048,
                        cores: 10,
                        exclusive: false,
                    }],
                }],
            );
            c.apply_pod(&uid(p), Some(&node), Some(a), false);
        }
    }
    c
}

fn main() {
    let Some(case) = std::env::args().nth(1) else {
        let me = std::env::current_exe().unwrap();
        for case in ["vgpu-only", "all-pods"] {
            let st = std::process::Command::new(&me).arg(case).status().unwrap();
            assert!(st.success());
        }
        return;
    };
    let hosts = case == "all-pods";
    let before = rss_kib();
    let c = build(hosts);
    let after = rss_kib();
    println!(
        "{}: {} vGPU pods placed, cache {:.1} MiB resident",
        if hosts {
            "vGPU pods + every pod's CPU and memory (150 000 pods)"
        } else {
            "vGPU pods only (20 000), as before the host terms"
        },
        c.placed_pods(),
        after.saturating_sub(before) as f64 / 1024.0
    );
}
