//! Log output that costs a request one short memory copy: lines are appended to a shared buffer,
//! which a writer thread hands to the output every [`FLUSH_EVERY`], in one write.
//!
//! The webhook logs one line per admission (the audit trail operators grep for). Written inline,
//! each line is a `write(2)` on the request's thread; through a channel to a writer thread
//! (`tracing-appender`), each is an allocation, a channel send and, mostly, a wake-up of that
//! thread. On a small machine serving tens of thousands of admissions a second, either costs more
//! than the admission itself. Here the writer thread sleeps for the interval and writes whatever
//! accumulated.
//!
//! Nothing is dropped: when the buffer reaches [`MAX_BUFFERED`] (the output is slower than the
//! admissions) the request that fills it writes the buffer out itself, so the webhook slows down
//! rather than losing lines or growing without bound. Warnings and errors are written at once,
//! with everything before them. Dropping the [`FlushGuard`] writes the rest.

use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// How long a line may wait in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(50);

/// Bytes buffered before a request writes them out itself.
pub const MAX_BUFFERED: usize = 1 << 20;

struct Shared {
    buf: Mutex<Vec<u8>>,
    /// Held while writing, so that buffers reach the output in the order they were taken; with it
    /// the empty buffer that is swapped in for the full one, so that neither is freed and grown
    /// again at every flush.
    out: Mutex<Output>,
    stop: AtomicBool,
}

struct Output {
    to: Box<dyn Write + Send>,
    spare: Vec<u8>,
}

fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn flush(&self) -> io::Result<()> {
        let mut out = lock(&self.out);
        let out = &mut *out;
        std::mem::swap(&mut *lock(&self.buf), &mut out.spare);
        if out.spare.is_empty() {
            return Ok(());
        }
        let r = out.to.write_all(&out.spare).and_then(|()| out.to.flush());
        out.spare.clear();
        // A buffer grown by a burst is not kept at that size.
        out.spare.shrink_to(MAX_BUFFERED);
        r
    }
}

/// A [`MakeWriter`] for `tracing_subscriber::fmt` that buffers lines (see the module documentation).
#[derive(Clone)]
pub struct BatchedWriter {
    shared: Arc<Shared>,
}

/// Keeps the writer thread running; dropping it stops the thread and writes what is buffered.
pub struct FlushGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl BatchedWriter {
    /// A writer to `out`, flushed every `every` by a thread of its own.
    pub fn new(out: impl Write + Send + 'static, every: Duration) -> (BatchedWriter, FlushGuard) {
        let shared = Arc::new(Shared {
            buf: Mutex::new(Vec::new()),
            out: Mutex::new(Output {
                to: Box::new(out),
                spare: Vec::new(),
            }),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || loop {
                std::thread::park_timeout(every);
                let stop = s.stop.load(Ordering::Acquire);
                // A write error (a closed stderr) has nowhere to be reported; the lines are gone.
                let _ = s.flush();
                if stop {
                    break;
                }
            })
            .ok();
        (
            BatchedWriter {
                shared: shared.clone(),
            },
            FlushGuard { shared, thread },
        )
    }
}

impl Drop for FlushGuard {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        match self.thread.take() {
            Some(t) => {
                t.thread().unpark();
                let _ = t.join();
            }
            None => {
                let _ = self.shared.flush();
            }
        }
    }
}

/// One event's writer.
pub struct LineWriter<'a> {
    shared: &'a Shared,
    urgent: bool,
}

impl Write for LineWriter<'_> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let full = {
            let mut buf = lock(&self.shared.buf);
            buf.extend_from_slice(b);
            buf.len() >= MAX_BUFFERED
        };
        if full {
            self.shared.flush()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter<'_> {
    fn drop(&mut self) {
        if self.urgent {
            let _ = self.shared.flush();
        }
    }
}

impl<'a> MakeWriter<'a> for BatchedWriter {
    type Writer = LineWriter<'a>;

    fn make_writer(&'a self) -> LineWriter<'a> {
        LineWriter {
            shared: &self.shared,
            urgent: false,
        }
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter<'a> {
        LineWriter {
            shared: &self.shared,
            urgent: *meta.level() <= Level::WARN,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::time::Instant;

    /// An output that records what reached it, and in how many writes.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(b);
            s.1 += 1;
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn text(s: &Sink) -> String {
        String::from_utf8(s.0.lock().unwrap().0.clone()).unwrap()
    }

    #[test]
    fn lines_arrive_in_order_in_few_writes_and_nothing_is_lost() {
        let sink = Sink::default();
        let (w, guard) = BatchedWriter::new(sink.clone(), Duration::from_millis(20));
        for i in 0..1000 {
            writeln!(w.make_writer(), "line {i}").unwrap();
        }
        // The writer thread delivers without being asked.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !text(&sink).contains("line 999\n") {
            assert!(Instant::now() < deadline, "not flushed: {:?}", text(&sink));
            std::thread::sleep(Duration::from_millis(5));
        }
        let writes = sink.0.lock().unwrap().1;
        assert!(writes < 100, "{writes} writes for 1000 lines");
        writeln!(w.make_writer(), "last").unwrap();
        drop(guard);
        let expected: String = (0..1000).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text(&sink), expected + "last\n");
    }

    #[test]
    fn warnings_and_a_full_buffer_are_written_at_once() {
        let sink = Sink::default();
        // An interval far longer than the test: only the two rules below can write.
        let (w, _guard) = BatchedWriter::new(sink.clone(), Duration::from_secs(3600));
        writeln!(w.make_writer(), "info").unwrap();
        {
            let mut urgent = LineWriter {
                shared: &w.shared,
                urgent: true,
            };
            writeln!(urgent, "warn").unwrap();
        }
        assert_eq!(text(&sink), "info\nwarn\n");
        let big = vec![b'x'; MAX_BUFFERED];
        w.make_writer().write_all(&big).unwrap();
        assert_eq!(
            sink.0.lock().unwrap().0.len(),
            "info\nwarn\n".len() + MAX_BUFFERED
        );
    }
}
