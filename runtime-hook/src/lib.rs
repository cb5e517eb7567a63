//! `libvgpu.so`: loaded into every process of a vGPU container (`/etc/ld.so.preload`), it exports the
//! CUDA driver entry points that allocate, free, report memory or launch work, meters them in the
//! container's shared accounting file and enforces the container's memory limit as a hard cap: an
//! allocation over the limit gets `CUDA_ERROR_OUT_OF_MEMORY` without reaching the driver, and
//! `cuMemGetInfo`/`cuDeviceTotalMem` report the slice, not the GPU.
//!
//! Layout: [`config`] reads the environment contract, [`ledger`] is the lock-free accounting over the
//! shared words, [`meter`] holds the per-thread launch meters, [`throttle`] the core limit and
//! [`board`] what the containers on one GPU tell each other (task priority, whether the GPU is
//! shared); all safe code. Unsafe code is allowed only in `ffi`'s modules that cross the C boundary
//! (real driver and NVML lookup with the real `dlsym`, the file mapping, the exported functions),
//! because a preload library cannot be written without it; `ffi`'s other modules (sizes, keys, the
//! watcher) deny it, and every unsafe block carries a `SAFETY` comment. Every exported function runs
//! inside a panic boundary that turns a panic into `CUDA_ERROR_UNKNOWN`.
//!
//! Staleness of the launch count: memory use, peaks, OOM refusals and throttled time reach the
//! accounting file at the call that changes them. Kernel launches are counted in per-thread meters
//! (no atomic read-modify-write on the launch path) and copied into the process's slot by its
//! watcher thread every [`throttle::PERIOD`] (50 ms) and at a normal exit (`atexit`), so a reader
//! sees a live process's count at most one period (plus scheduling delay) behind, and the exact count
//! once it has exited; a process killed by a signal loses at most its last period's launches.
#![deny(unsafe_code)]

pub mod board;
pub mod config;
mod ffi;
pub mod handles;
pub mod ledger;
pub mod meter;
pub mod pools;
pub mod shareable;
pub mod throttle;
