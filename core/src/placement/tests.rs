#![allow(clippy::unwrap_used)]

use super::*;
use crate::request::Memory;

fn dev(uuid: &str, index: u32, model: &str, mib: u64) -> DeviceInfo {
    DeviceInfo {
        uuid: uuid.into(),
        index,
        model: model.into(),
        memory_mib: mib,
        cores: 100,
        split: 10,
        numa: None,
        healthy: true,
        vendor: String::new(),
        nvlinks: Default::default(),
    }
}

fn node(devs: &[DeviceInfo]) -> NodeGpus {
    NodeGpus::new(devs.iter().map(Gpu::from_device).collect())
}

fn a100s(n: u32) -> NodeGpus {
    let devs: Vec<_> = (0..n)
        .map(|i| dev(&format!("GPU-{i}"), i, "NVIDIA A100-SXM4-80GB", 81920))
        .collect();
    node(&devs)
}

fn ctr(name: &str, gpus: u32, memory: Memory, cores: u32) -> ContainerRequest {
    ContainerRequest {
        name: name.into(),
        request: VgpuRequest {
            gpus,
            memory,
            cores,
        },
    }
}

fn one(gpus: u32, memory: Memory, cores: u32) -> PodRequest {
    PodRequest::simple(vec![ctr("main", gpus, memory, cores)])
}

fn slice(uuid: &str, mib: u64, cores: u32) -> DeviceSlice {
    DeviceSlice {
        uuid: uuid.into(),
        memory_mib: mib,
        cores,
        exclusive: false,
    }
}

fn uuids(a: &[ContainerAssignment]) -> Vec<Vec<&str>> {
    a.iter()
        .map(|c| c.devices.iter().map(|d| d.uuid.as_str()).collect())
        .collect()
}

fn err(n: &NodeGpus, p: &PodRequest) -> String {
    place(n, p).unwrap_err().to_string()
}

#[test]
fn count_gives_distinct_gpus_and_fails_when_too_few() {
    let n = a100s(4);
    let a = place(&n, &one(3, Memory::Mib(1024), 10)).unwrap();
    let u = &uuids(&a)[0];
    assert_eq!(u.len(), 3);
    let mut d = u.clone();
    d.dedup();
    assert_eq!(d.len(), 3, "same GPU twice in one container: {u:?}");
    assert_eq!(
        a[0].devices[0],
        DeviceSlice {
            uuid: u[0].to_string(),
            memory_mib: 1024,
            cores: 10,
            exclusive: false,
        }
    );
    assert_eq!(
        err(&n, &one(5, Memory::Mib(1024), 0)),
        "5 healthy GPUs needed, only 4"
    );
    // Two GPUs left with room for 60 GiB: a 3-GPU container cannot use the same one twice.
    let mut n = a100s(3);
    n.add(&slice("GPU-0", 40960, 0));
    assert_eq!(
        err(&n, &one(3, Memory::Mib(61440), 0)),
        "3 GPUs with 61440 MiB free needed, only 2 (largest 81920 MiB on GPU-1)"
    );
}

#[test]
fn memory_in_mib_names_the_largest_free_gpu() {
    let mut n = node(&[
        dev("GPU-ab12", 0, "NVIDIA T4", 15360),
        dev("GPU-cd34", 1, "NVIDIA T4", 15360),
    ]);
    n.add(&slice("GPU-ab12", 9216, 0));
    n.add(&slice("GPU-cd34", 12288, 0));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(8192), 0)),
        "no GPU with 8192 MiB free (largest 6144 MiB on GPU-ab12)"
    );
    let a = place(&n, &one(1, Memory::Mib(6144), 0)).unwrap();
    assert_eq!(uuids(&a), [["GPU-ab12"]]);
}

#[test]
fn percentage_resolves_against_the_chosen_card() {
    let n = node(&[
        dev("GPU-small", 0, "NVIDIA T4", 16000),
        dev("GPU-big", 1, "NVIDIA A100", 80000),
    ]);
    let a = place(&n, &one(2, Memory::Percent(25), 0)).unwrap();
    let mut got: Vec<_> = a[0]
        .devices
        .iter()
        .map(|d| (d.uuid.as_str(), d.memory_mib))
        .collect();
    got.sort();
    assert_eq!(got, [("GPU-big", 20000), ("GPU-small", 4000)]);
    // 60 % of a half-used card does not fit; the message gives the MiB it meant.
    let mut n = node(&[dev("GPU-a", 0, "NVIDIA T4", 16000)]);
    n.add(&slice("GPU-a", 8000, 0));
    assert_eq!(
        err(&n, &one(1, Memory::Percent(60), 0)),
        "no GPU with 60% memory (9600 MiB) free (largest 8000 MiB on GPU-a)"
    );
    // The default (100 %) takes a whole idle card.
    let n = a100s(1);
    assert_eq!(
        place(&n, &one(1, Memory::Percent(100), 0)).unwrap()[0].devices[0].memory_mib,
        81920
    );
}

#[test]
fn cores_are_checked_and_zero_needs_some_left() {
    let mut n = a100s(2);
    n.add(&slice("GPU-0", 1024, 70));
    n.add(&slice("GPU-1", 1024, 80));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1024), 40)),
        "no GPU with 40% cores free (most 30% on GPU-0)"
    );
    assert_eq!(
        uuids(&place(&n, &one(1, Memory::Mib(1024), 30)).unwrap()),
        [["GPU-0"]]
    );
    // All cores placed: not even a 0-core (unlimited) share joins.
    let mut n = a100s(1);
    n.add(&slice("GPU-0", 1024, 100 - 1));
    n.add(&slice("GPU-0", 1024, 1));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1024), 0)),
        "no GPU with 1% cores free (most 0% on GPU-0)"
    );
}

