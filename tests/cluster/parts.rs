//! vgpu's parts as host processes on the cluster's node, each configured from the rendered chart:
//! the chart's RBAC and a ServiceAccount token per part, the chart's container args (only the
//! host-specific ones replaced), the chart's webhook configurations (only `clientConfig` pointed at
//! the host), and a second kube-scheduler with the chart's KubeSchedulerConfiguration.

use crate::kube::{Cluster, DEVICE_PLUGIN_DIR};
use base64::Engine as _;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vgpu_tests::helm::{args, Chart, NAMESPACE};
use vgpu_tests::net::{addr_after, free_port, listening_addr};
use vgpu_tests::process::Running;

/// How long a part may take to come up.
pub const START: Duration = Duration::from_secs(60);
/// The one fake GPU of the node (the fake NVML's, and the fake libcuda's in the image).
pub const GPU_UUID: &str = "GPU-c1a55e00-0000-4000-8000-000000000001";
/// Its model.
pub const GPU_MODEL: &str = "NVIDIA A10";
/// Its memory.
pub const GPU_MIB: u64 = 24576;
/// The chart's scheduler name.
pub const SCHEDULER_NAME: &str = "vgpu-scheduler";

/// The chart rendered for this cluster's version.
pub fn chart() -> Chart {
    let helm = vgpu_tests::helm::helm().unwrap_or_else(|| {
        panic!("the cluster tier renders the chart: no helm ($HELM, .ci/tools/bin/helm or PATH); run .ci/install-tools")
    });
    Chart::render(&helm, "1.36.2", &[])
}

/// `args` without the flags named in `drop` (`--flag=value` or `--flag value`).
fn without(args: Vec<String>, drop: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_value = false;
    for a in args {
        if std::mem::take(&mut skip_value) {
            continue;
        }
        let name = a.split('=').next().unwrap_or_default();
        if drop.contains(&name) {
            skip_value = !a.contains('=');
            continue;
        }
        out.push(a);
    }
    out
}

/// The webhook as a host process, registered with the chart's two configurations.
pub struct Webhook {
    /// The process.
    pub proc: Running,
    /// Its HTTPS address.
    pub addr: SocketAddr,
    cert: PathBuf,
    key: PathBuf,
    args: Vec<String>,
}

/// The scheduler pair: vgpu-scheduler and a kube-scheduler that calls it.
pub struct Scheduler {
    /// vgpu-scheduler.
    pub extender: Running,
    /// Its extender address.
    pub extender_addr: SocketAddr,
    /// Its metrics address.
    pub metrics: SocketAddr,
    /// kube-scheduler with the chart's configuration.
    pub kube_scheduler: Running,
    args: Vec<String>,
}

/// The device plugin registered with the node's kubelet.
pub struct DevicePlugin {
    /// The process.
    pub proc: Running,
    /// Its metrics address.
    pub metrics: SocketAddr,
    cmd: Vec<String>,
    envs: Vec<(String, PathBuf)>,
}

/// Everything the tier started; stopping it unregisters the webhooks first, so a dead webhook
/// never outlives the run in the cluster's admission chain.
pub struct Parts<'c> {
    /// The cluster.
    pub cluster: &'c Cluster,
    /// Scratch space: certificates, kubeconfigs, the device plugin's host directory.
    pub tmp: tempfile::TempDir,
    /// The webhook.
    pub webhook: Option<Webhook>,
    /// The scheduler pair.
    pub scheduler: Option<Scheduler>,
    /// The device plugin.
    pub plugin: Option<DevicePlugin>,
    /// The DRA plugin (the device plugin's binary in `--mode=dra`).
    pub dra: Option<DevicePlugin>,
    /// The rendered chart.
    pub chart: Chart,
    /// The webhook's CA (PEM).
    pub ca_pem: String,
}

impl Drop for Parts<'_> {
    fn drop(&mut self) {
        for c in [
            "mutatingwebhookconfiguration/vgpu-mutate",
            "validatingwebhookconfiguration/vgpu-validate",
        ] {
            let _ = self.cluster.kubectl(&["delete", "--ignore-not-found", c]);
        }
        // The chart's objects applied by hand: a Helm install would refuse to adopt them.
        let _ = self.cluster.kubectl_stdin(
            &rbac_list(&self.chart).to_string(),
            &["delete", "--ignore-not-found", "--wait=false", "-f", "-"],
        );
    }
}

