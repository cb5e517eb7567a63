//! Child processes that are killed when the test ends and whose output is shown when it fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A running child process; killed on drop. Its stdout and stderr are collected line by line.
pub struct Running {
    name: String,
    child: Child,
    output: Arc<Mutex<Vec<String>>>,
}

impl Running {
    /// Spawns `cmd` with piped output.
    pub fn spawn(name: &str, mut cmd: Command) -> Running {
        cmd.stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let output = Arc::new(Mutex::new(Vec::new()));
        for stream in [
            child
                .stdout
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
            child
                .stderr
                .take()
                .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        ]
        .into_iter()
        .flatten()
        {
            let out = output.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines().map_while(Result::ok) {
                    out.lock().unwrap().push(line);
                }
            });
        }
        Running {
            name: name.to_string(),
            child,
            output,
        }
    }

    /// Output lines so far (stdout and stderr interleaved as read).
    pub fn output(&self) -> Vec<String> {
        self.output.lock().unwrap().clone()
    }

    /// Waits until a line matching `pred` appears, or panics after `timeout` showing the output.
    pub fn wait_for_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(l) = self.output().into_iter().find(|l| pred(l)) {
                return l;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited with {status} before the expected line; output:\n{}",
                    self.name,
                    self.output().join("\n")
                );
            }
            if std::time::Instant::now() > deadline {
                panic!(
                    "{}: expected line not seen in {timeout:?}; output:\n{}",
                    self.name,
                    self.output().join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM-equivalent kill and waits (tests that need SIGTERM send it themselves).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for exit, up to `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "---- output of {} ----\n{}",
                self.name,
                self.output().join("\n")
            );
        }
    }
}

/// Starts the real `vgpu-webhook` on `127.0.0.1:0` with this pair and extra flags, and returns it
/// with the address it reported.
pub fn start_webhook(
    cert: &std::path::Path,
    key: &std::path::Path,
    extra: &[&str],
) -> (Running, std::net::SocketAddr) {
    let mut cmd = Command::new(crate::binary("vgpu-webhook"));
    // Only an explicit --kubeconfig in `extra` connects it to an API server.
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .args(extra);
    let mut proc = Running::spawn("vgpu-webhook", cmd);
    let line = proc.wait_for_line(Duration::from_secs(20), |l| {
        crate::net::listening_addr(l).is_some()
    });
    let addr =
        crate::net::listening_addr(&line).unwrap_or_else(|| panic!("no address in {line:?}"));
    (proc, addr)
}

/// CPU time (user + system) process `pid` has used so far, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> Duration {
    // A process that is gone must fail the measurement, not read as idle.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("process {pid}: /proc/{pid}/stat: {e}"));
    // Fields after the command name (which is in parentheses and may hold spaces): utime and stime
    // are the 14th and 15th fields of the line, in clock ticks (sysconf(_SC_CLK_TCK), 100 on Linux).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = [11, 12]
        .iter()
        .map(|&i| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("process {pid}: unreadable stat line {stat:?}"))
        })
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The share of one core process `pid` uses over `window`.
pub fn cpu_share(pid: u32, window: Duration) -> f64 {
    let before = cpu_time(pid);
    std::thread::sleep(window);
    (cpu_time(pid) - before).as_secs_f64() / window.as_secs_f64()
}
