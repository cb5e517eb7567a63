//! The Helm install, exactly as README says, on the real cluster: the images made here
//! (docker/local-images.sh), `helm install` with only the overrides this machine forces (image
//! registry and pull policy, the fake NVML for the device plugin, the node label), then the
//! journey against the installed components, least privilege checked with `kubectl auth can-i`,
//! and `helm uninstall` leaving nothing that could block a pod.

use crate::journey::{probe_pod, slice_pod};
use crate::kube::{Cluster, CONTAINERD_SOCKET, WAIT};
use crate::parts::{GPU_MIB, GPU_MODEL, GPU_UUID};
use crate::{report, sh};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::assignment::PodAssignment;

const RELEASE: &str = "vgpu";
const NS: &str = "vgpu-system";
/// A tenant namespace for the installed journey.
const TENANT: &str = "vgpu-installed";
const QUOTA_MIB: u64 = 8192;
/// Where the fake NVML sits in the device plugin's container.
const FAKE_NVML_DIR: &str = "/opt/fake-nvml";
/// The kube-scheduler version the chart defaults its image tag to (the cluster's).
const KUBE_SCHEDULER_TAG: &str = "v1.36.2";

/// `helm ARGS` against the cluster.
fn helm(c: &Cluster, args: &[&str]) -> Result<String, String> {
    let bin = vgpu_tests::helm::helm().expect("helm");
    let out = Command::new(bin)
        .args(args)
        .env("KUBECONFIG", c.kubeconfig())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "helm {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// The images the chart runs, made from this build's binaries and imported into the node.
fn images(c: &Cluster, work: &Path) {
    let script = vgpu_tests::repo_root().join("docker/local-images.sh");
    let out = work.join("images");
    sh(Command::new("bash")
        .arg(&script)
        .arg("images")
        .arg(vgpu_tests::profile_dir())
        .arg(&out)
        .arg("local"));
    sh(Command::new("bash")
        .arg(&script)
        .arg("kube-scheduler")
        .arg(c.bin("kube-scheduler"))
        .arg(out.join("kube-scheduler.tar"))
        .arg(format!("local/kube-scheduler:{KUBE_SCHEDULER_TAG}")));
    let tars: Vec<PathBuf> = std::fs::read_dir(&out)
        .expect("images")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    sh(Command::new("bash")
        .arg(&script)
        .arg("import")
        .args(&tars)
        .env("CONTAINERD_ADDRESS", CONTAINERD_SOCKET));
}

/// The fake NVML for the device plugin, in a host directory its pod mounts.
fn fake_nvml(work: &Path) -> PathBuf {
    let dir = work.join("fake-nvml");
    std::fs::create_dir_all(&dir).expect("mkdir fake-nvml");
    std::fs::copy(
        vgpu_tests::cdylib("fake_nvml"),
        dir.join("libnvidia-ml.so.1"),
    )
    .expect("copy fake NVML");
    std::fs::write(
        dir.join("nvml.json"),
        json!({"gpus": [{"uuid": GPU_UUID, "name": GPU_MODEL, "memoryMib": GPU_MIB}]}).to_string(),
    )
    .expect("write nvml.json");
    dir
}

/// `helm install` as README says, with this machine's overrides only.
fn install(c: &Cluster, nvml: &Path) {
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
            "pod-security.kubernetes.io/enforce": "privileged"}}})
        .to_string(),
    );
    c.kubectl(&["label", "--overwrite", "node", &c.node, "gpu=on"])
        .unwrap_or_else(|e| panic!("{e}"));
    let chart = vgpu_tests::repo_root().join("helm/vgpu");
    let volumes = json!([{"name": "fake-nvml", "hostPath": {"path": nvml, "type": "Directory"}}]);
    let mounts = json!([{"name": "fake-nvml", "mountPath": FAKE_NVML_DIR, "readOnly": true}]);
    let env = json!([{"name": "FAKE_NVML_CONFIG", "value": format!("{FAKE_NVML_DIR}/nvml.json")}]);
    let started = Instant::now();
    helm(
        c,
        &[
            "install",
            RELEASE,
            chart.to_str().expect("path"),
            "-n",
            NS,
            "--wait",
            "--timeout",
            "4m",
            // What this machine forces: images from containerd, never pulled.
            "--set",
            "global.imageRegistry=local",
            "--set",
            "imagePullPolicy=Never",
            "--set",
            "scheduler.kubeScheduler.image.registry=local",
            // The fake NVML instead of the driver's.
            "--set",
            &format!("devicePlugin.nvmlLib={FAKE_NVML_DIR}/libnvidia-ml.so.1"),
            "--set-json",
            &format!("devicePlugin.extraEnv={env}"),
            "--set-json",
            &format!("devicePlugin.extraVolumes={volumes}"),
            "--set-json",
            &format!("devicePlugin.extraVolumeMounts={mounts}"),
        ],
    )
    .unwrap_or_else(|e| panic!("install: {e}\n{}", describe_release(c)));
    report(&format!(
        "helm install: deployed in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

/// What an operator would look at when an install fails.
fn describe_release(c: &Cluster) -> String {
    let mut out = String::new();
    for args in [
        &["get", "pods,jobs", "-n", NS, "-o", "wide"][..],
        &["describe", "pods", "-n", NS][..],
        &["get", "events", "-n", NS][..],
    ] {
        out.push_str(&c.kubectl(args).unwrap_or_else(|e| e));
    }
    for pod in c.json(&["get", "pods", "-n", NS])["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        out.push_str(&format!("---- logs of {name}\n"));
        out.push_str(
            &c.kubectl(&["logs", &name, "-n", NS, "--all-containers", "--tail=30"])
                .unwrap_or_else(|e| e),
        );
    }
    out
}

/// What the install must have produced: workloads ready, the CA in both webhook configurations,
/// the device plugin's split GPU on the node.
fn check_installed(c: &Cluster) {
    let step = "install";
    for kind in ["deployment", "daemonset"] {
        for w in c.json(&["get", kind, "-n", NS])["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
        {
            let name = w["metadata"]["name"].as_str().unwrap_or_default();
            let (want, ready) = match kind {
                "deployment" => (&w["spec"]["replicas"], &w["status"]["readyReplicas"]),
                _ => (
                    &w["status"]["desiredNumberScheduled"],
                    &w["status"]["numberReady"],
                ),
            };
            assert_eq!(
                want,
                ready,
                "{step}: {kind} {name} not ready:\n{}",
                describe_release(c)
            );
        }
    }
    let secret = c.json(&["get", "secret", "vgpu-webhook-tls", "-n", NS]);
    let ca = secret["data"]["ca.crt"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        !ca.is_empty(),
        "{step}: the certificates Job left no ca.crt: {secret}"
    );
    for kind in [
        "mutatingwebhookconfiguration/vgpu-mutate",
        "validatingwebhookconfiguration/vgpu-validate",
    ] {
        let cfg = c.json(&["get", kind]);
        assert_eq!(
            cfg["webhooks"][0]["clientConfig"]["caBundle"].as_str(),
            Some(ca.as_str()),
            "{step}: the inject Job did not give {kind} the CA"
        );
    }
    vgpu_tests::wait_for(WAIT, &format!("{step}: the node's split GPU"), || {
        let node = c.get(&["node", &c.node])?;
        (node["status"]["allocatable"]["nvidia.com/gpu"] == "10").then_some(())
    });
}

/// Each ServiceAccount can do what the journey needs and not a sample of what it must not.
fn check_rbac(c: &Cluster) {
    let can = |sa: &str, args: &[&str]| -> bool {
        let who = format!("--as=system:serviceaccount:{NS}:{sa}");
        let mut a = vec!["auth", "can-i", who.as_str()];
        a.extend(args);
        // `kubectl auth can-i` exits 1 for "no".
        c.kubectl(&a).is_ok_and(|o| o.trim() == "yes")
    };
    let cases: &[(&str, &[&str], bool)] = &[
        ("vgpu-webhook", &["create", "configmaps", "-n", NS], true),
        ("vgpu-webhook", &["list", "pods", "--all-namespaces"], true),
        (
            "vgpu-webhook",
            &["create", "events.events.k8s.io", "-n", TENANT],
            true,
        ),
        ("vgpu-webhook", &["get", "secrets", "-n", NS], false),
        ("vgpu-webhook", &["create", "pods", "-n", TENANT], false),
        (
            "vgpu-webhook",
            &["update", "resourcequotas", "-n", TENANT],
            false,
        ),
        // The same ServiceAccount runs kube-scheduler (system:kube-scheduler: bindings, and pod
        // deletes for preemption) and the extender (the assignment patch).
        (
            "vgpu-scheduler",
            &["create", "pods", "--subresource=binding", "-n", TENANT],
            true,
        ),
        ("vgpu-scheduler", &["patch", "pods", "-n", TENANT], true),
        ("vgpu-scheduler", &["create", "pods", "-n", TENANT], false),
        ("vgpu-scheduler", &["get", "secrets", "-n", NS], false),
        ("vgpu-device-plugin", &["patch", "nodes"], true),
        (
            "vgpu-device-plugin",
            &["list", "pods", "--all-namespaces"],
            true,
        ),
        ("vgpu-device-plugin", &["delete", "nodes"], false),
        (
            "vgpu-device-plugin",
            &["create", "pods", "-n", TENANT],
            false,
        ),
        (
            "vgpu-certs",
            &["patch", "mutatingwebhookconfigurations/vgpu-mutate"],
            true,
        ),
        (
            "vgpu-certs",
            &["patch", "validatingwebhookconfigurations/vgpu-validate"],
            true,
        ),
        (
            "vgpu-certs",
            &["patch", "mutatingwebhookconfigurations/other"],
            false,
        ),
        ("vgpu-certs", &["get", "secrets/other", "-n", NS], false),
    ];
    let wrong: Vec<String> = cases
        .iter()
        .filter(|(sa, args, want)| can(sa, args) != *want)
        .map(|(sa, args, want)| {
            format!(
                "{sa} {}: expected {}",
                args.join(" "),
                if *want { "yes" } else { "no" }
            )
        })
        .collect();
    assert!(wrong.is_empty(), "rbac: {wrong:#?}");
}

/// The journey against the installed components: a slice capped in its container, quota with a
/// reason, Pending with a reason, deletes that free.
fn journey(c: &Cluster) {
    let step = "installed journey";
    c.delete(&["namespace", TENANT]);
    c.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT, "labels": {
                "vgpu": "enabled", "pod-security.kubernetes.io/enforce": "restricted"}}},
            {"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu-quota", "namespace": TENANT},
                "spec": {"hard": {"requests.nvidia.com/gpumem": QUOTA_MIB.to_string()}}}]})
        .to_string(),
    );
    vgpu_tests::wait_for(WAIT, &format!("{step}: ServiceAccount default"), || {
        c.get(&["serviceaccount", "default", "-n", TENANT])
    });
    let pod = probe_pod(
        "capped",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}),
        &[
            "direct",
            "init",
            "ctx:0",
            "alloc:4095m",
            "alloc:1m",
            "alloc:2m",
            "info",
            "hold:3600000",
        ],
    );
    c.create_in(TENANT, pod)
        .unwrap_or_else(|e| panic!("{step}: {e}\n{}", describe_release(c)));
    let pod = c.wait_running(TENANT, "capped", step);
    let a = pod["metadata"]["annotations"][ASSIGNMENT]
        .as_str()
        .and_then(|a| PodAssignment::decode(a).ok())
        .unwrap_or_else(|| panic!("{step}: no assignment: {pod}"));
    assert_eq!(a.containers[0].devices[0].memory_mib, 4096, "{step}");
    let logs = c.logs_until(TENANT, "capped", step, |l| l.starts_with("info ="));
    for want in [
        format!("alloc {} = 2", 2u64 << 20),
        format!("info = 0 free 0 total {}", 4096u64 << 20),
    ] {
        assert!(
            logs.lines().any(|l| l == want),
            "{step}: no {want:?} in:\n{logs}"
        );
    }
    assert!(
        !logs.contains("vgpu:"),
        "{step}: the hook complained:\n{logs}"
    );
    // The key README recommends shows in `kubectl describe quota` (Kubernetes' own count).
    vgpu_tests::wait_for(WAIT, &format!("{step}: kubectl describe quota"), || {
        let d = c
            .kubectl(&["describe", "quota", "gpu-quota", "-n", TENANT])
            .ok()?;
        let want = ["requests.nvidia.com/gpumem", "4096", "8192"];
        d.lines()
            .any(|l| l.split_whitespace().eq(want.iter().copied()))
            .then_some(())
    });

    let err = c
        .create_in(TENANT, slice_pod("over", 8192, 0))
        .expect_err("installed journey: a pod over the quota was admitted");
    assert!(err.contains("quota"), "{step}: {err}");
    vgpu_tests::wait_for(WAIT, &format!("{step}: the quota Event"), || {
        c.events(TENANT)
            .into_iter()
            .find(|(o, r, _)| o == "over" && r == "VGPUQuotaExceeded")
    });

    let two = probe_pod(
        "two",
        json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1024"}),
        &["direct", "init"],
    );
    c.create_in(TENANT, two)
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: FailedScheduling from the extender"),
        || {
            let d = c.kubectl(&["describe", "pod", "two", "-n", TENANT]).ok()?;
            (d.contains("FailedScheduling") && d.contains("GPU")).then_some(())
        },
    );

    c.delete(&["pod", "capped", "two", "-n", TENANT]);
    vgpu_tests::wait_for(WAIT, &format!("{step}: the quota is free again"), || {
        c.create_in(TENANT, slice_pod("again", QUOTA_MIB, 0)).ok()
    });
    c.wait_running(TENANT, "again", step);
}

