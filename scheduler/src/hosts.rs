//! CPU and memory each node has left for new pods, the way kube-scheduler's `NodeResourcesFit`
//! counts them: the Node's `status.allocatable` minus the requests of every pod bound to it that
//! has not finished (`pkg/scheduler/framework/types.go` `NodeInfo.update`, which adds each pod's
//! `PodRequests` to `Requested`). The `gap-aware` policy's host terms read it.
//!
//! Slim on purpose: per pod only its node and its two numbers, per node its allocatable and the
//! sums. A cluster of 150 000 pods costs about 100 bytes a pod here.

use std::collections::HashMap;
use vgpu_core::placement::host::{HostLeft, HostRequest};

/// Node index in [`Hosts::names`].
type NodeId = u32;

#[derive(Debug, Clone, Copy, Default)]
struct NodeHost {
    /// `status.allocatable` (milli-CPU, MiB), once the Node was seen with it.
    allocatable: Option<HostLeft>,
    /// The sum of its pods' requests.
    requested: HostRequest,
}

/// The host view of the cluster.
#[derive(Debug, Default)]
pub struct Hosts {
    ids: HashMap<String, NodeId>,
    names: Vec<String>,
    nodes: Vec<NodeHost>,
    /// Pod UID to its node and request.
    pods: HashMap<Box<str>, (NodeId, HostRequest)>,
}

impl Hosts {
    fn id(&mut self, node: &str) -> NodeId {
        if let Some(&id) = self.ids.get(node) {
            return id;
        }
        let id = self.nodes.len() as NodeId;
        self.nodes.push(NodeHost::default());
        self.names.push(node.to_string());
        self.ids.insert(node.to_string(), id);
        id
    }

    /// Sets a node's allocatable CPU and memory (`None`: not known); whether it changed.
    pub fn set_allocatable(&mut self, node: &str, allocatable: Option<HostLeft>) -> bool {
        let id = self.id(node);
        let slot = &mut self.nodes[id as usize].allocatable;
        let changed = *slot != allocatable;
        *slot = allocatable;
        changed
    }

    /// What pod `uid` is counted with.
    pub fn request(&self, uid: &str) -> Option<HostRequest> {
        self.pods.get(uid).map(|p| p.1)
    }

    /// Forgets a deleted node's allocatable (its pods stay counted until they go, as they do in
    /// kube-scheduler's cache).
    pub fn delete_node(&mut self, node: &str) {
        if let Some(&id) = self.ids.get(node) {
            self.nodes[id as usize].allocatable = None;
        }
    }

    /// Counts pod `uid` on `node` with request `r`, replacing what it counted before; `None`
    /// (not bound, or finished) stops counting it. Returns the nodes whose use changed.
    pub fn set_pod(&mut self, uid: &str, on: Option<(&str, HostRequest)>) -> Vec<&str> {
        let old = self.pods.get(uid).copied();
        let new = on.map(|(node, r)| (self.id(node), r));
        if old == new {
            return Vec::new();
        }
        if let Some((id, r)) = old {
            let n = &mut self.nodes[id as usize].requested;
            n.cpu_milli = n.cpu_milli.saturating_sub(r.cpu_milli);
            n.mem_mib = n.mem_mib.saturating_sub(r.mem_mib);
        }
        match new {
            Some((id, r)) => {
                let n = &mut self.nodes[id as usize].requested;
                n.cpu_milli = n.cpu_milli.saturating_add(r.cpu_milli);
                n.mem_mib = n.mem_mib.saturating_add(r.mem_mib);
                self.pods.insert(uid.into(), (id, r));
            }
            None => {
                self.pods.remove(uid);
            }
        }
        let mut changed: Vec<&str> = Vec::with_capacity(2);
        for id in [old.map(|o| o.0), new.map(|n| n.0)].into_iter().flatten() {
            let name = self.names[id as usize].as_str();
            if !changed.contains(&name) {
                changed.push(name);
            }
        }
        changed
    }

    /// Drops every pod not in `keep` (after a re-list); returns the nodes whose use changed.
    pub fn retain_pods(&mut self, keep: &dyn Fn(&str) -> bool) -> Vec<String> {
        let gone: Vec<Box<str>> = self.pods.keys().filter(|u| !keep(u)).cloned().collect();
        let mut changed: Vec<String> = Vec::new();
        for uid in gone {
            for n in self.set_pod(&uid, None) {
                if !changed.iter().any(|c| c == n) {
                    changed.push(n.to_string());
                }
            }
        }
        changed
    }

    /// What `node` has left, when its allocatable is known.
    pub fn left(&self, node: &str) -> Option<HostLeft> {
        let n = self.nodes.get(*self.ids.get(node)? as usize)?;
        let a = n.allocatable?;
        Some(HostLeft {
            cpu_milli: a.cpu_milli.saturating_sub(n.requested.cpu_milli),
            mem_mib: a.mem_mib.saturating_sub(n.requested.mem_mib),
            model: 0,
        })
    }

    /// Pods counted.
    pub fn pods(&self) -> usize {
        self.pods.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cpu_milli: u64, mem_mib: u64) -> HostRequest {
        HostRequest { cpu_milli, mem_mib }
    }

    #[test]
    fn pods_take_from_their_node_until_they_go() {
        let mut h = Hosts::default();
        assert_eq!(h.left("a"), None);
        h.set_allocatable(
            "a",
            Some(HostLeft {
                cpu_milli: 8000,
                mem_mib: 32768,
                model: 0,
            }),
        );
        assert_eq!(h.set_pod("p1", Some(("a", req(2000, 4096)))), ["a"]);
        assert!(h.set_pod("p1", Some(("a", req(2000, 4096)))).is_empty());
        h.set_pod("p2", Some(("a", req(500, 1024))));
        h.set_pod("p3", Some(("b", req(500, 1024))));
        assert_eq!(
            h.left("a"),
            Some(HostLeft {
                cpu_milli: 5500,
                mem_mib: 27648,
                model: 0,
            })
        );
        // Moved, finished, re-listed away.
        assert_eq!(h.set_pod("p1", Some(("b", req(2000, 4096)))), ["a", "b"]);
        h.set_pod("p2", None);
        assert_eq!(h.left("a").map(|l| l.cpu_milli), Some(8000));
        h.set_pod("p2", Some(("a", req(9000, 1))));
        assert_eq!(h.left("a").map(|l| l.cpu_milli), Some(0));
        assert_eq!(h.retain_pods(&|u| u != "p2"), ["a"]);
        assert_eq!(h.left("a").map(|l| l.cpu_milli), Some(8000));
        assert_eq!(h.pods(), 2);
        h.delete_node("a");
        assert_eq!(h.left("a"), None);
    }
}
