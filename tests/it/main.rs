//! The one integration-test binary (ripgrep's layout): each module tests one part through its real
//! process boundary, using the doubles beside this crate.

mod cert_rotation;
mod certs_api;
mod device_plugin;
mod dra;
mod e2e;
mod faults;
mod helm;
mod hook;
mod hostile;
mod images;
mod layout;
mod metrics;
mod python;
mod scheduler;
mod validate;
mod webhook;
