//! The environment contract between the parts that set a container's limits (webhook, device plugin)
//! and the preload library that enforces them.
//!
//! | variable | set by | value |
//! |---|---|---|
//! | `CUDA_DEVICE_MEMORY_LIMIT` | webhook (gpumem in MiB), device plugin (when every device of the container has the same) | memory per visible device: bytes, or with a unit `b k m g` (any case, binary: `4096m` = 4 GiB) |
//! | `CUDA_DEVICE_MEMORY_LIMIT_<i>` | device plugin | the same for visible device `i`; wins over the unsuffixed one |
//! | `CUDA_DEVICE_SM_LIMIT` | webhook, device plugin (as the memory limit) | 0–100, percent of SMs; 0 = unlimited |
//! | `CUDA_DEVICE_SM_LIMIT_<i>` | device plugin | the same for visible device `i` |
//! | `CUDA_DEVICE_MEMORY_SHARED_CACHE` | device plugin | path of the container's accounting file |
//! | `VGPU_*` | reserved | for future knobs of the hook |
//! | `CUDA_TASK_PRIORITY` | device plugin, from the container's `nvidia.com/priority` | 0 high, 1 low (HAMi's; default 1) |
//! | `GPU_CORE_UTILIZATION_POLICY` | device plugin: the node's `--gpu-core-policy`, or the container's own `env` | `default`, `force`, `disable` (HAMi's, any case) |
//!
//! The webhook and the device plugin write the unsuffixed pair in one form ([`container_limits`]):
//! the pod's `env` comes after the plugin's variables in the container, so the two must agree for
//! the hook to find the environment agreeing with its limits file.
//!
//! A tenant must not be able to set the limits: the webhook replaces user values, and the validating
//! webhook refuses them. [`is_reserved`] is the one definition of "a limit the runtime reads". The
//! two settings (HAMi's names, [`is_setting`]) are the tenant's to ask for in the pod: the device
//! plugin reads them from the pod spec (the validating webhook decides who may disable the core
//! limit) and writes what it decided into the limits file, which the hook trusts over the
//! environment.

use thiserror::Error;

/// Memory limit for every visible device (a per-device variable wins).
pub const MEMORY_LIMIT: &str = "CUDA_DEVICE_MEMORY_LIMIT";
/// SM limit for every visible device (a per-device variable wins).
pub const SM_LIMIT: &str = "CUDA_DEVICE_SM_LIMIT";
/// Path of the container's shared accounting file.
pub const SHARED_CACHE: &str = "CUDA_DEVICE_MEMORY_SHARED_CACHE";
/// Prefix reserved for other settings of the hook.
pub const RESERVED_PREFIX: &str = "VGPU_";
/// Task priority (HAMi's `CUDA_TASK_PRIORITY`): 0 high, 1 low.
pub const TASK_PRIORITY: &str = "CUDA_TASK_PRIORITY";
/// Core-limit policy (HAMi's `GPU_CORE_UTILIZATION_POLICY`).
pub const CORE_POLICY: &str = "GPU_CORE_UTILIZATION_POLICY";
/// HAMi's switch that answers a container without the hook (`true`, as Go's `strconv.ParseBool`).
pub const DISABLE_CONTROL: &str = "CUDA_DISABLE_CONTROL";
/// The resource that carries a container's task priority (HAMi's `resourcePriority`), ignored by
/// kube-scheduler (the chart's `managedResources`) and the kubelet (which drops extended resources
/// the node does not advertise: `pkg/kubelet/lifecycle/predicate.go`
/// `removeMissingExtendedResources`), read by the device plugin.
pub const TASK_PRIORITY_RESOURCE: &str = "nvidia.com/priority";
/// The priority a container without `nvidia.com/priority` gets (HAMi-core's default).
pub const DEFAULT_PRIORITY: u8 = 1;
/// Default accounting-file path when [`SHARED_CACHE`] is unset.
pub const DEFAULT_SHARED_CACHE: &str = "/tmp/vgpu/vgpu.cache";

