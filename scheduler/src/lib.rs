//! `vgpu-scheduler`: a kube-scheduler HTTP extender that places vGPU pods on physical GPUs.
//!
//! kube-scheduler (an unmodified one, in the same pod) calls [`server::extender_app`]'s filter,
//! prioritize and bind verbs; the decisions come from `vgpu_core::placement` over the
//! [`cache::Cluster`] that [`watch`] keeps from node inventory annotations and vGPU pods'
//! assignment annotations. A bind is one Binding that carries the pod's `vgpu.io/assignment`.

pub mod cache;
pub mod claim_score;
pub mod claims;
pub mod cli;
mod dense;
pub mod extender;
mod fxhash;
pub mod hosts;
pub mod metrics;
pub mod pod;
pub mod readiness;
pub mod requeue;
pub mod server;
pub mod typical;
pub mod watch;
