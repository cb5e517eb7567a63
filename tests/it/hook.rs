//! The runtime hook under `LD_PRELOAD`, driving the fake `libcuda.so.1` from a C program through the
//! three ways applications reach the driver: linked symbols, `cuGetProcAddress_v2`, `dlopen`+`dlsym`.

use std::path::PathBuf;
use std::process::Command;
use vgpu_core::accounting::Snapshot;

/// Held by the tests that measure rates and by the CPU-heavy stress test, so the stress test's 64
/// threads do not starve the rate measurements of CPU (the other tests run in parallel).
static TIMING: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn timing() -> std::sync::MutexGuard<'static, ()> {
    TIMING.lock().unwrap_or_else(|p| p.into_inner())
}

struct Env {
    dir: tempfile::TempDir,
    probe: PathBuf,
    hook: PathBuf,
}

fn setup() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let fake = vgpu_tests::cdylib("fake_cuda");
    let hook = vgpu_tests::cdylib("vgpu");
    std::fs::copy(&fake, dir.path().join("libcuda.so.1")).unwrap();
    std::fs::copy(
        vgpu_tests::cdylib("fake_nvml"),
        dir.path().join("libnvidia-ml.so.1"),
    )
    .unwrap();
    std::os::unix::fs::symlink("libcuda.so.1", dir.path().join("libcuda.so")).unwrap();
    std::os::unix::fs::symlink("libnvidia-ml.so.1", dir.path().join("libnvidia-ml.so")).unwrap();
    let probe = dir.path().join("probe");
    let src = vgpu_tests::repo_root().join("tests/hook/probe.c");
    let out = Command::new("cc")
        .arg("-o")
        .arg(&probe)
        .arg(&src)
        .arg("-L")
        .arg(dir.path())
        .args(["-lcuda", "-lnvidia-ml", "-ldl", "-lpthread"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Env { dir, probe, hook }
}

impl Env {
    fn cache(&self) -> PathBuf {
        self.dir.path().join("acct/vgpu.cache")
    }

    /// Runs the probe under the hook with `vars`; returns (stdout lines, stderr).
    fn run(&self, vars: &[(&str, &str)], args: &[&str]) -> (Vec<String>, String) {
        let mut cmd = Command::new(&self.probe);
        cmd.args(args)
            .env_clear()
            .env("LD_LIBRARY_PATH", self.dir.path())
            .env("LD_PRELOAD", &self.hook)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.cache());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(
            out.status.success(),
            "probe {args:?} failed\n{stdout}\n{stderr}"
        );
        (stdout.lines().map(String::from).collect(), stderr)
    }

    fn command(&self, vars: &[(&str, &str)], args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.probe);
        cmd.args(args)
            .env_clear()
            .env("LD_LIBRARY_PATH", self.dir.path())
            .env("LD_PRELOAD", &self.hook)
            .env("CUDA_DEVICE_MEMORY_SHARED_CACHE", self.cache())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        for (k, v) in vars {
            cmd.env(k, v);
        }
        cmd
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot::parse(&std::fs::read(self.cache()).unwrap()).unwrap()
    }
}

fn gib(n: u64) -> String {
    format!("{}", n << 30)
}

/// Limit 1 GiB: 1023 MiB succeeds, 2 MiB more is refused without the driver, 1 MiB fits exactly;
/// cuMemGetInfo and cuDeviceTotalMem report the slice; the accounting file meters it all.
#[test]
fn memory_cap_exact_and_reported_on_every_lookup_path() {
    for mode in ["direct", "procaddr", "dlsym"] {
        let env = setup();
        let (out, _) = env.run(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
                ("FAKE_CUDA_DEVICE_MEMORY", "16g"),
            ],
            &[
                mode,
                "init",
                "ctx:0",
                "total:0",
                "alloc:1023m",
                "alloc:2m",
                "alloc:1m",
                "info",
                "alloc:1",
                "free:0",
                "info",
                "launch:5",
                "count",
            ],
        );
        let want = [
            "init = 0".to_string(),
            "ctx = 0".into(),
            format!("total = 0 bytes {}", gib(1)),
            format!("alloc {} = 0", 1023u64 << 20),
            format!("alloc {} = 2", 2u64 << 20),
            format!("alloc {} = 0", 1u64 << 20),
            format!("info = 0 free 0 total {}", gib(1)),
            "alloc 1 = 2".into(),
            "free = 0".into(),
            format!("info = 0 free {} total {}", 1023u64 << 20, gib(1)),
            "launch ok 5".into(),
            "driver launches 5".into(),
        ];
        assert_eq!(out, want, "mode {mode}");
        let snap = env.snapshot();
        assert_eq!(snap.memory_limit[0], 1 << 30);
        assert_eq!(snap.processes.len(), 1, "{snap:?}");
        let p = &snap.processes[0];
        assert_eq!(p.launches, 5, "mode {mode}");
        assert_eq!(p.oom_refusals, 2, "mode {mode}");
        assert_eq!(p.used[0], 1 << 20, "mode {mode}");
        assert_eq!(p.peak[0], 1 << 30, "mode {mode}");
    }
}

/// Stream-ordered allocation is capped too, including the per-thread-default-stream (`_ptsz`)
/// entry that cuGetProcAddress hands out for flag 2.
#[test]
fn async_allocations_are_capped_on_every_lookup_path() {
    for mode in ["direct", "procaddr", "dlsym"] {
        let env = setup();
        let (out, _) = env.run(
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
            &[
                mode,
                "init",
                "ctx:0",
                "async:1023m",
                "async:2m",
                "free:0",
                "async:2m",
                "info",
            ],
        );
        assert_eq!(
            out,
            [
                "init = 0".to_string(),
                "ctx = 0".into(),
                format!("async {} = 0", 1023u64 << 20),
                format!("async {} = 2", 2u64 << 20),
                "free = 0".into(),
                format!("async {} = 0", 2u64 << 20),
                // The freed 1023 MiB went back to the device's memory pool, which holds it until
                // a synchronisation (none here), as the driver's pool does: the 2 MiB come out of
                // it, and the slice still counts the pool's 1023 MiB.
                format!("info = 0 free {} total {}", 1u64 << 20, gib(1)),
            ],
            "mode {mode}"
        );
    }
}