#[test]
fn exclusive_needs_an_idle_card_and_blocks_it() {
    let mut n = a100s(2);
    n.add(&slice("GPU-0", 1024, 0));
    let a = place(&n, &one(1, Memory::Mib(1024), 100)).unwrap();
    assert_eq!(uuids(&a), [["GPU-1"]]);
    assert_eq!(a[0].devices[0].cores, 100);
    n.add(&a[0].devices[0]);
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1024), 100)),
        "no GPU idle (gpucores 100 needs a whole card)"
    );
    // Nothing else joins an exclusive card, even with memory and cores to spare.
    let mut n = a100s(1);
    n.add(&slice("GPU-0", 1024, 100));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1), 0)),
        "no GPU free of an exclusive pod (gpucores 100 or mutex)"
    );
}

#[test]
fn mutex_takes_idle_gpus_and_keeps_them_alone() {
    let mut n = a100s(2);
    n.add(&slice("GPU-0", 1024, 10));
    let mutex = |cores| {
        let mut p = annotated(&[(GPU_POLICY, "binpack, Mutex")]);
        p.containers[0].request.cores = cores;
        p
    };
    // Binpack alone would join GPU-0; mutex takes the idle GPU, with only the cores it asks.
    let a = place(&n, &mutex(30)).unwrap();
    assert_eq!(uuids(&a), [["GPU-1"]]);
    assert_eq!(
        (a[0].devices[0].cores, a[0].devices[0].exclusive),
        (30, true)
    );
    assert_eq!(
        score(&n, &mutex(30)).unwrap(),
        place_scored(&n, &mutex(30)).unwrap().1
    );
    n.add(&a[0].devices[0]);
    assert_eq!(
        err(&n, &mutex(30)),
        "no GPU idle (the mutex policy needs a GPU nothing else uses)"
    );
    // Nothing joins the mutex pod's GPU, with memory and cores to spare: the slice says so.
    let mut n = a100s(1);
    n.add(&DeviceSlice {
        exclusive: true,
        ..slice("GPU-0", 1024, 30)
    });
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1), 0)),
        "no GPU free of an exclusive pod (gpucores 100 or mutex)"
    );
    // A slice without the flag (0.1's annotations) leaves the GPU shared as before.
    let mut n = a100s(1);
    n.add(&slice("GPU-0", 1024, 30));
    assert!(place(&n, &one(1, Memory::Mib(1), 0)).is_ok());
    // Two containers of one mutex pod do not share a GPU either.
    let mut p = mutex(10);
    p.containers.push(ctr("second", 1, Memory::Mib(1024), 10));
    let a = place(&a100s(2), &p).unwrap();
    assert_eq!(uuids(&a), [["GPU-0"], ["GPU-1"]]);
    assert!(place(&a100s(1), &p).is_err());
}

#[test]
fn cordoned_gpus_get_no_new_pods_and_say_why() {
    let mut n = a100s(2);
    n.add(&slice("GPU-0", 1024, 10));
    n.cordon(&NameList::parse(" gpu-0 ,"));
    // Binpack would join GPU-0; it is cordoned, so GPU-1.
    assert_eq!(
        uuids(&place(&n, &annotated(&[(GPU_POLICY, "binpack")])).unwrap()),
        [["GPU-1"]]
    );
    assert_eq!(
        score(&n, &one(1, Memory::Mib(1024), 0)).unwrap(),
        place_scored(&n, &one(1, Memory::Mib(1024), 0)).unwrap().1
    );
    n.cordon(&NameList::parse("GPU-0,GPU-1"));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(1024), 0)),
        "no GPU outside the cordon (node annotation hami.io/device-cordon)"
    );
    assert_eq!(
        err(&n, &one(2, Memory::Mib(1024), 0)),
        "no GPU outside the cordon (node annotation hami.io/device-cordon)"
    );
    n.cordon(&NameList::parse("GPU-1"));
    assert_eq!(
        err(&n, &one(2, Memory::Mib(1024), 0)),
        "2 GPUs outside the cordon (node annotation hami.io/device-cordon) needed, only 1"
    );
    // The only GPU of the asked type cordoned: the cordon is named, not the type.
    let mut mixed = node(&[
        dev("GPU-0", 0, "NVIDIA A100-SXM4-80GB", 81920),
        dev("GPU-1", 1, "NVIDIA T4", 15360),
    ]);
    mixed.cordon(&NameList::parse("GPU-0"));
    assert_eq!(
        err(&mixed, &annotated(&[(USE_GPU_TYPE, "a100")])),
        "no GPU outside the cordon (node annotation hami.io/device-cordon)"
    );
    // Lifting the cordon: the GPU takes pods again; its slice stayed counted throughout.
    n.cordon(&NameList::default());
    assert_eq!(n.gpus()[0].used_mib, 1024);
    assert!(place(&n, &one(2, Memory::Mib(1024), 0)).is_ok());
}

#[test]
fn split_count_limits_slices() {
    let mut d = dev("GPU-0", 0, "NVIDIA T4", 15360);
    d.split = 2;
    let mut n = node(&[d]);
    n.add(&slice("GPU-0", 100, 0));
    assert!(place(&n, &one(1, Memory::Mib(100), 0)).is_ok());
    n.add(&slice("GPU-0", 100, 0));
    assert_eq!(
        err(&n, &one(1, Memory::Mib(100), 0)),
        "no GPU below its split count"
    );
    // Two containers of one pod: the second sees the first's slice.
    let mut d = dev("GPU-0", 0, "NVIDIA T4", 15360);
    d.split = 1;
    let n = node(&[d]);
    let pod = PodRequest::simple(vec![
        ctr("a", 1, Memory::Mib(100), 0),
        ctr("b", 1, Memory::Mib(100), 0),
    ]);
    assert_eq!(
        err(&n, &pod),
        "container \"b\": no GPU below its split count"
    );
}

