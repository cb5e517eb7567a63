//! What Allocate answers for one container: environment and mounts, built from the scheduler's
//! assignment. Pure: no I/O (the caller creates the container's host directory).

use crate::api;
use crate::pods::ContainerSettings;
use std::path::{Path, PathBuf};
use vgpu_core::assignment::ContainerAssignment;
use vgpu_core::env::{self, CorePolicy};

/// Where the preload library appears inside a container.
pub const CONTAINER_LIB: &str = "/usr/local/vgpu/libvgpu.so";
/// The library's file name in the host directory.
pub const LIB_NAME: &str = "libvgpu.so";
/// The preload list's file name in the host directory (mounted at `/etc/ld.so.preload`).
pub const PRELOAD_NAME: &str = "ld.so.preload";
/// Where the container's accounting directory appears inside it (the hook's default cache dir).
pub const CONTAINER_CACHE_DIR: &str = "/tmp/vgpu";
/// Host-directory subfolder with one accounting directory per container.
pub const CONTAINERS_DIR: &str = "containers";
/// Host-directory subfolder with one limits file per container (`<pod-uid>_<name>.env`).
pub const LIMITS_DIR: &str = "limits";
/// Where the container's limits file appears: next to the hook library, which reads it from there
/// (see `vgpu_core::limits_file` for why the environment alone is not enough).
pub const CONTAINER_LIMITS: &str = "/usr/local/vgpu/limits.env";
/// Host-directory subfolder with one GPU activity file per GPU (`vgpu_core::activity`), named by
/// the GPU's UUID.
pub const GPUS_DIR: &str = "gpus";
/// Where a container's GPU activity files appear: `<this>/<i>` for its device `i`, next to the
/// hook library, which finds them there.
pub const CONTAINER_GPUS: &str = "/usr/local/vgpu/gpus";
/// The visible-devices variable the NVIDIA container runtime reads.
pub const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// Contents of the `ld.so.preload` the plugin writes into the host directory.
pub fn preload_contents() -> String {
    format!("{CONTAINER_LIB}\n")
}

/// The host directory of one container's accounting file: `<host-dir>/containers/<pod-uid>_<name>`.
pub fn container_dir(host_dir: &Path, pod_uid: &str, container: &str) -> PathBuf {
    host_dir
        .join(CONTAINERS_DIR)
        .join(format!("{pod_uid}_{container}"))
}

/// The host path of one container's limits file: `<host-dir>/limits/<pod-uid>_<name>.env`.
pub fn limits_path(host_dir: &Path, pod_uid: &str, container: &str) -> PathBuf {
    host_dir
        .join(LIMITS_DIR)
        .join(format!("{pod_uid}_{container}.env"))
}

/// The host path of a GPU's activity file: `<host-dir>/gpus/<uuid>`.
pub fn activity_path(host_dir: &Path, uuid: &str) -> PathBuf {
    host_dir.join(GPUS_DIR).join(uuid)
}

/// What Allocate decided about a container's runtime beyond its slice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Runtime {
    /// Task priority, 0 high, 1 low.
    pub priority: u8,
    /// When the core limit applies.
    pub core_policy: CorePolicy,
    /// Whether the hook is preloaded (`CUDA_DISABLE_CONTROL` not set; the validating webhook
    /// decides who may set it).
    pub preload: bool,
}