/// `helm uninstall`: no webhook configuration is left to block pod creation, the node's capacity
/// goes back to zero, and a vGPU pod is then created like any other.
fn uninstall(c: &Cluster) {
    let step = "uninstall";
    helm(
        c,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "2m"],
    )
    .unwrap_or_else(|e| panic!("{step}: {e}"));
    for kind in [
        "mutatingwebhookconfiguration/vgpu-mutate",
        "validatingwebhookconfiguration/vgpu-validate",
    ] {
        assert!(c.get(&[kind]).is_none(), "{step}: {kind} is left behind");
    }
    vgpu_tests::wait_for(
        Duration::from_secs(120),
        &format!("{step}: the node's GPU capacity back to 0"),
        || {
            let node = c.get(&["node", &c.node])?;
            let cap = &node["status"]["allocatable"]["nvidia.com/gpu"];
            (cap.is_null() || cap == "0").then_some(())
        },
    );
    c.delete(&["pod", "--all", "-n", TENANT]);
    c.create_in(TENANT, slice_pod("after", 1024, 0))
        .unwrap_or_else(|e| panic!("{step}: a pod was refused after uninstall: {e}"));
    c.delete(&["namespace", TENANT]);
    c.kubectl(&["label", "node", &c.node, "gpu-"]).ok();
}

/// Removes what an earlier run that failed half-way may have left: the release, and the webhook
/// configurations and RBAC the host-process phase applies by hand.
pub fn clean_slate(c: &Cluster) {
    let _ = helm(
        c,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "2m"],
    );
    c.delete(&[
        "mutatingwebhookconfiguration/vgpu-mutate",
        "validatingwebhookconfiguration/vgpu-validate",
    ]);
    c.delete(&["namespace", TENANT]);
}

/// The whole install phase.
pub fn run(c: &Cluster, work: &Path) {
    let started = Instant::now();
    images(c, work);
    let nvml = fake_nvml(work);
    install(c, &nvml);
    check_installed(c);
    check_rbac(c);
    journey(c);
    uninstall(c);
    report(&format!(
        "helm install, journey and uninstall in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
}
