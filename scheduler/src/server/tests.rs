//! The extender's HTTP verbs and decisions, end to end through the router and in process.

#![allow(clippy::unwrap_used)]
use super::*;
use crate::readiness::Feed;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use vgpu_core::inventory::{DeviceInfo, NodeInventory};

fn state() -> Arc<AppState> {
    let s = AppState::new(Settings::default(), None);
    let now = vgpu_core::time::format_rfc3339(unix_now());
    for (node, free) in [("big", 16384u64), ("small", 4096)] {
        let inv = NodeInventory::new(vec![DeviceInfo {
            uuid: format!("GPU-{node}"),
            index: 0,
            model: "NVIDIA T4".into(),
            memory_mib: free,
            cores: 100,
            split: 10,
            numa: None,
            healthy: true,
            vendor: String::new(),
            nvlinks: Default::default(),
        }]);
        write(&s.cluster).apply_node(node, Some(&inv.encode()), Some(&now), None);
    }
    Arc::new(s)
}

fn pod(limits: Value) -> Value {
    json!({"metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}})
}

async fn call(app: Router, path: &str, body: Value) -> (StatusCode, Value) {
    let req = axum::http::Request::post(path)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body.to_string()))
        .unwrap();
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, v)
}

#[tokio::test]
async fn filter_by_names_explains_failures_and_prioritize_scores() {
    let s = state();
    let args = json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})),
        "NodeNames": ["big", "small", "gone"]});
    let (code, r) = call(extender_app(s.clone()), "/filter", args.clone()).await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(r["NodeNames"], json!(["big"]));
    assert_eq!(
        r["FailedNodes"]["small"],
        "small: no GPU with 8192 MiB free (largest 4096 MiB on GPU-small)"
    );
    assert_eq!(
        r["FailedNodes"]["gone"],
        "gone: not known to the vGPU extender (no Node object seen)"
    );
    let (_, p) = call(
        extender_app(s.clone()),
        "/prioritize",
        json!({"Pod": args["Pod"], "NodeNames": ["big"]}),
    )
    .await;
    // Binpack: half of the card's memory, no cores: a quarter used, score 3 of 10.
    assert_eq!(p, json!([{"Host": "big", "Score": 3}]));
    // Without a cached filter, prioritize computes the same.
    let (_, p) = call(
        extender_app(s),
        "/prioritize",
        json!({"Pod": args["Pod"], "NodeNames": ["big", "small"]}),
    )
    .await;
    assert_eq!(
        p,
        json!([{"Host": "big", "Score": 3}, {"Host": "small", "Score": 0}])
    );
}

#[tokio::test]
async fn filter_with_whole_nodes_returns_whole_nodes() {
    let s = state();
    let args = json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})),
        "Nodes": {"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": [
            {"metadata": {"name": "big", "labels": {"a": "b"}}},
            {"metadata": {"name": "small"}}]}});
    let (_, r) = call(extender_app(s), "/filter", args).await;
    assert_eq!(
        r["Nodes"]["items"],
        json!([{"metadata": {"name": "big", "labels": {"a": "b"}}}])
    );
    assert_eq!(r["Nodes"]["kind"], "NodeList");
    assert!(r.get("NodeNames").is_none());
    assert!(r["FailedNodes"]["small"].is_string());
}

