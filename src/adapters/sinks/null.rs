//! The null sink's writer: discards every event (the queue still counts them as written),
//! for benchmarks and for running without sinks.

use std::io;
use std::sync::Arc;

use crate::domain::RunEvent;

use super::writer::SinkWriter;

/// A [`SinkWriter`] that discards events.
#[derive(Debug, Default)]
pub(crate) struct NullWriter;

impl SinkWriter for NullWriter {
    fn write_batch(&mut self, _events: &[Arc<RunEvent>]) -> io::Result<()> {
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use tokio::runtime::Handle;

    use super::*;
    use crate::adapters::event_format::tests::{completed, output};
    use crate::adapters::sinks::queue::QueuedSink;
    use crate::adapters::sinks::queue::tests::settings;
    use crate::ports::EventSink;

    #[tokio::test]
    async fn discards_and_counts_events() {
        let sink = QueuedSink::on_task("null", NullWriter, settings(10), &Handle::current());
        for i in 0..5 {
            sink.publish(output(&i.to_string()));
        }
        sink.publish(completed());
        sink.flush().await;
        let stats = sink.stats();
        assert_eq!(stats.written(), 6);
        assert_eq!(stats.queue_depth(), 0);
    }
}
