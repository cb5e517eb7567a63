//! TLS for the admission endpoint: the services' shared settings (`vgpu_serve::tls`), re-exported
//! here so the webhook's API stays where it was.

pub use vgpu_serve::tls::*;