/// Per-device limits win over the global one; without a limit the real values pass through.
#[test]
fn per_device_limits() {
    let env = setup();
    let (out, _) = env.run(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT", "2g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "512m"),
            ("FAKE_CUDA_DEVICE_MEMORY", "8g,8g"),
        ],
        &[
            "direct",
            "init",
            "total:0",
            "total:1",
            "ctx:1",
            "alloc:512m",
            "alloc:1",
            "ctx:0",
            "alloc:1024m",
            "info",
        ],
    );
    assert_eq!(
        out,
        [
            "init = 0".to_string(),
            format!("total = 0 bytes {}", gib(2)),
            format!("total = 0 bytes {}", 512u64 << 20),
            "ctx = 0".into(),
            format!("alloc {} = 0", 512u64 << 20),
            "alloc 1 = 2".into(),
            "ctx = 0".into(),
            format!("alloc {} = 0", gib(1)),
            format!("info = 0 free {} total {}", gib(1), gib(2)),
        ]
    );
    let env = setup();
    let (out, _) = env.run(
        &[("FAKE_CUDA_DEVICE_MEMORY", "8g")],
        &["direct", "init", "total:0"],
    );
    assert_eq!(out[1], format!("total = 0 bytes {}", gib(8)));
}

/// CUDA_VISIBLE_DEVICES inside the container renumbers: CUDA ordinal 0 is container device 1, so
/// limit _1 applies to it.
#[test]
fn visible_devices_pick_the_right_limit() {
    let env = setup();
    let (out, _) = env.run(
        &[
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
            ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
            ("CUDA_VISIBLE_DEVICES", "1"),
            ("FAKE_CUDA_DEVICE_MEMORY", "8g,8g"),
        ],
        &["direct", "init", "total:0"],
    );
    assert_eq!(out[1], format!("total = 0 bytes {}", gib(3)));
}

/// An unreadable limit fails closed: cuInit returns CUDA_ERROR_INVALID_VALUE with one line naming it.
#[test]
fn bad_limit_fails_closed_with_the_variable_named() {
    let env = setup();
    let (out, err) = env.run(
        &[("CUDA_DEVICE_MEMORY_LIMIT", "4gb")],
        &["direct", "init", "alloc:1"],
    );
    assert_eq!(out, ["init = 1", "alloc 1 = 1"]);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("CUDA_DEVICE_MEMORY_LIMIT=\"4gb\""),
        "{err}"
    );
}

/// Two processes share one limit through the file; the memory of a process that exited is reclaimed
/// when another needs it.
#[test]
fn processes_share_one_limit_and_dead_ones_are_reclaimed() {
    let env = setup();
    let vars = [("CUDA_DEVICE_MEMORY_LIMIT", "1g")];
    let (out, _) = env.run(&vars, &["direct", "init", "ctx:0", "alloc:1023m"]);
    assert_eq!(out[2], format!("alloc {} = 0", 1023u64 << 20));
    // The first process is gone; its slot still shows its usage until someone needs the memory.
    assert_eq!(env.snapshot().used(0), 1023 << 20);
    let (out, _) = env.run(&vars, &["direct", "init", "ctx:0", "alloc:1023m", "info"]);
    assert_eq!(out[2], format!("alloc {} = 0", 1023u64 << 20));
    assert_eq!(
        out[3],
        format!("info = 0 free {} total {}", 1u64 << 20, gib(1))
    );
    let snap = env.snapshot();
    assert_eq!(snap.used(0), 1023 << 20);
    assert_eq!(snap.processes.len(), 1);
}

