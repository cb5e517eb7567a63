//! Certificate rotation under load: the real `vgpu-webhook` (and `vgpu-scheduler` over HTTPS)
//! serves files laid out the way the kubelet lays out a Secret volume, the files are replaced the
//! way the kubelet replaces them, and a client that keeps one connection busy the whole time sees
//! no failure; a broken new pair is refused and the last good one keeps serving.

use crate::hostile::{start_in, Kind};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use vgpu_tests::certs::{trusting, TestPki};
use vgpu_tests::https;

/// Writes a pair the way the kubelet's atomic writer updates a Secret volume: the files go into a
/// fresh timestamped directory, a temporary `..data_tmp` symlink points at it and is renamed over
/// `..data`, so readers see either the whole old set or the whole new one. `tls.crt` and `tls.key`
/// in the volume root are symlinks through `..data` (made once).
fn kubelet_write(volume: &Path, generation: u32, cert: &str, key: &str) {
    let dir_name = format!("..2026_12_03_00_00_0{generation}.000000001");
    let dir = volume.join(&dir_name);
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("tls.crt"), cert).unwrap();
    std::fs::write(dir.join("tls.key"), key).unwrap();
    let tmp = volume.join("..data_tmp");
    std::os::unix::fs::symlink(&dir_name, &tmp).unwrap();
    std::fs::rename(&tmp, volume.join("..data")).unwrap();
    for f in ["tls.crt", "tls.key"] {
        let link = volume.join(f);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{f}"), &link).unwrap();
        }
    }
}

/// A real answer: an allowed review from the webhook, a filter result from the scheduler.
fn answered(path: &str, r: &https::Reply) -> bool {
    let v = r.json();
    match path {
        "/mutate" => v["response"]["allowed"] == true,
        // A pod without vGPU limits passes every candidate.
        _ => v["NodeNames"] == serde_json::json!(["n1"]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_a_busy_keep_alive_connection_and_serves_the_new_certificate() {
    rotation_under_load(Kind::Webhook).await;
}

/// The scheduler's extender API over HTTPS (`--tls-cert/--tls-key`) reloads the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_rotation_keeps_a_busy_keep_alive_connection_and_refuses_a_broken_pair() {
    rotation_under_load(Kind::Scheduler).await;
}

/// Idle servers with plain certificate files (no Secret volume symlinks) stay idle: the watcher
/// reloads on changes only, not on the opens and reads of its own reloads (which once made each
/// server reload about 15 000 times a second, a whole core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_servers_watching_plain_certificate_files_use_no_cpu() {
    for kind in [Kind::Webhook, Kind::Scheduler] {
        let dir = tempfile::tempdir().unwrap();
        let pki = TestPki::new(&[]);
        let (_, cert, key) = pki.write(dir.path());
        let work = tempfile::tempdir().unwrap();
        let target = start_in(kind, work, &cert, &key, pki, &[]).await;
        // Something reads the files (an operator's `cat`, a backup): an open and a close that
        // write nothing. Then, past start-up, a two-second window: 10 % of a core is 200 ms.
        std::fs::read(&cert).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let pid = target.proc.pid();
        let share = tokio::task::spawn_blocking(move || {
            vgpu_tests::process::cpu_share(pid, Duration::from_secs(2))
        })
        .await
        .unwrap();
        assert!(
            share < 0.1,
            "{:?} idle at {:.0} % of a core",
            target.path,
            share * 100.0
        );
    }
}

async fn rotation_under_load(kind: Kind) {
    let volume = tempfile::tempdir().unwrap();
    let old = TestPki::new(&[]);
    let new = TestPki::new(&[]);
    kubelet_write(volume.path(), 1, &old.cert_pem, &old.key_pem);

    let dir = tempfile::tempdir().unwrap();
    let target = start_in(
        kind,
        dir,
        &volume.path().join("tls.crt"),
        &volume.path().join("tls.key"),
        TestPki::new(&[]),
        &[],
    )
    .await;
    let (addr, path, body) = (target.addr, target.path, target.body());
    let mut proc = target.proc;
    // The client trusts both CAs, as a caBundle carrying old and new does during a rotation.
    let tls = Arc::new(trusting(&[&old, &new]));

    // One connection, kept busy for the whole rotation.
    let mut conn = https::connect(addr, tls.clone()).await.unwrap();
    assert_eq!(conn.peer_leaf, old.leaf_der());
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let busy = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                match conn.send("POST", path, body.clone()).await {
                    Ok(r) if r.status == 200 && answered(path, &r) => {
                        ok.fetch_add(1, Ordering::Relaxed)
                    }
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
            }
            conn
        })
    };
    vgpu_tests::wait_for_async(Duration::from_secs(10), "requests before the swap", || {
        let n = ok.load(Ordering::Relaxed);
        async move { (n >= 20).then_some(()) }
    })
    .await;

    kubelet_write(volume.path(), 2, &new.cert_pem, &new.key_pem);
    // New handshakes get the new certificate once the watcher has reloaded.
    let new_leaf = new.leaf_der();
    vgpu_tests::wait_for_async(Duration::from_secs(10), "the new certificate", || {
        let (tls, new_leaf) = (tls.clone(), new_leaf.clone());
        async move {
            let c = https::connect(addr, tls).await.ok()?;
            (c.peer_leaf == new_leaf).then_some(())
        }
    })
    .await;
    proc.wait_for_line(Duration::from_secs(5), |l| {
        l.contains("serving a new certificate")
    });

    // A broken pair (a key that does not match) is refused, and the new certificate keeps serving.
    let stranger = TestPki::new(&[]);
    kubelet_write(volume.path(), 3, &new.cert_pem, &stranger.key_pem);
    proc.wait_for_line(Duration::from_secs(10), |l| {
        l.contains("new certificate refused")
    });
    let c = https::connect(addr, tls.clone()).await.unwrap();
    assert_eq!(c.peer_leaf, new_leaf, "a broken pair replaced the good one");

    let before_stop = ok.load(Ordering::Relaxed);
    vgpu_tests::wait_for_async(Duration::from_secs(10), "requests after the swap", || {
        let n = ok.load(Ordering::Relaxed);
        async move { (n >= before_stop + 20).then_some(()) }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let conn = busy.await.unwrap();
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "requests failed during rotation"
    );
    // The busy connection is the one opened before the swap: it kept its negotiated keys.
    assert_eq!(conn.peer_leaf, old.leaf_der());
}
