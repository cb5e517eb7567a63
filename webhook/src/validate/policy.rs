//! Policy rules for vGPU pods: what a tenant may not do because it would let a container escape
//! its slice or forge what other parts trust. Pure functions of the pod JSON; each rule can be
//! switched off in the config file (`policy:`).

use serde::Deserialize;
use serde_json::Value;
use vgpu_core::annotations::{MANAGED_LABEL, RESERVED_POD_ANNOTATIONS};
use vgpu_core::env;
use vgpu_core::request::{Memory, RequestPolicy, VgpuRequest};

use crate::pod::{self, PodContainer};

/// Which rules run (all by default).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicyRules {
    /// Privileged containers that request vGPU: they can open the device without the hook.
    pub deny_privileged: bool,
    /// User values of the runtime's reserved variables that differ from what the resources imply.
    pub deny_reserved_env: bool,
    /// The scheduler's assignment annotation set by the user at CREATE, or the reserved
    /// annotations and the managed label changed at UPDATE by anyone but `annotation_writers`.
    pub deny_reserved_annotations: bool,
    /// User names that may change the reserved annotations of a pod (the scheduler's and the
    /// device plugin's service accounts, `system:serviceaccount:<namespace>:<name>`).
    pub annotation_writers: Vec<String>,
    /// `LD_PRELOAD` in a vGPU container, or a volume over `/etc/ld.so.preload` or the hook's directory.
    pub deny_preload_override: bool,
    /// gpumem larger than every card in the node inventory (never schedulable).
    pub deny_oversized_gpumem: bool,
    /// Paths a vGPU container may not mount over (nor any directory above or below them).
    pub protected_paths: Vec<String>,
    /// HAMi's switches that lift a container's limits, `CUDA_DISABLE_CONTROL` (no hook at all) and
    /// the container's own `GPU_CORE_UTILIZATION_POLICY` `disable` (no core limit) or `default`
    /// (none while it looks alone on the GPU), outside `disable_control_namespaces`.
    pub deny_disable_control: bool,
    /// Namespaces whose pods may use those switches (an administrator's own workloads).
    pub disable_control_namespaces: Vec<String>,
    /// `spec.nodeName` set at CREATE: the pod would skip vgpu-scheduler (its GPU choice, the
    /// placement policy, cordons, exclusive GPUs), outside `preset_node_name_namespaces`.
    pub deny_preset_node_name: bool,
    /// Namespaces whose vGPU pods may be placed by name (an administrator's own tooling).
    pub preset_node_name_namespaces: Vec<String>,
}

impl Default for PolicyRules {
    fn default() -> Self {
        Self {
            deny_privileged: true,
            deny_reserved_env: true,
            deny_reserved_annotations: true,
            annotation_writers: Vec::new(),
            deny_preload_override: true,
            deny_oversized_gpumem: true,
            protected_paths: vec!["/etc/ld.so.preload".into(), "/usr/local/vgpu".into()],
            deny_disable_control: true,
            disable_control_namespaces: Vec::new(),
            deny_preset_node_name: true,
            preset_node_name_namespaces: Vec::new(),
        }
    }
}

/// A rule the pod breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rule, as named in the config file.
    pub rule: &'static str,
    /// The message for the user: names the container and the rule.
    pub message: String,
}