impl Runtime {
    /// The container's settings over the node's core policy; the field and the value when one
    /// cannot be read, or when the pod lifts a limit (`CUDA_DISABLE_CONTROL`, or a core policy
    /// other than `force`) and its namespace is not `lift_allowed` (the validating webhook
    /// refuses such pods; this holds where it did not run, a pod admitted before an upgrade).
    pub fn decide(
        s: &ContainerSettings,
        node_policy: CorePolicy,
        lift_allowed: bool,
    ) -> Result<Runtime, String> {
        let priority = match &s.priority {
            None => env::DEFAULT_PRIORITY,
            Some(v) => env::parse_priority(v)
                .map_err(|e| format!("resource {}: {e}", env::TASK_PRIORITY_RESOURCE))?,
        };
        let core_policy = match &s.core_policy {
            None => node_policy,
            Some(v) => {
                CorePolicy::parse(v).map_err(|e| format!("env {}: {e}", env::CORE_POLICY))?
            }
        };
        let own_policy = s.core_policy.is_some().then_some(core_policy);
        if let (false, Some(lift)) = (lift_allowed, env::lift(s.disable_control, own_policy)) {
            let what = match lift {
                env::Lift::DisableControl => format!("{}=true", env::DISABLE_CONTROL),
                env::Lift::CorePolicy(p) => format!("{}={}", env::CORE_POLICY, p.as_str()),
            };
            return Err(format!(
                "{what} lifts a vGPU limit, and the pod's namespace is not in --disable-control-namespaces"
            ));
        }
        Ok(Runtime {
            priority,
            core_policy,
            preload: !s.disable_control,
        })
    }
}

impl Default for Runtime {
    fn default() -> Self {
        Runtime {
            priority: env::DEFAULT_PRIORITY,
            core_policy: CorePolicy::default(),
            preload: true,
        }
    }
}