/// The chart's RBAC and ServiceAccounts as one List.
fn rbac_list(chart: &Chart) -> Value {
    let items: Vec<&Value> = chart
        .docs
        .iter()
        .filter(|d| {
            matches!(
                d["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                )
            )
        })
        .collect();
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

impl<'c> Parts<'c> {
    /// Applies the chart's namespace-independent setup (RBAC, ServiceAccounts) and starts nothing.
    pub fn prepare(cluster: &'c Cluster) -> Parts<'c> {
        let chart = chart();
        let tmp = tempfile::Builder::new()
            .prefix("vgpu-cluster-")
            .tempdir()
            .expect("tempdir");
        cluster.apply(
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
                .to_string(),
        );
        cluster.apply(&rbac_list(&chart).to_string());
        let pki = vgpu_tests::certs::TestPki::new(&[]);
        pki.write(tmp.path());
        Parts {
            cluster,
            ca_pem: pki.ca_pem.clone(),
            tmp,
            webhook: None,
            scheduler: None,
            plugin: None,
            dra: None,
            chart,
        }
    }

    fn kubeconfig_for(&self, sa: &str) -> PathBuf {
        let path = self.tmp.path().join(format!("{sa}.kubeconfig"));
        if !path.exists() {
            self.cluster
                .service_account_kubeconfig(NAMESPACE, sa, &path);
        }
        path
    }

    fn config_file(&self, configmap: &str) -> PathBuf {
        let text = self.chart.get("ConfigMap", configmap)["data"]["config.yaml"]
            .as_str()
            .unwrap_or_else(|| panic!("ConfigMap {configmap} has no config.yaml"))
            .to_string();
        let path = self.tmp.path().join(format!("{configmap}.yaml"));
        std::fs::write(&path, text).expect("write config");
        path
    }

    /// Starts the webhook with the chart's args and registers the chart's webhook configurations
    /// at its host address.
    pub fn start_webhook(&mut self) {
        let kubeconfig = self.kubeconfig_for("vgpu-webhook");
        let w = self.launch_webhook_with(&kubeconfig, NAMESPACE);
        self.register_webhooks(w.addr);
        self.webhook = Some(w);
    }

    /// A webhook beside the tier's, not registered with the API server: the chart's args with
    /// `kubeconfig` (`None`: its own ServiceAccount's) and its ledgers in `ledger_namespace`.
    pub fn side_webhook(&self, kubeconfig: Option<&Path>, ledger_namespace: &str) -> Webhook {
        let own = self.kubeconfig_for("vgpu-webhook");
        self.launch_webhook_with(kubeconfig.unwrap_or(&own), ledger_namespace)
    }

    fn launch_webhook_with(&self, kubeconfig: &Path, ledger_namespace: &str) -> Webhook {
        let config = self.config_file("vgpu-webhook");
        let mut args = without(
            args(
                self.chart
                    .container("Deployment", "vgpu-webhook", "webhook"),
            ),
            &["--listen", "--tls-cert", "--tls-key", "--config"],
        );
        args.extend([
            "--config".into(),
            config.display().to_string(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--namespace".into(),
            ledger_namespace.into(),
        ]);
        let (cert, key) = (
            self.tmp.path().join("tls.crt"),
            self.tmp.path().join("tls.key"),
        );
        launch_webhook(&cert, &key, &args, "127.0.0.1:0")
    }

    /// GET `path` over HTTPS from a part serving the tier's certificate (curl, trusting its CA).
    pub fn https_get(&self, addr: SocketAddr, path: &str) -> String {
        let out = Command::new("curl")
            .args(["-sS", "--fail", "--max-time", "10", "--cacert"])
            .arg(self.tmp.path().join("ca.crt"))
            .arg(format!("https://{addr}{path}"))
            .output()
            .expect("curl");
        assert!(out.status.success(), "GET {path}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `method` `path` over HTTPS with a JSON `body` (empty: none) to a part serving the tier's
    /// certificate: the HTTP status and the body, whatever the status.
    pub fn https_call(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> (u16, String) {
        let mut cmd = Command::new("curl");
        cmd.args([
            "-sS",
            "--max-time",
            "10",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            "--cacert",
        ])
        .arg(self.tmp.path().join("ca.crt"));
        let file = self.tmp.path().join("request.json");
        if !body.is_empty() {
            std::fs::write(&file, body).expect("write the request body");
            cmd.args(["-H", "Content-Type: application/json", "--data-binary"])
                .arg(format!("@{}", file.display()));
        }
        let out = cmd
            .arg(format!("https://{addr}{path}"))
            .output()
            .expect("curl");
        assert!(out.status.success(), "{method} {path}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
        (code.trim().parse().unwrap_or(0), body.to_string())
    }

    /// Stops the webhook (its configurations stay: the API server then fails closed).
    pub fn stop_webhook(&mut self) {
        if let Some(w) = self.webhook.as_mut() {
            w.proc.kill();
        }
    }

    /// Starts the webhook again on the same address with the same args.
    pub fn restart_webhook(&mut self) {
        let w = self.webhook.take().expect("webhook running");
        let (cert, key, args, addr) = (w.cert.clone(), w.key.clone(), w.args.clone(), w.addr);
        drop(w);
        self.webhook = Some(launch_webhook(&cert, &key, &args, &addr.to_string()));
    }

    fn register_webhooks(&self, addr: SocketAddr) {
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        for (kind, name) in [
            ("MutatingWebhookConfiguration", "vgpu-mutate"),
            ("ValidatingWebhookConfiguration", "vgpu-validate"),
        ] {
            let mut doc = self.chart.get(kind, name).clone();
            for w in doc["webhooks"].as_array_mut().into_iter().flatten() {
                let path = w["clientConfig"]["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_string();
                w["clientConfig"] = json!({"url": format!("https://{addr}{path}"), "caBundle": ca});
            }
            self.cluster.apply(&doc.to_string());
        }
    }

    /// Starts vgpu-scheduler with the chart's args and a kube-scheduler with the chart's
    /// configuration pointed at it.
    pub fn start_scheduler(&mut self) {
        self.start_scheduler_with(&json!({}));
    }

    /// [`Parts::start_scheduler`] with `client_connection` merged into kube-scheduler's
    /// `clientConnection` (`{"qps": 1000, "burst": 2000}`; the chart sets none).
    pub fn start_scheduler_with(&mut self, client_connection: &Value) {
        let kubeconfig = self.kubeconfig_for("vgpu-scheduler");
        let mut args = without(
            args(
                self.chart
                    .container("Deployment", "vgpu-scheduler", "vgpu-scheduler"),
            ),
            &["--listen", "--metrics-listen"],
        );
        args.extend([
            "--listen=127.0.0.1:0".into(),
            "--metrics-listen=127.0.0.1:0".into(),
            format!("--kubeconfig={}", kubeconfig.display()),
        ]);
        let (extender, extender_addr, metrics) = launch_extender(&args);

        let mut config =
            scheduler_config(&self.chart, &kubeconfig, &format!("http://{extender_addr}"));
        for (k, v) in client_connection.as_object().into_iter().flatten() {
            config["clientConnection"][k] = v.clone();
        }
        let path = self.tmp.path().join("kube-scheduler.json");
        std::fs::write(&path, config.to_string()).expect("write scheduler config");
        let kube_scheduler = self.launch_kube_scheduler(&path, &kubeconfig, "kube-scheduler");
        self.scheduler = Some(Scheduler {
            extender,
            extender_addr,
            metrics,
            kube_scheduler,
            args,
        });
    }

    /// A kube-scheduler from the cluster's binaries with `config`.
    pub fn launch_kube_scheduler(&self, config: &Path, kubeconfig: &Path, name: &str) -> Running {
        launch_kube_scheduler(self.cluster, config, kubeconfig, name)
    }

    /// Stops vgpu-scheduler, leaving kube-scheduler running.
    pub fn stop_extender(&mut self) {
        if let Some(s) = self.scheduler.as_mut() {
            s.extender.kill();
        }
    }

    /// Starts vgpu-scheduler again on the same addresses.
    pub fn restart_extender(&mut self) {
        let s = self.scheduler.as_mut().expect("scheduler pair");
        let mut a = without(s.args.clone(), &["--listen", "--metrics-listen"]);
        a.extend([
            format!("--listen={}", s.extender_addr),
            format!("--metrics-listen={}", s.metrics),
        ]);
        s.extender.kill();
        let (p, _, _) = launch_extender(&a);
        s.extender = p;
    }

    /// Runs the DaemonSet's init step (`--install-lib`) into `host_dir` and writes the fake
    /// NVML's configuration (the node's one GPU); its path.
    fn node_agent_setup(&self, host_dir: &Path) -> PathBuf {
        self.node_agent_setup_for(host_dir, GPU_UUID, "")
    }

    /// [`Self::node_agent_setup`] for a node whose one GPU is `uuid`, its NVML files named with
    /// `suffix`.
    fn node_agent_setup_for(&self, host_dir: &Path, uuid: &str, suffix: &str) -> PathBuf {
        let bin = vgpu_tests::binary("vgpu-device-plugin");
        let out = Command::new(&bin)
            .arg(format!("--install-lib={}", host_dir.display()))
            .arg(format!(
                "--lib-source={}",
                vgpu_tests::cdylib("vgpu").display()
            ))
            .output()
            .expect("run --install-lib");
        assert!(out.status.success(), "device plugin --install-lib: {out:?}");
        let nvml = self.tmp.path().join(format!("nvml{suffix}.json"));
        let events = self.tmp.path().join(format!("nvml-events{suffix}.txt"));
        std::fs::write(&events, "").expect("write the NVML events file");
        std::fs::write(
            &nvml,
            json!({"gpus": [{"uuid": uuid, "name": GPU_MODEL, "memoryMib": GPU_MIB}],
                "eventsFile": events})
            .to_string(),
        )
        .expect("write nvml config");
        nvml
    }

    /// The fake NVML's events file: a line `<gpu index> <xid>` appended there is an XID event
    /// for the running node agent.
    pub fn nvml_events(&self) -> PathBuf {
        self.tmp.path().join("nvml-events.txt")
    }

    /// Switches to `chart` (rendered with other values): its RBAC applied, and the running
    /// webhook registered with its webhook configurations.
    pub fn switch_chart(&mut self, chart: Chart) {
        self.chart = chart;
        self.cluster.apply(&rbac_list(&self.chart).to_string());
        if let Some(addr) = self.webhook.as_ref().map(|w| w.addr) {
            self.register_webhooks(addr);
        }
    }

    /// Runs the DaemonSet's init step (`--install-lib`) and starts the device plugin with the
    /// chart's args, the fake NVML standing in for the driver.
    pub fn start_device_plugin(&mut self) {
        let host_dir = self.tmp.path().join("host-vgpu");
        let nvml = self.node_agent_setup(&host_dir);
        let kubeconfig = self.kubeconfig_for("vgpu-device-plugin");
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = without(
            args(
                self.chart
                    .container("DaemonSet", "vgpu-device-plugin", "device-plugin"),
            ),
            &[
                "--host-dir",
                "--metrics-listen",
                "--nvml-lib",
                "--device-plugin-dir",
            ],
        );
        cmd.extend([
            format!("--host-dir={}", host_dir.display()),
            format!("--metrics-listen={metrics}"),
            format!("--nvml-lib={}", vgpu_tests::cdylib("fake_nvml").display()),
            format!("--device-plugin-dir={DEVICE_PLUGIN_DIR}"),
            format!("--node-name={}", self.cluster.node),
        ]);
        let envs = vec![
            ("KUBECONFIG".to_string(), kubeconfig),
            ("FAKE_NVML_CONFIG".to_string(), nvml),
        ];
        let proc = launch_plugin(&cmd, &envs);
        self.wait_for_capacity("the device plugin registers");
        self.plugin = Some(DevicePlugin {
            proc,
            metrics,
            cmd,
            envs,
        });
    }

    /// Stops the device plugin (the node changes mode).
    pub fn stop_device_plugin(&mut self) {
        self.plugin = None;
    }

    /// Starts the node agent in DRA mode with the chart's args (a chart rendered with
    /// `dra.enabled=true`, see [`Self::switch_chart`]); waits until the kubelet has registered it.
    pub fn start_dra_plugin(&mut self) {
        let plugin = self.launch_dra_plugin(&self.cluster.node, GPU_UUID, None);
        self.dra = Some(plugin);
    }

    /// The DRA plugin for the kube-local second node (`<node>-2`), run in its mount namespace
    /// (`mount_ns`: its kubelet's plugin directories and CDI directory at the standard paths),
    /// its one GPU `uuid`; registered with that node's kubelet.
    pub fn dra_plugin_on(&self, node: &str, uuid: &str, mount_ns: &Path) -> DevicePlugin {
        self.launch_dra_plugin(node, uuid, Some(mount_ns))
    }

    fn launch_dra_plugin(&self, node: &str, uuid: &str, mount_ns: Option<&Path>) -> DevicePlugin {
        let chart = &self.chart;
        let suffix = if mount_ns.is_some() {
            format!("-{node}")
        } else {
            String::new()
        };
        let host_dir = self.tmp.path().join(format!("host-vgpu-dra{suffix}"));
        let nvml = self.node_agent_setup_for(&host_dir, uuid, &suffix);
        let kubeconfig = self.kubeconfig_for("vgpu-device-plugin");
        let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut cmd = without(
            args(chart.container("DaemonSet", "vgpu-dra-plugin", "dra-plugin")),
            &["--host-dir", "--metrics-listen", "--nvml-lib"],
        );
        cmd.extend([
            format!("--host-dir={}", host_dir.display()),
            format!("--metrics-listen={metrics}"),
            format!("--nvml-lib={}", vgpu_tests::cdylib("fake_nvml").display()),
            format!("--node-name={node}"),
        ]);
        let envs = vec![
            ("KUBECONFIG".to_string(), kubeconfig),
            ("FAKE_NVML_CONFIG".to_string(), nvml),
        ];
        let mut proc = match mount_ns {
            None => launch_plugin(&cmd, &envs),
            Some(ns) => {
                let mut all = vec![
                    format!("--mount={}", ns.display()),
                    "--".to_string(),
                    vgpu_tests::binary("vgpu-device-plugin")
                        .display()
                        .to_string(),
                ];
                all.extend(cmd.iter().cloned());
                launch_in("nsenter", &all, &envs)
            }
        };
        proc.wait_for_line(START, |l| l.contains("registered with the kubelet"));
        DevicePlugin {
            proc,
            metrics,
            cmd,
            envs,
        }
    }

    /// Kills the DRA plugin (SIGKILL) and starts it again with the same flags; returns how long
    /// the new one took until the kubelet registered it.
    pub fn restart_dra_plugin(&mut self) -> std::time::Duration {
        self.dra.as_mut().expect("DRA plugin").restart()
    }

    /// Waits until the node advertises the split GPU (`--split-count` devices, allocatable) and the
    /// plugin's inventory: the kubelet has the plugin's devices and the extender can see the GPU.
    pub fn wait_for_capacity(&self, what: &str) -> std::time::Duration {
        let started = std::time::Instant::now();
        let split = args(
            self.chart
                .container("DaemonSet", "vgpu-device-plugin", "device-plugin"),
        )
        .iter()
        .find_map(|a| a.strip_prefix("--split-count=").map(str::to_string))
        .expect("the chart passes --split-count");
        vgpu_tests::wait_for(
            START,
            &format!("{what}: node allocatable nvidia.com/gpu {split}"),
            || {
                let node = self.cluster.get(&["node", &self.cluster.node])?;
                let inventory = node["metadata"]["annotations"]
                    [vgpu_core::annotations::NODE_DEVICES]
                    .as_str()?;
                (node["status"]["allocatable"]["nvidia.com/gpu"] == split.as_str()
                    && inventory.contains(GPU_UUID))
                .then_some(())
            },
        );
        started.elapsed()
    }

    /// Kills the device plugin (SIGKILL) and starts it again with the same flags; returns how long
    /// the new one took to register with the kubelet.
    pub fn restart_device_plugin(&mut self) -> std::time::Duration {
        self.plugin.as_mut().expect("device plugin").restart()
    }
}

impl DevicePlugin {
    /// SIGKILL, then the same command again; how long until the kubelet registered it (both modes
    /// log "registered with the kubelet").
    fn restart(&mut self) -> std::time::Duration {
        self.proc.kill();
        let started = std::time::Instant::now();
        self.proc = launch_plugin(&self.cmd, &self.envs);
        self.proc
            .wait_for_line(START, |l| l.contains("registered with the kubelet"));
        started.elapsed()
    }
}

fn launch_webhook(cert: &Path, key: &Path, args: &[String], listen: &str) -> Webhook {
    let mut cmd = Command::new(vgpu_tests::binary("vgpu-webhook"));
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .arg(format!("--listen={listen}"))
        .arg(format!("--tls-cert={}", cert.display()))
        .arg(format!("--tls-key={}", key.display()))
        .args(args);
    let mut proc = Running::spawn("vgpu-webhook", cmd);
    let line = proc.wait_for_line(START, |l| listening_addr(l).is_some());
    let addr = listening_addr(&line).unwrap_or_else(|| panic!("no address in {line:?}"));
    Webhook {
        proc,
        addr,
        cert: cert.into(),
        key: key.into(),
        args: args.to_vec(),
    }
}

fn launch_extender(args: &[String]) -> (Running, SocketAddr, SocketAddr) {
    let mut cmd = Command::new(vgpu_tests::binary("vgpu-scheduler"));
    cmd.args(args)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBECONFIG");
    let mut p = Running::spawn("vgpu-scheduler", cmd);
    let addr = addr_after(&p.wait_for_line(START, |l| l.contains("extender listening")));
    let metrics = addr_after(&p.wait_for_line(START, |l| l.contains("metrics listening")));
    (p, addr, metrics)
}

fn launch_plugin(args: &[String], envs: &[(String, PathBuf)]) -> Running {
    launch_in(vgpu_tests::binary("vgpu-device-plugin"), args, envs)
}

/// `program` with `args` as the node agent runs (no in-cluster environment, info logs).
fn launch_in(
    program: impl AsRef<std::ffi::OsStr>,
    args: &[String],
    envs: &[(String, PathBuf)],
) -> Running {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove("NODE_NAME")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("RUST_LOG", "info");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    Running::spawn("vgpu-device-plugin", cmd)
}

/// The chart's KubeSchedulerConfiguration for a host process: the kubeconfig instead of in-cluster
/// config, no leader election (a lease left by an earlier run would hold a new scheduler back for
/// its duration), and the extender at `url_prefix`.
pub fn scheduler_config(chart: &Chart, kubeconfig: &Path, url_prefix: &str) -> Value {
    let text = chart.get("ConfigMap", "vgpu-scheduler")["data"]["config.yaml"]
        .as_str()
        .expect("the chart's scheduler config")
        .to_string();
    let mut config: Value =
        serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&text).expect("YAML"))
            .expect("JSON");
    config["clientConnection"] = json!({"kubeconfig": kubeconfig});
    config["leaderElection"] = json!({"leaderElect": false});
    // Each extender keeps its path (DRA mode's is `/dra`) on the given host.
    for e in config["extenders"].as_array_mut().into_iter().flatten() {
        let path = e["urlPrefix"]
            .as_str()
            .and_then(|u| u.split("://").nth(1))
            .and_then(|rest| rest.find('/').map(|i| rest[i..].to_string()))
            .unwrap_or_default();
        e["urlPrefix"] = json!(format!("{url_prefix}{path}"));
    }
    config
}

/// A kube-scheduler from `cluster`'s binaries with `config`, once it serves.
pub fn launch_kube_scheduler(
    cluster: &Cluster,
    config: &Path,
    kubeconfig: &Path,
    name: &str,
) -> Running {
    let port = free_port();
    let mut cmd = Command::new(cluster.bin("kube-scheduler"));
    cmd.arg(format!("--config={}", config.display()))
        .args(["--bind-address=127.0.0.1", "--v=2"])
        .arg(format!("--secure-port={port}"))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ));
    let mut p = Running::spawn(name, cmd);
    p.wait_for_line(START, |l| l.contains("Serving securely"));
    p
}
