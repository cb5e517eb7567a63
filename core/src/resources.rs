//! The extended-resource names a pod uses to ask for a vGPU slice, and the defaults applied when a
//! pod leaves some of them out.
//!
//! The names default to HAMi's, so pods written for HAMi run unchanged; a cluster that already uses
//! these names for something else can rename them in the webhook's configuration file.

use serde::{Deserialize, Serialize};

/// Which resource names mean what. Deserialises from the `resourceNames` section of the config file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ResourceNames {
    /// Number of vGPUs (each on a different physical GPU). Default `nvidia.com/gpu`.
    pub gpu: String,
    /// Device memory per vGPU, in MiB. Default `nvidia.com/gpumem`.
    pub gpumem: String,
    /// Device memory per vGPU as a percentage (1–100) of the card it lands on.
    /// Default `nvidia.com/gpumem-percentage`.
    pub gpumem_percentage: String,
    /// Share of the card's streaming multiprocessors per vGPU, 0–100 (0 = unlimited).
    /// Default `nvidia.com/gpucores`.
    pub gpucores: String,
}

impl Default for ResourceNames {
    fn default() -> Self {
        Self {
            gpu: "nvidia.com/gpu".into(),
            gpumem: "nvidia.com/gpumem".into(),
            gpumem_percentage: "nvidia.com/gpumem-percentage".into(),
            gpucores: "nvidia.com/gpucores".into(),
        }
    }
}

impl ResourceNames {
    /// All four names, in a fixed order (gpu, gpumem, gpumem-percentage, gpucores).
    pub fn all(&self) -> [&str; 4] {
        [
            &self.gpu,
            &self.gpumem,
            &self.gpumem_percentage,
            &self.gpucores,
        ]
    }

    /// Whether `name` is one of the vGPU resources.
    pub fn is_vgpu(&self, name: &str) -> bool {
        self.all().contains(&name)
    }
}

/// Values filled in for resources a vGPU container leaves out. Deserialises from `defaults`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Defaults {
    /// vGPUs when only gpumem, gpumem-percentage or gpucores is given. Default 1.
    pub gpu: u32,
    /// Memory percentage when neither gpumem nor gpumem-percentage is given. Default 100 (whole card).
    pub gpumem_percentage: u32,
    /// Core percentage when gpucores is not given. Default 0, which means unlimited.
    pub gpucores: u32,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            gpu: 1,
            gpumem_percentage: 100,
            gpucores: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_hami_compatible() {
        let names = ResourceNames::default();
        assert_eq!(
            names.all(),
            [
                "nvidia.com/gpu",
                "nvidia.com/gpumem",
                "nvidia.com/gpumem-percentage",
                "nvidia.com/gpucores"
            ]
        );
        assert!(names.is_vgpu("nvidia.com/gpucores"));
        assert!(!names.is_vgpu("cpu"));
        assert_eq!(
            Defaults::default(),
            Defaults {
                gpu: 1,
                gpumem_percentage: 100,
                gpucores: 0
            }
        );
    }

    #[test]
    fn partial_config_keeps_other_defaults() {
        let names: ResourceNames = serde_json::from_str(r#"{"gpu":"example.com/vgpu"}"#).unwrap();
        assert_eq!(names.gpu, "example.com/vgpu");
        assert_eq!(names.gpumem, "nvidia.com/gpumem");
        let err = serde_json::from_str::<ResourceNames>(r#"{"gpus":"x"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `gpus`"), "{err}");
    }
}
