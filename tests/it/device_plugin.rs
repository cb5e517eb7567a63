//! The real `vgpu-device-plugin` binary against its real boundaries: the fake NVML loaded through
//! `--nvml-lib` (dlopen), the fake kubelet over unix-socket gRPC, and the fake API server over HTTPS
//! through a kubeconfig.

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vgpu_core::accounting::{ProcessUsage, Snapshot};
use vgpu_core::annotations::{ASSIGNMENT, MANAGED_LABEL, NODE_DEVICES, NODE_HEARTBEAT};
use vgpu_core::assignment::{ContainerAssignment, DeviceSlice, PodAssignment};
use vgpu_core::inventory::NodeInventory;
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_fake_kubelet::api::Device;
use vgpu_fake_kubelet::FakePodResources;
use vgpu_fake_kubelet::{FakeKubelet, PluginClient};
use vgpu_tests::net::free_port;
use vgpu_tests::process::Running;

const NODE: &str = "gpu-node-1";
const SOCKET: &str = "vgpu-nvidia.sock";
const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
const T: Duration = Duration::from_secs(10);

struct Env {
    _tmp: tempfile::TempDir,
    dp_dir: PathBuf,
    host_dir: PathBuf,
    events: PathBuf,
    faults: PathBuf,
    nvml_log: PathBuf,
    api: FakeApiServer,
    kubelet: FakeKubelet,
    plugin: Running,
    metrics_port: u16,
}

/// Two A100-40GB cards joined by two NVLinks: GPU 0 on NUMA node 0, GPU 1 without a NUMA
/// affinity. XIDs and NVML errors are injected through files beside `events`.
fn nvml_config(events: &Path) -> Value {
    let dir = events.parent().unwrap();
    json!({
        "faultsFile": dir.join("nvml-faults"),
        "logFile": dir.join("nvml.log"),
        "gpus": [
            {"uuid": GPU0, "name": "NVIDIA A100-PCIE-40GB", "memoryMib": 40960, "numa": 0,
             "busId": "00000000:3B:00.0", "utilization": [10, 20], "nvlinks": [1, 1]},
            {"uuid": GPU1, "name": "NVIDIA A100-PCIE-40GB", "memoryMib": 40960, "nvlinks": [0, 0]}
        ],
        "eventsFile": events,
    })
}

fn plugin_command(
    dp_dir: &Path,
    host_dir: &Path,
    metrics_port: u16,
    extra: &[&str],
    kubeconfig: &Path,
    config: &Path,
) -> Command {
    let mut cmd = Command::new(vgpu_tests::binary("vgpu-device-plugin"));
    cmd.arg(format!(
        "--nvml-lib={}",
        vgpu_tests::cdylib("fake_nvml").display()
    ))
    .arg(format!("--device-plugin-dir={}", dp_dir.display()))
    .arg(format!("--host-dir={}", host_dir.display()))
    .arg("--split-count=4")
    .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
    // Not the machine's own kubelet; a test that serves one passes its socket in `extra`.
    .arg("--pod-resources-socket=")
    .args(extra)
    .env("NODE_NAME", NODE)
    .env("KUBECONFIG", kubeconfig)
    .env("FAKE_NVML_CONFIG", config)
    .env("RUST_LOG", "info");
    cmd
}

async fn start(extra: &[&str]) -> Env {
    let tmp = tempfile::tempdir().unwrap();
    let dp_dir = tmp.path().join("device-plugins");
    let host_dir = tmp.path().join("vgpu");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let events = tmp.path().join("xid-events");
    std::fs::write(&events, "").unwrap();
    let faults = tmp.path().join("nvml-faults");
    std::fs::write(&faults, "").unwrap();
    let nvml_log = tmp.path().join("nvml.log");
    let config = tmp.path().join("nvml.json");
    std::fs::write(&config, nvml_config(&events).to_string()).unwrap();
    let api = FakeApiServer::start().await.unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))
        .unwrap();
    let kubelet = FakeKubelet::start(&dp_dir).await.unwrap();
    let metrics_port = free_port();
    let cmd = plugin_command(
        &dp_dir,
        &host_dir,
        metrics_port,
        extra,
        &kubeconfig,
        &config,
    );
    let plugin = Running::spawn("vgpu-device-plugin", cmd);
    Env {
        _tmp: tmp,
        dp_dir,
        host_dir,
        events,
        faults,
        nvml_log,
        api,
        kubelet,
        plugin,
        metrics_port,
    }
}

impl Env {
    /// Waits for registration number `n` (1-based), then dials the plugin as the kubelet does.
    async fn registered(&self, n: usize) -> PluginClient {
        let r = self.kubelet.wait_registrations(n, T).await;
        let r = r.unwrap_or_else(|| {
            panic!(
                "no registration #{n}; plugin output:\n{}",
                self.plugin.output().join("\n")
            )
        });
        assert_eq!(r.endpoint, SOCKET);
        vgpu_tests::wait_for_async(T, "dialing the plugin", || async {
            self.kubelet.dial(&r.endpoint).await.ok()
        })
        .await
    }

