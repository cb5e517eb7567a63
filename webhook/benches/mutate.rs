#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! The mutate path without the network: parse an AdmissionReview, decide, serialise the response.
//! `cargo bench -p vgpu-webhook --bench mutate`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use vgpu_webhook::admission::AdmissionRequest;
use vgpu_webhook::mutate::MutateSettings;
use vgpu_webhook::server::decide_mutation;

const EXAMPLE: &str = include_str!("../../examples/admission-review.json");

fn full_path(body: &[u8], settings: &MutateSettings) -> Vec<u8> {
    let req = AdmissionRequest::from_review_bytes(body).unwrap_or_else(|e| panic!("{e}"));
    let (resp, _) = decide_mutation(&req, settings);
    serde_json::to_vec(&resp.into_review()).unwrap_or_default()
}

fn bench(c: &mut Criterion) {
    let settings = MutateSettings::default();
    let mut group = c.benchmark_group("mutate");
    group.throughput(Throughput::Elements(1));

    // Baseline in the same run: just parsing the JSON body into a Value.
    group.bench_function("baseline_parse_json_value", |b| {
        b.iter(|| {
            serde_json::from_slice::<serde_json::Value>(black_box(EXAMPLE.as_bytes()))
                .unwrap_or_default()
        })
    });
    group.bench_function("parse_decide_serialize/example_pod", |b| {
        b.iter(|| full_path(black_box(EXAMPLE.as_bytes()), &settings))
    });
    // A pod with eight GPU containers and user env to replace.
    let mut big: serde_json::Value = serde_json::from_str(EXAMPLE).unwrap_or_default();
    let container = big["request"]["object"]["spec"]["containers"][0].clone();
    let mut cs = Vec::new();
    for i in 0..8 {
        let mut c = container.clone();
        c["name"] = serde_json::json!(format!("c{i}"));
        c["env"] = serde_json::json!([{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}, {"name": "A", "value": "b"}]);
        cs.push(c);
    }
    big["request"]["object"]["spec"]["containers"] = serde_json::Value::Array(cs);
    let big = big.to_string();
    group.bench_function("parse_decide_serialize/eight_containers", |b| {
        b.iter(|| full_path(black_box(big.as_bytes()), &settings))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
