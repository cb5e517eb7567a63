//! DRA mode's shared model (docs/dra.md): the names every part uses, the GPUs as the driver's
//! ResourceSlices publish them, what a claim's requests of class `gpu.vgpu.io` ask, what allocated
//! claims hold, and why a claim cannot be allocated. Pure, over the objects' JSON
//! (`resource.k8s.io/v1`: `ResourceSlice.spec.devices[]` with `capacity.<name>.value`,
//! `attributes` and `taints`; `ResourceClaimSpec.devices.requests[]` with `exactly` or
//! `firstAvailable[]`, each a `deviceClassName`, `selectors` and `capacity.requests`; the
//! allocation's `status.allocation.devices.results[]` with `driver`, `pool`, `device` and
//! `consumedCapacity`).

use crate::quantity::parse_integer;
use serde_json::Value;
use std::collections::BTreeMap;

/// The driver, the DeviceClass and the attributes' domain.
pub const CLASS: &str = "gpu.vgpu.io";
/// Device memory capacity, in bytes (requests in whole MiB).
pub const MEMORY: &str = "memory";
/// Streaming-multiprocessor capacity, in percent of the card.
pub const CORES: &str = "cores";
/// The taint the DRA plugin puts on an unhealthy GPU.
pub const UNHEALTHY_TAINT: &str = "gpu.vgpu.io/unhealthy";
const MIB: u64 = 1 << 20;

/// One published GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Card {
    /// Node (the slice's `nodeName`).
    pub node: String,
    /// Pool.
    pub pool: String,
    /// Device name in the pool.
    pub device: String,
    /// `uuid` attribute.
    pub uuid: String,
    /// `memory` capacity, bytes.
    pub memory: u64,
    /// `cores` capacity.
    pub cores: u64,
    /// Tainted unhealthy.
    pub unhealthy: bool,
    /// Attributes as plain values (`string`, `int`, `bool`; a `version` as its string).
    pub attributes: serde_json::Map<String, Value>,
}

/// The GPUs of driver `gpu.vgpu.io` in `slices` (ResourceSlice objects).
pub fn cards(slices: &[Value]) -> Vec<Card> {
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| s["spec"]["driver"] == CLASS) {
        let node = s["spec"]["nodeName"].as_str().unwrap_or_default();
        let pool = s["spec"]["pool"]["name"].as_str().unwrap_or_default();
        for d in s["spec"]["devices"].as_array().into_iter().flatten() {
            let attributes: serde_json::Map<String, Value> = d["attributes"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, a)| {
                    let v = ["string", "int", "bool", "version"]
                        .iter()
                        .find_map(|t| a.get(*t).cloned())
                        .unwrap_or(Value::Null);
                    (k.clone(), v)
                })
                .collect();
            let cap = |name: &str| {
                d["capacity"][name]["value"]
                    .as_str()
                    .and_then(|q| parse_integer(q).ok())
                    .unwrap_or(0)
            };
            out.push(Card {
                node: node.to_string(),
                pool: pool.to_string(),
                device: d["name"].as_str().unwrap_or_default().to_string(),
                uuid: attributes
                    .get("uuid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                memory: cap(MEMORY),
                cores: cap(CORES),
                unhealthy: d["taints"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|t| t["key"] == UNHEALTHY_TAINT),
                attributes,
            });
        }
    }
    out
}

/// `(field path, request)` of every request or `firstAvailable` alternative of class
/// `gpu.vgpu.io` in a ResourceClaim or (with `kind` `ResourceClaimTemplate`) a template.
pub fn requests<'a>(kind: &str, object: &'a Value) -> Vec<(String, &'a Value)> {
    let (prefix, spec) = if kind == "ResourceClaimTemplate" {
        ("spec.spec", &object["spec"]["spec"])
    } else {
        ("spec", &object["spec"])
    };
    let mut out = Vec::new();
    for (i, r) in spec["devices"]["requests"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let base = format!("{prefix}.devices.requests[{i}]");
        if r["exactly"].is_object() {
            out.push((format!("{base}.exactly"), &r["exactly"]));
        }
        for (j, s) in r["firstAvailable"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            out.push((format!("{base}.firstAvailable[{j}]"), s));
        }
    }
    out.retain(|(_, r)| r["deviceClassName"] == CLASS);
    out
}

/// What one request asks of one GPU: memory in bytes and cores, `None` where it names no amount
/// (the request policy's default: the whole card's memory, no cores). `Err` names the field.
pub fn asked(path: &str, request: &Value) -> Result<(Option<u64>, Option<u64>), String> {
    let mut want = (None, None);
    for (name, q) in request["capacity"]["requests"]
        .as_object()
        .into_iter()
        .flatten()
    {
        let field = format!("{path}.capacity.requests.{name}");
        if name != MEMORY && name != CORES {
            return Err(format!(
                "{field}: devices of class {CLASS} have the capacities memory (bytes) and cores (percent of the SMs)"
            ));
        }
        let text = q
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| q.to_string());
        let n =
            parse_integer(&text).map_err(|e| format!("{field}: {e}: {name} is a whole number"))?;
        if name == MEMORY {
            want.0 = Some(n);
        } else {
            want.1 = Some(n);
        }
    }
    Ok(want)
}

/// Memory (bytes) and cores held per `(pool, device)` by the allocated claims among `claims`.
pub fn held(claims: &[Value]) -> BTreeMap<(String, String), (u64, u64)> {
    let mut out = BTreeMap::new();
    for c in claims {
        for r in c["status"]["allocation"]["devices"]["results"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["driver"] == CLASS)
        {
            let amount = |name: &str| {
                r["consumedCapacity"][name]
                    .as_str()
                    .and_then(|q| parse_integer(q).ok())
                    .unwrap_or(0)
            };
            let key = (
                r["pool"].as_str().unwrap_or_default().to_string(),
                r["device"].as_str().unwrap_or_default().to_string(),
            );
            let h = out.entry(key).or_insert((0, 0));
            h.0 += amount(MEMORY);
            h.1 += amount(CORES);
        }
    }
    out
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(MIB))
}

