//! The one queue every sink sits behind: [`QueuedSink`] accepts events without waiting,
//! holds them in a queue bounded for non-terminal events, and drains them in batches into a
//! [`SinkWriter`] — on a task of the edge's runtime ([`QueuedSink::on_task`]), or on a std
//! thread of its own for a writer that blocks on I/O ([`QueuedSink::on_thread`]);
//! [`SinkStats`] exposes its counters.
//!
//! Overflow policy: when `capacity` events wait unwritten, a new non-terminal event is
//! dropped and counted in `dropped_queue_full`; a terminal event is always admitted, so
//! every run still ends with exactly one terminal event in the sink. Memory therefore stays
//! below `capacity` plus one event per open run. Events count against the capacity until
//! they have been written, so a stalled writer fills the queue.
//!
//! The drain itself (batching, flushing, error reporting) is in `drain.rs`, the writer it
//! drains into in `writer.rs`, the counters both keep in `stats.rs`. None of them knows
//! what a writer does with events (formatting, files, stdout): that lives in the adapter
//! modules beside them.

use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

use super::drain::{Drain, Message};
use super::stats::SinkStats;
use super::writer::SinkWriter;
use crate::domain::RunEvent;
use crate::ports::EventSink;

/// How a [`QueuedSink`] queues and flushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueSettings {
    /// Non-terminal events that may wait unwritten before new ones are dropped.
    pub capacity: usize,
    /// The writer is flushed whenever the queue runs empty, and at least this often.
    pub flush_interval: Duration,
}

/// The drain of a sink: a task of the runtime or a thread of its own, joined on close.
enum Worker {
    Task(tokio::task::JoinHandle<()>),
    Thread(std::thread::JoinHandle<()>),
}

/// An [`EventSink`] that queues events and writes them with a [`SinkWriter`] on its drain.
///
/// The queue is an unbounded channel behind a depth gate: `publish` admits a non-terminal
/// event only while fewer than `capacity` events wait unwritten, and always admits terminal
/// events (see the module docs). The drain ends, after writing and flushing what is left,
/// on [`EventSink::close`] (which joins it) or once the sink is dropped.
pub(crate) struct QueuedSink {
    name: &'static str,
    capacity: usize,
    sender: mpsc::UnboundedSender<Message>,
    stats: SinkStats,
    /// Taken by `close`; never touched by `publish`.
    worker: Mutex<Option<Worker>>,
}

