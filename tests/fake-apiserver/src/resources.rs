//! The resource types the double knows: URL plural -> group, version, kind, scope, status subresource.
//!
//! Kubernetes names a collection by `/api/v1/...` for the core group and `/apis/GROUP/VERSION/...`
//! otherwise ("API groups", <https://kubernetes.io/docs/reference/using-api/#api-groups>). A list's kind
//! is the item kind plus `List` ("Kubernetes API Concepts: collections").

/// One resource type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group, empty for the core group.
    pub group: String,
    /// API version (`v1`).
    pub version: String,
    /// URL plural (`pods`).
    pub plural: String,
    /// Object kind (`Pod`).
    pub kind: String,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
    /// Whether `.status` is a subresource: the main resource's writes then ignore `.status` and
    /// `/status` writes change only `.status` ("Subresources", API concepts).
    pub has_status: bool,
}

impl ResourceType {
    /// `apiVersion` as written in objects (`v1`, `events.k8s.io/v1`).
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Key used in the store: `group/version/plural`.
    pub fn id(&self) -> String {
        format!("{}/{}/{}", self.group, self.version, self.plural)
    }
}

const KNOWN: &[(&str, &str, &str, &str, bool, bool)] = &[
    ("", "v1", "pods", "Pod", true, true),
    ("", "v1", "namespaces", "Namespace", false, true),
    ("", "v1", "nodes", "Node", false, true),
    ("", "v1", "resourcequotas", "ResourceQuota", true, true),
    ("", "v1", "events", "Event", true, false),
    ("", "v1", "configmaps", "ConfigMap", true, false),
    ("", "v1", "secrets", "Secret", true, false),
    ("", "v1", "services", "Service", true, true),
    ("events.k8s.io", "v1", "events", "Event", true, false),
    ("coordination.k8s.io", "v1", "leases", "Lease", true, false),
    ("apps", "v1", "replicasets", "ReplicaSet", true, true),
    ("apps", "v1", "deployments", "Deployment", true, true),
    ("batch", "v1", "jobs", "Job", true, true),
    // DRA (`kubectl api-resources --api-group=resource.k8s.io` on the real 1.36 cluster: slices
    // and classes cluster-scoped, claims with a status subresource the scheduler writes).
    (
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        false,
        false,
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "ResourceClaim",
        true,
        true,
    ),
    (
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        true,
        false,
    ),
    (
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        false,
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "mutatingwebhookconfigurations",
        "MutatingWebhookConfiguration",
        false,
        false,
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        false,
        false,
    ),
];

/// Looks up a known type, or makes up a generic one for an unknown plural (kind = singular with a
/// capital, scope from whether the URL carried a namespace) so that tests can store any object.
pub fn lookup(group: &str, version: &str, plural: &str, namespaced_url: bool) -> ResourceType {
    if let Some(&(g, v, p, k, ns, st)) = KNOWN
        .iter()
        .find(|(g, v, p, ..)| *g == group && *v == version && *p == plural)
    {
        return ResourceType {
            group: g.into(),
            version: v.into(),
            plural: p.into(),
            kind: k.into(),
            namespaced: ns,
            has_status: st,
        };
    }
    let singular = plural.strip_suffix('s').unwrap_or(plural);
    let mut kind = String::new();
    let mut chars = singular.chars();
    if let Some(c) = chars.next() {
        kind.extend(c.to_uppercase());
        kind.extend(chars);
    }
    ResourceType {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        kind,
        namespaced: namespaced_url,
        has_status: false,
    }
}

/// The type for an `apiVersion` and plural (`"events.k8s.io/v1"`, `"events"`).
pub fn by_plural(api_version: &str, plural: &str) -> ResourceType {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let namespaced = KNOWN
        .iter()
        .find(|(g, v, p, ..)| *g == group && *v == version && *p == plural)
        .is_none_or(|k| k.4);
    lookup(group, version, plural, namespaced)
}

/// The type for an object's `apiVersion` and `kind` (unknown kinds: lower-case kind plus `s`).
pub fn by_kind(api_version: &str, kind: &str) -> ResourceType {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    match KNOWN
        .iter()
        .find(|(g, v, _, k, ..)| *g == group && *v == version && *k == kind)
    {
        Some((_, _, p, ..)) => lookup(group, version, p, true),
        None => lookup(group, version, &format!("{}s", kind.to_lowercase()), true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_generic() {
        let pods = lookup("", "v1", "pods", true);
        assert_eq!((pods.kind.as_str(), pods.has_status), ("Pod", true));
        assert_eq!(pods.api_version(), "v1");
        let ev = lookup("events.k8s.io", "v1", "events", true);
        assert_eq!(ev.api_version(), "events.k8s.io/v1");
        let w = lookup("example.com", "v1", "widgets", false);
        assert_eq!((w.kind.as_str(), w.namespaced), ("Widget", false));
    }
}