#[tokio::test]
async fn non_vgpu_pods_pass_and_bad_requests_are_unresolvable() {
    let s = state();
    let (_, r) = call(
        extender_app(s.clone()),
        "/filter",
        json!({"Pod": pod(json!({"cpu": "1"})), "NodeNames": ["big", "x"]}),
    )
    .await;
    assert_eq!(r["NodeNames"], json!(["big", "x"]));
    let (_, r) = call(
        extender_app(s.clone()),
        "/filter",
        json!({"Pod": pod(json!({"nvidia.com/gpucores": "150"})), "NodeNames": ["big"]}),
    )
    .await;
    assert_eq!(r["NodeNames"], json!([]));
    assert_eq!(
        r["FailedAndUnresolvableNodes"]["big"],
        "big: container \"main\": nvidia.com/gpucores: 150 is out of range 0-100"
    );
    // Whole nodes beyond axum's 2 MiB default are still read.
    let items: Vec<Value> = (0..600)
        .map(|i| json!({"metadata": {"name": format!("n{i}")}, "status": {"images": [{"names": ["x".repeat(4096)]}]}}))
        .collect();
    let (code, r) = call(
        extender_app(s.clone()),
        "/filter",
        json!({"Pod": pod(json!({"cpu": "1"})), "Nodes": {"items": items}}),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(r["Nodes"]["items"].as_array().unwrap().len(), 600);
    let (code, body) = call(extender_app(s.clone()), "/filter", json!([1])).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(body.as_str().unwrap().contains("not ExtenderArgs JSON"));
    let (code, _) = call(extender_app(s.clone()), "/bind", json!({"PodName": 3})).await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    // Bind without an API client answers an error, not a crash.
    let (code, r) = call(
        extender_app(s),
        "/bind",
        json!({"PodName": "p", "PodNamespace": "ns", "PodUID": "u", "Node": "big"}),
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    assert_eq!(r["Error"], "no API client configured");
}

#[tokio::test]
async fn health_ready_and_metrics() {
    let s = state();
    let get = |path: &'static str| {
        let s = s.clone();
        async move {
            let req = axum::http::Request::get(path)
                .body(axum::body::Body::empty())
                .unwrap();
            let resp = metrics_app(s).oneshot(req).await.unwrap();
            let status = resp.status();
            let ct = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.to_str().unwrap().to_string());
            let b = resp.into_body().collect().await.unwrap().to_bytes();
            (status, ct, String::from_utf8(b.to_vec()).unwrap())
        }
    };
    assert_eq!(get("/healthz").await.0, StatusCode::OK);
    assert_eq!(get("/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
    s.readiness.listed(Feed::Nodes);
    s.readiness.listed(Feed::Pods);
    assert_eq!(get("/readyz").await.0, StatusCode::OK);
    let (_, ct, text) = get("/metrics").await;
    assert_eq!(ct.as_deref(), Some(exposition::PROMETHEUS_TEXT));
    assert!(
        text.contains("vgpu_scheduler_nodes{state=\"ready\"} 2"),
        "{text}"
    );
}

fn inventory(gpus: &[(&str, u64)]) -> String {
    NodeInventory::new(
        gpus.iter()
            .enumerate()
            .map(|(i, (uuid, mib))| DeviceInfo {
                uuid: uuid.to_string(),
                index: i as u32,
                model: if i % 2 == 0 {
                    "NVIDIA A100-SXM4-80GB"
                } else {
                    "Tesla T4"
                }
                .into(),
                memory_mib: *mib,
                cores: 100,
                split: 4,
                numa: None,
                healthy: true,
                vendor: String::new(),
                nvlinks: Default::default(),
            })
            .collect(),
    )
    .encode()
}

/// The JSON path (pruned read, answer written straight out) answers exactly what the typed
/// path answers, for every form of body kube-scheduler or a client may send.
#[test]
fn json_answers_equal_the_typed_answers() {
    let s = state();
    let now = unix_now();
    let hb = vgpu_core::time::format_rfc3339(now);
    for n in 0..6 {
        let uuids: Vec<String> = (0..3).map(|i| format!("GPU-{n}-{i}")).collect();
        let gpus: Vec<(&str, u64)> = uuids.iter().map(|u| (u.as_str(), 24576)).collect();
        write(&s.cluster).apply_node(&format!("n{n}"), Some(&inventory(&gpus)), Some(&hb), None);
    }
    write(&s.cluster).apply_node("bare", None, Some(&hb), None);
    let names = json!([
        "n0",
        "n1",
        "big",
        "small",
        "gone",
        "bare",
        "n\"q\\uote",
        "n2",
        "n3",
        "n4",
        "n5"
    ]);
    let annotated = |limits: Value, annotations: Value| {
        let mut p = pod(limits);
        p["metadata"]["annotations"] = annotations;
        p
    };
    let bodies = vec![
        json!({"Pod": pod(json!({"nvidia.com/gpumem": "8192"})), "NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpumem": 20000, "nvidia.com/gpucores": "30"})), "NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpu": "2", "nvidia.com/gpumem-percentage": "50"})), "NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpu": "9"})), "NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpucores": "150"})), "NodeNames": names}),
        json!({"Pod": pod(json!({"cpu": "1"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/use-gputype": "a100", "other": "x", "kubectl.kubernetes.io/last-applied-configuration": "{\"a\": 1}"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/nouse-gputype": "A100,t4"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"nvidia.com/use-gpuuuid": "GPU-3-1"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "1"}), json!({"hami.io/node-scheduler-policy": "nope"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}), json!({"hami.io/node-scheduler-policy": "spread", "hami.io/gpu-scheduler-policy": "binpack"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/numa-bind": "true", "hami.io/gpu-scheduler-policy": "binpack,topology-aware,mutex"})), "NodeNames": names}),
        json!({"Pod": annotated(json!({"nvidia.com/gpu": "2"}), json!({"nvidia.com/numa-bind": "perhaps"})), "NodeNames": names}),
        json!({"Pod": {"metadata": {"name": "p", "uid": "u2"}, "spec": {
            "initContainers": [{"name": "init", "resources": {"limits": {"nvidia.com/gpumem": "30000"}}}],
            "containers": [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}, "requests": {"nvidia.com/gpu": "2"}}},
                {"name": "b", "resources": {"requests": {"nvidia.com/gpumem": "24000"}}}]},
            "status": {"phase": "Pending"}}, "NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"})), "NodeNames": []}),
        json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"}))}),
        json!({"NodeNames": names}),
        json!({"Pod": pod(json!({"nvidia.com/gpumem": "1000"})), "Nodes": {"items": [{"metadata": {"name": "n1"}}, {"metadata": {"name": "small"}}]}}),
        json!({"Pod": {"metadata": {"uid": "u3"}}, "NodeNames": names}),
        json!({"Pod": {"spec": {}}, "NodeNames": names}),
        json!({"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}, "NodeNames": names}),
        json!({"Pod": {"spec": {"containers": null}}, "NodeNames": names}),
    ];
    for body in &bodies {
        let bytes = serde_json::to_vec(body).unwrap();
        let typed: ExtenderArgs = serde_json::from_value(body.clone()).unwrap();
        let want = serde_json::to_value(s.filter(&typed, now)).unwrap();
        let got = s.filter_json(&bytes, now).unwrap();
        let got_v: Value = serde_json::from_slice(&got.body).unwrap();
        assert_eq!(got_v, want, "{body}");
        let want = serde_json::to_value(s.prioritize(&typed, now)).unwrap();
        // The filter's scores stand in for prioritize when nothing changed.
        s.filter_json(&bytes, now).unwrap();
        let got: Value =
            serde_json::from_slice(&s.prioritize_json(&bytes, now).unwrap().body).unwrap();
        assert_eq!(got, want, "{body}");
    }
    // Not extender JSON: the same 400 message as the typed read gives.
    for bad in [
        &b"[1]"[..],
        b"{\"Pod\": 3}",
        b"{\"Pod\": {\"spec\": {\"containers\": 5}}}",
        b"{\"NodeNames\": [1]}",
        b"{",
    ] {
        let e = serde_json::from_slice::<ExtenderArgs>(bad).unwrap_err();
        assert_eq!(
            s.filter_json(bad, now).unwrap_err(),
            format!("body is not ExtenderArgs JSON: {e}")
        );
        assert!(s.prioritize_json(bad, now).is_err());
    }
}

