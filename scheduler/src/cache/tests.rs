//! The cache's tests: assume, forget, heartbeats, placement through the dense copy.
#![allow(clippy::unwrap_used)]
use super::*;
use vgpu_core::assignment::DeviceSlice;
use vgpu_core::placement::ContainerRequest;
use vgpu_core::request::{Memory, VgpuRequest};
use vgpu_core::time::format_rfc3339;

const NOW: u64 = 1_800_000_000;

fn inventory(gpus: &[(&str, u64)]) -> String {
    NodeInventory::new(
        gpus.iter()
            .enumerate()
            .map(|(i, (uuid, mib))| DeviceInfo {
                uuid: uuid.to_string(),
                index: i as u32,
                model: "NVIDIA T4".into(),
                memory_mib: *mib,
                cores: 100,
                split: 10,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect(),
    )
    .encode()
}

fn cluster() -> Cluster {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW - 10);
    c.apply_node("n1", Some(&inventory(&[("GPU-a", 8192)])), Some(&hb), None);
    c
}

fn mib(m: u64) -> PodRequest {
    PodRequest::simple(vec![ContainerRequest {
        name: "main".into(),
        request: VgpuRequest {
            gpus: 1,
            memory: Memory::Mib(m),
            cores: 0,
        },
    }])
}

fn assignment(node: &str, uuid: &str, m: u64) -> PodAssignment {
    PodAssignment::new(
        node,
        vec![ContainerAssignment {
            name: "main".into(),
            devices: vec![DeviceSlice {
                uuid: uuid.into(),
                memory_mib: m,
                cores: 0,
                exclusive: false,
            }],
        }],
    )
}

#[test]
fn stale_missing_and_unknown_nodes_fail_with_reasons() {
    let mut c = cluster();
    assert!(c.check("n1", &mib(1), NOW).is_ok());
    assert_eq!(
        c.check("n1", &mib(1), NOW + 100).unwrap_err(),
        "n1: device-plugin heartbeat is 110s old (limit 60s)"
    );
    c.apply_node("n2", None, None, None);
    assert!(c
        .check("n2", &mib(1), NOW)
        .unwrap_err()
        .starts_with("n2: no vGPU inventory (annotation vgpu.io/node-devices missing"));
    c.apply_node("n3", Some(&inventory(&[("GPU-x", 1)])), None, None);
    assert_eq!(
        c.check("n3", &mib(1), NOW).unwrap_err(),
        "n3: no device-plugin heartbeat (annotation vgpu.io/node-heartbeat)"
    );
    c.apply_node("n4", Some("{"), None, None);
    assert!(c
        .check("n4", &mib(1), NOW)
        .unwrap_err()
        .starts_with("n4: annotation vgpu.io/node-devices is not valid"));
    assert_eq!(
        c.check("zz", &mib(1), NOW).unwrap_err(),
        "zz: not known to the vGPU extender (no Node object seen)"
    );
    assert_eq!(
        c.node_counts(NOW),
        NodeCounts {
            ready: 1,
            stale: 1,
            no_inventory: 2
        }
    );
}

#[test]
fn cordoned_gpus_refuse_new_pods_and_keep_theirs_counted() {
    let mut c = cluster();
    c.apply_pod(
        "u1",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 4096)),
        false,
    );
    let hb = format_rfc3339(NOW - 10);
    let inv = inventory(&[("GPU-a", 8192)]);
    c.apply_node("n1", Some(&inv), Some(&hb), Some("gpu-a"));
    assert_eq!(
        c.check("n1", &mib(1), NOW).unwrap_err(),
        "n1: no GPU outside the cordon (node annotation hami.io/device-cordon)"
    );
    assert_eq!(
        c.scorer(&mib(1), NOW).score("n1").unwrap_err(),
        "n1: no GPU outside the cordon (node annotation hami.io/device-cordon)"
    );
    // Lifted: the running pod's 4096 MiB were counted all along.
    c.apply_node("n1", Some(&inv), Some(&hb), Some(" "));
    assert!(c.check("n1", &mib(4096), NOW).is_ok());
    assert!(c.check("n1", &mib(4097), NOW).is_err());
}

