//! Which pod the kubelet is admitting, from its PodResources API, when the pod cache alone cannot
//! tell.
//!
//! The kubelet's GetPreferredAllocation and Allocate name no pod, so the pod cache answers for the
//! oldest pending pod whose next container asks as many devices (`pods.rs`). The kubelet admits
//! pods in the order they reach it (each batch sorted by creation, `kubelet.go`
//! `HandlePodAdditions`), which is not the order they were created: kube-scheduler binds waiting pods
//! in its own queue order. Two such pods bound together could then be answered crosswise, each
//! container getting the other's slice (seen on the real cluster with pods waiting for one GPU).
//!
//! The kubelet adds a pod to its pod manager before admitting it (`HandlePodAdditions`:
//! `podManager.AddPod`, then `allocationManager.AddPod`, whose admission calls the device manager)
//! and admits one pod at a time, and its PodResources `List` answers the active pods of the pod
//! manager with the devices each container holds (`apis/podresources/server_v1.go`). While the
//! kubelet waits on our answer, the pod it is admitting is therefore in `List` with the container
//! being allocated holding none of our devices, and pods bound after it are not in `List` yet. Of
//! the pods the cache could answer for, the one in that state is the one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::unix::connect_unix;

/// The kubelet's PodResources API, v1 (generated from `proto/podresources_v1.proto`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod api {
    tonic::include_proto!("v1");
}

/// The kubelet's PodResources socket.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// How long a List may take before the plugin answers without it (the kubelet waits on us).
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// What the kubelet's List says of the pods it knows: by (namespace, name), the containers that hold
/// devices of our resource.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletPods {
    pods: HashMap<(String, String), Vec<String>>,
}

impl KubeletPods {
    /// From a List answer, for devices of `resource`.
    pub fn from_list(list: api::ListPodResourcesResponse, resource: &str) -> KubeletPods {
        let pods = list
            .pod_resources
            .into_iter()
            .map(|p| {
                let holding = p
                    .containers
                    .into_iter()
                    .filter(|c| {
                        c.devices
                            .iter()
                            .any(|d| d.resource_name == resource && !d.device_ids.is_empty())
                    })
                    .map(|c| c.name)
                    .collect();
                ((p.namespace, p.name), holding)
            })
            .collect();
        KubeletPods { pods }
    }

    /// Whether the kubelet may be allocating `container` of pod `namespace/name` now: the pod is
    /// active there and the container holds none of our devices yet.
    pub fn may_be_allocating(&self, namespace: &str, name: &str, container: &str) -> bool {
        self.pods
            .get(&(namespace.to_string(), name.to_string()))
            .is_some_and(|holding| !holding.iter().any(|c| c == container))
    }
}

/// Where to ask: the kubelet's PodResources socket, and the resource our devices are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lister {
    /// The socket ([`DEFAULT_SOCKET`]).
    pub socket: PathBuf,
    /// Our resource (`nvidia.com/gpu`).
    pub resource: String,
}

impl Lister {
    /// The kubelet's pods, from `List`; `None` (logged) when the kubelet does not answer in time
    /// or serves no PodResources API, and the pod cache's own order decides.
    pub async fn list(&self) -> Option<KubeletPods> {
        let socket = &self.socket;
        let call = async {
            let channel = connect_unix(socket).await.map_err(|e| e.to_string())?;
            api::pod_resources_lister_client::PodResourcesListerClient::new(channel)
                .list(api::ListPodResourcesRequest {})
                .await
                .map(tonic::Response::into_inner)
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(LIST_TIMEOUT, call).await {
            Ok(Ok(list)) => Some(KubeletPods::from_list(list, &self.resource)),
            Ok(Err(error)) => {
                tracing::warn!(socket = %socket.display(), %error,
                    "the kubelet's PodResources List failed; answering the oldest pending pod");
                None
            }
            Err(_) => {
                tracing::warn!(socket = %socket.display(), timeout = ?LIST_TIMEOUT,
                    "the kubelet's PodResources List did not answer; answering the oldest pending pod");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, containers: &[(&str, &[&str])]) -> api::PodResources {
        api::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .map(|(c, ids)| api::ContainerResources {
                    name: (*c).into(),
                    devices: vec![api::ContainerDevices {
                        resource_name: "nvidia.com/gpu".into(),
                        device_ids: ids.iter().map(|i| i.to_string()).collect(),
                    }],
                })
                .collect(),
        }
    }

    #[test]
    fn a_container_holding_no_device_of_ours_may_be_the_one_allocated() {
        let mut other = pod("a", "cpu-only", &[("main", &["x"])]);
        other.containers[0].devices[0].resource_name = "example.com/fpga".into();
        let list = api::ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "running", &[("main", &["GPU-0::1"])]),
                pod("a", "admitting", &[("init", &["GPU-0::2"]), ("main", &[])]),
                other,
            ],
        };
        let k = KubeletPods::from_list(list, "nvidia.com/gpu");
        assert!(!k.may_be_allocating("a", "running", "main"));
        assert!(!k.may_be_allocating("a", "admitting", "init"));
        assert!(k.may_be_allocating("a", "admitting", "main"));
        assert!(k.may_be_allocating("a", "cpu-only", "main"));
        assert!(
            !k.may_be_allocating("a", "not-yet-at-the-kubelet", "main"),
            "a pod the kubelet has not received is not being admitted"
        );
    }
}
