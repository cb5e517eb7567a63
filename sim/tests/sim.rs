//! vgpu-sim end to end: synthetic traces with a known optimal packing, the CLI's outputs, and a
//! CI-sized run of the real Alibaba trace (skipped with a message when the trace is absent).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use vgpu_sim::report::Published;
use vgpu_sim::run::feasible_nodes_to_find;
use vgpu_sim::trace::{load_nodes, load_pods, pod_list_path, NodeRow, PodRow};
use vgpu_sim::{simulate, simulate_with, Cluster, Policy, RunOptions, Ties, Trace};

fn node(name: &str, gpus: u32, cpu: u64, model: &str) -> NodeRow {
    NodeRow {
        name: name.into(),
        cpu_milli: cpu,
        memory_mib: 1 << 20,
        gpus,
        model: model.into(),
    }
}

fn pod(cpu: u64, num: u32, milli: u32) -> PodRow {
    PodRow {
        cpu_milli: cpu,
        memory_mib: 1024,
        num_gpu: num,
        gpu_milli: milli,
        gpu_spec: Vec::new(),
    }
}

/// Pods in file order, no tuning.
fn run_as_listed(nodes: &[NodeRow], pods: &[PodRow], policy: Policy) -> vgpu_sim::RunResult {
    let mut cluster = Cluster::new(nodes).unwrap();
    let trace = Trace::new("synthetic", pods, &mut cluster).unwrap();
    simulate(&cluster, &trace, &trace.pods, policy, 0, 1.0)
}

fn run(nodes: &[NodeRow], pods: &[PodRow], policy: Policy, seed: u64) -> vgpu_sim::RunResult {
    let mut cluster = Cluster::new(nodes).unwrap();
    let trace = Trace::new("synthetic", pods, &mut cluster).unwrap();
    let arrivals = trace.arrivals(cluster.gpu_capacity(), 1.0, seed);
    simulate(&cluster, &trace, &arrivals, policy, seed, 1.0)
}

/// Two 8-GPU nodes; eight 1-GPU pods and one 8-GPU pod fill them exactly, but only if the
/// 1-GPU pods share one node. Request = capacity, so tuning adds nothing.
#[test]
fn whole_gpu_pods_pack_so_the_eight_gpu_pod_fits() {
    let nodes = [node("n0", 8, 64_000, "A"), node("n1", 8, 64_000, "A")];
    let mut pods = vec![pod(1000, 1, 1000); 8];
    pods.push(pod(8000, 8, 1000));
    for policy in [
        Policy::BestFit,
        Policy::GpuPacking,
        Policy::Fgd,
        Policy::Ours,
        Policy::FgdLive,
        Policy::OursLive,
    ] {
        for seed in 0..20 {
            let r = run(&nodes, &pods, policy, seed);
            assert_eq!(r.pods, 9);
            assert_eq!(r.failed, 0, "{policy} seed {seed}: {:?}", r.placements);
            assert_eq!(r.at(100), Some(100.0), "{policy} seed {seed}");
        }
    }
    // Random spreads the small pods and must lose the big one for some order.
    let lost = (0..20)
        .filter(|&s| run(&nodes, &pods, Policy::Random, s).failed > 0)
        .count();
    assert!(lost > 0, "random never blocked the 8-GPU pod in 20 seeds");
}

/// kube-scheduler's sample sizes (numFeasibleNodesToFind): all under 100 nodes, at least 100,
/// the adaptive default at 0.
#[test]
fn the_sample_is_kube_schedulers() {
    assert_eq!(feasible_nodes_to_find(100, 5000), 5000);
    assert_eq!(feasible_nodes_to_find(10, 5000), 500);
    assert_eq!(feasible_nodes_to_find(0, 5000), 500);
    assert_eq!(feasible_nodes_to_find(0, 1213), 497);
    assert_eq!(feasible_nodes_to_find(0, 100_000), 5000);
    assert_eq!(feasible_nodes_to_find(10, 1000), 100);
    assert_eq!(feasible_nodes_to_find(10, 60), 60);
}

