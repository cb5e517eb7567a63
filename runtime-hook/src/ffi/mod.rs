//! The C ABI side: the real driver's functions, the mapped accounting file, and the exported
//! interposers. Every exported function is a one-liner into [`boundary`], which catches panics.
#![allow(unsafe_code)]
#![allow(clippy::missing_safety_doc)]
// Test builds do not export the symbols (`cfg_attr(not(test), no_mangle)`), so most of this is unused there.
#![cfg_attr(test, allow(dead_code))]
// The exported names are the CUDA driver API's.
#![allow(non_snake_case)]

use crate::board::Board;
use crate::config::Config;
use crate::ledger::Ledger;
use crate::meter::{Meters, ThreadMeter};
use crate::throttle::{self, Bucket, Controller, Pool};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::OnceLock;
use vgpu_core::accounting::{FILE_WORDS, MAX_DEVICES};
use vgpu_core::env::CorePolicy;

type CUresult = c_int;
type CUdeviceptr = u64;

const CUDA_SUCCESS: CUresult = 0;
const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
const CUDA_ERROR_NOT_FOUND: CUresult = 500;
const CUDA_ERROR_UNKNOWN: CUresult = 999;

/// Runs an exported function's body; a panic becomes `CUDA_ERROR_UNKNOWN` instead of unwinding into C.
fn boundary(f: impl FnOnce() -> CUresult) -> CUresult {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(CUDA_ERROR_UNKNOWN)
}

fn cu(r: CUresult) -> Result<(), CUresult> {
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

/// A table of the real library's entry points, each looked up by its own name (`None` when the
/// library lacks it).
macro_rules! real_table {
    ($(#[$m:meta])* struct $table:ident; $($name:ident : fn($($arg:ty),*);)*) => {
        $(#[$m])*
        #[allow(non_snake_case)]
        pub(super) struct $table { $(pub(super) $name: Option<unsafe extern "C" fn($($arg),*) -> CUresult>,)* }
        impl $table {
            pub(super) fn load(handle: *mut c_void, dlsym: DlsymFn) -> $table {
                $table { $($name: {
                    // SAFETY: looking up a constant name in the driver handle.
                    let p = unsafe { dlsym(handle, concat!(stringify!($name), "\0").as_ptr().cast()) };
                    // SAFETY: the driver's symbol of this name has this C signature (cuda.h).
                    (!p.is_null()).then(|| unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> CUresult>(p) })
                },)* }
            }
        }
    };
}

macro_rules! real_or {
    ($h:expr, $name:ident) => {
        match $h.real.$name {
            Some(f) => f,
            None => return CUDA_ERROR_NOT_FOUND,
        }
    };
}

macro_rules! try_cu {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(code) => return code,
        }
    };
}

mod boards;
mod cuda_exports;
mod hook;
mod keys;
mod lookup;
mod mapping;
mod nvml;
mod nvml_exports;
mod real;
mod sizes;
mod watcher;

use boards::*;
use hook::*;
use keys::*;
use mapping::*;
use nvml::*;
use real::*;
use sizes::*;
use watcher::*;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_a_cuda_error() {
        assert_eq!(boundary(|| panic!("boom")), CUDA_ERROR_UNKNOWN);
        assert_eq!(boundary(|| CUDA_SUCCESS), CUDA_SUCCESS);
    }
}