/// `CUDA_DEVICE_MEMORY_LIMIT_<index>`.
pub fn memory_limit_for(index: usize) -> String {
    format!("{MEMORY_LIMIT}_{index}")
}

/// `CUDA_DEVICE_SM_LIMIT_<index>`.
pub fn sm_limit_for(index: usize) -> String {
    format!("{SM_LIMIT}_{index}")
}

/// Whether the runtime reads `name`, so that only vgpu may set it.
pub fn is_reserved(name: &str) -> bool {
    let indexed = |base: &str| {
        name.strip_prefix(base).is_some_and(|rest| {
            rest.is_empty()
                || rest
                    .strip_prefix('_')
                    .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    indexed(MEMORY_LIMIT)
        || indexed(SM_LIMIT)
        || name == SHARED_CACHE
        || name.starts_with(RESERVED_PREFIX)
}

/// Whether `name` is one of the settings the device plugin decides from the pod ([`TASK_PRIORITY`],
/// [`CORE_POLICY`]).
pub fn is_setting(name: &str) -> bool {
    name == TASK_PRIORITY || name == CORE_POLICY
}

/// When the core limit (`CUDA_DEVICE_SM_LIMIT`) applies: HAMi-core's
/// `GPU_CORE_UTILIZATION_POLICY` (`src/multiprocess/multiprocess_memory_limit.c`: `force`,
/// `disable`, anything else `default`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CorePolicy {
    /// Only while another container has launched work on the GPU within
    /// [`crate::activity::SHARED_WINDOW_MS`]: a container alone on its GPU may use all of it.
    Default,
    /// Always (vgpu's default: a slice is a slice).
    #[default]
    Force,
    /// Never.
    Disable,
}

impl CorePolicy {
    /// The value as written in the limits file.
    pub fn as_str(self) -> &'static str {
        match self {
            CorePolicy::Default => "default",
            CorePolicy::Force => "force",
            CorePolicy::Disable => "disable",
        }
    }

    /// Reads a value, any case, spaces trimmed.
    pub fn parse(value: &str) -> Result<CorePolicy, EnvValueError> {
        let v = value.trim();
        [CorePolicy::Default, CorePolicy::Force, CorePolicy::Disable]
            .into_iter()
            .find(|p| v.eq_ignore_ascii_case(p.as_str()))
            .ok_or_else(|| EnvValueError::NotCorePolicy {
                value: value.to_string(),
            })
    }
}

/// A pod's own setting that lifts one of its vGPU limits: only the namespaces an administrator
/// lists may use one (the validating webhook refuses it elsewhere, the device plugin does not
/// start it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lift {
    /// `CUDA_DISABLE_CONTROL` true: no hook at all.
    DisableControl,
    /// The container's own core policy other than `force`: `disable` (no core limit) or
    /// `default` (none while it looks alone on the GPU: it shares the GPU's activity file with
    /// its co-tenants, so it could make them look idle).
    CorePolicy(CorePolicy),
}

/// What a container's own settings lift, if anything.
pub fn lift(disable_control: bool, own_policy: Option<CorePolicy>) -> Option<Lift> {
    if disable_control {
        return Some(Lift::DisableControl);
    }
    own_policy
        .filter(|p| *p != CorePolicy::Force)
        .map(Lift::CorePolicy)
}

/// Reads a task priority: `0` (high) or `1` (low).
pub fn parse_priority(value: &str) -> Result<u8, EnvValueError> {
    match value.trim() {
        "0" => Ok(0),
        "1" => Ok(1),
        _ => Err(EnvValueError::NotPriority {
            value: value.to_string(),
        }),
    }
}

/// Whether a value is true as Go's `strconv.ParseBool` reads it (HAMi reads
/// `CUDA_DISABLE_CONTROL` so): `1`, `t`, `T`, `TRUE`, `true`, `True`.
pub fn go_true(value: &str) -> bool {
    matches!(value, "1" | "t" | "T" | "TRUE" | "true" | "True")
}

/// Writes a MiB amount the way the webhook injects it: `4096m`.
pub fn format_memory_mib(mib: u64) -> String {
    format!("{mib}m")
}

