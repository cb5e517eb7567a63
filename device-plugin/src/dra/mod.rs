//! DRA mode: the node agent as a kubelet DRA plugin (driver `gpu.vgpu.io`) instead of a device
//! plugin. Each physical GPU is one device in this node's ResourceSlice, shared by many
//! ResourceClaims as consumable capacity (KEP-5075: `allowMultipleAllocations`, capacities
//! `memory` in bytes and `cores` in percent of the SMs); kube-scheduler allocates shares, and
//! NodePrepareResources gives each claim's containers what Allocate gives a device-plugin
//! container (limits file, limits env, libvgpu.so and `/etc/ld.so.preload`, the accounting dir),
//! through a CDI spec. docs/dra.md describes the mode.
//!
//! The parts: [`slices`] publishes the ResourceSlice, [`claims`] reads a claim's allocation,
//! [`cdi`] writes the CDI spec, [`prepare`] serves NodePrepareResources/NodeUnprepareResources,
//! [`health`] streams the GPUs' health to the kubelet, [`registration`] registers with the
//! kubelet's plugin watcher and serves the sockets.

pub mod authority;
pub mod cdi;
pub mod claims;
pub mod health;
pub mod prepare;
pub mod registration;
pub mod slices;

/// The driver name (the DeviceClass, the ResourceSlices' `spec.driver`, the attributes' domain),
/// the capacities' names and the unhealthy taint: `vgpu_core::dra`'s, shared with the webhook and
/// the scheduler.
pub use vgpu_core::dra::{CLASS as DRIVER, CORES, MEMORY, UNHEALTHY_TAINT};

/// The kubelet DRA plugin API, v1 (generated from `proto/dra_v1.proto`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod api_v1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}

/// The kubelet DRA plugin API, v1beta1 (the same messages; kubelets before 1.34 speak it).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod api_v1beta1 {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1beta1");
}

/// The kubelet's DRA resource health API, v1alpha1 (generated from
/// `proto/dra_health_v1alpha1.proto`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod health_api {
    tonic::include_proto!("v1alpha1");
}

/// The kubelet plugin registration API (generated from `proto/pluginregistration_v1.proto`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod registration_api {
    tonic::include_proto!("pluginregistration");
}
