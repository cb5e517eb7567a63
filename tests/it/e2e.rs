//! End to end on one machine: pods go through all four parts as real processes, with only the
//! cluster and the GPU replaced by the shared doubles.
//!
//! The test plays the parts of the cluster that are not ours, each at its real protocol boundary:
//! - the API server's admission chain: an AdmissionReview to `vgpu-webhook`'s `/mutate`, the JSON
//!   patch applied, the mutated pod sent to `/validate`, and the admitted pod stored in the fake
//!   API server (which, as the real one, assigns the uid);
//! - kube-scheduler: the extender's `/filter`, `/prioritize` and `/bind` with extender v1 JSON;
//! - the kubelet: ListAndWatch, GetPreferredAllocation and Allocate over the device-plugin gRPC
//!   socket of the chosen node's `vgpu-device-plugin` (one plugin per fake node, each with its own
//!   fake NVML configuration, fake kubelet directory and `--node-name`);
//! - the container runtime: the fake-CUDA probe run under `libvgpu.so` with exactly the env that
//!   Allocate returned, its mounts mapped to the host directories they name.
//!
//! Each step's failure message names the step and the part that disagreed.

use base64::Engine as _;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use vgpu_core::annotations::{ASSIGNMENT, NODE_DEVICES};
use vgpu_core::assignment::PodAssignment;
use vgpu_core::inventory::NodeInventory;
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_fake_kubelet::api::ContainerAllocateResponse;
use vgpu_fake_kubelet::{FakeKubelet, PluginClient};
use vgpu_tests::certs::TestPki;
use vgpu_tests::https;
use vgpu_tests::kube_scheduler;
use vgpu_tests::net::{addr_after, free_port, http};
use vgpu_tests::process::{start_webhook, Running};

const NS: &str = "team-a";
/// A second tenant without a quota.
const NS_FREE: &str = "team-b";
const LEDGER_NS: &str = "vgpu-system";
const WAIT: Duration = Duration::from_secs(30);
const SOCKET: &str = "vgpu-nvidia.sock";
const QUOTA_MIB: u64 = 12288;
/// Short, so a deleted pod's reservation stops counting within the test (see the delete step).
const RESERVATION_TTL_SECS: u64 = 4;
const HEARTBEAT_TIMEOUT_SECS: u64 = 6;
/// Container path of the hook library in the device plugin's mounts.
const HOOK_IN_CONTAINER: &str = "/usr/local/vgpu/libvgpu.so";

/// node-a: two A10s; node-b: one A100 (two card sizes, one and two GPUs per node).
const NODE_A: &str = "node-a";
const NODE_B: &str = "node-b";
const A10_0: &str = "GPU-a1000000-0000-0000-0000-000000000000";
const A10_1: &str = "GPU-a1000000-0000-0000-0000-000000000001";
const A100: &str = "GPU-a1000000-0000-0000-0000-0000000000b0";

fn node_gpus(node: &str) -> Vec<(&'static str, &'static str, u64)> {
    match node {
        NODE_A => vec![(A10_0, "NVIDIA A10", 24576), (A10_1, "NVIDIA A10", 24576)],
        _ => vec![(A100, "NVIDIA A100-PCIE-40GB", 40960)],
    }
}

struct Node {
    name: String,
    host_dir: PathBuf,
    kubelet: FakeKubelet,
    plugin: Running,
    metrics_port: u16,
    /// Device ids the kubelet has handed to containers (it never gives one out twice).
    used_ids: Vec<String>,
}

struct Probe {
    dir: PathBuf,
    exe: PathBuf,
}

struct Cluster {
    api: FakeApiServer,
    webhook: (Running, SocketAddr),
    tls: Arc<rustls::ClientConfig>,
    _scheduler: Running,
    extender: SocketAddr,
    scheduler_metrics: SocketAddr,
    nodes: Vec<Node>,
    probe: Probe,
    /// Last: the processes above stop before their files go.
    _tmp: tempfile::TempDir,
}

