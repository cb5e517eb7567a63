//! The user's journey through a real cluster: mutate, quota, place, allocate, run capped, Pending
//! reasons, deletes that free, pods vgpu must leave alone, and HAMi's GPU cordon, mutex policy,
//! task priority and core-limit policy.

use crate::image::PROBE_IMAGE;
use crate::kube::{Cluster, WAIT};
use crate::parts::{Parts, GPU_UUID, SCHEDULER_NAME};
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use vgpu_core::annotations::{ASSIGNMENT, MANAGED_LABEL};
use vgpu_core::assignment::PodAssignment;

/// Labelled for vgpu, a gpumem quota, Pod Security `restricted` enforced.
pub const NS: &str = "vgpu-tier";
/// Labelled for vgpu, no quota.
pub const NS_FREE: &str = "vgpu-tier-free";
/// Not labelled: vgpu leaves its pods alone.
pub const NS_PLAIN: &str = "vgpu-tier-plain";
/// The quota on `NS`, MiB counted as GPUs x MiB.
pub const QUOTA_MIB: u64 = 10240;
/// One MiB.
const MIB: u64 = 1 << 20;

/// The journey's state: the parts and the cluster.
pub struct Journey<'p, 'c> {
    /// The running parts.
    pub parts: &'p mut Parts<'c>,
    /// Whether the Python image (`crate::image::PYTHON_IMAGE`) was built and imported.
    pub python_image: bool,
}

/// A pod that meets Pod Security `restricted` (non-root, no privilege escalation, all capabilities
/// dropped, RuntimeDefault seccomp) running the probe with `args`, asking for `limits`.
pub fn probe_pod(name: &str, limits: Value, args: &[&str]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": PROBE_IMAGE, "imagePullPolicy": "Never",
                "args": args,
                // The fake driver's card: the node's one 24 GiB GPU.
                "env": [{"name": "FAKE_CUDA_DEVICE_MEMORY", "value": "24g"}],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": limits}}]}})
}

/// The probe's steps against a 4096 MiB slice: it allocates 4095 MiB, 1 MiB and then 2 MiB more
/// (refused), reports `cuMemGetInfo` and holds.
pub const CAPPED_ARGS: [&str; 8] = [
    "direct",
    "init",
    "ctx:0",
    "alloc:4095m",
    "alloc:1m",
    "alloc:2m",
    "info",
    "hold:3600000",
];

/// The journey's first pod: one vGPU of 4096 MiB and 30 % of the cores, running [`CAPPED_ARGS`].
pub fn capped_pod(name: &str) -> Value {
    probe_pod(
        name,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "30"}),
        &CAPPED_ARGS,
    )
}

/// `probe_pod` asking for one vGPU of `mib` MiB and `cores` percent, holding for an hour after
/// the memory steps.
pub fn slice_pod(name: &str, mib: u64, cores: u32) -> Value {
    probe_pod(
        name,
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": mib.to_string(),
            "nvidia.com/gpucores": cores.to_string()}),
        &["direct", "init", "ctx:0", "info", "hold:3600000"],
    )
}

/// How many of the node's `nvidia.com/gpu` devices no running or pending pod on it holds.
pub fn free_slots(c: &Cluster) -> usize {
    let node = c.json(&["get", "node", &c.node]);
    let allocatable = node["status"]["allocatable"]["nvidia.com/gpu"]
        .as_str()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let pods = c.json(&[
        "get",
        "pods",
        "-A",
        "--field-selector",
        &format!("spec.nodeName={}", c.node),
    ]);
    let held: usize = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
        .flat_map(|p| {
            p["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| {
            c["resources"]["limits"]["nvidia.com/gpu"]
                .as_str()?
                .parse::<usize>()
                .ok()
        })
        .sum();
    allocatable.saturating_sub(held)
}

/// A pod without any GPU: busybox sleeping.
pub fn plain_pod(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "main", "image": "local/busybox:1", "imagePullPolicy": "Never",
                "command": ["sleep", "3600"],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}}}]}})
}

