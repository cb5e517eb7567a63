//! The limits of this container, read from the environment contract in `vgpu_core::env`, or from
//! the device plugin's read-only limits file (`vgpu_core::limits_file`) when it is there.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use thiserror::Error;
use vgpu_core::accounting::MAX_DEVICES;
use vgpu_core::env::{self, CorePolicy, EnvValueError};
use vgpu_core::limits_file::{self, LimitsFileError};

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

/// Why the configuration cannot be read: the hook prints this and fails closed.
#[derive(Debug, Error)]
pub enum LoadError {
    /// A variable (from the environment or the limits file) has a bad value.
    #[error(transparent)]
    Value(#[from] ConfigError),
    /// The limits file exists but cannot be read.
    #[error("vgpu: limits file {path}: {source}; refusing CUDA")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The limits file is damaged.
    #[error("vgpu: limits file {path}: {source}; refusing CUDA")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: LimitsFileError,
    },
}

/// Where the configuration came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The environment only (no limits file: outside Kubernetes, or `--allow-unscheduled`).
    Environment,
    /// The limits file; the environment was not read for limits. `overridden` lists the reserved
    /// variables the environment set to something else, or that the file does not have (what a
    /// pod's `envFrom` or a shell's `export` could try): the webhook and the device plugin write
    /// the same names in the same form, so in a container vgpu set up the list is empty.
    LimitsFile {
        /// `NAME=value` pairs of the environment that the file overrode.
        overridden: Vec<String>,
    },
}

/// Reads the configuration: from the limits file at `file` when it exists (the environment then
/// only supplies `CUDA_VISIBLE_DEVICES`, which is the program's own choice), else from `get_env`.
pub fn load(
    get_env: impl Fn(&str) -> Option<String>,
    file: Option<&Path>,
) -> Result<(Config, Source), LoadError> {
    let text = match file.map(std::fs::read_to_string) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Some(Err(source)) => {
            return Err(LoadError::Read {
                path: file.map(Path::to_path_buf).unwrap_or_default(),
                source,
            })
        }
    };
    let Some(text) = text else {
        return Ok((Config::from_vars(get_env)?, Source::Environment));
    };
    let path = file.map(Path::to_path_buf).unwrap_or_default();
    let vars: BTreeMap<String, String> =
        limits_file::parse(&text).map_err(|source| LoadError::Parse { path, source })?;
    let get = |k: &str| {
        if limits_file::is_allowed(k) {
            vars.get(k).cloned()
        } else {
            get_env(k)
        }
    };
    let mut config = Config::from_vars(get)?;
    config.cache_path = under_root(file.unwrap_or(Path::new("/")), &config.cache_path);
    let mut names = vec![
        env::MEMORY_LIMIT.to_string(),
        env::SM_LIMIT.to_string(),
        env::SHARED_CACHE.to_string(),
    ];
    for i in 0..MAX_DEVICES {
        names.push(env::memory_limit_for(i));
        names.push(env::sm_limit_for(i));
    }
    let mut overridden: Vec<String> = names
        .iter()
        .filter_map(|k| {
            let v = get_env(k)?;
            let agrees = vars.get(k).is_some_and(|f| env::same_value(k, f, &v));
            (!agrees).then(|| format!("{k}={v}"))
        })
        .collect();
    overridden.sort();
    Ok((config, Source::LimitsFile { overridden }))
}

