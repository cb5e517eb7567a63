//! Serving the vGPU services' HTTP APIs to clients that may be slow, many, or hostile.
//!
//! The webhook (HTTPS, reached by the API server) and the scheduler extender (HTTP on localhost, or
//! HTTPS) share this one serving loop, [`server::serve`], instead of each wiring hyper up its own
//! way. What it adds to a plain `axum::serve`:
//!
//! - **TLS** ([`tls`]): TLS 1.3 and 1.2 only, the certificate reloaded from its files while
//!   serving, and optionally a client certificate required and verified against a CA.
//! - **Timeouts** ([`Limits`]): a TLS handshake or request header not finished within the header
//!   timeout closes the connection; a body not received whole within the body timeout gets 408; a
//!   keep-alive connection with no request for the idle timeout is closed.
//! - **Body size**: a body over the limit gets 413 — at once when its Content-Length says so,
//!   otherwise as soon as the streamed bytes pass the limit — and is never buffered whole
//!   ([`body`]).
//! - **File descriptors** ([`raise_nofile_limit`]): the soft RLIMIT_NOFILE is raised to the hard
//!   one, so a thousand idle connections do not exhaust the usual 1024.
//!
//! And what every service shares besides serving: the one logging set-up of every binary
//! ([`logging`]) and the one watch loop of every cache that follows the API server ([`watch`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod body;
pub mod logging;
pub mod server;
pub mod tls;
pub mod watch;

pub use server::{serve, Limits};

use std::time::Duration;
use thiserror::Error;

/// A duration flag that does not parse.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{input:?} is not a duration: write a whole number greater than zero with a unit, like 10s, 500ms or 2m")]
pub struct DurationError {
    input: String,
}

/// Parses a duration flag: a whole number with `ms`, `s` or `m` (`10s`, `500ms`, `2m`); a bare
/// number is seconds. Zero is refused: every timeout here must end.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_string(),
    };
    let s = input.trim();
    let (digits, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = digits.parse().map_err(|_| err())?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(err)?),
        _ => return Err(err()),
    };
    if d.is_zero() {
        return Err(err());
    }
    Ok(d)
}

/// What [`raise_nofile_limit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NofileLimit {
    /// The soft limit before.
    pub before: u64,
    /// The soft limit now.
    pub now: u64,
}

/// Raises this process's soft RLIMIT_NOFILE to its hard limit (capped at 1 Mi when the hard limit
/// is unlimited, which Linux refuses as a soft value above `fs.nr_open`). The soft limit is often
/// 1024 while the hard one is far higher; every open connection costs one descriptor. Failure
/// leaves the limit as it was and is reported, not fatal.
pub fn raise_nofile_limit() -> Result<NofileLimit, std::io::Error> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    const CAP: u64 = 1 << 20;
    let cur = getrlimit(Resource::Nofile);
    let before = cur.current.unwrap_or(u64::MAX);
    let target = cur.maximum.unwrap_or(CAP);
    if before >= target {
        return Ok(NofileLimit {
            before,
            now: before,
        });
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(target),
            maximum: cur.maximum,
        },
    )?;
    Ok(NofileLimit {
        before,
        now: target,
    })
}

/// SIGTERM or SIGINT, as a future; the handlers are installed by this call, not when the future is
/// first polled. Call it first thing: until a handler is installed, SIGTERM kills the process with
/// the default action, skipping the shutdown (a plugin's socket left behind, connections cut), and a
/// handler installed inside a task or on first poll leaves that window open while the process
/// already serves. Must be called inside a Tokio runtime.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn durations_take_a_unit_or_mean_seconds() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "0s", "ten", "5h", "-1s", "1.5s"] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.to_string().contains("is not a duration"), "{bad}: {e}");
        }
    }

    #[test]
    fn nofile_soft_limit_reaches_the_hard_limit() {
        let got = raise_nofile_limit().unwrap();
        assert!(got.now >= got.before);
        let after = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(after.current.unwrap_or(u64::MAX), got.now);
        assert_eq!(raise_nofile_limit().unwrap().before, got.now, "idempotent");
    }
}