#[test]
fn unhealthy_and_foreign_vendor_gpus_are_skipped() {
    let mut sick = dev("GPU-0", 0, "NVIDIA T4", 15360);
    sick.healthy = false;
    let mut dcu = dev("DCU-1", 1, "Z100", 15360);
    dcu.vendor = "dcu".into();
    let n = node(&[sick.clone(), dcu]);
    assert_eq!(err(&n, &one(1, Memory::Mib(1), 0)), "no healthy GPU");
    assert_eq!(
        err(&NodeGpus::default(), &one(1, Memory::Mib(1), 0)),
        "no GPUs in the node's inventory"
    );
    let n = node(&[sick, dev("GPU-1", 1, "NVIDIA T4", 15360)]);
    assert_eq!(
        uuids(&place(&n, &one(1, Memory::Mib(1), 0)).unwrap()),
        [["GPU-1"]]
    );
}

fn annotated(pairs: &[(&str, &str)]) -> PodRequest {
    PodRequest::from_annotations(
        vec![ctr("main", 1, Memory::Mib(1024), 0)],
        |k| pairs.iter().find(|(a, _)| *a == k).map(|(_, v)| *v),
        Policy::Binpack,
        Policy::Spread,
    )
    .unwrap()
}

#[test]
fn gpu_type_include_and_exclude_are_case_insensitive_comma_lists() {
    let n = node(&[
        dev("GPU-t4", 0, "NVIDIA Tesla T4", 15360),
        dev("GPU-a100", 1, "NVIDIA A100-SXM4-80GB", 81920),
        dev("GPU-v100", 2, "Tesla V100-SXM2-32GB", 32768),
    ]);
    let pick =
        |pairs: &[(&str, &str)]| uuids(&place(&n, &annotated(pairs)).unwrap())[0][0].to_string();
    assert_eq!(pick(&[(USE_GPU_TYPE, "a100")]), "GPU-a100");
    assert_eq!(pick(&[(USE_GPU_TYPE, " h100 , V100 ")]), "GPU-v100");
    assert_eq!(
        pick(&[(USE_GPU_TYPE, "tesla"), (NOUSE_GPU_TYPE, "T4")]),
        "GPU-v100"
    );
    assert_eq!(
        err(&n, &annotated(&[(USE_GPU_TYPE, "H100,h200")])),
        "no GPU of type h100,h200 (node has NVIDIA Tesla T4, NVIDIA A100-SXM4-80GB, Tesla V100-SXM2-32GB)"
    );
    assert_eq!(
        err(&n, &annotated(&[(NOUSE_GPU_TYPE, "t4,a100,V100")])),
        "no GPU not of type t4,a100,v100 (node has NVIDIA Tesla T4, NVIDIA A100-SXM4-80GB, Tesla V100-SXM2-32GB)"
    );
    // An empty list allows everything.
    assert!(place(&n, &annotated(&[(USE_GPU_TYPE, " , ")])).is_ok());
}

#[test]
fn gpu_uuid_include_and_exclude() {
    let n = a100s(3);
    let pick =
        |pairs: &[(&str, &str)]| uuids(&place(&n, &annotated(pairs)).unwrap())[0][0].to_string();
    assert_eq!(pick(&[(USE_GPU_UUID, "gpu-2")]), "GPU-2");
    assert_eq!(pick(&[(NOUSE_GPU_UUID, "GPU-0,GPU-1")]), "GPU-2");
    assert_eq!(
        err(&n, &annotated(&[(USE_GPU_UUID, "GPU-9")])),
        "no GPU with an allowed UUID"
    );
    assert_eq!(
        err(
            &n,
            &annotated(&[(USE_GPU_UUID, "GPU-1"), (NOUSE_GPU_UUID, "GPU-1")])
        ),
        "no GPU with an allowed UUID"
    );
    // Exact match, not substring: GPU-1 does not allow GPU-10.
    let n = node(&[dev("GPU-10", 0, "NVIDIA T4", 15360)]);
    assert_eq!(
        err(&n, &annotated(&[(USE_GPU_UUID, "GPU-1")])),
        "no GPU with an allowed UUID"
    );
}

#[test]
fn gpu_policies_pick_fullest_or_emptiest() {
    let mut n = a100s(3);
    n.add(&slice("GPU-1", 40960, 50));
    n.add(&slice("GPU-2", 20480, 0));
    let pick = |policy: &str| {
        uuids(&place(&n, &annotated(&[(GPU_POLICY, policy)])).unwrap())[0][0].to_string()
    };
    assert_eq!(pick("binpack"), "GPU-1");
    assert_eq!(pick("Spread"), "GPU-0");
    // Default (spread) when unset or empty.
    assert_eq!(pick(""), "GPU-0");
    // Ties break by index.
    let n = a100s(4);
    assert_eq!(
        uuids(&place(&n, &one(2, Memory::Mib(1), 0)).unwrap()),
        [["GPU-0", "GPU-1"]]
    );
}

#[test]
fn node_policies_score_fuller_or_emptier_nodes_higher() {
    let idle = a100s(2);
    let mut busy = a100s(2);
    busy.add(&slice("GPU-0", 81920 - 8192, 80));
    busy.add(&slice("GPU-1", 40960, 50));
    let score = |n: &NodeGpus, policy: &str| {
        place_scored(n, &annotated(&[(NODE_POLICY, policy)]))
            .unwrap()
            .1
    };
    assert!(score(&busy, "binpack") > score(&idle, "binpack"));
    assert!(score(&busy, "spread") < score(&idle, "spread"));
    assert_eq!(score(&idle, "spread"), MAX_SCORE);
    assert_eq!(score(&idle, "binpack"), 0);
    // Whole card on a 1-GPU node: full.
    let n = a100s(1);
    let pod = PodRequest::simple(vec![ctr("m", 1, Memory::Percent(100), 100)]);
    assert_eq!(place_scored(&n, &pod).unwrap().1, MAX_SCORE);
}