impl QueuedSink {
    /// Starts the drain of `writer`, which never blocks, as a task on `runtime`.
    pub(crate) fn on_task<W: SinkWriter>(
        name: &'static str,
        writer: W,
        settings: QueueSettings,
        runtime: &Handle,
    ) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let stats = SinkStats::default();
        let drain = Drain::new(
            name,
            writer,
            Arc::clone(&stats.counters),
            settings.flush_interval,
        );
        let task = runtime.spawn(drain.run_on_task(receiver));
        Self::new(name, settings, sender, stats, Worker::Task(task))
    }

    /// Starts the drain of `writer`, whose writes block on I/O, on a std thread of its own
    /// (`edge-sink-<name>`), so neither its formatting nor its writes take time from the
    /// runtime's workers, which relay the events.
    ///
    /// # Errors
    /// The thread could not be started.
    pub(crate) fn on_thread<W: SinkWriter>(
        name: &'static str,
        writer: W,
        settings: QueueSettings,
    ) -> io::Result<Self> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let stats = SinkStats::default();
        let drain = Drain::new(
            name,
            writer,
            Arc::clone(&stats.counters),
            settings.flush_interval,
        );
        let thread = std::thread::Builder::new()
            .name(format!("edge-sink-{name}"))
            .spawn(move || drain.run_on_thread(receiver))?;
        Ok(Self::new(
            name,
            settings,
            sender,
            stats,
            Worker::Thread(thread),
        ))
    }

    fn new(
        name: &'static str,
        settings: QueueSettings,
        sender: mpsc::UnboundedSender<Message>,
        stats: SinkStats,
        worker: Worker,
    ) -> Self {
        Self {
            name,
            capacity: settings.capacity,
            sender,
            stats,
            worker: Mutex::new(Some(worker)),
        }
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

    /// Sends a marker the drain answers once it has written and flushed what came before;
    /// returns when it has (or at once when the drain is gone).
    async fn marker(&self, message: fn(oneshot::Sender<()>) -> Message) {
        let (done, written) = oneshot::channel();
        if self.sender.send(message(done)).is_ok() {
            // An error means the drain is gone; there is nothing left to wait for.
            let _ = written.await;
        }
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
            // The drain is gone (closed, or it panicked): nothing can be written any more.
            counters.queue_depth.fetch_sub(1, Ordering::Relaxed);
            counters.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn flush(&self) {
        self.marker(Message::Flush).await;
    }

    async fn close(&self) {
        self.marker(Message::Close).await;
        let worker = self
            .worker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        // The drain has answered the close and is returning: the joins are immediate.
        match worker {
            Some(Worker::Task(task)) => {
                let _ = task.await;
            }
            Some(Worker::Thread(thread)) => {
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
            None => {}
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::Condvar;
    use std::sync::atomic::AtomicUsize;

    use super::*;
    use crate::adapters::event_format::tests::{completed, output};

    /// A writer that records what it wrote, optionally waiting for a permit per batch, and
    /// failing the batches it is told to fail.
    #[derive(Clone, Default)]
    pub(crate) struct Recorder {
        pub written: Arc<Mutex<Vec<Arc<RunEvent>>>>,
        pub flushes: Arc<AtomicUsize>,
        gate: Option<Gate>,
        fail_next: Arc<AtomicUsize>,
    }

    /// Permits a blocking writer waits for, one per batch.
    #[derive(Clone, Default)]
    struct Gate(Arc<(Mutex<usize>, Condvar)>);

    impl Gate {
        fn add_permits(&self, n: usize) {
            let (permits, added) = &*self.0;
            *permits.lock().unwrap() += n;
            added.notify_all();
        }

        fn acquire(&self) {
            let (permits, added) = &*self.0;
            let mut permits = added
                .wait_while(permits.lock().unwrap(), |permits| *permits == 0)
                .unwrap();
            *permits -= 1;
        }
    }

    impl Recorder {
        fn gated(gate: Gate) -> Self {
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
        fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()> {
            if let Some(gate) = &self.gate {
                gate.acquire();
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

        fn flush(&mut self) -> io::Result<()> {
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
        QueuedSink::on_task("test", writer, settings(capacity), &Handle::current())
    }

    /// The drain on a thread of its own, where a writer may block.
    fn spawn_thread(writer: Recorder, capacity: usize) -> QueuedSink {
        QueuedSink::on_thread("test", writer, settings(capacity)).unwrap()
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
        let gate = Gate::default();
        let writer = Recorder::gated(gate.clone());
        let sink = spawn_thread(writer.clone(), 4);
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn close_writes_the_rest_and_joins_the_drain() {
        for on_thread in [false, true] {
            let writer = Recorder::default();
            let sink = if on_thread {
                spawn_thread(writer.clone(), 10)
            } else {
                spawn(writer.clone(), 10)
            };
            sink.publish(output("a"));
            sink.publish(completed());
            sink.close().await;
            // Joined: the drain dropped its writer, the only other clone of `written`.
            assert_eq!(Arc::strong_count(&writer.written), 1, "thread: {on_thread}");
            assert_eq!(writer.texts(), ["a", "completed"]);
            assert!(writer.flushes.load(Ordering::Relaxed) >= 1);
            // Nothing is written after the close; what comes is counted as lost.
            sink.publish(completed());
            let stats = sink.stats();
            assert_eq!(stats.write_errors(), 1);
            assert_eq!(stats.queue_depth(), 0);
            sink.flush().await;
            sink.close().await;
        }
    }
}
