//! What each component may ask of the Kubernetes API: the single list that the Helm chart's RBAC
//! must grant exactly (a test renders the chart and compares), and that README.md explains.
//!
//! When code starts calling a new verb, add it here with the reason; the chart test then fails
//! until `helm/vgpu/templates/rbac.yaml` grants it, so the two never drift apart.

/// Where a grant applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (a ClusterRole bound by a ClusterRoleBinding).
    Cluster,
    /// The release namespace only (a Role).
    ReleaseNamespace,
}

/// One rule: these verbs on this resource, and why the code needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApiAccess {
    /// API group (`""` is the core group).
    pub group: &'static str,
    /// Resource (`pods/binding` for a subresource).
    pub resource: &'static str,
    /// Only these object names (empty: any). Chart-dependent names are written as the
    /// placeholder of [`ApiAccess::names`].
    pub names: &'static [&'static str],
    /// Verbs.
    pub verbs: &'static [&'static str],
    /// Where it applies.
    pub scope: Scope,
    /// Why.
    pub why: &'static str,
    /// Granted only when the chart turns DRA mode on (`dra.enabled`).
    pub dra_only: bool,
}

impl ApiAccess {
    const fn cluster(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
        why: &'static str,
    ) -> ApiAccess {
        ApiAccess {
            group,
            resource,
            names: &[],
            verbs,
            scope: Scope::Cluster,
            why,
            dra_only: false,
        }
    }

    /// A cluster-wide grant of DRA mode only.
    const fn dra(
        group: &'static str,
        resource: &'static str,
        verbs: &'static [&'static str],
        why: &'static str,
    ) -> ApiAccess {
        ApiAccess {
            dra_only: true,
            ..ApiAccess::cluster(group, resource, verbs, why)
        }
    }
}

/// A component's identity and grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Component {
    /// ServiceAccount name suffix in the chart (`<release>-<suffix>`).
    pub service_account: &'static str,
    /// Rules of the component's own roles.
    pub rules: &'static [ApiAccess],
    /// Built-in roles the component is bound to (kube-scheduler's, as its documentation for a
    /// second scheduler says): `ClusterRole/NAME` or `NAMESPACE/Role/NAME`.
    pub builtin_roles: &'static [&'static str],
}

/// The admission webhook.
pub const WEBHOOK: Component = Component {
    service_account: "webhook",
    rules: &[
        ApiAccess::cluster(
            "",
            "resourcequotas",
            &["get", "list", "watch"],
            "read each tenant's gpumem quota to admit or reject a pod",
        ),
        ApiAccess::cluster(
            "",
            "pods",
            &["list", "watch"],
            "count the gpumem already used by a namespace's vGPU pods",
        ),
        ApiAccess::cluster(
            "",
            "nodes",
            &["list", "watch"],
            "the largest card of the inventory: percentage requests and oversized gpumem",
        ),
        ApiAccess::cluster(
            "events.k8s.io",
            "events",
            &["create", "get", "update"],
            "record each rejection as an Event (get, update: aggregate repeats in its series)",
        ),
        ApiAccess::cluster(
            "apps",
            "replicasets",
            &["patch"],
            "ask a controller whose pod was refused for quota to retry once room may have appeared (annotation vgpu.io/quota-retry)",
        ),
        ApiAccess::cluster(
            "apps",
            "statefulsets",
            &["patch"],
            "ask a controller whose pod was refused for quota to retry once room may have appeared (annotation vgpu.io/quota-retry)",
        ),
        ApiAccess::cluster(
            "apps",
            "daemonsets",
            &["patch"],
            "ask a controller whose pod was refused for quota to retry once room may have appeared (annotation vgpu.io/quota-retry)",
        ),
        ApiAccess::cluster(
            "batch",
            "jobs",
            &["patch"],
            "ask a controller whose pod was refused for quota to retry once room may have appeared (annotation vgpu.io/quota-retry)",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceslices",
            &["list", "watch"],
            "DRA mode: the published GPUs, to refuse a claim no GPU can serve",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceclaims",
            &["list", "watch"],
            "DRA mode: count the gpumem a namespace's claims of class gpu.vgpu.io hold",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceclaimtemplates",
            &["get", "list", "create", "patch", "delete"],
            "DRA mode: make the templates of pods written for HAMi, stamp their use, delete unused ones; read a pod's templates for its quota",
        ),
        ApiAccess {
            group: "",
            resource: "configmaps",
            names: &[],
            verbs: &["create", "get", "update"],
            scope: Scope::ReleaseNamespace,
            why: "the quota reservation ledgers (one ConfigMap per tenant namespace, compare-and-swap)",
            dra_only: false,
        },
    ],
    builtin_roles: &[],
};