#[test]
fn unknown_policy_is_refused_naming_the_annotation() {
    let e = PodRequest::from_annotations(
        vec![],
        |k| (k == NODE_POLICY).then_some("pack"),
        Policy::Binpack,
        Policy::Spread,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "annotation hami.io/node-scheduler-policy: \"pack\" is not one of binpack, spread, fragmentation, gap-aware"
    );
    assert_eq!("SPREAD".parse::<Policy>(), Ok(Policy::Spread));
    assert!("x".parse::<Policy>().is_err());
}

#[test]
fn containers_share_gpus_within_limits_and_node_counts_are_untouched() {
    let n = a100s(1);
    let pod = PodRequest::simple(vec![
        ctr("a", 1, Memory::Mib(40960), 50),
        ctr("b", 1, Memory::Mib(40960), 50),
    ]);
    let a = place(&n, &pod).unwrap();
    assert_eq!(uuids(&a), [["GPU-0"], ["GPU-0"]]);
    assert_eq!(n.gpus()[0].used_mib, 0);
    let pod = PodRequest::simple(vec![
        ctr("a", 1, Memory::Mib(40960), 50),
        ctr("b", 1, Memory::Mib(40961), 0),
    ]);
    assert_eq!(
        err(&n, &pod),
        "container \"b\": no GPU with 40961 MiB free (largest 40960 MiB on GPU-0)"
    );
}

#[test]
fn nodes_with_more_gpus_than_the_inline_buffer() {
    let mut n = a100s(20);
    n.add(&slice("GPU-19", 81920, 0));
    let a = place(&n, &one(19, Memory::Mib(1024), 0)).unwrap();
    let mut u = uuids(&a)[0].clone();
    u.sort();
    u.dedup();
    assert_eq!(u.len(), 19);
    assert!(!u.contains(&"GPU-19"));
    assert_eq!(
        err(&n, &one(20, Memory::Mib(1024), 0)),
        "20 GPUs with 1024 MiB free needed, only 19 (largest 81920 MiB on GPU-0)"
    );
}

#[test]
fn placed_slices_round_trip_through_node_counts() {
    let mut n = a100s(2);
    let a = place(&n, &one(2, Memory::Mib(1000), 20)).unwrap();
    n.add_all(&a);
    for g in n.gpus() {
        assert_eq!((g.used_mib, g.used_cores, g.slices), (1000, 20, 1));
    }
    assert!(!n.add(&slice("GPU-gone", 1, 1)));
}

/// The hot record stays one cache line with its precomputed use.
#[test]
fn gpu_hot_is_one_cache_line() {
    assert_eq!(std::mem::size_of::<GpuHot>(), 64);
    let g = Gpu::from_device(&dev("GPU-a", 0, "NVIDIA T4", 15360)).hot();
    assert_eq!(g.use_now, 0);
}

