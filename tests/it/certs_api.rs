//! The real `vgpu-certs` binary against the fake API server, reached through a kubeconfig as in a
//! cluster (`KUBECONFIG`): the Secret is created once and renewed in place only when due, and
//! `inject` sets the caBundle of both webhook configurations, idempotently, surviving a conflict.

use base64::Engine as _;
use serde_json::json;
use std::process::{Command, Output};
use vgpu_fake_apiserver::FakeApiServer;

const ADM: &str = "admissionregistration.k8s.io/v1";

fn certs(kubeconfig: &std::path::Path, args: &[&str]) -> Output {
    let out = Command::new(vgpu_tests::binary("vgpu-certs"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "vgpu-certs {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn webhook_config(kind: &str, name: &str) -> serde_json::Value {
    json!({"apiVersion": ADM, "kind": kind, "metadata": {"name": name},
        "webhooks": [{"name": format!("{name}.vgpu.io"), "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {"service": {"name": "vgpu-webhook", "namespace": "vgpu-system", "path": "/mutate"}}}]})
}

#[test]
fn generate_applies_the_secret_once_and_inject_sets_both_ca_bundles() {
    let api = FakeApiServer::start_blocking().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    api.create(webhook_config(
        "MutatingWebhookConfiguration",
        "vgpu-mutate",
    ))
    .unwrap();
    api.create(webhook_config(
        "ValidatingWebhookConfiguration",
        "vgpu-validate",
    ))
    .unwrap();
    let out_dir = dir.path().join("certs");
    let out_dir_s = out_dir.to_str().unwrap();
    let generate = [
        "generate",
        "--service",
        "vgpu-webhook",
        "--namespace",
        "vgpu-system",
        "--secret",
        "vgpu-webhook-tls",
        "--apply",
        "--out",
        out_dir_s,
    ];

    certs(&kubeconfig, &generate);
    let secret = api
        .get("v1", "secrets", "vgpu-system", "vgpu-webhook-tls")
        .expect("Secret created");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let b64 = base64::engine::general_purpose::STANDARD;
    let ca_in_secret = b64
        .decode(secret["data"]["ca.crt"].as_str().unwrap())
        .unwrap();
    let ca_file = std::fs::read(out_dir.join("ca.crt")).unwrap();
    assert_eq!(
        ca_in_secret, ca_file,
        "the Secret and the files hold the same CA"
    );
    let leaf = String::from_utf8(
        b64.decode(secret["data"]["tls.crt"].as_str().unwrap())
            .unwrap(),
    )
    .unwrap();
    let parsed = vgpu_certs::inspect::parse_cert(&leaf).unwrap();
    assert!(parsed
        .dns
        .contains(&"vgpu-webhook.vgpu-system.svc".to_string()));
    assert!(!parsed.is_ca);

    // Nothing is due: the Secret is not written again.
    let version = secret["metadata"]["resourceVersion"].clone();
    let again = certs(&kubeconfig, &generate);
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to do"));
    let secret = api
        .get("v1", "secrets", "vgpu-system", "vgpu-webhook-tls")
        .unwrap();
    assert_eq!(secret["metadata"]["resourceVersion"], version);

    // inject: the first PATCH meets a conflict (someone else wrote in between) and is retried.
    api.fail_matching(Some("PATCH"), Some("mutatingwebhookconfigurations"), 1, 409);
    // The chart's RBAC grants get/patch on each configuration for its own kind only: the real API
    // server answers a lookup of the other kind with 403 (this double has no RBAC; it answers so
    // here), which once stopped inject after the mutating configuration.
    api.fail_matching(
        Some("GET"),
        Some("validatingwebhookconfigurations/vgpu-mutate"),
        10,
        403,
    );
    api.fail_matching(
        Some("GET"),
        Some("mutatingwebhookconfigurations/vgpu-validate"),
        10,
        403,
    );
    let ca_path = out_dir.join("ca.crt");
    let inject = [
        "inject",
        "--ca",
        ca_path.to_str().unwrap(),
        "--mutating",
        "vgpu-mutate",
        "--validating",
        "vgpu-validate",
    ];
    certs(&kubeconfig, &inject);
    let want = b64.encode(&ca_file);
    for (plural, name) in [
        ("mutatingwebhookconfigurations", "vgpu-mutate"),
        ("validatingwebhookconfigurations", "vgpu-validate"),
    ] {
        let cfg = api.get(ADM, plural, "", name).unwrap();
        assert_eq!(
            cfg["webhooks"][0]["clientConfig"]["caBundle"],
            want.as_str(),
            "{name}"
        );
        // The rest of the configuration is untouched.
        assert_eq!(
            cfg["webhooks"][0]["clientConfig"]["service"]["name"],
            "vgpu-webhook"
        );
    }

    // Idempotent: a second inject changes nothing and sends no PATCH.
    api.clear_requests();
    let again = certs(&kubeconfig, &inject);
    assert!(String::from_utf8_lossy(&again.stderr).contains("already carries the CA"));
    assert!(
        api.requests().iter().all(|r| r.method != "PATCH"),
        "{:?}",
        api.requests()
    );
}
