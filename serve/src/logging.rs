//! The services' one logging set-up: `RUST_LOG` (default `info`), text or JSON lines to stderr.
//!
//! tracing-subscriber's formatter and timer, through tracing-appender's non-blocking writer over a
//! buffered stderr: its worker thread writes whatever lines have queued up and flushes when the
//! queue is empty, so under load one write carries many lines (one write per line, as stderr alone
//! does, cost more than the rest of an admission: docs/webhook.md), and a request never waits on
//! the terminal or pipe. Not lossy: when the queue is full, the caller waits rather than lose its
//! line. Keep the guard until exit; dropping it writes the rest.

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Writes the rest of the log at exit.
pub type Guard = tracing_appender::non_blocking::WorkerGuard;

/// Installs the global subscriber; keep the guard alive until exit.
pub fn init(format: LogFormat) -> Guard {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .finish(std::io::BufWriter::new(std::io::stderr()));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.with_ansi(false).init(),
    }
    guard
}