impl<'p, 'c> Journey<'p, 'c> {
    /// A journey over started parts, with fresh namespaces.
    pub fn new(parts: &'p mut Parts<'c>) -> Journey<'p, 'c> {
        let j = Journey {
            parts,
            python_image: false,
        };
        j.cleanup();
        let c = j.cluster();
        c.apply(
            &json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
                    "vgpu": "enabled", "pod-security.kubernetes.io/enforce": "restricted"}}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_FREE, "labels": {
                    "vgpu": "enabled"}}},
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_PLAIN}},
                {"apiVersion": "v1", "kind": "ResourceQuota",
                    "metadata": {"name": "gpu-quota", "namespace": NS},
                    // HAMi's spelling, which Kubernetes does not count: vgpu alone enforces it
                    // here, so a vgpu quota bug cannot hide behind Kubernetes' own quota. (The
                    // installed journey uses the `requests.` key README recommends.)
                    "spec": {"hard": {"limits.nvidia.com/gpumem": QUOTA_MIB.to_string()}}}]})
            .to_string(),
        );
        // Namespaces get their default ServiceAccount from the controller-manager; pods wait for it.
        for ns in [NS, NS_FREE, NS_PLAIN] {
            vgpu_tests::wait_for(
                WAIT,
                &format!("setup: ServiceAccount default in {ns}"),
                || c.get(&["serviceaccount", "default", "-n", ns]),
            );
        }
        j
    }

    /// The cluster.
    pub fn cluster(&self) -> &'c Cluster {
        self.parts.cluster
    }

    /// Deletes the journey's namespaces (and with them every pod it made).
    pub fn cleanup(&self) {
        self.cluster().delete(&["namespace", NS, NS_FREE, NS_PLAIN]);
    }

    /// Every step in order.
    pub fn run(&mut self) {
        let a = self.step1_a_slice_runs_capped();
        self.step2_quota_refuses_with_a_reason();
        self.step3_too_large_stays_pending_with_a_reason();
        self.step4_deletes_free_the_gpu_and_the_quota(&a);
        self.step5_other_pods_are_untouched();
        self.step6_hami_cordon_and_mutex();
        self.step7_hami_priority_and_core_policy();
    }

    /// Step 1: a vGPU pod in a labelled namespace is mutated, placed through the extender,
    /// allocated by the kubelet through the plugin, and runs capped at its slice; the plugin's
    /// metrics show its usage. Also times create -> Running against a plain pod.
    fn step1_a_slice_runs_capped(&mut self) -> String {
        let step = "step 1 (a slice runs capped)";
        let c = self.cluster();
        let plain_started = Instant::now();
        self.cluster()
            .create_in(NS, plain_pod("plain"))
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        self.cluster().wait_running(NS, "plain", step);
        let plain = plain_started.elapsed();

        let started = Instant::now();
        let pod = capped_pod("probe-a");
        self.cluster()
            .create_in(NS, pod)
            .unwrap_or_else(|e| panic!("{step}: the API server refused probe-a: {e}"));
        let pod = self.cluster().wait_running(NS, "probe-a", step);
        let vgpu = started.elapsed();
        crate::report(&format!(
            "create -> Running: vGPU pod {:.2} s, plain pod {:.2} s ({:.2}x)",
            vgpu.as_secs_f64(),
            plain.as_secs_f64(),
            vgpu.as_secs_f64() / plain.as_secs_f64()
        ));

        assert_eq!(
            pod["spec"]["schedulerName"], SCHEDULER_NAME,
            "{step}: webhook /mutate did not set the scheduler name"
        );
        assert_eq!(
            pod["metadata"]["labels"][MANAGED_LABEL], "true",
            "{step}: webhook /mutate did not label the pod"
        );
        assert_eq!(
            pod["spec"]["nodeName"], c.node,
            "{step}: kube-scheduler + extender placed it elsewhere"
        );
        let assignment = pod["metadata"]["annotations"][ASSIGNMENT]
            .as_str()
            .and_then(|a| PodAssignment::decode(a).ok())
            .unwrap_or_else(|| panic!("{step}: the extender's bind wrote no assignment: {pod}"));
        // The limits the container gets, in its spec as the webhook wrote them (HAMi's names),
        // the same as the device plugin's: the hook below says nothing.
        let env: Vec<(&str, &str)> = pod["spec"]["containers"][0]["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
            .filter(|(n, _)| n.starts_with("CUDA_DEVICE_"))
            .collect();
        assert_eq!(
            env,
            [
                ("CUDA_DEVICE_MEMORY_LIMIT", "4096m"),
                ("CUDA_DEVICE_SM_LIMIT", "30")
            ],
            "{step}: webhook /mutate did not write the limits into the spec"
        );
        let slice = &assignment.containers[0].devices[0];
        assert_eq!(
            (slice.uuid.as_str(), slice.memory_mib, slice.cores),
            (GPU_UUID, 4096, 30),
            "{step}: the extender's assignment"
        );
        let logs = self
            .cluster()
            .logs_until(NS, "probe-a", step, |l| l.starts_with("info ="));
        for want in [
            format!("alloc {} = 0", 4095 * MIB),
            format!("alloc {} = 0", MIB),
            // CUDA_ERROR_OUT_OF_MEMORY
            format!("alloc {} = 2", 2 * MIB),
            format!("info = 0 free 0 total {}", 4096 * MIB),
        ] {
            assert!(
                logs.lines().any(|l| l == want),
                "{step}: the hook in the container: no line {want:?} in its logs:\n{logs}"
            );
        }
        assert!(
            !logs.contains("vgpu:"),
            "{step}: the hook printed a complaint in a container vgpu itself set up:\n{logs}"
        );
        let plugin = self.parts.plugin.as_ref().expect("plugin");
        crate::fixtures::check_kubelet_calls(&plugin.proc.output(), &format!("{NS}/probe-a"));
        let uid = pod["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let metrics = self
            .parts
            .plugin
            .as_ref()
            .map(|p| p.metrics)
            .expect("plugin");
        let line = vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: the device plugin's /metrics"),
            || {
                let (_, body) = http_get(metrics, "/metrics")?;
                body.lines()
                    .find(|l| {
                        l.starts_with("vgpu_container_memory_used_bytes{")
                            && l.contains("pod=\"probe-a\"")
                            && l.ends_with(&format!(" {}", 4096 * MIB))
                    })
                    .map(str::to_string)
            },
        );
        assert!(
            line.contains(&format!("namespace=\"{NS}\"")),
            "{step}: {line}"
        );
        // What vgpu enforces is where an operator looks: the webhook's gauge per quota key.
        let webhook = self.parts.webhook.as_ref().expect("webhook");
        let metrics = self.parts.https_get(webhook.addr, "/metrics");
        let want = format!(
            "vgpu_webhook_quota_used{{namespace=\"{NS}\",quota=\"gpu-quota\",resource=\"limits.nvidia.com/gpumem\"}} 4096"
        );
        assert!(
            metrics.lines().any(|l| l == want),
            "{step}: the webhook's /metrics lacks {want}:\n{metrics}"
        );
        // The webhook serves plain certificate files here (not a Secret volume): read once, they
        // must not set its watcher reloading in a loop.
        let webhook = self.parts.webhook.as_ref().expect("webhook");
        std::fs::read(self.parts.tmp.path().join("tls.crt")).expect("read tls.crt");
        let share = vgpu_tests::process::cpu_share(webhook.proc.pid(), Duration::from_secs(2));
        assert!(
            share < 0.1,
            "{step}: the idle webhook uses {:.0} % of a core",
            share * 100.0
        );
        uid
    }

    /// Step 2: over the quota, a pod is refused at creation and the reason is in `kubectl get
    /// events`, and so are a privileged vGPU pod and one placed by `spec.nodeName`; a Deployment
    /// stops at the quota with the reason on its ReplicaSet.
    fn step2_quota_refuses_with_a_reason(&mut self) {
        let step = "step 2 (quota)";
        let c = self.cluster();
        let err = self
            .cluster()
            .create_in(NS, slice_pod("over", 8192, 0))
            .expect_err("step 2: a pod over the quota was admitted");
        assert!(
            err.contains("vgpu quota exceeded") && err.contains("8192"),
            "{step}: webhook /validate's refusal does not name the quota: {err}"
        );
        vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: an Event about the refused pod over"),
            || {
                c.events(NS)
                    .into_iter()
                    .find(|(o, r, m)| o == "over" && r == "VGPUQuotaExceeded" && m.contains("8192"))
            },
        );
        // A policy refusal of a pod without an owner is an Event too.
        let mut privileged = slice_pod("privileged", 1024, 0);
        privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
        let err = self
            .cluster()
            .create_in(NS_FREE, privileged)
            .expect_err("step 2: a privileged vGPU pod was admitted");
        assert!(err.contains("denyPrivileged"), "{step}: {err}");
        // A vGPU pod placed by name would skip vgpu-scheduler: refused, naming the field.
        let mut by_name = slice_pod("by-name", 1024, 0);
        by_name["spec"]["nodeName"] = json!("vm");
        let err = self
            .cluster()
            .create_in(NS_FREE, by_name)
            .expect_err("step 2: a vGPU pod with spec.nodeName was admitted");
        assert!(
            err.contains("spec.nodeName is set") && err.contains("rule denyPresetNodeName"),
            "{step}: {err}"
        );
        vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: an Event about the refused pod privileged"),
            || {
                c.events(NS_FREE)
                    .into_iter()
                    .find(|(o, r, _)| o == "privileged" && r == "VGPUPolicyViolation")
            },
        );

        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "replicas", "namespace": NS},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "replicas"}},
                "template": {"metadata": {"labels": {"app": "replicas"}}}}});
        let mut pod = slice_pod("x", 4096, 0);
        pod["spec"]["restartPolicy"] = json!("Always");
        d["spec"]["template"] =
            json!({"metadata": {"labels": {"app": "replicas"}}, "spec": pod["spec"]});
        c.create(&d).unwrap_or_else(|e| panic!("{step}: {e}"));
        // 4096 (probe-a) + 4096 fits under 10240; a third 4096 does not.
        let rs = vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: the ReplicaSet's quota event"),
            || {
                let rs = c.json(&["get", "replicasets", "-n", NS, "-l", "app=replicas"])["items"]
                    [0]["metadata"]["name"]
                    .as_str()?
                    .to_string();
                c.events(NS)
                    .into_iter()
                    .any(|(o, r, m)| {
                        o == rs && r == "FailedCreate" && m.contains("vgpu quota exceeded")
                    })
                    .then_some(rs)
            },
        );
        let running = vgpu_tests::wait_for(WAIT, &format!("{step}: one replica Running"), || {
            let d = c.get(&["deployment", "replicas", "-n", NS])?;
            (d["status"]["readyReplicas"] == 1).then_some(d)
        });
        assert_eq!(
            running["status"]["replicas"], 1,
            "{step}: ReplicaSet {rs} made more pods than the quota allows"
        );
        self.quota_raised_lets_the_replicas_in(&rs);
    }

    /// Issue 38 (d): the quota raised while the ReplicaSet backs off. Its controller retries a
    /// refused creation with a per-item backoff doubling from 5 ms (a 13th failure comes about 20
    /// s after the first, and the next retry 20 s later) and does not watch ResourceQuotas; the
    /// webhook nudges the owners it refused when a quota of their namespace changes.
    fn quota_raised_lets_the_replicas_in(&self, rs: &str) {
        let step = "step 2d (quota raised)";
        let c = self.cluster();
        let failures = || -> u64 {
            c.json(&["get", "events", "-n", NS])["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["involvedObject"]["name"] == rs && e["reason"] == "FailedCreate")
                .map(|e| e["count"].as_u64().unwrap_or(1))
                .sum()
        };
        vgpu_tests::wait_for(
            Duration::from_secs(90),
            &format!("{step}: ReplicaSet {rs} refused 13 times"),
            || (failures() >= 13).then_some(()),
        );
        let set_quota = |mib: u64| {
            let hard = json!({"spec": {"hard": {"limits.nvidia.com/gpumem": mib.to_string()}}});
            c.kubectl(&[
                "patch",
                "resourcequota",
                "gpu-quota",
                "-n",
                NS,
                "--type=merge",
                "-p",
                &hard.to_string(),
            ])
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        };
        // probe-a and three replicas of 4096 MiB.
        let raised = Instant::now();
        set_quota(4 * 4096);
        let mut seen: Vec<f64> = Vec::new();
        vgpu_tests::wait_for(WAIT, &format!("{step}: three replicas Running"), || {
            let d = c.get(&["deployment", "replicas", "-n", NS])?;
            let ready = d["status"]["readyReplicas"].as_u64().unwrap_or(0) as usize;
            while seen.len() + 1 < ready {
                seen.push(raised.elapsed().as_secs_f64());
            }
            (ready == 3).then_some(())
        });
        crate::report(&format!(
            "wait: quota raised (ReplicaSet refused {} times) -> the two waiting replicas Running in {:.1} s, {:.1} s",
            failures(),
            seen[0],
            seen[1]
        ));
        assert!(
            seen[1] < 5.0,
            "{step}: the replicas waited {:.1} s for the raised quota",
            seen[1]
        );
        // Back to one replica under the journey's quota for step 4.
        c.kubectl(&["scale", "deployment", "replicas", "-n", NS, "--replicas=1"])
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        set_quota(QUOTA_MIB);
        vgpu_tests::wait_for(WAIT, &format!("{step}: back to one replica"), || {
            let pods = c.json(&["get", "pods", "-n", NS, "-l", "app=replicas"]);
            (pods["items"].as_array().map(Vec::len) == Some(1)).then_some(())
        });
    }

    /// Step 3: a pod no GPU can hold stays Pending and `kubectl describe pod` says why: the
    /// extender's message in the FailedScheduling event.
    fn step3_too_large_stays_pending_with_a_reason(&mut self) {
        let step = "step 3 (Pending with a reason)";
        let c = self.cluster();
        let pod = probe_pod(
            "two-gpus",
            json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "1024"}),
            &["direct", "init"],
        );
        self.cluster()
            .create_in(NS_FREE, pod)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let describe = vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: FailedScheduling from the extender"),
            || {
                let d = c
                    .kubectl(&["describe", "pod", "two-gpus", "-n", NS_FREE])
                    .ok()?;
                (d.contains("FailedScheduling") && d.contains("GPU")).then_some(d)
            },
        );
        let pod = c.pod(NS_FREE, "two-gpus").unwrap_or_default();
        assert_eq!(pod["status"]["phase"], "Pending", "{step}: {describe}");
        assert!(
            pod["spec"]["nodeName"].is_null(),
            "{step}: placed without room: {pod}"
        );
    }

    /// Step 4: deleting pods frees the GPU (scheduler /metrics) and the quota at once; the freed
    /// slice is reused.
    fn step4_deletes_free_the_gpu_and_the_quota(&mut self, probe_a_uid: &str) {
        let step = "step 4 (deletes free)";
        let c = self.cluster();
        let metrics = self
            .parts
            .scheduler
            .as_ref()
            .map(|s| s.metrics)
            .expect("scheduler");
        let allocated = |body: &str| -> Option<u64> {
            body.lines()
                .find(|l| {
                    l.starts_with("vgpu_device_memory_allocated_bytes{") && l.contains(GPU_UUID)
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
        };
        // Step 2d's scaled-down replicas leave as the scheduler's pod watch delivers them.
        vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: the scheduler counts probe-a and one replica"),
            || (allocated(&http_get(metrics, "/metrics")?.1)? == 8192 * MIB).then_some(()),
        );
        // The `gap-aware` host terms: every bound pod that has not finished, vGPU or not,
        // counted from the real API server's pod watch.
        let host_pods = |body: &str| -> Option<u64> {
            body.lines()
                .find_map(|l| l.strip_prefix("vgpu_scheduler_host_pods "))
                .and_then(|v| v.trim().parse().ok())
        };
        let bound = || -> u64 {
            let pods = c.json(&["get", "pods", "-A"]);
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            items
                .iter()
                .filter(|p| {
                    p["spec"]["nodeName"]
                        .as_str()
                        .is_some_and(|n| !n.is_empty())
                })
                .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
                .count() as u64
        };
        let counted = vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: the scheduler counts every bound pod's CPU and memory"),
            || {
                let n = host_pods(&http_get(metrics, "/metrics")?.1)?;
                (n == bound() && n >= 2).then_some(n)
            },
        );
        crate::report(&format!(
            "the scheduler counts {counted} bound pods' CPU and memory"
        ));
        c.delete(&["deployment", "replicas", "-n", NS]);
        c.delete(&["pod", "probe-a", "-n", NS]);
        let deleted = Instant::now();
        vgpu_tests::wait_for(
            WAIT,
            &format!("{step}: the scheduler frees the GPU"),
            || (allocated(&http_get(metrics, "/metrics")?.1)? == 0).then_some(()),
        );
        // The quota is back as soon as the pods are gone: the full 10240 MiB in two pods.
        let mut admitted = 0;
        vgpu_tests::wait_for(WAIT, &format!("{step}: the quota is free again"), || {
            while admitted < 2 {
                match self
                    .cluster()
                    .create_in(NS, slice_pod(&format!("again-{admitted}"), 5120, 0))
                {
                    Ok(_) => admitted += 1,
                    Err(_) => return None,
                }
            }
            Some(())
        });
        crate::report(&format!(
            "quota back {:.2} s after the deletes returned",
            deleted.elapsed().as_secs_f64()
        ));
        let pod = self.cluster().wait_running(NS, "again-0", step);
        assert_ne!(pod["metadata"]["uid"], probe_a_uid);
        let a = PodAssignment::decode(
            pod["metadata"]["annotations"][ASSIGNMENT]
                .as_str()
                .unwrap_or(""),
        )
        .unwrap_or_else(|e| panic!("{step}: {e}"));
        assert_eq!(
            a.containers[0].devices[0].uuid, GPU_UUID,
            "{step}: the freed slice is reused"
        );
        self.cluster().wait_running(NS, "again-1", step);
        c.delete(&["pod", "again-0", "again-1", "-n", NS]);
    }

    /// Step 5: a GPU pod in an unlabelled namespace and a plain pod in a labelled one are not
    /// touched by the webhook.
    fn step5_other_pods_are_untouched(&mut self) {
        let step = "step 5 (untouched)";
        let c = self.cluster();
        let plain = c.pod(NS, "plain").unwrap_or_default();
        assert_eq!(
            plain["spec"]["schedulerName"], "default-scheduler",
            "{step}: {plain}"
        );
        assert!(
            plain["metadata"]["labels"][MANAGED_LABEL].is_null(),
            "{step}: {plain}"
        );
        // A user's 2000 MiB reaches the webhook as "2k" (canonical form): no warning for it, and
        // the spec shows the 2000 MiB limit.
        let mut round = slice_pod("round", 2000, 0);
        round["metadata"]["namespace"] = json!(NS_FREE);
        let warnings = c
            .create_warnings(&round)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        assert!(
            !warnings.contains("Warning"),
            "{step}: kubectl create of gpumem 2000 warned: {warnings}"
        );
        let pod = c.pod(NS_FREE, "round").unwrap_or_default();
        assert_eq!(
            pod["spec"]["containers"][0]["env"][1],
            json!({"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "2000m"}),
            "{step}: gpumem 2000 (\"2k\" at the webhook) in the spec: {pod}"
        );
        c.delete(&["pod", "round", "-n", NS_FREE]);
        self.tampered_environment_is_named_and_ignored(step);
        self.real_cuda_user_space_runs_capped(step);
        let gpu = slice_pod("elsewhere", 1024, 0);
        self.cluster()
            .create_in(NS_PLAIN, gpu)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let pod = c.pod(NS_PLAIN, "elsewhere").unwrap_or_default();
        assert_eq!(
            pod["spec"]["schedulerName"], "default-scheduler",
            "{step}: {pod}"
        );
        assert!(
            pod["metadata"]["labels"][MANAGED_LABEL].is_null(),
            "{step}: {pod}"
        );
        assert!(
            pod["metadata"]["annotations"][vgpu_core::annotations::INJECTED].is_null(),
            "{step}: the webhook marked it: {pod}"
        );
        assert_eq!(
            pod["spec"]["containers"][0]["resources"]["limits"],
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024", "nvidia.com/gpucores": "0"}),
            "{step}: its resources changed"
        );

        c.delete(&["pod", "elsewhere", "-n", NS_PLAIN]);
    }

    /// A tenant's ConfigMap behind `envFrom` (which no admission webhook sees) raises the memory
    /// limit after admission: the container stays capped at its slice, and the hook says in one
    /// line what it ignored.
    fn tampered_environment_is_named_and_ignored(&self, step: &str) {
        let c = self.cluster();
        c.apply(
            &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "lift", "namespace": NS_FREE},
                "data": {"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"}})
            .to_string(),
        );
        let mut pod = probe_pod(
            "tampered",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}),
            &["direct", "init", "ctx:0", "alloc:2047m", "alloc:2m", "info"],
        );
        pod["spec"]["containers"][0]["envFrom"] = json!([{"configMapRef": {"name": "lift"}}]);
        c.create_in(NS_FREE, pod)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let logs = c.logs_until(NS_FREE, "tampered", step, |l| l.starts_with("info ="));
        for want in [
            format!("alloc {} = 0", 2047 * MIB),
            format!("alloc {} = 2", 2 * MIB),
            format!("info = 0 free {} total {}", MIB, 2048 * MIB),
        ] {
            assert!(
                logs.lines().any(|l| l == want),
                "{step}: the hook under an envFrom of 80g: no line {want:?}:\n{logs}"
            );
        }
        let complaints: Vec<&str> = logs.lines().filter(|l| l.starts_with("vgpu:")).collect();
        assert_eq!(
            complaints,
            ["vgpu: ignoring CUDA_DEVICE_MEMORY_LIMIT_0=80g from the environment: the device plugin's limits file decides"],
            "{step}: the hook's word on the changed environment:\n{logs}"
        );
        c.delete(&["pod", "tampered", "-n", NS_FREE]);
    }

    /// NVIDIA's `cuda-bindings` (driver and runtime modules) and `nvidia-ml-py` from PyPI, in a
    /// container the device plugin set up: every allocation path they take
    /// (`tests/python/driver_checks.py`: linear, stream-ordered, VMM on the device and in host
    /// memory, managed; `runtime_checks.py`: the CUDA runtime's) is capped at the container's
    /// 2048 MiB, and NVML reports the slice (`nvml_checks.py`); the hook says nothing.
    fn real_cuda_user_space_runs_capped(&self, step: &str) {
        if !self.python_image {
            return;
        }
        let c = self.cluster();
        let container = |name: &str, script: &str| {
            json!({"name": name, "image": crate::image::PYTHON_IMAGE, "imagePullPolicy": "Never",
                "args": [format!("{}/{script}", crate::image::CHECKS_DIR), "2048"],
                "env": [{"name": "FAKE_CUDA_DEVICE_MEMORY", "value": "24g"}],
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}}})
        };
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "cuda-python"},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 1000,
                    "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [container("driver", "driver_checks.py"),
                    container("runtime", "runtime_checks.py"),
                    container("nvml", "nvml_checks.py")]}});
        c.create_in(NS_FREE, pod)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        let phase = vgpu_tests::wait_for(WAIT, &format!("{step}: cuda-python to finish"), || {
            let pod = c.pod(NS_FREE, "cuda-python")?;
            let phase = pod["status"]["phase"].as_str()?.to_string();
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        });
        for (name, want) in [
            ("driver", vgpu_tests::PYTHON_DRIVER_CHECKS),
            ("runtime", vgpu_tests::PYTHON_RUNTIME_CHECKS),
            ("nvml", vgpu_tests::PYTHON_NVML_CHECKS),
        ] {
            let logs = c
                .kubectl(&["logs", "cuda-python", "-c", name, "-n", NS_FREE])
                .unwrap_or_else(|e| e);
            let done: Vec<&str> = logs.lines().filter_map(|l| l.strip_prefix("ok ")).collect();
            assert_eq!(
                done, want,
                "{step}: cuda-python container {name} (pod {phase}) under the device plugin's 2048 MiB:\n{logs}"
            );
            assert!(
                !logs.contains("vgpu:"),
                "{step}: the hook complained in container {name}:\n{logs}"
            );
        }
        assert_eq!(phase, "Succeeded", "{step}: cuda-python");
        crate::report(
            "real CUDA user space: cuda-bindings 12.9 (driver and runtime) and nvidia-ml-py capped at 2048 MiB in a pod",
        );
        c.delete(&["pod", "cuda-python", "-n", NS_FREE]);
    }

    /// Step 6: HAMi's node annotation `hami.io/device-cordon` keeps new pods off the GPU (Pending,
    /// the reason names the cordon) until it is lifted; `hami.io/gpu-scheduler-policy: mutex`
    /// waits for an idle GPU, and nothing joins it while the mutex pod lives.
    fn step6_hami_cordon_and_mutex(&mut self) {
        let step = "step 6 (cordon and mutex)";
        let c = self.cluster();
        let node = format!("node/{}", c.node);
        let pending_because = |name: &str, why: &str| {
            let describe = vgpu_tests::wait_for(
                WAIT,
                &format!("{step}: {name} Pending because {why:?}"),
                || {
                    let d = c.kubectl(&["describe", "pod", name, "-n", NS_FREE]).ok()?;
                    (d.contains("FailedScheduling") && d.contains(why)).then_some(d)
                },
            );
            let pod = c.pod(NS_FREE, name).unwrap_or_default();
            assert!(
                pod["spec"]["nodeName"].is_null(),
                "{step}: {name} placed: {describe}"
            );
            if let Some(line) = describe.lines().find(|l| l.contains(why)) {
                crate::report(&format!("{name}: {}", line.trim()));
            }
        };
        let annotate = |value: &str| {
            c.kubectl(&["annotate", "--overwrite", &node, value])
                .unwrap_or_else(|e| panic!("{step}: kubectl annotate {value}: {e}"));
        };
        let create = |name: &str, mutex: bool| {
            let mut pod = slice_pod(name, 1024, 10);
            if mutex {
                pod["metadata"]["annotations"] =
                    json!({vgpu_core::annotations::GPU_POLICY: "binpack,mutex"});
            }
            c.create_in(NS_FREE, pod)
                .unwrap_or_else(|e| panic!("{step}: {name}: {e}"));
        };
        annotate(&format!(
            "{}={GPU_UUID}",
            vgpu_core::annotations::DEVICE_CORDON
        ));
        create("cordoned", false);
        pending_because(
            "cordoned",
            "outside the cordon (node annotation hami.io/device-cordon)",
        );
        // Issue 38's waits, measured: how long a pending vGPU pod waits after its GPU opens.
        let lifted = Instant::now();
        annotate(&format!("{}-", vgpu_core::annotations::DEVICE_CORDON));
        c.wait_running(NS_FREE, "cordoned", step);
        let waited = lifted.elapsed().as_secs_f64();
        crate::report(&format!(
            "wait: cordon lifted -> the pending pod Running in {waited:.1} s"
        ));
        assert!(
            waited < 5.0,
            "{step}: the cordoned pod waited {waited:.1} s"
        );

        create("mutex", true);
        pending_because(
            "mutex",
            "no GPU idle (the mutex policy needs a GPU nothing else uses)",
        );
        c.delete(&["pod", "cordoned", "-n", NS_FREE]);
        // From the moment the pod is gone (`kubectl delete --wait`).
        let freed = Instant::now();
        let pod = c.wait_running(NS_FREE, "mutex", step);
        let waited = freed.elapsed().as_secs_f64();
        crate::report(&format!(
            "wait: the GPU's only pod gone -> the pending mutex pod Running in {waited:.1} s"
        ));
        assert!(waited < 5.0, "{step}: the mutex pod waited {waited:.1} s");
        let a = PodAssignment::decode(
            pod["metadata"]["annotations"][ASSIGNMENT]
                .as_str()
                .unwrap_or(""),
        )
        .unwrap_or_else(|e| panic!("{step}: {e}"));
        let slice = &a.containers[0].devices[0];
        assert!(
            slice.exclusive && slice.cores == 10,
            "{step}: the mutex pod's slice: {slice:?}"
        );
        create("joins", false);
        pending_because(
            "joins",
            "no GPU free of an exclusive pod (gpucores 100 or mutex)",
        );
        c.delete(&["pod", "mutex", "-n", NS_FREE]);
        c.wait_running(NS_FREE, "joins", step);
        c.delete(&["pod", "joins", "-n", NS_FREE]);

        // Fifty pods waiting at once (issue 38): a mutex pod holds the GPU and fifty small pods
        // wait; once it is gone they start in rounds of the GPU's free slots (`--split-count`),
        // each round deleted to make room for the next. How long each waits from the change
        // (the hog or the round before gone), and whether they start in creation order.
        create("hog", true);
        c.wait_running(NS_FREE, "hog", step);
        let free_slots = free_slots(c) + 1;
        // Each its own size, so a container answered with another pod's slice shows in its logs.
        let mib_of = |name: &str| 256 + name["waits-".len()..].parse::<u64>().unwrap_or(0);
        let mut left: Vec<String> = (0..50).map(|i| format!("waits-{i:02}")).collect();
        for name in &left {
            c.create_in(NS_FREE, slice_pod(name, mib_of(name), 0))
                .unwrap_or_else(|e| panic!("{step}: {name}: {e}"));
        }
        let mut crosswise = Vec::new();
        pending_because(
            "waits-49",
            "no GPU free of an exclusive pod (gpucores 100 or mutex)",
        );
        c.delete(&["pod", "hog", "-n", NS_FREE]);
        let mut bound_waits: Vec<f64> = Vec::new();
        let mut running_waits: Vec<f64> = Vec::new();
        let mut out_of_order = Vec::new();
        let mut rounds = 0;
        while !left.is_empty() {
            let changed = Instant::now();
            let room = free_slots.min(left.len());
            let mut bound: Vec<String> = Vec::new();
            let mut running: Vec<String> = Vec::new();
            vgpu_tests::wait_for(
                WAIT,
                &format!("{step}: {room} of the {} waiting pods Running", left.len()),
                || {
                    let pods = c.json(&["get", "pods", "-n", NS_FREE]);
                    let at = changed.elapsed().as_secs_f64();
                    for p in pods["items"].as_array().into_iter().flatten() {
                        let name = p["metadata"]["name"].as_str().unwrap_or_default();
                        if !left.iter().any(|l| l == name) {
                            continue;
                        }
                        if !p["spec"]["nodeName"].is_null() && !bound.iter().any(|b| b == name) {
                            bound.push(name.to_string());
                            bound_waits.push(at);
                        }
                        if p["status"]["phase"] == "Running" && !running.iter().any(|r| r == name) {
                            running.push(name.to_string());
                            running_waits.push(at);
                        }
                    }
                    (running.len() >= room).then_some(())
                },
            );
            assert_eq!(
                bound.len(),
                room,
                "{step}: more pods bound than the GPU's {room} free slots: {bound:?}"
            );
            out_of_order.extend(bound.iter().filter(|b| !left[..room].contains(b)).cloned());
            for name in &bound {
                let logs = c.logs_until(NS_FREE, name, step, |l| l.starts_with("info ="));
                let want = format!("total {}", mib_of(name) * MIB);
                if !logs
                    .lines()
                    .any(|l| l.starts_with("info =") && l.ends_with(&want))
                {
                    crosswise.push(name.clone());
                }
            }
            let mut delete = vec!["pod"];
            delete.extend(bound.iter().map(String::as_str));
            delete.extend(["-n", NS_FREE]);
            c.delete(&delete);
            left.retain(|l| !bound.contains(l));
            rounds += 1;
        }
        let p99 = |waits: &mut Vec<f64>| {
            waits.sort_by(f64::total_cmp);
            waits[(waits.len() * 99).div_ceil(100) - 1]
        };
        let (bound_p99, running_p99) = (p99(&mut bound_waits), p99(&mut running_waits));
        crate::report(&format!(
            "wait: fifty pods waiting, {rounds} rounds of {free_slots} slots -> bound p99 {bound_p99:.1} s (max {:.1}), Running p99 {running_p99:.1} s (max {:.1}); started out of creation order: {out_of_order:?}",
            bound_waits.last().copied().unwrap_or_default(),
            running_waits.last().copied().unwrap_or_default(),
        ));
        // Bound is what placement decides; Running adds ten sandboxes starting at once.
        assert!(
            bound_p99 < 5.0,
            "{step}: fifty waiting pods bound p99 {bound_p99:.1} s"
        );
        // Room goes to the oldest waiting pod that fits (vgpu-scheduler's server/waiting.rs).
        assert!(
            out_of_order.is_empty(),
            "{step}: pods started out of creation order: {out_of_order:?}"
        );
        // The kubelet admitted them in the order they were bound; before the device plugin asked
        // it which pod it was admitting, 19 of the 50 ran with another pod's slice.
        assert!(
            crosswise.is_empty(),
            "{step}: containers running with another pod's slice: {crosswise:?}"
        );
    }

    /// Step 7: HAMi's task priority through the real kubelet: a pod with `nvidia.com/priority: 0`
    /// pauses a low-priority pod's launches on the same GPU while it launches (the device plugin
    /// mounts the GPU's activity file into both, non-root); a pod that disables the core limit
    /// outside the allowed namespaces is refused naming the rule, and so is a priority that is not
    /// 0 or 1.
    fn step7_hami_priority_and_core_policy(&mut self) {
        let step = "step 7 (priority and core policy)";
        let c = self.cluster();
        let launcher = |name: &str, priority: Option<&str>, ms: u32| {
            let mut limits = json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"});
            if let Some(p) = priority {
                limits["nvidia.com/priority"] = json!(p);
            }
            let rate = format!("rate:{ms}:100:4");
            let mut pod = probe_pod(name, limits, &["direct", "init", "ctx:0", &rate]);
            // The fake GPU runs 200 us per launch: 5000 launches/s at most.
            pod["spec"]["containers"][0]["env"]
                .as_array_mut()
                .expect("env")
                .push(json!({"name": "FAKE_CUDA_BLOCK_NS", "value": "50000"}));
            pod
        };
        let windows = |logs: &str| -> Vec<f64> {
            logs.lines()
                .filter_map(|l| l.strip_prefix("window "))
                .filter_map(|l| l.split(' ').next()?.parse().ok())
                .collect()
        };
        // Whether a log line is a window starting at `ms` or later.
        let past = |l: &str, ms: f64| {
            l.strip_prefix("window ")
                .and_then(|l| l.split(' ').next()?.parse::<f64>().ok())
                .is_some_and(|t| t >= ms)
        };
        c.create_in(NS_FREE, launcher("low", None, 9000))
            .unwrap_or_else(|e| panic!("{step}: low: {e}"));
        c.logs_until(NS_FREE, "low", step, |l| past(l, 1000.0));
        c.create_in(NS_FREE, launcher("high", Some("0"), 2000))
            .unwrap_or_else(|e| panic!("{step}: high: {e}"));
        c.logs_until(NS_FREE, "high", step, |l| past(l, 1800.0));
        let logs = c.logs_until(NS_FREE, "low", step, |l| past(l, 8800.0));
        // Launch windows are 100 ms; a paused launch holds its window open while the high pod
        // launches (about 2 s).
        let starts = windows(&logs);
        let longest = starts.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        crate::report(&format!(
            "a low-priority pod paused {longest:.0} ms while a high-priority pod launched for 2000 ms"
        ));
        assert!(
            longest >= 1200.0,
            "{step}: the low-priority pod never paused: {logs}"
        );
        c.delete(&["pod", "low", "high", "-n", NS_FREE]);

        let mut lifted = slice_pod("lifted", 1024, 30);
        lifted["spec"]["containers"][0]["env"]
            .as_array_mut()
            .expect("env")
            .push(json!({"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}));
        let e = c
            .create_in(NS_FREE, lifted)
            .expect_err("a pod disabling its core limit was admitted");
        assert!(
            e.contains("GPU_CORE_UTILIZATION_POLICY=disable lifts the core limit")
                && e.contains("rule denyDisableControl"),
            "{step}: {e}"
        );
        let e = c
            .create_in(NS_FREE, launcher("urgent", Some("5"), 100))
            .expect_err("a pod with priority 5 was admitted");
        assert!(
            e.contains("nvidia.com/priority: \"5\" is not a task priority"),
            "{step}: {e}"
        );
    }
}

/// A plain-HTTP GET: (status, body).
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}
