//! The contract fixtures, checked against the real components: what kube-scheduler sends an
//! extender (filter, prioritize, bind), what the API server sends admission webhooks (a pod whose
//! `gpumem` was written `2000`), how it answers an Event about a cluster-scoped object in a
//! namespace, and how the kubelet calls a device plugin. Each is captured live and compared with
//! `tests/fixtures/` (the doubles' source); `VGPU_UPDATE_FIXTURES=1` writes the captures there.

use crate::kube::Cluster;
use crate::parts::chart;
use crate::report;
use base64::Engine as _;
use serde_json::{json, Value};
use std::time::Duration;
use vgpu_tests::fixtures::{self, shape};
use vgpu_tests::recorder::Recorder;

const NS: &str = "vgpu-fixture";
const NODE: &str = "vgpu-fixture-node";
const PROFILE: &str = "vgpu-fixture";
const RECORDER_WEBHOOKS: &str = "vgpu-fixture-recorder";

fn updating() -> bool {
    std::env::var_os("VGPU_UPDATE_FIXTURES").is_some_and(|v| v != "0")
}

/// Writes `captured` as fixture `name` when updating, else checks it against the checked-in one
/// with `same` (which says what must agree).
fn settle(name: &str, captured: &Value, same: impl Fn(&Value, &Value) -> Result<(), String>) {
    let path = fixtures::dir().join(name);
    if updating() {
        std::fs::create_dir_all(path.parent().expect("fixture dir")).expect("mkdir fixtures");
        let text = serde_json::to_string_pretty(captured).expect("JSON") + "\n";
        std::fs::write(&path, text).expect("write fixture");
        report(&format!("fixture {name} written"));
        return;
    }
    let pinned = fixtures::load(name);
    if let Err(e) = same(&pinned, captured) {
        panic!(
            "fixtures: the real component no longer does what tests/fixtures/{name} pins \
             (the doubles copy it): {e}\ncaptured now: {captured}\n\
             rerun with VGPU_UPDATE_FIXTURES=1 to take the new behaviour, then fix the doubles and the code"
        );
    }
}

fn same_shape(pinned: &Value, now: &Value) -> Result<(), String> {
    (shape(pinned) == shape(now))
        .then_some(())
        .ok_or_else(|| format!("shape {} became {}", shape(pinned), shape(now)))
}

/// What must agree in an AdmissionReview: the request's fields and their kinds, and the quantity
/// as the webhook receives it.
fn same_review(pinned: &Value, now: &Value) -> Result<(), String> {
    same_shape(&pinned["request"], &now["request"])?;
    let q = |v: &Value| {
        v["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"]
            .clone()
    };
    (q(pinned) == q(now))
        .then_some(())
        .ok_or_else(|| format!("gpumem {} became {}", q(pinned), q(now)))
}

