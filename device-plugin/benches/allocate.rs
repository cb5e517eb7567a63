#![allow(missing_docs)] // criterion_group! generates undocumented items.
#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Allocate latency with 500 pending vGPU pods cached on the node, over real gRPC on a unix socket.
//! `cargo bench -p vgpu-device-plugin --bench allocate`
//!
//! Baselines in the same run: GetDevicePluginOptions over the same socket (the transport alone) and
//! the matcher alone in process (`PodCache::claim` over the same 500 pods).
//!
//! The `stage_*` benchmarks break one Allocate down into the steps `Shared::allocate_container`
//! takes, each alone and in process: checking the IDs, the matcher, creating the container's
//! directory, writing the allocation record, building the answer; `allocate_in_process` is the
//! whole handler without gRPC. `dra_prepare_in_process` is DRA mode's counterpart of that: a
//! claim already read (its allocation on GPU 3, 4 GiB and 25 %), this node's share of it, the same
//! host files, the CDI spec and the checkpoint (`Dra::prepare_allocated`).

use criterion::{criterion_group, criterion_main, Criterion};
use std::time::{Duration, Instant};
use vgpu_core::assignment::{ContainerAssignment, DeviceSlice, PodAssignment};
use vgpu_device_plugin::api;
use vgpu_device_plugin::api::device_plugin_client::DevicePluginClient;
use vgpu_device_plugin::api::device_plugin_server::DevicePluginServer;
use vgpu_device_plugin::backend::Gpu;
use vgpu_device_plugin::devices::{DeviceState, Shape};
use vgpu_device_plugin::plugin::{Service, Settings, Shared};
use vgpu_device_plugin::pods::{PodCache, PodEntry};

const PODS: usize = 500;
const GPUS: u32 = 8;

fn uuid(i: u32) -> String {
    format!("GPU-{i:08}-0000-0000-0000-000000000000")
}

fn pod(i: usize) -> PodEntry {
    let g = (i as u32) % GPUS;
    PodEntry {
        uid: format!("uid-{i:04}"),
        namespace: "bench".into(),
        name: format!("pod-{i:04}"),
        created: i as i64,
        pending: true,
        assignment: Ok(PodAssignment::new(
            "node",
            vec![ContainerAssignment {
                name: "main".into(),
                devices: vec![DeviceSlice {
                    uuid: uuid(g),
                    memory_mib: 4096,
                    cores: 25,
                    exclusive: false,
                }],
            }],
        )),
        allocated: Vec::new(),
        settings: Default::default(),
    }
}

fn fill(cache: &mut PodCache) {
    for i in 0..PODS {
        cache.upsert(pod(i));
    }
}