#[test]
fn pods_count_and_finished_or_deleted_pods_free_their_gpus() {
    let mut c = cluster();
    c.apply_pod(
        "u1",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 6144)),
        false,
    );
    assert_eq!(
        c.check("n1", &mib(4096), NOW).unwrap_err(),
        "n1: no GPU with 4096 MiB free (largest 2048 MiB on GPU-a)"
    );
    c.apply_pod(
        "u1",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 6144)),
        true,
    );
    assert!(c.check("n1", &mib(4096), NOW).is_ok());
    c.apply_pod("u2", None, Some(assignment("n1", "GPU-a", 6144)), false);
    assert!(c.check("n1", &mib(4096), NOW).is_err());
    c.delete_pod("u2");
    assert!(c.check("n1", &mib(4096), NOW).is_ok());
    // A pod seen before its node: counted once the node appears.
    c.apply_pod(
        "u3",
        Some("n9"),
        Some(assignment("n9", "GPU-z", 8000)),
        false,
    );
    c.apply_node(
        "n9",
        Some(&inventory(&[("GPU-z", 8192)])),
        Some(&format_rfc3339(NOW)),
        None,
    );
    assert!(c.check("n9", &mib(1024), NOW).is_err());
    assert_eq!(c.placed_pods(), 1);
}

#[test]
fn assumptions_hold_capacity_until_seen_forgotten_or_expired() {
    let mut c = cluster();
    let t0 = Instant::now();
    let a = c.assume("u1", "n1", &mib(6144), NOW, t0).unwrap();
    assert_eq!(a.containers[0].devices[0].uuid, "GPU-a");
    // A second pod in flight does not get the same memory.
    assert_eq!(
        c.assume("u2", "n1", &mib(6144), NOW, t0).unwrap_err(),
        "n1: no GPU with 6144 MiB free (largest 2048 MiB on GPU-a)"
    );
    // The watch shows u1 before our patch: the assumption stands.
    c.apply_pod("u1", None, None, false);
    assert!(c.check("n1", &mib(4096), NOW).is_err());
    // ... and then with it: counted once, not twice.
    c.apply_pod("u1", Some("n1"), Some(a), false);
    assert_eq!(c.assumed(), 0);
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 6144);
    // Rollback frees the capacity.
    c.delete_pod("u1");
    c.assume("u3", "n1", &mib(6144), NOW, t0).unwrap();
    c.forget("u3");
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
    // Expiry.
    c.assume("u4", "n1", &mib(6144), NOW, t0).unwrap();
    assert_eq!(c.expire(t0 + Duration::from_secs(301)), 1);
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
    // Re-assuming the same pod replaces its own previous placement.
    c.assume("u5", "n1", &mib(6144), NOW, t0).unwrap();
    c.assume("u5", "n1", &mib(6144), NOW, t0).unwrap();
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 6144);
}

/// `gap-aware` prices solved for one live table carry over to the next while the share mix
/// stays close (a burst of binds solves the LP once), and are solved again when it moves.
#[test]
fn gap_prices_carry_over_while_the_placed_mix_stays_close() {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW);
    let gpus: Vec<(String, u64)> = (0..40).map(|i| (format!("GPU-{i}"), 10000)).collect();
    let gpu_refs: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
    c.apply_node("n1", Some(&inventory(&gpu_refs)), Some(&hb), None);
    let place = |c: &mut Cluster, i: usize, mib: u64| {
        c.apply_pod(
            &format!("u{i}"),
            Some("n1"),
            Some(assignment("n1", &format!("GPU-{i}"), mib)),
            false,
        );
    };
    // Ten 40 % and ten 60 % pods; the prices are solved on first use.
    for i in 0..20 {
        place(&mut c, i, if i % 2 == 0 { 4000 } else { 6000 });
    }
    let t = c.typical_pods().unwrap();
    assert!(!t.gaps_solved());
    let prices = t.gaps().clone();
    // One more 40 % pod: a new table, the same prices without a solve.
    place(&mut c, 20, 4000);
    let t = c.typical_pods().unwrap();
    assert!(t.gaps_solved());
    assert_eq!(t.gaps(), &prices);
    // Ten more 40 % pods move the mix past 1.25x: solved again.
    for i in 21..31 {
        place(&mut c, i, 4000);
    }
    assert!(!c.typical_pods().unwrap().gaps_solved());
}