proptest::proptest! {
    /// Whatever arrives, placing pod after pod never puts more memory, cores or slices on a GPU than
    /// it has, never the same GPU twice in a container, never a new slice on a cordoned GPU, and
    /// an exclusive (gpucores 100 or mutex) slice is alone; under `nvidia.com/numa-bind` a
    /// container's GPUs share a NUMA node.
    #[test]
    fn never_overcommits(
        cards in proptest::collection::vec((1u64..100_000, 1u32..6, proptest::bool::ANY, 0u8..4), 1..8),
        pods in proptest::collection::vec((1u32..4, 1u64..60_000, 0u32..101, proptest::bool::ANY, 1u32..101, proptest::bool::ANY, 0u8..6, 0u8..5), 1..40),
    ) {
        let devs: Vec<_> = cards.iter().enumerate().map(|(i, &(mib, split, a100, extra))| {
            let model = if a100 { "NVIDIA A100-SXM4-80GB" } else { "NVIDIA T4" };
            let mut d = dev(&format!("GPU-{i}"), i as u32, model, mib);
            d.split = split;
            d.numa = (extra > 0).then_some(u32::from(extra % 2));
            if i > 0 && extra % 2 == 1 {
                d.nvlinks.insert(format!("GPU-{}", i - 1), u32::from(extra));
            }
            d
        }).collect();
        let mut n = node(&devs);
        // Every third card cordoned (from the start: the slices the test places are new ones).
        let cordoned: Vec<String> = (0..devs.len()).filter(|i| i % 3 == 2).map(|i| format!("GPU-{i}")).collect();
        n.cordon(&NameList::parse(&cordoned.join(",")));
        let mut placed: Vec<Vec<DeviceSlice>> = vec![Vec::new(); devs.len()];
        for (gpus, mib, cores, pct, p, spread, lists, hami) in pods {
            let memory = if pct { Memory::Percent(p) } else { Memory::Mib(mib) };
            let mut pod = one(gpus, memory, cores);
            // Type and UUID lists, so the one-container pass is checked with them too.
            match lists {
                1 => pod.filter.use_types = NameList::parse("a100"),
                2 => pod.filter.nouse_types = NameList::parse("t4"),
                3 => pod.filter.nouse_uuids = NameList::parse("GPU-0"),
                4 => pod.filter.use_uuids = NameList::parse("GPU-1,GPU-2,GPU-3"),
                _ => {}
            }
            pod.gpu_policy = if spread { Policy::Spread } else { Policy::Binpack };
            pod.mutex = hami == 1;
            pod.topology = hami == 2 || hami == 4;
            pod.numa_bind = hami == 3 || hami == 4;
            pod.node_policy = if mib % 2 == 0 { Policy::Spread } else { Policy::Binpack };
            let scored = score(&n, &pod).ok();
            // The lean failure is the one placement reports.
            let mut buf = PlaceBuf::default();
            if let Err(m) = score_buf(&n, &pod, &mut buf, None) {
                proptest::prop_assert_eq!(m, place(&n, &pod).unwrap_err().miss);
            }
            let placed_now = place_scored(&n, &pod).ok();
            proptest::prop_assert_eq!(scored, placed_now.as_ref().map(|(_, s)| *s));
            if let Some((a, s)) = &placed_now {
                // The score (untouched GPUs summed from their records' use_now) is the mean use of
                // the usable GPUs recomputed from scratch after placement.
                let mut after = n.clone();
                after.add_all(a);
                let (sum, k) = after.gpus().iter().map(Gpu::hot).filter(|h| h.usable)
                    .fold((0u64, 0u64), |(s, k), h| (s + h.use_permille(h.used_mib, h.used_cores), k + 1));
                proptest::prop_assert_eq!(n.gpus().iter().map(Gpu::hot).map(|h| u64::from(h.use_now)).collect::<Vec<_>>(),
                    n.gpus().iter().map(Gpu::hot).map(|h| h.use_permille(h.used_mib, h.used_cores)).collect::<Vec<_>>());
                let used = sum.checked_div(k).unwrap_or(0);
                let permille = match pod.node_policy { Policy::Spread => 1000 - used.min(1000), _ => used };
                proptest::prop_assert_eq!(*s, ((permille * u64::from(MAX_SCORE) + 500) / 1000) as u32);
            }
            if let Some((a, _)) = placed_now {
                let u = &uuids(&a)[0];
                proptest::prop_assert!(u.iter().all(|g| !cordoned.iter().any(|c| c == g)));
                if pod.numa_bind {
                    let numa: Vec<Option<u32>> = u.iter()
                        .map(|g| n.gpus().iter().find(|x| x.uuid == *g).and_then(|x| x.numa))
                        .collect();
                    proptest::prop_assert!(numa.windows(2).all(|w| w[0] == w[1]), "{:?}", numa);
                }
                let mut d = u.clone();
                d.sort();
                d.dedup();
                proptest::prop_assert_eq!(d.len(), u.len());
                for s in &a[0].devices {
                    let i = n.gpus().iter().position(|g| g.uuid == s.uuid).unwrap();
                    placed[i].push(s.clone());
                }
                n.add_all(&a);
            }
        }
        for (g, slices) in n.gpus().iter().zip(&placed) {
            proptest::prop_assert!(g.used_mib <= g.memory_mib);
            proptest::prop_assert!(slices.len() as u32 <= g.split);
            if slices.iter().any(|s| s.cores >= EXCLUSIVE_CORES || s.exclusive) {
                proptest::prop_assert_eq!(slices.len(), 1);
            } else {
                proptest::prop_assert!(g.used_cores <= g.cores);
            }
        }
    }
}

/// Every kind of failure, one or several containers, typed or not, in the words a user reads in
/// `kubectl describe pod`; on a node without GPUs, always the same words.
#[test]
fn every_miss_has_its_words() {
    let mut devs = vec![
        dev("GPU-a", 0, "NVIDIA A100-SXM4-80GB", 81920),
        dev("GPU-b", 1, "nvidia a100-sxm4-80gb", 81920),
        dev("GPU-c", 2, "Tesla T4", 15360),
    ];
    devs[2].split = 1;
    let mut n = node(&devs);
    n.add(&slice("GPU-a", 80000, 90));
    n.add(&slice("GPU-c", 100, 100));
    let mut pods = vec![
        one(1, Memory::Mib(4096), 0),
        one(2, Memory::Mib(1024), 20),
        one(1, Memory::Percent(50), 0),
        one(3, Memory::Mib(1), 0),
        one(1, Memory::Mib(1), 100),
        one(2, Memory::Mib(1), 50),
        one(4, Memory::Mib(1), 0),
        PodRequest::simple(vec![
            ctr("a", 1, Memory::Mib(81920), 0),
            ctr("b", 2, Memory::Mib(40000), 0),
        ]),
    ];
    for (k, v) in [
        (USE_GPU_TYPE, "v100,h100"),
        (NOUSE_GPU_TYPE, "a100"),
        (USE_GPU_UUID, "GPU-zz"),
    ] {
        let mut p = annotated(&[(k, v)]);
        p.containers[0].request.gpus = 2;
        pods.push(p);
    }
    pods.push(annotated(&[
        (USE_GPU_TYPE, "v100"),
        (NOUSE_GPU_TYPE, "t4, a10"),
    ]));
    let expected = [
        "2 GPUs with 20% cores free needed, only 1 (most 100% on GPU-b)",
        "3 GPUs below its split count needed, only 2",
        "2 GPUs with 50% cores free needed, only 1 (most 100% on GPU-b)",
        "4 healthy GPUs needed, only 3",
        "container \"b\": no GPU with 40000 MiB free (largest 1920 MiB on GPU-a)",
        "no GPU of type v100,h100 (node has NVIDIA A100-SXM4-80GB, Tesla T4)",
        "2 GPUs not of type a100 needed, only 1 (node has NVIDIA A100-SXM4-80GB, Tesla T4)",
        "no GPU with an allowed UUID",
        "no GPU of type v100, not of type t4,a10 (node has NVIDIA A100-SXM4-80GB, Tesla T4)",
    ];
    let mut written = Vec::new();
    for p in &pods {
        if let Err(u) = place(&n, p) {
            written.push(u.to_string());
        }
        let none = place(&NodeGpus::default(), p).unwrap_err().to_string();
        let lead = if p.containers.len() > 1 {
            "container \"a\": "
        } else {
            ""
        };
        assert_eq!(none, format!("{lead}no GPUs in the node's inventory"));
    }
    assert_eq!(written, expected);
}