/// Compiles the hook test program against the fake libcuda and fake NVML, as tests/it/hook.rs.
fn build_probe(dir: &Path) -> Probe {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(vgpu_tests::cdylib("fake_cuda"), dir.join("libcuda.so.1")).unwrap();
    std::fs::copy(
        vgpu_tests::cdylib("fake_nvml"),
        dir.join("libnvidia-ml.so.1"),
    )
    .unwrap();
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    std::os::unix::fs::symlink("libnvidia-ml.so.1", dir.join("libnvidia-ml.so")).unwrap();
    let exe = dir.join("probe");
    let out = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(vgpu_tests::repo_root().join("tests/hook/probe.c"))
        .arg("-L")
        .arg(dir)
        .args(["-lcuda", "-lnvidia-ml", "-ldl", "-lpthread"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "setup: cc probe.c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Probe {
        dir: dir.to_path_buf(),
        exe,
    }
}

/// Starts one node: its Node object, fake kubelet, the DaemonSet's `--install-lib` init step and
/// the device plugin, against fake NVML configured with this node's GPUs.
async fn start_node(tmp: &Path, api: &FakeApiServer, kubeconfig: &Path, name: &str) -> Node {
    let root = tmp.join(name);
    let dp_dir = root.join("device-plugins");
    let host_dir = root.join("vgpu");
    std::fs::create_dir_all(&dp_dir).unwrap();
    let events = root.join("xid-events");
    std::fs::write(&events, "").unwrap();
    let gpus: Vec<Value> = node_gpus(name)
        .into_iter()
        .map(|(uuid, model, mib)| json!({"uuid": uuid, "name": model, "memoryMib": mib}))
        .collect();
    let config = root.join("nvml.json");
    std::fs::write(
        &config,
        json!({"gpus": gpus, "eventsFile": events}).to_string(),
    )
    .unwrap();
    api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}))
        .unwrap();
    let kubelet = FakeKubelet::start(&dp_dir).await.unwrap();
    let plugin_bin = vgpu_tests::binary("vgpu-device-plugin");
    let out = Command::new(&plugin_bin)
        .arg(format!("--install-lib={}", host_dir.display()))
        .arg(format!(
            "--lib-source={}",
            vgpu_tests::cdylib("vgpu").display()
        ))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "setup {name}: device plugin --install-lib: {out:?}"
    );
    let metrics_port = free_port();
    let mut cmd = Command::new(plugin_bin);
    cmd.arg(format!(
        "--nvml-lib={}",
        vgpu_tests::cdylib("fake_nvml").display()
    ))
    .arg(format!("--device-plugin-dir={}", dp_dir.display()))
    .arg(format!("--host-dir={}", host_dir.display()))
    .arg("--split-count=4")
    .arg("--heartbeat-seconds=1")
    .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
    .arg(format!("--node-name={name}"))
    // Two fake nodes on one machine: not the machine's own kubelet.
    .arg("--pod-resources-socket=")
    .env_remove("NODE_NAME")
    .env_remove("KUBERNETES_SERVICE_HOST")
    .env("KUBECONFIG", kubeconfig)
    .env("FAKE_NVML_CONFIG", &config)
    .env("RUST_LOG", "info");
    let plugin = Running::spawn(&format!("vgpu-device-plugin {name}"), cmd);
    Node {
        name: name.to_string(),
        host_dir,
        kubelet,
        plugin,
        metrics_port,
        used_ids: Vec::new(),
    }
}

async fn start_cluster() -> Cluster {
    let tmp = tempfile::tempdir().unwrap();
    let api = FakeApiServer::start().await.unwrap();
    let kubeconfig = tmp.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    for ns in [NS, NS_FREE] {
        api.create(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns, "labels": {"vgpu": "enabled"}}}))
            .unwrap();
    }
    api.create(json!({"apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpu-quota", "namespace": NS},
        "spec": {"hard": {"limits.nvidia.com/gpumem": QUOTA_MIB.to_string()}}}))
        .unwrap();

    let mut nodes = Vec::new();
    for name in [NODE_A, NODE_B] {
        nodes.push(start_node(tmp.path(), &api, &kubeconfig, name).await);
    }
    // Each plugin publishes its inventory on its Node (the scheduler and the webhook read it).
    for n in &nodes {
        vgpu_tests::wait_for_async(WAIT, "device plugin inventory on its Node", || async {
            let node = api.get("v1", "nodes", "", &n.name)?;
            let inv =
                NodeInventory::decode(node["metadata"]["annotations"][NODE_DEVICES].as_str()?)
                    .ok()?;
            (inv.devices.len() == node_gpus(&n.name).len()).then_some(())
        })
        .await;
    }

    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(tmp.path());
    let tls = Arc::new(pki.client_config());
    let ttl = RESERVATION_TTL_SECS.to_string();
    let webhook = start_webhook(
        &cert,
        &key,
        &[
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--namespace",
            LEDGER_NS,
            "--reservation-ttl",
            &ttl,
        ],
    );
    let wh_addr = webhook.1;
    vgpu_tests::wait_for_async(WAIT, "webhook /readyz", || {
        let tls = tls.clone();
        async move {
            let r = https::request(wh_addr, tls, "GET", "/readyz", vec![])
                .await
                .ok()?;
            (r.status == 200).then_some(())
        }
    })
    .await;

    let mut cmd = Command::new(vgpu_tests::binary("vgpu-scheduler"));
    cmd.args([
        "--listen=127.0.0.1:0",
        "--metrics-listen=127.0.0.1:0",
        "--scheduler-name=vgpu-scheduler",
        "--node-policy=binpack",
        "--gpu-policy=binpack",
    ])
    .arg(format!(
        "--heartbeat-timeout-seconds={HEARTBEAT_TIMEOUT_SECS}"
    ))
    .arg("--kubeconfig")
    .arg(&kubeconfig)
    .env_remove("KUBERNETES_SERVICE_HOST");
    let mut scheduler = Running::spawn("vgpu-scheduler", cmd);
    let extender = addr_after(&scheduler.wait_for_line(WAIT, |l| l.contains("extender listening")));
    let scheduler_metrics =
        addr_after(&scheduler.wait_for_line(WAIT, |l| l.contains("metrics listening")));
    vgpu_tests::wait_for_async(WAIT, "scheduler /readyz", || async {
        (http(scheduler_metrics, "GET", "/readyz", "").await.0 == 200).then_some(())
    })
    .await;
    let probe = build_probe(&tmp.path().join("probe"));
    Cluster {
        _tmp: tmp,
        api,
        webhook,
        tls,
        _scheduler: scheduler,
        extender,
        scheduler_metrics,
        nodes,
        probe,
    }
}

/// A pod as a user writes it: one container `main` with these limits.
fn user_pod(ns: &str, name: &str, limits: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}})
}

fn review(endpoint: &str, pod: &Value) -> Vec<u8> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    vgpu_tests::admission::pod_create_review(&format!("{endpoint}-{name}"), pod, false)
}

