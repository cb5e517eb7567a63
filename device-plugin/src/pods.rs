//! The node's vGPU pods and the matcher that tells Allocate which pod and container it is serving.
//!
//! The kubelet's Allocate carries only device IDs, never a pod. The kubelet's device manager
//! allocates one container at a time (init containers first, then app containers, in spec order),
//! right after admitting the pod and before it starts, so the pod being allocated is a Pending pod on
//! this node. The matcher takes the oldest such pod whose next not-yet-allocated container was
//! assigned as many devices as requested, preferring one whose assigned GPUs are exactly the
//! requested ones, and remembers what it answered so two racing pods of the same shape get different
//! answers.

use k8s_openapi::api::core::v1::{Container, Pod};
use std::collections::{HashMap, HashSet};
use thiserror::Error;
use vgpu_core::annotations::{ALLOCATED, ASSIGNMENT};
use vgpu_core::assignment::{ContainerAssignment, PodAssignment};

use crate::admitting::KubeletPods;
use crate::devices::uuid_of;

/// What the plugin remembers of one vGPU pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEntry {
    /// `metadata.uid`.
    pub uid: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// `status.phase` is Pending (or not reported yet).
    pub pending: bool,
    /// The assignment, when the annotation is present and readable for this node.
    pub assignment: Result<PodAssignment, String>,
    /// Containers already answered, from the `vgpu.io/allocated` annotation.
    pub allocated: Vec<String>,
    /// What each container asks of the runtime beyond its slice, by container name (only those
    /// that ask something).
    pub settings: HashMap<String, ContainerSettings>,
}

impl PodEntry {
    /// Oldest first: creation, then namespace and name (creation has 1 s granularity).
    fn age_order(&self) -> (i64, &str, &str) {
        (self.created, &self.namespace, &self.name)
    }
}

/// HAMi's per-container runtime settings, as the pod spec gives them (literal `env` values only:
/// `valueFrom` and `envFrom` are not in the pod, so they cannot change what Allocate decides).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerSettings {
    /// The `nvidia.com/priority` limit, as written.
    pub priority: Option<String>,
    /// `GPU_CORE_UTILIZATION_POLICY` in `env`.
    pub core_policy: Option<String>,
    /// `CUDA_DISABLE_CONTROL` in `env`, true as Go reads it.
    pub disable_control: bool,
}

impl ContainerSettings {
    /// The settings of one container spec; `None` when it asks nothing.
    pub fn of(c: &Container) -> Option<ContainerSettings> {
        let priority = c
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(vgpu_core::env::TASK_PRIORITY_RESOURCE))
            .map(|q| q.0.clone());
        let env = |name: &str| {
            c.env
                .iter()
                .flatten()
                .rev()
                .find(|e| e.name == name)
                .and_then(|e| e.value.clone())
        };
        let s = ContainerSettings {
            priority,
            core_policy: env(vgpu_core::env::CORE_POLICY),
            disable_control: env(vgpu_core::env::DISABLE_CONTROL)
                .is_some_and(|v| vgpu_core::env::go_true(&v)),
        };
        (s != ContainerSettings::default()).then_some(s)
    }
}

impl PodEntry {
    /// Reads a pod as the API returned it; `None` without a uid.
    pub fn from_pod(pod: &Pod, node: &str) -> Option<PodEntry> {
        let m = &pod.metadata;
        let uid = m.uid.clone()?;
        let assignment = match m.annotations.as_ref().and_then(|a| a.get(ASSIGNMENT)) {
            None => Err(format!("no {ASSIGNMENT} annotation")),
            Some(v) => match PodAssignment::decode(v) {
                Err(e) => Err(e.to_string()),
                Ok(a) if a.node != node => Err(format!(
                    "{ASSIGNMENT} names node {:?}, this is {node:?}",
                    a.node
                )),
                Ok(a) => Ok(a),
            },
        };
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let allocated = m
            .annotations
            .as_ref()
            .and_then(|a| a.get(ALLOCATED))
            .map(|v| {
                v.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        let settings = pod
            .spec
            .iter()
            .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
            .filter_map(|c| Some((c.name.clone(), ContainerSettings::of(c)?)))
            .collect();
        Some(PodEntry {
            uid,
            namespace: m.namespace.clone().unwrap_or_default(),
            name: m.name.clone().unwrap_or_default(),
            created: m
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.as_second())
                .unwrap_or(0),
            pending: matches!(phase, None | Some("Pending")),
            assignment,
            allocated,
            settings,
        })
    }
}

/// The pod and container an Allocate was matched to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// Pod uid.
    pub uid: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub name: String,
    /// The container's assignment.
    pub container: ContainerAssignment,
    /// What it asks of the runtime beyond its slice.
    pub settings: ContainerSettings,
}

