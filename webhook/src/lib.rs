//! The vgpu admission webhook: rewrites new vGPU pods so the rest of vgpu can place and limit them.
//!
//! The HTTP layer ([`server`]) is a thin adapter: it reads an AdmissionReview ([`admission`]),
//! hands the pod to the pure decision functions ([`mutate`]), and always answers with a review,
//! except for bodies that are not reviews at all (400) or too large (413).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod admission;
pub mod cli;
pub mod config;
pub mod dra;
pub mod metrics;
pub mod mutate;
pub mod pod;
pub mod podview;
pub mod server;
pub mod validate;
