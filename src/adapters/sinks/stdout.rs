//! The stdout sink's writer (the console router): one readable text line, or one JSON line,
//! per event on standard output.
//!
//! Writes go through `std::io::stdout()` on the sink's own thread. A closed stdout (`EPIPE`;
//! Rust ignores `SIGPIPE`) is an ordinary write error: counted by the queue, never a panic.

use std::io::{self, Stdout};
use std::sync::Arc;

use super::lines::LineWriter;
use crate::adapters::event_format::LineFormat;

/// The writer putting events on standard output in `format`.
pub(crate) fn stdout_writer(format: LineFormat) -> LineWriter<Stdout> {
    LineWriter::new(format, io::stdout(), Arc::new(|| Ok(io::stdout())))
}

#[cfg(test)]
mod tests {
    use std::fs::{self, File, OpenOptions};

    use super::*;
    use crate::adapters::event_format::tests::{completed, output};
    use crate::adapters::sinks::queue::QueuedSink;
    use crate::adapters::sinks::queue::tests::settings;
    use crate::ports::EventSink;

    /// The console writer, writing to `/dev/full` instead of stdout (as a closed stdout
    /// would, it fails every write).
    fn full_console() -> LineWriter<File> {
        let open = || OpenOptions::new().write(true).open("/dev/full");
        LineWriter::new(LineFormat::Text, open().unwrap(), Arc::new(open))
    }

    #[tokio::test]
    async fn a_failing_stdout_counts_errors_and_keeps_accepting_events() {
        let sink = QueuedSink::on_thread("stdout", full_console(), settings(10)).unwrap();
        let stats = sink.stats();
        sink.publish(output("a"));
        sink.flush().await;
        assert_eq!(stats.write_errors(), 1);
        sink.publish(output("b"));
        sink.publish(completed());
        sink.flush().await;
        assert_eq!(stats.write_errors(), 2);
        assert_eq!(stats.queue_depth(), 0);
        assert_eq!(stats.dropped_queue_full(), 0);
    }

    #[tokio::test]
    async fn the_console_writer_writes_one_line_per_event() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("console.txt");
        let open = {
            let path = path.clone();
            move || OpenOptions::new().create(true).append(true).open(&path)
        };
        let writer = LineWriter::new(LineFormat::Text, open().unwrap(), Arc::new(open));
        let sink = QueuedSink::on_thread("stdout", writer, settings(10)).unwrap();
        sink.publish(output("hi\nthere"));
        sink.publish(completed());
        sink.flush().await;
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            "r1 node-a echo/m1 output hi\\nthere\n\
             r1 node-a echo/m1 completed finish_reason=stop input_tokens=5 output_tokens=7\n"
        );
    }

    #[tokio::test]
    async fn the_stdout_writer_builds_and_writes() {
        let sink =
            QueuedSink::on_thread("stdout", stdout_writer(LineFormat::Json), settings(10)).unwrap();
        sink.publish(completed());
        sink.flush().await;
        assert_eq!(sink.stats().written(), 1);
    }
}