/// A container's limits for all its devices, as the webhook writes them into the pod's `env` and
/// the device plugin into its Allocate answer and limits file: `CUDA_DEVICE_MEMORY_LIMIT` (`4096m`)
/// when the MiB are known and `CUDA_DEVICE_SM_LIMIT` when the percentage is, in that order.
pub fn container_limits(
    memory_mib: Option<u64>,
    cores: Option<u32>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::with_capacity(2);
    if let Some(m) = memory_mib {
        out.push((MEMORY_LIMIT, format_memory_mib(m)));
    }
    if let Some(c) = cores {
        out.push((SM_LIMIT, c.to_string()));
    }
    out
}

/// Whether two values of the variable `name` mean the same limit: memory sizes and percentages
/// compared as numbers (`4096m` = `4g`), anything else as text.
pub fn same_value(name: &str, a: &str, b: &str) -> bool {
    let is = |base: &str| name == base || name.starts_with(&format!("{base}_"));
    if is(MEMORY_LIMIT) {
        if let (Ok(x), Ok(y)) = (parse_memory_bytes(a), parse_memory_bytes(b)) {
            return x == y;
        }
    } else if is(SM_LIMIT) {
        if let (Ok(x), Ok(y)) = (parse_sm_percent(a), parse_sm_percent(b)) {
            return x == y;
        }
    }
    a == b
}

/// Why an environment value cannot be read. The hook prints it and fails closed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EnvValueError {
    /// Not a number with an optional unit.
    #[error("{value:?} is not a memory size (bytes, or a number with unit b, k, m or g)")]
    NotMemory {
        /// The value as found.
        value: String,
    },
    /// Above 16 EiB.
    #[error("{value:?} is too large")]
    TooLarge {
        /// The value as found.
        value: String,
    },
    /// Not a whole percentage 0–100.
    #[error("{value:?} is not a percentage 0-100")]
    NotPercent {
        /// The value as found.
        value: String,
    },
    /// Not `default`, `force` or `disable`.
    #[error("{value:?} is not one of default, force, disable")]
    NotCorePolicy {
        /// The value as found.
        value: String,
    },
    /// Not 0 or 1.
    #[error("{value:?} is not a task priority (0 high, 1 low)")]
    NotPriority {
        /// The value as found.
        value: String,
    },
}

/// Parses a memory limit into bytes: plain bytes, or a number with a unit `b k m g`, case-insensitive,
/// binary multiples.
///
/// ```
/// use vgpu_core::env::parse_memory_bytes;
/// assert_eq!(parse_memory_bytes("4096m"), Ok(4 << 30));
/// assert_eq!(parse_memory_bytes("4G"), Ok(4 << 30));
/// assert_eq!(parse_memory_bytes("1024"), Ok(1024));
/// ```
pub fn parse_memory_bytes(value: &str) -> Result<u64, EnvValueError> {
    let bad = || EnvValueError::NotMemory {
        value: value.to_string(),
    };
    let v = value.trim();
    let (digits, shift) = match v.as_bytes().last().map(u8::to_ascii_lowercase) {
        Some(b'b') => (&v[..v.len() - 1], 0),
        Some(b'k') => (&v[..v.len() - 1], 10),
        Some(b'm') => (&v[..v.len() - 1], 20),
        Some(b'g') => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| EnvValueError::TooLarge {
        value: value.to_string(),
    })?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| EnvValueError::TooLarge {
            value: value.to_string(),
        })
}

