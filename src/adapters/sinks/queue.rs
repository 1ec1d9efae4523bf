//! The one queue every sink sits behind: [`QueuedSink`] accepts events without waiting,
//! holds them in a queue bounded for non-terminal events, and drains them in batches into a
//! [`SinkWriter`] — on a task of the edge's runtime, or on the sink's own thread for a
//! writer that blocks on I/O; [`SinkStats`] exposes its counters.
//!
//! Overflow policy: when `capacity` events wait unwritten, a new non-terminal event is
//! dropped and counted in `dropped_queue_full`; a terminal event is always admitted, so
//! every run still ends with exactly one terminal event in the sink. Memory therefore stays
//! below `capacity` plus one event per open run. Events count against the capacity until
//! they have been written, so a stalled writer fills the queue.
//!
//! This module must not know what a writer does with events (formatting, files, stdout):
//! that lives in the adapter modules beside it.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::domain::RunEvent;
use crate::ports::EventSink;

/// The most messages the drain task takes from the queue for one batch.
const MAX_BATCH: usize = 1_024;

/// How long a blocking writer's drain waits for more events after a batch that did not fill
/// [`MAX_BATCH`], on its own thread. Events then reach the writer up to this much later.
const LINGER: Duration = Duration::from_millis(1);

/// At most one warning per this long about a failing writer; the rest are counted.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// Where a [`QueuedSink`] writes its events; owned and driven by the sink's drain task.
pub(crate) trait SinkWriter: Send + 'static {
    /// Whether the writer blocks on I/O (files, standard output). Such a writer's drain runs
    /// on the sink's own thread, so neither its formatting nor its writes take time from the
    /// runtime's workers, which relay the events; others drain on a task of the runtime.
    const BLOCKS: bool = false;

    /// Writes (or buffers) `events`, in order.
    ///
    /// # Errors
    /// The I/O error that stopped the write; the events of this batch, and any the writer
    /// still buffered, are lost. The writer must accept the next batch (reopening what it
    /// writes to if it has to).
    fn write_batch(
        &mut self,
        events: &[Arc<RunEvent>],
    ) -> impl Future<Output = io::Result<()>> + Send;

    /// Writes out anything buffered so it reaches its destination.
    ///
    /// # Errors
    /// The I/O error that stopped the write; the buffered events are lost.
    fn flush(&mut self) -> impl Future<Output = io::Result<()>> + Send;
}

/// How a [`QueuedSink`] queues and flushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueSettings {
    /// Non-terminal events that may wait unwritten before new ones are dropped.
    pub capacity: usize,
    /// The writer is flushed whenever the queue runs empty, and at least this often.
    pub flush_interval: Duration,
}

/// The counters of one sink, shared by the sink and its drain task.
#[derive(Debug, Default)]
struct Counters {
    written: AtomicU64,
    dropped_queue_full: AtomicU64,
    write_errors: AtomicU64,
    queue_depth: AtomicUsize,
}

/// A cheap-to-clone, read-only view of one sink's counters, for metrics export.
#[derive(Debug, Clone, Default)]
pub struct SinkStats {
    counters: Arc<Counters>,
}

impl SinkStats {
    /// Events handed to the writer without error.
    pub fn written(&self) -> u64 {
        self.counters.written.load(Ordering::Relaxed)
    }

    /// Non-terminal events dropped because the queue was full.
    pub fn dropped_queue_full(&self) -> u64 {
        self.counters.dropped_queue_full.load(Ordering::Relaxed)
    }

    /// Writes and flushes that failed (each loses the events it carried).
    pub fn write_errors(&self) -> u64 {
        self.counters.write_errors.load(Ordering::Relaxed)
    }

    /// Events accepted but not yet written, now.
    pub fn queue_depth(&self) -> usize {
        self.counters.queue_depth.load(Ordering::Relaxed)
    }
}

/// What travels through a sink's queue.
enum Message {
    /// An event to write.
    Event(Arc<RunEvent>),
    /// Write and flush everything before this marker, then answer.
    Flush(oneshot::Sender<()>),
}