/// Untimed: replaces the oldest pod on GPU 3 (the one each Allocate matches) with a new pod of a
/// new uid, so every timed Allocate creates a new container directory and a new record file, as
/// on a node.
fn fresh_pod3(shared: &Shared, n: &mut u64) {
    *n += 1;
    let mut p = pod(3);
    p.uid = format!("uid-0003-{n}");
    shared.with_pods(|c| {
        c.remove(&format!("uid-0003-{}", *n - 1));
        c.remove("uid-0003");
        c.upsert(p);
    });
    if n.is_multiple_of(1000) {
        // Keep the directories as small as a node's.
        vgpu_device_plugin::records::forget_pods(&shared.settings.host_dir, |_| false);
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let gpus = (0..GPUS)
        .map(|i| Gpu {
            index: i,
            uuid: uuid(i),
            model: "A100".into(),
            memory_mib: 40960,
            pci_bus_id: None,
            numa: Some(0),
            mig: false,
            nvlink_peers: Vec::new(),
        })
        .collect();
    let shared = Shared::new(
        Settings {
            node_name: "node".into(),
            shape: Shape {
                split: 10,
                memory_scaling: 1.0,
                core_scaling: 1.0,
            },
            host_dir: tmp.path().join("host"),
            allow_unscheduled: false,
            core_policy: Default::default(),
            disable_control_namespaces: Vec::new(),
            pod_resources: None,
        },
        DeviceState::new(gpus, "nvidia"),
        None,
    );
    shared.with_pods(fill);
    let sock = tmp.path().join("plugin.sock");
    let listener = rt
        .block_on(async { tokio::net::UnixListener::bind(&sock) })
        .unwrap();
    let svc = DevicePluginServer::new(Service(shared.clone()));
    rt.spawn(
        tonic::transport::Server::builder()
            .add_service(svc)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
    let channel = rt
        .block_on(vgpu_device_plugin::unix::connect_unix(&sock))
        .unwrap();
    let mut client = DevicePluginClient::new(channel);

    let mut group = c.benchmark_group("allocate");
    group.measurement_time(Duration::from_secs(4));
    group.sample_size(30);
    group.bench_function("baseline_get_options_rpc", |b| {
        b.iter(|| {
            rt.block_on(client.get_device_plugin_options(api::Empty {}))
                .unwrap()
        })
    });
    // The matcher alone: claim the pod on GPU 3 among 500, then forget the answer (untimed).
    let mut cache = PodCache::default();
    fill(&mut cache);
    let ids = vec![format!("{}::0", uuid(3))];
    group.bench_function("matcher_only_500_pods", |b| {
        b.iter_custom(|n| {
            let mut total = Duration::ZERO;
            for _ in 0..n {
                let t = Instant::now();
                let claim = cache.claim(&ids, None).unwrap();
                total += t.elapsed();
                cache.remove(&claim.uid);
                cache.upsert(pod(claim.uid[4..].parse().unwrap()));
            }
            total
        })
    });
    // Stages of one Allocate, each alone.
    let ids_ref = ids.clone();
    group.bench_function("stage_check_ids", |b| {
        b.iter(|| shared.with_devices(|d| ids_ref.iter().all(|id| d.knows(id))))
    });
    let claim = cache.claim(&ids, None).unwrap();
    let host = tmp.path().join("host");
    let mut n = 0u64;
    group.bench_function("stage_create_container_dir", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let dir =
                    vgpu_device_plugin::allocate::container_dir(&host, &format!("u{n}"), "main");
                let t = Instant::now();
                std::fs::create_dir_all(&dir).unwrap();
                total += t.elapsed();
                std::fs::remove_dir(&dir).unwrap();
            }
            total
        })
    });
    group.bench_function("stage_write_allocation_record", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let mut c = claim.clone();
                c.uid = format!("u{n}");
                let t = Instant::now();
                vgpu_device_plugin::records::record_allocation(&host, &c);
                total += t.elapsed();
            }
            // Untimed: leave the directory as small as a node's.
            vgpu_device_plugin::records::forget_pods(&host, |u| !u.starts_with('u'));
            total
        })
    });
    group.bench_function("stage_build_answer", |b| {
        b.iter(|| {
            vgpu_device_plugin::allocate::assigned(
                &host,
                &claim.uid,
                &claim.container,
                &Default::default(),
            )
        })
    });
    group.bench_function("allocate_in_process_500_pods_cached", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                fresh_pod3(&shared, &mut n);
                let t = Instant::now();
                let r = rt.block_on(shared.allocate_container(&ids)).unwrap();
                total += t.elapsed();
                assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
            }
            total
        })
    });
    // DRA mode: prepare a claim already read from the API.
    let dra = vgpu_device_plugin::dra::prepare::Dra::new(
        shared.clone(),
        None,
        vgpu_device_plugin::dra::prepare::DraSettings {
            cdi_dir: tmp.path().join("cdi"),
            gpu_cdi_kind: None,
        },
    );
    let allocated: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "bench"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [{
                "consumedCapacity": {"cores": "25", "memory": "4Gi"}, "device": "gpu-3",
                "driver": "gpu.vgpu.io", "pool": "node", "request": "gpu",
                "shareID": "08694b24-5a9b-4f62-9c0d-133cefcb1b26"}]}}}
        }))
        .unwrap();
    group.bench_function("dra_prepare_in_process", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let c = vgpu_device_plugin::dra::api_v1::Claim {
                    namespace: "bench".into(),
                    uid: format!("claim-{n}"),
                    name: "c".into(),
                };
                let t = Instant::now();
                let devices = dra.prepare_allocated(&c, &allocated).unwrap();
                total += t.elapsed();
                assert_eq!(devices.len(), 1);
                // Untimed: as the kubelet would once the pod is gone.
                dra.unprepare_one(&c.uid).unwrap();
            }
            total
        })
    });
    // The whole Allocate RPC: match, create the container dir, write the record, answer.
    let req = api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.clone(),
        }],
    };
    group.bench_function("allocate_rpc_500_pods_cached", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                fresh_pod3(&shared, &mut n);
                let t = Instant::now();
                let r = rt.block_on(client.allocate(req.clone())).unwrap();
                total += t.elapsed();
                assert_eq!(r.get_ref().container_responses.len(), 1);
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