/// kube-scheduler formats the bind error with Go's fmt: a percent sign is doubled.
#[test]
fn bind_errors_survive_go_formatting() {
    let e = BindError::NoFit("n1: no GPU with 46% cores free".into());
    assert_eq!(bind_failure(&e).error, "n1: no GPU with 46%% cores free");
}

/// Prioritize reuses the filter's scores only while they are still right: the same pod
/// request, the same names in the same order, and no change to the cluster in between.
#[test]
fn prioritize_reuses_the_filter_only_while_nothing_changed() {
    let s = state();
    let now = unix_now();
    let p = pod(json!({"nvidia.com/gpumem": "4096"}));
    let body = |p: &Value, names: Value| {
        serde_json::to_vec(&json!({"Pod": p, "NodeNames": names})).unwrap()
    };
    let scores = |b: &[u8]| -> Value {
        serde_json::from_slice(&s.prioritize_json(b, now).unwrap().body).unwrap()
    };
    let f = body(&p, json!(["big", "small"]));
    s.filter_json(&f, now).unwrap();
    // Binpack: 4 GiB of 16 GiB is an eighth used (score 1), of 4 GiB half (score 5).
    assert_eq!(
        scores(&f),
        json!([{"Host": "big", "Score": 1}, {"Host": "small", "Score": 5}])
    );
    // A pod placed on "big" between filter and prioritize: the scores follow.
    s.filter_json(&f, now).unwrap();
    write(&s.cluster).apply_pod(
        "other",
        Some("big"),
        Some(vgpu_core::assignment::PodAssignment::new(
            "big",
            vec![vgpu_core::assignment::ContainerAssignment {
                name: "c".into(),
                devices: vec![vgpu_core::assignment::DeviceSlice {
                    uuid: "GPU-big".into(),
                    memory_mib: 8192,
                    cores: 0,
                    exclusive: false,
                }],
            }],
        )),
        false,
    );
    assert_eq!(
        scores(&f),
        json!([{"Host": "big", "Score": 4}, {"Host": "small", "Score": 5}])
    );
    // The pod's policy changed between the calls: computed for the new request.
    s.filter_json(&f, now).unwrap();
    let mut spread = p.clone();
    spread["metadata"]["annotations"] = json!({"hami.io/node-scheduler-policy": "spread"});
    assert_eq!(
        scores(&body(&spread, json!(["big", "small"]))),
        json!([{"Host": "big", "Score": 6}, {"Host": "small", "Score": 5}])
    );
    // Other names, or another order: computed.
    s.filter_json(&f, now).unwrap();
    assert_eq!(
        scores(&body(&p, json!(["small", "big"]))),
        json!([{"Host": "small", "Score": 5}, {"Host": "big", "Score": 4}])
    );
}