/// Captures from the real kube-scheduler and API server, and checks the pinned fixtures.
pub fn check_against_the_real_components(c: &Cluster) {
    cleanup(c);
    let ext = Recorder::start(
        None,
        Box::new(|path, body| match path {
            // Pass every candidate, so kube-scheduler goes on to prioritize.
            "/filter" => json!({"NodeNames": body["NodeNames"]}),
            "/prioritize" => Value::Array(
                body["NodeNames"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|n| json!({"Host": n, "Score": 0}))
                    .collect(),
            ),
            _ => json!({"Error": "fixture capture: not binding"}),
        }),
    );
    let pki = vgpu_tests::certs::TestPki::new(&[]);
    let adm = Recorder::start(
        Some((&pki.cert_pem, &pki.key_pem)),
        Box::new(|_, body| {
            json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": body["request"]["uid"], "allowed": true}})
        }),
    );
    let ca = base64::engine::general_purpose::STANDARD.encode(&pki.ca_pem);
    let hook = |path: &str| {
        json!({"name": format!("{}.vgpu.io", &path[1..]), "admissionReviewVersions": ["v1"],
            "sideEffects": "None", "failurePolicy": "Ignore", "timeoutSeconds": 5,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NS}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"], "scope": "Namespaced"}],
            "clientConfig": {"url": format!("https://{}{path}", adm.addr), "caBundle": ca}})
    };
    c.apply(
        &json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": RECORDER_WEBHOOKS}, "webhooks": [hook("/mutate")]},
            {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": RECORDER_WEBHOOKS}, "webhooks": [hook("/validate")]},
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE,
                "labels": {"kubernetes.io/hostname": NODE}}}]})
        .to_string(),
    );
    // A second schedulable node (no kubelet: its status written here), so that kube-scheduler's
    // filters leave two nodes and it calls prioritize.
    c.kubectl(&[
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=merge",
        "-p",
        &json!({"status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
        .to_string(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    vgpu_tests::wait_for(
        Duration::from_secs(60),
        "fixtures: ServiceAccount default",
        || c.get(&["serviceaccount", "default", "-n", NS]),
    );

    // kube-scheduler with the chart's extender settings, pointed at the recorder.
    let mut config =
        crate::parts::scheduler_config(&chart(), &c.kubeconfig(), &format!("http://{}", ext.addr));
    config["profiles"] = json!([{"schedulerName": PROFILE}]);
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("kube-scheduler.json");
    std::fs::write(&path, config.to_string()).expect("write config");
    let _scheduler =
        crate::parts::launch_kube_scheduler(c, &path, &c.kubeconfig(), "kube-scheduler (fixtures)");

    // gpumem only (ignoredByScheduler): kube-scheduler's own filters pass both nodes.
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "capture", "namespace": NS},
        "spec": {"schedulerName": PROFILE, "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "main", "image": "local/busybox:1", "imagePullPolicy": "Never",
                "resources": {"limits": {"nvidia.com/gpumem": "2000"}}}]}});
    c.create(&pod).unwrap_or_else(|e| panic!("fixtures: {e}"));
    let mut bodies = std::collections::BTreeMap::new();
    for (recorder, path) in [
        (&ext, "/filter"),
        (&ext, "/prioritize"),
        (&ext, "/bind"),
        (&adm, "/mutate"),
        (&adm, "/validate"),
    ] {
        let body = vgpu_tests::wait_for(
            Duration::from_secs(60),
            &format!("fixtures: a {path} call"),
            || recorder.first(path),
        );
        bodies.insert(path, body);
    }
    settle("kube-scheduler/filter.json", &bodies["/filter"], same_shape);
    settle(
        "kube-scheduler/prioritize.json",
        &bodies["/prioritize"],
        same_shape,
    );
    settle("kube-scheduler/bind.json", &bodies["/bind"], same_shape);
    settle(
        "apiserver/admission-mutate.json",
        &bodies["/mutate"],
        same_review,
    );
    settle(
        "apiserver/admission-validate.json",
        &bodies["/validate"],
        same_review,
    );
    let names = bodies["/filter"]["NodeNames"]
        .as_array()
        .map(Vec::len)
        .unwrap_or(0);
    assert_eq!(
        names, 2,
        "fixtures: kube-scheduler's filter should carry both nodes: {}",
        bodies["/filter"]
    );

    // An Event in a namespace about a cluster-scoped object: refused, with these words.
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "fixture", "namespace": NS},
        "eventTime": "2026-12-06T00:00:00.000000Z", "reportingController": "vgpu.io/fixture",
        "reportingInstance": "fixture", "action": "Admit", "reason": "Fixture", "type": "Warning",
        "note": "fixture", "regarding": {"apiVersion": "v1", "kind": "Namespace", "name": NS}});
    let status = raw_status(
        c,
        &format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"),
        &event,
    );
    settle(
        "apiserver/event-cluster-scoped-in-namespace.json",
        &json!({"request": event, "status": status}),
        |pinned, now| {
            let said = |v: &Value| {
                let s = &v["status"];
                (s["code"].clone(), s["reason"].clone(), s["message"].clone())
            };
            (said(pinned) == said(now))
                .then_some(())
                .ok_or_else(|| format!("{:?} became {:?}", said(pinned), said(now)))
        },
    );
    // A ConfigMap created in a namespace that does not exist: NamespaceLifecycle's 404, which the
    // webhook tells apart from an outage when its ledger namespace is missing.
    let missing = "vgpu-fixture-missing";
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "vgpu-ledger-probe"}});
    let status = raw_status(
        c,
        &format!("/api/v1/namespaces/{missing}/configmaps"),
        &configmap,
    );
    settle(
        "apiserver/create-in-missing-namespace.json",
        &json!({"namespace": missing, "request": configmap, "status": status}),
        |pinned, now| {
            let said = |v: &Value| {
                let s = &v["status"];
                (s["code"].clone(), s["reason"].clone(), s["details"].clone())
            };
            (said(pinned) == said(now))
                .then_some(())
                .ok_or_else(|| format!("{:?} became {:?}", said(pinned), said(now)))
        },
    );
    cleanup(c);
    report("fixtures: kube-scheduler and API server bodies match tests/fixtures");
}

