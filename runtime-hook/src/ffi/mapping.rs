//! The accounting file mapped into memory (created, sized and checked first), and whether a
//! process that held a slot is still alive.

use super::*;

/// Why the accounting file cannot be used: the step that failed and the OS error (its errno).
#[derive(Debug, thiserror::Error)]
#[error("{step}: {source}")]
pub(super) struct MapError {
    pub(super) step: &'static str,
    #[source]
    pub(super) source: std::io::Error,
}

pub(super) fn step<T>(step: &'static str, r: std::io::Result<T>) -> Result<T, MapError> {
    r.map_err(|source| MapError { step, source })
}

/// Opens (creating it and its directory, mode 0666, when missing) and maps the accounting file.
/// Fails closed rather than run unmetered: a directory that cannot be created or written (read-only
/// file system, a path through a regular file), a path that is not a regular file (a device such as
/// `/dev/zero` would map as memory no other process shares), a file-size limit (`RLIMIT_FSIZE`)
/// below the file's size (growing past it would raise SIGXFSZ), and a full file system: the file's
/// blocks are allocated with `fallocate` before it is mapped, so "no space" is an error here and
/// not a SIGBUS at the first store into the mapping.
pub(super) fn map_file(path: &std::path::Path) -> Result<&'static [AtomicU64], MapError> {
    use std::io::Error;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        step("cannot create its directory", std::fs::create_dir_all(dir))?;
    }
    // The directory is writable by every user of the container: the path is not followed if it is
    // a symlink (another user could point it at a file of ours), and only the process that creates
    // the file opens it to all (0666 whatever its umask), so processes of every uid share it.
    let open = |create_new: bool| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(create_new)
            .mode(0o666)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
    };
    let (file, created) = match open(true) {
        Ok(f) => (f, true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            (step("cannot open it for writing", open(false))?, false)
        }
        Err(source) => {
            return Err(MapError {
                step: "cannot open it for writing",
                source,
            })
        }
    };
    let meta = step("cannot stat it", file.metadata())?;
    if !meta.is_file() {
        return Err(MapError {
            step: "not a regular file",
            source: Error::from_raw_os_error(libc::EINVAL),
        });
    }
    if created {
        use std::os::unix::fs::PermissionsExt;
        let _ = file.set_permissions(std::fs::Permissions::from_mode(0o666));
    }
    let len = (FILE_WORDS * 8) as u64;
    if meta.len() < len {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) } == 0
            && lim.rlim_cur != libc::RLIM_INFINITY
            && lim.rlim_cur < len
        {
            return Err(MapError {
                step: "the file-size limit (RLIMIT_FSIZE) is below its size",
                source: Error::from_raw_os_error(libc::EFBIG),
            });
        }
        // SAFETY: fallocate on our own open descriptor; mode 0 allocates and extends.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) } != 0 {
            let e = Error::last_os_error();
            match e.raw_os_error() {
                // File systems without fallocate: a sparse file (blocks allocated on first store).
                Some(libc::EOPNOTSUPP) => step("cannot size it", file.set_len(len))?,
                _ => {
                    return Err(MapError {
                        step: "cannot allocate its blocks",
                        source: e,
                    })
                }
            }
        }
    }
    map_words(&file, FILE_WORDS)
}

/// Maps the first `words` words of `file` (at least that long) shared, read-write, for the life
/// of the process.
pub(super) fn map_words(
    file: &std::fs::File,
    words: usize,
) -> Result<&'static [AtomicU64], MapError> {
    use std::os::fd::AsRawFd;
    // SAFETY: a shared read-write mapping of `words` words of a file at least that long; never
    // unmapped, so the 'static slice stays valid for the life of the process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            words * 8,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(MapError {
            step: "cannot map it",
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: page-aligned mapping of `words` u64s; AtomicU64 has the layout of u64, and every
    // process accesses the words only atomically.
    Ok(unsafe { std::slice::from_raw_parts(p as *const AtomicU64, words) })
}

/// Maps an activity file the device plugin made (never created or grown here): a regular file,
/// not followed if a symlink, at least `words` words long.
pub(super) fn map_existing(
    path: &std::path::Path,
    words: usize,
) -> Result<&'static [AtomicU64], String> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| format!("cannot open it for writing: {e}"))?;
    let meta = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?;
    if !meta.is_file() || meta.len() < (words * 8) as u64 {
        return Err(format!("not a regular file of {} bytes or more", words * 8));
    }
    map_words(&file, words).map_err(|e| e.to_string())
}

pub(super) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks existence.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists
        && std::fs::read_to_string(format!("/proc/{pid}/status"))
            .map_or(true, |status| !released(&status))
}

/// Whether the process `/proc/<pid>/status` describes has let go of its GPU memory: the driver
/// frees it when the last thread closes the process's device files at exit. That is true of a
/// zombie with no other thread left; a SIGKILLed multi-threaded process first shows a zombie
/// leader (`State: Z`) while its other threads are still exiting (`Threads:` above 1) and its
/// files still open, and reclaiming then would hand out memory the card still holds.
pub(super) fn released(status: &str) -> bool {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim_start)
    };
    let zombie = field("State:").is_some_and(|s| s.starts_with('Z') || s.starts_with('X'));
    let threads = field("Threads:").and_then(|n| n.trim().parse::<u32>().ok());
    zombie && threads.is_none_or(|n| n <= 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_released_only_when_the_last_thread_is_gone() {
        let status = |state: &str, threads: u32| {
            format!("Name:\tprobe\nState:\t{state}\nTgid:\t7\nThreads:\t{threads}\n")
        };
        assert!(!released(&status("R (running)", 16)));
        assert!(!released(&status("S (sleeping)", 1)));
        // A SIGKILLed leader is a zombie while its other threads still exit.
        assert!(!released(&status("Z (zombie)", 5)));
        assert!(released(&status("Z (zombie)", 1)));
        assert!(released(&status("X (dead)", 1)));
        // This process is alive.
        assert!(alive(std::process::id()));
    }
}