    /// Kills the plugin and starts it again with the same flags (a DaemonSet pod restart).
    fn restart_plugin(&mut self) {
        self.plugin.kill();
        let tmp = self._tmp.path();
        let cmd = plugin_command(
            &self.dp_dir,
            &self.host_dir,
            self.metrics_port,
            &[],
            &tmp.join("kubeconfig"),
            &tmp.join("nvml.json"),
        );
        self.plugin = Running::spawn("vgpu-device-plugin (restarted)", cmd);
    }

    fn registrations(&self) -> usize {
        self.kubelet.registrations().len()
    }

    fn xid(&self, gpu: u32, xid: u64) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.events)
            .unwrap();
        writeln!(f, "{gpu} {xid}").unwrap();
    }

    /// Makes the next `count` NVML calls of `function` (`*`: any) about `gpu` (all when `None`)
    /// return `error` (an nvml.h return code name).
    fn nvml_fault(&self, function: &str, error: &str, count: u32, gpu: Option<u32>) {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.faults)
            .unwrap();
        let gpu = gpu.map(|g| g.to_string()).unwrap_or_default();
        writeln!(f, "{function} {error} {count} {gpu}").unwrap();
    }

    /// The fake NVML's log lines split on whitespace (`xid <µs> <gpu> <xid>`,
    /// `fault <µs> <function> <code> <gpu>`).
    fn nvml_log(&self) -> Vec<Vec<String>> {
        std::fs::read_to_string(&self.nvml_log)
            .unwrap_or_default()
            .lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect())
            .collect()
    }

    /// A Pending vGPU pod bound to this node, with an assignment unless `assignment` is `None`.
    fn pod(&self, name: &str, assignment: Option<&PodAssignment>) -> String {
        self.pod_with(name, assignment, json!({"name": "main", "image": "cuda"}))
    }

    /// [`Env::pod`] with this container spec.
    fn pod_with(&self, name: &str, assignment: Option<&PodAssignment>, container: Value) -> String {
        let mut annotations = serde_json::Map::new();
        if let Some(a) = assignment {
            annotations.insert(ASSIGNMENT.into(), a.encode().into());
        }
        let pod = self
            .api
            .create(json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "team-a",
                    "labels": {MANAGED_LABEL: "true"}, "annotations": annotations},
                "spec": {"nodeName": NODE, "containers": [container]},
                "status": {"phase": "Pending"}
            }))
            .unwrap();
        pod["metadata"]["uid"].as_str().unwrap().to_string()
    }

    fn node_annotations(&self) -> Value {
        self.api
            .get("v1", "nodes", "", NODE)
            .map(|n| n["metadata"]["annotations"].clone())
            .unwrap_or(Value::Null)
    }

    async fn metrics(&self) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.metrics_port))
            .await
            .unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }
}

/// (uuid, MiB, cores) of one slice.
type Slice<'a> = (&'a str, u64, u32);

