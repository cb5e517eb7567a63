//! cargo-fuzz target `accounting_parse`: the body and the properties it checks are
//! `vgpu_fuzz_harness::accounting_parse` (shared with the corpus replay test).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| vgpu_fuzz_harness::accounting_parse(data));
