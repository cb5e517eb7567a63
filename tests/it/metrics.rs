//! `/metrics` of each running service, checked by `promtool check metrics` (Prometheus' own linter
//! for names, units, `_total` suffixes and help texts) and for the values that must be there.
//!
//! promtool comes from Debian's `prometheus` package (`.ci/run` installs it). Without it the test
//! says so and passes, unless `VGPU_REQUIRE_PROMTOOL` is set (CI sets it).

use serde_json::json;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use vgpu_tests::certs::TestPki;
use vgpu_tests::https;

pub(crate) fn promtool() -> Option<&'static str> {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("VGPU_REQUIRE_PROMTOOL").is_none(),
            "VGPU_REQUIRE_PROMTOOL is set but promtool is not on PATH"
        );
        eprintln!("SKIPPED: promtool not on PATH (Debian package prometheus)");
        return None;
    }
    Some("promtool")
}

/// Runs `promtool check metrics` on an exposition and returns its complaints (empty when clean).
pub fn promtool_complaints(promtool: &str, exposition: &str) -> String {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        String::new()
    } else {
        text
    }
}

#[tokio::test]
async fn webhook_metrics_pass_promtool_and_count_admissions() {
    let Some(promtool) = promtool() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pki = TestPki::new(&[]);
    let (_, cert, key) = pki.write(dir.path());
    let (_proc, addr) = vgpu_tests::process::start_webhook(&cert, &key, &[]);
    let tls = Arc::new(pki.client_config());

    let review = |limits: serde_json::Value| {
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
            "uid": "m", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "team-a", "operation": "CREATE",
            "object": {"spec": {"containers": [{"name": "c", "image": "i",
                "resources": {"limits": limits}}]}}}})
        .to_string()
        .into_bytes()
    };
    for body in [
        review(json!({"nvidia.com/gpu": "1"})),
        review(json!({"nvidia.com/gpu": "1"})),
        review(json!({"nvidia.com/gpucores": "150"})),
        review(json!({"cpu": "1"})),
        b"{not json".to_vec(),
    ] {
        https::request(addr, tls.clone(), "POST", "/mutate", body)
            .await
            .unwrap();
    }
    let reply = https::request(addr, tls, "GET", "/metrics", vec![])
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    let text = String::from_utf8(reply.body).unwrap();
    assert_eq!(promtool_complaints(promtool, &text), "", "{text}");
    for want in [
        r#"vgpu_webhook_admissions_total{endpoint="mutate",decision="allowed",reason="patched"} 2"#,
        r#"vgpu_webhook_admissions_total{endpoint="mutate",decision="denied",reason="invalid"} 1"#,
        r#"vgpu_webhook_admissions_total{endpoint="mutate",decision="allowed",reason="no-vgpu"} 1"#,
        r#"vgpu_webhook_admissions_total{endpoint="mutate",decision="bad-request",reason="not-a-review"} 1"#,
        r#"vgpu_webhook_admission_duration_seconds_count{endpoint="mutate"} 5"#,
    ] {
        assert!(text.contains(want), "missing {want} in:\n{text}");
    }
}
