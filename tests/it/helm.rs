//! The Helm chart, rendered by a real `helm` binary with several values sets and checked offline:
//! every document parses and round-trips through the typed Kubernetes API structs (so a misplaced
//! or misspelt field fails), kinds exist in Kubernetes 1.28+, selectors select, the webhook
//! configurations point at the Service and carry (or receive) the CA, their CEL match condition
//! selects exactly the vGPU pods, and RBAC grants exactly what `vgpu_core::rbac` lists.
//!
//! `helm` is found through `$HELM`, then `.ci/tools/bin/helm` (what `.ci/run` installs), then
//! `PATH`. Without one the test says so and passes, unless `VGPU_REQUIRE_HELM` is set (CI sets it).

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;
use vgpu_core::rbac::{self, Scope};
use vgpu_tests::certs::TestPki;

use vgpu_tests::helm::{args, helm, Chart, NAMESPACE, RELEASE};

const KUBE_VERSION: &str = "1.28.3";

fn render(helm: &PathBuf, sets: &[&str]) -> Vec<Value> {
    Chart::render(helm, KUBE_VERSION, sets).docs
}

/// Deserializes into the typed struct and serializes back: any field the API does not know (or
/// that sits at the wrong level, or has the wrong type) is lost or fails, and the comparison shows it.
fn round_trip<T: DeserializeOwned + Serialize>(doc: &Value) -> Value {
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} {}: {e}", doc["kind"], doc["metadata"]["name"]));
    serde_json::to_value(typed).expect("serialize")
}

fn check_typed(doc: &Value) {
    use k8s_openapi::api::{
        admissionregistration::v1 as adm, apps::v1 as apps, batch::v1 as batch, core::v1 as core,
        policy::v1 as policy, rbac::v1 as rbac_v1,
    };
    let api = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let back = match (api, kind) {
        ("v1", "ServiceAccount") => round_trip::<core::ServiceAccount>(doc),
        ("v1", "ConfigMap") => round_trip::<core::ConfigMap>(doc),
        ("v1", "Service") => round_trip::<core::Service>(doc),
        ("apps/v1", "Deployment") => round_trip::<apps::Deployment>(doc),
        ("apps/v1", "DaemonSet") => round_trip::<apps::DaemonSet>(doc),
        ("policy/v1", "PodDisruptionBudget") => round_trip::<policy::PodDisruptionBudget>(doc),
        ("batch/v1", "Job") => round_trip::<batch::Job>(doc),
        ("batch/v1", "CronJob") => round_trip::<batch::CronJob>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => round_trip::<rbac_v1::ClusterRole>(doc),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            round_trip::<rbac_v1::ClusterRoleBinding>(doc)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => round_trip::<rbac_v1::Role>(doc),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => round_trip::<rbac_v1::RoleBinding>(doc),
        ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
            round_trip::<adm::MutatingWebhookConfiguration>(doc)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            round_trip::<adm::ValidatingWebhookConfiguration>(doc)
        }
        ("resource.k8s.io/v1", "DeviceClass") => {
            round_trip::<k8s_openapi::api::resource::v1::DeviceClass>(doc)
        }
        // cert-manager's CRDs (not in k8s-openapi): only these kinds are expected.
        ("cert-manager.io/v1", "Issuer" | "Certificate") => return,
        other => panic!("unexpected kind {other:?}: not a stable API of Kubernetes 1.28+"),
    };
    assert_eq!(
        normalize(doc.clone()),
        normalize(back),
        "{kind} {} has fields the API does not know",
        doc["metadata"]["name"]
    );
}

/// Drops empty objects/arrays and nulls, which typed serialization may omit.
fn normalize(v: Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.into_iter()
                .map(|(k, v)| (k, normalize(v)))
                .filter(|(_, v)| !is_empty(v))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(normalize).collect()),
        other => other,
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn selects(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| &labels[k] == v))
}

