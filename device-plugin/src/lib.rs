//! The vGPU kubelet device plugin: advertises each GPU as `--split-count` kubelet devices, answers
//! Allocate from the scheduler's assignment annotation, watches device health and publishes the
//! node inventory.

pub mod admitting;
pub mod allocate;
pub mod backend;
pub mod devices;
pub mod dra;
pub mod health;
pub mod inventory;
pub mod kubelet;
pub mod metrics;
pub mod plugin;
pub mod pods;
pub mod records;
pub mod unix;
pub mod watch;

/// The kubelet device plugin API, v1beta1 (generated from `proto/deviceplugin_v1beta1.proto`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod api {
    tonic::include_proto!("v1beta1");
}
