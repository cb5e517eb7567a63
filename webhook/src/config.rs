//! The webhook's configuration file (`--config`, YAML): resource names and defaults.
//!
//! ```yaml
//! resourceNames:
//!   gpu: nvidia.com/gpu
//!   gpumem: nvidia.com/gpumem
//!   gpumemPercentage: nvidia.com/gpumem-percentage
//!   gpucores: nvidia.com/gpucores
//! defaults:
//!   gpu: 1                 # vGPUs when only memory/cores are given
//!   gpumemPercentage: 100  # memory when neither gpumem nor percentage is given
//!   gpucores: 0            # 0 = unlimited
//! policy:                  # validating rules, all on by default
//!   denyPrivileged: true
//!   denyReservedEnv: true
//!   denyReservedAnnotations: true
//!   denyPreloadOverride: true
//!   denyOversizedGpumem: true
//!   protectedPaths: [/etc/ld.so.preload, /usr/local/vgpu]
//!   denyDisableControl: true
//!   disableControlNamespaces: []   # may set CUDA_DISABLE_CONTROL / their own GPU_CORE_UTILIZATION_POLICY
//!   denyPresetNodeName: true
//!   presetNodeNameNamespaces: []   # may create vGPU pods with spec.nodeName (skipping vgpu-scheduler)
//! ```
//!
//! Every key is optional; unknown keys are an error, so a typo never silently keeps a default.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use thiserror::Error;
use vgpu_core::request::RequestPolicy;
use vgpu_core::resources::{Defaults, ResourceNames};

use crate::validate::policy::PolicyRules;

/// The file's contents.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConfigFile {
    /// Resource names.
    pub resource_names: ResourceNames,
    /// Defaults.
    pub defaults: Defaults,
    /// Validating policy rules.
    pub policy: PolicyRules,
}

/// The file could not be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not readable.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Not valid YAML of the expected shape.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The YAML error (names the field and line).
        #[source]
        source: serde_yaml::Error,
    },
    /// Values that make no sense together.
    #[error("config file {path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

impl ConfigFile {
    /// Reads and checks a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parses config text; `path` is only used in messages.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: ConfigFile = if text.trim().is_empty() {
            ConfigFile::default()
        } else {
            serde_yaml::from_str(text).map_err(|source| ConfigError::Parse {
                path: path.into(),
                source,
            })?
        };
        let invalid = |problem: String| ConfigError::Invalid {
            path: path.into(),
            problem,
        };
        let d = cfg.defaults;
        if d.gpu == 0 {
            return Err(invalid("defaults.gpu must be at least 1".into()));
        }
        if !(1..=100).contains(&d.gpumem_percentage) {
            return Err(invalid(format!(
                "defaults.gpumemPercentage {} is out of range 1-100",
                d.gpumem_percentage
            )));
        }
        if d.gpucores > 100 {
            return Err(invalid(format!(
                "defaults.gpucores {} is out of range 0-100",
                d.gpucores
            )));
        }
        let names = cfg.resource_names.all();
        for (i, n) in names.iter().enumerate() {
            if n.is_empty() {
                return Err(invalid("resourceNames: names must not be empty".into()));
            }
            if names[..i].contains(n) {
                return Err(invalid(format!("resourceNames: {n} is used twice")));
            }
        }
        Ok(cfg)
    }

    /// The request policy this config describes.
    pub fn request_policy(&self) -> RequestPolicy {
        RequestPolicy {
            names: self.resource_names.clone(),
            defaults: self.defaults,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(s, Path::new("vgpu.yaml"))
    }

    #[test]
    fn empty_and_partial_files_keep_defaults() {
        assert_eq!(parse("").unwrap(), ConfigFile::default());
        let c =
            parse("defaults:\n  gpucores: 20\nresourceNames:\n  gpu: example.com/vgpu\n").unwrap();
        assert_eq!(c.defaults.gpucores, 20);
        assert_eq!(c.defaults.gpu, 1);
        assert_eq!(c.resource_names.gpu, "example.com/vgpu");
        assert_eq!(c.resource_names.gpumem, "nvidia.com/gpumem");
        assert!(c.policy.deny_privileged);
        let c = parse("policy:\n  denyPrivileged: false\n").unwrap();
        assert!(!c.policy.deny_privileged && c.policy.deny_reserved_env);
        let e = parse("policy:\n  denyPriviliged: false\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown field `denyPriviliged`"), "{e}");
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse("defaults:\n  gpucore: 20\n").unwrap_err().to_string();
        assert!(
            e.contains("unknown field `gpucore`") && e.starts_with("config file vgpu.yaml"),
            "{e}"
        );
        let e = parse("defaults:\n  gpucores: 120\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config file vgpu.yaml: defaults.gpucores 120 is out of range 0-100"
        );
        let e = parse("resourceNames:\n  gpumem: nvidia.com/gpu\n")
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "config file vgpu.yaml: resourceNames: nvidia.com/gpu is used twice"
        );
        let e = ConfigFile::load(Path::new("/nonexistent/vgpu.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot read config file /nonexistent/vgpu.yaml"),
            "{e}"
        );
    }
}