/// Why `claim` (unallocated) cannot get its GPUs, when it is their free capacity: for the first
/// request whose share no healthy GPU has free, what it needs and what each GPU has. `None` when
/// some GPU has room for every request (then it is something else: selectors, the pod's node).
pub fn unallocatable(
    claim: &Value,
    cards: &[Card],
    held: &BTreeMap<(String, String), (u64, u64)>,
) -> Option<String> {
    for (path, r) in requests("ResourceClaim", claim) {
        let (memory, cores) = asked(&path, r).ok()?;
        let count = r["count"].as_u64().unwrap_or(1);
        let free = |c: &Card| {
            let h = held
                .get(&(c.pool.clone(), c.device.clone()))
                .copied()
                .unwrap_or((0, 0));
            (c.memory.saturating_sub(h.0), c.cores.saturating_sub(h.1))
        };
        let fits = |c: &&Card| {
            let (m, k) = free(c);
            !c.unhealthy && m >= memory.unwrap_or(c.memory) && k >= cores.unwrap_or(0)
        };
        if cards.iter().filter(fits).count() as u64 >= count {
            continue;
        }
        let need = format!(
            "{} and {} cores",
            memory
                .map(mib)
                .unwrap_or_else(|| "a whole GPU's memory".into()),
            cores.unwrap_or(0)
        );
        let have: Vec<String> = cards
            .iter()
            .map(|c| {
                let (m, k) = free(c);
                format!(
                    "{}/{} {} and {k} cores free{}",
                    c.node,
                    c.device,
                    mib(m),
                    if c.unhealthy { " (unhealthy)" } else { "" }
                )
            })
            .collect();
        let gpus = if count == 1 {
            "one GPU".to_string()
        } else {
            format!("each of {count} GPUs")
        };
        return Some(if have.is_empty() {
            format!("{path} needs {need} of {gpus} of class {CLASS}, and no node publishes one")
        } else {
            format!(
                "{path} needs {need} of {gpus} of class {CLASS}; free now: {}",
                have.join(", ")
            )
        });
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn slice() -> Value {
        json!({"spec": {"driver": "gpu.vgpu.io", "nodeName": "vm",
            "pool": {"name": "vm", "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "gpu-0", "attributes": {"uuid": {"string": "GPU-a"}, "index": {"int": 0},
                    "driverVersion": {"version": "550.54.15"}},
                 "capacity": {"memory": {"value": "24Gi"}, "cores": {"value": "100"}}},
                {"name": "gpu-1", "attributes": {"uuid": {"string": "GPU-b"}},
                 "capacity": {"memory": {"value": "24Gi"}, "cores": {"value": "100"}},
                 "taints": [{"key": UNHEALTHY_TAINT, "effect": "NoSchedule"}]}]}})
    }

    fn allocated(device: &str, memory: &str, cores: &str) -> Value {
        json!({"status": {"allocation": {"devices": {"results": [{"driver": "gpu.vgpu.io",
            "pool": "vm", "device": device, "request": "gpu",
            "consumedCapacity": {"memory": memory, "cores": cores}}]}}}})
    }

    fn claim(memory: &str, cores: &str) -> Value {
        json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.vgpu.io", "capacity": {"requests": {"memory": memory, "cores": cores}}}}]}}})
    }

    #[test]
    fn cards_requests_and_what_is_held() {
        let cards = cards(&[slice()]);
        assert_eq!(cards.len(), 2);
        assert_eq!(
            (cards[0].memory, cards[0].cores, cards[0].unhealthy),
            (24 << 30, 100, false)
        );
        assert_eq!(cards[0].attributes["driverVersion"], "550.54.15");
        assert!(cards[1].unhealthy);
        let c = claim("4Gi", "30");
        let r = requests("ResourceClaim", &c);
        assert_eq!(r[0].0, "spec.devices.requests[0].exactly");
        assert_eq!(asked(&r[0].0, r[0].1), Ok((Some(4 << 30), Some(30))));
        let h = held(&[
            allocated("gpu-0", "4Gi", "30"),
            allocated("gpu-0", "4Gi", "0"),
        ]);
        assert_eq!(h[&("vm".to_string(), "gpu-0".to_string())], (8 << 30, 30));
    }

    #[test]
    fn a_claim_no_gpu_has_room_for_is_explained() {
        let cards = cards(&[slice()]);
        let h = held(&[allocated("gpu-0", "8Gi", "30")]);
        assert_eq!(
            unallocatable(&claim("20Gi", "10"), &cards, &h).unwrap(),
            "spec.devices.requests[0].exactly needs 20480 MiB and 10 cores of one GPU of class gpu.vgpu.io; free now: vm/gpu-0 16384 MiB and 70 cores free, vm/gpu-1 24576 MiB and 100 cores free (unhealthy)"
        );
        // Room enough: the reason is elsewhere.
        assert_eq!(unallocatable(&claim("16Gi", "70"), &cards, &h), None);
        // No memory asked: the whole card.
        let whole = json!({"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.vgpu.io"}}]}}});
        assert!(unallocatable(&whole, &cards, &h)
            .unwrap()
            .contains("needs a whole GPU's memory and 0 cores"));
        assert!(unallocatable(&claim("1Gi", "0"), &[], &h)
            .unwrap()
            .ends_with("and no node publishes one"));
    }
}