/// No pod fits an Allocate.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("no pending vGPU pod on this node has a container waiting for {count} device(s) on {uuids:?}{detail}; was the pod placed by the vgpu scheduler (annotation {ASSIGNMENT})?")]
pub struct NoMatch {
    /// Devices requested.
    pub count: usize,
    /// GPUs requested.
    pub uuids: Vec<String>,
    /// Why pending pods did not fit, when some exist.
    pub detail: String,
}

/// The node's vGPU pods.
#[derive(Debug, Default)]
pub struct PodCache {
    pods: HashMap<String, PodEntry>,
    /// Containers already answered, by pod uid. Keyed by uid so that the matcher's look-ups borrow
    /// instead of building a (uid, name) pair of owned strings for every cached pod.
    allocated: HashMap<String, HashSet<String>>,
}

impl PodCache {
    /// Adds or replaces a pod; containers its annotation marks as answered stay answered.
    pub fn upsert(&mut self, e: PodEntry) {
        for c in &e.allocated {
            self.mark(&e.uid, c);
        }
        self.pods.insert(e.uid.clone(), e);
    }

    /// Containers of pod `uid` answered so far, in assignment order.
    pub fn answered(&self, uid: &str) -> Vec<String> {
        let Some(Ok(a)) = self.pods.get(uid).map(|p| &p.assignment) else {
            return Vec::new();
        };
        a.containers
            .iter()
            .filter(|c| self.is_answered(uid, &c.name))
            .map(|c| c.name.clone())
            .collect()
    }

    /// Forgets a pod and what was answered for it.
    pub fn remove(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.allocated.remove(uid);
    }

    /// Replaces all pods (a relist); answers for pods still present are kept.
    pub fn replace_all(&mut self, entries: Vec<PodEntry>) {
        for e in &entries {
            for c in &e.allocated {
                self.mark(&e.uid, c);
            }
        }
        self.pods = entries.into_iter().map(|e| (e.uid.clone(), e)).collect();
        let pods = &self.pods;
        self.allocated.retain(|u, _| pods.contains_key(u));
    }

    fn is_answered(&self, uid: &str, container: &str) -> bool {
        self.allocated
            .get(uid)
            .is_some_and(|names| names.contains(container))
    }

    fn mark(&mut self, uid: &str, container: &str) {
        self.allocated
            .entry(uid.to_string())
            .or_default()
            .insert(container.to_string());
    }

    /// Number of cached pods.
    pub fn len(&self) -> usize {
        self.pods.len()
    }

    /// Whether no pod is cached.
    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    /// The pod with this uid.
    pub fn get(&self, uid: &str) -> Option<&PodEntry> {
        self.pods.get(uid)
    }

    /// The pending pods whose next container waits for `count` devices, with that container.
    fn waiting(&self, count: usize) -> impl Iterator<Item = (&PodEntry, &ContainerAssignment)> {
        self.pods
            .values()
            .filter(|p| p.pending)
            .filter_map(move |p| {
                let a = p.assignment.as_ref().ok()?;
                let next = a
                    .containers
                    .iter()
                    .find(|c| !self.is_answered(&p.uid, &c.name))?;
                (next.devices.len() == count).then_some((p, next))
            })
    }

    /// The GPUs assigned to the next container waiting for `count` devices (the hint
    /// GetPreferredAllocation gives the kubelet): of the oldest pod, or with `kubelet`, of the
    /// oldest the kubelet may be allocating (none: `None`); records nothing.
    pub fn peek_assigned(
        &self,
        count: usize,
        kubelet: Option<&KubeletPods>,
    ) -> Option<Vec<String>> {
        self.waiting(count)
            .filter(|(p, c)| {
                kubelet.is_none_or(|k| k.may_be_allocating(&p.namespace, &p.name, &c.name))
            })
            .min_by(|(a, _), (b, _)| a.age_order().cmp(&b.age_order()))
            .map(|(_, c)| c.devices.iter().map(|d| d.uuid.clone()).collect())
    }

