//! The bodies of the fuzz targets: bytes in, through the same functions the servers and the hook
//! call, with the properties that must hold for every input asserted (a failed assertion is a
//! crash to the fuzzer, like a panic in the code under test).
//!
//! `fuzz/` (cargo-fuzz, libFuzzer) calls one of these per target; this crate's test
//! `tests/corpus.rs` runs every file of `fuzz/corpus/<target>/` through the same function, so
//! `cargo test --workspace` replays the corpus without cargo-fuzz. [`TARGETS`] names them all.
//!
//! The cluster state the decisions need (quotas, cached pods, ledger, node inventory, placed pods)
//! is a small fixed snapshot built here in memory: no API server, no network.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use base64::Engine as _;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use vgpu_core::accounting::{AccountingError, Snapshot, HEADER_WORDS, MAX_DEVICES, SLOT_COUNT};
use vgpu_core::annotations::{InjectedMarker, NODE_DEVICES};
use vgpu_core::assignment::PodAssignment;
use vgpu_core::env;
use vgpu_core::inventory::{DeviceInfo, NodeInventory};
use vgpu_core::quantity::parse_integer;
use vgpu_core::resources::ResourceNames;
use vgpu_core::time::{format_rfc3339, parse_rfc3339};

use vgpu_scheduler::extender::{node_name, ExtenderArgs, ExtenderBindingArgs};
use vgpu_scheduler::server::{AppState as SchedulerState, Settings as SchedulerSettings};

use vgpu_webhook::admission::{AdmissionRequest, AdmissionResponse};
use vgpu_webhook::metrics::Metrics;
use vgpu_webhook::mutate::{mutate_pod, MutateSettings};
use vgpu_webhook::server::decide_mutation;
use vgpu_webhook::validate::cache::{cached_pod, node_largest_card, ClusterCache};
use vgpu_webhook::validate::ledger::{Ledger, Reservation};
use vgpu_webhook::validate::quota::Quota;
use vgpu_webhook::validate::usage::pod_usage;
use vgpu_webhook::validate::{ValidateSettings, Validator};

/// A target's body: panics (an assertion) when the input breaks a property.
pub type Target = fn(&[u8]);

/// Every target: its name (the file `fuzz/fuzz_targets/<name>.rs` and the corpus directory
/// `fuzz/corpus/<name>/`) and its body.
pub const TARGETS: &[(&str, Target)] = &[
    ("accounting_parse", accounting_parse),
    ("quantity", quantity),
    ("env_values", env_values),
    ("codecs", codecs),
    ("admission_mutate", admission_mutate),
    ("admission_validate", admission_validate),
    ("extender", extender),
];

/// The snapshot's clock: 2026-12-03T12:00:00Z, in seconds.
pub const NOW_SECS: u64 = 1_796_300_000;

/// The accounting file the device plugin reads (written by the container, so hostile): any bytes
/// give a snapshot or an error; a file shorter than its header says is an error; totals saturate;
/// what parses survives a write/read round trip.
pub fn accounting_parse(data: &[u8]) {
    let parsed = Snapshot::parse(data);
    // Any file cut inside its fixed header is truncated, whatever it holds.
    let cut = &data[..data.len().min(HEADER_WORDS * 8 - 1)];
    assert!(
        matches!(Snapshot::parse(cut), Err(AccountingError::Truncated { .. })),
        "a {}-byte prefix parsed",
        cut.len()
    );
    let Ok(s) = parsed else { return };
    let _ = (s.launches(), s.oom_refusals(), s.throttled_ns());
    for d in 0..=MAX_DEVICES {
        let _ = s.used(d);
    }
    // The layout it parsed with: one byte less is an error.
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&data[i * 8..i * 8 + 8]);
        u64::from_ne_bytes(w) as usize
    };
    let need = (word(2) + word(3) * word(4)) * 8;
    assert!(need <= data.len());
    assert!(
        matches!(
            Snapshot::parse(&data[..need - 1]),
            Err(AccountingError::Truncated { .. })
        ),
        "a file one byte short of its layout ({need} bytes) parsed"
    );
    // Writing what was read and reading it back gives the same, when the writer can express it
    // (at most SLOT_COUNT processes, each with a pid: a slot owned with pid 0 reads as free).
    if s.processes.len() <= SLOT_COUNT && s.processes.iter().all(|p| p.pid != 0) {
        assert_eq!(Snapshot::parse(&s.to_bytes()).ok(), Some(s));
    }
}

