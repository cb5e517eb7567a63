//! The Helm install, exactly as README says, on the real cluster: the images made here
//! (docker/local-images.sh), `helm install` with only the overrides this machine forces (image
//! registry and pull policy, the fake NVML for the device plugin, the node label), then the
//! journey against the installed components, least privilege checked with `kubectl auth can-i`,
//! and `helm uninstall` leaving nothing that could block a pod.

use crate::journey::{capped_pod, free_slots, probe_pod, slice_pod};
use crate::kube::{Cluster, CONTAINERD_SOCKET, WAIT};
use crate::parts::{GPU_MIB, GPU_MODEL, GPU_UUID};
use crate::{report, sh};
use base64::Engine as _;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use vgpu_core::annotations::ASSIGNMENT;
use vgpu_core::assignment::PodAssignment;

const RELEASE: &str = "vgpu";
const NS: &str = "vgpu-system";
/// A tenant namespace for the installed journey.
const TENANT: &str = "vgpu-installed";
/// A labelled namespace without a quota, for the admissions that run during the lifecycle steps.
const BURST: &str = "vgpu-installed-burst";
const QUOTA_MIB: u64 = 8192;
/// The namespace of the installed DRA step.
const DRA_NS: &str = "vgpu-installed-dra";
/// Where the fake NVML sits in the device plugin's container.
const FAKE_NVML_DIR: &str = "/opt/fake-nvml";
/// The device plugin's host directory (the chart's default).
const HOST_DIR: &str = "/usr/local/vgpu";
/// What `helm uninstall` leaves, and the commands docs/install.md gives to remove it.
const AFTER_UNINSTALL: &[&str] = &[
    "kubectl delete secret -n vgpu-system vgpu-webhook-tls --ignore-not-found",
    "kubectl delete job,serviceaccount,role,rolebinding -n vgpu-system -l app.kubernetes.io/instance=vgpu",
    "kubectl delete clusterrole,clusterrolebinding -l app.kubernetes.io/instance=vgpu",
    "kubectl delete configmap -n vgpu-system -l app.kubernetes.io/managed-by=vgpu-webhook",
    "kubectl annotate nodes --all vgpu.io/node-devices- vgpu.io/node-heartbeat- vgpu.io/room-changed-",
    "rm -rf /usr/local/vgpu",
];
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
        (
            "vgpu-webhook",
            &["patch", "replicasets.apps", "-n", TENANT],
            true,
        ),
        (
            "vgpu-webhook",
            &["update", "replicasets.apps", "-n", TENANT],
            false,
        ),
        (
            "vgpu-webhook",
            &["patch", "deployments.apps", "-n", TENANT],
            false,
        ),
        ("vgpu-webhook", &["get", "secrets", "-n", NS], false),
        ("vgpu-webhook", &["create", "pods", "-n", TENANT], false),
        (
            "vgpu-webhook",
            &["update", "resourcequotas", "-n", TENANT],
            false,
        ),
        // The same ServiceAccount runs kube-scheduler (system:kube-scheduler: bindings, and pod
        // deletes for preemption) and the extender (whose Binding carries the assignment: it
        // patches no pod).
        (
            "vgpu-scheduler",
            &["create", "pods", "--subresource=binding", "-n", TENANT],
            true,
        ),
        ("vgpu-scheduler", &["patch", "pods", "-n", TENANT], false),
        ("vgpu-scheduler", &["create", "pods", "-n", TENANT], false),
        ("vgpu-scheduler", &["get", "secrets", "-n", NS], false),
        ("vgpu-scheduler", &["patch", "nodes"], true),
        ("vgpu-device-plugin", &["patch", "nodes"], true),
        (
            "vgpu-device-plugin",
            &["patch", "nodes", "--subresource=status"],
            true,
        ),
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
    c.delete(&["namespace", TENANT, BURST]);
    c.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TENANT, "labels": {
                "vgpu": "enabled", "pod-security.kubernetes.io/enforce": "restricted"}}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": BURST, "labels": {
                "vgpu": "enabled", "pod-security.kubernetes.io/enforce": "restricted"}}},
            {"apiVersion": "v1", "kind": "ResourceQuota",
                "metadata": {"name": "gpu-quota", "namespace": TENANT},
                "spec": {"hard": {"requests.nvidia.com/gpumem": QUOTA_MIB.to_string()}}}]})
        .to_string(),
    );
    for ns in [TENANT, BURST] {
        vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: ServiceAccount default in {ns}"),
            || c.get(&["serviceaccount", "default", "-n", ns]),
        );
    }
    let pod = capped_pod("capped");
    c.create_in(TENANT, pod)
        .unwrap_or_else(|e| panic!("{step}: {e}\n{}", describe_release(c)));
    let pod = c.wait_running(TENANT, "capped", step);
    let a = pod["metadata"]["annotations"][ASSIGNMENT]
        .as_str()
        .and_then(|a| PodAssignment::decode(a).ok())
        .unwrap_or_else(|| panic!("{step}: no assignment: {pod}"));
    assert_eq!(a.containers[0].devices[0].memory_mib, 4096, "{step}");
    let logs = capped_at_4096(c, TENANT, "capped", step);
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