/// The limits file for an answer: the same limits as its environment, in the file format.
pub fn limits_contents(response: &api::ContainerAllocateResponse) -> String {
    vgpu_core::limits_file::format(response.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

fn mounts(host_dir: &Path, cache_dir: Option<&Path>, preload: bool) -> Vec<api::Mount> {
    let mut m = vec![api::Mount {
        container_path: CONTAINER_LIB.into(),
        host_path: host_dir.join(LIB_NAME).display().to_string(),
        read_only: true,
    }];
    if preload {
        m.push(api::Mount {
            container_path: "/etc/ld.so.preload".into(),
            host_path: host_dir.join(PRELOAD_NAME).display().to_string(),
            read_only: true,
        });
    }
    if let Some(dir) = cache_dir {
        m.push(api::Mount {
            container_path: CONTAINER_CACHE_DIR.into(),
            host_path: dir.display().to_string(),
            read_only: false,
        });
    }
    m
}

/// The answer for a container the scheduler assigned: visible devices in assignment order, a memory
/// and SM limit per visible device, the task priority and core policy, the accounting file, each
/// GPU's activity file, and the mounts (without the preload list when `runtime.preload` is off:
/// HAMi's `CUDA_DISABLE_CONTROL`, `pkg/device-plugin/nvidiadevice/plugin/server.go`).
pub fn assigned(
    host_dir: &Path,
    pod_uid: &str,
    container: &ContainerAssignment,
    runtime: &Runtime,
) -> api::ContainerAllocateResponse {
    let mut envs = std::collections::HashMap::new();
    let uuids: Vec<&str> = container.devices.iter().map(|d| d.uuid.as_str()).collect();
    envs.insert(VISIBLE_DEVICES.to_string(), uuids.join(","));
    for (i, d) in container.devices.iter().enumerate() {
        envs.insert(
            env::memory_limit_for(i),
            env::format_memory_mib(d.memory_mib),
        );
        envs.insert(env::sm_limit_for(i), d.cores.to_string());
    }
    // The unsuffixed pair in the webhook's form, when it holds for every device: the pod's own
    // `env` (where the webhook wrote the same pair) comes after these in the container, and the
    // hook compares the environment with the limits file, so the two must say the same.
    let common = |of: fn(&vgpu_core::assignment::DeviceSlice) -> u64| {
        let first = of(container.devices.first()?);
        container
            .devices
            .iter()
            .all(|d| of(d) == first)
            .then_some(first)
    };
    let memory = common(|d| d.memory_mib);
    let cores = common(|d| u64::from(d.cores)).and_then(|c| u32::try_from(c).ok());
    for (name, value) in env::container_limits(memory, cores) {
        envs.insert(name.to_string(), value);
    }
    envs.insert(
        env::SHARED_CACHE.to_string(),
        env::DEFAULT_SHARED_CACHE.to_string(),
    );
    // Written only when they differ from the hook's defaults, so that a hook rolled back to a
    // version without them (it refuses names it does not know in the limits file) still starts
    // the containers that do not use them.
    if runtime.priority != env::DEFAULT_PRIORITY {
        envs.insert(env::TASK_PRIORITY.to_string(), runtime.priority.to_string());
    }
    if runtime.core_policy != CorePolicy::default() {
        envs.insert(
            env::CORE_POLICY.to_string(),
            runtime.core_policy.as_str().to_string(),
        );
    }
    let dir = container_dir(host_dir, pod_uid, &container.name);
    let mut mounts = mounts(host_dir, Some(&dir), runtime.preload);
    mounts.push(api::Mount {
        container_path: CONTAINER_LIMITS.into(),
        host_path: limits_path(host_dir, pod_uid, &container.name)
            .display()
            .to_string(),
        read_only: true,
    });
    for (i, d) in container.devices.iter().enumerate() {
        mounts.push(api::Mount {
            container_path: format!("{CONTAINER_GPUS}/{i}"),
            host_path: activity_path(host_dir, &d.uuid).display().to_string(),
            read_only: false,
        });
    }
    api::ContainerAllocateResponse {
        envs,
        mounts,
        ..Default::default()
    }
}

/// The answer under `--allow-unscheduled` for a container without an assignment: the requested
/// GPUs whole, no limits, no accounting file.
pub fn unscheduled(host_dir: &Path, uuids: &[String]) -> api::ContainerAllocateResponse {
    let mut envs = std::collections::HashMap::new();
    envs.insert(VISIBLE_DEVICES.to_string(), uuids.join(","));
    api::ContainerAllocateResponse {
        envs,
        mounts: mounts(host_dir, None, true),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_core::assignment::DeviceSlice;

    #[test]
    fn two_gpu_answer() {
        let c = ContainerAssignment {
            name: "main".into(),
            devices: vec![
                DeviceSlice {
                    uuid: "GPU-a".into(),
                    memory_mib: 4096,
                    cores: 30,
                    exclusive: false,
                },
                DeviceSlice {
                    uuid: "GPU-b".into(),
                    memory_mib: 2048,
                    cores: 0,
                    exclusive: false,
                },
            ],
        };
        let r = assigned(Path::new("/h"), "uid1", &c, &Runtime::default());
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "2048m");
        assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_0"], "30");
        assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_1"], "0");
        // The two GPUs' slices differ, so there is no unsuffixed limit for all of them.
        assert!(!r.envs.contains_key("CUDA_DEVICE_MEMORY_LIMIT"));
        assert!(!r.envs.contains_key("CUDA_DEVICE_SM_LIMIT"));
        assert_eq!(
            r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
            "/tmp/vgpu/vgpu.cache"
        );
        assert_eq!(r.mounts.len(), 6);
        assert_eq!(r.mounts[0].host_path, "/h/libvgpu.so");
        assert!(r.mounts[0].read_only && r.mounts[1].read_only);
        assert_eq!(r.mounts[1].container_path, "/etc/ld.so.preload");
        assert_eq!(r.mounts[2].host_path, "/h/containers/uid1_main");
        assert!(!r.mounts[2].read_only);
        // The limits file sits next to the library, read-only, and says what the env says.
        assert_eq!(r.mounts[3].container_path, "/usr/local/vgpu/limits.env");
        assert_eq!(r.mounts[3].host_path, "/h/limits/uid1_main.env");
        assert!(r.mounts[3].read_only);
        // Each GPU's activity file, read-write, by device index.
        assert_eq!(r.mounts[5].container_path, "/usr/local/vgpu/gpus/1");
        assert_eq!(r.mounts[5].host_path, "/h/gpus/GPU-b");
        assert!(!r.mounts[5].read_only);
        // The defaults are left out (a rolled-back hook refuses names it does not know).
        assert!(!r.envs.contains_key("CUDA_TASK_PRIORITY"));
        assert!(!r.envs.contains_key("GPU_CORE_UTILIZATION_POLICY"));
        let file = vgpu_core::limits_file::parse(&limits_contents(&r)).unwrap_or_default();
        let envs: std::collections::BTreeMap<String, String> = r.envs.clone().into_iter().collect();
        assert_eq!(file, envs);
    }

    #[test]
    fn equal_slices_get_the_webhooks_pair_too() {
        let slice = |uuid: &str| DeviceSlice {
            uuid: uuid.into(),
            memory_mib: 3000,
            cores: 30,
            exclusive: false,
        };
        let c = ContainerAssignment {
            name: "main".into(),
            devices: vec![slice("GPU-a"), slice("GPU-b")],
        };
        let r = assigned(Path::new("/h"), "uid1", &c, &Runtime::default());
        // The names and the form the webhook writes into the pod's env (vgpu_core::env::container_limits).
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT"], "3000m");
        assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT"], "30");
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "3000m");
        let file = vgpu_core::limits_file::parse(&limits_contents(&r)).unwrap_or_default();
        assert_eq!(file["CUDA_DEVICE_MEMORY_LIMIT"], "3000m");
    }

    #[test]
    fn hami_settings_decide_priority_policy_and_preload() {
        let s = |priority: Option<&str>, policy: Option<&str>, disable: bool| ContainerSettings {
            priority: priority.map(String::from),
            core_policy: policy.map(String::from),
            disable_control: disable,
        };
        let decide = Runtime::decide;
        let r = decide(&s(Some("0"), None, false), CorePolicy::Default, false).unwrap();
        assert_eq!(
            (r.priority, r.core_policy, r.preload),
            (0, CorePolicy::Default, true)
        );
        let r = decide(&s(None, Some("DISABLE"), true), CorePolicy::Force, true).unwrap();
        assert_eq!(
            (r.priority, r.core_policy, r.preload),
            (1, CorePolicy::Disable, false)
        );
        assert_eq!(
            decide(&s(Some("2"), None, false), CorePolicy::Force, true).unwrap_err(),
            "resource nvidia.com/priority: \"2\" is not a task priority (0 high, 1 low)"
        );
        assert_eq!(
            decide(&s(None, Some("off"), false), CorePolicy::Force, true).unwrap_err(),
            "env GPU_CORE_UTILIZATION_POLICY: \"off\" is not one of default, force, disable"
        );
        // Outside the allowed namespaces a pod may not lift a limit, whatever admitted it; the
        // node's own policy and `force` are fine.
        assert_eq!(
            decide(&s(None, None, true), CorePolicy::Force, false).unwrap_err(),
            "CUDA_DISABLE_CONTROL=true lifts a vGPU limit, and the pod's namespace is not in --disable-control-namespaces"
        );
        assert!(decide(&s(None, Some("default"), false), CorePolicy::Force, false).is_err());
        assert!(decide(&s(None, Some("force"), false), CorePolicy::Default, false).is_ok());
        assert!(decide(&s(None, None, false), CorePolicy::Default, false).is_ok());
        let c = ContainerAssignment {
            name: "main".into(),
            devices: vec![],
        };
        let off = Runtime {
            preload: false,
            ..Runtime::default()
        };
        let r = assigned(Path::new("/h"), "uid1", &c, &off);
        assert!(r
            .mounts
            .iter()
            .all(|m| m.container_path != "/etc/ld.so.preload"));
        assert!(r
            .mounts
            .iter()
            .any(|m| m.container_path == "/usr/local/vgpu/limits.env"));
    }

    #[test]
    fn unscheduled_has_no_limits() {
        let r = unscheduled(Path::new("/h"), &["GPU-a".into()]);
        assert_eq!(r.envs.len(), 1);
        assert_eq!(r.mounts.len(), 2);
    }
}