/// With a sample, a pod sees only its window: two half-GPU pods on 200 idle one-GPU nodes share
/// a GPU when the extender sees every node, and land a window apart when kube-scheduler samples
/// half of them (the second pod's window starts where the first's search stopped).
#[test]
fn a_sampled_pod_chooses_within_its_window() {
    let nodes: Vec<NodeRow> = (0..200)
        .map(|i| node(&format!("n{i:03}"), 1, 8000, "A"))
        .collect();
    let pods = vec![pod(1000, 1, 500); 2];
    let mut cluster = Cluster::new(&nodes).unwrap();
    let trace = Trace::new("synthetic", &pods, &mut cluster).unwrap();
    let placed = |percentage_of_nodes_to_score| {
        let opts = RunOptions {
            percentage_of_nodes_to_score,
            ..RunOptions::default()
        };
        simulate_with(
            &cluster,
            &trace,
            &trace.pods,
            Policy::OursLive,
            42,
            1.0,
            opts,
        )
        .placements
    };
    assert_eq!(placed(100), vec![Some(0), Some(0)]);
    assert_eq!(placed(50), vec![Some(0), Some(100)]);
}

/// The tie rule. Four idle 1-GPU nodes and four whole-GPU pods: every move leaves nothing
/// fragmented, so the extender's scores tie on every node. Ties to the smallest name (the
/// extender's `--choose-node`) fill the nodes in name order for every seed; kube-scheduler's
/// random ties do not.
#[test]
fn ties_go_to_the_smallest_name_or_at_random() {
    let nodes: Vec<NodeRow> = (0..4)
        .map(|i| node(&format!("n{i}"), 1, 8000, "A"))
        .collect();
    let pods = vec![pod(1000, 1, 1000); 4];
    let mut cluster = Cluster::new(&nodes).unwrap();
    let trace = Trace::new("synthetic", &pods, &mut cluster).unwrap();
    let placed = |ties: Ties, seed: u64| {
        let opts = RunOptions {
            ties,
            ..RunOptions::default()
        };
        let r = simulate_with(
            &cluster,
            &trace,
            &trace.pods,
            Policy::FgdLive,
            seed,
            1.0,
            opts,
        );
        r.placements
    };
    let in_order = vec![Some(0), Some(1), Some(2), Some(3)];
    assert!((0..20).all(|seed| placed(Ties::Name, seed) == in_order));
    let shuffled = (0..20)
        .filter(|&seed| placed(Ties::Random, seed) != in_order)
        .count();
    assert!(
        shuffled > 10,
        "random ties kept name order in {} of 20",
        20 - shuffled
    );
    // Either way every pod is placed.
    assert!((0..20).all(|seed| placed(Ties::Random, seed).iter().all(Option::is_some)));
}

/// Two 1-GPU nodes; 600m and 400m shares pair up to fill both GPUs. When both 400s come first,
/// best-fit stacks them on one GPU (200m left, useless) and loses a 600; the fragmentation-aware
/// policies keep both GPUs able to take a 600.
#[test]
fn share_pods_pair_up_to_full_gpus() {
    let nodes = [node("n0", 1, 32_000, "A"), node("n1", 1, 32_000, "A")];
    let pods = [
        pod(1000, 1, 600),
        pod(1000, 1, 400),
        pod(1000, 1, 600),
        pod(1000, 1, 400),
    ];
    // DRA mode with vgpu's node scores pairs them too, though the GPU is first fit's.
    for policy in [
        Policy::Fgd,
        Policy::Ours,
        Policy::FgdLive,
        Policy::OursLive,
        Policy::DraExtender,
    ] {
        for seed in 0..20 {
            let r = run(&nodes, &pods, policy, seed);
            assert_eq!(r.failed, 0, "{policy} seed {seed}");
            assert_eq!(r.at(100), Some(100.0));
        }
    }
    let lost = (0..20)
        .filter(|&s| run(&nodes, &pods, Policy::BestFit, s).failed > 0)
        .count();
    assert!(lost > 0, "best-fit never stacked the 400s in 20 seeds");
}