/// An [`EventSink`] that queues events and writes them with `W` on its own task.
///
/// The queue is an unbounded channel behind a depth gate: `publish` admits a non-terminal
/// event only while fewer than `capacity` events wait unwritten, and always admits terminal
/// events (see the module docs). The drain task ends, after writing and flushing what is
/// left, once the sink is dropped.
pub(crate) struct QueuedSink {
    name: &'static str,
    capacity: usize,
    sender: mpsc::UnboundedSender<Message>,
    stats: SinkStats,
}

impl QueuedSink {
    /// Starts the drain of `writer` (on `runtime`, or on a thread of its own when the
    /// writer blocks: [`SinkWriter::BLOCKS`]) and returns the sink feeding it.
    ///
    /// # Errors
    /// The thread of a blocking writer could not be started.
    pub(crate) fn spawn<W: SinkWriter>(
        name: &'static str,
        writer: W,
        settings: QueueSettings,
        runtime: &Handle,
    ) -> io::Result<Self> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let stats = SinkStats::default();
        let drain = Drain {
            name,
            writer,
            receiver,
            counters: Arc::clone(&stats.counters),
            flush_interval: settings.flush_interval,
            throttle: WarnThrottle::default(),
        };
        // Not joined: the drain ends by itself once `sender` (owned by this sink) is gone.
        if W::BLOCKS {
            // The drain needs no timer and no I/O driver: its writes are plain blocking calls.
            let own = tokio::runtime::Builder::new_current_thread().build()?;
            std::thread::Builder::new()
                .name(format!("edge-sink-{name}"))
                .spawn(move || own.block_on(drain.run()))?;
        } else {
            runtime.spawn(drain.run());
        }
        Ok(Self {
            name,
            capacity: settings.capacity,
            sender,
            stats,
        })
    }

    /// The sink's counters.
    pub(crate) fn stats(&self) -> SinkStats {
        self.stats.clone()
    }

    /// Reserves a place in the queue for one event, or says there is none.
    fn admit(&self, terminal: bool) -> bool {
        let depth = &self.stats.counters.queue_depth;
        if terminal {
            depth.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        depth
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| {
                (d < self.capacity).then_some(d + 1)
            })
            .is_ok()
    }
}

#[async_trait]
impl EventSink for QueuedSink {
    fn name(&self) -> &str {
        self.name
    }

