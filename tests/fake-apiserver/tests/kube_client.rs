//! The double driven by a real kube-rs client through a kubeconfig: list with selectors and pages,
//! watch (with bookmarks and 410 recovery through kube-runtime's watcher), and CAS conflicts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, Config};
use serde_json::json;
use std::time::Duration;
use vgpu_fake_apiserver::FakeApiServer;

async fn client(api: &FakeApiServer) -> (Client, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig(&path).unwrap();
    let kc = kube::config::Kubeconfig::read_from(&path).unwrap();
    let cfg = Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    (Client::try_from(cfg).unwrap(), dir)
}

fn pod(name: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "i"}]}}))
    .unwrap()
}

#[tokio::test]
async fn list_with_selectors_and_pages() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(c, "a");
    for i in 0..7 {
        let labels = if i % 2 == 0 {
            json!({"vgpu.io/managed": "true"})
        } else {
            json!({})
        };
        pods.create(&PostParams::default(), &pod(&format!("p{i}"), labels))
            .await
            .unwrap();
    }
    let all = pods.list(&ListParams::default().limit(3)).await.unwrap();
    assert_eq!(all.items.len(), 3);
    assert!(all.metadata.continue_.is_some());
    let managed = pods
        .list(&ListParams::default().labels("vgpu.io/managed=true"))
        .await
        .unwrap();
    assert_eq!(managed.items.len(), 4);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=p3"))
        .await
        .unwrap();
    assert_eq!(by_name.items.len(), 1);
    assert!(api
        .requests()
        .iter()
        .any(|r| r.query.contains("labelSelector=vgpu.io")));
}

#[tokio::test]
async fn update_with_stale_version_is_409_conflict() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(c, "a");
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "r"}, "data": {"n": "0"}})).unwrap();
    let first = cms.create(&PostParams::default(), &cm).await.unwrap();
    let mut a = first.clone();
    a.data = Some([("n".to_string(), "1".to_string())].into());
    cms.replace("r", &PostParams::default(), &a).await.unwrap();
    let mut b = first;
    b.data = Some([("n".to_string(), "2".to_string())].into());
    match cms.replace("r", &PostParams::default(), &b).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert_eq!(s.reason, "Conflict");
            assert!(
                s.message.contains("the object has been modified"),
                "{}",
                s.message
            );
        }
        other => panic!("expected 409, got {other:?}"),
    }
    // A merge patch carrying the stale version is refused the same way.
    let stale = b.metadata.resource_version.clone().unwrap();
    let p = json!({"metadata": {"resourceVersion": stale}, "data": {"n": "3"}});
    let err = cms
        .patch("r", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .unwrap_err();
    assert!(matches!(err, kube::Error::Api(s) if s.code == 409));
    assert_eq!(cms.get("r").await.unwrap().data.unwrap()["n"], "1");
}

#[tokio::test]
async fn watcher_sees_changes_bookmarks_and_recovers_from_410() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(c, "a");
    pods.create(&PostParams::default(), &pod("before", json!({})))
        .await
        .unwrap();
    let mut w = watcher(pods.clone(), watcher::Config::default().timeout(5)).boxed();
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Initial list, then a live create, as kube-runtime's state machine reports them.
    while !seen.contains(&"apply:after".to_string()) {
        let ev = tokio::time::timeout_at(deadline, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match ev {
            watcher::Event::InitApply(p) => seen.push(format!("init:{}", p.metadata.name.unwrap())),
            watcher::Event::InitDone => {
                seen.push("done".into());
                pods.create(&PostParams::default(), &pod("after", json!({})))
                    .await
                    .unwrap();
            }
            watcher::Event::Apply(p) => seen.push(format!("apply:{}", p.metadata.name.unwrap())),
            _ => {}
        }
    }
    assert_eq!(seen[..2], ["init:before".to_string(), "done".to_string()]);
    // Break the watch, hold the re-watch back, change and forget history: the re-watch from the
    // old version gets 410 and the watcher re-lists (a second Init..InitDone).
    api.delay_matching(Some("GET"), Some("/pods"), 1, Duration::from_millis(500));
    api.close_watches();
    pods.create(&PostParams::default(), &pod("later", json!({})))
        .await
        .unwrap();
    api.compact();
    let mut relisted = false;
    let watches_before = api.requests().iter().filter(|r| r.is_watch()).count();
    assert!(watches_before >= 1);
    while !relisted {
        match tokio::time::timeout_at(deadline + Duration::from_secs(10), w.next())
            .await
            .unwrap()
        {
            Some(Ok(watcher::Event::InitDone)) => relisted = true,
            Some(_) => {}
            None => panic!("watch ended"),
        }
    }
    assert!(api
        .requests()
        .iter()
        .any(|r| r.is_watch() && r.query.contains("allowWatchBookmarks=true")));
    let lists = api
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.is_watch())
        .count();
    assert_eq!(lists, 2, "one initial list and one re-list after 410");
}

type Events = tokio::sync::mpsc::UnboundedReceiver<Result<watcher::Event<Pod>, watcher::Error>>;

