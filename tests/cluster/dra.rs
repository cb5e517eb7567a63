//! Step 10: DRA mode. The node changes mode (device plugin off, the DRA plugin of the chart
//! rendered with `dra.enabled=true` on), and pods ask with native ResourceClaims of DeviceClass
//! `gpu.vgpu.io`: the slice is published, kube-scheduler allocates shares of the one GPU, the
//! plugin prepares them through CDI, and the probe in the container sees its slice, capped by
//! libvgpu.so. A pod written for HAMi in the namespace (labelled `vgpu.io/mode: dra`) becomes a
//! DRA pod, a dry run of one makes nothing, and one gpumem quota counts a device-plugin pod and
//! claims together. Then capacity runs out, deletes free it, and the plugin and the kubelet
//! restart under running pods.

use crate::journey::http_get;
use crate::kube::{Cluster, WAIT};
use crate::parts::{Parts, GPU_UUID};
use crate::report;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::Duration;

/// The DRA journey's namespace, labelled for the webhook in DRA mode.
pub const NS_DRA: &str = "vgpu-tier-dra";
/// A device-plugin-mode namespace with a gpumem quota, where claims are written directly.
pub const NS_MIXED: &str = "vgpu-tier-mixed";
const MIB: u64 = 1 << 20;
/// Where containerd reads CDI specs and the plugin writes them (the chart's `dra.cdiDir`).
const CDI_DIR: &str = "/var/run/cdi";

/// A claim template asking one share of `mib` MiB and `cores` percent.
pub fn template(name: &str, mib: u64, cores: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS_DRA},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.vgpu.io",
            "capacity": {"requests": {"memory": format!("{mib}Mi"), "cores": cores.to_string()}}}}]}}}})
}

/// The tier's probe pod (restricted Pod Security) with one claim from `template` instead of
/// extended resources, running `args`.
pub fn dra_pod(name: &str, template: &str, args: &[&str]) -> Value {
    let mut pod = crate::journey::probe_pod(name, json!({}), args);
    pod["metadata"]["namespace"] = json!(NS_DRA);
    pod["spec"]["resourceClaims"] = json!([{"name": "gpu", "resourceClaimTemplateName": template}]);
    pod["spec"]["containers"][0]["resources"] = json!({"claims": [{"name": "gpu"}]});
    pod
}

pub const HOLD: [&str; 5] = ["direct", "init", "ctx:0", "info", "hold:3600000"];

/// The generated claim of pod `name` and its allocation result.
fn claim_of(c: &Cluster, name: &str, step: &str) -> (String, String, Value) {
    let pod = c
        .pod(NS_DRA, name)
        .unwrap_or_else(|| panic!("{step}: no pod {name}"));
    let claim = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        .as_str()
        .unwrap_or_else(|| panic!("{step}: pod {name} has no generated claim: {pod}"))
        .to_string();
    let obj = c.json(&["get", "resourceclaim", &claim, "-n", NS_DRA]);
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (
        claim,
        uid,
        obj["status"]["allocation"]["devices"]["results"][0].clone(),
    )
}

fn cdi_spec(uid: &str) -> PathBuf {
    PathBuf::from(CDI_DIR).join(format!("gpu.vgpu.io-claim_{uid}.json"))
}

fn exec_probe(c: &Cluster, ns: &str, pod: &str, args: &[&str]) -> String {
    let mut a = vec!["exec", pod, "-n", ns, "--", "/bin/probe", "direct"];
    a.extend(args);
    c.kubectl(&a).unwrap_or_else(|e| panic!("{e}"))
}

/// The probe run again inside `pod` of `NS_DRA`: `mib` MiB is its slice, one MiB more is refused.
fn still_capped(c: &Cluster, pod: &str, mib: u64, step: &str) {
    capped_in(c, NS_DRA, pod, mib, step);
}

/// The probe run again inside `ns/pod`: `mib` MiB is its slice, one MiB more is refused.
pub fn capped_in(c: &Cluster, ns: &str, pod: &str, mib: u64, step: &str) {
    let out = exec_probe(
        c,
        ns,
        pod,
        &[
            "init",
            "ctx:0",
            &format!("alloc:{}m", mib - 1),
            "alloc:2m",
            "info",
        ],
    );
    for want in [
        format!("alloc {} = 0", (mib - 1) * MIB),
        format!("alloc {} = 2", 2 * MIB),
        format!("info = 0 free {MIB} total {}", mib * MIB),
    ] {
        assert!(
            out.lines().any(|l| l == want),
            "{step}: {pod}: no line {want:?}:\n{out}"
        );
    }
}

