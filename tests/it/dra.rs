//! The real `vgpu-device-plugin --mode=dra` against its boundaries, as the kubelet sees it: the
//! fake NVML through `--nvml-lib`, the fake API server over HTTPS, and this test as the kubelet
//! (the plugin-watcher's Registration calls on the registry socket, then NodePrepareResources,
//! NodeUnprepareResources and the health stream on the DRA socket, v1 and v1beta1). The real
//! kubelet and kube-scheduler drive the same binary in the real-cluster tier (step 10).

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vgpu_device_plugin::dra::api_v1 as v1;
use vgpu_device_plugin::dra::api_v1beta1 as v1beta1;
use vgpu_device_plugin::dra::health_api as health;
use vgpu_device_plugin::dra::registration_api as reg;
use vgpu_fake_apiserver::FakeApiServer;
use vgpu_tests::net::free_port;
use vgpu_tests::process::Running;

const NODE: &str = "gpu-node-1";
const GPU0: &str = "GPU-00000000-0000-0000-0000-000000000000";
const GPU1: &str = "GPU-11111111-1111-1111-1111-111111111111";
const T: Duration = Duration::from_secs(10);
const SLICES: (&str, &str) = ("resource.k8s.io/v1", "resourceslices");

struct Env {
    tmp: tempfile::TempDir,
    api: FakeApiServer,
    plugin: Running,
    metrics_port: u16,
}

impl Env {
    fn dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    fn spawn(tmp: &Path, metrics_port: u16) -> Running {
        let mut cmd = Command::new(vgpu_tests::binary("vgpu-device-plugin"));
        cmd.arg("--mode=dra")
            .arg(format!(
                "--nvml-lib={}",
                vgpu_tests::cdylib("fake_nvml").display()
            ))
            .arg(format!(
                "--kubelet-registry-dir={}",
                tmp.join("plugins_registry").display()
            ))
            .arg(format!(
                "--kubelet-plugins-dir={}",
                tmp.join("plugins").display()
            ))
            .arg(format!("--cdi-dir={}", tmp.join("cdi").display()))
            .arg(format!("--host-dir={}", tmp.join("vgpu").display()))
            .arg("--gpu-cdi-kind=nvidia.com/gpu")
            .arg(format!("--metrics-listen=127.0.0.1:{metrics_port}"))
            .env("NODE_NAME", NODE)
            .env("KUBECONFIG", tmp.join("kubeconfig"))
            .env("FAKE_NVML_CONFIG", tmp.join("nvml.json"))
            .env("RUST_LOG", "info");
        Running::spawn("vgpu-device-plugin --mode=dra", cmd)
    }

    async fn start() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("plugins_registry")).unwrap();
        std::fs::write(tmp.path().join("xid-events"), "").unwrap();
        std::fs::write(
            tmp.path().join("nvml.json"),
            json!({"driverVersion": "550.54.15", "eventsFile": tmp.path().join("xid-events"),
                "gpus": [
                    {"uuid": GPU0, "name": "NVIDIA A100-PCIE-40GB", "memoryMib": 40960, "numa": 0},
                    {"uuid": GPU1, "name": "NVIDIA A100-PCIE-40GB", "memoryMib": 40960}]})
            .to_string(),
        )
        .unwrap();
        let api = FakeApiServer::start().await.unwrap();
        api.write_kubeconfig(&tmp.path().join("kubeconfig"))
            .unwrap();
        api.create(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}))
            .unwrap();
        let metrics_port = free_port();
        let plugin = Env::spawn(tmp.path(), metrics_port);
        Env {
            tmp,
            api,
            plugin,
            metrics_port,
        }
    }

    fn restart(&mut self) {
        self.plugin.kill();
        self.plugin = Env::spawn(self.tmp.path(), self.metrics_port);
    }

    /// The kubelet's plugin watcher: GetInfo on the registry socket, then the status (`fresh`:
    /// no slice may exist before it).
    async fn register(&self, fresh: bool) -> reg::PluginInfo {
        let sock = self.dir("plugins_registry").join("gpu.vgpu.io-reg.sock");
        let channel = vgpu_tests::wait_for_async(T, "the registration socket", || async {
            vgpu_device_plugin::unix::connect_unix(&sock).await.ok()
        })
        .await;
        let mut client = reg::registration_client::RegistrationClient::new(channel);
        let info = client
            .get_info(reg::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        // Published only once the kubelet says it registered the plugin: before, a pod placed
        // on the slice could not be prepared.
        assert!(
            !fresh || self.slice().is_none(),
            "a slice before the registration"
        );
        client
            .notify_registration_status(reg::RegistrationStatus {
                plugin_registered: true,
                error: String::new(),
            })
            .await
            .unwrap();
        info
    }

    async fn channel(&self) -> tonic::transport::Channel {
        let sock = self.dir("plugins").join("gpu.vgpu.io/dra.sock");
        vgpu_device_plugin::unix::connect_unix(&sock).await.unwrap()
    }

    fn slice(&self) -> Option<Value> {
        self.api
            .get(SLICES.0, SLICES.1, "", &format!("{NODE}-gpu.vgpu.io"))
    }
}

