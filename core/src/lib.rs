//! The vocabulary every vgpu part shares.
//!
//! This crate does no I/O, spawns nothing and reads no environment: like kube-core it only *describes*
//! things — resource names and quantities, a pod's vGPU request, the annotations and environment
//! variables that cross process boundaries — and offers pure functions over those descriptions. The
//! webhook, scheduler and device plugin build on it, and so does the preload library, which is why its
//! dependencies stay light (serde, serde_json, thiserror).
//!
//! ```
//! use vgpu_core::request::{ContainerKind, ContainerResources, Memory, RequestPolicy};
//!
//! let policy = RequestPolicy::default();
//! let train = ContainerResources::new("train", ContainerKind::App)
//!     .limit("nvidia.com/gpu", "2")
//!     .limit("nvidia.com/gpumem", "4Gi");
//! let req = policy.parse_container(&train).unwrap().unwrap();
//! assert_eq!(req.gpus, 2);
//! assert_eq!(req.memory, Memory::Mib(4 * 1024 * 1024 * 1024));
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod accounting;
pub mod activity;
pub mod annotations;
pub mod assignment;
pub mod borrowed;
pub mod dra;
pub mod env;
pub mod exposition;
pub mod inventory;
pub mod limits_file;
pub mod placement;
pub mod quantity;
pub mod rbac;
pub mod request;
pub mod resources;
pub mod time;