fn frag_table(shapes: &[(u32, u32, u64)]) -> live::LiveFrag {
    use frag::{typical_pods, ModelMask, PodShape};
    live::LiveFrag::new(&typical_pods(
        shapes.iter().map(|&(milli, num, count)| {
            (
                PodShape {
                    cpu_milli: 0,
                    gpu_milli: milli,
                    num_gpu: num,
                    models: ModelMask::ANY,
                },
                count,
            )
        }),
        100.0,
    ))
}

/// Where binpack and spread look only at how full a GPU gets, the fragmentation policy looks at
/// what the typical pods could still use afterwards.
#[test]
fn fragmentation_policy_keeps_room_for_typical_pods() {
    // Typical workload: half-card pods. GPU-a has 60 % free, GPU-b 50 %.
    let n = {
        let mut n = node(&[
            dev("GPU-a", 0, "NVIDIA T4", 10000),
            dev("GPU-b", 1, "NVIDIA T4", 10000),
        ]);
        n.add(&slice("GPU-a", 4000, 40));
        n.add(&slice("GPU-b", 5000, 50));
        n
    };
    let t = frag_table(&[(500, 1, 10)]);
    // A 10 % pod: binpack takes the fuller GPU-b (leaving 40 %, too little for a half pod);
    // fragmentation takes GPU-a (leaving 50 %, still a half pod's room).
    let mut p = one(1, Memory::Percent(10), 10);
    p.gpu_policy = Policy::Binpack;
    let (a, _) = place_scored_with(&n, &p, None).unwrap();
    assert_eq!(uuids(&a), [["GPU-b"]]);
    p.gpu_policy = Policy::Fragmentation;
    let (a, _) = place_scored_with(&n, &p, Some(&t)).unwrap();
    assert_eq!(uuids(&a), [["GPU-a"]]);
    // Without a table it is binpack.
    let (a, _) = place_scored_with(&n, &p, None).unwrap();
    assert_eq!(uuids(&a), [["GPU-b"]]);

    // Node policy: placing the 10 % pod on an idle card fragments nothing a half pod needs;
    // placing it on a 55 %-free card leaves 45 %: a half pod no longer fits there.
    let idle = node(&[dev("GPU-i", 0, "NVIDIA T4", 10000)]);
    let tight = {
        let mut n = node(&[dev("GPU-t", 0, "NVIDIA T4", 10000)]);
        n.add(&slice("GPU-t", 4500, 45));
        n
    };
    p.node_policy = Policy::Fragmentation;
    let s_idle = place_scored_with(&idle, &p, Some(&t)).unwrap().1;
    let s_tight = place_scored_with(&tight, &p, Some(&t)).unwrap().1;
    assert!(s_idle > s_tight, "{s_idle} vs {s_tight}");
    // Binpack prefers the fuller node.
    p.node_policy = Policy::Binpack;
    let b_idle = place_scored_with(&idle, &p, None).unwrap().1;
    let b_tight = place_scored_with(&tight, &p, None).unwrap().1;
    assert!(b_tight > b_idle, "{b_idle} vs {b_tight}");
    // Scores stay in 0..=10 and the lean path agrees with the full one.
    let mut buf = PlaceBuf::default();
    p.node_policy = Policy::Fragmentation;
    assert_eq!(score_buf(&tight, &p, &mut buf, Some(&t)), Ok(s_tight));
    assert!(s_idle <= MAX_SCORE);
    assert!(t.fragmentation(&[1000, 450]) > t.fragmentation(&[1000, 500]));
    assert!(!t.is_empty() && live::LiveFrag::default().is_empty());
}

/// One card of 1000 MiB and 100 cores with `used` milli-GPU taken (memory and cores alike), so
/// free milli-GPU reads as free MiB.
fn milli_node(used: &[u32]) -> NodeGpus {
    let devs: Vec<_> = (0..used.len())
        .map(|i| {
            let mut d = dev(&format!("GPU-{i}"), i as u32, "NVIDIA T4", 1000);
            d.split = 100;
            d
        })
        .collect();
    let mut n = node(&devs);
    for (i, &u) in used.iter().enumerate() {
        if u > 0 {
            n.add(&slice(&format!("GPU-{i}"), u64::from(u), u / 10));
        }
    }
    n
}

/// A pod of `milli` milli-GPU on [`milli_node`] cards.
fn milli_pod(milli: u32) -> PodRequest {
    one(1, Memory::Mib(u64::from(milli)), milli / 10)
}

/// `gap-aware` prices what each gap can still hold. With twice as many 60 % pods as 40 % pods
/// typical, each 60 % pod will want a card of its own and the 40 % pods fill the holes next to
/// them: a 40 % pod goes to the idle card (leaving 60 %, a 60 % pod's room) rather than into a
/// 60 % gap (leaving 20 %, which nothing fills), where binpack takes the fuller card.
#[test]
fn gap_aware_policy_keeps_gaps_the_typical_pods_fill() {
    let t = frag_table(&[(600, 1, 20), (400, 1, 10)]);
    let n = milli_node(&[0, 400]);
    let mut p = milli_pod(400);
    p.gpu_policy = Policy::Binpack;
    assert_eq!(
        uuids(&place_scored_with(&n, &p, None).unwrap().0),
        [["GPU-1"]]
    );
    p.gpu_policy = Policy::GapAware;
    assert_eq!(
        uuids(&place_scored_with(&n, &p, Some(&t)).unwrap().0),
        [["GPU-0"]]
    );
    // Without a table it is binpack.
    assert_eq!(
        uuids(&place_scored_with(&n, &p, None).unwrap().0),
        [["GPU-1"]]
    );

    // Node policy: the lossless move scores 5, the move that spoils a 60 % gap scores less.
    p.node_policy = Policy::GapAware;
    let idle = milli_node(&[0]);
    let spoiling = milli_node(&[400]);
    let s_idle = place_scored_with(&idle, &p, Some(&t)).unwrap().1;
    let s_spoil = place_scored_with(&spoiling, &p, Some(&t)).unwrap().1;
    assert_eq!((s_idle, s_spoil), (5, 0));
    // A 60 % pod into that 60 % gap fills it: a lossless move too.
    let mut fill = milli_pod(600);
    fill.node_policy = Policy::GapAware;
    assert_eq!(place_scored_with(&spoiling, &fill, Some(&t)).unwrap().1, 5);
    // Binpack prefers the fuller node.
    p.node_policy = Policy::Binpack;
    let b_idle = place_scored_with(&idle, &p, None).unwrap().1;
    let b_spoil = place_scored_with(&spoiling, &p, None).unwrap().1;
    assert!(b_spoil > b_idle, "{b_idle} vs {b_spoil}");
    // The lean path agrees with the full one.
    p.node_policy = Policy::GapAware;
    let mut buf = PlaceBuf::default();
    assert_eq!(score_buf(&spoiling, &p, &mut buf, Some(&t)), Ok(s_spoil));
    assert_eq!(score_buf(&idle, &p, &mut buf, Some(&t)), Ok(s_idle));
}