/// Kubernetes quantities as the webhook, the scheduler and quota read them: any text gives a
/// whole number or an error naming the text; a number written back in decimal reads the same.
pub fn quantity(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    match parse_integer(s) {
        Ok(n) => assert_eq!(parse_integer(&n.to_string()), Ok(n), "{s:?}"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// The environment contract the hook reads (`CUDA_DEVICE_MEMORY_LIMIT[_i]` = `4096m`/`4g`/bytes,
/// `CUDA_DEVICE_SM_LIMIT[_i]`, `CUDA_VISIBLE_DEVICES`): the input is read as `KEY=VALUE` lines and
/// given to the hook's own configuration reader; each value also goes through the value parsers.
pub fn env_values(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let mut vars: HashMap<String, String> = HashMap::new();
    for line in text.lines() {
        let _ = env::is_reserved(line);
        let value = line.split_once('=').map_or(line, |(_, v)| v);
        if let Ok(b) = env::parse_memory_bytes(value) {
            if b % (1 << 20) == 0 {
                let again = env::parse_memory_bytes(&env::format_memory_mib(b >> 20));
                assert_eq!(again, Ok(b), "{value:?}");
            }
        }
        if let Ok(p) = env::parse_sm_percent(value) {
            assert!(p <= 100, "{value:?} gave {p}%");
        }
        if let Some((k, v)) = line.split_once('=') {
            vars.insert(k.to_string(), v.to_string());
        }
    }
    match vgpu::config::Config::from_vars(|k| vars.get(k).cloned()) {
        Ok(c) => {
            assert!(c.memory_limit.iter().all(|m| m.is_none_or(|b| b > 0)));
            assert!(c.sm_limit.iter().all(|&p| p <= 100));
            // Every CUDA ordinal maps to a limit slot that exists.
            for ordinal in 0..MAX_DEVICES {
                assert!(c.limit_index(ordinal) < MAX_DEVICES, "ordinal {ordinal}");
            }
        }
        Err(e) => {
            assert!(vars.contains_key(&e.var), "error names {:?}", e.var);
            assert!(e.to_string().contains(&e.var));
        }
    }
}

/// The annotations that cross processes: the injected marker, the node inventory, the assignment
/// and the heartbeat timestamp. Anything decodes or errors; what decodes survives encode/decode;
/// the scheduler's cache takes any of them as a node's or pod's annotation and still scores.
pub fn codecs(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = InjectedMarker::decode(s) {
        assert_eq!(InjectedMarker::decode(&m.encode()).ok(), Some(m));
    }
    let inventory = NodeInventory::decode(s);
    if let Ok(i) = &inventory {
        assert_eq!(NodeInventory::decode(&i.encode()).ok().as_ref(), Some(i));
    }
    let assignment = PodAssignment::decode(s);
    if let Ok(a) = &assignment {
        assert_eq!(PodAssignment::decode(&a.encode()).ok().as_ref(), Some(a));
    }
    if let Ok(t) = parse_rfc3339(s) {
        assert_eq!(parse_rfc3339(&format_rfc3339(t)), Ok(t), "{s:?}");
    }
    // The webhook reads the inventory for its largest card.
    let node = json!({"metadata": {"name": "n", "annotations": {NODE_DEVICES: s}}});
    let largest = node_largest_card(&node);
    let want = inventory
        .ok()
        .and_then(|i| i.devices.iter().map(|d| d.memory_mib).max());
    assert_eq!(largest, want);
    // The scheduler takes the text as a node's inventory and heartbeat, and as the assignment of
    // a pod placed on the fixed cluster's big node; every node still gets a decision.
    let state = scheduler_state(false);
    {
        let mut cluster = state.cluster.write().unwrap_or_else(|p| p.into_inner());
        cluster.apply_node("fuzzed", Some(s), Some(s), Some(s));
        cluster.apply_node("fuzzed-heartbeat", Some(&big_inventory()), Some(s), None);
        cluster.apply_pod("fuzzed-pod", Some("big"), assignment.ok(), false);
    }
    let args: ExtenderArgs = match serde_json::from_value(json!({
        "Pod": vgpu_pod("probe", json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"})),
        "NodeNames": ["fuzzed", "fuzzed-heartbeat", "big", "small"]}))
    {
        Ok(a) => a,
        Err(e) => panic!("fixed extender args: {e}"),
    };
    check_filter(&state, &args);
}

/// The mutating webhook: any body gives a 400 (not a review) or a review answer for the same
/// uid; a patch is base64 JSON Patch that applies to the pod (the API server refuses the pod
/// otherwise), and mutating the patched pod again changes nothing (reinvocation, second replica).
pub fn admission_mutate(data: &[u8]) {
    let Ok(request) = AdmissionRequest::from_review_bytes(data) else {
        return;
    };
    let settings = MutateSettings::default();
    let (response, label) = decide_mutation(&request, &settings);
    check_response(&request, &response);
    assert!(
        ["skipped", "invalid", "no-vgpu", "unchanged", "patched"].contains(&label),
        "{label}"
    );
    if let Some(code) = response.status.as_ref().map(|s| s.code) {
        assert!(code == 400 || code == 422, "{code}");
    }
    let Some(patch) = &response.patch else {
        return;
    };
    assert_eq!(response.patch_type, Some("JSONPatch"));
    let bytes = match base64::engine::general_purpose::STANDARD.decode(patch) {
        Ok(b) => b,
        Err(e) => panic!("patch is not base64: {e}"),
    };
    let patch: json_patch::Patch = match serde_json::from_slice(&bytes) {
        Ok(p) => p,
        Err(e) => panic!("patch is not a JSON Patch: {e}"),
    };
    let mut pod = request.object.clone().unwrap_or(Value::Null);
    if let Err(e) = json_patch::patch(&mut pod, &patch) {
        panic!("patch does not apply to the pod: {e}\npatch: {patch:?}");
    }
    match mutate_pod(&pod, &settings) {
        Ok(again) => assert!(
            again.patch.0.is_empty(),
            "mutating the mutated pod patches again: {:?}\npod: {pod}",
            again.patch
        ),
        Err(e) => panic!("the mutated pod is refused: {e}\npod: {pod}"),
    }
}

/// The validating webhook on a fixed snapshot (quotas, cached pods, ledger, node inventory):
/// any body gives a 400 or an answer for the same uid; the decision without API access (what
/// `/validate` answers when it has none) agrees with the snapshot decision wherever quota is not
/// involved; a written ledger holds the pod's reservation and every live one before it.
pub fn admission_validate(data: &[u8]) {
    let _ = validate_on_snapshot(data);
}

/// [`admission_validate`], returning the snapshot decision's label (None for a 400).
pub fn validate_on_snapshot(data: &[u8]) -> Option<&'static str> {
    let request = AdmissionRequest::from_review_bytes(data).ok()?;
    let v = validator();
    let ledger = snapshot_ledger();
    let now_ms = NOW_SECS * 1000;
    let ((response, label), written) = v.decide_on_snapshot(&request, &ledger, now_ms);
    check_response(&request, &response);
    assert!(
        ["skipped", "invalid", "no-vgpu", "policy", "no-quota", "reserved", "quota"]
            .contains(&label),
        "{label}"
    );
    if let Some(code) = response.status.as_ref().map(|s| s.code) {
        assert!([400, 403, 422].contains(&code), "{code}");
    }
    if let Some(next) = written {
        assert!(response.allowed);
        let live = ledger
            .reservations
            .iter()
            .filter(|r| r.expires_ms > now_ms)
            .count();
        assert_eq!(next.reservations.len(), live + 1);
    }
    // The handler's own path (no API client: quota is not checked).
    let rt = runtime()?;
    let (offline, offline_label) = rt.block_on(v.decide(&request));
    check_response(&request, &offline);
    if offline_label == "no-quota" {
        assert!(["no-quota", "reserved", "quota", "invalid"].contains(&label));
    } else {
        assert_eq!((offline, offline_label), (response.clone(), label));
    }
    Some(label)
}

/// The scheduler extender: any body is ExtenderArgs / ExtenderBindingArgs JSON or a 400; filter
/// over a fixed cluster answers for every candidate exactly once, passes only candidates, agrees
/// with the placement it would bind; prioritize scores every candidate 0..=10 in order.
pub fn extender(data: &[u8]) {
    if let Ok(b) = serde_json::from_slice::<ExtenderBindingArgs>(data) {
        let again = serde_json::to_vec(&b)
            .ok()
            .and_then(|j| serde_json::from_slice::<ExtenderBindingArgs>(&j).ok());
        assert_eq!(again, Some(b));
    }
    let Ok(args) = serde_json::from_slice::<ExtenderArgs>(data) else {
        return;
    };
    check_filter(&scheduler_state(false), &args);
    check_choose(&scheduler_state(false), &scheduler_state(true), &args);
}

/// The default `choose_node` filter against the every-node one on the same cluster: the same
/// failures; for a vGPU pod one passing node, one with the best score (the smallest name among
/// equals); for any other pod the same nodes.
fn check_choose(every: &SchedulerState, choose: &SchedulerState, args: &ExtenderArgs) {
    let now = NOW_SECS;
    let (all, one) = (every.filter(args, now), choose.filter(args, now));
    assert_eq!(one.failed_nodes, all.failed_nodes);
    assert_eq!(
        one.failed_and_unresolvable_nodes,
        all.failed_and_unresolvable_nodes
    );
    assert_eq!(one.error, all.error);
    let names = |r: &vgpu_scheduler::extender::ExtenderFilterResult| {
        candidate_names(r.nodenames.as_ref(), r.nodes.as_ref())
    };
    let (all_names, one_names) = (names(&all), names(&one));
    let Some(pod) = &args.pod else { return };
    let req = match vgpu_scheduler::pod::pod_request(
        pod,
        &choose.settings.request_policy,
        choose.settings.node_policy,
        choose.settings.gpu_policy,
    ) {
        Ok(Some(req)) => req,
        _ => {
            assert_eq!(one_names, all_names);
            return;
        }
    };
    assert_eq!(
        one_names.len(),
        all_names.len().min(1),
        "{one_names:?} of {all_names:?}"
    );
    let Some(chosen) = one_names.first() else {
        return;
    };
    assert!(all_names.contains(chosen));
    // The filter held its choice for the pod; the comparison is of the nodes without it.
    if let Some(uid) = pod.metadata.uid.as_deref() {
        choose
            .cluster
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .forget(uid);
    }
    let cluster = choose.cluster.read().unwrap_or_else(|p| p.into_inner());
    let scorer = cluster.scorer(&req, now);
    // Nodes are chosen by rank (the score before it is clamped into 0..=10).
    let rank = |n: &str| {
        scorer
            .standing_at(n, &mut None, &mut vgpu_core::placement::PlaceBuf::default())
            .map_or(i64::MIN, |s| s.rank)
    };
    for n in &all_names {
        let (s, c) = (rank(n), rank(chosen));
        assert!(
            s < c || (s == c && chosen <= n),
            "{chosen} ({c}) chosen over {n} ({s})"
        );
    }
}

/// The node names of extender args or a filter result: `nodenames` when given, else the names
/// of the `nodes` list.
fn candidate_names(
    nodenames: Option<&Vec<String>>,
    nodes: Option<&vgpu_scheduler::extender::NodeList>,
) -> Vec<String> {
    match (nodenames, nodes) {
        (Some(n), _) => n.clone(),
        (None, Some(l)) => l
            .items
            .iter()
            .filter_map(node_name)
            .map(str::to_string)
            .collect(),
        (None, None) => Vec::new(),
    }
}

fn check_filter(state: &SchedulerState, args: &ExtenderArgs) {
    let now = NOW_SECS;
    let names = candidate_names(args.nodenames.as_ref(), args.nodes.as_ref());
    let r = state.filter(args, now);
    if serde_json::to_vec(&r).is_err() {
        panic!("filter result does not serialise");
    }
    if args.pod.is_none() {
        assert!(!r.error.is_empty());
        return;
    }
    assert!(r.error.is_empty(), "{}", r.error);
    let passed: Vec<String> = match (&args.nodenames, &r.nodes, &r.nodenames) {
        (None, Some(list), _) => {
            for item in &list.items {
                assert!(args.nodes.as_ref().is_some_and(|l| l.items.contains(item)));
            }
            list.items
                .iter()
                .filter_map(node_name)
                .map(str::to_string)
                .collect()
        }
        (_, _, Some(n)) => n.clone(),
        (Some(_), _, None) => Vec::new(),
        (None, None, None) => panic!("filter returned neither nodes nor nodenames"),
    };
    if args.nodenames.is_some() || args.nodes.is_none() {
        assert_eq!(
            passed.len() + r.failed_nodes.len() + r.failed_and_unresolvable_nodes.len(),
            names.len(),
            "every candidate answered once"
        );
    }
    for p in &passed {
        assert!(names.contains(p), "{p} passed but was not a candidate");
    }
    // prioritize: one score per candidate, in order, within MaxExtenderPriority.
    let scores = state.prioritize(args, now);
    assert_eq!(scores.len(), names.len());
    for (s, n) in scores.iter().zip(&names) {
        assert_eq!(&s.host, n);
        assert!((0..=10).contains(&s.score), "{n}: {}", s.score);
    }
    // The score the filter used is the decision bind would make.
    let Some(pod) = &args.pod else { return };
    let Ok(Some(req)) = vgpu_scheduler::pod::pod_request(
        pod,
        &state.settings.request_policy,
        state.settings.node_policy,
        state.settings.gpu_policy,
    ) else {
        return;
    };
    let cluster = state.cluster.read().unwrap_or_else(|p| p.into_inner());
    for n in &names {
        let score = cluster.score(n, &req, now);
        let check = cluster.check(n, &req, now);
        match (&score, &check) {
            (Ok(s), Ok((placement, c))) => {
                assert_eq!(s, c, "{n}");
                assert_eq!(placement.len(), req.containers.len(), "{n}");
            }
            (Err(a), Err(b)) => assert_eq!(a, b, "{n}"),
            _ => panic!("{n}: score {score:?} but check {check:?}"),
        }
    }
}

fn check_response(request: &AdmissionRequest, response: &AdmissionResponse) {
    assert_eq!(response.uid, request.uid);
    assert_eq!(response.allowed, response.status.is_none());
    let body = match serde_json::to_value(response.clone().into_review()) {
        Ok(b) => b,
        Err(e) => panic!("review does not serialise: {e}"),
    };
    assert_eq!(body["response"]["uid"], request.uid.as_str());
}

fn runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RT: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .ok()
    })
    .as_ref()
}

