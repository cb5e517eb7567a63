//! Replays the checked-in fuzz corpus (`fuzz/corpus/<target>/*`) through the fuzz targets' own
//! bodies, so `cargo test --workspace` catches a regression on any seed or past crash without
//! cargo-fuzz; and keeps the target list, the cargo-fuzz files and the corpus directories in step.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use vgpu_fuzz_harness::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

fn names_in(dir: &Path, strip: &str) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|n| {
            if strip.is_empty() {
                Some(n)
            } else {
                n.strip_suffix(strip).map(str::to_string)
            }
        })
        .collect()
}

#[test]
fn every_target_has_a_cargo_fuzz_file_and_a_corpus() {
    let targets: BTreeSet<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(names_in(&fuzz_dir().join("fuzz_targets"), ".rs"), targets);
    assert_eq!(names_in(&fuzz_dir().join("corpus"), ""), targets);
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for t in &targets {
        assert!(
            manifest.contains(&format!("name = \"{t}\"")),
            "fuzz/Cargo.toml has no [[bin]] {t}"
        );
    }
}

#[test]
fn corpus_replays_without_a_panic() {
    let mut total = 0;
    for (name, run) in TARGETS {
        let dir = fuzz_dir().join("corpus").join(name);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        files.sort();
        assert!(!files.is_empty(), "{name}: empty corpus");
        for f in &files {
            let data = std::fs::read(f).unwrap();
            let result = std::panic::catch_unwind(|| run(&data));
            assert!(result.is_ok(), "{name}: {} fails", f.display());
            total += 1;
        }
    }
    assert!(total >= TARGETS.len());
}

/// The validate seeds reach every branch of the snapshot decision, so the fuzzer starts from all.
#[test]
fn validate_seeds_reach_every_decision() {
    let dir = fuzz_dir().join("corpus/admission_validate");
    let mut seen = BTreeSet::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        seen.insert(vgpu_fuzz_harness::validate_on_snapshot(&data).unwrap_or("bad-request"));
    }
    let want = [
        "bad-request",
        "invalid",
        "no-quota",
        "no-vgpu",
        "policy",
        "quota",
        "reserved",
        "skipped",
    ];
    assert_eq!(seen, want.into_iter().collect::<BTreeSet<_>>());
}
