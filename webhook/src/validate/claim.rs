//! ResourceClaims and ResourceClaimTemplates against DeviceClass `gpu.vgpu.io` (DRA mode,
//! docs/dra.md): what kube-scheduler would only answer with "cannot allocate all claims" is
//! refused at admission, naming the field.
//!
//! A request (`spec.devices.requests[i].exactly`, or each `firstAvailable[j]` alternative) of our
//! class may ask the capacities `memory` (bytes, whole) and `cores` (whole percents of the SMs);
//! anything else, a fraction, cores above what a card has or memory above the largest card is
//! refused. With the driver's ResourceSlices at hand, the request's CEL selectors are also run
//! against every published GPU, as kube-scheduler would (`device.driver`,
//! `device.attributes["gpu.vgpu.io"].<name>`): when the GPUs they match are all unhealthy (taint
//! `gpu.vgpu.io/unhealthy`), or none matches, the claim is admitted with a warning that says so,
//! since health and nodes change and the claim may wait.
//!
//! Shapes: `resource.k8s.io/v1` `ResourceClaimSpec.devices.requests[]` (`DeviceRequest` with
//! `exactly: ExactDeviceRequest {deviceClassName, selectors[].cel.expression, capacity.requests}`
//! or `firstAvailable: [DeviceSubRequest]`), k8s-openapi `v1_36`.

use serde_json::Value;
use vgpu_core::dra::{asked, requests};
pub use vgpu_core::dra::{cards, Card, CLASS, UNHEALTHY_TAINT};

/// Whether `object` (a claim or a template) asks DeviceClass `gpu.vgpu.io` anywhere.
pub fn asks_for_us(kind: &str, object: &Value) -> bool {
    !requests(kind, object).is_empty()
}

fn mib_text(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 30) {
        format!("{}Gi", bytes >> 30)
    } else {
        format!("{}Mi", bytes >> 20)
    }
}

/// `device` as the selectors see it (kube-scheduler's CEL environment: `device.driver`,
/// `device.attributes[domain]`, `device.capacity[domain]`, `device.allowMultipleAllocations`).
fn cel_device(card: &Card) -> cel::Value {
    let device = serde_json::json!({
        "driver": CLASS,
        "allowMultipleAllocations": true,
        "attributes": {CLASS: card.attributes},
        "capacity": {CLASS: {"memory": card.memory, "cores": card.cores}},
    });
    cel::to_value(device).unwrap_or(cel::Value::Null)
}

/// Whether `card` passes every selector of `request`; `None` when one cannot be evaluated here
/// (a function this evaluator lacks, such as `semver`).
fn selected(request: &Value, card: &Card) -> Option<bool> {
    let mut ctx = cel::Context::default();
    ctx.add_variable_from_value("device", cel_device(card));
    for s in request["selectors"].as_array().into_iter().flatten() {
        let expr = s["cel"]["expression"].as_str()?;
        let program = cel::Program::compile(expr).ok()?;
        match program.execute(&ctx) {
            Ok(cel::Value::Bool(true)) => {}
            Ok(cel::Value::Bool(false)) => return Some(false),
            _ => return None,
        }
    }
    Some(true)
}