/// SIGKILL storms under the concurrency test: 3 processes x 16 threads allocate and free at random
/// against one 1 GiB limit while 100 more processes of 4 threads each, in 25 waves of 4 running at
/// once beside them (64 allocating threads in all), are SIGKILLed at random points (during start-up, the hook's initialisation, a
/// reservation, a reclaim...). The device-wide peak the fake driver saw never passes the limit, no
/// call of a survivor blocks for a second, the killed processes' slots (and so their usage) are gone
/// from the file within 1 s of the last kill while the survivors still run, and afterwards a new
/// process gets the whole limit.
#[test]
fn sigkill_storms_under_concurrency_never_pass_the_limit() {
    let _serial = timing();
    let env = setup();
    let shared = env.dir.path().join("fake-gpu");
    let shared_s = shared.to_string_lossy().to_string();
    let stop = env.dir.path().join("stop");
    let vars = [
        ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
        ("FAKE_CUDA_DEVICE_MEMORY", "4g"),
        ("FAKE_CUDA_SHARED", shared_s.as_str()),
    ];
    let mut survivors: Vec<_> = (0..3)
        .map(|i| {
            let step = format!("stressuntil:16:{}:{}", stop.display(), i + 1);
            env.command(&vars, &["direct", "init", step.as_str()])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let survivor_pids: Vec<u32> = survivors.iter().map(std::process::Child::id).collect();
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut random = move |n: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % n
    };
    for wave in 0..25 {
        let started = std::time::Instant::now();
        let mut victims: Vec<_> = (0..4)
            .map(|v| {
                let step = format!("stress:4:100000000:{}", wave * 4 + v);
                let child = env
                    .command(&vars, &["direct", "init", step.as_str()])
                    .spawn()
                    .unwrap();
                // Each one's kill point: a random moment 0-15 ms after the wave started.
                (std::time::Duration::from_micros(random(15_000)), child)
            })
            .collect();
        victims.sort_by_key(|v| v.0);
        for (at, child) in &mut victims {
            if let Some(left) = at.checked_sub(started.elapsed()) {
                std::thread::sleep(left);
            }
            child.kill().unwrap();
        }
        for (_, child) in &mut victims {
            child.wait().unwrap();
        }
    }
    let last_kill = std::time::Instant::now();
    let read = || {
        std::fs::read(env.cache())
            .ok()
            .and_then(|b| Snapshot::parse(&b).ok())
    };
    let mut polls = 0u32;
    let snap = vgpu_tests::wait_for(
        std::time::Duration::from_secs(10),
        "the killed processes' slots to be reclaimed",
        || {
            let s = read()?;
            polls += 1;
            if polls.is_multiple_of(200) {
                // Shown if the wait times out: which slots stay, and whether their pid exists (a
                // pid the machine reused for another process keeps its slot, by design).
                let left: Vec<(u32, bool)> = s
                    .processes
                    .iter()
                    .filter(|p| !survivor_pids.contains(&p.pid))
                    .map(|p| {
                        (
                            p.pid,
                            std::path::Path::new(&format!("/proc/{}", p.pid)).exists(),
                        )
                    })
                    .collect();
                eprintln!("slots left (pid, exists): {left:?}");
            }
            (s.processes.len() == survivor_pids.len()
                && s.processes.iter().all(|p| survivor_pids.contains(&p.pid)))
            .then_some(s)
        },
    );
    let took = last_kill.elapsed();
    let alive: Vec<bool> = survivors
        .iter_mut()
        .map(|c| c.try_wait().unwrap().is_none())
        .collect();
    std::fs::write(&stop, b"").unwrap();
    let statuses = vgpu_tests::wait_for(
        std::time::Duration::from_secs(120),
        "the surviving stress processes to finish",
        || {
            let done: Vec<_> = survivors
                .iter_mut()
                .map(|c| c.try_wait().unwrap())
                .collect();
            done.iter().all(Option::is_some).then_some(done)
        },
    );
    for s in statuses.into_iter().flatten() {
        assert!(s.success(), "a survivor failed: {s}");
    }
    assert_eq!(alive, [true; 3], "a survivor ended before the storm did");
    assert!(
        took < std::time::Duration::from_secs(1),
        "killed processes reclaimed {took:?} after the last kill"
    );
    // The killed processes' launches and refusals stay counted (retired), and what is left in use
    // is the survivors' alone, never more than the limit. Not checked on the live sum of the
    // slots: the survivors still run, and the ledger reserves before it checks
    // (runtime-hook/src/ledger.rs), so a slot read mid-storm can hold a reservation about to be
    // refused. The container's peak is raised only by reservations that passed their check.
    assert!(snap.container_peak[0] <= 1 << 30, "{snap:?}");
    assert!(
        snap.oom_refusals() > 0,
        "the storm never reached the limit: {snap:?}"
    );
    // No allocation or free of a survivor blocked for a second, whatever the kills interrupted
    // ("blocked": the call's wall time less the time its thread waited for a CPU, see probe.c's
    // TIMED; with 64 stress threads on a 2-core machine a runnable thread can wait that long).
    for c in &mut survivors {
        let mut out = String::new();
        std::io::Read::read_to_string(&mut c.stdout.take().unwrap(), &mut out).unwrap();
        let worst: f64 = out
            .split_whitespace()
            .skip_while(|w| *w != "worst_ms")
            .nth(1)
            .unwrap_or_else(|| panic!("{out}"))
            .parse()
            .unwrap();
        eprintln!("survivor: {}", out.trim());
        assert!(worst < 1000.0, "a call blocked {worst} ms: {out}");
    }
    let (out, _) = env.run(&vars, &["direct", "init", "ctx:0", "peak:0", "alloc:1023m"]);
    let peak: u64 = out[2]
        .strip_prefix("peak = 0 bytes ")
        .unwrap_or_else(|| panic!("{out:?}"))
        .parse()
        .unwrap();
    assert!(peak <= 1 << 30, "device-wide peak {peak} passed the limit");
    assert!(
        peak > 512 << 20,
        "the stress never came near the limit: {peak}"
    );
    // Everything the killed processes held is reclaimed: a new process gets all but 1 MiB.
    assert_eq!(out[3], format!("alloc {} = 0", 1023u64 << 20));
}

/// Every other allocator, the VMM and array calls, the CUDA 3.1 (v1) ABI and every launch entry
/// (`_ptsz` included) go through the hook on all three lookup paths: nothing bypasses the cap or
/// the launch meter.
#[test]
fn every_allocator_and_launch_entry_is_capped_and_metered() {
    let mib = |n: u64| n << 20;
    for mode in ["direct", "procaddr", "dlsym"] {
        let env = setup();
        let (out, _) = env.run(
            &[("CUDA_DEVICE_MEMORY_LIMIT", "1g")],
            &[
                mode,
                "init",
                "ctx:0",
                "managed:512m",
                "pool:256m",
                "poolp:255m",
                // The fake's pitch for 1000 bytes is 1024: 1 MiB, the limit exactly.
                "pitch:1000:1024",
                "managed:1",
                "free:0",
                "vmm:0:256m",
                // 1024 x 1024 float4: 16 MiB; 64^3 float4: 4 MiB.
                "array:1024:1024",
                "array3d:64:64:64",
                "alloc1:236m",
                "alloc1:1",
                "info",
                "info1",
                "release:0",
                "arrfree:0",
                "arrfree:1",
                "free1:0",
                "info1",
                "vmm:0:513m",
                "launchp:3",
                "coop:3",
                "coopp:3",
                "launchex:3",
                "launchexp:3",
                "graph:3",
                "graphp:3",
                "count",
            ],
        );
        let want = [
            "init = 0".to_string(),
            "ctx = 0".into(),
            format!("managed {} = 0", mib(512)),
            format!("pool {} = 0", mib(256)),
            format!("poolp {} = 0", mib(255)),
            "pitch 1000x1024 = 0 pitch 1024".into(),
            "managed 1 = 2".into(),
            "free = 0".into(),
            format!("vmm 0 {} = 0", mib(256)),
            "array = 0".into(),
            "array3d = 0".into(),
            format!("alloc1 {} = 0", mib(236)),
            "alloc1 1 = 2".into(),
            format!("info = 0 free 0 total {}", gib(1)),
            format!("info1 = 0 free 0 total {}", gib(1)),
            "release = 0".into(),
            "arrfree = 0".into(),
            "arrfree = 0".into(),
            "free1 = 0".into(),
            format!("info1 = 0 free {} total {}", mib(512), gib(1)),
            format!("vmm 0 {} = 2", mib(513)),
            "launchp ok 3".into(),
            "coop ok 3".into(),
            "coopp ok 3".into(),
            "launchex ok 3".into(),
            "launchexp ok 3".into(),
            "graph ok 3".into(),
            "graphp ok 3".into(),
            "driver launches 21".into(),
        ];
        assert_eq!(out, want, "mode {mode}");
        let p = &env.snapshot().processes[0];
        assert_eq!(p.launches, 21, "mode {mode}");
        assert_eq!(p.oom_refusals, 3, "mode {mode}");
        assert_eq!(p.used[0], mib(512), "mode {mode}");
        assert_eq!(p.peak[0], gib(1).parse::<u64>().unwrap(), "mode {mode}");
    }
}

/// Mipmapped arrays are charged the sum of their levels (1024 x 1024 float4, 11 levels: 22369616
/// bytes) and returned when destroyed, on every lookup path.
#[test]
fn mipmapped_arrays_are_capped_by_all_their_levels() {
    for mode in ["direct", "procaddr", "dlsym"] {
        let env = setup();
        let (out, _) = env.run(
            &[("CUDA_DEVICE_MEMORY_LIMIT", "32m")],
            &[
                mode,
                "init",
                "ctx:0",
                "mipmap:1024:1024:11",
                "info",
                "mipmap:1024:1024:11",
                "mipfree:0",
                "info",
                "mipmap:1024:1024:1",
                "info",
            ],
        );
        let total = 32u64 << 20;
        assert_eq!(
            out,
            [
                "init = 0".to_string(),
                "ctx = 0".into(),
                "mipmap = 0".into(),
                format!("info = 0 free {} total {total}", total - 22_369_616),
                "mipmap = 2".into(),
                "mipfree = 0".into(),
                format!("info = 0 free {total} total {total}"),
                "mipmap = 0".into(),
                format!("info = 0 free {} total {total}", 16u64 << 20),
            ],
            "mode {mode}"
        );
        assert_eq!(env.snapshot().processes[0].oom_refusals, 1, "mode {mode}");
    }
}

/// Launch rates per window from the probe's `rate` step: (window start in ms, launches per second).
fn windows(out: &[String]) -> Vec<(f64, f64)> {
    out.iter()
        .filter_map(|l| l.strip_prefix("window "))
        .map(|l| {
            let (t, r) = l.split_once(' ').unwrap();
            (t.parse().unwrap(), r.parse().unwrap())
        })
        .collect()
}

/// Core limit: the fake GPU runs 200 us per launch (4 blocks x 50 us), so a program launching as
/// fast as it can keeps it 100 % busy, and the fake NVML reports utilization proportional to the
/// launch rate. With CUDA_DEVICE_SM_LIMIT=30 the launch rate measured by the program is within
/// +-10 % of 30 % of its unthrottled rate (the device's pace, 5000/s, which the program's best
/// unthrottled window must approach) in every window after 2 s; with 100 nothing waits. With
/// NVML process utilization, with its device-utilization fallback, and in a pid namespace beside
/// another tenant (NVML's host pids are mapped to the container's processes).
#[test]
fn core_limit_converges_to_the_limit_within_two_seconds() {
    let _serial = timing();
    for (process_util, namespaced) in [(true, false), (false, false), (true, true)] {
        let env = setup();
        let mut vars = vec![("FAKE_CUDA_BLOCK_NS", "50000")];
        if !process_util {
            vars.push(("FAKE_NVML_CONFIG", r#"{"processUtilization": false}"#));
        }
        if namespaced {
            // NVML names the process by its host pid, and another tenant keeps the GPU 40 % busy:
            // only the host-pid mapping finds the container's own samples (device utilization
            // would count the other tenant's 40 % as the container's).
            vars.push((
                "FAKE_NVML_CONFIG",
                r#"{"pidOffset": 100000, "otherTenantUtilization": 40}"#,
            ));
        }
        let with = |limit: &'static str| {
            let mut v = vars.clone();
            v.push(("CUDA_DEVICE_SM_LIMIT", limit));
            v
        };
        let (out, _) = env.run(&with("0"), &["direct", "init", "ctx:0", "rate:1500:100:4"]);
        let free = windows(&out);
        assert!(free.len() >= 3, "{out:?}");
        // The unthrottled rate is the device's pace (5000 launches/s); a window falls short of it
        // when the program is descheduled on a busy machine (and passes it by at most the 2 ms the
        // launch queue holds, 2 %), so the best 100 ms window measures it.
        let r0 = free.iter().map(|w| w.1).fold(0.0, f64::max);
        assert!((2500.0..=5200.0).contains(&r0), "unthrottled rate {r0}");
        // The shares below are of the device's pace, which the best window only approaches: on a
        // starved machine (load 10 on 2 cores) the best window was 4440-4700/s while the throttled
        // rate, which follows the fake GPU's utilization and not the CPU, held 30-31 % of 5000/s;
        // divided by the starved r0 that read as 33-35 %.
        let pace = 1e9 / (4.0 * 50_000.0);

        let (out, _) = env.run(&with("30"), &["direct", "init", "ctx:0", "rate:3000:250:4"]);
        let limited = windows(&out);
        let late: Vec<f64> = limited
            .iter()
            .filter(|w| w.0 >= 2000.0)
            .map(|w| w.1 / pace)
            .collect();
        assert!(late.len() >= 3, "{limited:?}");
        for share in &late {
            assert!(
                (0.27..=0.33).contains(share),
                "process_util {process_util} namespaced {namespaced}: share {share:.3} of {pace:.0}/s (best unthrottled window {r0:.0}/s) after 2 s; windows {limited:?}"
            );
        }
        let snap = env.snapshot();
        assert!(
            snap.processes.iter().any(|p| p.throttled_ns > 500_000_000),
            "{snap:?}"
        );
        if namespaced {
            // The process found its NVML pid and recorded it for the device plugin.
            let p = &snap.processes[0];
            assert_eq!(p.host_pid, p.pid + 100_000, "{snap:?}");
        }

        // Limit 100 = no limit: nothing waits (exact: no throttled time in a fresh file), and the
        // rate stays the device's (loosely: the machine may be busy).
        let env = setup();
        let (out, _) = env.run(
            &with("100"),
            &["direct", "init", "ctx:0", "rate:1000:100:4"],
        );
        assert_eq!(env.snapshot().throttled_ns(), 0);
        let full = windows(&out);
        eprintln!(
            "process_util {process_util} namespaced {namespaced}: r0 {r0:.0}/s, limit 30 {limited:?}, limit 100 {full:?}"
        );
        let r100 = full.iter().map(|w| w.1).fold(0.0, f64::max);
        assert!(r100 / r0 > 0.8, "limit 100 throttled: {r100} vs {r0}");
    }
}

/// NVML memory info (both versions, linked and dlopen+dlsym) reports the container's limit and
/// usage. NVML numbers devices as the container sees them (NVIDIA_VISIBLE_DEVICES order) and ignores
/// CUDA_VISIBLE_DEVICES: with CUDA_VISIBLE_DEVICES=1, CUDA ordinal 0 is NVML device 1 and limit _1.
#[test]
fn nvml_memory_info_reports_the_slice() {
    for mode in ["direct", "dlsym"] {
        let env = setup();
        let (out, _) = env.run(
            &[
                ("CUDA_DEVICE_MEMORY_LIMIT_0", "1g"),
                ("CUDA_DEVICE_MEMORY_LIMIT_1", "3g"),
                ("CUDA_VISIBLE_DEVICES", "1"),
                ("FAKE_CUDA_DEVICE_MEMORY", "8g,8g"),
            ],
            &[mode, "init", "ctx:0", "alloc:1024m", "nvml:1", "nvml:0"],
        );
        let g = |n: u64| n << 30;
        assert_eq!(
            out[3..],
            [
                format!("nvml = 0 total {} free {} used {}", g(3), g(2), g(1)),
                format!("nvml2 = 0 total {} free {} used {}", g(3), g(2), g(1)),
                format!("nvml = 0 total {} free {} used 0", g(1), g(1)),
                format!("nvml2 = 0 total {} free {} used 0", g(1), g(1)),
            ],
            "mode {mode}"
        );
    }
    // Without a limit NVML's own numbers pass through (the fake driver's usage).
    let env = setup();
    let (out, _) = env.run(
        &[("FAKE_CUDA_DEVICE_MEMORY", "8g")],
        &["direct", "init", "ctx:0", "alloc:1024m", "nvml:0"],
    );
    assert_eq!(
        out[3],
        format!(
            "nvml = 0 total {} free {} used {}",
            8u64 << 30,
            7u64 << 30,
            1u64 << 30
        )
    );
}

/// A live process's watcher reclaims the slot of a process that exited within 1 s: its memory
/// returns to the container and its launches stay in the container's (retired) totals.
#[test]
fn dead_processes_leave_the_file_within_a_second() {
    let env = setup();
    let vars = [("CUDA_DEVICE_MEMORY_LIMIT", "1g")];
    let mut holder = env
        .command(
            &vars,
            &["direct", "init", "ctx:0", "alloc:1m", "hold:30000"],
        )
        .spawn()
        .unwrap();
    let read = || {
        std::fs::read(env.cache())
            .ok()
            .and_then(|b| Snapshot::parse(&b).ok())
    };
    vgpu_tests::wait_for(
        std::time::Duration::from_secs(10),
        "the holder's allocation in the file",
        || read().filter(|s| s.used(0) == 1 << 20),
    );
    let (out, _) = env.run(
        &vars,
        &["direct", "init", "ctx:0", "alloc:512m", "launch:7"],
    );
    let exited = std::time::Instant::now();
    assert_eq!(out[3], "launch ok 7");
    let snap = vgpu_tests::wait_for(
        std::time::Duration::from_secs(5),
        "the exited process's slot to be reclaimed",
        || read().filter(|s| s.processes.len() == 1 && s.used(0) == 1 << 20),
    );
    let took = exited.elapsed();
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        took < std::time::Duration::from_secs(1),
        "reclaimed after {took:?}"
    );
    assert_eq!(snap.launches(), 7);
    assert_eq!(snap.retired.launches, 7);
    assert_eq!(snap.container_peak[0], 513 << 20);
}

/// Launches are counted in per-thread meters that the watcher copies into the process's slot every
/// 50 ms and the process copies at exit (runtime-hook/src/meter.rs): with 8 threads that launch and
/// exit (their meters are then reused), the count reaches the file while the process still runs
/// (well within 1 s), it is exact once the process has exited, and a fork()ed child counts only
/// its own launches, with and without a core limit.
#[test]
fn launch_counts_are_exact_across_threads_forks_and_exits() {
    for limit in ["0", "50"] {
        let env = setup();
        let vars = [
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_SM_LIMIT", limit),
        ];
        let read = || {
            std::fs::read(env.cache())
                .ok()
                .and_then(|b| Snapshot::parse(&b).ok())
        };
        let mut running = env
            .command(
                &vars,
                &[
                    "direct",
                    "init",
                    "ctx:0",
                    "tlaunch:8:1000",
                    "tlaunch:8:1000",
                    "launch:5",
                    "hold:30000",
                ],
            )
            .spawn()
            .unwrap();
        let launched = std::time::Instant::now();
        let snap = vgpu_tests::wait_for(
            std::time::Duration::from_secs(10),
            "the running process's launches in the file",
            || read().filter(|s| s.launches() == 16_005),
        );
        let took = launched.elapsed();
        assert_eq!(
            running.try_wait().unwrap(),
            None,
            "limit {limit}: the process ended early"
        );
        running.kill().unwrap();
        running.wait().unwrap();
        assert_eq!(snap.processes.len(), 1, "limit {limit}: {snap:?}");
        // The probe's launches take well under a second even on a loaded machine; the copy comes
        // at most one 50 ms period after them.
        assert!(
            took < std::time::Duration::from_secs(3),
            "limit {limit}: the launch count reached the file after {took:?}"
        );

        let env = setup();
        let (out, _) = env.run(
            &vars,
            &[
                "direct",
                "init",
                "ctx:0",
                "launch:5",
                "tlaunch:4:250",
                "forklaunch:7",
                "launch:2",
                "count",
            ],
        );
        assert_eq!(
            out[2..],
            [
                "launch ok 5",
                "tlaunch ok 1000",
                "child launch ok 7",
                "child exited 0",
                "launch ok 2",
                "driver launches 1007",
            ],
            "limit {limit}"
        );
        // Both processes have exited; each counted its own launches (the child did not inherit the
        // parent's 1005), and the exit copies made the totals exact.
        let snap = env.snapshot();
        assert_eq!(snap.launches(), 1014, "limit {limit}: {snap:?}");
    }
}

/// A process has one slot however its threads start: 16 threads whose first launches meet at a
/// barrier all claim the process's slot at once, and exactly one claim may happen (a race once let
/// each of them take a slot for the same pid, splitting its counters). Repeated, with and without a
/// core limit, since a race shows only now and then.
#[test]
fn threads_launching_first_together_share_one_slot() {
    let env = setup();
    for round in 0..12 {
        let limit = if round % 2 == 0 { "0" } else { "50" };
        let cache = env.dir.path().join(format!("acct/round-{round}.cache"));
        let cache_var = cache.to_string_lossy().into_owned();
        let vars = [
            ("CUDA_DEVICE_MEMORY_LIMIT", "1g"),
            ("CUDA_DEVICE_SM_LIMIT", limit),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", cache_var.as_str()),
        ];
        let mut running = env
            .command(
                &vars,
                &["direct", "init", "ctx:0", "tlaunch:16:1", "hold:30000"],
            )
            .spawn()
            .unwrap();
        let snap = vgpu_tests::wait_for(
            std::time::Duration::from_secs(10),
            "the 16 launches in the file",
            || {
                std::fs::read(&cache)
                    .ok()
                    .and_then(|b| Snapshot::parse(&b).ok())
                    .filter(|s| s.launches() == 16)
            },
        );
        running.kill().unwrap();
        running.wait().unwrap();
        assert_eq!(
            snap.processes.len(),
            1,
            "round {round}, limit {limit}: {snap:?}"
        );
    }
}

/// In a container the device plugin mounts a read-only limits file next to the library. Its
/// limits hold whatever the process's environment says (a ConfigMap behind `envFrom`, or a shell
/// `export` inside the container), the accounting file it names is the one used, and a damaged
/// file refuses CUDA instead of running unlimited.
#[test]
fn the_limits_file_beside_the_library_beats_the_environment() {
    let env = setup();
    // A container tree: <root>/usr/local/vgpu/{libvgpu.so,limits.env} and <root>/tmp/vgpu.
    let root = env.dir.path().join("ctr");
    let lib_dir = root.join("usr/local/vgpu");
    std::fs::create_dir_all(&lib_dir).unwrap();
    std::fs::create_dir_all(root.join("tmp/vgpu")).unwrap();
    let hook = lib_dir.join("libvgpu.so");
    std::fs::copy(&env.hook, &hook).unwrap();
    let limits = lib_dir.join(vgpu_core::limits_file::FILE_NAME);
    std::fs::write(
        &limits,
        vgpu_core::limits_file::format([
            ("CUDA_DEVICE_MEMORY_LIMIT_0", "1024m"),
            ("CUDA_DEVICE_SM_LIMIT_0", "0"),
            ("CUDA_DEVICE_MEMORY_SHARED_CACHE", "/tmp/vgpu/vgpu.cache"),
        ]),
    )
    .unwrap();
    let run = || {
        Command::new(&env.probe)
            .args([
                "direct",
                "init",
                "ctx:0",
                "total:0",
                "alloc:1023m",
                "alloc:2m",
            ])
            .env_clear()
            .env("LD_LIBRARY_PATH", env.dir.path())
            .env("LD_PRELOAD", &hook)
            .env("FAKE_CUDA_DEVICE_MEMORY", "16g")
            .env("CUDA_DEVICE_MEMORY_LIMIT_0", "80g")
            .env("CUDA_DEVICE_MEMORY_LIMIT", "80g")
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                env.dir.path().join("mine.cache"),
            )
            .output()
            .unwrap()
    };
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(
        lines,
        [
            "init = 0".to_string(),
            "ctx = 0".into(),
            format!("total = 0 bytes {}", gib(1)),
            format!("alloc {} = 0", 1023u64 << 20),
            format!("alloc {} = 2", 2u64 << 20),
        ],
        "{stderr}"
    );
    assert!(
        stderr.contains("vgpu: ignoring CUDA_DEVICE_MEMORY_LIMIT=80g CUDA_DEVICE_MEMORY_LIMIT_0=80g CUDA_DEVICE_MEMORY_SHARED_CACHE="),
        "{stderr}"
    );
    // The file's accounting path, inside the container tree, not the environment's.
    assert!(root.join("tmp/vgpu/vgpu.cache").is_file());
    assert!(!env.dir.path().join("mine.cache").exists());

    std::fs::write(&limits, "CUDA_DEVICE_MEMORY_LIMIT_0=1024m\nnot a line\n").unwrap();
    let out = run();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // CUDA_ERROR_INVALID_VALUE (1): fail closed, naming the file and the line.
    assert_eq!(
        stdout.lines().next(),
        Some("init = 1"),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("limits.env") && stderr.contains("line 2"),
        "{stderr}"
    );
}

