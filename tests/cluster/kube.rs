//! The cluster under test: where it is, and `kubectl` against it.
//!
//! The tier needs a disposable single-node cluster whose node is this machine (the device plugin
//! registers with that node's kubelet through its socket directory): a kube-local install, as
//! `../shared/kube/up.sh --node` makes one. `VGPU_CLUSTER` names its directory (`$HOME/kube-local`):
//! `kubeconfig` (cluster-admin), `bin/kubectl`, `bin/kube-scheduler`, `pki/ca.crt`.

use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a pod may take to start, be scheduled or be admitted.
pub const WAIT: Duration = Duration::from_secs(90);

/// The kubelet's device-plugin directory on the node (`--root-dir` default of the kubelet).
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// containerd's socket in a kube-local install (its `CTRD_STATE`).
pub const CONTAINERD_SOCKET: &str = "/run/kube-local/containerd/containerd.sock";
/// The API server as host processes reach it.
pub const API_SERVER: &str = "https://127.0.0.1:6443";

/// A cluster to run the tier against.
pub struct Cluster {
    /// The kube-local directory.
    pub dir: PathBuf,
    /// The node's name (the one Node object).
    pub node: String,
}

impl Cluster {
    /// The cluster `VGPU_CLUSTER` names; `None` (after one line saying how to enable the tier)
    /// when it is unset, a panic when `VGPU_REQUIRE_CLUSTER` is set and there is none.
    pub fn from_env() -> Option<Cluster> {
        let required = std::env::var_os("VGPU_REQUIRE_CLUSTER").is_some_and(|v| v != "0");
        let Some(dir) = std::env::var_os("VGPU_CLUSTER").map(PathBuf::from) else {
            assert!(
                !required,
                "VGPU_REQUIRE_CLUSTER is set but VGPU_CLUSTER names no cluster"
            );
            crate::report(
                "SKIPPED: the real-cluster tier needs a disposable single-node cluster on this machine: \
                 run ../shared/kube/up.sh --node, then VGPU_CLUSTER=$HOME/kube-local cargo test -p vgpu-tests --test cluster \
                 (docs/cluster-tests.md)"
            );
            return None;
        };
        for f in ["kubeconfig", "bin/kubectl", "bin/kube-scheduler"] {
            assert!(
                dir.join(f).exists(),
                "VGPU_CLUSTER={}: no {f} there (is it a kube-local install?)",
                dir.display()
            );
        }
        let mut c = Cluster {
            dir,
            node: String::new(),
        };
        let nodes = c.json(&["get", "nodes"]);
        let names: Vec<&str> = nodes["items"]
            .as_array()
            .into_iter()
            .flatten()
            // The scale step's simulated nodes, left by a run that was killed: that step deletes
            // them when it starts.
            .filter(|n| n["metadata"]["labels"][crate::scale::LABEL].is_null())
            .filter_map(|n| n["metadata"]["name"].as_str())
            .collect();
        assert_eq!(
            names.len(),
            1,
            "the tier needs a single-node cluster; nodes: {names:?}"
        );
        c.node = names[0].to_string();
        Some(c)
    }

    /// The cluster-admin kubeconfig.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// A binary of the install (`kube-scheduler`).
    pub fn bin(&self, name: &str) -> PathBuf {
        self.dir.join("bin").join(name)
    }

