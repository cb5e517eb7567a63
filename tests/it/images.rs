//! `docker/local-images.sh` builds the images `docker/Dockerfile` describes, without a registry:
//! the same files at the same paths, the same user and the same entrypoint, stage by stage. The
//! real-cluster tier installs the chart from these images, so what it proves holds for the
//! Dockerfile's.

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

/// One runtime stage of the Dockerfile: files copied in, user, entrypoint.
#[derive(Debug, Default, PartialEq)]
struct Stage {
    files: Vec<String>,
    user: Option<String>,
    entrypoint: Vec<String>,
}

/// The Dockerfile's runtime stages (every `FROM ... AS name` but the build stage).
fn dockerfile_stages() -> BTreeMap<String, Stage> {
    let text = std::fs::read_to_string(vgpu_tests::repo_root().join("docker/Dockerfile")).unwrap();
    let mut stages = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["FROM", _, "AS", name] => {
                current = (*name != "build").then(|| name.to_string());
                if let Some(n) = &current {
                    stages.insert(n.clone(), Stage::default());
                }
            }
            ["COPY", from, _, dest] if from.starts_with("--from=") => {
                if let Some(s) = current.as_ref().and_then(|n| stages.get_mut(n)) {
                    s.files.push(dest.trim_start_matches('/').to_string());
                }
            }
            ["USER", user] => {
                if let Some(s) = current.as_ref().and_then(|n| stages.get_mut(n)) {
                    s.user = Some(user.to_string());
                }
            }
            ["ENTRYPOINT", ..] => {
                if let Some(s) = current.as_ref().and_then(|n| stages.get_mut(n)) {
                    let json = line.trim_start_matches("ENTRYPOINT").trim();
                    s.entrypoint = serde_json::from_str(json).unwrap();
                }
            }
            _ => {}
        }
    }
    stages
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn local_images_have_the_dockerfiles_layout() {
    let stages = dockerfile_stages();
    assert_eq!(
        stages.keys().map(String::as_str).collect::<Vec<_>>(),
        ["certs", "device-plugin", "scheduler", "webhook"],
        "the Dockerfile's stages changed: {stages:?}"
    );
    let bins = vgpu_tests::profile_dir();
    vgpu_tests::ensure_built();
    let out = tempfile::tempdir().unwrap();
    run(Command::new("bash")
        .arg(vgpu_tests::repo_root().join("docker/local-images.sh"))
        .arg("images")
        .arg(&bins)
        .arg(out.path())
        .arg("local"));
    for (name, want) in &stages {
        let dir = out.path().join(name);
        std::fs::create_dir(&dir).unwrap();
        run(Command::new("tar")
            .arg("-xf")
            .arg(out.path().join(format!("{name}.tar")))
            .arg("-C")
            .arg(&dir));
        let manifest: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(
            manifest[0]["RepoTags"][0],
            format!("local/vgpu/vgpu-{name}:{}", env!("CARGO_PKG_VERSION")),
            "{name}: the chart's image name"
        );
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join(manifest[0]["Config"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        let files = run(Command::new("tar")
            .arg("-tf")
            .arg(dir.join(manifest[0]["Layers"][0].as_str().unwrap())));
        let files: Vec<&str> = files.lines().map(|l| l.trim_start_matches("./")).collect();
        let got = Stage {
            files: want
                .files
                .iter()
                .filter(|f| files.contains(&f.as_str()))
                .cloned()
                .collect(),
            user: config["config"]["User"].as_str().map(str::to_string),
            entrypoint: serde_json::from_value(config["config"]["Entrypoint"].clone()).unwrap(),
        };
        assert_eq!(&got, want, "{name}: local image vs Dockerfile stage");
    }
}