/// Server-side dry-run creations of a vGPU pod in `BURST`, one after another, until `stop`: every
/// one goes through both webhooks (dry runs write nothing), so each failure is a failed admission.
fn admissions_until(c: &Cluster, stop: &AtomicBool) -> (usize, Vec<String>) {
    let (mut ok, mut failed) = (0, Vec::new());
    let mut pod = slice_pod("dry-run", 256, 0);
    pod["metadata"]["namespace"] = json!(BURST);
    let text = pod.to_string();
    while !stop.load(Ordering::SeqCst) {
        match c.kubectl_stdin(&text, &["create", "--dry-run=server", "-f", "-"]) {
            Ok(_) => ok += 1,
            Err(e) => failed.push(e),
        }
    }
    (ok, failed)
}

/// Runs `during` while admissions go on; fails the step if any admission failed.
fn without_failed_admissions(c: &Cluster, step: &str, during: impl FnOnce()) {
    /// Stops the admissions when dropped: also when `during` panics, or the scope would wait for
    /// them forever.
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }
    let stop = AtomicBool::new(false);
    let (ok, failed) = std::thread::scope(|scope| {
        let burst = scope.spawn(|| admissions_until(c, &stop));
        {
            let _stop = Stop(&stop);
            during();
        }
        burst.join().expect("admissions thread")
    });
    report(&format!(
        "{step}: {ok} admissions went through, {} failed",
        failed.len()
    ));
    assert!(ok > 0, "{step}: no admission ran meanwhile");
    assert!(failed.is_empty(), "{step}: failed admissions: {failed:#?}");
}

/// The webhook pods' serving-certificate fingerprints (openssl against each pod IP).
fn served_certificates(c: &Cluster) -> Vec<String> {
    let pods = c.json(&[
        "get",
        "pods",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/component=webhook",
    ]);
    pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .filter_map(|p| p["status"]["podIP"].as_str().map(str::to_string))
        .map(|ip| {
            let script = format!(
                "timeout 10 openssl s_client -connect {ip}:8443 </dev/null 2>/dev/null | openssl x509 -noout -fingerprint -sha256"
            );
            sh(Command::new("sh").args(["-c", &script])).trim().to_string()
        })
        .collect()
}

/// The Secret's serving certificate's fingerprint.
fn secret_certificate(c: &Cluster) -> String {
    let secret = c.json(&["get", "secret", "vgpu-webhook-tls", "-n", NS]);
    let pem = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["tls.crt"].as_str().unwrap_or_default())
        .expect("base64 tls.crt");
    let mut child = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    use std::io::Write;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&pem)
        .expect("write pem");
    let out = child.wait_with_output().expect("openssl");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A Job from the chart's renewal CronJob, as `kubectl create job --from=cronjob/...` makes it.