    /// Finds the pod and container for an Allocate of `ids` and records the answer: among the
    /// pending pods whose next container asks as many devices (with `kubelet`, only those the
    /// kubelet may be allocating), the one assigned exactly these GPUs, else the oldest.
    pub fn claim(
        &mut self,
        ids: &[String],
        kubelet: Option<&KubeletPods>,
    ) -> Result<Claim, NoMatch> {
        let mut uuids: Vec<String> = Vec::new();
        for id in ids {
            let u = uuid_of(id);
            if !uuids.iter().any(|x| x == u) {
                uuids.push(u.to_string());
            }
        }
        let mut want = uuids.clone();
        want.sort();
        let mut candidates: Vec<(&PodEntry, &ContainerAssignment)> = Vec::new();
        let mut skipped = Vec::new();
        for p in self.pods.values().filter(|p| p.pending) {
            let a = match &p.assignment {
                Ok(a) => a,
                Err(e) => {
                    skipped.push(format!("{}/{}: {e}", p.namespace, p.name));
                    continue;
                }
            };
            let next = a
                .containers
                .iter()
                .find(|c| !self.is_answered(&p.uid, &c.name));
            match next {
                Some(c) if c.devices.len() == ids.len() => candidates.push((p, c)),
                Some(c) => skipped.push(format!(
                    "{}/{}: next container {} has {} device(s)",
                    p.namespace,
                    p.name,
                    c.name,
                    c.devices.len()
                )),
                None => {}
            }
        }
        candidates.sort_by(|a, b| a.0.age_order().cmp(&b.0.age_order()));
        if let Some(k) = kubelet {
            candidates.retain(|(p, c)| {
                let admitting = k.may_be_allocating(&p.namespace, &p.name, &c.name);
                if !admitting {
                    skipped.push(format!(
                        "{}/{}: not being admitted by the kubelet",
                        p.namespace, p.name
                    ));
                }
                admitting
            });
        }
        let same_gpus = |c: &ContainerAssignment| {
            let mut have: Vec<&str> = c.devices.iter().map(|d| d.uuid.as_str()).collect();
            have.sort();
            have == want.iter().map(String::as_str).collect::<Vec<_>>()
        };
        let chosen = candidates
            .iter()
            .find(|(_, c)| same_gpus(c))
            .or_else(|| candidates.first())
            .map(|(p, c)| Claim {
                uid: p.uid.clone(),
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                container: (*c).clone(),
                settings: p.settings.get(&c.name).cloned().unwrap_or_default(),
            });
        match chosen {
            Some(claim) => {
                self.mark(&claim.uid, &claim.container.name);
                Ok(claim)
            }
            None => {
                skipped.sort();
                Err(NoMatch {
                    count: ids.len(),
                    uuids,
                    detail: if skipped.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", skipped.join("; "))
                    },
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vgpu_core::assignment::DeviceSlice;

    fn entry(uid: &str, created: i64, containers: &[(&str, &[&str])]) -> PodEntry {
        PodEntry {
            uid: uid.into(),
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            created,
            pending: true,
            assignment: Ok(PodAssignment::new(
                "n1",
                containers
                    .iter()
                    .map(|(name, uuids)| ContainerAssignment {
                        name: name.to_string(),
                        devices: uuids
                            .iter()
                            .map(|u| DeviceSlice {
                                uuid: u.to_string(),
                                memory_mib: 1024,
                                cores: 10,
                                exclusive: false,
                            })
                            .collect(),
                    })
                    .collect(),
            )),
            allocated: Vec::new(),
            settings: HashMap::new(),
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn hami_settings_come_from_the_pod_spec() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"uid": "u1", "name": "p", "namespace": "ns"},
            "spec": {
                "initContainers": [{"name": "init", "env": [
                    {"name": "CUDA_DISABLE_CONTROL", "value": "True"}]}],
                "containers": [
                    {"name": "main",
                     "resources": {"limits": {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"}},
                     "env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
                             {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "default"}]},
                    // Only literal values count: a valueFrom is not in the pod.
                    {"name": "side", "env": [{"name": "GPU_CORE_UTILIZATION_POLICY",
                        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]}
        }))
        .unwrap();
        let e = PodEntry::from_pod(&pod, "n").unwrap();
        assert_eq!(
            e.settings["main"],
            ContainerSettings {
                priority: Some("0".into()),
                // The last of repeated names wins, as in the container runtime.
                core_policy: Some("default".into()),
                disable_control: false,
            }
        );
        assert!(e.settings["init"].disable_control);
        assert!(!e.settings.contains_key("side"));
    }

    #[test]
    fn oldest_first_then_next_pod() {
        let mut c = PodCache::default();
        c.upsert(entry("b", 20, &[("main", &["GPU-1"])]));
        c.upsert(entry("a", 10, &[("main", &["GPU-0"])]));
        // Same shape, the kubelet picked shares of neither assigned GPU: oldest first.
        assert_eq!(c.claim(&ids(&["GPU-9::0"]), None).unwrap().uid, "a");
        assert_eq!(c.claim(&ids(&["GPU-9::1"]), None).unwrap().uid, "b");
        let e = c.claim(&ids(&["GPU-9::2"]), None).unwrap_err();
        assert_eq!(e.count, 1);
    }

    /// The kubelet admits pods in the order they reach it, not by age: the one its PodResources
    /// List shows being admitted gets the hint and the answer, whatever GPU ids it used.
    #[test]
    fn the_pod_the_kubelet_admits_wins_over_age() {
        use crate::admitting::api;
        let view = |admitting: &str, holding: &str| {
            let pod = |name: &str, ids: &[&str]| api::PodResources {
                name: name.into(),
                namespace: "ns".into(),
                containers: vec![api::ContainerResources {
                    name: "main".into(),
                    devices: vec![api::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: ids.iter().map(|i| i.to_string()).collect(),
                    }],
                }],
            };
            let list = api::ListPodResourcesResponse {
                pod_resources: vec![
                    pod(&format!("pod-{admitting}"), &[]),
                    pod(&format!("pod-{holding}"), &["GPU-1::0"]),
                ],
            };
            KubeletPods::from_list(list, "nvidia.com/gpu")
        };
        let mut c = PodCache::default();
        c.upsert(entry("a", 10, &[("main", &["GPU-0"])]));
        c.upsert(entry("b", 20, &[("main", &["GPU-1"])]));
        // Without the kubelet's view: the oldest, crosswise if the kubelet admits b first.
        assert_eq!(c.peek_assigned(1, None), Some(vec!["GPU-0".to_string()]));
        let b_first = view("b", "none");
        assert_eq!(
            c.peek_assigned(1, Some(&b_first)),
            Some(vec!["GPU-1".to_string()])
        );
        assert_eq!(
            c.claim(&ids(&["GPU-0::3"]), Some(&b_first)).unwrap().uid,
            "b"
        );
        let then_a = view("a", "b");
        assert_eq!(
            c.claim(&ids(&["GPU-1::3"]), Some(&then_a)).unwrap().uid,
            "a"
        );
        // A view naming none of ours matches nothing (the caller refreshes, then falls back).
        c.upsert(entry("c", 30, &[("main", &["GPU-0"])]));
        let e = c
            .claim(&ids(&["GPU-0::4"]), Some(&view("elsewhere", "b")))
            .unwrap_err();
        assert!(
            e.to_string().contains("not being admitted by the kubelet"),
            "{e}"
        );
    }

    #[test]
    fn exact_gpus_win_over_age() {
        let mut c = PodCache::default();
        c.upsert(entry("a", 10, &[("main", &["GPU-0"])]));
        c.upsert(entry("b", 20, &[("main", &["GPU-1"])]));
        assert_eq!(c.claim(&ids(&["GPU-1::3"]), None).unwrap().uid, "b");
        assert_eq!(c.claim(&ids(&["GPU-0::3"]), None).unwrap().uid, "a");
    }

    #[test]
    fn containers_in_order_and_by_count() {
        let mut c = PodCache::default();
        c.upsert(entry(
            "a",
            10,
            &[("init", &["GPU-0"]), ("main", &["GPU-0", "GPU-1"])],
        ));
        let first = c.claim(&ids(&["GPU-0::1"]), None).unwrap();
        assert_eq!(first.container.name, "init");
        let e = c.claim(&ids(&["GPU-0::2"]), None).unwrap_err();
        assert!(e.detail.contains("next container main has 2"), "{e}");
        let second = c.claim(&ids(&["GPU-0::2", "GPU-1::0"]), None).unwrap();
        assert_eq!(second.container.name, "main");
        assert_eq!(c.answered("a"), ["init", "main"]);
        c.remove("a");
        assert!(c.is_empty());
    }

    #[test]
    fn annotation_marks_containers_answered() {
        let mut c = PodCache::default();
        let mut e = entry("a", 10, &[("init", &["GPU-0"]), ("main", &["GPU-0"])]);
        e.allocated = vec!["init".into()];
        c.upsert(e);
        assert_eq!(
            c.claim(&ids(&["GPU-0::0"]), None).unwrap().container.name,
            "main"
        );
    }

    #[test]
    fn skips_running_and_unassigned() {
        let mut c = PodCache::default();
        let mut running = entry("r", 1, &[("main", &["GPU-0"])]);
        running.pending = false;
        c.upsert(running);
        let mut bare = entry("u", 2, &[]);
        bare.assignment = Err("no vgpu.io/assignment annotation".into());
        c.upsert(bare);
        let e = c.claim(&ids(&["GPU-0::0"]), None).unwrap_err();
        assert!(
            e.to_string().contains("ns/pod-u: no vgpu.io/assignment"),
            "{e}"
        );
    }
}