fn assignment(containers: &[(&str, &[Slice<'_>])]) -> PodAssignment {
    PodAssignment::new(
        NODE,
        containers
            .iter()
            .map(|(name, devs)| ContainerAssignment {
                name: name.to_string(),
                devices: devs
                    .iter()
                    .map(|(u, m, c)| DeviceSlice {
                        uuid: u.to_string(),
                        memory_mib: *m,
                        cores: *c,
                        exclusive: false,
                    })
                    .collect(),
            })
            .collect(),
    )
}

fn health_of<'a>(devices: &'a [Device], uuid: &str) -> Vec<&'a str> {
    devices
        .iter()
        .filter(|d| d.id.starts_with(&format!("{uuid}::")))
        .map(|d| d.health.as_str())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_and_lists_split_devices_with_numa() {
    let env = start(&[]).await;
    let r = env.kubelet.wait_registrations(1, T).await.unwrap();
    assert_eq!(r.version, "v1beta1");
    assert_eq!(r.resource_name, "nvidia.com/gpu");
    assert!(r.options.unwrap().get_preferred_allocation_available);
    let mut c = env.registered(1).await;
    let opts = c
        .client
        .get_device_plugin_options(vgpu_fake_kubelet::api::Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(opts.get_preferred_allocation_available && !opts.pre_start_required);
    let devices = c.list_and_watch().await.unwrap().next(T).await.unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(devices.len(), 2 * 4, "2 GPUs x --split-count 4: {ids:?}");
    assert_eq!(ids[0], format!("{GPU0}::0"));
    assert_eq!(ids[7], format!("{GPU1}::3"));
    assert!(devices.iter().all(|d| d.health == "Healthy"));
    assert_eq!(devices[0].topology.as_ref().unwrap().nodes[0].id, 0);
    assert!(devices[4].topology.is_none(), "GPU 1 has no NUMA node");
}

fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn critical_xid_flips_health_within_a_second_and_recovers() {
    let env = start(&["--xid-recovery-seconds=2"]).await;
    let mut c = env.registered(1).await;
    let mut watch = c.list_and_watch().await.unwrap();
    watch.next(T).await.unwrap();
    // XID 43 (GPU stopped processing) is the application's fault: ignored.
    env.xid(1, 43);
    env.xid(0, 79); // fell off the bus
    let list = watch
        .until(T, |d| health_of(d, GPU0).iter().all(|h| *h == "Unhealthy"))
        .await
        .expect("GPU 0 turns unhealthy");
    let received = unix_micros();
    assert!(health_of(&list, GPU1).iter().all(|h| *h == "Healthy"));
    // The 1 s budget runs from the moment NVML handed the event to the plugin (the fake's log,
    // written inside nvmlEventSetWait before it returns) to the stream's update reaching us: the
    // fake's own file polling and the test's setup are not the plugin's latency.
    let log = env.nvml_log();
    let delivered = |gpu: &str, xid: &str| {
        log.iter()
            .find(|l| l.len() == 4 && l[0] == "xid" && l[2] == gpu && l[3] == xid)
            .map(|l| l[1].parse::<u128>().unwrap())
    };
    let t79 = delivered("0", "79").expect("XID 79 delivered");
    assert!(
        delivered("1", "43").is_some(),
        "XID 43 was delivered (and ignored)"
    );
    let latency = Duration::from_micros((received - t79) as u64);
    eprintln!("XID 79: NVML delivery to stream update {latency:?}");
    assert!(
        latency < Duration::from_secs(1),
        "event to stream update took {latency:?}"
    );
    // The inventory follows.
    vgpu_tests::wait_for_async(T, "inventory shows GPU 0 unhealthy", || async {
        let a = env.node_annotations();
        let inv = NodeInventory::decode(a[NODE_DEVICES].as_str()?).ok()?;
        (!inv.devices[0].healthy && inv.devices[1].healthy).then_some(())
    })
    .await;
    // Quiet for the recovery window, then a probe NVML answers: healthy again.
    watch
        .until(T, |d| d.iter().all(|x| x.health == "Healthy"))
        .await
        .expect("GPU 0 recovers");
}

/// HAMi's settings from the pod spec reach the container: `nvidia.com/priority` and
/// `GPU_CORE_UTILIZATION_POLICY` in the limits file, `CUDA_DISABLE_CONTROL` drops the preload
/// list; a pod lifting a limit outside `--disable-control-namespaces` is not started.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hami_settings_from_the_pod_reach_the_container() {
    let env = start(&["--disable-control-namespaces=admin,team-a"]).await;
    let mut c = env.registered(1).await;
    let main = |env_vars: Value| {
        json!({"name": "main", "image": "cuda", "env": env_vars,
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}}})
    };
    // A damaged activity file for the GPU is replaced at the next Allocate.
    let board = env.host_dir.join(format!("gpus/{GPU0}"));
    std::fs::create_dir_all(board.parent().unwrap()).unwrap();
    std::fs::write(&board, b"not a layout").unwrap();
    env.pod_with(
        "urgent",
        Some(&assignment(&[("main", &[(GPU0, 1024, 30)])])),
        main(
            json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "Default"},
            {"name": "CUDA_DISABLE_CONTROL", "value": "true"}]),
        ),
    );
    let r = c.allocate(&[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(r.envs["CUDA_TASK_PRIORITY"], "0");
    let bytes = std::fs::read(&board).unwrap();
    assert_eq!(bytes.len(), vgpu_core::activity::FILE_BYTES);
    assert!(vgpu_core::activity::header_bytes_ok(&bytes));
    assert_eq!(r.envs["GPU_CORE_UTILIZATION_POLICY"], "default");
    assert!(
        r.mounts
            .iter()
            .all(|m| m.container_path != "/etc/ld.so.preload"),
        "{:?}",
        r.mounts
    );
    drop(c);
    drop(env);

    let env = start(&["--disable-control-namespaces=admin"]).await;
    let mut c = env.registered(1).await;
    env.pod_with(
        "lifted",
        Some(&assignment(&[("main", &[(GPU0, 1024, 30)])])),
        main(json!([{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}])),
    );
    let e = c.allocate(&[&format!("{GPU0}::0")]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "pod team-a/lifted container \"main\": GPU_CORE_UTILIZATION_POLICY=disable lifts a vGPU limit, and the pod's namespace is not in --disable-control-namespaces"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allocate_single_and_multi_gpu_from_the_assignment() {
    let env = start(&["--memory-scaling=2"]).await;
    let mut c = env.registered(1).await;
    // Single GPU, 50 % of a 40 GiB card with --memory-scaling 2: the scheduler resolved it to
    // 40960 MiB against the scaled inventory; the plugin passes the amount through.
    let one = env.pod("one", Some(&assignment(&[("main", &[(GPU1, 40960, 30)])])));
    let r = c.allocate(&[&format!("{GPU1}::2")]).await.unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], GPU1);
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "40960m");
    assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_0"], "30");
    assert_eq!(
        r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
        "/tmp/vgpu/vgpu.cache"
    );
    let mounts: Vec<(&str, &str, bool)> = r
        .mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str(), m.read_only))
        .collect();
    let host = env.host_dir.display().to_string();
    let dir = format!("{host}/containers/{one}_main");
    assert_eq!(
        mounts,
        vec![
            (
                "/usr/local/vgpu/libvgpu.so",
                format!("{host}/libvgpu.so").as_str(),
                true
            ),
            (
                "/etc/ld.so.preload",
                format!("{host}/ld.so.preload").as_str(),
                true
            ),
            ("/tmp/vgpu", dir.as_str(), false),
            (
                "/usr/local/vgpu/limits.env",
                format!("{host}/limits/{one}_main.env").as_str(),
                true
            ),
            (
                "/usr/local/vgpu/gpus/0",
                format!("{host}/gpus/{GPU1}").as_str(),
                false
            ),
        ]
    );
    assert!(Path::new(&dir).is_dir(), "per-container dir created");
    // The GPU's activity file: laid out, open to every container user.
    let board = env.host_dir.join(format!("gpus/{GPU1}"));
    let bytes = std::fs::read(&board).unwrap();
    assert_eq!(bytes.len(), vgpu_core::activity::FILE_BYTES);
    assert!(vgpu_core::activity::header_bytes_ok(&bytes));
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&board).unwrap().permissions().mode() & 0o777,
        0o666
    );
    // The defaults are left out (a rolled-back hook refuses names it does not know).
    assert!(!r.envs.contains_key("CUDA_TASK_PRIORITY"));
    assert!(!r.envs.contains_key("GPU_CORE_UTILIZATION_POLICY"));
    // The read-only limits file the hook trusts says exactly what the environment says.
    let file = vgpu_core::limits_file::parse(
        &std::fs::read_to_string(env.host_dir.join(format!("limits/{one}_main.env"))).unwrap(),
    )
    .unwrap();
    let envs: std::collections::BTreeMap<String, String> = r.envs.clone().into_iter().collect();
    assert_eq!(file, envs);
    assert_eq!(
        std::fs::read_to_string(env.host_dir.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );

    // Two GPUs, in the assignment's order, one limit pair per visible device.
    env.pod(
        "two",
        Some(&assignment(&[(
            "main",
            &[(GPU1, 8192, 50), (GPU0, 4096, 25)],
        )])),
    );
    let r = c
        .allocate(&[&format!("{GPU0}::0"), &format!("{GPU1}::0")])
        .await
        .unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], format!("{GPU1},{GPU0}"));
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "8192m");
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "4096m");
    assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_1"], "25");

    // Nothing left to allocate: a clear error, not a guess.
    let e = c.allocate(&[&format!("{GPU0}::1")]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message().contains("vgpu.io/assignment"),
        "{}",
        e.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_pods_of_one_shape_get_their_own_assignment() {
    let env = start(&[]).await;
    let mut c = env.registered(1).await;
    env.pod("a", Some(&assignment(&[("main", &[(GPU0, 1000, 10)])])));
    env.pod("b", Some(&assignment(&[("main", &[(GPU1, 2000, 20)])])));
    // The kubelet chose shares on the GPUs the scheduler picked, in the opposite order.
    let id0 = format!("{GPU0}::0");
    let ids0 = [id0.as_str()];
    let (rb, ra) = tokio::join!(
        async {
            let mut c2 = env.kubelet.dial(SOCKET).await.unwrap();
            c2.allocate(&[&format!("{GPU1}::0")]).await.unwrap()
        },
        c.allocate(&ids0),
    );
    let ra = ra.unwrap();
    assert_eq!(ra.envs["NVIDIA_VISIBLE_DEVICES"], GPU0);
    assert_eq!(ra.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
    assert_eq!(rb.envs["NVIDIA_VISIBLE_DEVICES"], GPU1);
    assert_eq!(rb.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "2000m");
}

/// The kubelet admits pods in the order they reach it, which kube-scheduler's binds need not
/// make the order they were created: the newer of two pending pods of one shape admitted first
/// gets its own slice, hint and answer, from what the kubelet's PodResources List shows being
/// admitted (before: the older pod's slice, each container crosswise). The plugin's watch has not
/// seen the newer pod yet when the kubelet asks, as on a busy node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_the_kubelet_admits_gets_its_own_slice_whatever_its_age() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let kubelet_pods = FakePodResources::start(&socket).unwrap();
    let env = start(&[&format!("--pod-resources-socket={}", socket.display())]).await;
    let mut c = env.registered(1).await;
    env.pod("older", Some(&assignment(&[("main", &[(GPU0, 1000, 10)])])));
    env.pod("newer", Some(&assignment(&[("main", &[(GPU1, 2000, 20)])])));
    kubelet_pods.set(&[("team-a", "newer", &[("main", &[])])], "nvidia.com/gpu");
    let avail: Vec<String> = [GPU0, GPU1]
        .iter()
        .flat_map(|g| (0..4).map(move |i| format!("{g}::{i}")))
        .collect();
    let hint = c.preferred(&avail, &[], 1).await.unwrap();
    assert!(hint[0].starts_with(GPU1), "{hint:?}");
    let newer = c.allocate(&[&hint[0]]).await.unwrap();
    assert_eq!(newer.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "2000m");
    kubelet_pods.set(
        &[
            ("team-a", "newer", &[("main", &[hint[0].as_str()])]),
            ("team-a", "older", &[("main", &[])]),
        ],
        "nvidia.com/gpu",
    );
    let hint = c.preferred(&avail, &[], 1).await.unwrap();
    assert!(hint[0].starts_with(GPU0), "{hint:?}");
    let older = c.allocate(&[&hint[0]]).await.unwrap();
    assert_eq!(older.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
    assert!(kubelet_pods.lists() >= 4, "{}", kubelet_pods.lists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_plugin_does_not_answer_a_container_twice() {
    let mut env = start(&[]).await;
    let mut c = env.registered(1).await;
    env.pod(
        "two-step",
        Some(&assignment(&[
            ("init", &[(GPU0, 1000, 0)]),
            ("main", &[(GPU0, 2000, 0)]),
        ])),
    );
    let r = c.allocate(&[&format!("{GPU0}::0")]).await.unwrap();
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "1000m");
    let pod = env.api.get("v1", "pods", "team-a", "two-step").unwrap();
    assert_eq!(pod["metadata"]["annotations"]["vgpu.io/allocated"], "init");
    let before = env.registrations();
    tokio::task::block_in_place(|| env.restart_plugin());
    let mut c = env.registered(before + 1).await;
    let r = c.allocate(&[&format!("{GPU0}::1")]).await.unwrap();
    assert_eq!(
        r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "2000m",
        "main, not init again"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_annotation_is_an_error_unless_allow_unscheduled() {
    let env = start(&[]).await;
    let mut c = env.registered(1).await;
    env.pod("bare", None);
    let e = c.allocate(&[&format!("{GPU0}::0")]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("team-a/bare: no vgpu.io/assignment annotation"),
        "{}",
        e.message()
    );
    let e = c.allocate(&["GPU-unknown::0"]).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    drop(env);

    let env = start(&["--allow-unscheduled"]).await;
    let mut c = env.registered(1).await;
    env.pod("bare", None);
    let r = c
        .allocate(&[&format!("{GPU0}::0"), &format!("{GPU1}::3")])
        .await
        .unwrap();
    assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], format!("{GPU0},{GPU1}"));
    assert!(!r.envs.keys().any(|k| k.starts_with("CUDA_DEVICE_")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preferred_allocation_follows_the_scheduler_else_packs() {
    let env = start(&[]).await;
    let mut c = env.registered(1).await;
    let all: Vec<String> = (0..4)
        .flat_map(|k| [format!("{GPU0}::{k}"), format!("{GPU1}::{k}")])
        .collect();
    // No pod waiting: pack onto the GPU with the fewest free shares (GPU 1 here).
    let avail: Vec<String> = all
        .iter()
        .filter(|i| !i.ends_with(&format!("{GPU1}::0")))
        .cloned()
        .collect();
    let p = c.preferred(&avail, &[], 1).await.unwrap();
    assert_eq!(p.len(), 1);
    assert!(p[0].starts_with(GPU1), "{p:?}");
    // A pod assigned GPU 0: its share is preferred.
    env.pod("p", Some(&assignment(&[("main", &[(GPU0, 1000, 0)])])));
    // The watch delivers the pod; poll until the hint follows it.
    let got = vgpu_tests::wait_for_async(T, "preferred follows the assignment", || {
        let avail = avail.clone();
        let kubelet = &env.kubelet;
        async move {
            let mut c2 = kubelet.dial(SOCKET).await.ok()?;
            let p = c2.preferred(&avail, &[], 1).await.ok()?;
            p.first().filter(|id| id.starts_with(GPU0)).cloned()
        }
    })
    .await;
    assert!(got.starts_with(GPU0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_restart_and_socket_removal_re_register() {
    let mut env = start(&[]).await;
    env.registered(1).await;
    let t0 = std::time::Instant::now();
    let before = env.registrations();
    env.kubelet.restart().await.unwrap();
    let c = env.registered(before + 1).await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let list = vgpu_tests::wait_for_async(T, "a device list on the new socket", || async {
        let mut c = env.kubelet.dial(SOCKET).await.ok()?;
        c.list_and_watch().await.ok()?.next(T).await
    })
    .await;
    assert_eq!(list.len(), 8);
    // Our socket deleted (by hand, by a node cleanup) while the kubelet's ListAndWatch stream is
    // still open on it: the open stream must not hold the restart back.
    let mut c = c;
    let mut open_stream = c.list_and_watch().await.unwrap();
    open_stream.next(T).await.unwrap();
    let before = env.registrations();
    std::fs::remove_file(env.dp_dir.join(SOCKET)).unwrap();
    let mut fresh = env.registered(before + 1).await;
    assert!(env.dp_dir.join(SOCKET).exists());
    let list = fresh.list_and_watch().await.unwrap().next(T).await.unwrap();
    assert_eq!(list.len(), 8);
    drop(open_stream);
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_killed_and_restarted_20_times() {
    const ROUNDS: usize = 20;
    let mut env = start(&[]).await;
    for i in 0..=ROUNDS {
        let mib = 100 + i as u64;
        env.pod(
            &format!("round-{i}"),
            Some(&assignment(&[("main", &[(GPU0, mib, 5)])])),
        );
    }
    let mut answered = std::collections::HashSet::new();
    {
        let mut c = env.registered(1).await;
        let list = c.list_and_watch().await.unwrap().next(T).await.unwrap();
        assert_eq!(list.len(), 8);
        let r = c.allocate(&[&format!("{GPU0}::0")]).await.unwrap();
        answered.insert(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"].clone());
    }
    let pid = env.plugin.pid();
    let fds_before = open_fds(pid);
    for round in 1..=ROUNDS {
        let n = env.registrations();
        // SIGKILL: the kubelet's connections drop and its socket file stays behind; the new
        // kubelet removes every socket in the directory and serves a fresh kubelet.sock.
        env.kubelet.kill();
        env.kubelet.restart().await.unwrap();
        let mut c = env.registered(n + 1).await;
        let list = c.list_and_watch().await.unwrap().next(T).await.unwrap();
        assert_eq!(list.len(), 8, "round {round}");
        assert!(list.iter().all(|d| d.health == "Healthy"), "round {round}");
        let r = c
            .allocate(&[&format!("{GPU0}::{}", round % 4)])
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], GPU0);
        assert!(
            answered.insert(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"].clone()),
            "round {round} answered a pod twice: {:?}",
            r.envs
        );
    }
    assert_eq!(answered.len(), ROUNDS + 1, "every pod answered once");
    assert!(env.registrations() > ROUNDS, "{}", env.registrations());
    // No socket or connection left behind: 20 rounds leaking one fd each would show as +20.
    // Two of slack for the API client's connection pool, which may hold one more at a time.
    let fds_after = vgpu_tests::wait_for_async(T, "the fd count back to its start", || async {
        let n = open_fds(pid);
        (n <= fds_before + 2).then_some(n)
    })
    .await;
    eprintln!("plugin fds: {fds_before} before, {fds_after} after {ROUNDS} kubelet restarts");
    let mut sockets: Vec<String> = std::fs::read_dir(&env.dp_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    sockets.sort();
    assert_eq!(sockets, ["kubelet.sock", SOCKET]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvml_errors_a_lost_gpu_turns_unhealthy_and_recovers() {
    let env = start(&["--xid-recovery-seconds=1", "--health-probe-seconds=1"]).await;
    let mut c = env.registered(1).await;
    let mut watch = c.list_and_watch().await.unwrap();
    watch.next(T).await.unwrap();
    let long = Duration::from_secs(30);

    // GPU 0 falls off the bus without an XID: every NVML call about it answers
    // NVML_ERROR_GPU_IS_LOST for a while. The periodic probe notices.
    env.nvml_fault("*", "GPU_IS_LOST", 4, Some(0));
    let list = watch
        .until(T, |d| health_of(d, GPU0).iter().all(|h| *h == "Unhealthy"))
        .await
        .expect("the lost GPU turns unhealthy");
    assert!(health_of(&list, GPU1).iter().all(|h| *h == "Healthy"));
    // Still serving: Allocate on the healthy GPU, and /metrics.
    env.pod("during", Some(&assignment(&[("main", &[(GPU1, 512, 10)])])));
    let r = c.allocate(&[&format!("{GPU1}::0")]).await.unwrap();
    assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "512m");
    let text = env.metrics().await;
    assert!(
        text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
        "{text}"
    );
    let gauge =
        |uuid: &str, v: u8| format!("vgpu_device_healthy{{node=\"{NODE}\",uuid=\"{uuid}\"}} {v}");
    assert!(text.lines().any(|l| l == gauge(GPU0, 0)), "{text}");
    assert!(text.lines().any(|l| l == gauge(GPU1, 1)), "{text}");
    // NVML answers again once the injected errors are used up: after the quiet time, a good
    // probe turns GPU 0 healthy.
    watch
        .until(long, |d| d.iter().all(|x| x.health == "Healthy"))
        .await
        .expect("GPU 0 recovers when NVML answers again");
    let used = env
        .nvml_log()
        .iter()
        .filter(|l| l[0] == "fault" && l[3] == "15" && l[4] == "0")
        .count();
    assert_eq!(used, 4, "every injected GPU_IS_LOST was returned");

    // The event wait fails (NVML_ERROR_UNKNOWN, twice). Every device still answers its probe,
    // but XIDs may have been missed: all turn unhealthy, as the NVIDIA plugin does, and recover
    // after the quiet time.
    env.nvml_fault("nvmlEventSetWait_v2", "UNKNOWN", 2, None);
    watch
        .until(T, |d| d.iter().all(|x| x.health == "Unhealthy"))
        .await
        .expect("all unhealthy after a failed wait");
    watch
        .until(long, |d| d.iter().all(|x| x.health == "Healthy"))
        .await
        .expect("all recover");
    // The plugin made a new event set: XIDs reach it again.
    env.xid(1, 48); // double-bit ECC error
    watch
        .until(T, |d| {
            health_of(d, GPU1).iter().all(|h| *h == "Unhealthy")
                && health_of(d, GPU0).iter().all(|h| *h == "Healthy")
        })
        .await
        .expect("XIDs are watched again after the wait failed");
    assert!(env.plugin.output().iter().all(|l| !l.contains("panicked")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_removes_the_socket() {
    let mut env = start(&[]).await;
    env.registered(1).await;
    assert!(env.dp_dir.join(SOCKET).exists());
    vgpu_tests::wait_for_async(T, "the Node's capacity written", || async {
        let node = env.api.get("v1", "nodes", "", NODE)?;
        node["status"]["capacity"]["nvidia.com/gpumem"]
            .as_str()
            .map(drop)
    })
    .await;
    let st = Command::new("kill")
        .arg("-TERM")
        .arg(env.plugin.pid().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let status = tokio::task::block_in_place(|| env.plugin.wait_exit(T)).expect("exits");
    assert!(status.success(), "{status}");
    assert!(!env.dp_dir.join(SOCKET).exists());
    // The Node keeps no capacity for a plugin that left.
    let node = env.api.get("v1", "nodes", "", NODE).unwrap();
    assert_eq!(node["status"]["capacity"], json!({}), "{node}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_inventory_and_heartbeat() {
    let env = start(&[
        "--memory-scaling=1.5",
        "--core-scaling=2",
        "--heartbeat-seconds=1",
    ])
    .await;
    env.registered(1).await;
    let first = vgpu_tests::wait_for_async(T, "node annotations", || async {
        let a = env.node_annotations();
        Some((
            a[NODE_DEVICES].as_str()?.to_string(),
            a[NODE_HEARTBEAT].as_str()?.to_string(),
        ))
    })
    .await;
    let inv = NodeInventory::decode(&first.0).unwrap();
    assert_eq!(inv.version, 1);
    assert_eq!(inv.devices.len(), 2);
    let d = &inv.devices[0];
    assert_eq!(
        (d.uuid.as_str(), d.index, d.model.as_str()),
        (GPU0, 0, "NVIDIA A100-PCIE-40GB")
    );
    assert_eq!((d.memory_mib, d.cores, d.split), (61440, 200, 4));
    assert_eq!((d.numa, d.healthy), (Some(0), true));
    assert_eq!(inv.devices[1].numa, None);
    // NVLinks from NVML, by the peer's UUID.
    assert_eq!(d.nvlinks, [(GPU1.to_string(), 2)].into());
    assert_eq!(inv.devices[1].nvlinks, [(GPU0.to_string(), 2)].into());
    vgpu_core::time::parse_rfc3339(&first.1).unwrap();
    // The Node's capacity holds every slice the scheduler may place (inventory::capacity).
    let capacity = || {
        env.api
            .get("v1", "nodes", "", NODE)
            .map(|n| n["status"]["capacity"].clone())
            .unwrap_or(Value::Null)
    };
    let want = json!({"nvidia.com/gpumem": "122880", "nvidia.com/gpumem-percentage": "200",
        "nvidia.com/gpucores": "400", "nvidia.com/priority": "8"});
    vgpu_tests::wait_for_async(T, "the Node's capacity", || async {
        (capacity() == want).then_some(())
    })
    .await;
    // Zeroed as a kubelet re-registering a recreated node does: written again.
    env.api
        .merge_patch(
            "v1",
            "nodes",
            "",
            NODE,
            &json!({"status": {"capacity": {"nvidia.com/gpumem": "0"}}}),
        )
        .unwrap();
    vgpu_tests::wait_for_async(T, "the Node's capacity restored", || async {
        (capacity() == want).then_some(())
    })
    .await;
    // The heartbeat moves on.
    vgpu_tests::wait_for_async(T, "a newer heartbeat", || async {
        let a = env.node_annotations();
        let hb = a[NODE_HEARTBEAT].as_str()?;
        (hb > first.1.as_str()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_read_the_hooks_accounting_files() {
    let env = start(&[]).await;
    let mut c = env.registered(1).await;
    let uid = env.pod("m", Some(&assignment(&[("main", &[(GPU0, 2048, 40)])])));
    c.allocate(&[&format!("{GPU0}::0")]).await.unwrap();
    // What the hook would write into the container's accounting file.
    let mut s = Snapshot::default();
    s.memory_limit[0] = 2048 << 20;
    let mut p = ProcessUsage {
        pid: 42,
        launches: 7,
        oom_refusals: 1,
        throttled_ns: 1_500_000_000,
        ..Default::default()
    };
    p.used[0] = 1 << 30;
    p.peak[0] = 3 << 29;
    s.processes.push(p);
    std::fs::write(
        env.host_dir
            .join(format!("containers/{uid}_main/vgpu.cache")),
        s.to_bytes(),
    )
    .unwrap();
    let text = env.metrics().await;
    let labels = format!("namespace=\"team-a\",pod=\"m\",container=\"main\",device=\"{GPU0}\"");
    for line in [
        format!("vgpu_container_memory_used_bytes{{{labels}}} 1073741824"),
        format!("vgpu_container_memory_limit_bytes{{{labels}}} 2147483648"),
        format!("vgpu_container_memory_peak_bytes{{{labels}}} 1610612736"),
        format!("vgpu_container_kernel_launches_total{{{labels}}} 7"),
        format!("vgpu_container_oom_refusals_total{{{labels}}} 1"),
        format!("vgpu_container_throttled_seconds_total{{{labels}}} 1.5"),
        format!("vgpu_device_memory_allocated_bytes{{node=\"{NODE}\",uuid=\"{GPU0}\"}} 2147483648"),
        format!("vgpu_device_memory_limit_bytes{{node=\"{NODE}\",uuid=\"{GPU1}\"}} 42949672960"),
        format!("vgpu_device_cores_allocated_ratio{{node=\"{NODE}\",uuid=\"{GPU0}\"}} 0.4"),
        format!("vgpu_device_healthy{{node=\"{NODE}\",uuid=\"{GPU1}\"}} 1"),
        // NVML's utilization of GPU 0: the fake's series starts at 10 %.
        format!("vgpu_device_utilization_ratio{{node=\"{NODE}\",uuid=\"{GPU0}\"}} 0.1"),
        "# TYPE vgpu_container_kernel_launches_total counter".to_string(),
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    // Prometheus' own linter on the exposition (the body after the HTTP/1.0 headers).
    if let Some(promtool) = crate::metrics::promtool() {
        let body = text
            .split_once("\r\n\r\n")
            .map_or(text.as_str(), |(_, b)| b);
        assert_eq!(
            crate::metrics::promtool_complaints(promtool, body),
            "",
            "{body}"
        );
    }
    // The series moves on with each sample (10, 20, 10, ...).
    let text = env.metrics().await;
    let want = format!("vgpu_device_utilization_ratio{{node=\"{NODE}\",uuid=\"{GPU0}\"}} 0.2");
    assert!(
        text.lines().any(|l| l == want),
        "missing {want:?} in:\n{text}"
    );
}

#[test]
fn install_lib_copies_the_library_and_the_preload_list() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("libvgpu.so");
    std::fs::write(&src, b"\x7fELF fake").unwrap();
    let dest = tmp.path().join("host");
    let out = Command::new(vgpu_tests::binary("vgpu-device-plugin"))
        .arg(format!("--install-lib={}", dest.display()))
        .arg(format!("--lib-source={}", src.display()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        std::fs::read(dest.join("libvgpu.so")).unwrap(),
        b"\x7fELF fake"
    );
    assert_eq!(
        std::fs::read_to_string(dest.join("ld.so.preload")).unwrap(),
        "/usr/local/vgpu/libvgpu.so\n"
    );
    let out = Command::new(vgpu_tests::binary("vgpu-device-plugin"))
        .arg(format!("--install-lib={}", dest.display()))
        .arg("--lib-source=/nonexistent/libvgpu.so")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/libvgpu.so"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcu_backend_from_sysfs() {
    let tmp = tempfile::tempdir().unwrap();
    let sys = tmp.path().join("sys");
    for (n, uid) in [(0, "aa01"), (1, "aa02")] {
        let dev = sys.join(format!("class/drm/card{n}/device"));
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("vendor"), "0x1d94\n").unwrap();
        std::fs::write(dev.join("mem_info_vram_total"), "68719476736\n").unwrap();
        std::fs::write(dev.join("unique_id"), format!("{uid}\n")).unwrap();
        std::fs::write(dev.join("numa_node"), "-1\n").unwrap();
        std::fs::create_dir_all(dev.join("ras")).unwrap();
        std::fs::write(dev.join("ras/umc_err_count"), "ue: 0\nce: 0\n").unwrap();
    }
    let ras1 = sys.join("class/drm/card1/device/ras");
    let env = start(&[
        "--backend=dcu",
        &format!("--sysfs-root={}", sys.display()),
        "--split-count=2",
    ])
    .await;
    let mut c = env.registered(1).await;
    let devices = c.list_and_watch().await.unwrap().next(T).await.unwrap();
    let ids: Vec<&str> = devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(
        ids,
        ["DCU-aa01::0", "DCU-aa01::1", "DCU-aa02::0", "DCU-aa02::1"]
    );
    let inv = vgpu_tests::wait_for_async(T, "DCU inventory", || async {
        NodeInventory::decode(env.node_annotations()[NODE_DEVICES].as_str()?).ok()
    })
    .await;
    assert_eq!(inv.devices[0].memory_mib, 65536);
    assert_eq!(inv.devices[0].vendor, "dcu");
    // amdgpu's RAS counter for the memory controller reports an uncorrectable error on card 1.
    let mut watch = c.list_and_watch().await.unwrap();
    watch.next(T).await.unwrap();
    std::fs::write(ras1.join("umc_err_count"), "ue: 1\nce: 3\n").unwrap();
    let list = watch
        .until(T, |d| {
            health_of(d, "DCU-aa02").iter().all(|h| *h == "Unhealthy")
        })
        .await
        .expect("RAS error turns the card unhealthy");
    assert!(health_of(&list, "DCU-aa01").iter().all(|h| *h == "Healthy"));
}