/// Places a pod `u-<node>` holding `mib` and `cores` of GPU `uuid` on `node`.
fn place_slice(s: &AppState, node: &str, uuid: &str, mib: u64, cores: u32) {
    write(&s.cluster).apply_pod(
        &format!("u-{node}"),
        Some(node),
        Some(vgpu_core::assignment::PodAssignment::new(
            node,
            vec![vgpu_core::assignment::ContainerAssignment {
                name: "c".into(),
                devices: vec![vgpu_core::assignment::DeviceSlice {
                    uuid: uuid.to_string(),
                    memory_mib: mib,
                    cores,
                    exclusive: false,
                }],
            }],
        )),
        false,
    );
}

/// An extender with nodes `roomy` (an idle 10000 MiB card) and `tight` (that card with
/// `used` percent taken), and the typical pods of `typical` (the `--typical-pods` JSON).
fn two_node_state(typical: &[u8], used: u32) -> Arc<AppState> {
    let settings = Settings {
        typical_pods: Some(crate::typical::parse("t", typical).unwrap()),
        ..Settings::default()
    };
    let s = Arc::new(AppState::new(settings, None));
    let hb = vgpu_core::time::format_rfc3339(unix_now());
    for (node, used) in [("roomy", 0u32), ("tight", used)] {
        let uuid = format!("GPU-{node}");
        write(&s.cluster).apply_node(node, Some(&inventory(&[(&uuid, 10000)])), Some(&hb), None);
        if used > 0 {
            place_slice(&s, node, &uuid, u64::from(used) * 100, used);
        }
    }
    s
}

/// `/prioritize` of a pod asking `percent` of a card's memory and cores, under node policy
/// `policy`, over `roomy` and `tight`: their scores.
async fn prioritize_two(s: &Arc<AppState>, policy: &str, percent: u32) -> (i64, i64) {
    let mut p = pod(json!({
        "nvidia.com/gpumem-percentage": percent.to_string(),
        "nvidia.com/gpucores": percent.to_string(),
    }));
    p["metadata"]["annotations"] = json!({"hami.io/node-scheduler-policy": policy});
    let body = json!({"Pod": p, "NodeNames": ["roomy", "tight"]});
    let (_, v) = call(extender_app(s.clone()), "/prioritize", body).await;
    let score = |i: usize| v[i]["Score"].as_i64().unwrap();
    (score(0), score(1))
}