/// The typical-pod table follows the placed pods (shapes from their assignments on the
/// node's cards), and a `fragmentation` GPU policy then picks another GPU than binpack.
/// `gap-aware` reads every pod's CPU and memory on its node: a node whose CPU a plain pod
/// has taken ranks below one with the same GPUs and CPU to spare, and the extender's own
/// binds count until the watch shows them.
#[test]
fn gap_aware_sees_cpu_taken_by_any_pod() {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW);
    for n in ["n1", "n2"] {
        let gpus = [(format!("GPU-{n}a"), 10000), (format!("GPU-{n}b"), 10000)];
        let gpus: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
        c.apply_node(n, Some(&inventory(&gpus)), Some(&hb), None);
    }
    let shapes = [crate::typical::TypicalShape {
        gpus: 1,
        percent: 50,
        count: 10,
        cpu: Some("4".into()),
        memory: Some("8Gi".into()),
    }];
    c.set_typical_pods(Some(crate::typical::table(&shapes)));
    let mut pod = PodRequest::simple(vec![ContainerRequest {
        name: "main".into(),
        request: VgpuRequest {
            gpus: 1,
            memory: Memory::Percent(50),
            cores: 0,
        },
    }]);
    pod.node_policy = placement::Policy::GapAware;
    pod.gpu_policy = placement::Policy::GapAware;
    pod.host = HostRequest {
        cpu_milli: 4000,
        mem_mib: 8192,
    };
    let rank = |c: &Cluster, n: &str| {
        let s = c.scorer(&pod, NOW);
        s.standing_at(n, &mut None, &mut PlaceBuf::default())
            .map(|s| s.rank)
            .unwrap()
    };
    // No allocatable known: the GPU-only measure, the two nodes alike.
    c.apply_pod_host(
        "plain",
        Some("n1"),
        HostRequest {
            cpu_milli: 12_000,
            mem_mib: 1024,
        },
        false,
    );
    assert_eq!(rank(&c, "n1"), rank(&c, "n2"));
    let alloc = Some(HostLeft {
        cpu_milli: 16_000,
        mem_mib: 65_536,
        model: 0,
    });
    let before = c.generation();
    c.apply_allocatable("n1", alloc);
    c.apply_allocatable("n2", alloc);
    assert!(c.generation() > before);
    // n1 keeps 4 cores: the pod would leave 1.5 idle GPUs with no CPU to serve them.
    assert!(
        rank(&c, "n1") < rank(&c, "n2"),
        "{} {}",
        rank(&c, "n1"),
        rank(&c, "n2")
    );
    // The plain pod finishes: alike again.
    c.apply_pod_host("plain", Some("n1"), HostRequest::default(), true);
    assert_eq!(rank(&c, "n1"), rank(&c, "n2"));
    // A bind counts its CPU at once, and keeps counting while the watch still shows the
    // pod unbound.
    c.assume("u1", "n2", &pod, NOW, Instant::now()).unwrap();
    let left = |c: &Cluster| c.hosts.left("n2").map(|l| l.cpu_milli);
    assert_eq!(left(&c), Some(12_000));
    c.apply_pod_host("u1", None, pod.host, false);
    assert_eq!(left(&c), Some(12_000));
    c.forget("u1");
    assert_eq!(left(&c), Some(16_000));
}