/// CPU and memory must fit (NodeResourcesFit), GPU model lists are honoured.
#[test]
fn cpu_memory_and_model_constraints_hold() {
    let nodes = [node("n0", 1, 4000, "T4"), node("n1", 1, 64_000, "V100")];
    // Too much CPU for n0: must go to n1, then the second one fails.
    let r = run_as_listed(
        &nodes,
        &[pod(8000, 1, 1000), pod(8000, 1, 1000)],
        Policy::BestFit,
    );
    assert_eq!(r.failed, 1);
    assert_eq!(r.placements.iter().flatten().collect::<Vec<_>>(), vec![&1]);
    // Memory larger than any node: fails everywhere.
    let mut big = pod(1000, 1, 500);
    big.memory_mib = 2 << 20;
    assert_eq!(run_as_listed(&nodes, &[big], Policy::Fgd).failed, 1);
    // gpu_spec T4 only: lands on n0 even where best-fit would not care.
    let mut typed = pod(1000, 1, 1000);
    typed.gpu_spec = vec!["t4".into()];
    let r = run_as_listed(&nodes, &[typed.clone(), typed], Policy::Ours);
    assert_eq!(r.placements, vec![Some(0), None]);
}

/// Arrival recording: one point per 1 % up to `tune`, allocation non-decreasing, at most 100 %
/// and at most what arrived.
#[test]
fn allocation_is_recorded_at_every_percent_of_arrival() {
    let nodes = [node("n0", 8, 96_000, "A"), node("n1", 4, 48_000, "A")];
    let pods = [
        pod(4000, 1, 500),
        pod(2000, 1, 250),
        pod(8000, 1, 1000),
        pod(16_000, 2, 1000),
        pod(4000, 0, 0),
    ];
    let mut cluster = Cluster::new(&nodes).unwrap();
    let trace = Trace::new("mix", &pods, &mut cluster).unwrap();
    let cap = cluster.gpu_capacity();
    let arrivals = trace.arrivals(cap, 1.3, 7);
    let total: u64 = arrivals
        .iter()
        .map(|&p| trace.classes[p as usize].shape.total_milli())
        .sum();
    assert!(total as f64 <= 1.3 * cap as f64);
    assert!(
        total as f64 > 1.3 * cap as f64 - 1000.0,
        "tuning stopped early: {total}"
    );
    assert_eq!(
        arrivals,
        trace.arrivals(cap, 1.3, 7),
        "same seed, same workload"
    );
    assert_ne!(arrivals, trace.arrivals(cap, 1.3, 8));
    for policy in Policy::ALL {
        let r = simulate(&cluster, &trace, &arrivals, policy, 7, 1.3);
        assert_eq!(r.alloc_pct.len(), 131, "{policy}");
        for (k, w) in r.alloc_pct.windows(2).enumerate() {
            assert!(w[0] <= w[1] + 1e-9, "{policy}: allocation fell at {k}");
        }
        assert!(r.alloc_pct.iter().all(|&a| a <= 100.0), "{policy}");
        let last = *r.alloc_pct.last().unwrap();
        assert!(
            last <= total as f64 * 100.0 / cap as f64 + 1e-9,
            "{policy}: {last}"
        );
    }
    // Over the target: pods are removed until the request fits 0.5 x capacity.
    let down = trace.arrivals(cap, 0.2, 3);
    let total: u64 = down
        .iter()
        .map(|&p| trace.classes[p as usize].shape.total_milli())
        .sum();
    assert!(total as f64 <= 0.2 * cap as f64);
}