/// The generic checks every values set must pass.
fn check_common(chart: &Chart) {
    for d in &chart.docs {
        check_typed(d);
    }
    let service_accounts: BTreeSet<&str> = chart
        .all("ServiceAccount")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    for (w, tmpl) in chart.workloads() {
        let name = &w["metadata"]["name"];
        let labels = &tmpl["metadata"]["labels"];
        if w["kind"] == "Deployment" || w["kind"] == "DaemonSet" {
            assert!(
                selects(&w["spec"]["selector"]["matchLabels"], labels),
                "{name}: selector does not match its pod labels"
            );
        }
        let sa = tmpl["spec"]["serviceAccountName"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no serviceAccountName"));
        assert!(
            service_accounts.contains(sa),
            "{name}: ServiceAccount {sa} missing"
        );
        if let Some(terms) = tmpl["spec"]["affinity"]["podAntiAffinity"]
            ["preferredDuringSchedulingIgnoredDuringExecution"]
            .as_array()
        {
            for t in terms {
                assert!(
                    selects(
                        &t["podAffinityTerm"]["labelSelector"]["matchLabels"],
                        labels
                    ),
                    "{name}: anti-affinity does not select its own replicas"
                );
            }
        }
        // SECURITY.md: no privileged container, no privilege escalation, every capability
        // dropped, read-only root filesystems, RuntimeDefault seccomp, non-root except the
        // device plugin (it writes the kubelet's device-plugin directory). Init containers too.
        let pod = &tmpl["spec"];
        let containers = pod["containers"].as_array().into_iter().flatten();
        let inits = pod["initContainers"].as_array().into_iter().flatten();
        for c in containers.chain(inits) {
            let sc = &c["securityContext"];
            let cname = &c["name"];
            assert_eq!(
                sc["allowPrivilegeEscalation"], false,
                "{name}/{cname}: privilege escalation allowed"
            );
            assert_ne!(sc["privileged"], true, "{name}/{cname}: privileged");
            assert!(
                sc["capabilities"]["drop"]
                    .as_array()
                    .is_some_and(|d| d.contains(&json!("ALL"))),
                "{name}/{cname}: capabilities not all dropped"
            );
            assert_eq!(
                sc["readOnlyRootFilesystem"], true,
                "{name}/{cname}: writable root filesystem"
            );
            let either = |key: &str| {
                if sc[key].is_null() {
                    pod["securityContext"][key].clone()
                } else {
                    sc[key].clone()
                }
            };
            assert_eq!(
                either("seccompProfile")["type"],
                "RuntimeDefault",
                "{name}/{cname}: no RuntimeDefault seccomp profile"
            );
            // The node agents write the kubelet's root-owned directories.
            if name != "vgpu-device-plugin" && name != "vgpu-dra-plugin" {
                assert_eq!(
                    either("runAsNonRoot"),
                    true,
                    "{name}/{cname}: may run as root"
                );
            }
        }
    }
    for s in chart.all("Service") {
        assert!(
            chart
                .workloads()
                .iter()
                .any(|(_, t)| selects(&s["spec"]["selector"], &t["metadata"]["labels"])),
            "Service {} selects no pods",
            s["metadata"]["name"]
        );
        for p in s["spec"]["ports"].as_array().into_iter().flatten() {
            let target = p["targetPort"].as_str().unwrap_or_default();
            assert!(
                chart.workloads().iter().any(|(_, t)| {
                    selects(&s["spec"]["selector"], &t["metadata"]["labels"])
                        && t["spec"]["containers"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                            .any(|cp| cp["name"] == target)
                }),
                "Service {} targets port {target} that no selected container names",
                s["metadata"]["name"]
            );
        }
    }
    for pdb in chart.all("PodDisruptionBudget") {
        assert!(chart.workloads().iter().any(|(_, t)| selects(
            &pdb["spec"]["selector"]["matchLabels"],
            &t["metadata"]["labels"]
        )));
    }
    check_rbac(chart);
}

/// One granted verb: (scope, group, resource, names, verb).
type Grant = (String, String, String, Vec<String>, String);

fn grants_of(rules: &Value, scope: &str) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules.as_array().into_iter().flatten() {
        let list = |k: &str| -> Vec<String> {
            let mut v: Vec<String> = r[k]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s.as_str().map(String::from))
                .collect();
            v.sort();
            v
        };
        for g in list("apiGroups") {
            for res in list("resources") {
                for verb in list("verbs") {
                    out.insert((
                        scope.into(),
                        g.clone(),
                        res.clone(),
                        list("resourceNames"),
                        verb,
                    ));
                }
            }
        }
    }
    out
}

fn check_rbac(chart: &Chart) {
    let placeholders: BTreeMap<&str, String> = [
        (
            rbac::SCHEDULER_NAME_PLACEHOLDER,
            chart_value(chart, "schedulerName"),
        ),
        (
            rbac::SECRET_NAME_PLACEHOLDER,
            chart_value(chart, "secretName"),
        ),
        (rbac::MUTATING_NAME_PLACEHOLDER, format!("{RELEASE}-mutate")),
        (
            rbac::VALIDATING_NAME_PLACEHOLDER,
            format!("{RELEASE}-validate"),
        ),
    ]
    .into_iter()
    .collect();
    for component in rbac::ALL {
        let sa = format!("{RELEASE}-{}", component.service_account);
        if chart
            .all("ServiceAccount")
            .all(|d| d["metadata"]["name"] != sa.as_str())
        {
            // The certs ServiceAccount exists only with certs.mode=job.
            assert_eq!(
                component.service_account, "certs",
                "ServiceAccount {sa} missing"
            );
            continue;
        }
        let mut granted = BTreeSet::new();
        let mut builtin = BTreeSet::new();
        for b in chart
            .docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRoleBinding" || d["kind"] == "RoleBinding")
        {
            let bound = b["subjects"].as_array().into_iter().flatten().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == sa.as_str()
                    && s["namespace"] == NAMESPACE
            });
            if !bound {
                continue;
            }
            let role_kind = b["roleRef"]["kind"].as_str().unwrap_or_default();
            let role_name = b["roleRef"]["name"].as_str().unwrap_or_default();
            let binding_ns = b["metadata"]["namespace"].as_str();
            let role = chart.all(role_kind).find(|r| {
                r["metadata"]["name"] == role_name
                    && (role_kind == "ClusterRole"
                        || r["metadata"]["namespace"].as_str() == binding_ns)
            });
            let Some(role) = role else {
                builtin.insert(match role_kind {
                    "ClusterRole" => format!("ClusterRole/{role_name}"),
                    _ => format!("{}/Role/{role_name}", binding_ns.unwrap_or_default()),
                });
                continue;
            };
            let scope = match (b["kind"].as_str(), binding_ns) {
                (Some("ClusterRoleBinding"), _) => "Cluster",
                (_, Some(NAMESPACE)) => "ReleaseNamespace",
                (_, ns) => panic!("{sa} has its own Role bound in namespace {ns:?}"),
            };
            granted.extend(grants_of(&role["rules"], scope));
        }
        let mut expected = BTreeSet::new();
        let dra = chart.all("DeviceClass").next().is_some();
        for a in component.rules.iter().filter(|a| dra || !a.dra_only) {
            let scope = match a.scope {
                Scope::Cluster => "Cluster",
                Scope::ReleaseNamespace => "ReleaseNamespace",
            };
            let mut names: Vec<String> = a
                .names
                .iter()
                .map(|n| {
                    placeholders
                        .get(n)
                        .cloned()
                        .unwrap_or_else(|| n.to_string())
                })
                .collect();
            names.sort();
            for v in a.verbs {
                expected.insert((
                    scope.to_string(),
                    a.group.to_string(),
                    a.resource.to_string(),
                    names.clone(),
                    v.to_string(),
                ));
            }
        }
        // With scheduler.extender.tls.enabled the certs Jobs also renew the extender's Secret:
        // the same grant as the webhook's, on that one name.
        if component.service_account == "certs" {
            if let Some(secret) = scheduler_tls_secret(chart) {
                for verb in ["get", "update"] {
                    expected.insert((
                        "ReleaseNamespace".to_string(),
                        String::new(),
                        "secrets".to_string(),
                        vec![secret.clone()],
                        verb.to_string(),
                    ));
                }
            }
        }
        assert_eq!(
            granted, expected,
            "RBAC of {sa} differs from vgpu_core::rbac"
        );
        let expected_builtin: BTreeSet<String> = component
            .builtin_roles
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(builtin, expected_builtin, "built-in roles bound to {sa}");
    }
}

