//! The device plugin reads a container's accounting file, which the container can write: any bytes
//! must give a `Snapshot` or an error, never a panic, and a snapshot's totals must not overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::accounting::{Snapshot, MAX_DEVICES};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Snapshot::parse(data) {
        let _ = (s.launches(), s.oom_refusals(), s.throttled_ns());
        for d in 0..=MAX_DEVICES {
            let _ = s.used(d);
        }
    }
});
