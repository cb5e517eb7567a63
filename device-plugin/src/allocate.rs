//! What Allocate answers for one container: environment and mounts, built from the scheduler's
//! assignment. Pure: no I/O (the caller creates the container's host directory).

use crate::api;
use std::path::{Path, PathBuf};
use vgpu_core::assignment::ContainerAssignment;
use vgpu_core::env;

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

/// The limits file for an answer: the same limits as its environment, in the file format.
pub fn limits_contents(response: &api::ContainerAllocateResponse) -> String {
    vgpu_core::limits_file::format(response.envs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

fn mounts(host_dir: &Path, cache_dir: Option<&Path>) -> Vec<api::Mount> {
    let mut m = vec![
        api::Mount {
            container_path: CONTAINER_LIB.into(),
            host_path: host_dir.join(LIB_NAME).display().to_string(),
            read_only: true,
        },
        api::Mount {
            container_path: "/etc/ld.so.preload".into(),
            host_path: host_dir.join(PRELOAD_NAME).display().to_string(),
            read_only: true,
        },
    ];
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
/// and SM limit per visible device, the accounting file, and the mounts.
pub fn assigned(
    host_dir: &Path,
    pod_uid: &str,
    container: &ContainerAssignment,
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
    envs.insert(
        env::SHARED_CACHE.to_string(),
        env::DEFAULT_SHARED_CACHE.to_string(),
    );
    let dir = container_dir(host_dir, pod_uid, &container.name);
    let mut mounts = mounts(host_dir, Some(&dir));
    mounts.push(api::Mount {
        container_path: CONTAINER_LIMITS.into(),
        host_path: limits_path(host_dir, pod_uid, &container.name)
            .display()
            .to_string(),
        read_only: true,
    });
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
        mounts: mounts(host_dir, None),
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
        let r = assigned(Path::new("/h"), "uid1", &c);
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], "GPU-a,GPU-b");
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "4096m");
        assert_eq!(r.envs["CUDA_DEVICE_MEMORY_LIMIT_1"], "2048m");
        assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_0"], "30");
        assert_eq!(r.envs["CUDA_DEVICE_SM_LIMIT_1"], "0");
        assert_eq!(
            r.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"],
            "/tmp/vgpu/vgpu.cache"
        );
        assert_eq!(r.mounts.len(), 4);
        assert_eq!(r.mounts[0].host_path, "/h/libvgpu.so");
        assert!(r.mounts[0].read_only && r.mounts[1].read_only);
        assert_eq!(r.mounts[1].container_path, "/etc/ld.so.preload");
        assert_eq!(r.mounts[2].host_path, "/h/containers/uid1_main");
        assert!(!r.mounts[2].read_only);
        // The limits file sits next to the library, read-only, and says what the env says.
        assert_eq!(r.mounts[3].container_path, "/usr/local/vgpu/limits.env");
        assert_eq!(r.mounts[3].host_path, "/h/limits/uid1_main.env");
        assert!(r.mounts[3].read_only);
        let file = vgpu_core::limits_file::parse(&limits_contents(&r)).unwrap_or_default();
        let envs: std::collections::BTreeMap<String, String> = r.envs.clone().into_iter().collect();
        assert_eq!(file, envs);
    }

    #[test]
    fn unscheduled_has_no_limits() {
        let r = unscheduled(Path::new("/h"), &["GPU-a".into()]);
        assert_eq!(r.envs.len(), 1);
        assert_eq!(r.mounts.len(), 2);
    }
}
