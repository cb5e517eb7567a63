//! cargo-fuzz target `codecs`: the body and the properties it checks are
//! `vgpu_fuzz_harness::codecs` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz_harness::codecs(data));
