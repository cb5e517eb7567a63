#![allow(missing_docs)] // criterion_group! generates undocumented items.
//! The admission log line through the production subscriber set-up (`info` filter, text without
//! ANSI colours or flattened JSON, the batched writer of `logbuf`), its output thrown away:
//! tracing-subscriber's own `SystemTime` timer (the baseline) against the webhook's
//! `CachedUtcTime`.
//! `cargo bench -p vgpu-webhook --bench logline`

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use std::io::{self, Write};
use tracing::Subscriber;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::EnvFilter;
use vgpu_webhook::logbuf::{BatchedWriter, FLUSH_EVERY};
use vgpu_webhook::logtime::CachedUtcTime;

/// Where the batched writer's thread hands the lines: nothing is kept.
struct Sink;

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        black_box(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The subscriber `init_logging` in webhook/src/main.rs builds, with `timer`.
fn subscriber<T>(json: bool, timer: T, writer: BatchedWriter) -> Box<dyn Subscriber + Send + Sync>
where
    T: FormatTime + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::new("info"))
        .with_timer(timer)
        .with_writer(writer);
    if json {
        Box::new(builder.json().flatten_event(true).finish())
    } else {
        Box::new(builder.with_ansi(false).finish())
    }
}

/// The line `/mutate` writes per admission (webhook/src/server.rs), with realistic values.
fn admission_line(i: u64) {
    let uid = "705ab4f5-6393-11e8-b7cc-42010a800002";
    tracing::info!(
        endpoint = "mutate",
        uid = %uid,
        namespace = "team-a",
        pod = "trainer-7f9c",
        decision = "patched",
        duration_us = i % 50,
        "admission"
    );
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("admission log line");
    for (format, json) in [("text", false), ("json", true)] {
        let (writer, _flush) = BatchedWriter::new(Sink, FLUSH_EVERY);
        for (timer, sub) in [
            (
                "SystemTime (baseline)",
                subscriber(json, SystemTime, writer.clone()),
            ),
            (
                "CachedUtcTime",
                subscriber(json, CachedUtcTime, writer.clone()),
            ),
        ] {
            tracing::subscriber::with_default(sub, || {
                let mut i = 0u64;
                group.bench_function(format!("{format}, {timer}"), |b| {
                    b.iter(|| {
                        i += 1;
                        admission_line(black_box(i));
                    })
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
