//! The namespace the quota ledgers live in (`--namespace`, from `POD_NAMESPACE` in the chart), as
//! the webhook can use it.
//!
//! A ledger read or write that fails because that namespace does not exist, or because the
//! webhook may not write ConfigMaps there, is a setup fault, not an API outage: the refusal and
//! `/readyz` say which namespace and which flag, instead of "the Kubernetes API is unavailable".
//! The webhook checks at start with a dry-run create (what a ledger write needs: the namespace, and
//! the `create` verb on ConfigMaps there), then again every [`RECHECK`] while a fault is known, so
//! readiness comes back by itself once the namespace is created.

use kube::api::{Api, DynamicObject, ObjectMeta, PostParams};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often a known fault is checked again.
pub const RECHECK: Duration = Duration::from_secs(5);

/// Name of the ConfigMap the check creates with `dryRun=All` (never stored; no ledger can have it:
/// ledgers are `vgpu-quota-<namespace>`).
pub const PROBE_NAME: &str = "vgpu-ledger-probe";

/// Why the ledger namespace cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerFault {
    /// The namespace does not exist. The API server's NamespaceLifecycle admission refuses a
    /// create in it with `404 NotFound`, details `{kind: "namespaces", name: <namespace>}`
    /// (`k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle/admission.go`:
    /// `errors.NewNotFound(v1.Resource("namespaces"), a.GetNamespace())`; captured in
    /// `tests/fixtures/apiserver/create-in-missing-namespace.json`).
    Missing,
    /// RBAC refuses the webhook's ServiceAccount (`403 Forbidden`); the API server's message.
    Forbidden(String),
}

impl LedgerFault {
    /// What a ledger request's error means for the namespace `ledger_namespace`, or `None` for
    /// anything else (an outage, a timeout, a conflict).
    pub fn of(error: &kube::Error, ledger_namespace: &str) -> Option<LedgerFault> {
        let kube::Error::Api(status) = error else {
            return None;
        };
        match status.code {
            404 => status
                .details
                .as_ref()
                .filter(|d| d.kind == "namespaces" && d.name == ledger_namespace)
                .map(|_| LedgerFault::Missing),
            403 => Some(LedgerFault::Forbidden(status.message.clone())),
            _ => None,
        }
    }

    /// The fault in words that name the namespace and the flag.
    pub fn describe(&self, ledger_namespace: &str) -> String {
        match self {
            LedgerFault::Missing => format!(
                "the quota ledger namespace {ledger_namespace:?} (flag --namespace, env \
                 POD_NAMESPACE) does not exist: create it, or start the webhook with --namespace \
                 naming its own namespace"
            ),
            LedgerFault::Forbidden(message) => format!(
                "the webhook may not write its quota ledgers in namespace {ledger_namespace:?} \
                 (flag --namespace, env POD_NAMESPACE): {message}; it needs create, get and \
                 update on configmaps there (the chart's Role <release>-webhook-ledger)"
            ),
        }
    }
}

/// The ledger namespace and what is known to be wrong with it.
#[derive(Debug)]
pub struct LedgerNamespace {
    name: String,
    fault: Mutex<Option<LedgerFault>>,
}

impl LedgerNamespace {
    /// A namespace with no fault known yet.
    pub fn new(name: impl Into<String>) -> Arc<LedgerNamespace> {
        Arc::new(LedgerNamespace {
            name: name.into(),
            fault: Mutex::new(None),
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The known fault, described; `None` when the namespace works (or was not checked yet).
    pub fn problem(&self) -> Option<String> {
        self.lock().as_ref().map(|f| f.describe(&self.name))
    }

    /// Whether a ledger request's error is the namespace's fault: then it is recorded and
    /// described; any other error (an outage) is left to the caller.
    pub fn fault_in(&self, error: &kube::Error) -> Option<String> {
        let fault = LedgerFault::of(error, &self.name)?;
        let said = fault.describe(&self.name);
        *self.lock() = Some(fault);
        Some(said)
    }

    /// A ledger write went through: the namespace works.
    pub fn works(&self) {
        *self.lock() = None;
    }

    /// Checks the namespace at once, then every [`RECHECK`] while a fault is recorded (by the
    /// check or by an admission), for as long as the runtime runs.
    pub fn spawn_check(self: &Arc<Self>, client: kube::Client) {
        let me = self.clone();
        tokio::spawn(async move {
            me.check(&client).await;
            loop {
                tokio::time::sleep(RECHECK).await;
                if me.lock().is_some() {
                    me.check(&client).await;
                }
            }
        });
    }

    /// One dry-run create of [`PROBE_NAME`]: created, or already there (409), means the namespace
    /// exists and takes the webhook's writes; an outage changes nothing known.
    async fn check(&self, client: &kube::Client) {
        let configmaps = super::cache::api_resource("ConfigMap", "configmaps");
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &self.name, &configmaps);
        let mut probe = DynamicObject::new(PROBE_NAME, &configmaps);
        probe.metadata = ObjectMeta {
            name: Some(PROBE_NAME.to_string()),
            ..ObjectMeta::default()
        };
        let pp = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        match api.create(&pp, &probe).await {
            Ok(_) => self.works(),
            Err(kube::Error::Api(s)) if s.code == 409 => self.works(),
            Err(e) => {
                if let Some(problem) = self.fault_in(&e) {
                    tracing::warn!(problem, "quota ledger namespace unusable");
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<LedgerFault>> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status;

    /// An error as kube reads the API server's `Status` body.
    fn api_error(code: u16, kind: &str, name: &str, message: &str) -> kube::Error {
        let status: Status = serde_json::from_value(serde_json::json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
            "message": message, "details": {"name": name, "kind": kind}}))
        .unwrap();
        kube::Error::Api(status.boxed())
    }

    #[test]
    fn a_missing_namespace_is_told_apart_from_an_outage() {
        let ns = LedgerNamespace::new("vgpu-system");
        let missing = api_error(
            404,
            "namespaces",
            "vgpu-system",
            "namespaces \"vgpu-system\" not found",
        );
        let said = ns.fault_in(&missing).unwrap();
        assert_eq!(
            said,
            "the quota ledger namespace \"vgpu-system\" (flag --namespace, env POD_NAMESPACE) does \
             not exist: create it, or start the webhook with --namespace naming its own namespace"
        );
        assert_eq!(ns.problem(), Some(said));
        // Another object's 404, or a 500, is not the namespace's fault and changes nothing known.
        let other = api_error(404, "configmaps", "vgpu-quota-a", "not found");
        assert_eq!(ns.fault_in(&other), None);
        assert_eq!(ns.fault_in(&api_error(500, "", "", "etcd")), None);
        assert!(ns.problem().is_some());
        ns.works();
        assert_eq!(ns.problem(), None);
        let forbidden = api_error(
            403,
            "configmaps",
            "",
            "configmaps is forbidden: User \"x\" cannot create",
        );
        let said = ns.fault_in(&forbidden).unwrap();
        assert!(
            said.contains("cannot create") && said.contains("--namespace"),
            "{said}"
        );
    }
}
