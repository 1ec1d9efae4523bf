//! What every sink adapter implements: [`SinkWriter`], the plain synchronous writer a
//! sink's drain hands its batches to. It knows nothing of queues, threads or formats.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use crate::domain::RunEvent;

/// Where a [`QueuedSink`](super::queue::QueuedSink) writes its events: plain synchronous calls, made by the sink's
/// drain only (a task for a writer that never blocks, a thread of its own for one that
/// does).
pub(crate) trait SinkWriter: Send + 'static {
    /// Writes (or buffers) `events`, in order.
    ///
    /// # Errors
    /// The I/O error that stopped the write; the events of this batch, and any the writer
    /// still buffered, are lost. The writer must accept the next batch (reopening what it
    /// writes to if it has to).
    fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()>;

    /// Writes out anything buffered so it reaches its destination.
    ///
    /// # Errors
    /// The I/O error that stopped the write; the buffered events are lost.
    fn flush(&mut self) -> io::Result<()>;

    /// For a writer that holds events it could not write yet (a network writer waiting
    /// for its server): how soon its drain should call [`SinkWriter::flush`] again when no
    /// new event arrives. `None` (the default): nothing is held.
    fn retry_in(&self) -> Option<Duration> {
        None
    }
}