/// The container path `path` seen from where the limits file `file` is: the file lives in the hook's
/// directory, `<root>/usr/local/vgpu/`, and `<root>` is `/` in a container. Anywhere else (a test's
/// copy of a container tree) the file's absolute paths are taken inside that tree, as the
/// container would see them.
fn under_root(file: &Path, path: &Path) -> PathBuf {
    let lib_dir = file.parent().unwrap_or(Path::new("/"));
    let root = lib_dir
        .ends_with("usr/local/vgpu")
        .then(|| lib_dir.ancestors().nth(3))
        .flatten();
    match (root, path.strip_prefix("/")) {
        (Some(root), Ok(rel)) => root.join(rel),
        _ => path.to_path_buf(),
    }
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
    /// Task priority: 0 high, 1 low (`CUDA_TASK_PRIORITY`, default 1).
    pub priority: u8,
    /// When the SM limit applies (`GPU_CORE_UTILIZATION_POLICY`, default `force`).
    pub core_policy: CorePolicy,
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
        let priority = match get(env::TASK_PRIORITY) {
            None => env::DEFAULT_PRIORITY,
            Some(v) => env::parse_priority(&v).map_err(|e| bad(env::TASK_PRIORITY, v, e))?,
        };
        let core_policy = match get(env::CORE_POLICY) {
            None => CorePolicy::default(),
            Some(v) => CorePolicy::parse(&v).map_err(|e| bad(env::CORE_POLICY, v, e))?,
        };
        Ok(Config {
            memory_limit,
            sm_limit,
            cache_path,
            ordinal_map,
            priority,
            core_policy,
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
    fn a_container_vgpu_set_up_has_nothing_overridden() {
        let dir = std::env::temp_dir().join(format!("vgpu-agree-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(limits_file::FILE_NAME);
        // The device plugin's answer: per-device limits and the webhook's pair, in one form.
        let plugin = [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "3000m"),
            ("CUDA_DEVICE_SM_LIMIT_0", "30"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "3000m"),
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/vgpu.cache"),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-a"),
        ];
        std::fs::write(&file, limits_file::format(plugin)).unwrap();
        // The container's environment: the plugin's variables, then the pod's env (the webhook's
        // pair) over them, as the kubelet orders them.
        let mut env: HashMap<&str, &str> = plugin.into_iter().collect();
        env.insert("CUDA_DEVICE_MEMORY_LIMIT", "3000m");
        env.insert("CUDA_DEVICE_SM_LIMIT", "30");
        let get = |k: &str| env.get(k).map(|v| v.to_string());
        let (_, source) = load(get, Some(&file)).unwrap();
        assert_eq!(source, Source::LimitsFile { overridden: vec![] });
        // The same size in another spelling is the same limit.
        env.insert("CUDA_DEVICE_MEMORY_LIMIT_0", "3145728000");
        let get = |k: &str| env.get(k).map(|v| v.to_string());
        let (_, source) = load(get, Some(&file)).unwrap();
        assert_eq!(source, Source::LimitsFile { overridden: vec![] });
        // A different one is named.
        env.insert("CUDA_DEVICE_SM_LIMIT", "100");
        let get = |k: &str| env.get(k).map(|v| v.to_string());
        let (_, source) = load(get, Some(&file)).unwrap();
        assert_eq!(
            source,
            Source::LimitsFile {
                overridden: vec!["CUDA_DEVICE_SM_LIMIT=100".into()]
            }
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_limits_file_wins_over_the_environment_and_names_what_it_overrode() {
        let dir = std::env::temp_dir().join(format!("vgpu-limits-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join(limits_file::FILE_NAME);
        std::fs::write(
            &file,
            limits_file::format([
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
                ("CUDA_DEVICE_SM_LIMIT_0", "20"),
                ("NVIDIA_VISIBLE_DEVICES", "GPU-a"),
            ]),
        )
        .unwrap();
        // What a ConfigMap behind envFrom could set: a bigger limit, a second device, no SM cap.
        let env: HashMap<&str, &str> = [
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "80g"),
            ("CUDA_DEVICE_MEMORY_LIMIT", "80g"),
            ("CUDA_DEVICE_SM_LIMIT_0", "20"),
            ("NVIDIA_VISIBLE_DEVICES", "GPU-b,GPU-a"),
            ("CUDA_VISIBLE_DEVICES", "GPU-a"),
        ]
        .into_iter()
        .collect();
        let get = |k: &str| env.get(k).map(|v| v.to_string());
        let (c, source) = load(get, Some(&file)).unwrap();
        assert_eq!(c.memory_limit[0], Some(1 << 30));
        assert_eq!(c.memory_limit[1], None, "the unsuffixed 80g must not apply");
        assert_eq!(c.sm_limit[0], 20);
        // CUDA_VISIBLE_DEVICES is the program's; the UUIDs come from the file.
        assert_eq!(c.ordinal_map, vec![0]);
        assert_eq!(
            source,
            Source::LimitsFile {
                overridden: vec![
                    "CUDA_DEVICE_MEMORY_LIMIT=80g".into(),
                    "CUDA_DEVICE_MEMORY_LIMIT_0=80g".into()
                ]
            }
        );

        // No file: the environment, as outside Kubernetes.
        let (c, source) = load(get, Some(&dir.join("absent"))).unwrap();
        assert_eq!(
            (c.memory_limit[0], source),
            (Some(80 << 30), Source::Environment)
        );

        // A damaged file, or one that cannot be read, fails closed naming the file.
        std::fs::write(&file, "CUDA_DEVICE_MEMORY_LIMIT_0=1g\nnonsense\n").unwrap();
        let e = load(get, Some(&file)).unwrap_err().to_string();
        assert!(e.contains("limits.env") && e.contains("line 2"), "{e}");
        std::fs::write(&file, "CUDA_DEVICE_MEMORY_LIMIT_0=lots\n").unwrap();
        let e = load(get, Some(&file)).unwrap_err().to_string();
        assert!(e.contains("CUDA_DEVICE_MEMORY_LIMIT_0"), "{e}");
        let e = load(get, Some(&dir)).unwrap_err().to_string();
        assert!(e.contains("limits file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn file_paths_are_taken_inside_the_tree_the_library_sits_in() {
        let p = |f: &str, c: &str| under_root(Path::new(f), Path::new(c));
        assert_eq!(
            p("/usr/local/vgpu/limits.env", "/tmp/vgpu/vgpu.cache"),
            PathBuf::from("/tmp/vgpu/vgpu.cache")
        );
        assert_eq!(
            p("/t/ctr/usr/local/vgpu/limits.env", "/tmp/vgpu/vgpu.cache"),
            PathBuf::from("/t/ctr/tmp/vgpu/vgpu.cache")
        );
        assert_eq!(
            p("/t/lib/limits.env", "/tmp/vgpu/vgpu.cache"),
            PathBuf::from("/tmp/vgpu/vgpu.cache")
        );
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