fn renew_job(c: &Cluster, name: &str) -> serde_json::Value {
    let job = c
        .kubectl(&[
            "create",
            "job",
            name,
            "-n",
            NS,
            "--from=cronjob/vgpu-certs-renew",
            "--dry-run=client",
            "-o",
            "json",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&job).expect("job JSON")
}

/// What an operator does to a running install, each while admissions go on: an upgrade with a
/// changed value, a webhook replica killed, the certificate renewed by the CronJob's command.
fn lifecycle(c: &Cluster) {
    let keeper = c.pod(TENANT, "again").expect("the journey's last pod runs");
    without_failed_admissions(
        c,
        "helm upgrade --set devicePlugin.deviceSplitCount=4",
        || {
            upgrade(c, &["devicePlugin.deviceSplitCount=4"]);
            vgpu_tests::wait_for(WAIT, "upgrade: the node's GPU split in 4", || {
                let node = c.get(&["node", &c.node])?;
                (node["status"]["allocatable"]["nvidia.com/gpu"] == "4").then_some(())
            });
        },
    );
    let after = c.wait_running(TENANT, "again", "upgrade");
    assert_eq!(
        after["metadata"]["uid"], keeper["metadata"]["uid"],
        "upgrade: the running workload was replaced"
    );
    assert_eq!(
        after["status"]["containerStatuses"][0]["restartCount"], 0,
        "upgrade: the running workload restarted"
    );
    node_gains_capacity(c);

    without_failed_admissions(c, "a webhook replica killed", || {
        let pods = c.json(&[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            "app.kubernetes.io/component=webhook",
        ]);
        let victim = pods["items"][0]["metadata"]["name"]
            .as_str()
            .expect("a webhook pod")
            .to_string();
        c.kubectl(&[
            "delete",
            "pod",
            &victim,
            "-n",
            NS,
            "--grace-period=0",
            "--force",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        vgpu_tests::wait_for(WAIT, "a webhook replica killed: two ready again", || {
            let d = c.get(&["deployment", "vgpu-webhook", "-n", NS])?;
            (d["status"]["readyReplicas"] == 2).then_some(())
        });
    });

    // Renewal now: the CronJob's own Job, with --renew-before longer than the leaf's validity.
    let before = secret_certificate(c);
    without_failed_admissions(
        c,
        "the certificate renewed by the CronJob's command",
        || {
            let mut job = renew_job(c, "renew-now");
            for c in job["spec"]["template"]["spec"]["initContainers"]
                .as_array_mut()
                .into_iter()
                .flatten()
            {
                if c["args"][0] == "generate" {
                    c["args"]
                        .as_array_mut()
                        .expect("args")
                        .push(json!("--renew-before=400d"));
                }
            }
            c.create(&job).unwrap_or_else(|e| panic!("{e}"));
            vgpu_tests::wait_for(WAIT, "renewal: the Job completes", || {
                let j = c.get(&["job", "renew-now", "-n", NS])?;
                (j["status"]["succeeded"] == 1).then_some(())
            });
            let renewed = secret_certificate(c);
            assert_ne!(renewed, before, "renewal: the Secret kept its certificate");
            // The kubelet refreshes the Secret volume (up to its sync period), the webhook reloads.
            let started = Instant::now();
            vgpu_tests::wait_for(
                Duration::from_secs(150),
                "renewal: the webhooks serve the new certificate",
                || {
                    let served = served_certificates(c);
                    (!served.is_empty() && served.iter().all(|f| *f == renewed)).then_some(())
                },
            );
            report(&format!(
                "renewal: both webhook replicas serve the new certificate {:.0} s after the Job",
                started.elapsed().as_secs_f64()
            ));
        },
    );
    c.delete(&["job", "renew-now", "-n", NS]);

    // A certificates Job that fails keeps its pods, so its logs say why (with OnFailure the Job
    // controller deleted the pod at the backoff limit and `kubectl logs` had nothing).
    let step = "a failed certificates Job";
    let mut job = renew_job(c, "renew-broken");
    job["spec"]["backoffLimit"] = json!(0);
    job["spec"]["template"]["spec"]["initContainers"][0]["args"]
        .as_array_mut()
        .expect("args")
        .push(json!("--days=not-a-number"));
    c.create(&job).unwrap_or_else(|e| panic!("{e}"));
    vgpu_tests::wait_for(WAIT, &format!("{step}: the Job fails"), || {
        let j = c.get(&["job", "renew-broken", "-n", NS])?;
        (j["status"]["failed"] == 1).then_some(())
    });
    let logs = c
        .kubectl(&["logs", "-n", NS, "job/renew-broken", "-c", "generate"])
        .unwrap_or_else(|e| e);
    assert!(
        logs.contains("not-a-number"),
        "{step}: `kubectl logs job/renew-broken` does not say why: {logs}"
    );
    c.delete(&["job", "renew-broken", "-n", NS]);
}

/// Issue 38 (b): a node gains capacity. With the GPU split in 4, pods hold every slot and one
/// more waits (kube-scheduler: Insufficient nvidia.com/gpu); `helm upgrade` back to 10 restarts the
/// device plugin, which registers ten: how long the waiting pod takes once the Node shows them.
fn node_gains_capacity(c: &Cluster) {
    let step = "upgrade to 10 slots";
    let names: Vec<String> = (0..=free_slots(c)).map(|i| format!("slot-{i}")).collect();
    for name in &names {
        c.create_in(BURST, slice_pod(name, 256, 0))
            .unwrap_or_else(|e| panic!("{step}: {name}: {e}"));
    }
    let (waiting, holding) = names.split_last().expect("one pod at least");
    for name in holding {
        c.wait_running(BURST, name, step);
    }
    vgpu_tests::wait_for(WAIT, &format!("{step}: {waiting} Pending"), || {
        let d = c.kubectl(&["describe", "pod", waiting, "-n", BURST]).ok()?;
        d.contains("Insufficient nvidia.com/gpu").then_some(())
    });
    let started = Instant::now();
    let (shown, running) = std::thread::scope(|s| {
        let watch = s.spawn(|| {
            let deadline = started + Duration::from_secs(300);
            let (mut shown, mut running) = (None, None);
            while (shown.is_none() || running.is_none()) && Instant::now() < deadline {
                if shown.is_none() {
                    let node = c.get(&["node", &c.node]).unwrap_or_default();
                    if node["status"]["allocatable"]["nvidia.com/gpu"] == "10" {
                        shown = Some(Instant::now());
                    }
                }
                if running.is_none()
                    && c.pod(BURST, waiting).unwrap_or_default()["status"]["phase"] == "Running"
                {
                    running = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (shown, running)
        });
        upgrade(c, &["devicePlugin.deviceSplitCount=10"]);
        watch.join().expect("the watching thread")
    });
    let (Some(shown), Some(running)) = (shown, running) else {
        panic!("{step}: the Node showed 10 at {shown:?}, {waiting} Running at {running:?}");
    };
    // What lets kube-scheduler's queueing hint see the pod fit (inventory::capacity).
    let node = c.get(&["node", &c.node]).unwrap_or_default();
    assert_eq!(
        node["status"]["allocatable"]["nvidia.com/gpumem"],
        GPU_MIB.to_string(),
        "{step}: the Node's allocatable: {}",
        node["status"]["allocatable"]
    );
    let waited = running.saturating_duration_since(shown).as_secs_f64();
    report(&format!(
        "wait: the device plugin restarted with 10 slots -> {waiting} Running {waited:.1} s after the Node showed them ({:.1} s after helm upgrade began)",
        (running - started).as_secs_f64()
    ));
    assert!(waited < 5.0, "{step}: {waiting} waited {waited:.1} s");
    let mut all = vec!["pod"];
    all.extend(names.iter().map(String::as_str));
    all.extend(["-n", BURST]);
    c.delete(&all);
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
    let node = c.json(&["get", "node", &c.node]);
    report(&format!(
        "{step}: the device plugin withdrew the Node's nvidia.com/gpumem capacity: {}",
        node["status"]["capacity"]["nvidia.com/gpumem"].is_null()
    ));
    c.delete(&["pod", "--all", "-n", TENANT]);
    c.create_in(TENANT, slice_pod("after", 1024, 0))
        .unwrap_or_else(|e| panic!("{step}: a pod was refused after uninstall: {e}"));
    c.delete(&["namespace", TENANT, BURST]);

    // What Helm does not own, removed with the commands docs/install.md gives.
    let doc = std::fs::read_to_string(vgpu_tests::repo_root().join("docs/install.md"))
        .expect("docs/install.md");
    for command in AFTER_UNINSTALL {
        assert!(
            doc.lines().any(|l| l.trim() == *command),
            "{step}: docs/install.md does not give `{command}`"
        );
        let words: Vec<&str> = command.split_whitespace().collect();
        match words.as_slice() {
            ["kubectl", args @ ..] => {
                c.kubectl(args).unwrap_or_else(|e| panic!("{step}: {e}"));
            }
            // This machine is the GPU node.
            _ => {
                sh(Command::new("sh").args(["-c", command]));
            }
        }
    }
    let left = |args: &[&str]| -> Vec<String> {
        c.json(args)["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| {
                Some(format!(
                    "{}/{}",
                    o["kind"].as_str()?,
                    o["metadata"]["name"].as_str()?
                ))
            })
            .collect()
    };
    let mut leftovers = left(&[
        "get",
        "all,sa,role,rolebinding,secret,configmap",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/instance=vgpu",
    ]);
    leftovers.extend(left(&[
        "get",
        "configmap",
        "-n",
        NS,
        "-l",
        "app.kubernetes.io/managed-by=vgpu-webhook",
    ]));
    leftovers.extend(left(&[
        "get",
        "clusterrole,clusterrolebinding",
        "-l",
        "app.kubernetes.io/instance=vgpu",
    ]));
    if c.get(&["secret", "vgpu-webhook-tls", "-n", NS]).is_some() {
        leftovers.push("Secret/vgpu-webhook-tls".into());
    }
    let node = c.json(&["get", "node", &c.node]);
    leftovers.extend(
        node["metadata"]["annotations"]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| k.starts_with("vgpu.io/"))
            .map(|(k, _)| format!("node annotation {k}")),
    );
    if Path::new(HOST_DIR).exists() {
        leftovers.push(HOST_DIR.into());
    }
    assert!(leftovers.is_empty(), "{step}: left behind: {leftovers:?}");
    c.kubectl(&["label", "node", &c.node, "gpu-"]).ok();
}

/// The logs of `capped_pod` `ns/name` once it reported: 2 MiB over its 4096 MiB refused, and
/// `cuMemGetInfo` showing the slice.
fn capped_at_4096(c: &Cluster, ns: &str, name: &str, step: &str) -> String {
    let logs = c.logs_until(ns, name, step, |l| l.starts_with("info ="));
    for want in [
        format!("alloc {} = 2", 2u64 << 20),
        format!("info = 0 free 0 total {}", 4096u64 << 20),
    ] {
        assert!(
            logs.lines().any(|l| l == want),
            "{step}: no {want:?} in:\n{logs}"
        );
    }
    logs
}

/// `helm upgrade --reuse-values` with `sets`, waiting until the release is ready.
fn upgrade(c: &Cluster, sets: &[&str]) {
    let chart = vgpu_tests::repo_root().join("helm/vgpu");
    let mut args = vec![
        "upgrade",
        RELEASE,
        chart.to_str().expect("path"),
        "-n",
        NS,
        "--reuse-values",
        "--wait",
        "--timeout",
        "4m",
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(c, &args)
        .unwrap_or_else(|e| panic!("helm upgrade {sets:?}: {e}\n{}", describe_release(c)));
}

/// DRA mode through the chart: `helm upgrade --set dra.enabled=true`, the node labelled
/// `vgpu.io/mode=dra`; the device plugin's pod leaves the node and the DRA plugin's takes over,
/// publishes the GPU, and a claim's pod runs capped; the installed webhook refuses a claim larger
/// than the GPU. Then the node goes back to device-plugin mode.
fn dra_mode(c: &Cluster) {
    let step = "installed DRA mode";
    let started = Instant::now();
    // The fake GPU has no NVIDIA CDI spec.
    upgrade(c, &["dra.enabled=true", "dra.gpuCdiKind="]);
    c.kubectl(&["label", "--overwrite", "node", &c.node, "vgpu.io/mode=dra"])
        .unwrap_or_else(|e| panic!("{e}"));
    let agents = |component: &str| -> Vec<String> {
        c.json(&[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            &format!("app.kubernetes.io/component={component}"),
        ])["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| p["metadata"]["name"].as_str().map(String::from))
            .collect()
    };
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: the device plugin's pod leaves the DRA node"),
        || agents("device-plugin").is_empty().then_some(()),
    );
    let slice_name = format!("{}-gpu.vgpu.io", c.node);
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: the DRA plugin's pod publishes {slice_name}"),
        || {
            let s = c.get(&["resourceslice", &slice_name])?;
            (s["spec"]["devices"][0]["attributes"]["uuid"]["string"] == GPU_UUID).then_some(())
        },
    );
    assert_eq!(
        agents("dra-plugin").len(),
        1,
        "{step}: {:?}",
        agents("dra-plugin")
    );
    let ns = DRA_NS;
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
        .to_string(),
    );
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: ServiceAccount default in {ns}"),
        || c.get(&["serviceaccount", "default", "-n", ns]),
    );
    let template = |name: &str, memory: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.vgpu.io",
                "capacity": {"requests": {"memory": memory, "cores": "30"}}}}]}}}})
    };
    let err = c
        .create(&template("huge", "64Gi"))
        .expect_err("a 64 GiB claim template was admitted");
    assert!(
        err.contains("capacity.requests.memory: 64Gi is more than the largest GPU"),
        "{step}: {err}"
    );
    c.create(&template("slice-4g", "4Gi"))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    let mut pod = capped_pod("dra-capped");
    let spec = &mut pod["spec"];
    spec["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": "slice-4g"}]);
    spec["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    c.create_in(ns, pod)
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    c.wait_running(ns, "dra-capped", step);
    capped_at_4096(c, ns, "dra-capped", step);
    c.delete(&["namespace", ns]);
    c.kubectl(&["label", "node", &c.node, "vgpu.io/mode-"])
        .unwrap_or_else(|e| panic!("{e}"));
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: the DRA plugin's pod leaves, the device plugin's is back"),
        || (agents("dra-plugin").is_empty() && !agents("device-plugin").is_empty()).then_some(()),
    );
    report(&format!(
        "helm upgrade to DRA mode, a claim's pod capped, and back: {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

/// Removes what an earlier run that failed half-way may have left: the release, and the webhook
/// configurations and RBAC the host-process phase applies by hand.
pub fn clean_slate(c: &Cluster) {
    // Pods with claims of gpu.vgpu.io first, while a DRA plugin may still unprepare them: once
    // the driver is gone, such a pod cannot finish terminating (the kubelet must unprepare its
    // claims), so one left without its plugin is force-deleted.
    for ns in [
        crate::dra::NS_DRA,
        crate::dra::NS_MIXED,
        crate::two_nodes::NS_DP,
        crate::two_nodes::NS_DRA,
        DRA_NS,
    ] {
        let _ = c.kubectl(&[
            "delete",
            "pods",
            "--all",
            "-n",
            ns,
            "--wait=true",
            "--timeout=20s",
        ]);
        let _ = c.kubectl(&[
            "delete",
            "pods",
            "--all",
            "-n",
            ns,
            "--force",
            "--grace-period=0",
        ]);
    }
    let _ = helm(
        c,
        &["uninstall", RELEASE, "-n", NS, "--wait", "--timeout", "2m"],
    );
    c.delete(&[
        "mutatingwebhookconfiguration/vgpu-mutate",
        "validatingwebhookconfiguration/vgpu-validate",
    ]);
    c.delete(&[
        "namespace",
        TENANT,
        BURST,
        crate::dra::NS_DRA,
        crate::dra::NS_MIXED,
        crate::two_nodes::NS_DP,
        crate::two_nodes::NS_DRA,
        "vgpu-installed-dra",
    ]);
    // Quota ledgers of namespaces just deleted: a reservation for an object deleted before this
    // run's webhook saw it would count in the namespace's next life until its TTL.
    for ns in [
        crate::dra::NS_MIXED,
        crate::two_nodes::NS_DP,
        crate::two_nodes::NS_DRA,
    ] {
        let _ = c.kubectl(&[
            "delete",
            "configmap",
            "--ignore-not-found",
            "-n",
            vgpu_tests::helm::NAMESPACE,
            &format!("vgpu-quota-{ns}"),
        ]);
    }
    c.kubectl(&["label", "node", &c.node, "vgpu.io/mode-"]).ok();
    c.delete(&["deviceclass", "gpu.vgpu.io"]);
    c.delete(&[
        "resourceslice",
        "--field-selector",
        "spec.driver=gpu.vgpu.io",
    ]);
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
    lifecycle(c);
    dra_mode(c);
    uninstall(c);
    report(&format!(
        "helm install, journey and uninstall in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
}
