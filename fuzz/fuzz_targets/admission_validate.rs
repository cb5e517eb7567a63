//! cargo-fuzz target `admission_validate`: the body and the properties it checks are
//! `vgpu_fuzz_harness::admission_validate` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz_harness::admission_validate(data));