/// A placed pod's GPU-type lists count in its kind as the model groups they allow, and the
/// node's model reaches the measure (the simulator's `ours` does the same with its lists).
#[test]
fn typed_pods_count_with_the_models_they_allow() {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW);
    let mut inv = |node: &str, model: &str| {
        let d = DeviceInfo {
            uuid: format!("GPU-{node}"),
            index: 0,
            model: model.into(),
            memory_mib: 10000,
            cores: 100,
            split: 10,
            numa: None,
            healthy: true,
            vendor: String::new(),
            nvlinks: Default::default(),
        };
        c.apply_node(
            node,
            Some(&NodeInventory::new(vec![d]).encode()),
            Some(&hb),
            None,
        );
    };
    inv("a", "NVIDIA A100");
    inv("t", "NVIDIA T4");
    let filter = GpuFilter::from_annotations(|k| {
        (k == vgpu_core::annotations::USE_GPU_TYPE).then_some("a100")
    });
    c.apply_pod_types("u1", &filter);
    c.apply_pod("u1", Some("a"), Some(assignment("a", "GPU-a", 5000)), false);
    c.apply_pod("u2", Some("t"), Some(assignment("t", "GPU-t", 5000)), false);
    let masks: Vec<u64> = c.kinds().iter().map(|(k, _)| k.shape.models.0).collect();
    // Groups are numbered as first seen: a100 is 0, t4 is 1.
    assert_eq!(masks, [0, 0b1], "{masks:?}");
    let set = |c: &Cluster, name: &'static str| {
        let view = c.dense.get(name).unwrap();
        DenseSet {
            hot: view.gpus,
            verdicts: &[],
            models: &c.models,
            nodes: &c.nodes,
            hosts: &c.hosts,
            name,
            cold: OnceCell::new(),
        }
        .host_left()
    };
    // No allocatable yet: no host terms; then the node's model group comes with them.
    assert_eq!(set(&c, "t"), None);
    let alloc = Some(HostLeft {
        cpu_milli: 8000,
        mem_mib: 8192,
        model: 0,
    });
    c.apply_allocatable("a", alloc);
    c.apply_allocatable("t", alloc);
    assert_eq!(set(&c, "a").map(|h| h.model), Some(0));
    assert_eq!(set(&c, "t").map(|h| h.model), Some(1));
    c.delete_pod("u1");
    assert!(c.typed.is_empty());
}

/// Binds and deletes that barely move the placed mix keep the live table (and so every
/// remembered standing); a real change of the mix rebuilds it.
#[test]
fn binds_keep_the_table_while_the_mix_stays_close() {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW);
    let gpus: Vec<(String, u64)> = (0..64).map(|i| (format!("GPU-{i}"), 10000)).collect();
    let gpus: Vec<(&str, u64)> = gpus.iter().map(|(u, m)| (u.as_str(), *m)).collect();
    c.apply_node("n1", Some(&inventory(&gpus)), Some(&hb), None);
    for i in 0..600 {
        let a = assignment("n1", &format!("GPU-{}", i % 64), 1000);
        c.apply_pod(&format!("u{i}"), Some("n1"), Some(a), false);
    }
    assert!(c.typical_pods().is_some());
    let epoch = c.table_epoch();
    let mut pod = mib(1000);
    pod.node_policy = placement::Policy::GapAware;
    c.assume("new", "n1", &pod, NOW, Instant::now()).unwrap();
    c.forget("new");
    c.delete_pod("u0");
    assert!(c.typical_pods().is_some());
    assert_eq!(c.table_epoch(), epoch);
    // Three in a hundred pods of another size: rebuilt.
    for i in 600..620 {
        let a = assignment("n1", &format!("GPU-{}", i % 64), 5000);
        c.apply_pod(&format!("u{i}"), Some("n1"), Some(a), false);
        c.typical_pods();
    }
    assert!(c.table_epoch() > epoch);
}

