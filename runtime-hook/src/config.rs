//! The limits of this container, read from the environment contract in `vgpu_core::env`.

use std::path::PathBuf;
use thiserror::Error;
use vgpu_core::accounting::MAX_DEVICES;
use vgpu_core::env::{self, EnvValueError};

/// A variable whose value cannot be read: the hook prints this and fails closed.
#[derive(Debug, Error)]
#[error("vgpu: {var}={value:?} is invalid ({source}); refusing CUDA")]
pub struct ConfigError {
    /// Variable name.
    pub var: String,
    /// Its value.
    pub value: String,
    /// Why.
    #[source]
    pub source: EnvValueError,
}

/// Limits per visible device (index as the device plugin numbers them) and the accounting file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Memory limit in bytes; `None` = no limit (unset or 0).
    pub memory_limit: [Option<u64>; MAX_DEVICES],
    /// SM limit in percent; 0 = none.
    pub sm_limit: [u32; MAX_DEVICES],
    /// Accounting file.
    pub cache_path: PathBuf,
    /// CUDA ordinal -> limit index (from `CUDA_VISIBLE_DEVICES` inside the container).
    pub ordinal_map: Vec<usize>,
}

impl Config {
    /// Reads the configuration through `get` (the process environment, or a map in tests).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let bad = |var: &str, value: String, source| ConfigError {
            var: var.to_string(),
            value,
            source,
        };
        let mem = |var: &str| -> Result<Option<u64>, ConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) => env::parse_memory_bytes(&v)
                    .map(|b| (b > 0).then_some(b))
                    .map_err(|e| bad(var, v, e)),
            }
        };
        let sm = |var: &str| -> Result<Option<u32>, ConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) => env::parse_sm_percent(&v)
                    .map(Some)
                    .map_err(|e| bad(var, v, e)),
            }
        };
        let all_mem = mem(env::MEMORY_LIMIT)?;
        let all_sm = sm(env::SM_LIMIT)?;
        let mut memory_limit = [None; MAX_DEVICES];
        let mut sm_limit = [0; MAX_DEVICES];
        for i in 0..MAX_DEVICES {
            memory_limit[i] = match get(&env::memory_limit_for(i)) {
                Some(_) => mem(&env::memory_limit_for(i))?,
                None => all_mem,
            };
            sm_limit[i] = sm(&env::sm_limit_for(i))?.or(all_sm).unwrap_or(0);
        }
        let cache_path = get(env::SHARED_CACHE)
            .unwrap_or_else(|| env::DEFAULT_SHARED_CACHE.to_string())
            .into();
        let ordinal_map = ordinal_map(
            get("CUDA_VISIBLE_DEVICES").as_deref(),
            get("NVIDIA_VISIBLE_DEVICES").as_deref(),
        );
        Ok(Config {
            memory_limit,
            sm_limit,
            cache_path,
            ordinal_map,
        })
    }

    /// The limit index of CUDA ordinal `ordinal`.
    pub fn limit_index(&self, ordinal: usize) -> usize {
        self.ordinal_map.get(ordinal).copied().unwrap_or(ordinal)
    }
}

/// Maps CUDA ordinals to the container's device indexes. Inside the container the devices are
/// numbered in `NVIDIA_VISIBLE_DEVICES` order, which is the order of the `_<i>` limits; a
/// `CUDA_VISIBLE_DEVICES` set by the program renumbers them again: ordinal `k` is its `k`-th entry, an
/// index or a UUID found in `NVIDIA_VISIBLE_DEVICES` (HAMi-core #320/#225 applied limit `k` instead).
/// The list ends at the first entry that names no device, as the driver reads it.
pub fn ordinal_map(cuda_visible: Option<&str>, nvidia_visible: Option<&str>) -> Vec<usize> {
    let Some(list) = cuda_visible else {
        return (0..MAX_DEVICES).collect();
    };
    let uuids: Vec<&str> = nvidia_visible
        .map(|n| n.split(',').map(str::trim).collect())
        .unwrap_or_default();
    list.split(',')
        .map(str::trim)
        .map(|e| {
            e.parse::<usize>()
                .ok()
                .or_else(|| uuids.iter().position(|u| !e.is_empty() && *u == e))
        })
        .take_while(|i| i.is_some_and(|i| i < MAX_DEVICES))
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|k| m.get(k).cloned())
    }

    #[test]
    fn per_device_wins() {
        let c = cfg(&[
            ("CUDA_DEVICE_MEMORY_LIMIT", "4g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "1024m"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_SM_LIMIT_2", "0"),
        ])
        .unwrap();
        assert_eq!(c.memory_limit[0], Some(4 << 30));
        assert_eq!(c.memory_limit[1], Some(1 << 30));
        assert_eq!(c.sm_limit[0], 30);
        assert_eq!(c.sm_limit[2], 0);
        assert_eq!(c.cache_path, PathBuf::from(env::DEFAULT_SHARED_CACHE));
        assert_eq!(cfg(&[]).unwrap().memory_limit, [None; MAX_DEVICES]);
    }

    #[test]
    fn bad_values_fail_closed_naming_the_variable() {
        for (k, v) in [
            ("CUDA_DEVICE_MEMORY_LIMIT", "4gb"),
            ("CUDA_DEVICE_MEMORY_LIMIT_3", ""),
            ("CUDA_DEVICE_SM_LIMIT_0", "101"),
        ] {
            let e = cfg(&[(k, v)]).unwrap_err();
            assert_eq!(e.var, k);
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    #[test]
    fn visible_devices_renumber() {
        assert_eq!(ordinal_map(Some("1"), None), vec![1]);
        assert_eq!(ordinal_map(Some("2,0"), None), vec![2, 0]);
        assert_eq!(
            ordinal_map(Some("GPU-b,GPU-a"), Some("GPU-a,GPU-b")),
            vec![1, 0]
        );
        assert_eq!(ordinal_map(Some("1,x,0"), None), vec![1]);
        let c = cfg(&[("CUDA_VISIBLE_DEVICES", "1")]).unwrap();
        assert_eq!(c.limit_index(0), 1);
        assert_eq!(cfg(&[]).unwrap().limit_index(3), 3);
    }
}
