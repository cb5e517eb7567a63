//! The limits file: the device plugin's copy of a container's limits, out of the tenant's reach.
//!
//! Allocate answers with environment variables, but kubelet appends the pod's own `env` and `envFrom`
//! after the device plugin's (kubelet `GenerateRunContainerOptions`: `opts.Envs = append(opts.Envs,
//! envs...)`), and the container runtime lets the later value win. The validating webhook refuses
//! reserved names in `env`, but the keys of a ConfigMap behind `envFrom` are not in the pod, so a
//! tenant could lift its own `CUDA_DEVICE_MEMORY_LIMIT_0` that way. The device plugin therefore also
//! writes the limits to a file it mounts read-only next to the hook library
//! (`/usr/local/vgpu/limits.env`, a path the validating webhook forbids tenants to mount over), and
//! the hook reads limits from that file whenever it exists, ignoring the environment for them.
//!
//! Format: one `NAME=VALUE` per line, in the environment contract's names ([`crate::env`]); blank
//! lines and lines starting with `#` are ignored. The two settings (`CUDA_TASK_PRIORITY`,
//! `GPU_CORE_UTILIZATION_POLICY`) appear only when they differ from the hook's defaults, and the
//! file's header comment says which defaults those are: a hook rolled back to a version that
//! predates them refuses names it does not know, and a restarted container keeps its limits file
//! but gets the library the node has now. Only the contract's names and
//! `NVIDIA_VISIBLE_DEVICES` may appear, each at most once, so a damaged file is an error (the hook
//! fails closed), never a partial read.

use crate::env;
use std::collections::BTreeMap;
use thiserror::Error;

/// File name of the limits file, in the directory of the hook library.
pub const FILE_NAME: &str = "limits.env";

/// The device list variable, recorded so the hook numbers devices as the plugin did.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Why a limits file cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitsFileError {
    /// A line that is not `NAME=VALUE`.
    #[error("line {line}: expected NAME=VALUE")]
    Syntax {
        /// 1-based line number.
        line: usize,
    },
    /// A name outside the contract.
    #[error("line {line}: {name:?} is not a variable of the vgpu runtime")]
    UnknownName {
        /// 1-based line number.
        line: usize,
        /// The name.
        name: String,
    },
    /// A name given twice.
    #[error("line {line}: {name} is given twice")]
    Duplicate {
        /// 1-based line number.
        line: usize,
        /// The name.
        name: String,
    },
}

/// Whether `name` may appear in a limits file.
pub fn is_allowed(name: &str) -> bool {
    env::is_reserved(name) || env::is_setting(name) || name == VISIBLE_DEVICES
}

/// Writes `vars` as a limits file (sorted by name, so the same limits give the same bytes).
/// Names outside [`is_allowed`] are skipped: the file carries limits, nothing else.
pub fn format<'a>(vars: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let sorted: BTreeMap<&str, &str> = vars
        .into_iter()
        .filter(|(k, v)| is_allowed(k) && !v.contains('\n'))
        .collect();
    let mut out = format!(
        "# Written by vgpu-device-plugin at Allocate; read by libvgpu.so.\n\
         # Not listed here: {}={} and {}={}, the hook's defaults.\n",
        env::TASK_PRIORITY,
        env::DEFAULT_PRIORITY,
        env::CORE_POLICY,
        env::CorePolicy::default().as_str()
    );
    for (k, v) in sorted {
        out.push_str(k);
        out.push('=');
        out.push_str(v);
        out.push('\n');
    }
    out
}

/// Reads a limits file.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, LimitsFileError> {
    let mut vars = BTreeMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (name, value) = trimmed
            .split_once('=')
            .ok_or(LimitsFileError::Syntax { line })?;
        let name = name.trim();
        if name.is_empty() {
            return Err(LimitsFileError::Syntax { line });
        }
        if !is_allowed(name) {
            return Err(LimitsFileError::UnknownName {
                line,
                name: name.to_string(),
            });
        }
        if vars
            .insert(name.to_string(), value.trim().to_string())
            .is_some()
        {
            return Err(LimitsFileError::Duplicate {
                line,
                name: name.to_string(),
            });
        }
    }
    Ok(vars)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn round_trips_the_contract_and_drops_other_names() {
        let text = format([
            ("CUDA_DEVICE_SM_LIMIT_0", "30"),
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "4096m"),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-a,GPU-b"),
            ("LD_PRELOAD", "/evil.so"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/vgpu.cache"),
        ]);
        assert!(!text.contains("LD_PRELOAD"));
        let vars = parse(&text).unwrap();
        assert_eq!(vars.len(), 4);
        assert_eq!(vars["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
        assert_eq!(vars["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        // Sorted: the same limits always give the same bytes.
        let again = format(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        assert_eq!(again, text);
    }

    #[test]
    fn a_damaged_file_is_an_error_naming_the_line() {
        assert_eq!(
            parse("CUDA_DEVICE_MEMORY_LIMIT_0=1g\ngarbage\n"),
            Err(LimitsFileError::Syntax { line: 2 })
        );
        assert_eq!(
            parse("# c\n\nLD_PRELOAD=/x.so\n"),
            Err(LimitsFileError::UnknownName {
                line: 3,
                name: "LD_PRELOAD".into()
            })
        );
        assert_eq!(
            parse("CUDA_DEVICE_SM_LIMIT=1\nCUDA_DEVICE_SM_LIMIT=100\n"),
            Err(LimitsFileError::Duplicate {
                line: 2,
                name: "CUDA_DEVICE_SM_LIMIT".into()
            })
        );
        assert_eq!(parse("=5\n"), Err(LimitsFileError::Syntax { line: 1 }));
        assert!(parse("").unwrap().is_empty());
    }
}
