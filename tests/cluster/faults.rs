//! Step 6: faults an operator will meet, each with what vgpu promises through it.

use crate::journey::{plain_pod, slice_pod, Journey, NS, NS_FREE, NS_PLAIN, QUOTA_MIB};
use crate::kube::WAIT;
use crate::report;
use std::time::Duration;

/// Every fault step in order.
pub fn run(j: &mut Journey<'_, '_>) {
    device_plugin_restart_keeps_running_pods_capped(j);
    kubelet_restart_brings_the_plugin_back(j);
    extender_outage_leaves_pods_pending(j);
    webhook_outage_fails_closed_for_vgpu_pods_only(j);
    webhook_restart_mid_stream_never_overspends_the_quota(j);
    a_ledger_namespace_the_webhook_cannot_use_is_named(j);
}

/// The probe run again inside a running container (`kubectl exec`): the limits still hold.
fn exec_probe(j: &Journey<'_, '_>, ns: &str, pod: &str, args: &[&str]) -> String {
    let mut a = vec!["exec", pod, "-n", ns, "--", "/bin/probe", "direct"];
    a.extend(args);
    j.cluster().kubectl(&a).unwrap_or_else(|e| panic!("{e}"))
}

/// Device plugin killed and restarted: it registers again, the capacity comes back, and a pod
/// that was running keeps running under the same limits.
fn device_plugin_restart_keeps_running_pods_capped(j: &mut Journey<'_, '_>) {
    let step = "step 6a (device plugin restart)";
    j.cluster()
        .create_in(NS, slice_pod("keeper", 2048, 0))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    j.cluster().wait_running(NS, "keeper", step);
    let back = j.parts.restart_device_plugin();
    report(&format!(
        "device plugin killed and restarted: registered with the kubelet {:.2} s after its start",
        back.as_secs_f64()
    ));
    j.parts.wait_for_capacity(step);
    let pod = j.cluster().wait_running(NS, "keeper", step);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{step}: {pod}"
    );
    let out = exec_probe(
        j,
        NS,
        "keeper",
        &["init", "ctx:0", "alloc:2047m", "alloc:2m", "info"],
    );
    for want in [
        format!("alloc {} = 0", 2047u64 << 20),
        format!("alloc {} = 2", 2u64 << 20),
        format!("info = 0 free {} total {}", 1u64 << 20, 2048u64 << 20),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{step}: the hook after the plugin's restart: no line {want:?}:\n{out}"
        );
    }
}

/// The kubelet restarted (it removes every socket in its device-plugin directory): the plugin
/// registers again by itself within 5 s.
fn kubelet_restart_brings_the_plugin_back(j: &mut Journey<'_, '_>) {
    let step = "step 6b (kubelet restart)";
    let c = j.cluster();
    if !c.restart_kubelet(step) {
        return;
    }
    // From the new kubelet's log: its registration server starts, then our plugin registers.
    let log = c.dir.join("log/kubelet.log");
    let took = vgpu_tests::wait_for(
        Duration::from_secs(30),
        &format!("{step}: the plugin registers again"),
        || {
            let text = std::fs::read_to_string(&log).ok()?;
            let start = text.rfind("\"Starting device plugin registration server\"")?;
            let up = klog_time(text[..start].rsplit('\n').next()?)?;
            let line = text[start..].lines().find(|l| {
                l.contains("Got registration request from device plugin")
                    && l.contains("nvidia.com/gpu")
            })?;
            Some(klog_time(line)? - up)
        },
    );
    report(&format!(
        "kubelet restarted: the device plugin registered {:.2} s after the kubelet's registration server started",
        took.as_secs_f64()
    ));
    assert!(
        took < Duration::from_secs(5),
        "{step}: the plugin took {took:?} to come back"
    );
    j.parts.wait_for_capacity(step);
    j.cluster().wait_running(NS, "keeper", step);
}

/// The time of day of a klog line (`I1206 07:31:18.722415 ...`), as a duration since midnight.
fn klog_time(line: &str) -> Option<Duration> {
    let t = line.split_whitespace().nth(1)?;
    let mut parts = t.split(':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    let secs =
        h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?;
    Some(Duration::from_secs_f64(secs))
}

/// vgpu-scheduler down: vGPU pods stay Pending with the reason in their events, none is placed
/// without it, and they are placed once it is back.
fn extender_outage_leaves_pods_pending(j: &mut Journey<'_, '_>) {
    let step = "step 6c (extender outage)";
    let c = j.cluster();
    j.parts.stop_extender();
    j.cluster()
        .create_in(NS_FREE, slice_pod("waits", 1024, 0))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    // kube-scheduler's own words: `Post "http://127.0.0.1:PORT/filter": ... connection refused`.
    let describe = vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: FailedScheduling naming the extender's URL"),
        || {
            let d = c
                .kubectl(&["describe", "pod", "waits", "-n", NS_FREE])
                .ok()?;
            (d.contains("FailedScheduling") && d.contains("/filter")).then_some(d)
        },
    );
    let pod = c.pod(NS_FREE, "waits").unwrap_or_default();
    assert!(
        pod["spec"]["nodeName"].is_null(),
        "{step}: placed without the extender:\n{describe}"
    );
    j.parts.restart_extender();
    j.cluster().wait_running(NS_FREE, "waits", step);
    c.delete(&["pod", "waits", "-n", NS_FREE]);
}

