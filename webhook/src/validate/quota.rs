//! Tenant quotas: which `ResourceQuota` keys vgpu enforces, which pods a scoped quota covers, and
//! the check itself. Pure: the caller supplies the namespace's usage.
//!
//! Each of gpu, gpumem and gpucores may be written three ways in `spec.hard`: bare
//! (`nvidia.com/gpumem`), `requests.` and `limits.` (HAMi's spelling). vGPU requests are limits
//! that equal requests, so all three spellings count the same thing. Every quota of the namespace
//! must hold, and each spelling present is checked on its own.

use serde_json::Value;
use vgpu_core::quantity::parse_integer;
use vgpu_core::resources::ResourceNames;

use super::usage::{Amounts, PodUsage, ScopeFacts};

/// A quota-limited vGPU resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaResource {
    /// vGPUs.
    Gpu,
    /// Device memory, GPUs x MiB.
    Gpumem,
    /// Cores, GPUs x percent.
    Gpucores,
}

impl QuotaResource {
    /// This resource's share of `a`.
    pub fn of(self, a: &Amounts) -> u64 {
        match self {
            QuotaResource::Gpu => a.gpus,
            QuotaResource::Gpumem => a.mib,
            QuotaResource::Gpucores => a.cores,
        }
    }
}

/// One enforced `spec.hard` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HardLimit {
    /// The key as written (`limits.nvidia.com/gpumem`).
    pub key: String,
    /// What it limits.
    pub resource: QuotaResource,
    /// The limit, in MiB, percent or GPUs.
    pub hard: u64,
}

/// A scope term a quota selects pods by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeTerm {
    /// `Terminating`: pods with `activeDeadlineSeconds`.
    Terminating,
    /// `NotTerminating`.
    NotTerminating,
    /// `BestEffort`: QoS class BestEffort.
    BestEffort,
    /// `NotBestEffort`.
    NotBestEffort,
    /// `PriorityClass` with operator `In`/`NotIn` (`negate`) over `values`, or `Exists`/`DoesNotExist`
    /// (`values` None).
    PriorityClass {
        /// NotIn / DoesNotExist.
        negate: bool,
        /// None for Exists / DoesNotExist.
        values: Option<Vec<String>>,
    },
}

impl ScopeTerm {
    fn matches(&self, f: &ScopeFacts) -> bool {
        match self {
            ScopeTerm::Terminating => f.terminating,
            ScopeTerm::NotTerminating => !f.terminating,
            ScopeTerm::BestEffort => f.best_effort,
            ScopeTerm::NotBestEffort => !f.best_effort,
            ScopeTerm::PriorityClass { negate, values } => {
                let hit = match values {
                    None => !f.priority_class.is_empty(),
                    Some(v) => v.contains(&f.priority_class),
                };
                hit != *negate
            }
        }
    }
}

/// A namespace's ResourceQuota, as vgpu reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quota {
    /// Object name.
    pub name: String,
    /// Namespace.
    pub namespace: String,
    /// The vGPU keys of `spec.hard`.
    pub limits: Vec<HardLimit>,
    /// All must match for the quota to cover a pod.
    pub scopes: Vec<ScopeTerm>,
    /// Set when the quota cannot be evaluated (an unsupported scope, an unreadable hard value):
    /// such a quota is skipped and the reason logged.
    pub unsupported: Option<String>,
}

