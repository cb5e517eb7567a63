//! The CDI spec of a prepared claim: one CDI device per request, carrying the container edits a
//! device-plugin container gets from Allocate (its environment and mounts).
//!
//! Container Device Interface, spec version 0.6.0 (github.com/cncf-tags/container-device-interface
//! `SPEC.md`): a JSON file in `/var/run/cdi` with `cdiVersion`, `kind` (`vendor/class`) and
//! `devices`, each a `name` and `containerEdits` (`env` as `NAME=VALUE`, `mounts` with `hostPath`,
//! `containerPath`, `type` and `options`). containerd reads the directory again before each
//! container that names a device (`kind=name`), so the file must be complete before
//! NodePrepareResources answers: it is written beside and renamed into place.

use crate::api::ContainerAllocateResponse;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Our CDI kind (`vendor/class`).
pub const KIND: &str = "gpu.vgpu.io/claim";
/// The spec version written: env and bind mounts need nothing newer.
pub const CDI_VERSION: &str = "0.6.0";

/// The CDI device name of a claim's request (`<claim-uid>-<request key>`).
pub fn device_name(claim_uid: &str, request_key: &str) -> String {
    format!("{claim_uid}-{request_key}")
}

/// The fully qualified CDI device ID the kubelet passes to the runtime.
pub fn device_id(claim_uid: &str, request_key: &str) -> String {
    format!("{KIND}={}", device_name(claim_uid, request_key))
}

/// The claim's spec file in `dir`: one file per claim, so unprepare removes exactly it.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("gpu.vgpu.io-claim_{claim_uid}.json"))
}

/// The container edits of one answer: its environment (sorted, so the same claim gives the same
/// bytes) and its mounts, read-only ones `ro`, all `nosuid,nodev`.
fn edits(answer: &ContainerAllocateResponse) -> Value {
    let env: std::collections::BTreeMap<&String, &String> = answer.envs.iter().collect();
    let env: Vec<String> = env.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mounts: Vec<Value> = answer
        .mounts
        .iter()
        .map(|m| {
            json!({"hostPath": m.host_path, "containerPath": m.container_path, "type": "bind",
                "options": ["bind", if m.read_only { "ro" } else { "rw" }, "nosuid", "nodev"]})
        })
        .collect();
    json!({"env": env, "mounts": mounts})
}

/// The spec of a claim whose requests got `answers` (`(request key, answer)`).
pub fn spec(claim_uid: &str, answers: &[(String, ContainerAllocateResponse)]) -> Value {
    let devices: Vec<Value> = answers
        .iter()
        .map(|(key, a)| json!({"name": device_name(claim_uid, key), "containerEdits": edits(a)}))
        .collect();
    json!({"cdiVersion": CDI_VERSION, "kind": KIND, "devices": devices})
}

/// Writes the claim's spec into `dir`.
pub fn write(dir: &Path, claim_uid: &str, spec: &Value) -> std::io::Result<PathBuf> {
    let path = spec_path(dir, claim_uid);
    let bytes = serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?;
    crate::plugin::write_atomically(&path, &bytes)?;
    Ok(path)
}

/// Removes the claim's spec from `dir`; gone already is fine.
pub fn remove(dir: &Path, claim_uid: &str) -> std::io::Result<()> {
    match std::fs::remove_file(spec_path(dir, claim_uid)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::api::Mount;

    #[test]
    fn one_cdi_device_per_request_with_the_allocate_edits() {
        let answer = ContainerAllocateResponse {
            envs: [
                ("B".to_string(), "2".to_string()),
                ("A".to_string(), "1".to_string()),
            ]
            .into(),
            mounts: vec![
                Mount {
                    container_path: "/usr/local/vgpu/libvgpu.so".into(),
                    host_path: "/h/libvgpu.so".into(),
                    read_only: true,
                },
                Mount {
                    container_path: "/tmp/vgpu".into(),
                    host_path: "/h/containers/u_gpu".into(),
                    read_only: false,
                },
            ],
            ..Default::default()
        };
        let s = spec("u", &[("gpu".into(), answer)]);
        assert_eq!(s["kind"], "gpu.vgpu.io/claim");
        assert_eq!(s["devices"][0]["name"], "u-gpu");
        assert_eq!(
            s["devices"][0]["containerEdits"]["env"],
            json!(["A=1", "B=2"])
        );
        let m = &s["devices"][0]["containerEdits"]["mounts"];
        assert_eq!(
            m[0],
            json!({"hostPath": "/h/libvgpu.so", "containerPath": "/usr/local/vgpu/libvgpu.so",
            "type": "bind", "options": ["bind", "ro", "nosuid", "nodev"]})
        );
        assert_eq!(m[1]["options"][1], "rw");
        assert_eq!(device_id("u", "gpu"), "gpu.vgpu.io/claim=u-gpu");
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), "u", &s).unwrap();
        assert_eq!(path.file_name().unwrap(), "gpu.vgpu.io-claim_u.json");
        let back: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, s);
        remove(dir.path(), "u").unwrap();
        assert!(!path.exists());
        remove(dir.path(), "u").unwrap();
    }
}