/// The decision for a claim or template: `Err` a refusal naming the field, `Ok` the warnings.
/// `cards`: the published GPUs, when known (`None`: no API; only what needs no cards is checked).
pub fn check(kind: &str, object: &Value, cards: Option<&[Card]>) -> Result<Vec<String>, String> {
    let cards = cards.filter(|c| !c.is_empty());
    let mut warnings = Vec::new();
    for (path, r) in requests(kind, object) {
        let (memory, cores) = asked(&path, r)?;
        let field = |name: &str| format!("{path}.capacity.requests.{name}");
        if let Some(n) = cores {
            let most = cards
                .and_then(|c| c.iter().map(|c| c.cores).max())
                .unwrap_or(100);
            if n > most {
                return Err(format!(
                    "{}: {n} is more than a GPU has ({most}, percent of its SMs)",
                    field("cores")
                ));
            }
        }
        if let (Some(n), Some(card)) = (
            memory,
            cards.and_then(|c| c.iter().max_by_key(|c| c.memory)),
        ) {
            if n > card.memory {
                return Err(format!(
                    "{}: {} is more than the largest GPU of class {CLASS} has ({} on node {})",
                    field("memory"),
                    r["capacity"]["requests"]["memory"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| mib_text(n)),
                    mib_text(card.memory),
                    card.node
                ));
            }
        }
        let want = (memory.unwrap_or(0), cores.unwrap_or(0));
        let Some(cards) = cards else { continue };
        let mut fitting = Vec::new();
        for card in cards
            .iter()
            .filter(|c| c.memory >= want.0 && c.cores >= want.1)
        {
            match selected(r, card) {
                None => {
                    fitting.clear();
                    break;
                }
                Some(false) => {}
                Some(true) => fitting.push(card),
            }
        }
        if r["selectors"].as_array().is_some_and(|s| !s.is_empty()) && fitting.is_empty() {
            if cards.iter().all(|c| selected(r, c).is_some()) {
                warnings.push(format!(
                    "{path}.selectors: no GPU of class {CLASS} that is large enough matches them now; the claim stays unallocated until one does"
                ));
            }
        } else if !fitting.is_empty() && fitting.iter().all(|c| c.unhealthy) {
            let names: Vec<String> = fitting
                .iter()
                .map(|c| format!("{} ({}) on node {}", c.uuid, c.device, c.node))
                .collect();
            warnings.push(format!(
                "{path}: every GPU it can use is unhealthy ({}: taint {UNHEALTHY_TAINT}); the claim stays unallocated until one recovers",
                names.join(", ")
            ));
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn slice(devices: Value) -> Value {
        json!({
            "metadata": {"name": "vm-gpu.vgpu.io"},
            "spec": {"driver": "gpu.vgpu.io", "nodeName": "vm",
                "pool": {"name": "vm", "generation": 1, "resourceSliceCount": 1},
                "devices": devices}
        })
    }

    fn gpu(i: u32, uuid: &str, unhealthy: bool) -> Value {
        let mut d = json!({"name": format!("gpu-{i}"), "allowMultipleAllocations": true,
            "attributes": {"uuid": {"string": uuid}, "index": {"int": i},
                "productName": {"string": "NVIDIA A10"}, "driverVersion": {"version": "550.54.15"}},
            "capacity": {"memory": {"value": "24Gi"}, "cores": {"value": "100"}}});
        if unhealthy {
            d["taints"] =
                json!([{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}]);
        }
        d
    }

    fn claim(exactly: Value) -> Value {
        json!({"kind": "ResourceClaim", "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}})
    }

    #[test]
    fn impossible_requests_are_refused_naming_the_field() {
        let cards = cards(&[slice(json!([gpu(0, "GPU-a", false)]))]);
        let c = claim(
            json!({"deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"cores": "150"}}}),
        );
        assert_eq!(
            check("ResourceClaim", &c, Some(&cards)).unwrap_err(),
            "spec.devices.requests[0].exactly.capacity.requests.cores: 150 is more than a GPU has (100, percent of its SMs)"
        );
        // Without the slices, a card is taken to have 100 %.
        assert!(check("ResourceClaim", &c, None).is_err());
        let c = claim(
            json!({"deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"memory": "48Gi"}}}),
        );
        assert_eq!(
            check("ResourceClaim", &c, Some(&cards)).unwrap_err(),
            "spec.devices.requests[0].exactly.capacity.requests.memory: 48Gi is more than the largest GPU of class gpu.vgpu.io has (24Gi on node vm)"
        );
        assert!(check("ResourceClaim", &c, None).unwrap().is_empty());
        let c = claim(
            json!({"deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"gpumem": "4096"}}}),
        );
        assert_eq!(
            check("ResourceClaim", &c, None).unwrap_err(),
            "spec.devices.requests[0].exactly.capacity.requests.gpumem: devices of class gpu.vgpu.io have the capacities memory (bytes) and cores (percent of the SMs)"
        );
        let c = claim(
            json!({"deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"cores": "12.5"}}}),
        );
        assert!(check("ResourceClaim", &c, None)
            .unwrap_err()
            .contains("cores is a whole number"));
        // Another class is not ours to judge; a template's paths start at spec.spec.
        let other = claim(
            json!({"deviceClassName": "gpu.nvidia.com", "capacity": {"requests": {"cores": "150"}}}),
        );
        assert!(!asks_for_us("ResourceClaim", &other));
        let t = json!({"kind": "ResourceClaimTemplate", "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "firstAvailable": [
                {"name": "small", "deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"cores": "30"}}},
                {"name": "big", "deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"cores": "101"}}}]}]}}}});
        assert_eq!(
            check("ResourceClaimTemplate", &t, None).unwrap_err(),
            "spec.spec.devices.requests[0].firstAvailable[1].capacity.requests.cores: 101 is more than a GPU has (100, percent of its SMs)"
        );
    }

    #[test]
    fn a_claim_only_unhealthy_gpus_can_serve_is_admitted_with_a_warning() {
        let cards = cards(&[slice(json!([
            gpu(0, "GPU-a", true),
            gpu(1, "GPU-b", false)
        ]))]);
        let on = |uuid: &str| {
            claim(json!({"deviceClassName": "gpu.vgpu.io",
                "selectors": [{"cel": {"expression": format!("device.attributes[\"gpu.vgpu.io\"].uuid == \"{uuid}\"")}}],
                "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}))
        };
        assert_eq!(
            check("ResourceClaim", &on("GPU-a"), Some(&cards)).unwrap(),
            vec!["spec.devices.requests[0].exactly: every GPU it can use is unhealthy (GPU-a (gpu-0) on node vm: taint gpu.vgpu.io/unhealthy); the claim stays unallocated until one recovers"]
        );
        assert!(check("ResourceClaim", &on("GPU-b"), Some(&cards))
            .unwrap()
            .is_empty());
        assert_eq!(
            check("ResourceClaim", &on("GPU-z"), Some(&cards)).unwrap(),
            vec!["spec.devices.requests[0].exactly.selectors: no GPU of class gpu.vgpu.io that is large enough matches them now; the claim stays unallocated until one does"]
        );
        // A selector this evaluator cannot run says nothing rather than something wrong.
        let semver = claim(json!({"deviceClassName": "gpu.vgpu.io",
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.vgpu.io\"].driverVersion.isGreaterThan(semver(\"1.0.0\"))"}}]}));
        assert!(check("ResourceClaim", &semver, Some(&cards))
            .unwrap()
            .is_empty());
        let by_model = claim(json!({"deviceClassName": "gpu.vgpu.io",
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.vgpu.io\"].productName == \"NVIDIA A10\" && device.attributes[\"gpu.vgpu.io\"].index == 0"}}]}));
        assert_eq!(
            check("ResourceClaim", &by_model, Some(&cards))
                .unwrap()
                .len(),
            1
        );
    }
}