/// Runs a watcher in a task (it must be polled to re-watch) and hands its events over.
fn spawn_watcher(pods: Api<Pod>) -> Events {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut w = watcher(pods, watcher::Config::default()).boxed();
        while let Some(ev) = w.next().await {
            if tx.send(ev).is_err() {
                return;
            }
        }
    });
    rx
}

/// A watcher past its initial list, with its watch open on the server.
async fn synced_watcher(api: &FakeApiServer, pods: Api<Pod>) -> Events {
    let mut w = spawn_watcher(pods);
    while !matches!(
        next_event(&mut w, Duration::from_secs(10)).await,
        Ok(watcher::Event::InitDone)
    ) {}
    vgpu_tests_wait(|| api.watch_count() == 1).await;
    w
}

/// Next event within `t`, panicking on a timeout or the end of the stream.
async fn next_event(w: &mut Events, t: Duration) -> Result<watcher::Event<Pod>, watcher::Error> {
    tokio::time::timeout(t, w.recv())
        .await
        .expect("watcher event in time")
        .expect("watcher stream ended")
}

/// A cut watch connection: kube-rs reads the unfinished chunked body as an `UnexpectedEof`, which
/// it treats as a resumable end (kube-client's `request_events`), so the watcher re-watches from
/// its last version without reporting an error, and nothing is missed.
#[tokio::test]
async fn dropped_watch_is_resumed_from_its_version_without_a_relist() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(c, "a");
    let mut w = synced_watcher(&api, pods.clone()).await;
    api.drop_watches();
    pods.create(&PostParams::default(), &pod("after-drop", json!({})))
        .await
        .unwrap();
    match next_event(&mut w, Duration::from_secs(10)).await {
        Ok(watcher::Event::Apply(p)) => assert_eq!(p.metadata.name.unwrap(), "after-drop"),
        other => panic!("expected the create, got {other:?}"),
    }
    let reqs = api.requests();
    let lists = reqs.iter().filter(|r| r.method == "GET" && !r.is_watch());
    assert_eq!(lists.count(), 1, "a re-watch from the version, no re-list");
    let watches: Vec<_> = reqs.iter().filter(|r| r.is_watch()).collect();
    assert_eq!(watches.len(), 2);
    assert!(
        watches[1].query.contains("resourceVersion="),
        "{:?}",
        watches[1]
    );
}

/// On the wire, a dropped watch ends without HTTP/1.1's last chunk (`0\r\n\r\n`), while a closed
/// one (the server's timeout) ends with it.
#[tokio::test]
async fn dropped_watch_cuts_the_connection_closed_watch_ends_the_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let api = FakeApiServer::start_with(vgpu_fake_apiserver::Options {
        tls: false,
        ..Default::default()
    })
    .await
    .unwrap();
    for (cut, end) in [(true, false), (false, true)] {
        let mut s = tokio::net::TcpStream::connect(api.addr()).await.unwrap();
        s.write_all(b"GET /api/v1/namespaces/a/pods?watch=true HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        vgpu_tests_wait(|| api.watch_count() == 1).await;
        if cut {
            api.drop_watches();
        } else {
            api.close_watches();
        }
        let mut raw = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let read = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
                .await
                .unwrap();
            match read {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
            if raw.ends_with(b"0\r\n\r\n") {
                break;
            }
        }
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert_eq!(text.ends_with("0\r\n\r\n"), end, "{text}");
    }
}

#[tokio::test]
async fn expired_watch_is_an_error_event_410_and_the_watcher_relists() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(c, "a");
    let mut w = synced_watcher(&api, pods.clone()).await;
    api.expire_next_watches(Some("/pods"), 1);
    // A clean end (as `timeoutSeconds` ends a watch): the re-watch is the one answered 410.
    api.close_watches();
    match next_event(&mut w, Duration::from_secs(10)).await {
        Err(watcher::Error::WatchError(s)) => {
            assert_eq!((s.code, s.reason.as_str()), (410, "Expired"));
            assert!(s.message.starts_with("too old resource version"), "{s:?}");
        }
        other => panic!("expected a 410 watch event, got {other:?}"),
    }
    assert!(matches!(
        next_event(&mut w, Duration::from_secs(10)).await,
        Ok(watcher::Event::Init)
    ));
}

#[tokio::test]
async fn list_faults_match_the_list_verb_only_until_cleared() {
    let api = FakeApiServer::start().await.unwrap();
    let (c, _d) = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(c, "a");
    pods.create(&PostParams::default(), &pod("x", json!({})))
        .await
        .unwrap();
    api.fail_verb("list", Some("/pods"), usize::MAX, 500);
    for _ in 0..3 {
        match pods.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!((s.code, s.reason.as_str()), (500, "InternalError"))
            }
            other => panic!("expected 500, got {other:?}"),
        }
    }
    // A get of one object is not a list.
    assert!(pods.get("x").await.is_ok());
    api.clear_faults();
    api.delay_verb("list", None, 1, Duration::from_millis(300));
    let t = std::time::Instant::now();
    assert_eq!(
        pods.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
}

/// Polls `f` for up to 10 s.
async fn vgpu_tests_wait(f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not met in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
