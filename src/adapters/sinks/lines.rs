//! The line writer behind the stdout and file sinks: formats each batch into one reused
//! buffer and writes that buffer to a blocking `std::io::Write`. It blocks, so its sink
//! drains it on a thread of its own (`QueuedSink::on_thread`), never on the runtime's
//! worker threads.
//!
//! After a failed write it drops its handle and the buffered lines, and opens a fresh
//! handle for the next write, so a sink recovers by itself once its destination is writable
//! again. It does not decide when to flush: the queue's drain task does.

use std::io::{self, Write};
use std::sync::Arc;

use crate::domain::RunEvent;

use super::writer::SinkWriter;
use crate::adapters::event_format::LineFormat;
use crate::adapters::event_format::write_line;

/// Buffered bytes beyond which a batch is written out without waiting for a flush.
const HIGH_WATER: usize = 128 * 1024;

/// A buffer that grew beyond this (a huge event) is given back rather than kept.
const MAX_RETAINED: usize = 4 * 1024 * 1024;

/// Opens (or reopens) the destination; runs on the sink's thread.
pub(crate) type Opener<O> = Arc<dyn Fn() -> io::Result<O> + Send + Sync>;

/// A [`SinkWriter`] that writes events as lines in one [`LineFormat`] to `O`.
pub(crate) struct LineWriter<O> {
    format: LineFormat,
    open: Opener<O>,
    /// `None` after an error, until the next write reopens it.
    out: Option<O>,
    buf: Vec<u8>,
    /// A failed write stopped inside a line: start the next write on a fresh line.
    broken_line: bool,
}

/// What a write gives back.
struct Written<O> {
    out: Option<O>,
    result: io::Result<()>,
    broken_line: bool,
}

impl<O: Write + Send + 'static> LineWriter<O> {
    /// A writer starting with the already open `out`, reopening with `open` after errors.
    pub(crate) fn new(format: LineFormat, out: O, open: Opener<O>) -> Self {
        Self {
            format,
            open,
            out: Some(out),
            buf: Vec::with_capacity(HIGH_WATER),
            broken_line: false,
        }
    }

    /// Writes the buffer out (and flushes `O` when `flush`), reopening `O` if needed.
    fn write_out(&mut self, flush: bool) -> io::Result<()> {
        if self.buf.is_empty() && (!flush || self.out.is_none()) {
            return Ok(());
        }
        if self.broken_line && !self.buf.is_empty() {
            self.buf.insert(0, b'\n');
        }
        let Written {
            out,
            result,
            broken_line,
        } = write_blocking(
            self.out.take(),
            &self.buf,
            &*self.open,
            flush,
            self.broken_line,
        );
        self.buf.clear();
        if self.buf.capacity() > MAX_RETAINED {
            self.buf = Vec::with_capacity(HIGH_WATER);
        }
        // On error `out` is `None`: the next write reopens.
        self.out = out;
        self.broken_line = broken_line;
        result
    }
}

/// Writes `buf` to `out` (opened with `open` when `None`). Gives the handle back only when
/// everything succeeded.
fn write_blocking<O: Write>(
    out: Option<O>,
    buf: &[u8],
    open: &dyn Fn() -> io::Result<O>,
    flush: bool,
    broken_line: bool,
) -> Written<O> {
    let mut out = match out.map_or_else(open, Ok) {
        Ok(out) => out,
        Err(error) => {
            return Written {
                out: None,
                result: Err(error),
                broken_line,
            };
        }
    };
    let mut done = 0;
    let mut result = Ok(());
    while done < buf.len() {
        match out.write(&buf[done..]) {
            Ok(0) => {
                result = Err(io::ErrorKind::WriteZero.into());
                break;
            }
            Ok(n) => done += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => {
                result = Err(error);
                break;
            }
        }
    }
    if result.is_ok() && flush {
        result = out.flush();
    }
    let broken_line = match done {
        0 => broken_line,
        n => buf[n - 1] != b'\n',
    };
    Written {
        out: result.is_ok().then_some(out),
        result,
        broken_line,
    }
}

impl<O: Write + Send + 'static> SinkWriter for LineWriter<O> {
    fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()> {
        for event in events {
            write_line(self.format, event, &mut self.buf);
        }
        if self.buf.len() >= HIGH_WATER {
            self.write_out(false)
        } else {
            Ok(())
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        self.write_out(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts `limit` bytes, then fails every write.
    struct Limited {
        accepted: Vec<u8>,
        limit: usize,
    }

    impl Write for Limited {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let room = self.limit - self.accepted.len();
            if room == 0 {
                return Err(io::ErrorKind::StorageFull.into());
            }
            let n = room.min(buf.len());
            self.accepted.extend_from_slice(&buf[..n]);
            Ok(n)
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_stopped_mid_line_is_reported_as_a_broken_line() {
        let never: &dyn Fn() -> io::Result<Limited> = &|| Err(io::ErrorKind::NotFound.into());
        let out = Limited {
            accepted: Vec::new(),
            limit: 5,
        };
        let written = write_blocking(Some(out), b"abc\ndef\n", never, true, false);
        assert!(written.result.is_err());
        assert!(written.out.is_none());
        assert!(written.broken_line);

        let out = Limited {
            accepted: Vec::new(),
            limit: 4,
        };
        let written = write_blocking(Some(out), b"abc\n", never, true, false);
        assert!(written.result.is_ok());
        assert!(!written.broken_line);
    }
}