/// A claim as kube-scheduler leaves it: one share of `device` (`memory`, `cores`) for request
/// `gpu`, reserved for pod `pod`.
fn claim(name: &str, device: &str, memory: &str, cores: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io"}}]}},
        "status": {
            "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.vgpu.io",
                "pool": NODE, "device": device, "shareID": "5b2a6f3e-0000-4000-8000-000000000001",
                "consumedCapacity": {"memory": memory, "cores": cores}}]}},
            "reservedFor": [{"resource": "pods", "name": "train", "uid": "pod-uid-1"}]}})
}

fn claim_ref(name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "ml".into(),
        uid: uid.into(),
        name: name.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_plugin_registers_publishes_prepares_and_unprepares() {
    let mut env = Env::start().await;

    // Registration: what the kubelet's DRA manager checks.
    let info = env.register(true).await;
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "gpu.vgpu.io");
    assert_eq!(
        info.supported_versions,
        ["v1.DRAPlugin", "v1beta1.DRAPlugin"]
    );
    assert_eq!(
        PathBuf::from(&info.endpoint),
        env.dir("plugins").join("gpu.vgpu.io/dra.sock")
    );

    // The slice, once registered.
    let slice = vgpu_tests::wait_for(T, "the ResourceSlice", || env.slice());
    let devices = slice["spec"]["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2, "{slice}");
    assert_eq!(devices[1]["name"], "gpu-1");
    assert_eq!(devices[1]["attributes"]["uuid"]["string"], GPU1);
    assert_eq!(devices[0]["attributes"]["numaNode"]["int"], 0);
    assert_eq!(devices[0]["capacity"]["memory"]["value"], "40960Mi");
    let node = env.api.get("v1", "nodes", "", NODE).unwrap();
    assert_eq!(
        slice["metadata"]["ownerReferences"][0]["uid"],
        node["metadata"]["uid"]
    );
    let generation = slice["spec"]["pool"]["generation"].as_i64().unwrap();

    // Prepare, batched: one good claim, one the API does not have, one replaced under its name,
    // one that would over-commit the GPU.
    // The API server gives each claim its uid.
    let uid_of = |v: Value| v["metadata"]["uid"].as_str().unwrap().to_string();
    let uid = uid_of(env.api.create(claim("good", "gpu-1", "4Gi", "30")).unwrap());
    let replaced = uid_of(
        env.api
            .create(claim("replaced", "gpu-0", "1Gi", "0"))
            .unwrap(),
    );
    // An allocation no scheduler would write: the whole card on top of "good"'s share.
    let forged = uid_of(
        env.api
            .create(claim("forged", "gpu-1", "40Gi", "0"))
            .unwrap(),
    );
    let mut client = v1::dra_plugin_client::DraPluginClient::new(env.channel().await);
    let req = v1::NodePrepareResourcesRequest {
        claims: vec![
            claim_ref("good", &uid),
            claim_ref("missing", "uid-missing"),
            claim_ref("replaced", "uid-old"),
            claim_ref("forged", &forged),
        ],
    };
    let answer = client
        .node_prepare_resources(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.claims.len(),
        4,
        "every claim gets an entry: {answer:?}"
    );
    let good = &answer.claims[&uid];
    assert_eq!(good.error, "");
    assert_eq!(good.devices.len(), 1);
    let d = &good.devices[0];
    assert_eq!(
        (d.pool_name.as_str(), d.device_name.as_str()),
        (NODE, "gpu-1")
    );
    assert_eq!(d.request_names, ["gpu"]);
    assert_eq!(
        d.cdi_device_ids,
        [
            format!("gpu.vgpu.io/claim={uid}-gpu"),
            format!("nvidia.com/gpu={GPU1}")
        ]
    );
    assert!(
        answer.claims["uid-missing"]
            .error
            .contains("reading resourceclaim ml/missing"),
        "{answer:?}"
    );
    assert!(
        answer.claims["uid-old"]
            .error
            .contains(&format!("has uid \"{replaced}\", not \"uid-old\"")),
        "{answer:?}"
    );

    assert_eq!(
        answer.claims[&forged].error,
        "device gpu-1 would hold 45056 MiB of its 40960 MiB and 30 of its 100 cores with this claim's share (40960 MiB, 0 cores) and the claims prepared on it: the allocation disagrees with the slice, so it is not prepared"
    );
    assert!(!env
        .dir("cdi")
        .join(format!("gpu.vgpu.io-claim_{forged}.json"))
        .exists());

    // What the container gets: the CDI spec's edits, the limits file the hook trusts.
    let spec_path = env.dir("cdi").join(format!("gpu.vgpu.io-claim_{uid}.json"));
    let spec: Value = serde_json::from_slice(&std::fs::read(&spec_path).unwrap()).unwrap();
    assert_eq!(spec["kind"], "gpu.vgpu.io/claim");
    let edits = &spec["devices"][0]["containerEdits"];
    let env_list: Vec<&str> = edits["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for want in [
        format!("NVIDIA_VISIBLE_DEVICES={GPU1}"),
        "CUDA_DEVICE_MEMORY_LIMIT_0=4096m".into(),
        "CUDA_DEVICE_SM_LIMIT_0=30".into(),
        "CUDA_DEVICE_MEMORY_LIMIT=4096m".into(),
    ] {
        assert!(env_list.contains(&want.as_str()), "{want}: {env_list:?}");
    }
    let mounts: Vec<(&str, &str)> = edits["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["containerPath"].as_str().unwrap(),
                m["hostPath"].as_str().unwrap(),
            )
        })
        .collect();
    let limits_host = env.dir("vgpu").join(format!("limits/{uid}_gpu.env"));
    assert!(
        mounts.contains(&("/usr/local/vgpu/limits.env", limits_host.to_str().unwrap())),
        "{mounts:?}"
    );
    assert!(
        mounts.iter().any(|(c, _)| *c == "/etc/ld.so.preload"),
        "{mounts:?}"
    );
    let limits =
        vgpu_core::limits_file::parse(&std::fs::read_to_string(&limits_host).unwrap()).unwrap();
    assert_eq!(limits["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
    assert!(env
        .dir("vgpu")
        .join(format!("containers/{uid}_gpu"))
        .is_dir());

    // Metrics, labelled by claim.
    let want = format!(
        "vgpu_container_memory_limit_bytes{{namespace=\"ml\",pod=\"train\",claim=\"good\",container=\"gpu\",device=\"{GPU1}\"}} {}",
        4096u64 << 20
    );
    let body = metrics_body(env.metrics_port).await;
    assert!(body.lines().any(|l| l == want), "no {want:?} in:\n{body}");

    // Idempotent, and from the checkpoint: the same answer with the claim gone from the API,
    // over v1beta1 too, and after a plugin restart.
    env.api
        .delete(SLICES.0, "resourceclaims", "ml", "good")
        .unwrap();
    let again = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("good", &uid)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.claims[&uid], *good);
    let mut beta = v1beta1::dra_plugin_client::DraPluginClient::new(env.channel().await);
    let b = beta
        .node_prepare_resources(v1beta1::NodePrepareResourcesRequest {
            claims: vec![v1beta1::Claim {
                namespace: "ml".into(),
                uid: uid.clone(),
                name: "good".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        b.claims[&uid].devices[0].cdi_device_ids,
        good.devices[0].cdi_device_ids
    );
    env.restart();
    env.register(false).await;
    let mut client = v1::dra_plugin_client::DraPluginClient::new(env.channel().await);
    let after = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("good", &uid)],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        after.claims[&uid], *good,
        "a restarted plugin answers from its checkpoint"
    );
    let slice = env.slice().unwrap();
    assert_eq!(
        slice["spec"]["pool"]["generation"].as_i64(),
        Some(generation),
        "same devices, same generation"
    );

    // Health: an XID taints the GPU (a new generation) and the stream says Unhealthy.
    let mut stream =
        health::dra_resource_health_client::DraResourceHealthClient::new(env.channel().await)
            .node_watch_resources(health::NodeWatchResourcesRequest {})
            .await
            .unwrap()
            .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 2);
    assert!(first
        .devices
        .iter()
        .all(|d| d.health == health::HealthStatus::Healthy as i32));
    std::fs::write(env.dir("xid-events"), "1 79\n").unwrap();
    let next = tokio::time::timeout(T, stream.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let sick = next
        .devices
        .iter()
        .find(|d| d.device.as_ref().unwrap().device_name == "gpu-1")
        .unwrap();
    assert_eq!(sick.health, health::HealthStatus::Unhealthy as i32);
    assert!(sick.message.contains(GPU1), "{sick:?}");
    let tainted = vgpu_tests::wait_for(T, "the taint on gpu-1", || {
        let s = env.slice()?;
        (s["spec"]["devices"][1]["taints"][0]["key"] == "gpu.vgpu.io/unhealthy").then_some(s)
    });
    assert!(tainted["spec"]["pool"]["generation"].as_i64().unwrap() > generation);
    // A claim on the now unhealthy GPU is refused at prepare, naming the GPU and the taint.
    let late_uid = uid_of(env.api.create(claim("late", "gpu-1", "1Gi", "0")).unwrap());
    let late = client
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![claim_ref("late", &late_uid)],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(
        late.claims[&late_uid].error.starts_with(&format!(
            "device gpu-1 ({GPU1}) is unhealthy (taint gpu.vgpu.io/unhealthy"
        )),
        "{late:?}"
    );

    // Unprepare removes what prepare made, and again is fine.
    for _ in 0..2 {
        let u = client
            .node_unprepare_resources(v1::NodeUnprepareResourcesRequest {
                claims: vec![claim_ref("good", &uid)],
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(u.claims[&uid].error, "");
    }
    assert!(!spec_path.exists());
    assert!(!limits_host.exists());
    assert!(!env
        .dir("vgpu")
        .join(format!("containers/{uid}_gpu"))
        .exists());
    assert!(!env.dir("vgpu").join(format!("dra/{uid}.json")).exists());
}

async fn metrics_body(port: u16) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    })
    .await
    .unwrap()
}