/// The Secret the scheduler's extender serves HTTPS from, if the chart turned HTTPS on.
fn scheduler_tls_secret(chart: &Chart) -> Option<String> {
    let vols = &chart.get("Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["volumes"];
    vols.as_array()?
        .iter()
        .find(|v| v["name"] == "extender-tls")
        .and_then(|v| v["secret"]["secretName"].as_str())
        .map(String::from)
}

/// Values the chart was rendered with, read back from what it rendered.
fn chart_value(chart: &Chart, key: &str) -> String {
    match key {
        "schedulerName" => {
            let cm = chart.get("ConfigMap", &format!("{RELEASE}-scheduler"));
            let cfg: Value =
                serde_yaml::from_str(cm["data"]["config.yaml"].as_str().unwrap()).unwrap();
            cfg["profiles"][0]["schedulerName"]
                .as_str()
                .unwrap()
                .to_string()
        }
        "secretName" => {
            let d = chart.get("Deployment", &format!("{RELEASE}-webhook"));
            d["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "tls")
                .unwrap()["secret"]["secretName"]
                .as_str()
                .unwrap()
                .to_string()
        }
        _ => unreachable!(),
    }
}

/// Evaluates a webhook's CEL match condition against a pod, as the API server does.
fn matches(expression: &str, pod: &Value) -> bool {
    let program = cel::Program::compile(expression)
        .unwrap_or_else(|e| panic!("matchCondition does not compile: {e}\n{expression}"));
    let mut ctx = cel::Context::default();
    ctx.add_variable("object", pod.clone()).unwrap();
    match program.execute(&ctx) {
        Ok(cel::Value::Bool(b)) => b,
        other => panic!("matchCondition gave {other:?} for {pod}"),
    }
}

fn pod(containers: Value, init: Option<Value>) -> Value {
    let mut spec = json!({"containers": containers});
    if let Some(i) = init {
        spec["initContainers"] = i;
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec})
}

/// Checks the two webhook configurations against the Service, the CA and the resource names.
fn check_webhooks(chart: &Chart, resource: &str, mem: &str) {
    let svc = chart.get("Service", &format!("{RELEASE}-webhook"));
    for (kind, name, path) in [
        (
            "MutatingWebhookConfiguration",
            format!("{RELEASE}-mutate"),
            "/mutate",
        ),
        (
            "ValidatingWebhookConfiguration",
            format!("{RELEASE}-validate"),
            "/validate",
        ),
    ] {
        let cfg = chart.get(kind, &name);
        let hooks = cfg["webhooks"].as_array().unwrap();
        // With dra.enabled the validating configuration also has the claims webhook (checked in
        // chart_turns_on_dra_mode); the pods' comes first.
        let dra = chart.all("DeviceClass").next().is_some();
        // With dra.enabled the mutating configuration also has the DRA namespaces' webhook.
        assert_eq!(hooks.len(), 1 + usize::from(dra));
        let w = &hooks[0];
        let target = &w["clientConfig"]["service"];
        assert_eq!(
            target["name"], svc["metadata"]["name"],
            "{kind}: wrong Service"
        );
        assert_eq!(target["namespace"], NAMESPACE);
        assert_eq!(target["path"], path);
        assert!(svc["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == target["port"]));
        assert_eq!(w["admissionReviewVersions"], json!(["v1"]));
        assert_eq!(w["sideEffects"], "NoneOnDryRun");
        assert_eq!(w["timeoutSeconds"], 5);
        assert_eq!(w["failurePolicy"], "Fail");
        assert_eq!(w["namespaceSelector"]["matchLabels"]["vgpu"], "enabled");
        if kind.starts_with("Mutating") {
            assert_eq!(w["reinvocationPolicy"], "IfNeeded");
            assert_eq!(w["rules"][0]["operations"], json!(["CREATE"]));
        } else {
            // UPDATE too: the reserved annotations and the managed label are checked there.
            assert_eq!(w["rules"][0]["operations"], json!(["CREATE", "UPDATE"]));
        }
        let cel = w["matchConditions"][0]["expression"].as_str().unwrap();
        let limits =
            |r: &str| json!([{"name": "c", "image": "i", "resources": {"limits": {r: "1"}}}]);
        assert!(
            matches(cel, &pod(limits(resource), None)),
            "{kind}: gpu pod not matched"
        );
        assert!(matches(
            cel,
            &pod(
                json!([{"name": "c", "image": "i", "resources": {"requests": {mem: "4096"}}}]),
                None
            )
        ));
        assert!(matches(
            cel,
            &pod(json!([{"name": "c", "image": "i"}]), Some(limits(resource)))
        ));
        assert!(!matches(
            cel,
            &pod(json!([{"name": "c", "image": "i"}]), None)
        ));
        assert!(
            !matches(cel, &pod(limits("cpu"), None)),
            "{kind}: blocks non-GPU pods"
        );
        assert!(!matches(
            cel,
            &pod(
                json!([{"name": "c", "image": "i", "resources": {}}]),
                Some(json!([]))
            )
        ));
    }
}

fn ca_bundle(chart: &Chart, kind: &str, name: &str) -> Value {
    chart.get(kind, name)["webhooks"][0]["clientConfig"]["caBundle"].clone()
}

#[test]
fn chart_renders_and_wires_up_for_every_values_set() {
    let Some(helm) = helm() else {
        assert!(
            std::env::var_os("VGPU_REQUIRE_HELM").is_none(),
            "VGPU_REQUIRE_HELM is set but no helm binary was found"
        );
        eprintln!(
            "SKIPPED: no helm binary ($HELM, .ci/tools/bin/helm or PATH); run .ci/install-tools"
        );
        return;
    };
    let mutate = format!("{RELEASE}-mutate");
    let validate = format!("{RELEASE}-validate");

    // Defaults: certificates from the Jobs.
    let chart = Chart {
        docs: render(&helm, &[]),
    };
    check_common(&chart);
    check_webhooks(&chart, "nvidia.com/gpu", "nvidia.com/gpumem");
    let inject = args(chart.container("Job", "vgpu-certs-inject", "inject"));
    assert!(
        inject.contains(&format!("--mutating={mutate}"))
            && inject.contains(&format!("--validating={validate}"))
    );
    let generate =
        args(&chart.get("Job", "vgpu-certs-generate")["spec"]["template"]["spec"]["containers"][0]);
    assert!(
        generate.contains(&"--service=vgpu-webhook".to_string()),
        "{generate:?}"
    );
    assert!(generate.contains(&"--namespace=vgpu-system".to_string()));
    assert!(generate.contains(&"--secret=vgpu-webhook-tls".to_string()));
    let hooks = &chart.get("Job", "vgpu-certs-generate")["metadata"]["annotations"]["helm.sh/hook"];
    assert_eq!(
        hooks, "pre-install,pre-upgrade",
        "the Secret must exist before the webhook pods"
    );
    assert!(chart
        .all("CronJob")
        .any(|c| c["metadata"]["name"] == "vgpu-certs-renew"));
    let dp = args(chart.container("DaemonSet", "vgpu-device-plugin", "device-plugin"));
    assert!(dp.contains(&"--split-count=10".to_string()), "{dp:?}");
    assert!(
        dp.contains(&"--gpu-core-policy=force".to_string()),
        "{dp:?}"
    );
    let ds = chart.get("DaemonSet", "vgpu-device-plugin");
    assert_eq!(ds["spec"]["template"]["spec"]["nodeSelector"]["gpu"], "on");
    let ks = chart.container("Deployment", "vgpu-scheduler", "kube-scheduler");
    assert_eq!(
        ks["image"],
        format!("registry.k8s.io/kube-scheduler:v{KUBE_VERSION}")
    );
    // The webhook pods get the serving pair, not the CA key the Job's Secret also holds.
    let webhook_pod = &chart.get("Deployment", "vgpu-webhook")["spec"]["template"]["spec"];
    let tls = volume_at(
        webhook_pod,
        chart.container("Deployment", "vgpu-webhook", "webhook"),
        "/tls",
    );
    assert_eq!(
        tls["secret"]["items"],
        json!([{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}])
    );
    // Every pod the chart makes (the certificate Jobs and CronJob too) can pull from a private
    // registry.
    let pulling = Chart {
        docs: render(&helm, &["global.imagePullSecrets[0].name=regcred"]),
    };
    for (w, tmpl) in pulling.workloads() {
        assert_eq!(
            tmpl["spec"]["imagePullSecrets"],
            json!([{"name": "regcred"}]),
            "{}: no imagePullSecrets",
            w["metadata"]["name"]
        );
    }
    let sched_cfg: Value = serde_yaml::from_str(
        chart.get("ConfigMap", "vgpu-scheduler")["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(sched_cfg["profiles"][0]["schedulerName"], "vgpu-scheduler");
    assert_eq!(sched_cfg["leaderElection"]["leaderElect"], true);
    // kube-scheduler's adaptive sample of the fitting nodes (docs/scheduler.md, issue 39), of
    // which the extender (chooseNode) passes only its policy's best.
    assert_eq!(sched_cfg["percentageOfNodesToScore"], 0);
    let managed: Vec<&str> = sched_cfg["extenders"][0]["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        managed,
        [
            "nvidia.com/gpu",
            "nvidia.com/gpumem",
            "nvidia.com/gpumem-percentage",
            "nvidia.com/gpucores",
            "nvidia.com/priority"
        ]
    );
    let extender = args(chart.container("Deployment", "vgpu-scheduler", "vgpu-scheduler"));
    let port = sched_cfg["extenders"][0]["urlPrefix"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    assert!(
        extender.contains(&format!("--listen=127.0.0.1:{port}")),
        "{extender:?}"
    );
    assert!(
        extender.contains(&"--choose-node=true".to_string()),
        "{extender:?}"
    );
    let webhook_cfg = chart.get("ConfigMap", "vgpu-webhook")["data"]["config.yaml"]
        .as_str()
        .unwrap();
    let parsed =
        vgpu_webhook::config::ConfigFile::parse(webhook_cfg, std::path::Path::new("config.yaml"))
            .unwrap_or_else(|e| panic!("the webhook would refuse the chart's config: {e}"));
    assert_eq!(parsed.resource_names.gpu, "nvidia.com/gpu");
    // The writers of the reserved annotations are exactly the scheduler's and the device
    // plugin's service accounts, as the API server names them in userInfo.
    let writer = |sa: &str| {
        let sa = chart.get("ServiceAccount", sa);
        format!(
            "system:serviceaccount:{}:{}",
            sa["metadata"]["namespace"].as_str().unwrap(),
            sa["metadata"]["name"].as_str().unwrap()
        )
    };
    assert_eq!(
        parsed.policy.annotation_writers,
        vec![writer("vgpu-scheduler"), writer("vgpu-device-plugin")]
    );
    for (kind, name) in [
        ("Deployment", "vgpu-scheduler"),
        ("DaemonSet", "vgpu-device-plugin"),
    ] {
        let spec = &chart.get(kind, name)["spec"]["template"]["spec"];
        assert_eq!(
            spec["serviceAccountName"],
            chart.get("ServiceAccount", name)["metadata"]["name"]
        );
    }

    // cert-manager: no Jobs, cert-manager injects the CA into both configurations.
    let chart = Chart {
        docs: render(&helm, &["certs.mode=cert-manager"]),
    };
    check_common(&chart);
    check_webhooks(&chart, "nvidia.com/gpu", "nvidia.com/gpumem");
    assert_eq!(chart.all("Job").count() + chart.all("CronJob").count(), 0);
    let cert = chart.get("Certificate", "vgpu-webhook");
    assert_eq!(cert["spec"]["secretName"], "vgpu-webhook-tls");
    assert!(cert["spec"]["dnsNames"]
        .as_array()
        .unwrap()
        .contains(&json!("vgpu-webhook.vgpu-system.svc")));
    assert_eq!(cert["spec"]["renewBefore"], "720h");
    for (kind, name) in [
        ("MutatingWebhookConfiguration", &mutate),
        ("ValidatingWebhookConfiguration", &validate),
    ] {
        assert_eq!(
            chart.get(kind, name)["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "vgpu-system/vgpu-webhook"
        );
    }

    // Provided certificates, renamed resources, a mirror registry, other split count.
    let chart = Chart {
        docs: render(
            &helm,
            &[
                "certs.mode=provided",
                "certs.caBundle=Q0E=",
                "certs.secretName=my-tls",
                "resourceName=example.com/vgpu",
                "resourceMem=example.com/vgpu-memory",
                "schedulerName=gpu-sharing",
                "global.imageRegistry=mirror.example",
                "scheduler.kubeScheduler.image.registry=mirror.example",
                "devicePlugin.deviceSplitCount=4",
                "scheduler.kubeScheduler.imageTag=v1.31.0",
                "disableControlNamespaces={ml-admin,ops}",
                "presetNodeNameNamespaces={ops}",
                "devicePlugin.gpuCorePolicy=default",
            ],
        ),
    };
    check_common(&chart);
    check_webhooks(&chart, "example.com/vgpu", "example.com/vgpu-memory");
    assert_eq!(
        ca_bundle(&chart, "MutatingWebhookConfiguration", &mutate),
        "Q0E="
    );
    assert_eq!(
        ca_bundle(&chart, "ValidatingWebhookConfiguration", &validate),
        "Q0E="
    );
    let dp = chart.container("DaemonSet", "vgpu-device-plugin", "device-plugin");
    assert!(args(dp).contains(&"--split-count=4".to_string()));
    assert!(args(dp).contains(&"--resource-name=example.com/vgpu".to_string()));
    // The namespaces that may lift a limit reach both the device plugin and the webhook.
    assert!(args(dp).contains(&"--disable-control-namespaces=ml-admin,ops".to_string()));
    assert!(args(dp).contains(&"--gpu-core-policy=default".to_string()));
    let webhook_cfg: Value = serde_yaml::from_str(
        chart.get("ConfigMap", "vgpu-webhook")["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        webhook_cfg["policy"]["disableControlNamespaces"],
        serde_json::json!(["ml-admin", "ops"])
    );
    assert_eq!(
        webhook_cfg["policy"]["presetNodeNameNamespaces"],
        serde_json::json!(["ops"])
    );
    assert_eq!(dp["image"], "mirror.example/vgpu/vgpu-device-plugin:0.1.0");
    let ks = chart.container("Deployment", "vgpu-scheduler", "kube-scheduler");
    assert_eq!(ks["image"], "mirror.example/kube-scheduler:v1.31.0");
    let wh = args(chart.container("Deployment", "vgpu-webhook", "webhook"));
    assert!(wh.contains(&"--scheduler-name=gpu-sharing".to_string()));
    // The extender reads the renamed resources too (else it would see no vGPU request).
    let ext = args(chart.container("Deployment", "vgpu-scheduler", "vgpu-scheduler"));
    for flag in [
        "--resource-gpu=example.com/vgpu",
        "--resource-gpumem=example.com/vgpu-memory",
    ] {
        assert!(ext.contains(&flag.to_string()), "{flag} missing: {ext:?}");
    }
    <vgpu_scheduler::cli::Cli as clap::Parser>::try_parse_from(
        std::iter::once("vgpu-scheduler".to_string()).chain(ext.iter().cloned()),
    )
    .unwrap_or_else(|e| panic!("the extender refuses the chart's arguments: {e}"));
}

/// A container's volume mounted at `path`, resolved to its volume in the pod spec.
fn volume_at<'a>(pod: &'a Value, container: &Value, path: &str) -> &'a Value {
    let mount = container["volumeMounts"]
        .as_array()
        .and_then(|ms| ms.iter().find(|m| m["mountPath"] == path))
        .unwrap_or_else(|| panic!("nothing mounted at {path}: {container}"));
    pod["volumes"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == mount["name"]))
        .unwrap_or_else(|| panic!("no volume {} in the pod", mount["name"]))
}

fn extender_config(chart: &Chart) -> Value {
    let cfg: Value = serde_yaml::from_str(
        chart.get("ConfigMap", "vgpu-scheduler")["data"]["config.yaml"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    cfg["extenders"][0].clone()
}

/// `scheduler.extender.tls.enabled` and `webhook.clientCA`: kube-scheduler calls the extender
/// over HTTPS, trusting the CA of a certificate for localhost that the chart's certificate
/// machinery makes; the webhook requires the API server's client certificate. Default: neither.
#[test]
fn chart_turns_on_extender_https_and_webhook_client_certificates() {
    use clap::Parser as _;
    let Some(helm) = helm() else {
        eprintln!("SKIPPED: no helm binary");
        return;
    };
    let chart = Chart {
        docs: render(&helm, &[]),
    };
    let ext = extender_config(&chart);
    assert_eq!(ext["enableHTTPS"], false);
    assert!(ext["urlPrefix"]
        .as_str()
        .unwrap()
        .starts_with("http://127.0.0.1:"));
    assert!(ext.get("tlsConfig").is_none());
    let sched = args(chart.container("Deployment", "vgpu-scheduler", "vgpu-scheduler"));
    assert!(!sched.iter().any(|a| a.starts_with("--tls-")), "{sched:?}");
    let wh = chart.container("Deployment", "vgpu-webhook", "webhook");
    assert!(!args(wh).iter().any(|a| a.starts_with("--client-ca")));
    assert_eq!(wh["readinessProbe"]["httpGet"]["path"], "/readyz");

    let client_ca = TestPki::new(&[]).ca_pem;
    let ca_set = format!("webhook.clientCA={client_ca}");
    for mode in ["job", "cert-manager"] {
        let mode_set = format!("certs.mode={mode}");
        let chart = Chart {
            docs: render(
                &helm,
                &["scheduler.extender.tls.enabled=true", &mode_set, &ca_set],
            ),
        };
        check_common(&chart);
        let ext = extender_config(&chart);
        assert_eq!(ext["enableHTTPS"], true);
        let prefix = ext["urlPrefix"].as_str().unwrap();
        assert!(prefix.starts_with("https://127.0.0.1:"), "{prefix}");
        assert_eq!(ext["tlsConfig"]["serverName"], "localhost");
        let ca_file = ext["tlsConfig"]["caFile"].as_str().unwrap();

        let deploy = chart.get("Deployment", "vgpu-scheduler");
        let pod = &deploy["spec"]["template"]["spec"];
        let ks = chart.container("Deployment", "vgpu-scheduler", "kube-scheduler");
        let (dir, file) = ca_file.rsplit_once('/').unwrap();
        let ca_vol = volume_at(pod, ks, dir);
        assert_eq!(ca_vol["secret"]["secretName"], "vgpu-scheduler-tls");
        assert_eq!(
            ca_vol["secret"]["items"],
            json!([{"key": "ca.crt", "path": file}])
        );

        let ext_c = chart.container("Deployment", "vgpu-scheduler", "vgpu-scheduler");
        let a = args(ext_c);
        assert!(a.contains(&format!(
            "--listen=127.0.0.1:{}",
            prefix.rsplit(':').next().unwrap()
        )));
        let cert = a
            .iter()
            .find_map(|x| x.strip_prefix("--tls-cert="))
            .unwrap();
        let key = a.iter().find_map(|x| x.strip_prefix("--tls-key=")).unwrap();
        let (cert_dir, _) = cert.rsplit_once('/').unwrap();
        assert_eq!(key.rsplit_once('/').unwrap().0, cert_dir);
        let tls_vol = volume_at(pod, ext_c, cert_dir);
        assert_eq!(tls_vol["secret"]["secretName"], "vgpu-scheduler-tls");
        assert!(
            !tls_vol["secret"]["items"].to_string().contains("ca.key"),
            "the CA key reaches the extender"
        );

        // The certificate is for localhost and 127.0.0.1, made by the chart's machinery.
        match mode {
            "job" => {
                let job = chart.get("Job", "vgpu-certs-generate");
                let g = job["spec"]["template"]["spec"]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["name"] == "generate-scheduler")
                    .expect("a generate-scheduler container");
                let g = args(g);
                for want in [
                    "--dns=localhost",
                    "--ip=127.0.0.1",
                    "--secret=vgpu-scheduler-tls",
                    "--apply",
                ] {
                    assert!(g.contains(&want.to_string()), "{want} missing: {g:?}");
                }
                for kind in ["Job", "CronJob"] {
                    let name = if kind == "Job" {
                        "vgpu-certs-inject"
                    } else {
                        "vgpu-certs-renew"
                    };
                    let d = chart.get(kind, name).to_string();
                    assert!(
                        d.contains("--secret=vgpu-scheduler-tls"),
                        "{kind} {name} does not renew it"
                    );
                }
            }
            _ => {
                let c = chart.get("Certificate", "vgpu-scheduler");
                assert_eq!(c["spec"]["secretName"], "vgpu-scheduler-tls");
                assert!(c["spec"]["dnsNames"]
                    .as_array()
                    .unwrap()
                    .contains(&json!("localhost")));
                assert_eq!(c["spec"]["ipAddresses"], json!(["127.0.0.1"]));
            }
        }

        // The webhook: --client-ca pointing at a ConfigMap holding exactly the given PEM.
        let wh = chart.container("Deployment", "vgpu-webhook", "webhook");
        let wa = args(wh);
        let ca = wa
            .iter()
            .find_map(|x| x.strip_prefix("--client-ca="))
            .unwrap();
        let (ca_dir, ca_name) = ca.rsplit_once('/').unwrap();
        let wpod = &chart.get("Deployment", "vgpu-webhook")["spec"]["template"]["spec"];
        let cm_name = volume_at(wpod, wh, ca_dir)["configMap"]["name"]
            .as_str()
            .unwrap();
        let cm = chart.get("ConfigMap", cm_name);
        assert_eq!(
            cm["data"][ca_name].as_str().unwrap().trim(),
            client_ca.trim()
        );
        // The kubelet's probes carry no client certificate: they use the plain health port.
        assert_eq!(wh["readinessProbe"]["httpGet"]["port"], "health", "{wh}");
        assert!(
            wa.contains(&"--health-listen=0.0.0.0:8081".to_string()),
            "{wa:?}"
        );
        assert!(wh["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "health" && p["containerPort"] == 8081));
        // The real webhook accepts the flags the chart writes.
        let cli = vgpu_webhook::cli::Cli::try_parse_from(
            std::iter::once("vgpu-webhook".to_string()).chain(wa.iter().cloned()),
        )
        .unwrap_or_else(|e| panic!("the webhook refuses the chart's arguments: {e}"));
        let s = cli.settings().err();
        // settings() reads --config, which exists only in the pod; the flags themselves parsed.
        assert!(s.is_some_and(|e| e.to_string().contains("/config/config.yaml")));
        assert_eq!(cli.client_ca.as_deref(), Some(std::path::Path::new(ca)));
    }
}

#[test]
fn chart_refuses_values_that_cannot_work() {
    let Some(helm) = helm() else {
        eprintln!("SKIPPED: no helm binary");
        return;
    };
    let chart = vgpu_tests::repo_root().join("helm/vgpu");
    for (set, message) in [
        (
            "certs.mode=bogus",
            "certs.mode must be job, cert-manager or provided",
        ),
        (
            "certs.mode=provided",
            "certs.caBundle (base64 PEM) is required",
        ),
        (
            "devicePlugin.deviceSplitCount=0",
            "deviceSplitCount must be at least 1",
        ),
        (
            "devicePlugin.deviceSplitCount=1001",
            "deviceSplitCount must be at most 1000",
        ),
        (
            "devicePlugin.deviceMemoryScaling=0",
            "deviceMemoryScaling must be a positive number",
        ),
        (
            "devicePlugin.backend=amd",
            "devicePlugin.backend must be nvidia or dcu",
        ),
        (
            "scheduler.extender.nodePolicy=fgd",
            "scheduler.extender.nodePolicy must be one of",
        ),
        (
            "scheduler.extender.gpuPolicy=foo",
            "scheduler.extender.gpuPolicy must be one of",
        ),
        (
            "scheduler.percentageOfNodesToScore=101",
            "scheduler.percentageOfNodesToScore must be a whole number from 0",
        ),
        (
            "scheduler.percentageOfNodesToScore=-5",
            "scheduler.percentageOfNodesToScore must be a whole number from 0",
        ),
        (
            "scheduler.extender.chooseNode=yes",
            "scheduler.extender.chooseNode must be true or false",
        ),
        (
            "webhook.idleTimeout=1h",
            "webhook.idleTimeout must be a positive whole number",
        ),
        (
            "webhook.headerReadTimeout=0s",
            "webhook.headerReadTimeout must be a positive whole number",
        ),
        (
            "certs.renewBefore=2w",
            "certs.renewBefore must be a whole number of d, h, m or s",
        ),
        (
            "dra.enabled=true",
            "dra.enabled needs Kubernetes 1.34 or newer (resource.k8s.io/v1), not v1.30.0",
        ),
    ] {
        let out = Command::new(&helm)
            .args(["template", RELEASE])
            .arg(&chart)
            .args(["--kube-version", "1.30.0", "--set", set])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{set} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(message), "{set}: {err}");
    }
}

/// DRA mode (`dra.enabled`): the DeviceClass, the node agent in DRA mode beside the device
/// plugin (each kept to its own nodes), the RBAC of DRA mode, and the claims webhook whose CEL
/// match condition selects exactly the claims and templates of class gpu.vgpu.io.
#[test]
fn chart_turns_on_dra_mode() {
    let Some(helm) = helm() else {
        eprintln!("SKIPPED: no helm binary");
        return;
    };
    let chart = Chart::render(&helm, "1.36.2", &["dra.enabled=true"]);
    check_common(&chart);
    check_webhooks(&chart, "nvidia.com/gpu", "nvidia.com/gpumem");
    let class = chart.get("DeviceClass", "gpu.vgpu.io");
    assert_eq!(
        class["spec"]["selectors"][0]["cel"]["expression"],
        "device.driver == \"gpu.vgpu.io\""
    );
    let dra = args(chart.container("DaemonSet", "vgpu-dra-plugin", "dra-plugin"));
    for want in [
        "--mode=dra",
        "--cdi-dir=/var/run/cdi",
        "--kubelet-plugins-dir=/var/lib/kubelet/plugins",
        "--kubelet-registry-dir=/var/lib/kubelet/plugins_registry",
        "--gpu-cdi-kind=nvidia.com/gpu",
        "--host-dir=/usr/local/vgpu",
    ] {
        assert!(dra.contains(&want.to_string()), "{want}: {dra:?}");
    }
    assert!(
        !dra.iter()
            .any(|a| a.starts_with("--split-count") || a.starts_with("--device-plugin-dir")),
        "{dra:?}"
    );
    let pod = |name: &str| chart.get("DaemonSet", name)["spec"]["template"]["spec"].clone();
    assert_eq!(
        pod("vgpu-dra-plugin")["nodeSelector"],
        json!({"gpu": "on", "vgpu.io/mode": "dra"})
    );
    assert_eq!(
        pod("vgpu-device-plugin")["affinity"]["nodeAffinity"]
            ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
            ["matchExpressions"][0],
        json!({"key": "vgpu.io/mode", "operator": "NotIn", "values": ["dra"]})
    );
    let mounts: Vec<String> = chart.container("DaemonSet", "vgpu-dra-plugin", "dra-plugin")
        ["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap().to_string())
        .collect();
    for p in [
        "/var/lib/kubelet/plugins",
        "/var/lib/kubelet/plugins_registry",
        "/var/run/cdi",
        "/usr/local/vgpu",
    ] {
        assert!(mounts.contains(&p.to_string()), "{p}: {mounts:?}");
    }
    // DRA namespaces (vgpu.io/mode=dra) go to /mutate-dra, the others to /mutate; the pods'
    // validating condition also takes pods whose claims come from templates.
    let mutating = chart.get("MutatingWebhookConfiguration", &format!("{RELEASE}-mutate"));
    let hooks = mutating["webhooks"].as_array().unwrap();
    let mode = |w: &Value| w["namespaceSelector"]["matchExpressions"][0].clone();
    assert_eq!(
        mode(&hooks[0]),
        json!({"key": "vgpu.io/mode", "operator": "NotIn", "values": ["dra"]})
    );
    assert_eq!(hooks[1]["name"], "mutate-dra.vgpu.io");
    assert_eq!(hooks[1]["clientConfig"]["service"]["path"], "/mutate-dra");
    assert_eq!(hooks[1]["sideEffects"], "NoneOnDryRun");
    assert_eq!(
        mode(&hooks[1]),
        json!({"key": "vgpu.io/mode", "operator": "In", "values": ["dra"]})
    );
    assert_eq!(
        hooks[1]["namespaceSelector"]["matchLabels"]["vgpu"],
        "enabled"
    );
    let pods_validating = chart.get(
        "ValidatingWebhookConfiguration",
        &format!("{RELEASE}-validate"),
    );
    let pod_cond = pods_validating["webhooks"][0]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    let dra_pod = |claims: Value| json!({"kind": "Pod", "spec": {"resourceClaims": claims, "containers": [{"name": "c", "image": "i"}]}});
    assert!(matches(
        pod_cond,
        &dra_pod(json!([{"name": "g", "resourceClaimTemplateName": "t"}]))
    ));
    assert!(!matches(
        pod_cond,
        &dra_pod(json!([{"name": "g", "resourceClaimName": "c"}]))
    ));
    // The claims webhook: its match condition against claims and templates, as the API server
    // evaluates it.
    let validating = chart.get(
        "ValidatingWebhookConfiguration",
        &format!("{RELEASE}-validate"),
    );
    let claims = validating["webhooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "validate-claims.vgpu.io")
        .expect("the claims webhook");
    assert_eq!(
        claims["rules"][0]["resources"],
        json!(["resourceclaims", "resourceclaimtemplates"])
    );
    assert!(
        claims.get("namespaceSelector").is_none_or(is_empty),
        "claims need no vgpu label: {claims}"
    );
    let cond = claims["matchConditions"][0]["expression"].as_str().unwrap();
    let request = |class: &str| json!({"name": "gpu", "exactly": {"deviceClassName": class}});
    let claim = |requests: Value| json!({"kind": "ResourceClaim", "spec": {"devices": {"requests": requests}}});
    assert!(matches(cond, &claim(json!([request("gpu.vgpu.io")]))));
    assert!(!matches(cond, &claim(json!([request("gpu.nvidia.com")]))));
    assert!(!matches(
        cond,
        &json!({"kind": "ResourceClaim", "spec": {}})
    ));
    assert!(matches(
        cond,
        &claim(json!([{"name": "gpu", "firstAvailable": [
        {"name": "a", "deviceClassName": "other"}, {"name": "b", "deviceClassName": "gpu.vgpu.io"}]}]))
    ));
    assert!(matches(
        cond,
        &json!({"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [request("gpu.vgpu.io")]}}}})
    ));
    assert!(!matches(
        cond,
        &json!({"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [request("x")]}}}})
    ));
    // Off by default: none of it.
    let default = Chart::render(&helm, "1.36.2", &[]);
    assert!(default.all("DeviceClass").next().is_none());
    assert!(default
        .docs
        .iter()
        .all(|d| d["metadata"]["name"] != "vgpu-dra-plugin"));
}

#[test]
fn install_doc_lists_exactly_the_rbac_in_code() {
    let doc = std::fs::read_to_string(vgpu_tests::repo_root().join("docs/install.md")).unwrap();
    let rows: BTreeSet<String> = doc
        .lines()
        .filter(|l| {
            l.starts_with("| ")
                && l.matches(" | ").count() == 5
                && !l.starts_with("| ServiceAccount")
        })
        .map(String::from)
        .collect();
    let mut expected = BTreeSet::new();
    for c in rbac::ALL {
        for a in c.rules {
            let group = if a.group.is_empty() { "core" } else { a.group };
            let scope = match a.scope {
                Scope::Cluster => "Cluster",
                Scope::ReleaseNamespace => "ReleaseNamespace",
            };
            expected.insert(format!(
                "| {} | {group} | {} | {} | {scope} | {} |",
                c.service_account,
                a.resource,
                a.verbs.join(", "),
                a.why
            ));
        }
    }
    assert_eq!(
        rows, expected,
        "docs/install.md RBAC table differs from vgpu_core::rbac"
    );
}

#[test]
fn dashboard_is_grafana_json_querying_documented_metrics() {
    let root = vgpu_tests::repo_root();
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("helm/vgpu/files/dashboard.json")).unwrap(),
    )
    .expect("dashboard.json is JSON");
    let doc = std::fs::read_to_string(root.join("docs/install.md")).unwrap();
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6);
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            // Every vgpu_ metric the dashboard queries is listed in the metrics table.
            for name in expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("vgpu_"))
            {
                let documented = doc.contains(&format!("`{name}`"))
                    || ["_used_bytes", "_limit_bytes", "_peak_bytes"]
                        .iter()
                        .any(|s| name.ends_with(s) && doc.contains(&format!("`{s}`")));
                assert!(
                    documented,
                    "{name} (panel {}) is not in docs/install.md",
                    p["title"]
                );
            }
        }
    }
}