/// The DRA journey; leaves the node without a vgpu node agent.
pub fn run(parts: &mut Parts<'_>) {
    let c = parts.cluster;
    let started = std::time::Instant::now();
    let helm = vgpu_tests::helm::helm().expect("helm");
    // Generated templates unused for 5 s are swept, so the journey sees it happen.
    let chart = vgpu_tests::helm::Chart::render(
        &helm,
        "1.36.2",
        &["dra.enabled=true", "dra.gpuCdiKind=", "dra.templateIdle=5s"],
    );
    parts.stop_device_plugin();
    c.apply(&chart.get("DeviceClass", "gpu.vgpu.io").to_string());
    c.apply(
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_DRA,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted", "vgpu": "enabled",
            "vgpu.io/mode": "dra"}}})
        .to_string(),
    );
    parts.switch_chart(chart);
    // The webhook with the DRA chart's args (--dra).
    parts.webhook = None;
    parts.start_webhook();
    // vgpu-scheduler with the DRA chart's args: it explains claims that wait (--dra).
    parts.scheduler = None;
    parts.start_scheduler();
    parts.start_dra_plugin();

    let step = "step 10a (DRA: the slice)";
    let slice_name = format!("{}-gpu.vgpu.io", c.node);
    let slice = vgpu_tests::wait_for(WAIT, &format!("{step}: ResourceSlice {slice_name}"), || {
        let s = c.get(&["resourceslice", &slice_name])?;
        (s["spec"]["devices"][0]["attributes"]["uuid"]["string"] == GPU_UUID).then_some(s)
    });
    let dev = &slice["spec"]["devices"][0];
    assert_eq!(dev["name"], "gpu-0", "{step}: {slice}");
    assert_eq!(dev["allowMultipleAllocations"], true, "{step}: {slice}");
    assert_eq!(
        dev["capacity"]["memory"]["value"], "24Gi",
        "{step}: {slice}"
    );
    assert_eq!(dev["capacity"]["cores"]["value"], "100", "{step}: {slice}");
    assert_eq!(
        dev["attributes"]["productName"]["string"], "NVIDIA A10",
        "{step}: {slice}"
    );
    assert_eq!(
        slice["spec"]["pool"]["name"],
        c.node.as_str(),
        "{step}: {slice}"
    );
    let generation = slice["spec"]["pool"]["generation"].clone();

    let step = "step 10a (DRA: impossible claims are refused at admission, naming the field)";
    let mut bad = template("too-many-cores", 4096, 150);
    bad["kind"] = json!("ResourceClaim");
    bad["spec"] = bad["spec"]["spec"].clone();
    let err = c.create(&bad).expect_err(step);
    assert!(
        err.contains("spec.devices.requests[0].exactly.capacity.requests.cores: 150 is more than a GPU has (100, percent of its SMs)"),
        "{step}: {err}"
    );
    let err = c
        .create(&template("too-much-memory", 48 * 1024, 10))
        .expect_err(step);
    assert!(
        err.contains(&format!("spec.spec.devices.requests[0].exactly.capacity.requests.memory: 48Gi is more than the largest GPU of class gpu.vgpu.io has (24Gi on node {})", c.node)),
        "{step}: {err}"
    );
    report(&format!(
        "DRA: a 48 GiB claim template is refused: {}",
        err.trim()
    ));

    let step = "step 10b (DRA: a claim of 4 GiB and 30 % runs capped)";
    c.apply(&template("slice-4g", 4096, 30).to_string());
    // create -> Running of a plain pod just before, for scale (printed, not checked).
    let plain_started = std::time::Instant::now();
    c.create_in(NS_DRA, crate::journey::plain_pod("dra-plain"))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    c.wait_running(NS_DRA, "dra-plain", step);
    let plain = plain_started.elapsed();
    c.delete(&["pod", "dra-plain", "-n", NS_DRA, "--grace-period=0"]);
    let dra_started = std::time::Instant::now();
    c.create(&dra_pod("dra-a", "slice-4g", &crate::journey::CAPPED_ARGS))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    c.wait_running(NS_DRA, "dra-a", step);
    let dra = dra_started.elapsed();
    report(&format!(
        "create -> Running: DRA pod (claim from a template) {:.2} s, plain pod {:.2} s ({:.2}x)",
        dra.as_secs_f64(),
        plain.as_secs_f64(),
        dra.as_secs_f64() / plain.as_secs_f64()
    ));
    let logs = c.logs_until(NS_DRA, "dra-a", step, |l| l.starts_with("info"));
    for want in [
        format!("alloc {} = 0", 4095 * MIB),
        format!("alloc {MIB} = 0"),
        format!("alloc {} = 2", 2 * MIB),
        format!("info = 0 free 0 total {}", 4096 * MIB),
    ] {
        assert!(
            logs.lines().any(|l| l == want),
            "{step}: no line {want:?} (CUDA_ERROR_OUT_OF_MEMORY is 2):\n{logs}"
        );
    }
    let (claim_a, uid_a, result_a) = claim_of(c, "dra-a", step);
    assert_eq!(
        result_a["consumedCapacity"],
        json!({"memory": "4Gi", "cores": "30"}),
        "{step}: {result_a}"
    );
    assert!(
        cdi_spec(&uid_a).exists(),
        "{step}: no CDI spec {}",
        cdi_spec(&uid_a).display()
    );
    let metrics = parts.dra.as_ref().map(|d| d.metrics).expect("DRA plugin");
    let want = format!(
        "vgpu_container_memory_limit_bytes{{namespace=\"{NS_DRA}\",pod=\"dra-a\",claim=\"{claim_a}\",container=\"gpu\",device=\"{GPU_UUID}\"}} {}",
        4096 * MIB
    );
    let body = http_get(metrics, "/metrics")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert!(
        body.lines().any(|l| l == want),
        "{step}: /metrics has no {want:?}:\n{body}"
    );

    let step = "step 10c (DRA: two pods share the GPU)";
    c.create(&dra_pod("dra-b", "slice-4g", &HOLD))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    c.wait_running(NS_DRA, "dra-b", step);
    let (_, uid_b, result_b) = claim_of(c, "dra-b", step);
    assert_eq!(result_b["device"], result_a["device"], "{step}: {result_b}");
    assert_ne!(
        result_b["shareID"], result_a["shareID"],
        "{step}: {result_b}"
    );
    still_capped(c, "dra-b", 4096, step);

    hami_pod(c);
    one_quota(c);

    let step = "step 10d (DRA: capacity exhausted, then freed)";
    c.apply(&template("slice-20g", 20480, 10).to_string());
    c.create(&dra_pod("dra-c", "slice-20g", &HOLD))
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    let why = vgpu_tests::wait_for(WAIT, &format!("{step}: a FailedScheduling event"), || {
        c.events(NS_DRA)
            .into_iter()
            .find(|(o, r, _)| o == "dra-c" && r == "FailedScheduling")
            .map(|(_, _, m)| m)
    });
    assert!(why.contains("cannot allocate all claims"), "{step}: {why}");
    // vgpu-scheduler says why: the GPU's free memory and cores against the request.
    let explained = vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: vgpu-scheduler's VGPUClaimUnallocatable event"),
        || {
            c.events(NS_DRA)
                .into_iter()
                .find(|(o, r, _)| o == "dra-c" && r == "VGPUClaimUnallocatable")
                .map(|(_, _, m)| m)
        },
    );
    assert!(
        explained.ends_with(&format!("spec.devices.requests[0].exactly needs 20480 MiB and 10 cores of one GPU of class gpu.vgpu.io; free now: {}/gpu-0 16384 MiB and 40 cores free", c.node)),
        "{step}: {explained}"
    );
    report(&format!("DRA: vgpu-scheduler explains: {explained}"));
    report(&format!(
        "DRA: 4+4+20 GiB of a 24 GiB GPU: kube-scheduler says {why:?}"
    ));
    c.delete(&["pod", "dra-a", "-n", NS_DRA]);
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: the CDI spec of dra-a's claim is removed"),
        || (!cdi_spec(&uid_a).exists()).then_some(()),
    );
    c.wait_running(NS_DRA, "dra-c", step);
    let (_, uid_c, _) = claim_of(c, "dra-c", step);

    let step = "step 10e (DRA: plugin SIGKILL)";
    let back = parts.restart_dra_plugin();
    report(&format!(
        "DRA plugin killed and restarted: registered again {:.2} s after its start",
        back.as_secs_f64()
    ));
    let pod = c.wait_running(NS_DRA, "dra-b", step);
    assert_eq!(
        pod["status"]["containerStatuses"][0]["restartCount"], 0,
        "{step}: {pod}"
    );
    still_capped(c, "dra-b", 4096, step);
    let slice = c.json(&["get", "resourceslice", &slice_name]);
    assert_eq!(
        slice["spec"]["pool"]["generation"], generation,
        "{step}: the same devices, the same generation: {slice}"
    );

    let step = "step 10f (DRA: kubelet restart)";
    let before = registrations(parts);
    if c.restart_kubelet(step) {
        vgpu_tests::wait_for(
            Duration::from_secs(60),
            &format!("{step}: the kubelet registers the plugin again"),
            || (registrations(parts) > before).then_some(()),
        );
        for p in ["dra-b", "dra-c"] {
            c.wait_running(NS_DRA, p, step);
        }
        still_capped(c, "dra-c", 20480, step);
    }

    let step =
        "step 10g (DRA: an XID taints the GPU; running pods keep it, a claim on it is warned)";
    std::fs::write(parts.nvml_events(), "0 79\n").expect("append an XID");
    let tainted = vgpu_tests::wait_for(WAIT, &format!("{step}: the slice's GPU tainted"), || {
        let s = c.get(&["resourceslice", &slice_name])?;
        (s["spec"]["devices"][0]["taints"][0]["key"] == "gpu.vgpu.io/unhealthy").then_some(s)
    });
    assert_ne!(
        tainted["spec"]["pool"]["generation"], generation,
        "{step}: a changed device bumps the pool's generation: {tainted}"
    );
    let on_sick = json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "on-sick", "namespace": NS_DRA},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io",
            "selectors": [{"cel": {"expression": format!("device.attributes[\"gpu.vgpu.io\"].uuid == \"{GPU_UUID}\"")}}],
            "capacity": {"requests": {"memory": "1Gi"}}}}]}}});
    let warnings = c
        .create_warnings(&on_sick)
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    assert!(
        warnings.contains(&format!("spec.devices.requests[0].exactly: every GPU it can use is unhealthy ({GPU_UUID} (gpu-0) on node {}: taint gpu.vgpu.io/unhealthy)", c.node)),
        "{step}: kubectl's warnings: {warnings}"
    );
    for p in ["dra-b", "dra-c"] {
        c.wait_running(NS_DRA, p, step);
    }
    // The plugin's health stream reaches the pods' status (KEP-4680).
    let status = vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: dra-b's allocatedResourcesStatus says Unhealthy"),
        || {
            let pod = c.pod(NS_DRA, "dra-b")?;
            let s = pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"].clone();
            s.to_string().contains("\"Unhealthy\"").then_some(s)
        },
    );
    report(&format!(
        "DRA: after the XID, dra-b's allocatedResourcesStatus: {status}"
    ));

    let step = "step 10h (DRA: deletes unprepare)";
    c.delete(&["pod", "dra-b", "dra-c", "-n", NS_DRA]);
    vgpu_tests::wait_for(WAIT, &format!("{step}: the CDI specs are removed"), || {
        (!cdi_spec(&uid_b).exists() && !cdi_spec(&uid_c).exists()).then_some(())
    });
    parts.dra = None;
    c.delete(&["namespace", NS_DRA]);
    c.delete(&["resourceslice", &slice_name]);
    c.delete(&["deviceclass", "gpu.vgpu.io"]);
    report(&format!("DRA journey passed in {:.0?}", started.elapsed()));
}