/// Parses an SM limit, 0–100.
pub fn parse_sm_percent(value: &str) -> Result<u32, EnvValueError> {
    let v = value.trim();
    match v.parse::<u32>() {
        Ok(p) if p <= 100 && v.bytes().all(|b| b.is_ascii_digit()) => Ok(p),
        _ => Err(EnvValueError::NotPercent {
            value: value.to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_names() {
        for n in [
            MEMORY_LIMIT,
            "CUDA_DEVICE_MEMORY_LIMIT_0",
            "CUDA_DEVICE_SM_LIMIT_12",
            SM_LIMIT,
            SHARED_CACHE,
            "VGPU_LOG",
        ] {
            assert!(is_reserved(n), "{n}");
        }
        for n in [
            "CUDA_DEVICE_MEMORY_LIMITX",
            "CUDA_DEVICE_SM_LIMIT_",
            "CUDA_DEVICE_SM_LIMIT_a",
            "CUDA_VISIBLE_DEVICES",
            "PATH",
        ] {
            assert!(!is_reserved(n), "{n}");
        }
        assert_eq!(memory_limit_for(3), "CUDA_DEVICE_MEMORY_LIMIT_3");
        assert_eq!(sm_limit_for(0), "CUDA_DEVICE_SM_LIMIT_0");
    }

    #[test]
    fn memory_values_round_trip() {
        assert_eq!(parse_memory_bytes(&format_memory_mib(4096)), Ok(4096 << 20));
        for (v, want) in [
            ("1b", 1),
            ("2K", 2048),
            ("3k", 3072),
            ("1g", 1 << 30),
            ("7", 7),
            ("0", 0),
        ] {
            assert_eq!(parse_memory_bytes(v), Ok(want), "{v}");
        }
        for v in ["", "m", "4.5g", "-1", "4gb", "abc", "4 t"] {
            assert_eq!(
                parse_memory_bytes(v),
                Err(EnvValueError::NotMemory { value: v.into() }),
                "{v}"
            );
        }
        assert!(matches!(
            parse_memory_bytes("17179869184g"),
            Err(EnvValueError::TooLarge { .. })
        ));
        assert!(matches!(
            parse_memory_bytes("99999999999999999999"),
            Err(EnvValueError::TooLarge { .. })
        ));
    }

    #[test]
    fn one_form_for_a_containers_limits() {
        assert_eq!(
            container_limits(Some(3000), Some(30)),
            vec![
                (MEMORY_LIMIT, "3000m".to_string()),
                (SM_LIMIT, "30".to_string())
            ]
        );
        assert_eq!(
            container_limits(None, Some(0)),
            vec![(SM_LIMIT, "0".to_string())]
        );
        assert!(same_value(MEMORY_LIMIT, "4096m", "4g"));
        assert!(same_value(
            "CUDA_DEVICE_MEMORY_LIMIT_1",
            "1024m",
            "1073741824"
        ));
        assert!(!same_value("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m", "80g"));
        assert!(same_value(SM_LIMIT, "30", " 30"));
        assert!(!same_value("CUDA_DEVICE_SM_LIMIT_0", "30", "100"));
        assert!(!same_value(SHARED_CACHE, "/tmp/vgpu/vgpu.cache", "/tmp/x"));
        assert!(!same_value(MEMORY_LIMIT, "x", "4g"));
    }

    #[test]
    fn settings_read_as_hami_writes_them() {
        assert!(is_setting(TASK_PRIORITY) && is_setting(CORE_POLICY));
        assert!(!is_reserved(TASK_PRIORITY) && !is_setting(SM_LIMIT));
        assert_eq!(CorePolicy::parse("FORCE"), Ok(CorePolicy::Force));
        assert_eq!(CorePolicy::parse(" disable"), Ok(CorePolicy::Disable));
        assert_eq!(CorePolicy::parse("default"), Ok(CorePolicy::Default));
        assert_eq!(
            CorePolicy::parse("off").unwrap_err().to_string(),
            "\"off\" is not one of default, force, disable"
        );
        assert_eq!(parse_priority("0"), Ok(0));
        assert_eq!(parse_priority("1"), Ok(1));
        assert!(parse_priority("2").is_err() && parse_priority("").is_err());
        assert!(go_true("True") && go_true("1") && !go_true("yes") && !go_true("false"));
    }

    #[test]
    fn sm_values() {
        assert_eq!(parse_sm_percent("0"), Ok(0));
        assert_eq!(parse_sm_percent("100"), Ok(100));
        for v in ["101", "-1", "+5", "x", ""] {
            assert!(parse_sm_percent(v).is_err(), "{v}");
        }
    }
}