impl Quota {
    /// Reads a ResourceQuota object. Returns None when it limits no vGPU resource.
    pub fn from_object(obj: &Value, names: &ResourceNames) -> Option<Quota> {
        let name = obj
            .pointer("/metadata/name")
            .and_then(Value::as_str)?
            .to_string();
        let namespace = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let hard = obj.pointer("/spec/hard").and_then(Value::as_object)?;
        let mut limits = Vec::new();
        let mut unsupported = None;
        for (key, value) in hard {
            let Some(resource) = resource_of_key(key, names) else {
                continue;
            };
            let text = match value {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                _ => String::new(),
            };
            match parse_integer(&text) {
                Ok(hard) => limits.push(HardLimit {
                    key: key.clone(),
                    resource,
                    hard,
                }),
                Err(e) => {
                    unsupported = Some(format!("spec.hard[{key}] {text:?}: {e}"));
                }
            }
        }
        if limits.is_empty() && unsupported.is_none() {
            return None;
        }
        let mut scopes = Vec::new();
        let mut scope_names: Vec<(String, String, Option<Vec<String>>)> = obj
            .pointer("/spec/scopes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|s| (s.to_string(), "Exists".to_string(), None))
            .collect();
        for e in obj
            .pointer("/spec/scopeSelector/matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let s = |k: &str| {
                e.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let values = e.get("values").and_then(Value::as_array).map(|v| {
                v.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            });
            scope_names.push((s("scopeName"), s("operator"), values));
        }
        for (scope, op, values) in scope_names {
            let term = match (scope.as_str(), op.as_str()) {
                ("Terminating", "Exists") => ScopeTerm::Terminating,
                ("NotTerminating", "Exists") => ScopeTerm::NotTerminating,
                ("BestEffort", "Exists") => ScopeTerm::BestEffort,
                ("NotBestEffort", "Exists") => ScopeTerm::NotBestEffort,
                ("PriorityClass", "In") => ScopeTerm::PriorityClass {
                    negate: false,
                    values: Some(values.unwrap_or_default()),
                },
                ("PriorityClass", "NotIn") => ScopeTerm::PriorityClass {
                    negate: true,
                    values: Some(values.unwrap_or_default()),
                },
                ("PriorityClass", "Exists") => ScopeTerm::PriorityClass {
                    negate: false,
                    values: None,
                },
                ("PriorityClass", "DoesNotExist") => ScopeTerm::PriorityClass {
                    negate: true,
                    values: None,
                },
                _ => {
                    unsupported =
                        Some(format!("scope {scope} with operator {op} is not supported"));
                    continue;
                }
            };
            scopes.push(term);
        }
        Some(Quota {
            name,
            namespace,
            limits,
            scopes,
            unsupported,
        })
    }

    /// Whether this quota covers a pod with these facts.
    pub fn covers(&self, facts: &ScopeFacts) -> bool {
        self.scopes.iter().all(|s| s.matches(facts))
    }
}

/// The vGPU resource a `spec.hard` key limits, for any of its three spellings.
pub fn resource_of_key(key: &str, names: &ResourceNames) -> Option<QuotaResource> {
    let bare = key
        .strip_prefix("requests.")
        .or_else(|| key.strip_prefix("limits."))
        .unwrap_or(key);
    if bare == names.gpu {
        Some(QuotaResource::Gpu)
    } else if bare == names.gpumem {
        Some(QuotaResource::Gpumem)
    } else if bare == names.gpucores {
        Some(QuotaResource::Gpucores)
    } else {
        None
    }
}

/// A quota the pod would break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// Quota name.
    pub quota: String,
    /// The key as written.
    pub key: String,
    /// The pod's amount.
    pub requested: u64,
    /// Already used in the namespace (pods and reservations covered by the quota).
    pub used: u64,
    /// The limit.
    pub hard: u64,
    /// The message for the user.
    pub message: String,
}