/// POSTs `body` to `path` and returns the API server's `Status` answer, which kubectl prints only
/// at `-v=8` (its own error line rewords the message).
fn raw_status(c: &Cluster, path: &str, body: &Value) -> Value {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), body.to_string()).expect("write body");
    let file = file.path().display().to_string();
    let err = c
        .kubectl(&["create", "--raw", path, "-f", &file, "-v=8"])
        .expect_err("fixtures: the API server took the request");
    let at = err
        .find("\"Response Body\"")
        .unwrap_or_else(|| panic!("fixtures: no response body in {err}"));
    let line = err[at..]
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("fixtures: no response body in {err}"));
    serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("fixtures: {e}: {line}"))
}

fn cleanup(c: &Cluster) {
    for what in [
        format!("mutatingwebhookconfiguration/{RECORDER_WEBHOOKS}"),
        format!("validatingwebhookconfiguration/{RECORDER_WEBHOOKS}"),
        format!("node/{NODE}"),
        format!("namespace/{NS}"),
    ] {
        c.delete(&[what.as_str()]);
    }
}

/// The kubelet's calls for one container, from the device plugin's log: GetPreferredAllocation's
/// arguments and answer, and the ids Allocate then carried.
pub fn check_kubelet_calls(plugin_output: &[String], pod: &str) {
    let field = |line: &str, key: &str| -> Option<String> {
        let at = line.find(&format!(" {key}="))? + key.len() + 2;
        let rest = &line[at..];
        let end = if rest.starts_with('[') {
            rest.find(']')? + 1
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        Some(rest[..end].to_string())
    };
    let shown = || plugin_output.join("\n");
    let at = plugin_output
        .iter()
        .position(|l| l.contains(" allocated") && l.contains(pod))
        .unwrap_or_else(|| panic!("fixtures: no Allocate for {pod}:\n{}", shown()));
    let allocated = &plugin_output[at];
    // The kubelet's GetPreferredAllocation for that container: the last one before its Allocate.
    let preferred = plugin_output[..at]
        .iter()
        .rfind(|l| l.contains("preferred allocation"))
        .unwrap_or_else(|| {
            panic!(
                "fixtures: the kubelet never called GetPreferredAllocation:\n{}",
                shown()
            )
        });
    let calls = |what: &str| plugin_output.iter().filter(|l| l.contains(what)).count();
    assert_eq!(
        (calls("preferred allocation"), calls(" allocated")),
        (1, 1),
        "fixtures: one GetPreferredAllocation and one Allocate for the first pod:\n{}",
        shown()
    );
    let ids = |s: Option<String>| -> Vec<String> {
        s.unwrap_or_default()
            .trim_matches(|c| c == '[' || c == ']')
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(|s| s.trim_matches('"').to_string())
            .collect()
    };
    let offered = ids(field(preferred, "preferred"));
    let got = ids(field(allocated, "ids"));
    let captured = json!({
        "getPreferredAllocation": {
            "mustInclude": ids(field(preferred, "must_include")),
            "size": field(preferred, "size").and_then(|s| s.parse::<u64>().ok()),
        },
        "allocateCount": got.len(),
        "allocateUsesThePreferredIds": offered == got,
    });
    settle(
        "kubelet/one-gpu-container.json",
        &captured,
        |pinned, now| {
            (pinned == now)
                .then_some(())
                .ok_or_else(|| "the calls differ".to_string())
        },
    );
}
