#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! The validate decision from the caches, without the network: policy rules, usage of the
//! namespace (cached pods + ledger reservations) and every quota, with 10 000 vGPU pods in 100
//! namespaces and 100 quotas cached. `cargo bench -p vgpu-webhook --bench validate`
//!
//! The API round-trip that writes the reservation is not in here: `vgpu-validate-load` measures
//! the whole path against the fake API server.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use std::hint::black_box;
use vgpu_core::request::RequestPolicy;
use vgpu_core::resources::ResourceNames;
use vgpu_webhook::validate::cache::{cached_pod, ClusterCache};
use vgpu_webhook::validate::ledger::{self, Ledger};
use vgpu_webhook::validate::policy::{self, PolicyRules};
use vgpu_webhook::validate::quota::Quota;
use vgpu_webhook::validate::usage::pod_usage;

const NAMESPACES: usize = 100;
const PODS: usize = 10_000;

fn pod(ns: &str, name: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{ns}-{name}")},
        "spec": {"containers": [{"name": "train",
            "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4096"}},
            "env": [{"name": "HOME", "value": "/home/train"}]}]}})
}

fn bench(c: &mut Criterion) {
    let policy = RequestPolicy::default();
    let cache = ClusterCache::default();
    cache.load_pods((0..PODS).filter_map(|i| {
        let ns = format!("team-{}", i % NAMESPACES);
        cached_pod(&pod(&ns, &format!("p{i}")), &policy, 81920).map(|p| (ns, p))
    }));
    cache.load_quotas((0..NAMESPACES).filter_map(|i| {
        Quota::from_object(
            &json!({"metadata": {"name": "gpu-quota", "namespace": format!("team-{i}")},
                "spec": {"hard": {"limits.nvidia.com/gpumem": "10000000", "nvidia.com/gpu": "100000"}}}),
            &ResourceNames::default(),
        )
    }));
    cache.load_cards([("node-1".to_string(), 81920)]);
    // Ten reservations of pods not yet cached in the namespace's ledger.
    let ledger = Ledger {
        reservations: (0..10)
            .map(|i| {
                let u = pod_usage(&pod("team-7", "x"), &policy, 81920).unwrap_or_default();
                ledger::reservation(
                    &format!("r{i}"),
                    &format!("r{i}"),
                    u,
                    std::time::Duration::from_secs(600),
                )
            })
            .collect(),
        confirmed: Vec::new(),
    };
    let incoming_pod = pod("team-7", "new");
    let rules = PolicyRules::default();

    let mut group = c.benchmark_group("validate");
    group.throughput(Throughput::Elements(1));
    // Baseline in the same run: parsing the pod object into a Value, which every review pays.
    let text = incoming_pod.to_string();
    group.bench_function("baseline_parse_pod_json", |b| {
        b.iter(|| serde_json::from_str::<Value>(black_box(&text)).unwrap_or_default())
    });
    group.bench_function("decide_from_cache/10k_pods_100_quotas", |b| {
        b.iter(|| {
            let p = black_box(&incoming_pod);
            let containers = policy::vgpu_containers(p, &policy).unwrap_or_default();
            let largest = cache.largest_card_mib();
            let ok = policy::check(p, "bench", true, &containers, &rules, largest).is_ok();
            let usage = pod_usage(p, &policy, largest.unwrap_or(0)).unwrap_or_default();
            let incoming =
                ledger::reservation("uid-new", "new", usage, std::time::Duration::from_secs(60));
            let quotas = cache.quotas("team-7");
            let decision = cache.with_pods("team-7", |pods| {
                ledger::attempt(
                    "team-7",
                    &ledger,
                    pods,
                    &quotas,
                    &incoming,
                    ledger::now_ms(),
                    &|uid| cache.was_seen(uid),
                )
            });
            (ok, decision)
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