/// Checks a pod against every quota. `used` gives the namespace's usage restricted to the pods a
/// quota covers. The first violation, in quota name order then key order, is returned.
pub fn check(
    namespace: &str,
    pod: &PodUsage,
    quotas: &[Quota],
    mut used: impl FnMut(&Quota) -> Amounts,
) -> Result<(), Exceeded> {
    let requested = pod.amounts();
    let mut sorted: Vec<&Quota> = quotas.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    for q in sorted {
        if q.unsupported.is_some() || !q.covers(&pod.facts) {
            continue;
        }
        let u = used(q);
        let mut limits: Vec<&HardLimit> = q.limits.iter().collect();
        limits.sort_by(|a, b| a.key.cmp(&b.key));
        for l in limits {
            let (req, now) = (l.resource.of(&requested), l.resource.of(&u));
            if req == 0 || now.saturating_add(req) <= l.hard {
                continue;
            }
            let what = match l.resource {
                QuotaResource::Gpu => format!("{req} GPUs"),
                QuotaResource::Gpumem => {
                    format!("{req} MiB ({})", pod.breakdown(|s| s.mib_per_gpu))
                }
                QuotaResource::Gpucores => {
                    format!("{req} % ({})", pod.breakdown(|s| s.cores_per_gpu))
                }
            };
            return Err(Exceeded {
                quota: q.name.clone(),
                key: l.key.clone(),
                requested: req,
                used: now,
                hard: l.hard,
                message: format!(
                    "vgpu quota exceeded in namespace {namespace}: ResourceQuota {} {}: requested {what}, used {now}, hard {}",
                    q.name, l.key, l.hard
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::usage::SliceCount;
    use serde_json::json;

    fn quota(name: &str, hard: Value, spec_extra: Value) -> Quota {
        let mut spec = json!({"hard": hard});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
            s.extend(e.clone());
        }
        Quota::from_object(
            &json!({"metadata": {"name": name, "namespace": "team-a"}, "spec": spec}),
            &ResourceNames::default(),
        )
        .unwrap()
    }

    fn pod(gpus: u64, mib: u64) -> PodUsage {
        PodUsage {
            slices: vec![SliceCount {
                gpus,
                mib_per_gpu: mib,
                cores_per_gpu: 100,
            }],
            facts: ScopeFacts::default(),
        }
    }

    fn used(mib: u64) -> impl FnMut(&Quota) -> Amounts {
        move |_| Amounts {
            gpus: 0,
            mib,
            cores: 0,
        }
    }

    /// The table of the issue: every spelling, GPUs x MiB, several quotas.
    #[test]
    fn quota_semantics_table() {
        for key in [
            "nvidia.com/gpumem",
            "requests.nvidia.com/gpumem",
            "limits.nvidia.com/gpumem",
        ] {
            let q = [quota("gpu-quota", json!({ key: "102400" }), json!({}))];
            assert_eq!(check("team-a", &pod(2, 4096), &q, used(94208)), Ok(()));
            let e = check("team-a", &pod(2, 4096), &q, used(98304)).unwrap_err();
            assert_eq!(e.message, format!("vgpu quota exceeded in namespace team-a: ResourceQuota gpu-quota {key}: requested 8192 MiB (2 GPUs x 4096), used 98304, hard 102400"));
        }
        // gpu and gpucores keys, all spellings.
        let q = [quota(
            "q",
            json!({"limits.nvidia.com/gpu": "2", "nvidia.com/gpucores": 250}),
            json!({}),
        )];
        let e = check("ns", &pod(3, 1), &q, used(0)).unwrap_err();
        assert_eq!((e.key.as_str(), e.requested), ("limits.nvidia.com/gpu", 3));
        let e = check("ns", &pod(2, 1), &q, |_| Amounts {
            gpus: 0,
            mib: 0,
            cores: 100,
        })
        .unwrap_err();
        assert_eq!(e.message, "vgpu quota exceeded in namespace ns: ResourceQuota q nvidia.com/gpucores: requested 200 % (2 GPUs x 100), used 100, hard 250");
        // Several quotas: every one must hold.
        let qs = [
            quota(
                "big",
                json!({"limits.nvidia.com/gpumem": "1000000"}),
                json!({}),
            ),
            quota(
                "small",
                json!({"requests.nvidia.com/gpumem": "4096"}),
                json!({}),
            ),
        ];
        assert_eq!(check("ns", &pod(1, 4096), &qs, used(0)), Ok(()));
        assert_eq!(
            check("ns", &pod(1, 4097), &qs, used(0)).unwrap_err().quota,
            "small"
        );
        // Non-vGPU keys are not ours; a quota with none of ours is not read at all.
        assert!(Quota::from_object(
            &json!({"metadata": {"name": "cpu"}, "spec": {"hard": {"cpu": "10", "requests.nvidia.com/gpumemx": "1"}}}),
            &ResourceNames::default()
        )
        .is_none());
    }

    #[test]
    fn scopes_select_pods() {
        let q = [quota(
            "prio",
            json!({"limits.nvidia.com/gpumem": "4096"}),
            json!({"scopes": ["NotTerminating"], "scopeSelector": {"matchExpressions": [
                {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}),
        )];
        let mut p = pod(1, 8192);
        assert_eq!(
            check("ns", &p, &q, used(0)),
            Ok(()),
            "no priority class: not covered"
        );
        p.facts.priority_class = "high".into();
        assert!(check("ns", &p, &q, used(0)).is_err());
        p.facts.terminating = true;
        assert_eq!(
            check("ns", &p, &q, used(0)),
            Ok(()),
            "terminating: not covered"
        );
        let be = quota(
            "be",
            json!({"nvidia.com/gpu": "0"}),
            json!({"scopes": ["BestEffort"]}),
        );
        let mut p = pod(1, 1);
        p.facts.best_effort = true;
        assert!(check("ns", &p, std::slice::from_ref(&be), used(0)).is_err());
        p.facts.best_effort = false;
        assert_eq!(check("ns", &p, &[be], used(0)), Ok(()));
    }

    #[test]
    fn unsupported_quotas_are_skipped_with_a_reason() {
        let q = quota(
            "x",
            json!({"limits.nvidia.com/gpumem": "1"}),
            json!({"scopes": ["CrossNamespacePodAffinity"]}),
        );
        assert_eq!(
            q.unsupported.as_deref(),
            Some("scope CrossNamespacePodAffinity with operator Exists is not supported")
        );
        assert_eq!(check("ns", &pod(1, 10), &[q], used(0)), Ok(()));
        let q = quota("y", json!({"limits.nvidia.com/gpumem": "1.5"}), json!({}));
        assert!(q.unsupported.is_some());
    }
}