/// A pod with one container `main` with these limits, in namespace team-a.
pub fn vgpu_pod(name: &str, limits: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("uid-{name}")},
        "spec": {"containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]}})
}

fn device(uuid: &str, model: &str, mib: u64, split: u32) -> DeviceInfo {
    DeviceInfo {
        uuid: uuid.into(),
        index: 0,
        model: model.into(),
        memory_mib: mib,
        cores: 100,
        split,
        numa: Some(0),
        healthy: true,
        vendor: String::new(),
        nvlinks: Default::default(),
    }
}

fn big_inventory() -> String {
    NodeInventory::new(vec![
        device("GPU-big-0", "NVIDIA A100-SXM4-80GB", 81920, 10),
        device("GPU-big-1", "NVIDIA A100-SXM4-80GB", 81920, 10),
    ])
    .encode()
}

/// The scheduler's fixed cluster: `big` (two 80 GiB cards, one slice placed), `small` (one T4,
/// two slices), `stale` (old heartbeat), `broken` (unreadable inventory), `sick` (unhealthy card).
/// Fresh for every input, so one input's filter cannot change the next one's prioritize.
fn scheduler_state(choose_node: bool) -> SchedulerState {
    let settings = SchedulerSettings {
        choose_node,
        ..SchedulerSettings::default()
    };
    let state = SchedulerState::new(settings, None);
    let fresh = format_rfc3339(NOW_SECS - 10);
    {
        let mut c = state.cluster.write().unwrap_or_else(|p| p.into_inner());
        c.apply_node("big", Some(&big_inventory()), Some(&fresh), None);
        let small = NodeInventory::new(vec![device("GPU-small-0", "Tesla T4", 15360, 2)]).encode();
        c.apply_node("small", Some(&small), Some(&fresh), None);
        c.apply_node(
            "stale",
            Some(&small),
            Some(&format_rfc3339(NOW_SECS - 3600)),
            None,
        );
        c.apply_node("broken", Some("{not json"), Some(&fresh), None);
        let mut sick = device("GPU-sick-0", "Tesla T4", 15360, 4);
        sick.healthy = false;
        c.apply_node(
            "sick",
            Some(&NodeInventory::new(vec![sick]).encode()),
            Some(&fresh),
            None,
        );
        let placed = PodAssignment::decode(
            r#"{"version":1,"node":"big","containers":[{"name":"main","devices":[{"uuid":"GPU-big-0","memoryMib":40960,"cores":50}]}]}"#,
        )
        .ok();
        c.apply_pod("uid-placed", Some("big"), placed, false);
    }
    state
}