/// The measure behind `gap-aware`: fragmentation plus eight times each GPU's unusable gap, and
/// the per-move constant that makes a lossless move step 0.
#[test]
fn gap_measure_and_steps() {
    let t = frag_table(&[(600, 1, 20), (400, 1, 10)]);
    let g = t.gaps();
    // The LP's one optimum: every 60 % pod takes a card (a whole GPU's price), 40 % pods fill
    // the holes for free.
    assert!((g.price[600] - 1000.0).abs() < 1e-6 && g.price[400].abs() < 1e-6);
    assert!((g.unusable[200] - 200.0).abs() < 1e-6);
    assert!((g.unusable[600] + 400.0).abs() < 1e-6);
    assert!(g.unusable[1000].abs() < 1e-6);
    for left in [[200u32, 1000], [600, 0], [1000, 1000]] {
        let want = t.fragmentation(&left) + 8.0 * g.waste(&left);
        assert!((t.gap_measure(&left, None) - want).abs() < 1e-6, "{left:?}");
    }
    // A 40 % pod into a 60 % gap loses the 60 % pod's whole card: 8000 milli, 27 steps down.
    let step = t.gap_step(t.gap_measure(&[600], None), &[600], &[200], None);
    assert!(step <= -20, "{step}");
    assert_eq!(live::LiveFrag::gap_score_of_step(step), 0);
    // Into a free card: lossless.
    let step = t.gap_step(t.gap_measure(&[1000], None), &[1000], &[600], None);
    assert_eq!(step, 0);
    assert_eq!(live::LiveFrag::gap_score_of_step(step), 5);
    assert_eq!(live::LiveFrag::gap_score_of_step(40), MAX_SCORE);
    // Whole cards carry no constant; a size outside the table is valued as a gap of its size.
    assert_eq!(t.gap_constant(&[1000, 1000], &[0, 1000]), 0.0);
    assert!((g.move_constant(400) + 8.0 * 400.0).abs() < 1e-6);
    assert!((g.move_constant(450) + 8.0 * g.unusable[450]).abs() < 1e-6);
    assert_eq!(g.move_constant(0), 0.0);
    // Equal tables compare equal whether or not their prices were solved.
    assert_eq!(frag_table(&[(600, 1, 20), (400, 1, 10)]), t);
}

/// Without any share shape among the typical pods the prices say nothing (`W = 0`): `gap-aware`
/// then ranks nodes by fragmentation's steps, not all alike.
#[test]
fn gap_aware_without_share_shapes_follows_fragmentation() {
    let t = frag_table(&[(1000, 1, 10), (1000, 2, 5)]);
    assert!(t.gaps().unusable.iter().all(|&u| u == 0.0));
    let mut p = milli_pod(1000);
    let scores = |policy: Policy, p: &mut PodRequest| -> Vec<u32> {
        p.node_policy = policy;
        [
            &[0, 0, 0, 0][..],
            &[0, 1000, 1000, 1000],
            &[0, 0, 1000, 1000],
        ]
        .iter()
        .map(|used| place_scored_with(&milli_node(used), p, Some(&t)).unwrap().1)
        .collect()
    };
    let frag = scores(Policy::Fragmentation, &mut p);
    let gaps = scores(Policy::GapAware, &mut p);
    assert!(gaps.iter().any(|&s| s != gaps[0]), "{gaps:?}");
    // The same order of preference as fragmentation.
    let order = |v: &[u32]| {
        let mut i: Vec<usize> = (0..v.len()).collect();
        i.sort_by_key(|&k| std::cmp::Reverse(v[k]));
        i
    };
    assert_eq!(order(&gaps), order(&frag), "{gaps:?} vs {frag:?}");
}

#[test]
fn policy_names() {
    for p in [
        Policy::Binpack,
        Policy::Spread,
        Policy::Fragmentation,
        Policy::GapAware,
    ] {
        assert_eq!(Policy::parse(p.as_str()), Some(p));
        assert!(Policy::NAMES.contains(p.as_str()));
    }
    assert_eq!(Policy::parse(" Gap-Aware "), Some(Policy::GapAware));
    assert_eq!(Policy::parse("fgd"), None);
    assert!(Policy::GapAware.uses_table() && !Policy::Spread.uses_table());
}

