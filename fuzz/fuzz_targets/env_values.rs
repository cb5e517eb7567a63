//! cargo-fuzz target `env_values`: the body and the properties it checks are
//! `vgpu_fuzz_harness::env_values` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz_harness::env_values(data));