/// The names of the templates the webhook made in `ns`.
fn generated_templates(c: &Cluster, ns: &str) -> Vec<String> {
    c.json(&[
        "get",
        "resourceclaimtemplates",
        "-n",
        ns,
        "-l",
        "vgpu.io/generated=true",
    ])["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["metadata"]["name"].as_str().map(str::to_string))
        .collect()
}

/// Step 10c': a pod written for HAMi becomes a DRA pod; its dry run makes nothing; its template
/// goes once no pod uses it.
fn hami_pod(c: &Cluster) {
    let step = "step 10c' (DRA: a pod written for HAMi runs as a DRA pod, capped at what it asked)";
    let limits =
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3072", "nvidia.com/gpucores": "20"});
    let mut pod = crate::journey::probe_pod("hami-a", limits, &HOLD);
    pod["metadata"]["namespace"] = json!(NS_DRA);
    assert!(generated_templates(c, NS_DRA).is_empty(), "{step}");
    c.kubectl_stdin(&pod.to_string(), &["create", "--dry-run=server", "-f", "-"])
        .unwrap_or_else(|e| panic!("{step}: dry run: {e}"));
    assert!(
        generated_templates(c, NS_DRA).is_empty(),
        "{step}: a dry run made a template"
    );
    c.create(&pod).unwrap_or_else(|e| panic!("{step}: {e}"));
    let running = c.wait_running(NS_DRA, "hami-a", step);
    let main = &running["spec"]["containers"][0];
    assert_eq!(
        main["resources"]["claims"],
        json!([{"name": "vgpu-main"}]),
        "{step}: {main}"
    );
    assert!(
        !main["resources"].to_string().contains("nvidia.com/"),
        "{step}: the extended resources stay: {main}"
    );
    let templates = generated_templates(c, NS_DRA);
    assert_eq!(templates.len(), 1, "{step}: {templates:?}");
    assert!(
        templates[0].starts_with("vgpu-1x3072mi-20c-"),
        "{step}: {templates:?}"
    );
    assert_eq!(
        running["metadata"]["annotations"]["vgpu.io/dra-converted"],
        format!("main=vgpu-main/{}", templates[0]),
        "{step}"
    );
    let (_, uid, result) = claim_of(c, "hami-a", step);
    assert_eq!(
        result["consumedCapacity"],
        json!({"memory": "3Gi", "cores": "20"}),
        "{step}: {result}"
    );
    still_capped(c, "hami-a", 3072, step);
    // vgpu's profile places it (on one node kube-scheduler scores nothing; the two-node test
    // sees the DRA extender's scores).
    assert_eq!(running["spec"]["schedulerName"], "vgpu-scheduler", "{step}");
    report(&format!(
        "DRA: a pod asking nvidia.com/gpumem 3072 and gpucores 20 ran as a DRA pod from template {} and is capped at 3072 MiB",
        templates[0]
    ));
    c.delete(&["pod", "hami-a", "-n", NS_DRA]);
    vgpu_tests::wait_for(
        WAIT,
        &format!("{step}: the claim unprepared and the unused template swept"),
        || (!cdi_spec(&uid).exists() && generated_templates(c, NS_DRA).is_empty()).then_some(()),
    );
}

/// Step 10c'': one gpumem quota over a device-plugin pod and claims of class `gpu.vgpu.io`.
fn one_quota(c: &Cluster) {
    let step = "step 10c'' (DRA: one gpumem quota counts a device-plugin pod and claims together)";
    c.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS_MIXED,
                "labels": {"pod-security.kubernetes.io/enforce": "restricted", "vgpu": "enabled"}}},
            {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpumem", "namespace": NS_MIXED},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "8192"}}}]})
        .to_string(),
    );
    // A device-plugin pod of 4096 MiB that stays pending (no node matches) but counts.
    let mut dp = crate::journey::probe_pod(
        "dp-held",
        json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
        &HOLD,
    );
    dp["spec"]["nodeSelector"] = json!({"vgpu.io/tier": "nowhere"});
    c.create_in(NS_MIXED, dp)
        .unwrap_or_else(|e| panic!("{step}: {e}"));
    let claim = |name: &str, mib: u64| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS_MIXED},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io",
                "capacity": {"requests": {"memory": format!("{mib}Mi")}}}}]}}})
    };
    c.create(&claim("own-3g", 3072))
        .unwrap_or_else(|e| panic!("{step}: 4096 + 3072 of 8192: {e}"));
    let want = format!("vgpu quota exceeded in namespace {NS_MIXED}: ResourceQuota gpumem limits.nvidia.com/gpumem: requested 2048 MiB (1 GPU x 2048), used 7168, hard 8192");
    let err = c.create(&claim("own-2g", 2048)).expect_err(step);
    assert!(err.contains(&want), "{step}: the claim: {err}");
    let mut t = template("slice-2g", 2048, 10);
    t["metadata"]["namespace"] = json!(NS_MIXED);
    c.create(&t).unwrap_or_else(|e| panic!("{step}: {e}"));
    let mut pod = dra_pod("dra-2g", "slice-2g", &HOLD);
    pod["metadata"]["namespace"] = json!(NS_MIXED);
    let err = c.create(&pod).expect_err(step);
    assert!(err.contains(&want), "{step}: the DRA pod: {err}");
    for object in ["own-2g", "dra-2g"] {
        let note = vgpu_tests::wait_for(WAIT, &format!("{step}: {object}'s Event"), || {
            c.events(NS_MIXED)
                .into_iter()
                .find(|(o, r, _)| o == object && r == "VGPUQuotaExceeded")
                .map(|(_, _, m)| m)
        });
        assert_eq!(note, want, "{step}: {object}");
    }
    report(&format!("DRA: one quota over both modes: {want}"));
    c.delete(&["namespace", NS_MIXED]);
}

/// How many times the kubelet has registered the running DRA plugin.
fn registrations(parts: &Parts<'_>) -> usize {
    parts
        .dra
        .as_ref()
        .map(|d| {
            d.proc
                .output()
                .iter()
                .filter(|l| l.contains("registered with the kubelet"))
                .count()
        })
        .unwrap_or(0)
}