/// The scheduler extender (`vgpu-scheduler`) and the kube-scheduler beside it.
pub const SCHEDULER: Component = Component {
    service_account: "scheduler",
    rules: &[
        ApiAccess::cluster(
            "",
            "nodes",
            &["get", "list", "watch", "patch"],
            "the GPU inventory the device plugin writes on each node (patch: the annotation vgpu.io/room-changed that makes kube-scheduler retry pods turned away on an older view)",
        ),
        ApiAccess::cluster(
            "",
            "pods",
            &["get", "list", "watch"],
            "what is already placed on each GPU",
        ),
        ApiAccess::cluster(
            "",
            "pods/binding",
            &["create"],
            "bind a pod to the chosen node; the Binding carries its assignment",
        ),
        ApiAccess::cluster(
            "",
            "events",
            &["create", "patch"],
            "explain why a pod fits no GPU",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceslices",
            &["list", "watch"],
            "DRA mode: the published GPUs, to explain why a claim waits",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceclaims",
            &["list", "watch"],
            "DRA mode: what allocated claims hold, and the waiting claims' requests",
        ),
        ApiAccess::dra(
            "events.k8s.io",
            "events",
            &["create", "patch"],
            "DRA mode: the Event on a pod whose claim no GPU has room for",
        ),
        ApiAccess {
            group: "coordination.k8s.io",
            resource: "leases",
            names: &[],
            verbs: &["create"],
            scope: Scope::ReleaseNamespace,
            why: "kube-scheduler creates its leader-election lease",
            dra_only: false,
        },
        ApiAccess {
            group: "coordination.k8s.io",
            resource: "leases",
            names: &[SCHEDULER_NAME_PLACEHOLDER],
            verbs: &["get", "update"],
            scope: Scope::ReleaseNamespace,
            why: "kube-scheduler renews its leader-election lease (named after the profile)",
            dra_only: false,
        },
    ],
    builtin_roles: &[
        "ClusterRole/system:kube-scheduler",
        "ClusterRole/system:volume-scheduler",
        "kube-system/Role/extension-apiserver-authentication-reader",
    ],
};

/// The device plugin DaemonSet.
pub const DEVICE_PLUGIN: Component = Component {
    service_account: "device-plugin",
    rules: &[
        ApiAccess::cluster(
            "",
            "nodes",
            &["get", "patch"],
            "publish the node's GPU inventory and heartbeat as annotations (DRA mode: get, the slice's owner)",
        ),
        ApiAccess::cluster(
            "",
            "nodes/status",
            &["patch"],
            "advertise the capacity of the resources only vgpu-scheduler places by (gpumem, gpumem-percentage, gpucores, priority), so kube-scheduler requeues a waiting pod when the node gains GPUs",
        ),
        ApiAccess::cluster(
            "",
            "pods",
            &["get", "list", "watch", "patch"],
            "find the pod an Allocate call is for and mark its assignment as allocated",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceslices",
            &["list", "watch", "create", "update", "delete"],
            "DRA mode: publish the node's ResourceSlice (one device per GPU) and keep it",
        ),
        ApiAccess::dra(
            "resource.k8s.io",
            "resourceclaims",
            &["get"],
            "DRA mode: read the allocation of a claim the kubelet asks to prepare",
        ),
    ],
    builtin_roles: &[],
};

/// The certificate Jobs (`vgpu-certs generate --secret --apply` and `inject`).
pub const CERTS: Component = Component {
    service_account: "certs",
    rules: &[
        ApiAccess {
            group: "",
            resource: "secrets",
            names: &[],
            verbs: &["create"],
            scope: Scope::ReleaseNamespace,
            why: "create the webhook's TLS Secret on first install",
            dra_only: false,
        },
        ApiAccess {
            group: "",
            resource: "secrets",
            names: &[SECRET_NAME_PLACEHOLDER],
            verbs: &["get", "update"],
            scope: Scope::ReleaseNamespace,
            why: "read and renew that Secret, and nothing else",
            dra_only: false,
        },
        ApiAccess {
            group: "admissionregistration.k8s.io",
            resource: "mutatingwebhookconfigurations",
            names: &[MUTATING_NAME_PLACEHOLDER],
            verbs: &["get", "patch"],
            scope: Scope::Cluster,
            why: "set the caBundle of vgpu's own mutating webhook",
            dra_only: false,
        },
        ApiAccess {
            group: "admissionregistration.k8s.io",
            resource: "validatingwebhookconfigurations",
            names: &[VALIDATING_NAME_PLACEHOLDER],
            verbs: &["get", "patch"],
            scope: Scope::Cluster,
            why: "set the caBundle of vgpu's own validating webhook",
            dra_only: false,
        },
    ],
    builtin_roles: &[],
};

/// Every component.
pub const ALL: &[Component] = &[WEBHOOK, SCHEDULER, DEVICE_PLUGIN, CERTS];

/// Stands for the chart's `schedulerName` in [`ApiAccess::names`].
pub const SCHEDULER_NAME_PLACEHOLDER: &str = "{schedulerName}";
/// Stands for the chart's `certs.secretName`.
pub const SECRET_NAME_PLACEHOLDER: &str = "{certs.secretName}";
/// Stands for the chart's MutatingWebhookConfiguration name.
pub const MUTATING_NAME_PLACEHOLDER: &str = "{mutatingWebhookConfiguration}";
/// Stands for the chart's ValidatingWebhookConfiguration name.
pub const VALIDATING_NAME_PLACEHOLDER: &str = "{validatingWebhookConfiguration}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_component_can_read_secrets_cluster_wide_or_escalate() {
        for c in ALL {
            for r in c.rules {
                assert!(
                    !r.verbs.contains(&"*"),
                    "{}: wildcard verb",
                    c.service_account
                );
                assert!(!r.why.is_empty());
                let dangerous = ["escalate", "bind", "impersonate"];
                assert!(r.verbs.iter().all(|v| !dangerous.contains(v)));
                if r.resource == "secrets" {
                    assert_eq!(r.scope, Scope::ReleaseNamespace, "{}", c.service_account);
                }
            }
            assert!(!c.builtin_roles.contains(&"ClusterRole/cluster-admin"));
        }
    }
}