/// `fgd-live` and `ours-live` are the extender's `fragmentation` and `gap-aware` policies: on
/// random node states, the simulator's score and GPU pick equal what `vgpu_core::placement`
/// gives for the same node described as the extender sees it (cards of 1000 MiB and 100 cores,
/// so free milli-GPU reads as free MiB).
#[test]
fn live_policies_score_as_the_extender() {
    use vgpu_core::assignment::DeviceSlice;
    use vgpu_core::inventory::DeviceInfo;
    use vgpu_core::placement::host::{HostLeft, HostRequest};
    use vgpu_core::placement::{
        place_scored_with, standing_buf, Gpu, GpuFilter, GpuHot, GpuSet, NodeGpus, PlaceBuf,
        PodRequest,
    };
    use vgpu_core::request::{Memory, VgpuRequest};
    use vgpu_sim::policy::{score, GpuPick, NodeState};
    use vgpu_sim::rng::Rng;

    /// The node as the extender's cache holds it: its GPUs and what its CPU and memory leave.
    struct Live<'a>(&'a NodeGpus, HostLeft);
    impl GpuSet for Live<'_> {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn hot(&self, i: usize) -> GpuHot {
            self.0.hot(i)
        }
        fn uuid(&self, i: usize) -> &str {
            self.0.uuid(i)
        }
        fn model(&self, i: usize) -> &str {
            self.0.model(i)
        }
        fn type_ok(&self, i: usize, filter: &GpuFilter) -> bool {
            self.0.type_ok(i, filter)
        }
        fn host_left(&self) -> Option<HostLeft> {
            Some(self.1)
        }
    }

    let nodes = [node("n0", 8, 1 << 30, "A")];
    let sizes = [100, 160, 250, 300, 470, 500, 600, 810];
    let mut pods: Vec<PodRow> = sizes.iter().map(|&m| pod(1000, 1, m)).collect();
    pods.extend([pod(1000, 1, 1000), pod(1000, 2, 1000), pod(1000, 0, 0)]);
    pods.extend([pod(1000, 1, 470), pod(1000, 1, 810), pod(1000, 1, 810)]);
    // CPU-heavy pods of the same sizes: the host terms tell nodes apart by CPU.
    pods.extend([pod(8000, 1, 470), pod(16000, 1, 250), pod(4000, 2, 1000)]);
    let mut cluster = Cluster::new(&nodes).unwrap();
    let trace = Trace::new("live", &pods, &mut cluster).unwrap();
    let mut rng = Rng::new(5);
    let mut compared = 0;
    for _ in 0..300 {
        let ngpu = 1 + rng.below(8) as usize;
        let mut gpu_left = [0u32; vgpu_sim::trace::MAX_GPUS];
        for g in gpu_left.iter_mut().take(ngpu) {
            *g = [0, 1000, 1000, 190, 530, 400, 500, 840, 60][rng.below(9) as usize];
        }
        let host = HostLeft {
            cpu_milli: [1000, 4000, 9000, 20_000, 1 << 30][rng.below(5) as usize],
            mem_mib: [1024, 4096, 1 << 30][rng.below(3) as usize],
            model: 0,
        };
        let devs: Vec<Gpu> = (0..ngpu)
            .map(|i| {
                Gpu::from_device(&DeviceInfo {
                    uuid: format!("GPU-{i}"),
                    index: i as u32,
                    model: "A".into(),
                    memory_mib: 1000,
                    cores: 100,
                    split: 100,
                    numa: None,
                    healthy: true,
                    vendor: String::new(),
                    nvlinks: Default::default(),
                })
            })
            .collect();
        let mut gpus = NodeGpus::new(devs);
        for (i, &left) in gpu_left.iter().take(ngpu).enumerate() {
            let used = 1000 - left;
            if used > 0 {
                gpus.add(&DeviceSlice {
                    uuid: format!("GPU-{i}"),
                    memory_mib: u64::from(used),
                    cores: used / 10,
                    exclusive: false,
                });
            }
        }
        let live_node = Live(&gpus, host);
        for (policy, live_policy) in [
            (Policy::FgdLive, vgpu_core::placement::Policy::Fragmentation),
            (Policy::OursLive, vgpu_core::placement::Policy::GapAware),
        ] {
            let mut st = NodeState {
                cpu_left: host.cpu_milli,
                mem_left: host.mem_mib,
                cpu_mem_cap: (host.cpu_milli, host.mem_mib),
                gpu_left,
                ngpu,
                model: 0,
                kinds: [0; vgpu_sim::trace::MAX_GPUS + 1],
                version: 1,
                frag: 0.0,
            };
            st.frag = match policy {
                Policy::FgdLive => trace.live.fragmentation(st.gpus()),
                _ => trace.live.gap_measure(st.gpus(), Some(host)),
            };
            for c in &trace.classes {
                let s = c.shape;
                if s.num_gpu == 0 {
                    continue;
                }
                let mut req = PodRequest::simple(vec![vgpu_core::placement::ContainerRequest {
                    name: "main".into(),
                    request: VgpuRequest {
                        gpus: s.num_gpu,
                        memory: Memory::Mib(u64::from(s.gpu_milli)),
                        cores: s.gpu_milli / 10,
                    },
                }]);
                req.node_policy = live_policy;
                req.gpu_policy = live_policy;
                req.host = HostRequest {
                    cpu_milli: s.cpu_milli,
                    mem_mib: c.memory_mib,
                };
                // The simulator checks CPU and memory itself; the extender leaves them to
                // kube-scheduler's NodeResourcesFit, so compare where they fit.
                if host.cpu_milli < s.cpu_milli || host.mem_mib < c.memory_mib {
                    continue;
                }
                let table = Some(&trace.live);
                let live = place_scored_with(&live_node, &req, table).ok();
                let standing = standing_buf(&live_node, &req, &mut PlaceBuf::default(), table);
                // kube-scheduler's score (0..=10) without --choose-node, the rank with it.
                for choose_node in [false, true] {
                    let sim = score(policy, &st, c, &trace, choose_node);
                    let (sim_fits, live_fits) = (sim.is_some(), live.is_some());
                    let (Some((sim_score, pick)), Some((assigned, _)), Ok(st)) =
                        (sim, live.as_ref(), standing)
                    else {
                        assert!(!sim_fits && !live_fits, "{policy} {s:?} {gpu_left:?}");
                        continue;
                    };
                    let want = if choose_node {
                        st.rank
                    } else {
                        i64::from(st.score)
                    };
                    assert_eq!(sim_score, want, "{policy} {s:?} {gpu_left:?} {host:?}");
                    if let GpuPick::Index(i) = pick {
                        assert_eq!(
                            assigned[0].devices[0].uuid,
                            format!("GPU-{i}"),
                            "{policy} {s:?} {gpu_left:?}"
                        );
                    }
                    compared += 1;
                }
            }
        }
    }
    assert!(compared > 2000, "{compared}");
}