/// With `choose_node` (the default) filter passes only the best node: the highest score, then
/// the smallest name whatever the order kube-scheduler sends; without it, every node that
/// fits. Both the JSON path and the whole-`nodes` path.
#[tokio::test]
async fn filter_chooses_the_best_node_unless_told_not_to() {
    let setup = |choose_node: bool| {
        let s = Arc::new(AppState::new(
            Settings {
                choose_node,
                ..Settings::default()
            },
            None,
        ));
        let hb = vgpu_core::time::format_rfc3339(unix_now());
        for node in ["n-b", "n-a", "n-used", "n-full"] {
            let uuid = format!("GPU-{node}");
            let inv = inventory(&[(&uuid, 10000)]);
            write(&s.cluster).apply_node(node, Some(&inv), Some(&hb), None);
            let used = match node {
                "n-used" => 4000,
                "n-full" => 9000,
                _ => continue,
            };
            place_slice(&s, node, &uuid, used, 10);
        }
        s
    };
    let filter = |s: &Arc<AppState>, mib: u32, names: &[&str], whole: bool| {
        let p = pod(json!({"nvidia.com/gpumem": mib.to_string()}));
        let args = if whole {
            let items: Vec<Value> = names
                .iter()
                .map(|n| json!({"metadata": {"name": n}}))
                .collect();
            json!({"Pod": p, "Nodes": {"metadata": {}, "items": items}})
        } else {
            json!({"Pod": p, "NodeNames": names})
        };
        let app = extender_app(s.clone());
        async move {
            let (_, r) = call(app, "/filter", args).await;
            if whole {
                let names: Vec<Value> = r["Nodes"]["items"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| i["metadata"]["name"].clone())
                    .collect();
                (Value::Array(names), r)
            } else {
                (r["NodeNames"].clone(), r)
            }
        }
    };
    let on = setup(true);
    let all = ["n-b", "n-full", "n-a", "n-used"];
    for whole in [false, true] {
        // Binpack: n-used is the fullest that still fits 2000 MiB (n-full has 1000 left).
        let (names, r) = filter(&on, 2000, &all, whole).await;
        assert_eq!(names, json!(["n-used"]), "{r}");
        assert!(r["FailedNodes"]["n-full"].is_string(), "{r}");
        // 7000 MiB fits only the idle cards, equal scores: the smaller name, in any order.
        let (names, _) = filter(&on, 7000, &all, whole).await;
        assert_eq!(names, json!(["n-a"]));
        let (names, _) = filter(&on, 7000, &["n-a", "n-b"], whole).await;
        assert_eq!(names, json!(["n-a"]));
        // Nothing fits: nothing passes, every node says why.
        let (names, r) = filter(&on, 20000, &all, whole).await;
        assert_eq!(names, json!([]));
        assert_eq!(r["FailedNodes"].as_object().unwrap().len(), 4);
    }
    // Prioritize after a choosing filter: over the chosen node (the filter's memo), and over
    // any other list (computed): the chosen node's score is the best of them.
    let p = pod(json!({"nvidia.com/gpumem": "2000"}));
    let (names, _) = filter(&on, 2000, &all, false).await;
    let (_, one) = call(
        extender_app(on.clone()),
        "/prioritize",
        json!({"Pod": p, "NodeNames": names}),
    )
    .await;
    let (_, every) = call(
        extender_app(on.clone()),
        "/prioritize",
        json!({"Pod": p, "NodeNames": all}),
    )
    .await;
    let best = every
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["Score"].as_i64().unwrap())
        .max();
    assert_eq!(one[0]["Host"], "n-used", "{one}");
    assert_eq!(one[0]["Score"].as_i64(), best, "{one} {every}");
    let off = setup(false);
    for whole in [false, true] {
        let (names, _) = filter(&off, 2000, &all, whole).await;
        assert_eq!(names, json!(["n-b", "n-a", "n-used"]));
    }
    // A pod without vGPU passes every node either way.
    let (_, r) = call(
        extender_app(on),
        "/filter",
        json!({"Pod": pod(json!({})), "NodeNames": all}),
    )
    .await;
    assert_eq!(r["NodeNames"], json!(all));
}

