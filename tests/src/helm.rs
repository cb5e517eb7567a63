//! The Helm chart as a real `helm` binary renders it: found through `$HELM`, then
//! `.ci/tools/bin/helm` (what `.ci/run` installs), then `PATH`.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// Release name the tests render the chart as.
pub const RELEASE: &str = "vgpu";
/// Namespace the tests render the chart into.
pub const NAMESPACE: &str = "vgpu-system";

/// The `helm` binary, if there is one.
pub fn helm() -> Option<PathBuf> {
    if let Ok(h) = std::env::var("HELM") {
        return Some(PathBuf::from(h));
    }
    let ci = crate::repo_root().join(".ci/tools/bin/helm");
    if ci.exists() {
        return Some(ci);
    }
    Command::new("helm")
        .arg("version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::from("helm"))
}

/// The rendered chart's documents.
pub struct Chart {
    /// Every document, as JSON.
    pub docs: Vec<Value>,
}

impl Chart {
    /// `helm template` of helm/vgpu with `--set` pairs, for Kubernetes `kube_version`.
    pub fn render(helm: &PathBuf, kube_version: &str, sets: &[&str]) -> Chart {
        let chart = crate::repo_root().join("helm/vgpu");
        let mut cmd = Command::new(helm);
        cmd.args(["template", RELEASE]).arg(&chart).args([
            "--namespace",
            NAMESPACE,
            "--kube-version",
            kube_version,
        ]);
        for s in sets {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("run helm");
        assert!(
            out.status.success(),
            "helm template {sets:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf-8 output");
        let mut docs = Vec::new();
        for de in serde_yaml::Deserializer::from_str(&text) {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(de)
                .unwrap_or_else(|e| panic!("{sets:?}: a document does not parse: {e}"));
            if v.is_null() {
                continue;
            }
            docs.push(serde_json::to_value(v).expect("YAML to JSON"));
        }
        Chart { docs }
    }

    /// Every document of `kind`.
    pub fn all(&self, kind: &str) -> impl Iterator<Item = &Value> {
        let kind = kind.to_string();
        self.docs.iter().filter(move |d| d["kind"] == kind.as_str())
    }

    /// The document of `kind` named `name`.
    pub fn get(&self, kind: &str, name: &str) -> &Value {
        self.all(kind)
            .find(|d| d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the chart"))
    }

    /// Every workload with its pod template.
    pub fn workloads(&self) -> Vec<(&Value, &Value)> {
        let mut out = Vec::new();
        for d in &self.docs {
            let tmpl = match d["kind"].as_str() {
                Some("Deployment" | "DaemonSet" | "Job") => &d["spec"]["template"],
                Some("CronJob") => &d["spec"]["jobTemplate"]["spec"]["template"],
                _ => continue,
            };
            out.push((d, tmpl));
        }
        out
    }

    /// Container `container` of workload `kind`/`name`.
    pub fn container<'a>(&'a self, kind: &str, name: &str, container: &str) -> &'a Value {
        self.get(kind, name)["spec"]["template"]["spec"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == container))
            .unwrap_or_else(|| panic!("{kind} {name} has no container {container}"))
    }
}

/// A container's `args`.
pub fn args(container: &Value) -> Vec<String> {
    container["args"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}
