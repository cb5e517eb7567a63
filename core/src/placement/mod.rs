//! GPU placement: which physical GPUs of one node each vGPU container of a pod gets, and how good
//! that node is for the pod. Pure functions over a node's GPUs and what is already placed on them,
//! so the scheduler extender and the simulator run the same code.
//!
//! A container asking for `n` vGPUs gets `n` distinct GPUs of the node, each with
//!
//! - a healthy device of the NVIDIA vendor type,
//! - a model allowed by `nvidia.com/use-gputype` and not refused by `nvidia.com/nouse-gputype`
//!   (comma lists; an entry matches when the model contains it, ignoring case, as HAMi's `checkType`),
//! - a UUID allowed by `nvidia.com/use-gpuuuid` and not refused by `nvidia.com/nouse-gpuuuid`
//!   (comma lists of exact UUIDs, ignoring case),
//! - not cordoned: the node annotation `hami.io/device-cordon` (HAMi's: a comma list of GPU
//!   UUIDs) keeps new pods off the GPUs it names; pods already there keep running,
//! - fewer slices in use than the device's split count,
//! - the requested gpucores free (0 asks for no share; 100 asks for the card alone, so the card must
//!   hold no slice at all, and nothing else may join it afterwards; a pod whose
//!   `hami.io/gpu-scheduler-policy` lists `mutex` holds each of its GPUs alone the same way,
//!   with only the cores it asks for),
//! - the requested gpumem free (a percentage resolves against that card's memory).
//!
//! Containers of one pod are placed in order and see each other's slices, so two containers may
//! share a GPU (within its limits) but one container never holds the same GPU twice.
//!
//! Policies (`hami.io/node-scheduler-policy`, `hami.io/gpu-scheduler-policy`, HAMi-compatible):
//! `binpack` fills the most used GPUs (and nodes) first, `spread` the least used; with a table of
//! typical pods, `fragmentation` (FGD, [`frag`]) and `gap-aware` (FGD plus LP-priced gaps,
//! [`gaps`]) score what the typical pods could still use after the move. The GPU policy is a
//! comma list as in HAMi v2.10 (`binpack,mutex`): its first ordering policy orders the GPUs (the
//! scheduler's default when it names none), `mutex` adds the rule above ([`GpuPolicy`]).
//!
//! Topology (HAMi's `topology-aware` and `numa` words, and the pod annotation
//! `nvidia.com/numa-bind`), for the GPUs each container gets among those that fit:
//! `topology-aware` gives a container of several GPUs the set joined by the most NVLinks (the
//! node inventory's `nvlinks`; ties: the policy's order) and a one-GPU container the GPU with the
//! fewest NVLinks, keeping linked sets free; `numa` takes a container's GPUs from one NUMA node
//! when one has enough, `nvidia.com/numa-bind: "true"` insists (the node fails otherwise).
//!
//! The files, one job each (their items are re-exported here): `policy.rs` the policies and
//! HAMi's policy words, `gpu.rs` a node's GPUs as placement reads them, `request.rs` what a pod
//! asks, `miss.rs` why a container does not fit and the words for it, `place.rs` placing and
//! scoring; `frag.rs`, `gaps.rs` and `host.rs` the fragmentation, gap and host terms of the
//! table policies.

pub mod frag;
pub mod gaps;
pub mod host;
pub mod live;

use std::fmt;

use thiserror::Error;

use crate::annotations::{
    GPU_POLICY, NODE_POLICY, NOUSE_GPU_TYPE, NOUSE_GPU_UUID, USE_GPU_TYPE, USE_GPU_UUID,
};
use crate::assignment::{ContainerAssignment, DeviceSlice};
use crate::inventory::DeviceInfo;
use crate::request::VgpuRequest;
use host::{HostLeft, HostRequest};

/// The word of `hami.io/gpu-scheduler-policy` that asks for GPUs nothing else uses.
pub const MUTEX: &str = "mutex";
/// The word of `hami.io/gpu-scheduler-policy` that asks for NVLink-joined GPUs.
pub const TOPOLOGY_AWARE: &str = "topology-aware";
/// The word of `hami.io/gpu-scheduler-policy` that prefers a container's GPUs on one NUMA node.
pub const NUMA: &str = "numa";
/// Pod annotation that requires a container's GPUs on one NUMA node (HAMi's, Go `ParseBool`).
pub const NUMA_BIND: &str = "nvidia.com/numa-bind";
/// Largest candidate set whose subsets `topology-aware` tries one by one (beyond: greedy).
const TOPOLOGY_EXACT_MAX: usize = 16;

/// The gpucores value that asks for a whole card, exclusively.
pub const EXCLUSIVE_CORES: u32 = 100;

/// The highest node score [`place_scored`] gives (kube-scheduler's `MaxExtenderPriority`).
pub const MAX_SCORE: u32 = 10;

// The rooms; the `use` lines above are what they share (each has `use super::*`).
mod gpu;
mod miss;
mod place;
mod policy;
mod request;

pub use gpu::*;
pub use miss::*;
pub use place::*;
pub use policy::*;
pub use request::*;

#[cfg(test)]
mod tests;