/// `fragmentation` through the extender's JSON: with a typical workload of half-card pods, a
/// 10 % pod scores the node it leaves room for a half pod on above the one where it would
/// strand the rest, where binpack prefers the fuller card.
#[tokio::test]
async fn fragmentation_policy_scores_differently_from_binpack() {
    let s = two_node_state(br#"[{"gpus": 1, "percent": 50, "count": 1}]"#, 45);
    let (roomy, tight) = prioritize_two(&s, "fragmentation", 10).await;
    assert!(roomy > tight, "{roomy} vs {tight}");
    let (roomy, tight) = prioritize_two(&s, "binpack", 10).await;
    assert!(roomy < tight, "{roomy} vs {tight}");
}

/// `gap-aware` through the extender's JSON: with twice as many 60 % pods as 40 % pods
/// typical, a 40 % pod scores 5 on the idle card (it leaves a 60 % pod's room) and 0 on the
/// card with a 60 % gap (it would leave 20 %, which nothing fills); a 60 % pod fills that gap
/// losslessly.
#[tokio::test]
async fn gap_aware_policy_scores_through_the_extender() {
    let s = two_node_state(
        br#"[{"gpus": 1, "percent": 60, "count": 20}, {"gpus": 1, "percent": 40, "count": 10}]"#,
        40,
    );
    assert_eq!(prioritize_two(&s, "gap-aware", 40).await, (5, 0));
    assert_eq!(prioritize_two(&s, "gap-aware", 60).await.1, 5);
    let (roomy, tight) = prioritize_two(&s, "binpack", 40).await;
    assert!(roomy < tight, "{roomy} vs {tight}");
}

/// Room that appears goes to the oldest pod turned away that fits, whichever kube-scheduler
/// retries first (it orders waiting pods by their last attempt); a pod that fits nowhere holds
/// nothing back, and an older pod that was bound or deleted no longer waits.
#[tokio::test]
async fn room_goes_to_the_oldest_pod_turned_away_that_fits() {
    let s = Arc::new(AppState::new(Settings::default(), None));
    let hb = vgpu_core::time::format_rfc3339(unix_now());
    write(&s.cluster).apply_node("n", Some(&inventory(&[("GPU-n", 10000)])), Some(&hb), None);
    place_slice(&s, "n", "GPU-n", 9000, 0);
    let pod = |name: &str, created: &str, mib: u32| {
        json!({"metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"),
            "creationTimestamp": created},
            "spec": {"containers": [{"name": "main", "resources": {"limits": {
                "nvidia.com/gpumem": mib.to_string()}}}]}})
    };
    let filter = |p: Value| {
        let app = extender_app(s.clone());
        async move {
            let (_, r) = call(app, "/filter", json!({"Pod": p, "NodeNames": ["n"]})).await;
            r["NodeNames"].clone()
        }
    };
    let huge = pod("huge", "2026-12-07T10:00:00Z", 20000);
    let older = pod("older", "2026-12-07T10:00:01Z", 3000);
    let younger = pod("younger", "2026-12-07T10:00:02Z", 3000);
    for p in [&huge, &older, &younger] {
        assert_eq!(filter(p.clone()).await, json!([]), "the GPU is full");
    }
    // Room for one: kube-scheduler happens to retry the younger pod first.
    write(&s.cluster).delete_pod("u-n");
    place_slice(&s, "n", "GPU-n", 6000, 0);
    assert_eq!(
        filter(younger.clone()).await,
        json!([]),
        "held for the older pod"
    );
    assert_eq!(filter(older.clone()).await, json!(["n"]));
    // The older one bound elsewhere (or deleted): it waits no more, and holds nothing.
    write(&s.cluster).forget("uid-older");
    s.no_longer_waiting("uid-older");
    assert_eq!(filter(younger).await, json!(["n"]));
}