/// Runs the probe through a wrapper command (`sh -c ...`, `unshare ...`); returns (exit status,
/// stdout lines, stderr) without asserting success.
fn run_wrapped(
    env: &Env,
    wrapper: &[&str],
    vars: &[(&str, &str)],
    args: &[&str],
) -> (std::process::ExitStatus, Vec<String>, String) {
    let mut cmd = Command::new(wrapper[0]);
    cmd.args(&wrapper[1..])
        .arg(&env.probe)
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LD_LIBRARY_PATH", env.dir.path())
        .env("LD_PRELOAD", &env.hook);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    (
        out.status,
        stdout.lines().map(String::from).collect(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The probe's answer when the accounting file cannot be used: cuInit and the allocation are
/// refused (CUDA_ERROR_NOT_INITIALIZED), never run unmetered, and stderr has exactly one line,
/// naming the path and the OS error.
fn assert_fails_closed(out: &[String], err: &str, path: &std::path::Path, errno: &str) {
    assert_eq!(out, ["init = 3", "alloc 1048576 = 3"], "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&path.display().to_string()) && lines[0].contains(errno),
        "want the path and {errno:?}: {err}"
    );
}

/// A shared-file directory that cannot be written, or a file system that is full, fails closed.
/// Every case holds for root (the tests run as root in CI, where permission bits do not stop
/// writes): a path through a regular file (ENOTDIR), a device instead of a regular file (/dev/zero
/// would map as memory no other process shares), a file-size limit below the file's size
/// (RLIMIT_FSIZE, as `ulimit -f` sets it: growing the file fails with EFBIG) and, where this
/// machine lets an unprivileged user namespace mount, a read-only bind mount (EROFS); that last case
/// is skipped, with a line on stderr, where mounting is not permitted.
#[test]
fn unusable_accounting_file_fails_closed_with_one_line() {
    let env = setup();
    let vars = |p: &std::path::Path| {
        vec![
            ("CUDA_DEVICE_MEMORY_LIMIT".to_string(), "1g".to_string()),
            (
                "CUDA_DEVICE_MEMORY_SHARED_CACHE".to_string(),
                p.display().to_string(),
            ),
        ]
    };
    let args = ["direct", "init", "alloc:1m"];
    let plain = env.dir.path().join("plain-file");
    std::fs::write(&plain, b"not a directory").unwrap();
    // The accounting directory is writable by every user of the container: another user's symlink
    // there is not followed (it could point at a file of this process's user, which the hook would
    // then open to all and overwrite).
    let target = env.dir.path().join("someone-elses-file");
    std::fs::write(&target, b"keep").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = env.dir.path().join("linked/vgpu.cache");
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&target, &link).unwrap();
    for (path, errno) in [
        (plain.join("vgpu/vgpu.cache"), "os error 20"),
        (std::path::PathBuf::from("/dev/zero"), "not a regular file"),
        (link.clone(), "os error 40"),
    ] {
        let v = vars(&path);
        let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (k.as_str(), x.as_str())).collect();
        let (status, out, err) = run_wrapped(&env, &["env"], &v, &args);
        assert!(status.success(), "{out:?} {err}");
        assert_fails_closed(&out, &err, &path, errno);
    }

    assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    assert_eq!(
        std::fs::metadata(&target).unwrap().permissions().mode() & 0o777,
        0o600
    );

    // "Full": the file-size limit is below the accounting file's size (ulimit -f counts blocks of
    // 512 or 1024 bytes; 1 block is far below the file's 41 KiB).
    let full = env.dir.path().join("full/vgpu.cache");
    let v = vars(&full);
    let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (k.as_str(), x.as_str())).collect();
    let (status, out, err) = run_wrapped(
        &env,
        &["sh", "-c", "ulimit -f 1 && exec \"$0\" \"$@\""],
        &v,
        &args,
    );
    assert!(status.success(), "{out:?} {err}");
    assert_fails_closed(&out, &err, &full, "os error 27");
    assert!(
        !full.exists() || std::fs::metadata(&full).unwrap().len() == 0,
        "the file was grown past the limit"
    );

    // Read-only file system: a read-only bind mount in a private user and mount namespace.
    let ro = env.dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let cache = ro.join("acct/vgpu.cache");
    let v = vars(&cache);
    let v: Vec<(&str, &str)> = v.iter().map(|(k, x)| (k.as_str(), x.as_str())).collect();
    let mount = format!(
        "mount --bind -o ro {0} {0} || exit 97; exec \"$0\" \"$@\"",
        ro.display()
    );
    let (status, out, err) = run_wrapped(
        &env,
        &[
            "unshare",
            "--user",
            "--map-root-user",
            "--mount",
            "sh",
            "-c",
            &mount,
        ],
        &v,
        &args,
    );
    if out.is_empty() {
        eprintln!(
            "read-only case skipped: cannot mount here ({status}: {})",
            err.trim()
        );
        return;
    }
    assert!(status.success(), "{out:?} {err}");
    assert_fails_closed(&out, &err, &cache, "os error 30");
}