#[test]
fn gpu_policy_lists_read_as_hami_reads_them() {
    let p = |s| GpuPolicy::parse(s);
    assert_eq!(
        p("binpack,mutex"),
        Ok(GpuPolicy {
            order: Some(Policy::Binpack),
            mutex: true,
            topology: false,
            numa: false,
        })
    );
    // The first ordering policy wins; empty entries and spaces are ignored.
    assert_eq!(
        p(" mutex , spread,,binpack").map(|g| g.order),
        Ok(Some(Policy::Spread))
    );
    assert_eq!(p("").map(|g| (g.order, g.mutex)), Ok((None, false)));
    assert_eq!(
        p("binpack, Topology-Aware,numa").map(|g| (g.order, g.topology, g.numa)),
        Ok((Some(Policy::Binpack), true, true))
    );
    assert_eq!(p("binpack,nvlink"), Err("nvlink".into()));
    // A list without an ordering policy takes the scheduler's default.
    let pod = annotated(&[(GPU_POLICY, "mutex")]);
    assert_eq!((pod.gpu_policy, pod.mutex), (Policy::Spread, true));
    let e = PodRequest::from_annotations(
        vec![ctr("main", 1, Memory::Mib(1024), 0)],
        |k| (k == GPU_POLICY).then_some("binpack,numa-first"),
        Policy::Binpack,
        Policy::Spread,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "annotation hami.io/gpu-scheduler-policy: \"numa-first\" is not one of binpack, spread, fragmentation, gap-aware, mutex, topology-aware, numa"
    );
}

/// An 8-GPU node wired as two NVLink islands, 0-3 and 4-7 (two links between neighbours 0-1,
/// 2-3, 4-5, 6-7; one between 1-2 and 5-6), NUMA node 0 for 0-3 and 1 for 4-7.
fn islands() -> NodeGpus {
    let pairs = [
        (0, 1, 2),
        (2, 3, 2),
        (4, 5, 2),
        (6, 7, 2),
        (1, 2, 1),
        (5, 6, 1),
    ];
    let devs: Vec<DeviceInfo> = (0..8u32)
        .map(|i| {
            let mut d = dev(&format!("GPU-{i}"), i, "NVIDIA A100-SXM4-80GB", 81920);
            d.numa = Some(i / 4);
            for &(a, b, n) in &pairs {
                if a == i {
                    d.nvlinks.insert(format!("GPU-{b}"), n);
                } else if b == i {
                    d.nvlinks.insert(format!("GPU-{a}"), n);
                }
            }
            d
        })
        .collect();
    node(&devs)
}

fn with_policy(gpus: u32, pairs: &[(&str, &str)]) -> PodRequest {
    let mut p = annotated(pairs);
    p.containers[0].request.gpus = gpus;
    p
}

#[test]
fn topology_aware_takes_the_most_linked_set_and_keeps_it_for_those_who_need_it() {
    let mut n = islands();
    // Binpack alone fills the fullest GPUs: 3 and 4, which share no link.
    n.add(&slice("GPU-3", 40960, 0));
    n.add(&slice("GPU-4", 40960, 0));
    let plain = with_policy(2, &[(GPU_POLICY, "binpack")]);
    assert_eq!(uuids(&place(&n, &plain).unwrap()), [["GPU-3", "GPU-4"]]);
    // topology-aware: a pair joined by two links, the binpack order breaking the tie between
    // 2-3 (GPU-3 is the fullest) and the others.
    let linked = with_policy(2, &[(GPU_POLICY, "binpack,topology-aware")]);
    assert_eq!(uuids(&place(&n, &linked).unwrap()), [["GPU-3", "GPU-2"]]);
    // Four GPUs: one whole island (2+2+1 links), not a mix.
    let four = with_policy(4, &[(GPU_POLICY, "topology-aware")]);
    let placed = place(&islands(), &four).unwrap();
    let mut got = uuids(&placed)[0].clone();
    got.sort();
    assert_eq!(got, ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]);
    // One GPU: the least linked card, leaving linked pairs whole (0 and 3 have two links, 1 and
    // 2 three).
    let one = with_policy(1, &[(GPU_POLICY, "spread,topology-aware")]);
    assert_eq!(uuids(&place(&islands(), &one).unwrap()), [["GPU-0"]]);
    // The same decision through the one-pass scorer and the full placement.
    assert_eq!(
        score(&n, &linked).unwrap(),
        place_scored(&n, &linked).unwrap().1
    );
}

#[test]
fn numa_bind_keeps_a_container_on_one_numa_node_or_says_why() {
    let mut n = islands();
    // Node 0 has room on one GPU only.
    for g in ["GPU-0", "GPU-1", "GPU-2"] {
        n.add(&slice(g, 81920, 0));
    }
    let bound = with_policy(2, &[(NUMA_BIND, "true"), (GPU_POLICY, "binpack")]);
    let placed = place(&n, &bound).unwrap();
    let got = uuids(&placed)[0].clone();
    assert!(
        got.iter()
            .all(|u| ["GPU-4", "GPU-5", "GPU-6", "GPU-7"].contains(u)),
        "{got:?}"
    );
    // Now no NUMA node has two GPUs with room.
    for g in ["GPU-4", "GPU-5", "GPU-6"] {
        n.add(&slice(g, 81920, 0));
    }
    assert_eq!(
        err(&n, &bound),
        "2 GPUs that fit on one NUMA node (nvidia.com/numa-bind) needed, only 1"
    );
    // `numa` in the GPU policy prefers one node but does not insist.
    let soft = with_policy(2, &[(GPU_POLICY, "binpack,numa")]);
    assert_eq!(uuids(&place(&n, &soft).unwrap())[0].len(), 2);
    // A bad value names the annotation.
    let e = PodRequest::from_annotations(
        vec![ctr("main", 2, Memory::Mib(1), 0)],
        |k| (k == NUMA_BIND).then_some("yes"),
        Policy::Binpack,
        Policy::Spread,
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "annotation nvidia.com/numa-bind: \"yes\" is not one of true, false"
    );
}