/// What kube-scheduler and the kubelet ended with for one container.
struct Placed {
    node: usize,
    assignment: PodAssignment,
    uid: String,
    alloc: ContainerAllocateResponse,
    /// The literal `env` of the stored (mutated) pod's first container, which the kubelet puts
    /// after the device plugin's variables.
    pod_env: Vec<(String, String)>,
}

/// The literal `env` entries of a stored pod's first container.
fn pod_env(pod: &Value) -> Vec<(String, String)> {
    pod["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .collect()
}

impl Cluster {
    async fn admission(&self, endpoint: &str, pod: &Value) -> Value {
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let r = https::request(
            self.webhook.1,
            self.tls.clone(),
            "POST",
            endpoint,
            review(endpoint.trim_start_matches('/'), pod),
        )
        .await
        .unwrap_or_else(|e| {
            panic!("step admission {endpoint} of {name}: webhook unreachable: {e}")
        });
        assert_eq!(
            r.status,
            200,
            "step admission {endpoint} of {name}: webhook answered {}: {}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        r.json()["response"].clone()
    }

    /// The API server's admission chain: mutate, apply the patch, validate the mutated pod, store
    /// it. Returns the stored pod, or the validating response when the pod was refused.
    async fn create_pod(&self, pod: &Value) -> Result<Value, Value> {
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let resp = self.admission("/mutate", pod).await;
        assert_eq!(
            resp["allowed"], true,
            "step mutate of {name}: the webhook refused a valid pod: {resp}"
        );
        let mut mutated = pod.clone();
        if let Some(p) = resp.get("patch").and_then(Value::as_str) {
            assert_eq!(resp["patchType"], "JSONPatch", "step mutate of {name}");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(p)
                .unwrap_or_else(|e| panic!("step mutate of {name}: patch is not base64: {e}"));
            let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!("step mutate of {name}: patch is not a JSON patch: {e}")
            });
            json_patch::patch(&mut mutated, &patch).unwrap_or_else(|e| {
                panic!("step mutate of {name}: the webhook's patch does not apply: {e}\n{patch:?}")
            });
        }
        assert_eq!(
            mutated["spec"]["schedulerName"], "vgpu-scheduler",
            "step mutate of {name}: webhook and scheduler disagree on the scheduler name"
        );
        // The API server names the object before the validating webhooks run; the fake API
        // server assigns its own uid when storing (the webhook's ledger also matches by name).
        mutated["metadata"]["uid"] = json!(format!("admission-{name}"));
        let resp = self.admission("/validate", &mutated).await;
        if resp["allowed"] != true {
            return Err(resp);
        }
        mutated["metadata"].as_object_mut().unwrap().remove("uid");
        let stored = self.api.create(mutated).unwrap_or_else(|e| {
            panic!("step store {name}: the fake API server refused the admitted pod: {e:?}")
        });
        Ok(stored)
    }

    fn node_names(&self) -> Vec<&str> {
        self.nodes.iter().map(|n| n.name.as_str()).collect()
    }

    fn pod(&self, ns: &str, name: &str) -> Value {
        self.api
            .get("v1", "pods", ns, name)
            .unwrap_or_else(|| panic!("pod {ns}/{name} not in the fake API server"))
    }

    async fn extender(&self, verb: &str, body: Value) -> Value {
        let (status, text) = http(self.extender, "POST", verb, &body.to_string()).await;
        assert_eq!(
            status, 200,
            "step schedule {verb}: the extender answered {status}: {text}"
        );
        serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("step schedule {verb}: not JSON ({e}): {text}"))
    }

    /// kube-scheduler's filter; returns the extender's answer. kube-scheduler sends the extender
    /// only the nodes its own filters passed: a `kubernetes.io/hostname` nodeSelector (the
    /// NodeAffinity plugin) leaves that node alone.
    async fn filter(&self, ns: &str, name: &str) -> Value {
        let pod = self.pod(ns, name);
        let nodes: Vec<&str> = match pod["spec"]["nodeSelector"]["kubernetes.io/hostname"].as_str()
        {
            Some(h) => self.node_names().into_iter().filter(|n| *n == h).collect(),
            None => self.node_names(),
        };
        self.extender("/filter", kube_scheduler::filter_args(&pod, &nodes))
            .await
    }

    /// kube-scheduler's cycle for one pod: filter, prioritize (only when more than one node is
    /// left, as kube-scheduler does), pick the best score, bind. Bodies are built from the
    /// captured fixtures and answers read as kube-scheduler's Go client reads them. Checks the
    /// Binding and the assignment landed; returns the node index and the assignment.
    async fn schedule(&self, ns: &str, name: &str) -> (usize, PodAssignment) {
        let f = self.filter(ns, name).await;
        let feasible: Vec<String> = kube_scheduler::field(&f, "NodeNames")
            .as_array()
            .unwrap_or_else(|| panic!("step filter of {ns}/{name}: no NodeNames in {f}"))
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert!(
            !feasible.is_empty(),
            "step filter of {ns}/{name}: the scheduler found no node: {f}"
        );
        let pod = self.pod(ns, name);
        let feasible: Vec<&str> = feasible.iter().map(String::as_str).collect();
        let node = if kube_scheduler::calls_prioritize(feasible.len()) {
            let scores = self
                .extender(
                    "/prioritize",
                    kube_scheduler::prioritize_args(&pod, &feasible),
                )
                .await;
            let scores = scores
                .as_array()
                .unwrap_or_else(|| panic!("step prioritize of {ns}/{name}: not a list: {scores}"));
            assert_eq!(
                scores.len(),
                feasible.len(),
                "step prioritize of {ns}/{name}: one score per feasible node expected: {scores:?}"
            );
            eprintln!("step prioritize of {ns}/{name}: {scores:?}");
            // kube-scheduler takes the highest total score; ties go to the first listed here.
            let best = scores
                .iter()
                .fold(None::<&Value>, |b, s| {
                    let score = |v: &Value| kube_scheduler::field(v, "Score").as_i64();
                    match b {
                        Some(b) if score(b) >= score(s) => Some(b),
                        _ => Some(s),
                    }
                })
                .unwrap();
            kube_scheduler::field(best, "Host")
                .as_str()
                .unwrap()
                .to_string()
        } else {
            feasible[0].to_string()
        };
        let b = self
            .extender(
                "/bind",
                kube_scheduler::bind_args(ns, name, &pod["metadata"]["uid"], &node),
            )
            .await;
        assert_eq!(
            kube_scheduler::field(&b, "Error").as_str().unwrap_or(""),
            "",
            "step bind of {ns}/{name} to {node}: the extender failed: {b}"
        );
        let pod = self.pod(ns, name);
        assert_eq!(
            pod["spec"]["nodeName"].as_str(),
            Some(node.as_str()),
            "step bind of {ns}/{name}: no Binding to {node} landed in the API server"
        );
        let a = pod["metadata"]["annotations"][ASSIGNMENT]
            .as_str()
            .unwrap_or_else(|| {
                panic!("step bind of {ns}/{name}: no {ASSIGNMENT} annotation landed: {pod}")
            });
        let a = PodAssignment::decode(a)
            .unwrap_or_else(|e| panic!("step bind of {ns}/{name}: unreadable assignment: {e}"));
        assert_eq!(
            a.node, node,
            "step bind of {ns}/{name}: assignment and Binding name different nodes"
        );
        let idx = self.nodes.iter().position(|n| n.name == node).unwrap();
        let uuids: Vec<&str> = node_gpus(&node).iter().map(|g| g.0).collect();
        for d in a.containers.iter().flat_map(|c| &c.devices) {
            assert!(
                uuids.contains(&d.uuid.as_str()),
                "step bind of {ns}/{name}: the scheduler assigned {} which {node}'s NVML does not have",
                d.uuid
            );
        }
        (idx, a)
    }

    async fn plugin(&self, node: usize) -> PluginClient {
        let n = &self.nodes[node];
        vgpu_tests::wait_for_async(WAIT, "kubelet dialing the device plugin", || async {
            n.kubelet.dial(SOCKET).await.ok()
        })
        .await
    }

    /// The kubelet's part for the pod's one container, as kube-scheduler's partner the kubelet
    /// v1.36 plays it (tests/fixtures/kubelet/): ListAndWatch, one GetPreferredAllocation over the
    /// ids it has not handed out, then Allocate with the preferred ids it still has, topped up
    /// from the rest (pkg/kubelet/cm/devicemanager/manager.go, devicesToAllocate). It asks once:
    /// a hint computed before the plugin saw the binding is used as it is.
    async fn kubelet_allocate(
        &mut self,
        node: usize,
        count: usize,
        who: &str,
    ) -> ContainerAllocateResponse {
        let mut c = self.plugin(node).await;
        let nname = self.nodes[node].name.clone();
        let devices = c
            .list_and_watch()
            .await
            .unwrap_or_else(|e| panic!("step ListAndWatch on {nname} for {who}: {e}"))
            .next(WAIT)
            .await
            .unwrap_or_else(|| panic!("step ListAndWatch on {nname} for {who}: no device list"));
        assert_eq!(
            devices.len(),
            node_gpus(&nname).len() * 4,
            "step ListAndWatch on {nname}: device plugin and fake NVML disagree on the GPUs"
        );
        let available: Vec<String> = devices
            .iter()
            .filter(|d| d.health == "Healthy" && !self.nodes[node].used_ids.contains(&d.id))
            .map(|d| d.id.clone())
            .collect();
        let preferred = c
            .preferred(&available, &[], count as i32)
            .await
            .unwrap_or_else(|e| panic!("step GetPreferredAllocation on {nname} for {who}: {e}"));
        let fixture = vgpu_tests::fixtures::load("kubelet/one-gpu-container.json");
        assert_eq!(
            fixture["allocateUsesThePreferredIds"], true,
            "the kubelet fixture changed: make this double do what it says"
        );
        let mut ids: Vec<String> = preferred
            .into_iter()
            .filter(|id| available.contains(id))
            .take(count)
            .collect();
        for id in &available {
            if ids.len() == count {
                break;
            }
            if !ids.contains(id) {
                ids.push(id.clone());
            }
        }
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let alloc = c
            .allocate(&refs)
            .await
            .unwrap_or_else(|e| panic!("step Allocate on {nname} for {who} with {ids:?}: {e}"));
        self.nodes[node].used_ids.extend(ids);
        alloc
    }

    /// Admission, scheduling and allocation of a one-container pod that must be admitted.
    async fn run_pod(&mut self, ns: &str, name: &str, limits: Value) -> Placed {
        self.run(user_pod(ns, name, limits)).await
    }

    /// [`Cluster::run_pod`] for a pod as given.
    async fn run(&mut self, pod: Value) -> Placed {
        let ns = pod["metadata"]["namespace"].as_str().unwrap().to_string();
        let name = pod["metadata"]["name"].as_str().unwrap().to_string();
        let (ns, name) = (ns.as_str(), name.as_str());
        let gpus: usize = pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
            .as_str()
            .map(|s| s.parse().unwrap())
            .unwrap_or(1);
        let stored = self
            .create_pod(&pod)
            .await
            .unwrap_or_else(|r| panic!("step validate of {ns}/{name}: refused: {r}"));
        let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();
        let (node, assignment) = self.schedule(ns, name).await;
        let alloc = self
            .kubelet_allocate(node, gpus, &format!("{ns}/{name}"))
            .await;
        Placed {
            node,
            assignment,
            uid,
            alloc,
            pod_env: pod_env(&stored),
        }
    }

    /// Runs the probe as the container would: the env Allocate returned, then the pod's own `env`
    /// (the webhook's limits), in a root where each container path that a mount names is a link
    /// to its host path (hard for files, symbolic for directories), and the hook preloaded from
    /// there (what the mounted /etc/ld.so.preload does in the container). The hook must print
    /// nothing: its two sources agree.
    fn run_container(&self, p: &Placed, steps: &[&str]) -> Vec<String> {
        let (stdout, stderr) = self.run_container_with_tenant_env(p, steps, &[]);
        assert!(
            !stderr.contains("vgpu:"),
            "step container: the hook complained in a container vgpu set up:\n{stderr}"
        );
        stdout
    }

    /// [`Self::run_container`] with `tenant_env` appended after the device plugin's variables and
    /// the pod's `env`, as kubelet appends a pod's `env` and then `envFrom` (kubelet
    /// `GenerateRunContainerOptions`), so the tenant's value is the one the process sees. Returns
    /// the probe's stdout lines and its stderr.
    fn run_container_with_tenant_env(
        &self,
        p: &Placed,
        steps: &[&str],
        tenant_env: &[(&str, &str)],
    ) -> (Vec<String>, String) {
        let root = tempfile::tempdir().unwrap();
        for m in &p.alloc.mounts {
            let at = root.path().join(m.container_path.trim_start_matches('/'));
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            // A file mount is a hard link (the hook opens its GPU activity files without
            // following links, as it must in a container), a directory mount a symlink.
            if !Path::new(&m.host_path).is_file() || std::fs::hard_link(&m.host_path, &at).is_err()
            {
                std::os::unix::fs::symlink(&m.host_path, &at).unwrap();
            }
        }
        let map = |v: &str| -> String {
            for m in &p.alloc.mounts {
                if v.starts_with(m.container_path.as_str()) {
                    return root
                        .path()
                        .join(v.trim_start_matches('/'))
                        .display()
                        .to_string();
                }
            }
            v.to_string()
        };
        let hook = map(HOOK_IN_CONTAINER);
        assert!(
            Path::new(&hook).is_file(),
            "step container: the device plugin mounts no {HOOK_IN_CONTAINER} from its host dir ({hook})"
        );
        // The fake GPUs are the visible ones, in the container's order.
        let visible = p
            .alloc
            .envs
            .get("NVIDIA_VISIBLE_DEVICES")
            .cloned()
            .unwrap_or_default();
        let gpus = node_gpus(&self.nodes[p.node].name);
        let memory: Vec<String> = visible
            .split(',')
            .map(|u| {
                let g = gpus.iter().find(|g| g.0 == u).unwrap_or_else(|| {
                    panic!("step container: NVIDIA_VISIBLE_DEVICES names {u}, not on this node")
                });
                format!("{}m", g.2)
            })
            .collect();
        let mut cmd = Command::new(&self.probe.exe);
        cmd.arg("direct")
            .args(steps)
            .env_clear()
            .env("LD_LIBRARY_PATH", &self.probe.dir)
            .env("LD_PRELOAD", &hook)
            .env("FAKE_CUDA_DEVICE_MEMORY", memory.join(","));
        // As the container gets them: the hook reads the limits file and finds the accounting
        // path it names under the file's root.
        for (k, v) in &p.alloc.envs {
            cmd.env(k, v);
        }
        for (k, v) in &p.pod_env {
            cmd.env(k, v);
        }
        for (k, v) in tenant_env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "step container: the probe failed under libvgpu.so with the plugin's env {:?}\n{stdout}\n{}",
            p.alloc.envs,
            String::from_utf8_lossy(&out.stderr)
        );
        (
            stdout.lines().map(String::from).collect(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    async fn plugin_metrics(&self, node: usize) -> String {
        let addr: SocketAddr = ([127, 0, 0, 1], self.nodes[node].metrics_port).into();
        let (status, text) = http(addr, "GET", "/metrics", "").await;
        assert_eq!(
            status, 200,
            "step metrics: device plugin /metrics answered {status}"
        );
        text
    }

    async fn scheduler_metrics(&self) -> String {
        let (status, text) = http(self.scheduler_metrics, "GET", "/metrics", "").await;
        assert_eq!(
            status, 200,
            "step metrics: scheduler /metrics answered {status}"
        );
        text
    }

    /// Our Events in `ns`: (regarding kind/name, reason, note).
    fn events(&self, ns: &str) -> Vec<(String, String, String)> {
        self.api
            .list("events.k8s.io/v1", "events", Some(ns))
            .iter()
            .map(|e| {
                (
                    format!(
                        "{}/{}",
                        e["regarding"]["kind"].as_str().unwrap_or(""),
                        e["regarding"]["name"].as_str().unwrap_or("")
                    ),
                    e["reason"].as_str().unwrap_or("").to_string(),
                    e["note"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }
}

/// Host directory mounted at the container's /tmp/vgpu (the hook's accounting file lives there).
fn accounting_dir(p: &Placed) -> PathBuf {
    p.alloc
        .mounts
        .iter()
        .find(|m| m.container_path == "/tmp/vgpu")
        .map(|m| PathBuf::from(&m.host_path))
        .unwrap_or_else(|| panic!("step Allocate: no /tmp/vgpu mount in {:?}", p.alloc.mounts))
}

fn mib(n: u64) -> u64 {
    n << 20
}

/// The probe's expected lines for "init ctx:0 total:0 alloc:(slice-1)m alloc:2m alloc:1m info
/// launch:5 count": the slice, all of it and not a byte more.
fn slice_steps(slice_mib: u64) -> (Vec<String>, Vec<String>) {
    let steps = vec![
        "init".to_string(),
        "ctx:0".into(),
        "total:0".into(),
        format!("alloc:{}m", slice_mib - 1),
        "alloc:2m".into(),
        "alloc:1m".into(),
        "info".into(),
        "launch:5".into(),
        "count".into(),
    ];
    let want = vec![
        "init = 0".to_string(),
        "ctx = 0".into(),
        format!("total = 0 bytes {}", mib(slice_mib)),
        format!("alloc {} = 0", mib(slice_mib - 1)),
        // CUDA_ERROR_OUT_OF_MEMORY (2): over the slice, refused by the hook.
        format!("alloc {} = 2", mib(2)),
        format!("alloc {} = 0", mib(1)),
        format!("info = 0 free 0 total {}", mib(slice_mib)),
        "launch ok 5".into(),
        "driver launches 5".into(),
    ];
    (steps, want)
}

fn assert_lines(text: &str, want: &[String], step: &str) {
    for line in want {
        assert!(
            text.lines().any(|l| l == line),
            "step {step}: missing {line:?} in:\n{text}"
        );
    }
}

/// One pod's whole journey, then a second pod packed onto the same GPU with its own slice, an
/// over-quota pod refused with an Event, and a deleted pod's capacity freed in the scheduler and
/// in the quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_pods_journey_through_all_four_parts() {
    let mut c = start_cluster().await;

    // 1-5: admission, scheduling, allocation, the container.
    let train = c
        .run_pod(
            NS,
            "train",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        )
        .await;
    let dev = &train.assignment.containers[0].devices[0];
    assert_eq!(
        (train.assignment.containers[0].name.as_str(), dev.memory_mib),
        ("main", 4096),
        "step bind: the assignment does not carry the pod's request"
    );
    let gpu = dev.uuid.clone();
    let env = &train.alloc.envs;
    assert_eq!(
        env.get("NVIDIA_VISIBLE_DEVICES"),
        Some(&gpu),
        "step Allocate: device plugin and scheduler disagree on the GPU"
    );
    assert_eq!(
        env.get("CUDA_DEVICE_MEMORY_LIMIT_0").map(String::as_str),
        Some("4096m"),
        "step Allocate: device plugin and scheduler disagree on the slice"
    );
    let (steps, want) = slice_steps(4096);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    assert_eq!(
        c.run_container(&train, &steps),
        want,
        "step container: libvgpu.so does not enforce the slice the device plugin passed"
    );

    // 6: the device plugin's metrics read the hook's accounting file of that container.
    let text = c.plugin_metrics(train.node).await;
    let labels = format!("namespace=\"{NS}\",pod=\"train\",container=\"main\",device=\"{gpu}\"");
    assert_lines(
        &text,
        &[
            format!("vgpu_container_memory_used_bytes{{{labels}}} {}", mib(4096)),
            format!(
                "vgpu_container_memory_limit_bytes{{{labels}}} {}",
                mib(4096)
            ),
            format!("vgpu_container_kernel_launches_total{{{labels}}} 5"),
            format!("vgpu_container_oom_refusals_total{{{labels}}} 1"),
        ],
        "metrics (device plugin vs hook accounting)",
    );
    assert_eq!(
        accounting_dir(&train),
        c.nodes[train.node]
            .host_dir
            .join(format!("containers/{}_main", train.uid)),
        "step Allocate: device plugin and API server disagree on the pod's uid"
    );

    // Binpack: the second pod lands on the same GPU with its own slice. It selects train's node:
    // at the extender's 0..10 resolution an empty node and train's node can score the same, and
    // kube-scheduler breaks ties at random, so only the GPU choice is deterministic.
    let mut eval = user_pod(
        NS,
        "eval",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "6144"}),
    );
    eval["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": c.nodes[train.node].name});
    let eval = c.run(eval).await;
    let edev = &eval.assignment.containers[0].devices[0];
    assert_eq!(
        (eval.node, edev.uuid.as_str()),
        (train.node, gpu.as_str()),
        "step bind of eval: --gpu-policy binpack should share train's GPU"
    );
    assert_eq!(
        eval.alloc
            .envs
            .get("CUDA_DEVICE_MEMORY_LIMIT_0")
            .map(String::as_str),
        Some("6144m"),
        "step Allocate of eval"
    );
    assert_ne!(
        accounting_dir(&eval),
        accounting_dir(&train),
        "step Allocate of eval: two containers share one accounting directory"
    );
    let (steps, want) = slice_steps(6144);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    assert_eq!(
        c.run_container(&eval, &steps),
        want,
        "step container of eval: its own slice"
    );
    let text = c.plugin_metrics(train.node).await;
    let elabels = format!("namespace=\"{NS}\",pod=\"eval\",container=\"main\",device=\"{gpu}\"");
    assert_lines(
        &text,
        &[
            format!(
                "vgpu_container_memory_limit_bytes{{{elabels}}} {}",
                mib(6144)
            ),
            format!(
                "vgpu_container_memory_limit_bytes{{{labels}}} {}",
                mib(4096)
            ),
            format!(
                "vgpu_device_memory_allocated_bytes{{node=\"{}\",uuid=\"{gpu}\"}} {}",
                c.nodes[train.node].name,
                mib(10240)
            ),
        ],
        "metrics of two containers on one GPU",
    );

    // A third pod on the same GPU: 4096 + 6144 + 2048 fills the quota exactly.
    let mut third = user_pod(
        NS,
        "third",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}),
    );
    third["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": c.nodes[train.node].name});
    let third = c.run(third).await;
    assert_eq!(
        third.assignment.containers[0].devices[0].uuid, gpu,
        "step bind of third: binpack should put a third pod on the shared GPU"
    );
    let (steps, want) = slice_steps(2048);
    let steps: Vec<&str> = steps.iter().map(String::as_str).collect();
    // Its tenant tries to lift the slice with reserved names from a ConfigMap behind envFrom,
    // which the validating webhook cannot see: the hook reads the device plugin's read-only
    // limits file instead, so the slice holds.
    let (stdout, stderr) = c.run_container_with_tenant_env(
        &third,
        &steps,
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "80g"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/elsewhere.cache"),
        ],
    );
    assert_eq!(
        stdout, want,
        "step container of third: its own slice, whatever its envFrom says"
    );
    // One line names exactly what the environment changed after admission.
    let complaints: Vec<&str> = stderr.lines().filter(|l| l.starts_with("vgpu:")).collect();
    assert_eq!(
        complaints,
        ["vgpu: ignoring CUDA_DEVICE_MEMORY_LIMIT=80g CUDA_DEVICE_MEMORY_LIMIT_0=80g CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/elsewhere.cache from the environment: the device plugin's limits file decides"],
        "step container of third: the hook's warning"
    );

    // 7: over quota (12288 used, 4096 more): refused at validate, with an Event.
    let over = user_pod(
        NS,
        "over",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
    );
    let r = c
        .create_pod(&over)
        .await
        .expect_err("step validate of over: the webhook admitted a pod over the quota");
    assert_eq!(r["status"]["code"], 403, "step validate of over: {r}");
    assert_eq!(
        r["status"]["message"],
        "vgpu quota exceeded in namespace team-a: ResourceQuota gpu-quota limits.nvidia.com/gpumem: requested 4096 MiB (1 GPU x 4096), used 12288, hard 12288",
        "step validate of over"
    );
    assert!(c.api.get("v1", "pods", NS, "over").is_none());
    let events = vgpu_tests::wait_for_async(WAIT, "the quota Event", || async {
        let e = c.events(NS);
        (!e.is_empty()).then_some(e)
    })
    .await;
    assert_eq!(
        (events[0].0.as_str(), events[0].1.as_str()),
        ("Pod/over", "VGPUQuotaExceeded"),
        "step validate of over: Event {events:?}"
    );
    assert!(
        events[0].2.contains("used 12288, hard 12288"),
        "step validate of over: the Event does not carry the refusal: {events:?}"
    );

    // 8: delete eval: the scheduler's usage and the quota both free its 6144 MiB (train and
    // third keep 6144).
    c.api.delete("v1", "pods", NS, "eval").unwrap();
    let node_a = c.nodes[train.node].name.clone();
    let node_a = node_a.as_str();
    let want = format!(
        "vgpu_device_memory_allocated_bytes{{node=\"{node_a}\",uuid=\"{gpu}\"}} {}",
        mib(6144)
    );
    vgpu_tests::wait_for_async(
        WAIT,
        "the scheduler to free the deleted pod's memory",
        || async {
            c.scheduler_metrics()
                .await
                .lines()
                .any(|l| l == want)
                .then_some(())
        },
    )
    .await;
    // The webhook's reservation of eval outlives the pod until its TTL (validate.md: a reservation
    // counts until its pod is in the cache or it expires), so this waits up to the TTL.
    let again = vgpu_tests::wait_for_async(
        WAIT,
        "the quota to free the deleted pod's share",
        || async {
            let mut p = over.clone();
            p["metadata"]["name"] = json!("again");
            p["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node_a});
            c.create_pod(&p).await.ok()
        },
    )
    .await;
    assert_eq!(again["metadata"]["name"], "again");
    let (node, a) = c.schedule(NS, "again").await;
    assert_eq!(
        (node, a.containers[0].devices[0].uuid.as_str()),
        (train.node, gpu.as_str()),
        "step bind of again: the freed GPU should take the next pod (binpack)"
    );
}