fn quota(value: Value) -> Option<Quota> {
    Quota::from_object(&value, &ResourceNames::default())
}

/// The webhook's fixed snapshot: team-a has a gpumem/gpu quota, a quota scoped to priority class
/// `high`, one cached pod and a ledger (see [`snapshot_ledger`]); team-b has a quota vgpu cannot
/// evaluate; team-c none. The largest card is 81920 MiB.
fn validator() -> &'static Validator {
    static V: OnceLock<Validator> = OnceLock::new();
    V.get_or_init(|| {
        let settings = ValidateSettings::default();
        let cache = Arc::new(ClusterCache::default());
        cache.load_cards([("big".to_string(), 81920), ("small".to_string(), 15360)]);
        cache.load_quotas(
            [
                quota(json!({"metadata": {"name": "gpu", "namespace": "team-a"},
                    "spec": {"hard": {"limits.nvidia.com/gpumem": "16384", "nvidia.com/gpu": "4",
                        "requests.nvidia.com/gpucores": "300"}}})),
                quota(json!({"metadata": {"name": "high", "namespace": "team-a"},
                    "spec": {"hard": {"nvidia.com/gpumem": "8192"},
                        "scopeSelector": {"matchExpressions": [{"scopeName": "PriorityClass",
                            "operator": "In", "values": ["high"]}]}}})),
                quota(json!({"metadata": {"name": "odd", "namespace": "team-b"},
                    "spec": {"hard": {"nvidia.com/gpumem": "1.5"}}})),
            ]
            .into_iter()
            .flatten(),
        );
        let policy = settings.policy.clone();
        cache.load_pods(
            [vgpu_pod(
                "running",
                json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}),
            )]
            .iter()
            .filter_map(|p| cached_pod(p, &policy, 81920))
            .map(|p| ("team-a".to_string(), p)),
        );
        Validator::with_cache(settings, cache, None, Arc::new(Metrics::new()))
    })
}

/// team-a's ledger: one live reservation of a pod not cached yet, one expired.
fn snapshot_ledger() -> Ledger {
    let usage = pod_usage(
        &vgpu_pod(
            "pending",
            json!({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2048"}),
        ),
        &ValidateSettings::default().policy,
        81920,
    )
    .unwrap_or_default();
    let now_ms = NOW_SECS * 1000;
    let at = |uid: &str, expires_ms: u64| Reservation {
        uid: uid.into(),
        pod: uid.into(),
        expires_ms,
        usage: usage.clone(),
    };
    Ledger {
        reservations: vec![
            at("uid-pending", now_ms + 30_000),
            at("uid-gone", now_ms - 1),
        ],
        confirmed: Vec::new(),
    }
}