    fn publish(&self, event: Arc<RunEvent>) {
        let counters = &self.stats.counters;
        if !self.admit(event.kind.is_terminal()) {
            counters.dropped_queue_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if self.sender.send(Message::Event(event)).is_err() {
            // The drain task is gone (it panicked): nothing can be written any more.
            counters.queue_depth.fetch_sub(1, Ordering::Relaxed);
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.sender.send(Message::Flush(done)).is_ok() {
            // An error means the drain task is gone; there is nothing left to wait for.
            let _ = written.await;
        }
    }
}

/// The drain task's state.
struct Drain<W> {
    name: &'static str,
    writer: W,
    receiver: mpsc::UnboundedReceiver<Message>,
    counters: Arc<Counters>,
    flush_interval: Duration,
    throttle: WarnThrottle,
}

impl<W: SinkWriter> Drain<W> {
    /// Drains the queue until every sender is gone, then writes and flushes the rest.
    async fn run(mut self) {
        let mut messages = Vec::with_capacity(MAX_BATCH);
        let mut batch: Vec<Arc<RunEvent>> = Vec::with_capacity(MAX_BATCH);
        let mut unflushed = false;
        let mut last_flush = Instant::now();
        while self.receiver.recv_many(&mut messages, MAX_BATCH).await > 0 {
            let full_batch = messages.len() == MAX_BATCH;
            for message in messages.drain(..) {
                match message {
                    Message::Event(event) => batch.push(event),
                    Message::Flush(done) => {
                        self.write(&mut batch).await;
                        self.flush().await;
                        unflushed = false;
                        last_flush = Instant::now();
                        // The caller may have stopped waiting; that is fine.
                        let _ = done.send(());
                    }
                }
            }
            if !batch.is_empty() {
                self.write(&mut batch).await;
                unflushed = true;
            }
            if unflushed
                && (self.receiver.is_empty() || last_flush.elapsed() >= self.flush_interval)
            {
                self.flush().await;
                unflushed = false;
                last_flush = Instant::now();
            }
            if W::BLOCKS && !full_batch {
                // The sink's own thread: let events gather rather than being woken (a
                // system call on the relaying thread) for every few of them.
                std::thread::sleep(LINGER);
            }
        }
        if unflushed {
            self.flush().await;
        }
    }

    /// Writes `batch` and empties it; the events leave the queue whatever the outcome.
    async fn write(&mut self, batch: &mut Vec<Arc<RunEvent>>) {
        if batch.is_empty() {
            return;
        }
        let result = self.writer.write_batch(batch).await;
        let count = batch.len();
        batch.clear();
        self.counters
            .queue_depth
            .fetch_sub(count, Ordering::Relaxed);
        match result {
            Ok(()) => {
                self.counters
                    .written
                    .fetch_add(count as u64, Ordering::Relaxed);
            }
            Err(error) => self.failed(&error),
        }
    }

    async fn flush(&mut self) {
        match self.writer.flush().await {
            Ok(()) => self.recovered(),
            Err(error) => self.failed(&error),
        }
    }

    fn failed(&mut self, error: &io::Error) {
        self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
        if let Some(suppressed) = self.throttle.on_error(Instant::now()) {
            tracing::warn!(
                sink = self.name,
                %error,
                suppressed,
                "event sink write failed; the events in that write are lost \
                 (further failures are counted and reported at most every 10 s)"
            );
        }
    }

    fn recovered(&mut self) {
        if let Some(suppressed) = self.throttle.on_success() {
            tracing::info!(
                sink = self.name,
                suppressed,
                "event sink writes again after failing"
            );
        }
    }
}

/// Rate-limits log records about a failing writer: at most one warning per [`WARN_EVERY`],
/// carrying the number of failures not reported since the last one, and at most one
/// "writes again" record per warning.
#[derive(Debug, Default)]
struct WarnThrottle {
    last_warning: Option<Instant>,
    suppressed: u64,
    warned: bool,
}

impl WarnThrottle {
    /// Records a failure at `now`; returns `Some(suppressed)` when it should be reported.
    fn on_error(&mut self, now: Instant) -> Option<u64> {
        match self.last_warning {
            Some(last) if now.saturating_duration_since(last) < WARN_EVERY => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last_warning = Some(now);
                self.warned = true;
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }

    /// Records a success; returns `Some(suppressed)` when it follows a reported failure
    /// (and reports the failures not reported since).
    fn on_success(&mut self) -> Option<u64> {
        if !std::mem::take(&mut self.warned) {
            return None;
        }
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Mutex;

    use tokio::sync::Semaphore;

    use super::*;
    use crate::adapters::sinks::format::tests::{completed, output};

    /// A writer that records what it wrote, optionally waiting for a permit per batch, and
    /// failing the batches it is told to fail.
    #[derive(Clone, Default)]
    pub(crate) struct Recorder {
        pub written: Arc<Mutex<Vec<Arc<RunEvent>>>>,
        pub flushes: Arc<AtomicUsize>,
        gate: Option<Arc<Semaphore>>,
        fail_next: Arc<AtomicUsize>,
    }

    impl Recorder {
        fn gated(gate: Arc<Semaphore>) -> Self {
            Self {
                gate: Some(gate),
                ..Self::default()
            }
        }

        pub(crate) fn texts(&self) -> Vec<String> {
            self.written
                .lock()
                .unwrap()
                .iter()
                .map(|event| match &event.kind {
                    crate::domain::RunEventKind::Output { text, .. } => text.clone(),
                    other => other.name().to_owned(),
                })
                .collect()
        }
    }

    impl SinkWriter for Recorder {
        async fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()> {
            if let Some(gate) = &self.gate {
                gate.acquire().await.unwrap().forget();
            }
            let fail = self
                .fail_next
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
                .is_ok();
            if fail {
                return Err(io::Error::other("injected failure"));
            }
            self.written.lock().unwrap().extend(events.iter().cloned());
            Ok(())
        }

        async fn flush(&mut self) -> io::Result<()> {
            self.flushes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    pub(crate) fn settings(capacity: usize) -> QueueSettings {
        QueueSettings {
            capacity,
            flush_interval: Duration::from_millis(200),
        }
    }

    fn spawn(writer: Recorder, capacity: usize) -> QueuedSink {
        QueuedSink::spawn("test", writer, settings(capacity), &Handle::current()).unwrap()
    }

    #[tokio::test]
    async fn flush_returns_after_every_accepted_event_is_written() {
        let writer = Recorder::default();
        let sink = spawn(writer.clone(), 100);
        for i in 0..50 {
            sink.publish(output(&i.to_string()));
        }
        sink.publish(completed());
        sink.flush().await;
        let mut expected: Vec<String> = (0..50).map(|i| i.to_string()).collect();
        expected.push("completed".into());
        assert_eq!(writer.texts(), expected);
        assert!(writer.flushes.load(Ordering::Relaxed) >= 1);
        let stats = sink.stats();
        assert_eq!(stats.written(), 51);
        assert_eq!(stats.queue_depth(), 0);
        assert_eq!(stats.dropped_queue_full(), 0);
        assert_eq!(stats.write_errors(), 0);
    }

    #[tokio::test]
    async fn a_full_queue_drops_exactly_the_excess_non_terminal_events() {
        let gate = Arc::new(Semaphore::new(0));
        let writer = Recorder::gated(Arc::clone(&gate));
        let sink = spawn(writer.clone(), 4);
        let stats = sink.stats();
        for i in 0..7 {
            sink.publish(output(&format!("o{i}")));
        }
        assert_eq!(stats.dropped_queue_full(), 3);
        assert_eq!(stats.queue_depth(), 4);
        // Terminal events are admitted over capacity.
        sink.publish(completed());
        sink.publish(completed());
        assert_eq!(stats.dropped_queue_full(), 3);
        assert_eq!(stats.queue_depth(), 6);
        sink.publish(output("late"));
        assert_eq!(stats.dropped_queue_full(), 4);

        gate.add_permits(1_000);
        sink.flush().await;
        assert_eq!(
            writer.texts(),
            ["o0", "o1", "o2", "o3", "completed", "completed"]
        );
        assert_eq!(stats.written(), 6);
        assert_eq!(stats.queue_depth(), 0);
        // Room again once written.
        sink.publish(output("again"));
        sink.flush().await;
        assert_eq!(writer.texts().last().map(String::as_str), Some("again"));
        assert_eq!(stats.dropped_queue_full(), 4);
    }

    #[tokio::test]
    async fn write_errors_are_counted_and_later_events_still_written() {
        let writer = Recorder::default();
        writer.fail_next.store(1, Ordering::Relaxed);
        let sink = spawn(writer.clone(), 10);
        sink.publish(output("lost"));
        sink.flush().await;
        sink.publish(output("kept"));
        sink.flush().await;
        let stats = sink.stats();
        assert_eq!(stats.write_errors(), 1);
        assert_eq!(stats.written(), 1);
        assert_eq!(stats.queue_depth(), 0);
        assert_eq!(writer.texts(), ["kept"]);
    }

    #[tokio::test]
    async fn the_drain_task_writes_the_rest_and_ends_when_the_sink_is_dropped() {
        let writer = Recorder::default();
        let sink = spawn(writer.clone(), 10);
        sink.publish(output("a"));
        sink.publish(completed());
        drop(sink);
        // The task owns the only other clone of `written`'s Arc: wait for it to go away.
        let ended = async {
            while Arc::strong_count(&writer.written) > 1 {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), ended)
            .await
            .expect("the drain task did not end");
        assert_eq!(writer.texts(), ["a", "completed"]);
        assert!(writer.flushes.load(Ordering::Relaxed) >= 1);
    }

    #[test]
    fn warnings_are_limited_to_one_per_window_with_the_suppressed_count() {
        let start = Instant::now();
        let mut throttle = WarnThrottle::default();
        assert_eq!(throttle.on_success(), None);
        assert_eq!(throttle.on_error(start), Some(0));
        assert_eq!(throttle.on_error(start + Duration::from_secs(1)), None);
        assert_eq!(throttle.on_error(start + Duration::from_secs(9)), None);
        assert_eq!(throttle.on_error(start + Duration::from_secs(10)), Some(2));
        assert_eq!(throttle.on_error(start + Duration::from_secs(11)), None);
        assert_eq!(throttle.on_success(), Some(1));
        assert_eq!(throttle.on_success(), None);
        // A failure inside the window is counted, not reported, and not followed by a
        // recovery record of its own.
        assert_eq!(throttle.on_error(start + Duration::from_secs(12)), None);
        assert_eq!(throttle.on_success(), None);
        assert_eq!(throttle.on_error(start + Duration::from_secs(20)), Some(1));
    }
}