    /// `kubectl ARGS` as cluster-admin: stdout, or the error output naming the command.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        self.kubectl_as(&self.kubeconfig(), args, None)
    }

    /// `kubectl ARGS` with `stdin`.
    pub fn kubectl_stdin(&self, stdin: &str, args: &[&str]) -> Result<String, String> {
        self.kubectl_as(&self.kubeconfig(), args, Some(stdin))
    }

    /// `kubectl ARGS` with another kubeconfig.
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, String> {
        self.kubectl_full(kubeconfig, args, stdin)
            .map(|(out, _)| out)
    }

    /// `kubectl create -f -` of `doc`: what it printed on stderr (admission warnings) when created.
    pub fn create_warnings(&self, doc: &Value) -> Result<String, String> {
        self.kubectl_full(
            &self.kubeconfig(),
            &["create", "-f", "-"],
            Some(&doc.to_string()),
        )
        .map(|(_, err)| err)
    }

    /// `kubectl ARGS`: (stdout, stderr) on success, the error output naming the command otherwise.
    fn kubectl_full(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<(String, String), String> {
        let mut cmd = Command::new(self.bin("kubectl"));
        cmd.arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout", "20s"])
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| format!("kubectl {args:?}: {e}"))?;
        if let Some(s) = stdin {
            if let Some(mut w) = child.stdin.take() {
                w.write_all(s.as_bytes())
                    .map_err(|e| format!("kubectl {args:?}: stdin: {e}"))?;
            }
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("kubectl {args:?}: {e}"))?;
        if out.status.success() {
            Ok((
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ))
        } else {
            Err(format!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }

    /// `kubectl ARGS -o json`, parsed; panics on failure.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a).unwrap_or_else(|e| panic!("{e}"));
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("kubectl {a:?}: not JSON: {e}"))
    }

    /// `kubectl get ARGS -o json`, or `None` when it fails (not found).
    pub fn get(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a).ok()?).ok()
    }

    /// `kubectl apply -f -` of JSON or YAML documents; panics on failure.
    pub fn apply(&self, docs: &str) {
        self.kubectl_stdin(docs, &["apply", "-f", "-"])
            .unwrap_or_else(|e| panic!("{e}\n{docs}"));
    }

    /// `kubectl create -f -`: the error text when the API server refuses the object.
    pub fn create(&self, doc: &Value) -> Result<String, String> {
        self.kubectl_stdin(&doc.to_string(), &["create", "-f", "-"])
    }

    /// Deletes whatever ARGS names and waits until it is gone.
    pub fn delete(&self, args: &[&str]) {
        let mut a = vec![
            "delete",
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ];
        a.extend(args);
        self.kubectl(&a).unwrap_or_else(|e| panic!("{e}"));
    }

    /// A kubeconfig for ServiceAccount `ns/sa` (a token from the TokenRequest API), written to
    /// `path`: the part runs with exactly the RBAC the chart gives it.
    pub fn service_account_kubeconfig(&self, ns: &str, sa: &str, path: &Path) {
        let token = self
            .kubectl(&["create", "token", sa, "-n", ns, "--duration=4h"])
            .unwrap_or_else(|e| panic!("{e}"));
        let ca = std::fs::read(self.dir.join("pki/ca.crt")).expect("pki/ca.crt");
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(ca);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {API_SERVER}\n    certificate-authority-data: {ca}\n\
             users:\n- name: {sa}\n  user:\n    token: {}\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: {sa}\n    namespace: {ns}\ncurrent-context: c\n",
            token.trim()
        );
        std::fs::write(path, text).expect("write kubeconfig");
    }

    /// The pod `ns/name`, or `None`.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.get(&["pod", name, "-n", ns])
    }

    /// Events in `ns` (`kubectl get events`), as `reason: message` per involved object name.
    pub fn events(&self, ns: &str) -> Vec<(String, String, String)> {
        self.json(&["get", "events", "-n", ns])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["involvedObject"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    e["reason"].as_str().unwrap_or_default().to_string(),
                    e["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Creates `pod` in namespace `ns`; the API server's refusal as `Err`.
    pub fn create_in(&self, ns: &str, mut pod: Value) -> Result<String, String> {
        pod["metadata"]["namespace"] = Value::from(ns);
        self.create(&pod)
    }

    /// Stops the node's kubelet (its pods keep running, as on a real node) and starts it again
    /// with the kube-local scripts; `false` (and nothing done) without `VGPU_CLUSTER_SCRIPTS`.
    pub fn restart_kubelet(&self, step: &str) -> bool {
        let Some(scripts) = std::env::var_os("VGPU_CLUSTER_SCRIPTS").map(PathBuf::from) else {
            crate::report(&format!("{step}: skipped (set VGPU_CLUSTER_SCRIPTS to the kube-local scripts, e.g. ../shared/kube)"));
            return false;
        };
        let pid_file = self.dir.join("run/kubelet.pid");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{step}: {}: {e}", pid_file.display()));
        let status = std::process::Command::new("kill")
            .arg(pid.trim())
            .status()
            .expect("kill");
        assert!(status.success(), "{step}: kill {pid}");
        let gone = format!("/proc/{}", pid.trim());
        vgpu_tests::wait_for(WAIT, &format!("{step}: the kubelet stops"), || {
            (!Path::new(&gone).exists()).then_some(())
        });
        let out = std::process::Command::new("bash")
            .arg(scripts.join("node-up.sh"))
            .env("KUBE_LOCAL", &self.dir)
            .output()
            .expect("node-up.sh");
        assert!(out.status.success(), "{step}: node-up.sh: {out:?}");
        true
    }

    /// Waits until pod `ns/name` is Running and returns it.
    pub fn wait_running(&self, ns: &str, name: &str, step: &str) -> Value {
        let c = self;
        let deadline = Instant::now() + WAIT;
        loop {
            let pod = c.pod(ns, name);
            let phase = pod
                .as_ref()
                .and_then(|p| p["status"]["phase"].as_str().map(str::to_string));
            if phase.as_deref() == Some("Running") {
                return pod.unwrap_or_default();
            }
            if Instant::now() > deadline || matches!(phase.as_deref(), Some("Failed" | "Succeeded"))
            {
                let describe = c
                    .kubectl(&["describe", "pod", name, "-n", ns])
                    .unwrap_or_else(|e| e);
                panic!("{step}: pod {ns}/{name} is not Running (phase {phase:?}):\n{describe}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The logs of pod `ns/name`, once a line passes `done`.
    pub fn logs_until(
        &self,
        ns: &str,
        name: &str,
        step: &str,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let c = self;
        vgpu_tests::wait_for(WAIT, &format!("{step}: the logs of {ns}/{name}"), || {
            let logs = c.kubectl(&["logs", name, "-n", ns]).ok()?;
            logs.lines().any(&done).then_some(logs)
        })
    }
}