#[test]
fn typical_pods_come_from_placed_pods_and_steer_the_fragmentation_policy() {
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let hb = format_rfc3339(NOW);
    c.apply_node(
        "n1",
        Some(&inventory(&[("GPU-a", 10000), ("GPU-b", 10000)])),
        Some(&hb),
        None,
    );
    assert!(c.typical_pods().is_none());
    // The placed pods: 40 % and 50 % of a card.
    c.apply_pod(
        "u1",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 4000)),
        false,
    );
    c.apply_pod(
        "u2",
        Some("n1"),
        Some(assignment("n1", "GPU-b", 5000)),
        false,
    );
    let before = c.generation();
    let t = c.typical_pods().unwrap().clone();
    // Both shapes are typical: a GPU with 45 % free fits the 40 % pod only.
    assert!(t.fragmentation(&[450]) > 0.0 && t.fragmentation(&[500]) == 0.0);
    // A 10 % pod: binpack takes the fuller GPU-b (50 % free -> 40 %), fragmentation GPU-a
    // (60 % free -> 50 %: still room for either typical pod; GPU-b keeps 50 %).
    let mut pod = PodRequest::simple(vec![ContainerRequest {
        name: "main".into(),
        request: VgpuRequest {
            gpus: 1,
            memory: Memory::Percent(10),
            cores: 0,
        },
    }]);
    pod.gpu_policy = placement::Policy::Binpack;
    let (a, _) = c.check("n1", &pod, NOW).unwrap();
    assert_eq!(a[0].devices[0].uuid, "GPU-b");
    pod.gpu_policy = placement::Policy::Fragmentation;
    let a = c.assume("u3", "n1", &pod, NOW, Instant::now()).unwrap();
    assert_eq!(a.containers[0].devices[0].uuid, "GPU-a");
    assert!(c.generation() > before);
    // Pods leaving take their shapes with them; a file's table replaces the live one.
    for u in ["u1", "u2", "u3"] {
        c.delete_pod(u);
    }
    assert!(c.typical_pods().is_none());
    c.set_typical_pods(Some(t.clone()));
    assert_eq!(c.typical_pods(), Some(&t));
    c.apply_pod(
        "u4",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 9000)),
        false,
    );
    assert_eq!(c.typical_pods(), Some(&t));
}

#[test]
fn relists_drop_what_is_gone_but_keep_assumptions() {
    let mut c = cluster();
    c.apply_pod(
        "u1",
        Some("n1"),
        Some(assignment("n1", "GPU-a", 1000)),
        false,
    );
    let listed_from = Instant::now();
    c.assume("u2", "n1", &mib(1000), NOW, listed_from).unwrap();
    c.retain_pods(&HashSet::new(), listed_from);
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 1000);
    assert_eq!(c.assumed(), 1);
    // A pod assumed before a list began and missing from it was deleted during the outage
    // that forced the list: its memory is free again (it was counted until the assume TTL).
    c.retain_pods(&HashSet::new(), listed_from + Duration::from_millis(1));
    assert_eq!(c.node_gpus("n1").unwrap().gpus()[0].used_mib, 0);
    assert_eq!(c.assumed(), 0);
    c.retain_nodes(&HashSet::new());
    assert!(c.check("n1", &mib(1), NOW).is_err());
    assert_eq!(c.gpus().len(), 0);
}