/// Checks every enabled rule; the first violation wins. `largest_card_mib` is None when no node
/// inventory is known (the size rule is then skipped).
pub fn check(
    pod: &Value,
    namespace: &str,
    operation_create: bool,
    requests: &[(PodContainer<'_>, VgpuRequest)],
    rules: &PolicyRules,
    largest_card_mib: Option<u64>,
) -> Result<(), Violation> {
    if rules.deny_reserved_annotations && operation_create {
        if let Some(anns) = pod
            .pointer("/metadata/annotations")
            .and_then(Value::as_object)
        {
            if let Some(a) = RESERVED_POD_ANNOTATIONS
                .iter()
                .find(|a| anns.contains_key(**a))
            {
                return Err(Violation {
                    rule: "denyReservedAnnotations",
                    message: format!(
                        "vgpu policy: annotation {a} is set by the vgpu scheduler and may not be set at pod creation (rule denyReservedAnnotations)"
                    ),
                });
            }
        }
    }
    if let Some(v) = preset_node_name(pod, namespace, operation_create, requests, rules) {
        return Err(v);
    }
    for (c, req) in requests {
        let name = &c.resources.name;
        let deny = |rule: &'static str, what: String| Violation {
            rule,
            message: format!("vgpu policy: container {name:?}: {what} (rule {rule})"),
        };
        if rules.deny_privileged
            && c.json
                .pointer("/securityContext/privileged")
                .and_then(Value::as_bool)
                == Some(true)
        {
            return Err(deny(
                "denyPrivileged",
                "a privileged container may not request vGPU: it could reach the GPU without the vGPU limits".into(),
            ));
        }
        let envs = c.json.get("env").and_then(Value::as_array);
        if rules.deny_preload_override {
            if let Some(e) = envs
                .into_iter()
                .flatten()
                .find(|e| e.get("name").and_then(Value::as_str) == Some("LD_PRELOAD"))
            {
                let _ = e;
                return Err(deny(
                    "denyPreloadOverride",
                    "LD_PRELOAD may not be set in a vGPU container".into(),
                ));
            }
            for m in c
                .json
                .get("volumeMounts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let path = m
                    .get("mountPath")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if let Some(p) = rules.protected_paths.iter().find(|p| overlaps(path, p)) {
                    return Err(deny(
                        "denyPreloadOverride",
                        format!(
                            "volume mount at {path} would cover {p}, which loads the vGPU limits"
                        ),
                    ));
                }
            }
        }
        if rules.deny_reserved_env {
            // /mutate wrote the container's limits (`mutate::desired_env`) and removed
            // every other one of these: anything else, or another value, was added after it, and
            // the device plugin's Allocate is what sets the container's limits.
            let written = crate::mutate::desired_env(req);
            let written_by_mutate = |var: &str, e: &Value, seen: &[&str]| {
                let Some((_, want)) = written.iter().find(|(n, _)| *n == var) else {
                    return false;
                };
                !seen.contains(&var)
                    && e.get("valueFrom").is_none()
                    && e.get("value").and_then(Value::as_str) == Some(want.as_str())
            };
            let mut seen: Vec<&str> = Vec::new();
            if let Some((var, value)) = envs.into_iter().flatten().find_map(|e| {
                let var = e.get("name").and_then(Value::as_str)?;
                if !env::is_reserved(var) || written_by_mutate(var, e, &seen) {
                    seen.push(var);
                    return None;
                }
                Some((var, e.get("value").and_then(Value::as_str)))
            }) {
                let shown = match value {
                    Some(v) => format!("{v:?}"),
                    None => "a valueFrom reference or an empty value".to_string(),
                };
                return Err(deny(
                    "denyReservedEnv",
                    format!("{var} is reserved for the vGPU runtime; the pod sets {shown}, and only the device plugin sets it"),
                ));
            }
        }
        if let Some(v) = settings_violation(c, namespace, rules) {
            return Err(v);
        }
        if rules.deny_oversized_gpumem {
            if let (Memory::Mib(m), Some(largest)) = (req.memory, largest_card_mib) {
                if m > largest {
                    return Err(deny(
                        "denyOversizedGpumem",
                        format!("asks for {m} MiB per GPU, but the largest GPU in the cluster has {largest} MiB"),
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A vGPU pod created with `spec.nodeName`: kube-scheduler and so vgpu-scheduler never see it,
/// so no GPU is chosen for it (nor any policy, cordon or exclusive GPU applied), and the kubelet
/// admits it on the node's device count alone.
fn preset_node_name(
    pod: &Value,
    namespace: &str,
    operation_create: bool,
    requests: &[(PodContainer<'_>, VgpuRequest)],
    rules: &PolicyRules,
) -> Option<Violation> {
    if !rules.deny_preset_node_name || !operation_create || requests.is_empty() {
        return None;
    }
    let node = pod
        .pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())?;
    if rules
        .preset_node_name_namespaces
        .iter()
        .any(|n| n == namespace)
    {
        return None;
    }
    // A static pod's mirror, which the kubelet creates with its node set: the pod runs there
    // whatever the API says, and refusing the mirror would only hide it.
    if pod
        .pointer("/metadata/annotations/kubernetes.io~1config.mirror")
        .is_some()
    {
        return None;
    }
    Some(Violation {
        rule: "denyPresetNodeName",
        message: format!(
            "vgpu policy: spec.nodeName is set ({node:?}): a vGPU pod placed by name skips vgpu-scheduler, which chooses its GPUs and keeps cordoned and exclusive GPUs out of reach; choose nodes with spec.nodeSelector or node affinity instead; only namespaces in policy.presetNodeNameNamespaces may set it (rule denyPresetNodeName)"
        ),
    })
}

/// HAMi's runtime settings of a vGPU container (read by the device plugin at Allocate): values it
/// could not use, and the switches that lift limits where `denyDisableControl` forbids them.
fn settings_violation(
    c: &PodContainer<'_>,
    namespace: &str,
    rules: &PolicyRules,
) -> Option<Violation> {
    let name = &c.resources.name;
    // The last entry of a name wins in the container; the device plugin reads its literal value
    // (a `valueFrom` there means nothing the plugin acts on).
    let value_of = |var: &str| {
        c.json
            .get("env")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .rfind(|e| e.get("name").and_then(Value::as_str) == Some(var))
            .and_then(|e| e.get("value").and_then(Value::as_str))
    };
    let invalid = |what: String| Violation {
        rule: "validSettings",
        message: format!("vgpu: container {name:?}: {what}"),
    };
    let priority = c
        .json
        .pointer("/resources/limits")
        .and_then(|l| l.get(vgpu_core::env::TASK_PRIORITY_RESOURCE))
        .and_then(Value::as_str);
    if let Some(p) = priority {
        if let Err(e) = env::parse_priority(p) {
            return Some(invalid(format!(
                "resource {}: {e}",
                vgpu_core::env::TASK_PRIORITY_RESOURCE
            )));
        }
    }
    let policy = match value_of(env::CORE_POLICY).map(env::CorePolicy::parse) {
        Some(Err(e)) => return Some(invalid(format!("env {}: {e}", env::CORE_POLICY))),
        Some(Ok(p)) => Some(p),
        None => None,
    };
    let allowed = !rules.deny_disable_control
        || rules
            .disable_control_namespaces
            .iter()
            .any(|n| n == namespace);
    if allowed {
        return None;
    }
    let disable_control = value_of(env::DISABLE_CONTROL).is_some_and(env::go_true);
    let what = match env::lift(disable_control, policy)? {
        env::Lift::DisableControl => format!("{} lifts every vGPU limit", env::DISABLE_CONTROL),
        env::Lift::CorePolicy(env::CorePolicy::Default) => format!(
            "{}=default lifts the core limit while no other container launches",
            env::CORE_POLICY
        ),
        env::Lift::CorePolicy(p) => {
            format!("{}={} lifts the core limit", env::CORE_POLICY, p.as_str())
        }
    };
    Some(Violation {
        rule: "denyDisableControl",
        message: format!(
            "vgpu policy: container {name:?}: {what}; only namespaces in policy.disableControlNamespaces may set it (rule denyDisableControl)"
        ),
    })
}

/// The rule for a Pod UPDATE by `username`: only the configured writers may change the reserved
/// annotations (the scheduler's assignment is what the device plugin hands out and what the
/// scheduler and quota count) or the managed label (the label every cache finds vGPU pods by:
/// removing it would hide the pod's usage). Everything else in an update is the API server's
/// business (a pod's resources are immutable).
pub fn check_update(
    old: &Value,
    new: &Value,
    username: &str,
    rules: &PolicyRules,
) -> Result<(), Violation> {
    // No writers configured: the webhook cannot tell the scheduler from a tenant, and refusing
    // everyone would refuse every bind; the rule is then off at UPDATE (warned at start).
    if !update_rule_enforced(rules) || rules.annotation_writers.iter().any(|w| w == username) {
        return Ok(());
    }
    let field = |pod: &Value, map: &str, key: &str| {
        pod.get("metadata")
            .and_then(|m| m.get(map))
            .and_then(|m| m.get(key))
            .cloned()
    };
    let changed = |map: &str, key: &str| field(old, map, key) != field(new, map, key);
    let what = RESERVED_POD_ANNOTATIONS
        .iter()
        .find(|a| changed("annotations", a))
        .map(|a| format!("annotation {a}"))
        .or_else(|| changed("labels", MANAGED_LABEL).then(|| format!("label {MANAGED_LABEL}")));
    match what {
        None => Ok(()),
        Some(what) => Err(Violation {
            rule: "denyReservedAnnotations",
            message: format!(
                "vgpu policy: {what} is written only by the vgpu scheduler and device plugin ({writers}); {username:?} may not change it (rule denyReservedAnnotations, policy.annotationWriters)",
                writers = rules.annotation_writers.join(", ")
            ),
        }),
    }
}

/// Whether [`check_update`] refuses anything: the rule is on and its writers are named.
pub fn update_rule_enforced(rules: &PolicyRules) -> bool {
    rules.deny_reserved_annotations && !rules.annotation_writers.is_empty()
}

/// Whether mounting at `mount` covers `protected` or lies inside it.
fn overlaps(mount: &str, protected: &str) -> bool {
    let norm = |p: &str| p.trim_end_matches('/').to_string();
    let (m, p) = (norm(mount), norm(protected));
    m == p || p.starts_with(&format!("{m}/")) || m.starts_with(&format!("{p}/")) || m.is_empty()
}

/// The vGPU containers of a pod with their requests.
pub fn vgpu_containers<'a>(
    pod: &'a Value,
    policy: &RequestPolicy,
) -> Result<Vec<(PodContainer<'a>, VgpuRequest)>, String> {
    let mut out = Vec::new();
    for c in pod::containers(pod).map_err(|e| format!("object is not a valid Pod: {e}"))? {
        if let Some(r) = policy
            .parse_container(&c.resources)
            .map_err(|e| e.to_string())?
        {
            out.push((c, r));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(pod: Value, rules: &PolicyRules) -> Result<(), Violation> {
        let reqs = vgpu_containers(&pod, &RequestPolicy::default()).unwrap();
        check(&pod, "team-a", true, &reqs, rules, Some(81920))
    }

    fn gpu_pod(container: Value) -> Value {
        let mut c = json!({"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}},
            "env": [{"name": "HOME", "value": "/home"}]});
        if let (Some(c), Some(extra)) = (c.as_object_mut(), container.as_object()) {
            c.extend(extra.clone());
        }
        json!({"metadata": {"name": "p"}, "spec": {"containers": [c]}})
    }

    fn rule_of(pod: Value) -> &'static str {
        run(pod, &PolicyRules::default()).unwrap_err().rule
    }

    /// A vGPU pod created with `spec.nodeName` would skip vgpu-scheduler: refused, naming the
    /// field and the way out; a plain pod, an empty name, an allowed namespace or the rule off pass.
    #[test]
    fn a_preset_node_name_needs_an_allowed_namespace() {
        let mut placed = gpu_pod(json!({}));
        placed["spec"]["nodeName"] = json!("gpu-node-1");
        let e = run(placed.clone(), &PolicyRules::default()).unwrap_err();
        assert_eq!(e.rule, "denyPresetNodeName");
        assert_eq!(
            e.message,
            "vgpu policy: spec.nodeName is set (\"gpu-node-1\"): a vGPU pod placed by name skips vgpu-scheduler, which chooses its GPUs and keeps cordoned and exclusive GPUs out of reach; choose nodes with spec.nodeSelector or node affinity instead; only namespaces in policy.presetNodeNameNamespaces may set it (rule denyPresetNodeName)"
        );
        let plain = json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n", "containers": [{"name": "c"}]}});
        assert_eq!(run(plain, &PolicyRules::default()), Ok(()));
        let mut mirror = placed.clone();
        mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "abc"});
        assert_eq!(run(mirror, &PolicyRules::default()), Ok(()));
        let mut empty = gpu_pod(json!({}));
        empty["spec"]["nodeName"] = json!("");
        assert_eq!(run(empty, &PolicyRules::default()), Ok(()));
        let trusted = PolicyRules {
            preset_node_name_namespaces: vec!["team-a".into()],
            ..PolicyRules::default()
        };
        assert_eq!(run(placed.clone(), &trusted), Ok(()));
        let off = PolicyRules {
            deny_preset_node_name: false,
            ..PolicyRules::default()
        };
        assert_eq!(run(placed.clone(), &off), Ok(()));
        // Only at CREATE: a pod is bound by setting its node later.
        let reqs = vgpu_containers(&placed, &RequestPolicy::default()).unwrap();
        let rules = PolicyRules::default();
        assert_eq!(check(&placed, "team-a", false, &reqs, &rules, None), Ok(()));
    }

    #[test]
    fn hami_switches_that_lift_limits_need_an_allowed_namespace() {
        let with_env =
            |name: &str, value: &str| gpu_pod(json!({"env": [{"name": name, "value": value}]}));
        let e = run(
            with_env("CUDA_DISABLE_CONTROL", "true"),
            &PolicyRules::default(),
        )
        .unwrap_err();
        assert_eq!(e.rule, "denyDisableControl");
        assert_eq!(
            e.message,
            "vgpu policy: container \"train\": CUDA_DISABLE_CONTROL lifts every vGPU limit; only namespaces in policy.disableControlNamespaces may set it (rule denyDisableControl)"
        );
        assert_eq!(
            rule_of(with_env("GPU_CORE_UTILIZATION_POLICY", "Disable")),
            "denyDisableControl"
        );
        // Settings that lift nothing pass anywhere.
        let fine = PolicyRules::default();
        assert_eq!(
            run(with_env("CUDA_DISABLE_CONTROL", "false"), &fine),
            Ok(())
        );
        assert_eq!(
            run(with_env("GPU_CORE_UTILIZATION_POLICY", "FORCE"), &fine),
            Ok(())
        );
        assert_eq!(
            rule_of(with_env("GPU_CORE_UTILIZATION_POLICY", "default")),
            "denyDisableControl"
        );
        // In an init container too; the last entry of a name decides, as in the container.
        let init = json!({"metadata": {"name": "p"}, "spec": {
            "initContainers": [{"name": "prep", "resources": {"limits": {"nvidia.com/gpu": "1"}},
                "env": [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}]}],
            "containers": [{"name": "train", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}});
        assert_eq!(rule_of(init), "denyDisableControl");
        let last = gpu_pod(
            json!({"env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"},
            {"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}),
        );
        assert_eq!(run(last, &fine), Ok(()));
        // An allowed namespace, or the rule off.
        let admin = PolicyRules {
            disable_control_namespaces: vec!["team-a".into()],
            ..PolicyRules::default()
        };
        assert_eq!(run(with_env("CUDA_DISABLE_CONTROL", "1"), &admin), Ok(()));
        let off = PolicyRules {
            deny_disable_control: false,
            ..PolicyRules::default()
        };
        assert_eq!(
            run(with_env("GPU_CORE_UTILIZATION_POLICY", "disable"), &off),
            Ok(())
        );
        // Values the device plugin could not use are refused whatever the rules say.
        let e = run(with_env("GPU_CORE_UTILIZATION_POLICY", "half"), &off).unwrap_err();
        assert_eq!(
            e.message,
            "vgpu: container \"train\": env GPU_CORE_UTILIZATION_POLICY: \"half\" is not one of default, force, disable"
        );
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "train",
            "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "high"}}}]}});
        assert_eq!(
            run(pod, &off).unwrap_err().message,
            "vgpu: container \"train\": resource nvidia.com/priority: \"high\" is not a task priority (0 high, 1 low)"
        );
    }

    #[test]
    fn a_mutated_pod_passes() {
        assert_eq!(run(gpu_pod(json!({})), &PolicyRules::default()), Ok(()));
        // What /mutate writes, exactly and once; anything else is refused.
        let mutated = json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4096m"},
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]});
        assert_eq!(run(gpu_pod(mutated), &PolicyRules::default()), Ok(()));
        let spelled = json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "4g"}]});
        assert_eq!(rule_of(gpu_pod(spelled)), "denyReservedEnv");
        let twice = json!({"env": [{"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"},
            {"name": "CUDA_DEVICE_SM_LIMIT", "value": "0"}]});
        assert_eq!(rule_of(gpu_pod(twice)), "denyReservedEnv");
        let other = json!({"env": [{"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"}]});
        assert_eq!(rule_of(gpu_pod(other)), "denyReservedEnv");
        // Non-vGPU containers may do what they like.
        let pod = json!({"spec": {"containers": [{"name": "x", "securityContext": {"privileged": true},
            "env": [{"name": "LD_PRELOAD", "value": "a.so"}]}]}});
        assert_eq!(run(pod, &PolicyRules::default()), Ok(()));
    }

    #[test]
    fn every_rule_rejects_and_can_be_switched_off() {
        let cases = [
            (
                gpu_pod(json!({"securityContext": {"privileged": true}})),
                "denyPrivileged",
            ),
            (
                gpu_pod(json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}]})),
                "denyReservedEnv",
            ),
            (
                gpu_pod(json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1m"}]})),
                "denyReservedEnv",
            ),
            (
                gpu_pod(
                    json!({"env": [{"name": "CUDA_DEVICE_SM_LIMIT", "valueFrom": {"fieldRef": {"fieldPath": "x"}}}]}),
                ),
                "denyReservedEnv",
            ),
            (
                gpu_pod(json!({"env": [{"name": "LD_PRELOAD", "value": "/x.so"}]})),
                "denyPreloadOverride",
            ),
            (
                gpu_pod(json!({"volumeMounts": [{"name": "v", "mountPath": "/etc"}]})),
                "denyPreloadOverride",
            ),
            (
                gpu_pod(
                    json!({"volumeMounts": [{"name": "v", "mountPath": "/etc/ld.so.preload"}]}),
                ),
                "denyPreloadOverride",
            ),
            (
                gpu_pod(
                    json!({"volumeMounts": [{"name": "v", "mountPath": "/usr/local/vgpu/lib"}]}),
                ),
                "denyPreloadOverride",
            ),
            (
                gpu_pod(
                    json!({"resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "90000"}}, "env": []}),
                ),
                "denyOversizedGpumem",
            ),
        ];
        for (pod, rule) in cases {
            let v = run(pod.clone(), &PolicyRules::default()).unwrap_err();
            assert_eq!(v.rule, rule);
            assert!(
                v.message.contains("container \"train\"") && v.message.contains(rule),
                "{}",
                v.message
            );
            let off = PolicyRules {
                deny_privileged: rule != "denyPrivileged",
                deny_reserved_env: rule != "denyReservedEnv",
                deny_preload_override: rule != "denyPreloadOverride",
                deny_oversized_gpumem: rule != "denyOversizedGpumem",
                ..PolicyRules::default()
            };
            assert_eq!(run(pod, &off), Ok(()), "{rule} switched off");
        }
        let mut forged = gpu_pod(json!({}));
        forged["metadata"]["annotations"] = json!({"vgpu.io/assignment": "{}"});
        assert_eq!(rule_of(forged.clone()), "denyReservedAnnotations");
        let mut allocated = gpu_pod(json!({}));
        allocated["metadata"]["annotations"] = json!({"vgpu.io/allocated": "[]"});
        assert_eq!(rule_of(allocated), "denyReservedAnnotations");
        let reqs = vgpu_containers(&forged, &RequestPolicy::default()).unwrap();
        assert_eq!(
            check(
                &forged,
                "team-a",
                false,
                &reqs,
                &PolicyRules::default(),
                None
            ),
            Ok(()),
            "only at CREATE"
        );
        let v = run(
            gpu_pod(json!({"env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"}]})),
            &PolicyRules::default(),
        )
        .unwrap_err();
        assert_eq!(v.message, "vgpu policy: container \"train\": CUDA_DEVICE_MEMORY_LIMIT is reserved for the vGPU runtime; the pod sets \"80g\", and only the device plugin sets it (rule denyReservedEnv)");
    }

    #[test]
    fn mount_overlap() {
        assert!(overlaps("/", "/etc/ld.so.preload"));
        assert!(overlaps("/etc/", "/etc/ld.so.preload"));
        assert!(!overlaps("/etc2", "/etc/ld.so.preload"));
        assert!(!overlaps("/data", "/usr/local/vgpu"));
    }

    #[test]
    fn only_the_writers_may_change_reserved_annotations_and_the_label_at_update() {
        let rules = PolicyRules {
            annotation_writers: vec!["system:serviceaccount:vgpu:sched".into()],
            ..PolicyRules::default()
        };
        let old = json!({"metadata": {"labels": {"vgpu.io/managed": "true", "app": "a"},
            "annotations": {"vgpu.io/assignment": "{\"v\":1}"}}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut p = old.clone();
            f(&mut p);
            p
        };
        let tenant = "alice";
        // Other labels and annotations are the tenant's.
        let other = with(&|p| p["metadata"]["labels"]["app"] = json!("b"));
        assert_eq!(check_update(&old, &other, tenant, &rules), Ok(()));
        let cases: [(Value, &str); 4] = [
            (
                with(&|p| p["metadata"]["annotations"]["vgpu.io/assignment"] = json!("{}")),
                "annotation vgpu.io/assignment",
            ),
            (
                with(&|p| p["metadata"]["annotations"] = json!({})),
                "annotation vgpu.io/assignment",
            ),
            (
                with(&|p| p["metadata"]["annotations"]["vgpu.io/allocated"] = json!("main")),
                "annotation vgpu.io/allocated",
            ),
            (
                with(&|p| p["metadata"]["labels"] = json!({"app": "a"})),
                "label vgpu.io/managed",
            ),
        ];
        for (new, what) in cases {
            let v = check_update(&old, &new, tenant, &rules).unwrap_err();
            assert_eq!(v.rule, "denyReservedAnnotations");
            assert_eq!(
                v.message,
                format!("vgpu policy: {what} is written only by the vgpu scheduler and device plugin (system:serviceaccount:vgpu:sched); \"alice\" may not change it (rule denyReservedAnnotations, policy.annotationWriters)")
            );
            assert_eq!(
                check_update(&old, &new, "system:serviceaccount:vgpu:sched", &rules),
                Ok(())
            );
            let off = PolicyRules {
                deny_reserved_annotations: false,
                ..PolicyRules::default()
            };
            assert_eq!(check_update(&old, &new, tenant, &off), Ok(()));
            // Without writers the rule cannot tell the scheduler from a tenant: off at UPDATE.
            assert_eq!(
                check_update(&old, &new, tenant, &PolicyRules::default()),
                Ok(())
            );
            assert!(!update_rule_enforced(&PolicyRules::default()));
        }
    }
}