/// Two "containers" on one GPU: the hook copied into a directory with the GPU's activity file at
/// `gpus/0` (as the device plugin mounts it), each container with its own accounting file.
struct SharedGpu {
    env: Env,
    hook: PathBuf,
}

impl SharedGpu {
    fn new() -> SharedGpu {
        let env = setup();
        let lib = env.dir.path().join("lib");
        std::fs::create_dir_all(lib.join("gpus")).unwrap();
        let hook = lib.join("libvgpu.so");
        std::fs::copy(&env.hook, &hook).unwrap();
        for i in 0..2 {
            let board = lib.join(format!("gpus/{i}"));
            std::fs::write(board, vgpu_core::activity::initial_bytes()).unwrap();
        }
        SharedGpu { env, hook }
    }

    /// The probe as container `name` with `vars` ([`Env::command`] with this container's hook and
    /// accounting file, the fake GPU at 50 us a block), stdout and stderr piped.
    fn spawn(&self, name: &str, vars: &[(&str, &str)], args: &[&str]) -> std::process::Child {
        self.env
            .command(&[&[("FAKE_CUDA_BLOCK_NS", "50000")], vars].concat(), args)
            .env("LD_PRELOAD", &self.hook)
            .env(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                self.env.dir.path().join(name).join("vgpu.cache"),
            )
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// [`SharedGpu::spawn`], its windows streamed.
    fn launch(&self, name: &str, vars: &[(&str, &str)], args: &[&str]) -> Launcher {
        let mut child = self.spawn(name, vars, args);
        let windows = stream_windows(&mut child);
        Launcher { child, windows }
    }

    fn snapshot(&self, name: &str) -> Snapshot {
        let path = self.env.dir.path().join(name).join("vgpu.cache");
        Snapshot::parse(&std::fs::read(path).unwrap()).unwrap()
    }
}

/// A probe's `window` lines so far, and whether its output has ended.
type Windows = std::sync::Arc<std::sync::Mutex<(Vec<(f64, f64)>, bool)>>;

/// How long the priority tests wait for a probe's output.
const PROBE_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// A probe running a `rate` step, its windows read as they come.
struct Launcher {
    child: std::process::Child,
    windows: Windows,
}

impl Launcher {
    /// Waits until the probe has run `ms` of its own clock; returns that moment on its clock
    /// (the end of the window that started at `ms` or later).
    fn ran(&self, ms: f64) -> f64 {
        vgpu_tests::wait_for(PROBE_WAIT, &format!("the probe's first {ms} ms"), || {
            let w = self.windows.lock().unwrap();
            w.0.iter().find(|x| x.0 >= ms).map(|x| x.0 + 100.0)
        })
    }

