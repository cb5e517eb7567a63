//! The watcher thread: the core limit's control loop, launch counts into the accounting file,
//! host-pid learning and the reclaim of dead processes' slots. Safe code.
#![deny(unsafe_code)]

use super::*;

/// How often the watcher reclaims the slots of dead processes (their memory returns to the
/// container within this time, their counters move to the retired totals).
pub(super) const RECLAIM_EVERY: u32 = 10; // periods of 50 ms: 500 ms

/// The watcher thread, one per process (started when the process claims its slot): every
/// [`throttle::PERIOD`] it reads each limited device's utilization from NVML and steers its bucket
/// (control law in [`crate::throttle`]) and copies the threads' launch meters into the slot; every
/// [`RECLAIM_EVERY`] periods it reclaims dead slots.
pub(super) fn watch(h: &'static Hook) {
    let mut devices = Vec::new();
    if let Some(t) = &h.throttle {
        let found: Vec<_> = (0..MAX_DEVICES)
            .filter(|&d| t.limits[d] > 0)
            .filter_map(|d| nvml_device(d).map(|(nv, handle)| (d, nv, handle)))
            .collect();
        if found.is_empty() {
            eprintln!(
                "vgpu: NVML (libnvidia-ml.so.1) is not available; CUDA_DEVICE_SM_LIMIT is not enforced"
            );
        }
        for (d, nv, handle) in found {
            let c = Controller::new(t.limits[d], METERS.blocks_on(d), now_ns());
            devices.push((nv, d, handle, c, 0u64));
        }
    }
    let me = std::process::id();
    // Whether this process still looks for its host pid (see find_host_pid).
    let mut searching = true;
    for tick in 1u32.. {
        std::thread::sleep(throttle::PERIOD);
        let now_ms = monotonic_ms();
        let launched = LAUNCHED.swap(0, Ordering::Relaxed);
        let (paused, shared) = h.boards.tick(h.config.priority, now_ms, launched);
        PAUSED.store(paused, Ordering::Relaxed);
        PAUSED_AT.store(now_ms, Ordering::Relaxed);
        if let Some(t) = &h.throttle {
            if let Some(slot) = h.claimed_slot().filter(|_| searching) {
                searching = h.ledger.host_pid(slot) == 0
                    && !devices.iter().any(|(nv, d, handle, _, _)| {
                        t.before[*d]
                            .as_deref()
                            .is_some_and(|b| find_host_pid(h, b, nv, *handle, slot))
                    });
            }
            let pids = h.ledger.pids();
            for (nv, d, handle, c, last_seen) in &mut devices {
                let u = utilization(nv, *handle, &pids, last_seen);
                // `default`: throttled only while another container launches on the GPU (a
                // device without an activity file counts as shared).
                let alone = h.config.core_policy == CorePolicy::Default
                    && h.boards.has(*d)
                    && shared & (1 << *d) == 0;
                if alone {
                    t.buckets[*d].unthrottle();
                    c.step(&t.buckets[*d], METERS.blocks_on(*d), now_ns(), None);
                } else {
                    c.step(&t.buckets[*d], METERS.blocks_on(*d), now_ns(), u);
                }
            }
        }
        flush_launches(h);
        if tick % RECLAIM_EVERY == 0 {
            h.ledger.reclaim_dead(me, &alive);
        }
    }
}