fn write_synthetic_dir(dir: &Path) {
    std::fs::write(
        dir.join("openb_node_list_gpu_node.csv"),
        "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,A\nn1,64000,262144,8,A\nn2,32000,131072,2,B\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("openb_pod_list_tiny.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np0,4000,8192,1,500,\np1,8000,16384,1,1000,\np2,2000,4096,0,0,\np3,16000,32768,2,1000,B\np4,3000,4096,1,250,A|B\n",
    )
    .unwrap();
}

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vgpu-sim"))
}

#[test]
fn cli_writes_csv_summary_json_and_svg() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic_dir(dir.path());
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let status = bin()
        .arg("--trace-dir")
        .arg(dir.path())
        .args([
            "--trace",
            "tiny",
            "--policy",
            "all",
            "--seeds",
            "1-3",
            "--threads",
            "2",
        ])
        .arg("--csv")
        .arg(out.join("runs.csv"))
        .arg("--summary-json")
        .arg(out.join("summary.json"))
        .arg("--svg")
        .arg(out.join("plot.svg"))
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let table = String::from_utf8(status.stdout).unwrap();
    assert!(
        table.contains("alloc@100") && table.contains("ours"),
        "{table}"
    );

    let csv = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let mut lines = csv.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("workload,sc_policy,tune,seed,total_gpus,0,1,"));
    assert!(header.ends_with(",130"));
    let rows: Vec<&str> = lines.collect();
    assert_eq!(rows.len(), Policy::ALL.len() * 3);
    assert!(rows.iter().any(|r| r.starts_with("tiny,fgd,1.3,2,18,")));
    assert_eq!(rows[0].split(',').count(), 5 + 131);

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let items = json.as_array().unwrap();
    assert_eq!(items.len(), Policy::ALL.len());
    for it in items {
        assert_eq!(it["trace"], "tiny");
        assert_eq!(it["seeds"], serde_json::json!([1, 2, 3]));
        assert!(it["alloc_pct_at_100"].as_f64().unwrap() <= 100.0);
        assert!(
            it["alloc_pct_at_130"].as_f64().unwrap() >= it["alloc_pct_at_100"].as_f64().unwrap()
        );
    }
    let names: Vec<&str> = items
        .iter()
        .map(|i| i["policy"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "random",
            "dotprod",
            "bestfit",
            "gpu-packing",
            "gpu-clustering",
            "fgd",
            "ours",
            "fgd-live",
            "ours-live",
            "dra-default",
            "dra-extender"
        ]
    );

    let svg = std::fs::read_to_string(out.join("plot.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(
        svg.matches("<polyline").count(),
        Policy::ALL.len() * 2,
        "two panels of every policy"
    );
}