    /// Waits for a successful exit and the end of the output; the windows.
    fn finish(mut self) -> Vec<(f64, f64)> {
        assert!(self.child.wait().unwrap().success());
        vgpu_tests::wait_for(PROBE_WAIT, "the probe's output", || {
            self.windows.lock().unwrap().1.then_some(())
        });
        let w = self.windows.lock().unwrap().0.clone();
        w
    }
}

/// A probe's `window` lines as they come.
fn stream_windows(child: &mut std::process::Child) -> Windows {
    use std::io::BufRead;
    let out = child.stdout.take().unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), false)));
    let writer = seen.clone();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if let [(t, r)] = windows(&[line])[..] {
                writer.lock().unwrap().0.push((t, r));
            }
        }
        writer.lock().unwrap().1 = true;
    });
    seen
}

/// The share of a probe's 100 ms launch windows that started within `[from, to)` ms of its own
/// clock, of those a probe that never waits would start there (1.0). A paused launch holds its
/// window open, so a paused probe starts none.
fn windows_started(w: &[(f64, f64)], from: f64, to: f64) -> f64 {
    let n = w.iter().filter(|x| x.0 >= from && x.0 < to).count();
    n as f64 / ((to - from) / 100.0)
}

/// Task priority (HAMi's `CUDA_TASK_PRIORITY`, from `nvidia.com/priority`): while a high-priority
/// container launches on the GPU, a low-priority one's launches wait (its launch rate drops to
/// nearly 0 within about 150 ms: one 50 ms watcher period plus the 100 ms window), and it
/// resumes by itself once the high one has stopped; a SIGKILLed high one leaves it paused for
/// well under a second.
#[test]
fn a_low_priority_container_waits_while_a_high_one_launches() {
    let _serial = timing();
    let gpu = SharedGpu::new();
    let low_vars = [("CUDA_TASK_PRIORITY", "1")];
    let high_vars = [("CUDA_TASK_PRIORITY", "0")];

    // The high one runs 1.5 s and exits.
    let low = gpu.launch(
        "low",
        &low_vars,
        &["direct", "init", "ctx:0", "rate:4500:100:4"],
    );
    let ms_at_spawn = low.ran(500.0);
    let high_started = std::time::Instant::now();
    let high = gpu.launch(
        "high",
        &high_vars,
        &["direct", "init", "ctx:0", "rate:1500:100:4"],
    );
    high.finish();
    let high_ran = high_started.elapsed().as_secs_f64() * 1e3;
    let w = low.finish();
    let before = windows_started(&w, 0.0, ms_at_spawn);
    let (from, to) = (ms_at_spawn + 300.0, ms_at_spawn + high_ran - 100.0);
    let during = windows_started(&w, from, to);
    let after_from = ms_at_spawn + high_ran + 400.0;
    let last = w.last().map_or(0.0, |x| x.0);
    let after = windows_started(&w, after_from, last);
    eprintln!("low launch windows started, share of a free run: before {before:.2}, during the high one {during:.2}, after {after:.2}; windows {w:?}");
    assert!(before > 0.8, "the low one ran before: {w:?}");
    // At most the window open when the pause began ends in the interval.
    assert!(during <= 0.1, "not paused: {during:.2}; {w:?}");
    assert!(after > 0.8, "did not resume: {after:.2}; {w:?}");
    // The pause is metered as throttled time.
    assert!(gpu.snapshot("low").throttled_ns() > 1_000_000_000);
    assert_eq!(gpu.snapshot("high").throttled_ns(), 0);

    // The high one is SIGKILLed while it launches.
    let low = gpu.launch(
        "low",
        &low_vars,
        &["direct", "init", "ctx:0", "rate:4000:100:4"],
    );
    let ms_at_spawn = low.ran(500.0);
    let high_started = std::time::Instant::now();
    let mut high = gpu.launch(
        "high",
        &high_vars,
        &["direct", "init", "ctx:0", "rate:60000:100:4"],
    );
    high.ran(400.0);
    high.child.kill().unwrap();
    let killed_at = ms_at_spawn + high_started.elapsed().as_secs_f64() * 1e3;
    high.child.wait().unwrap();
    let w = low.finish();
    let before = w.iter().take(5).map(|x| x.1).fold(0.0, f64::max);
    // The first window after the kill that runs at half the earlier rate or more.
    let resumed = w
        .windows(2)
        .find(|p| p[0].0 >= killed_at - 100.0 && p[0].1 > 0.5 * before)
        .map(|p| p[0].0)
        .unwrap_or_else(|| panic!("never resumed after the kill at {killed_at:.0} ms: {w:?}"));
    eprintln!("killed at {killed_at:.0} ms, the low one resumed at {resumed:.0} ms");
    assert!(
        resumed - killed_at < 1000.0,
        "paused {:.0} ms after the high one was killed: {w:?}",
        resumed - killed_at
    );
}