/// The dense copy decides exactly as the node entries do, message for message, through
/// inventory changes, pods coming and going, stale heartbeats and deleted nodes.
#[test]
fn dense_copy_agrees_with_the_entries() {
    use vgpu_core::placement::{GpuFilter, NameList};
    let mut c = Cluster::new(Duration::from_secs(60), Duration::from_secs(300));
    let models = [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A10",
        "Tesla T4",
        "nvidia a10",
    ];
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for n in 0..60usize {
        let name = format!("n{n}");
        let count = 1 + (n % 5) as u32;
        let devices: Vec<DeviceInfo> = (0..count)
            .map(|i| DeviceInfo {
                uuid: format!("GPU-{n}-{i}"),
                index: i,
                model: models[(n + i as usize) % models.len()].into(),
                memory_mib: [16384, 24576, 81920][(n + i as usize) % 3],
                cores: 100,
                split: 1 + (n as u32 % 4),
                numa: None,
                healthy: !(n + i as usize).is_multiple_of(7),
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect();
        let hb = match n % 10 {
            0 => None,
            1 => Some(format_rfc3339(NOW - 500)),
            _ => Some(format_rfc3339(NOW - 5)),
        };
        let inv = (n % 13 != 0).then(|| NodeInventory::new(devices.clone()).encode());
        c.apply_node(&name, inv.as_deref(), hb.as_deref(), None);
        for (i, d) in devices.iter().enumerate() {
            if next() % 3 == 0 {
                continue;
            }
            c.apply_pod(
                &format!("p{n}-{i}"),
                Some(&name),
                Some(PodAssignment::new(
                    &name,
                    vec![ContainerAssignment {
                        name: "c".into(),
                        devices: vec![DeviceSlice {
                            uuid: d.uuid.clone(),
                            memory_mib: next() % d.memory_mib,
                            cores: [0, 10, 50, 100][next() as usize % 4],
                            exclusive: false,
                        }],
                    }],
                )),
                false,
            );
        }
    }
    // Changes after the first fill: a bigger inventory, deletions, a pod leaving.
    c.apply_node(
        "n2",
        Some(&inventory(&[
            ("GPU-x1", 8192),
            ("GPU-x2", 8192),
            ("GPU-x3", 4096),
        ])),
        Some(&format_rfc3339(NOW)),
        None,
    );
    c.delete_node("n3");
    c.delete_node("n4");
    c.delete_pod("p5-0");
    let container = |gpus, memory, cores| ContainerRequest {
        name: "c".into(),
        request: VgpuRequest {
            gpus,
            memory,
            cores,
        },
    };
    let mut pods = Vec::new();
    for (gpus, memory, cores) in [
        (1, Memory::Mib(1024), 0),
        (1, Memory::Mib(20000), 30),
        (2, Memory::Percent(25), 10),
        (3, Memory::Mib(4096), 0),
        (1, Memory::Percent(100), 100),
        (1, Memory::Mib(1), 60),
    ] {
        pods.push(PodRequest::simple(vec![container(gpus, memory, cores)]));
    }
    let mut two = PodRequest::simple(vec![
        container(1, Memory::Mib(8192), 20),
        container(2, Memory::Mib(4096), 0),
    ]);
    two.gpu_policy = placement::Policy::Binpack;
    two.node_policy = placement::Policy::Spread;
    pods.push(two);
    for (use_t, nouse_t, use_u, nouse_u) in [
        ("a100", "", "", ""),
        ("", "a10", "", ""),
        ("T4,a10", "a100", "", ""),
        ("", "", "gpu-7-0,GPU-9-1", ""),
        ("", "", "", "GPU-8-0"),
    ] {
        let mut p = PodRequest::simple(vec![container(1, Memory::Mib(2048), 10)]);
        p.filter = GpuFilter {
            use_types: NameList::parse(use_t),
            nouse_types: NameList::parse(nouse_t),
            use_uuids: NameList::parse(use_u),
            nouse_uuids: NameList::parse(nouse_u),
        };
        pods.push(p);
    }
    let mut names: Vec<String> = (0..62).map(|n| format!("n{n}")).collect();
    names.push("unknown".into());
    let (mut passed, mut failed) = (0, 0);
    let mut two_typed = PodRequest::simple(vec![container(2, Memory::Mib(2048), 10)]);
    two_typed.filter = GpuFilter {
        use_types: NameList::parse("a10"),
        ..GpuFilter::default()
    };
    pods.push(two_typed);
    let mut memo_hits = 0;
    for pod in &pods {
        let scorer = c.scorer(pod, NOW);
        // The memoised messages are the plain ones, on a first and a second pass.
        let mut memo = FailMemo::default();
        for n in names.iter().chain(&names) {
            let mut buf = PlaceBuf::default();
            if let Err(f) = scorer.score_lean(n, &mut buf) {
                let (mut plain, mut memoised) = (String::new(), String::from("x"));
                scorer.write_fail(&mut plain, n, &f);
                let before = memo.entries.len();
                scorer.write_fail_memo(&mut memoised, n, &f, &mut memo);
                assert_eq!(memoised[1..], plain, "{n} {pod:?}");
                memo_hits += usize::from(
                    matches!(f, Fail::Miss(_, m) if matches!(m.why, placement::MissReason::Type { .. }))
                        && memo.entries.len() == before,
                );
            }
        }
        for n in &names {
            let dense = scorer.score(n);
            assert_eq!(dense, c.score_cold(n, pod, NOW), "{n} {pod:?}");
            if dense.is_ok() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    assert!(
        passed > 50 && failed > 50,
        "{passed} passed, {failed} failed"
    );
    assert!(memo_hits > 20, "{memo_hits} memoised type misses");
}