/// Placement across the two nodes: a pod too big for every node explained by FailedNodes, a
/// multi-GPU pod, percentage requests on two card sizes pinned by GPU type, and a node whose
/// device plugin stops heartbeating getting no new pods.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn placement_across_nodes_types_and_heartbeats() {
    let mut c = start_cluster().await;
    // team-b's quota is exactly what the pods below hold while each is admitted: wide 3 x 1024,
    // multi 2 x 2048, half-a100 placed 20480, half-a10 unplaced 50 % of the largest card 20480.
    c.api
        .create(json!({"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "b-quota", "namespace": NS_FREE},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "48128"}}}))
        .unwrap();

    // Three GPUs: no node has three. Admitted (no quota in team-b), then explained per node.
    let wide = user_pod(
        NS_FREE,
        "wide",
        json!({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1024"}),
    );
    c.create_pod(&wide)
        .await
        .unwrap_or_else(|r| panic!("step validate of wide: refused: {r}"));
    let f = c.filter(NS_FREE, "wide").await;
    assert_eq!(f["NodeNames"], json!([]), "step filter of wide: {f}");
    assert_eq!(
        f["FailedNodes"],
        json!({NODE_A: "node-a: 3 healthy GPUs needed, only 2",
            NODE_B: "node-b: 3 healthy GPUs needed, only 1"}),
        "step filter of wide: the extender's reasons do not match fake NVML's GPUs"
    );

    // Two GPUs of one node, one slice each, in the container's device order.
    let multi = c
        .run_pod(
            NS_FREE,
            "multi",
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2048"}),
        )
        .await;
    assert_eq!(
        c.nodes[multi.node].name, NODE_A,
        "step bind of multi: only node-a has two GPUs"
    );
    let devs = &multi.assignment.containers[0].devices;
    let uuids: Vec<&str> = devs.iter().map(|d| d.uuid.as_str()).collect();
    assert_eq!(uuids.len(), 2, "step bind of multi: {uuids:?}");
    assert_ne!(uuids[0], uuids[1], "step bind of multi: one GPU twice");
    let env = &multi.alloc.envs;
    assert_eq!(
        env.get("NVIDIA_VISIBLE_DEVICES").cloned(),
        Some(uuids.join(",")),
        "step Allocate of multi: device plugin and scheduler disagree on the GPUs"
    );
    for i in 0..2 {
        assert_eq!(
            env.get(&format!("CUDA_DEVICE_MEMORY_LIMIT_{i}"))
                .map(String::as_str),
            Some("2048m"),
            "step Allocate of multi: device {i}"
        );
    }
    assert_eq!(
        c.run_container(&multi, &["init", "total:0", "total:1"]),
        [
            "init = 0".to_string(),
            format!("total = 0 bytes {}", mib(2048)),
            format!("total = 0 bytes {}", mib(2048)),
        ],
        "step container of multi: libvgpu.so must cap both devices"
    );

    // Half a card, pinned by type: 20480 MiB of the A100, 12288 MiB of an A10.
    // use-gputype matches a substring of the model, as HAMi: "A10" would also match the A100, so
    // the A10 pod excludes the A100 instead.
    for (name, key, model, node, slice) in [
        (
            "half-a100",
            "nvidia.com/use-gputype",
            "A100",
            NODE_B,
            20480u64,
        ),
        (
            "half-a10",
            "nvidia.com/nouse-gputype",
            "A100",
            NODE_A,
            12288,
        ),
    ] {
        let mut p = user_pod(
            NS_FREE,
            name,
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
        );
        p["metadata"]["annotations"] = json!({key: model});
        let stored = c
            .create_pod(&p)
            .await
            .unwrap_or_else(|r| panic!("step validate of {name}: refused: {r}"));
        let uid = stored["metadata"]["uid"].as_str().unwrap().to_string();
        let (n, a) = c.schedule(NS_FREE, name).await;
        assert_eq!(
            (
                c.nodes[n].name.as_str(),
                a.containers[0].devices[0].memory_mib
            ),
            (node, slice),
            "step bind of {name}: the scheduler did not resolve 50 % on the pinned card"
        );
        let alloc = c.kubelet_allocate(n, 1, &format!("{NS_FREE}/{name}")).await;
        let placed = Placed {
            node: n,
            assignment: a,
            uid,
            alloc,
            pod_env: pod_env(&stored),
        };
        assert_eq!(
            placed
                .alloc
                .envs
                .get("CUDA_DEVICE_MEMORY_LIMIT_0")
                .map(String::as_str),
            Some(format!("{slice}m").as_str()),
            "step Allocate of {name}"
        );
        assert_eq!(
            c.run_container(&placed, &["init", "total:0"]),
            [
                "init = 0".to_string(),
                format!("total = 0 bytes {}", mib(slice))
            ],
            "step container of {name}"
        );
    }

    // node-b's device plugin stops: once its heartbeat is older than the scheduler's timeout,
    // the extender no longer places there, and says why.
    let late = {
        let mut p = user_pod(
            NS_FREE,
            "late",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}),
        );
        p["metadata"]["annotations"] = json!({"nvidia.com/use-gputype": "A100"});
        p
    };
    // Placed on an A10, half-a10 holds 12288 MiB, not the 20480 counted before placement: the
    // webhook reads the scheduler's assignment, so late (1024) fits (39936 + 1024 <= 48128).
    // The webhook learns of the assignment through its watch: poll.
    vgpu_tests::wait_for_async(
        WAIT,
        "the webhook's quota to count half-a10 by its assignment",
        || async { c.create_pod(&late).await.ok() },
    )
    .await;
    let f = c.filter(NS_FREE, "late").await;
    assert_eq!(
        f["NodeNames"],
        json!([NODE_B]),
        "step filter of late while node-b's plugin runs: {f}"
    );
    let b = c.nodes.iter().position(|n| n.name == NODE_B).unwrap();
    c.nodes[b].plugin.kill();
    let f = vgpu_tests::wait_for_async(
        Duration::from_secs(HEARTBEAT_TIMEOUT_SECS + 20),
        "the scheduler to stop placing on node-b",
        || async {
            let f = c.filter(NS_FREE, "late").await;
            (f["NodeNames"] == json!([])).then_some(f)
        },
    )
    .await;
    let why = f["FailedNodes"][NODE_B].as_str().unwrap_or("");
    assert!(
        why.starts_with("node-b: device-plugin heartbeat is"),
        "step filter of late after node-b's plugin stopped: {f}"
    );
}