/// A high-priority process that launches on its GPU 0 only does not pause a low-priority one on
/// GPU 1 (launches are noted per device, each GPU has its own activity file).
#[test]
fn priority_pauses_only_on_the_gpu_the_high_one_uses() {
    let _serial = timing();
    let gpu = SharedGpu::new();
    let two = ("FAKE_CUDA_DEVICE_MEMORY", "16g,16g");
    let low = gpu.launch(
        "low",
        &[two, ("CUDA_TASK_PRIORITY", "1")],
        &["direct", "init", "ctx:1", "rate:3000:100:4"],
    );
    let ms_at_spawn = low.ran(500.0);
    let started = std::time::Instant::now();
    gpu.launch(
        "high",
        &[two, ("CUDA_TASK_PRIORITY", "0")],
        &["direct", "init", "ctx:0", "rate:1500:100:4"],
    )
    .finish();
    let ran = started.elapsed().as_secs_f64() * 1e3;
    let w = low.finish();
    let during = windows_started(&w, ms_at_spawn + 300.0, ms_at_spawn + ran - 100.0);
    assert!(during > 0.8, "paused on another GPU: {during:.2}; {w:?}");
    assert_eq!(gpu.snapshot("low").throttled_ns(), 0);
}

/// `GPU_CORE_UTILIZATION_POLICY` (HAMi's): `force` throttles a 30 % container always (the
/// default, as before), `disable` never, and `default` only while another container launches on
/// the GPU.
#[test]
fn the_core_policy_decides_when_the_sm_limit_applies() {
    let _serial = timing();
    let gpu = SharedGpu::new();
    let run_alone = |name: &str, policy: &str| {
        let mut c = gpu.spawn(
            name,
            &[
                ("CUDA_DEVICE_SM_LIMIT", "30"),
                ("GPU_CORE_UTILIZATION_POLICY", policy),
            ],
            &["direct", "init", "ctx:0", "rate:1500:100:4"],
        );
        assert!(c.wait().unwrap().success());
        gpu.snapshot(name).throttled_ns()
    };
    assert!(run_alone("force", "force") > 200_000_000);
    assert_eq!(run_alone("disable", "disable"), 0);
    assert_eq!(run_alone("alone", "default"), 0);

    // Another container launches the whole time: `default` throttles to 30 %.
    let mut other = gpu.launch(
        "other",
        &[],
        &["direct", "init", "ctx:0", "rate:6000:100:4"],
    );
    other.ran(200.0);
    let shared = gpu.launch(
        "shared",
        &[
            ("CUDA_DEVICE_SM_LIMIT", "30"),
            ("GPU_CORE_UTILIZATION_POLICY", "default"),
        ],
        &["direct", "init", "ctx:0", "rate:3000:250:4"],
    );
    let w = shared.finish();
    other.child.kill().unwrap();
    other.child.wait().unwrap();
    let pace = 1e9 / (4.0 * 50_000.0);
    let late: Vec<f64> = w
        .iter()
        .filter(|x| x.0 >= 2000.0)
        .map(|x| x.1 / pace)
        .collect();
    assert!(!late.is_empty(), "{w:?}");
    assert!(
        late.iter().all(|s| *s < 0.4),
        "not throttled while shared: shares {late:?} of {pace}/s"
    );
    assert!(gpu.snapshot("shared").throttled_ns() > 200_000_000);

    // A bad value fails closed, naming the variable.
    let bad = gpu.spawn(
        "bad",
        &[("GPU_CORE_UTILIZATION_POLICY", "sometimes")],
        &["direct", "init"],
    );
    let out = bad.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GPU_CORE_UTILIZATION_POLICY=\"sometimes\" is invalid"),
        "{stderr}"
    );
}