#[test]
fn cli_rejects_bad_input_with_named_field() {
    let dir = tempfile::tempdir().unwrap();
    write_synthetic_dir(dir.path());
    let run = |args: &[&str]| {
        let o = bin()
            .arg("--trace-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(!o.status.success());
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(run(&["--trace", "tiny", "--policy", "worstfit"]).contains("unknown policy `worstfit`"));
    assert!(run(&["--trace", "tiny", "--seeds", "9-3"]).contains("--seeds"));
    assert!(run(&["--trace", "nope"]).contains("openb_pod_list_nope.csv"));
    assert!(run(&["--trace", "tiny", "--tune", "0"]).contains("--tune"));
    std::fs::write(
        dir.path().join("openb_pod_list_bad.csv"),
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,3,500\n",
    )
    .unwrap();
    assert!(run(&["--trace", "bad"]).contains(":2: field `gpu_milli`"));
}

/// The folder of the trace's CSVs: `VGPU_SIM_TRACE_DIR` (as the CLI reads it) when set, else
/// `shared/traces/alibaba-gpu-v2023` next to the workspace root, if this checkout has it; with the
/// published results file when one is found (`VGPU_SIM_EXPECTED`, else `fgd-expected/` beside
/// the trace folder).
fn real_trace() -> Option<(PathBuf, Option<PathBuf>)> {
    let data = match std::env::var_os("VGPU_SIM_TRACE_DIR") {
        Some(d) => PathBuf::from(d),
        None => {
            let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
            root.parent()?.join("shared/traces/alibaba-gpu-v2023")
        }
    };
    if !data.join("openb_pod_list_default.csv").exists() {
        return None;
    }
    let published = match std::env::var_os("VGPU_SIM_EXPECTED") {
        // Named explicitly: it must be there (the test then fails on loading it).
        Some(f) => Some(PathBuf::from(f)),
        None => data
            .parent()
            .map(|p| p.join("fgd-expected/analysis_allo_discrete.csv"))
            .filter(|f| f.exists()),
    };
    Some((data, published))
}

/// CI-sized run of the real trace: the default pod list, one seed, FGD and ours.
#[test]
fn real_trace_fgd_matches_published_and_ours_beats_it() {
    let Some((data, published)) = real_trace() else {
        eprintln!("skipped: no trace (set VGPU_SIM_TRACE_DIR to the folder of openb_pod_list_default.csv, or keep shared/traces/alibaba-gpu-v2023 next to the workspace)");
        return;
    };
    let mut cluster =
        Cluster::new(&load_nodes(&data.join("openb_node_list_gpu_node.csv")).unwrap()).unwrap();
    assert_eq!(cluster.nodes.len(), 1213);
    assert_eq!(cluster.gpu_count(), 6212);
    let trace = Trace::new(
        "default",
        &load_pods(&pod_list_path(&data, "default")).unwrap(),
        &mut cluster,
    )
    .unwrap();
    let arrivals = trace.arrivals(cluster.gpu_capacity(), 1.3, 42);
    let fgd = simulate(&cluster, &trace, &arrivals, Policy::Fgd, 42, 1.3);
    let ours = simulate(&cluster, &trace, &arrivals, Policy::Ours, 42, 1.3);
    let (f, o) = (fgd.at(100).unwrap(), ours.at(100).unwrap());
    eprintln!("default seed 42: fgd {f:.2}, ours {o:.2}");
    if let Some(file) = published {
        let p = Published::load(&file)
            .unwrap_or_else(|e| panic!("published results {}: {e}", file.display()));
        let reference = p.at_100("default", Policy::Fgd).unwrap();
        assert!((reference - 95.23).abs() < 0.01);
        assert!(
            (f - reference).abs() < 1.5,
            "one seed of fgd {f} far from published mean {reference}"
        );
    }
    assert!(o > f, "ours {o} <= fgd {f}");
}