/// vgpu-webhook down: vGPU pods in labelled namespaces are refused (failurePolicy Fail), every
/// other pod is admitted (the configurations' match conditions never send it).
fn webhook_outage_fails_closed_for_vgpu_pods_only(j: &mut Journey<'_, '_>) {
    let step = "step 6d (webhook outage)";
    let c = j.cluster();
    j.parts.stop_webhook();
    let err = j
        .cluster()
        .create_in(NS_FREE, slice_pod("refused", 1024, 0))
        .expect_err("step 6d: a vGPU pod was admitted without the webhook");
    assert!(
        err.contains("vgpu.io"),
        "{step}: the refusal does not name the webhook: {err}"
    );
    j.cluster()
        .create_in(NS_FREE, plain_pod("plain-admitted"))
        .unwrap_or_else(|e| panic!("{step}: a plain pod was refused: {e}"));
    j.cluster()
        .create_in(NS_PLAIN, slice_pod("unlabelled-admitted", 1024, 0))
        .unwrap_or_else(|e| panic!("{step}: a pod in an unlabelled namespace was refused: {e}"));
    j.parts.restart_webhook();
    c.delete(&["pod", "plain-admitted", "-n", NS_FREE]);
    c.delete(&["pod", "unlabelled-admitted", "-n", NS_PLAIN]);
}

/// The webhook restarted while pods are being created: whatever each creation's fate, the pods
/// that exist never hold more than the quota.
fn webhook_restart_mid_stream_never_overspends_the_quota(j: &mut Journey<'_, '_>) {
    let step = "step 6e (webhook restart mid-stream)";
    let c = j.cluster();
    c.delete(&["pod", "keeper", "-n", NS]);
    let mib = 2048;
    let tries = 12;
    // Creations one after another, the webhook restarted once two have been answered.
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let admitted = std::thread::scope(|scope| {
        let creator = scope.spawn(|| {
            let mut admitted = 0;
            for i in 0..tries {
                if c.create_in(NS, slice_pod(&format!("burst-{i}"), mib, 0))
                    .is_ok()
                {
                    admitted += 1;
                }
                answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            admitted
        });
        vgpu_tests::wait_for(WAIT, &format!("{step}: creations under way"), || {
            (answered.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
        });
        j.parts.restart_webhook();
        creator.join().expect("creator thread")
    });
    let pods = c.json(&["get", "pods", "-n", NS, "-l", "vgpu.io/managed=true"]);
    let held: u64 = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .count() as u64
        * mib;
    report(&format!(
        "webhook restarted during {tries} creations: {admitted} admitted, {held} MiB held of {QUOTA_MIB}"
    ));
    assert!(
        held <= QUOTA_MIB,
        "{step}: {held} MiB of vGPU pods under a {QUOTA_MIB} MiB quota"
    );
    assert!(admitted >= 1, "{step}: nothing was admitted at all");
    // The next step needs room under the quota: how much this one left depends on the restart's
    // timing (4 or 5 of the 12 admitted).
    let names: Vec<String> = (0..tries).map(|i| format!("burst-{i}")).collect();
    let mut args = vec!["pod"];
    args.extend(names.iter().map(String::as_str));
    args.extend(["-n", NS]);
    c.delete(&args);
}

/// A webhook whose ledger namespace (`--namespace`) does not exist, or is closed to it: `/readyz`
/// and the refusal of a pod under a vGPU quota name the namespace and the flag, not an API outage.
/// With an admin's kubeconfig (a host process, as a new user starts it) the API server answers a
/// ledger write with its NamespaceLifecycle 404; with the chart's ServiceAccount, RBAC answers 403
/// first (the ledger Role lives in the release namespace only).
fn a_ledger_namespace_the_webhook_cannot_use_is_named(j: &mut Journey<'_, '_>) {
    let step = "step 6f (ledger namespace)";
    let missing = "vgpu-tier-no-such-namespace";
    let admin = j.cluster().kubeconfig();
    for (kubeconfig, says) in [
        (Some(admin.as_path()), "does not exist"),
        (None, "may not write its quota ledgers"),
    ] {
        let w = j.parts.side_webhook(kubeconfig, missing);
        let reason =
            vgpu_tests::wait_for(WAIT, &format!("{step}: /readyz naming {missing}"), || {
                let (code, body) = j.parts.https_call(w.addr, "GET", "/readyz", b"");
                (code == 503 && body.contains(says)).then_some(body)
            });
        assert!(
            reason.contains(&format!("{missing:?}")) && reason.contains("--namespace"),
            "{step}: /readyz: {reason}"
        );
        let mut pod = slice_pod("ledgerless", 1024, 0);
        pod["metadata"]["namespace"] = serde_json::json!(NS);
        let review = vgpu_tests::admission::pod_create_review("tier-ledger", &pod, false);
        let (code, body) = j.parts.https_call(w.addr, "POST", "/validate", &review);
        let answer: serde_json::Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{step}: /validate answered {code}: {e}: {body}"));
        let message = answer["response"]["status"]["message"]
            .as_str()
            .unwrap_or("");
        assert_eq!(
            (code, answer["response"]["allowed"].as_bool()),
            (200, Some(false)),
            "{step}: {body}"
        );
        assert!(
            message.contains(says)
                && message.contains(&format!("{missing:?}"))
                && message.contains("--namespace")
                && !message.contains("unavailable"),
            "{step}: the refusal: {message}"
        );
        report(&format!("webhook with --namespace {missing}: {message}"));
    }
}
