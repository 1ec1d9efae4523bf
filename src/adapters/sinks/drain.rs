//! The drain of a sink's queue: takes the queued messages in batches, writes the events
//! with the sink's [`SinkWriter`], flushes when the queue runs empty or the flush interval
//! passes, answers flush and close markers, and reports failing writes at most once per
//! [`WARN_EVERY`]. [`Drain::run_on_task`] and [`Drain::run_on_thread`] differ only in how
//! they wait for messages; everything else is plain synchronous code.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::stats::Counters;
use super::writer::SinkWriter;
use crate::domain::RunEvent;

/// The most messages the drain takes from the queue for one batch.
const MAX_BATCH: usize = 1_024;

/// How long a drain on its own thread waits for more events after a batch that did not
/// fill [`MAX_BATCH`]. Events then reach the writer up to this much later.
const LINGER: Duration = Duration::from_millis(1);

/// How long after a batch a drain on its own thread keeps looking for messages (every
/// [`LINGER`]) before it sleeps until one wakes it: while events keep coming, the relay
/// never has to wake it (a system call on the relay's path, and a thread woken on the
/// core the engine or the caller may need).
const UNWOKEN: Duration = Duration::from_millis(10);

/// How often a drain whose writer holds events looks for new messages while it waits to
/// retry them.
const RETRY_POLL: Duration = Duration::from_millis(5);

/// At most one warning per this long about a failing writer; the rest are counted.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// What travels through a sink's queue.
pub(super) enum Message {
    /// An event to write.
    Event(Arc<RunEvent>),
    /// Write and flush everything before this marker, then answer.
    Flush(oneshot::Sender<()>),
    /// Write and flush everything before this marker, answer, and end the drain.
    Close(oneshot::Sender<()>),
}

/// The drain's state: the writer, the batch being written, and when it last flushed. Its
/// methods are plain synchronous calls; [`Drain::run_on_task`] and
/// [`Drain::run_on_thread`] only differ in how they wait for messages.
pub(super) struct Drain<W> {
    name: &'static str,
    writer: W,
    counters: Arc<Counters>,
    flush_interval: Duration,
    throttle: WarnThrottle,
    batch: Vec<Arc<RunEvent>>,
    unflushed: bool,
    last_flush: Instant,
}

impl<W: SinkWriter> Drain<W> {
    /// A drain writing with `writer`, counting into `counters`, flushing at least every
    /// `flush_interval`.
    pub(super) fn new(
        name: &'static str,
        writer: W,
        counters: Arc<Counters>,
        flush_interval: Duration,
    ) -> Self {
        Self {
            name,
            writer,
            counters,
            flush_interval,
            throttle: WarnThrottle::default(),
            batch: Vec::with_capacity(MAX_BATCH),
            unflushed: false,
            last_flush: Instant::now(),
        }
    }

    /// Drains the queue on a task until it is closed or every sender is gone.
    pub(super) async fn run_on_task(mut self, mut receiver: mpsc::UnboundedReceiver<Message>) {
        let mut messages = Vec::with_capacity(MAX_BATCH);
        while receiver.recv_many(&mut messages, MAX_BATCH).await > 0 {
            if let Some(closed) = self.take(&mut messages, &receiver) {
                self.end(receiver, closed);
                return;
            }
        }
        self.finish();
    }

    /// Drains the queue on the sink's own thread until it is closed or every sender is
    /// gone; after a batch that did not fill, lingers so that it is not woken (a system
    /// call on the relaying thread) for every few events.
    pub(super) fn run_on_thread(mut self, mut receiver: mpsc::UnboundedReceiver<Message>) {
        let mut messages = Vec::with_capacity(MAX_BATCH);
        while let Some(first) = self.next_on_thread(&mut receiver) {
            messages.push(first);
            while messages.len() < MAX_BATCH {
                match receiver.try_recv() {
                    Ok(message) => messages.push(message),
                    Err(_) => break,
                }
            }
            let full_batch = messages.len() == MAX_BATCH;
            if let Some(closed) = self.take(&mut messages, &receiver) {
                self.end(receiver, closed);
                return;
            }
            if !full_batch {
                std::thread::sleep(LINGER);
            }
        }
        self.finish();
    }

    /// Waits for the next message on the drain's thread. While the writer holds events it
    /// could not write yet, it is flushed again whenever it asks to be
    /// ([`SinkWriter::retry_in`]) and no message came in the meantime.
    fn next_on_thread(
        &mut self,
        receiver: &mut mpsc::UnboundedReceiver<Message>,
    ) -> Option<Message> {
        loop {
            let Some(wait) = self.writer.retry_in() else {
                return Self::look_then_park(receiver);
            };
            let until = std::time::Instant::now() + wait;
            loop {
                match receiver.try_recv() {
                    Ok(message) => return Some(message),
                    Err(mpsc::error::TryRecvError::Disconnected) => return None,
                    Err(mpsc::error::TryRecvError::Empty) => {}
                }
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(RETRY_POLL));
            }
            self.flush();
        }
    }

    /// The next message: looked for every [`LINGER`] for [`UNWOKEN`], then waited for.
    fn look_then_park(receiver: &mut mpsc::UnboundedReceiver<Message>) -> Option<Message> {
        let until = std::time::Instant::now() + UNWOKEN;
        while std::time::Instant::now() < until {
            match receiver.try_recv() {
                Ok(message) => return Some(message),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(LINGER),
            }
        }
        receiver.blocking_recv()
    }

    /// Handles one batch of messages in order: writes the events, answers flushes, and
    /// flushes when the queue ran empty or the flush interval passed. Returns the answer
    /// of a close, after which the drain ends; anything behind a close is lost.
    fn take(
        &mut self,
        messages: &mut Vec<Message>,
        receiver: &mpsc::UnboundedReceiver<Message>,
    ) -> Option<oneshot::Sender<()>> {
        let mut closed = None;
        for message in messages.drain(..) {
            match (message, closed.is_some()) {
                (Message::Event(event), false) => self.batch.push(event),
                (Message::Flush(done), false) => {
                    self.write();
                    self.flush();
                    // The caller may have stopped waiting; that is fine.
                    let _ = done.send(());
                }
                (Message::Close(done), false) => closed = Some(done),
                (message, true) => self.lose(message),
            }
        }
        if !self.batch.is_empty() {
            self.write();
            self.unflushed = true;
        }
        let due = receiver.is_empty() || self.last_flush.elapsed() >= self.flush_interval;
        if self.unflushed && (due || closed.is_some()) {
            self.flush();
        }
        closed
    }

    /// Ends the drain after a close: whatever is still queued is lost, then the close is
    /// answered.
    fn end(mut self, mut receiver: mpsc::UnboundedReceiver<Message>, closed: oneshot::Sender<()>) {
        receiver.close();
        while let Ok(message) = receiver.try_recv() {
            self.lose(message);
        }
        let _ = closed.send(());
    }

    /// Flushes what is unflushed once the queue's senders are all gone.
    fn finish(&mut self) {
        if self.unflushed {
            self.flush();
        }
    }

    /// Drops a message that came after a close; an event counts as a lost write.
    fn lose(&mut self, message: Message) {
        if let Message::Event(_) = message {
            self.counters.queue_depth.fetch_sub(1, Ordering::Relaxed);
            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Writes the batch and empties it; the events leave the queue whatever the outcome.
    fn write(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let result = self.writer.write_batch(&self.batch);
        let count = self.batch.len();
        self.batch.clear();
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

    fn flush(&mut self) {
        match self.writer.flush() {
            Ok(()) => self.recovered(),
            Err(error) => self.failed(&error),
        }
        self.unflushed = false;
        self.last_flush = Instant::now();
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
mod tests {
    use super::*;

    #[test]
    fn the_drain_takes_what_comes_while_it_looks_or_sleeps_and_stops_when_senders_go() {
        type Looker = Drain<super::super::queue::tests::Recorder>;
        let (sender, mut receiver) = mpsc::unbounded_channel();
        sender
            .send(Message::Flush(oneshot::channel().0))
            .expect("sent");
        assert!(matches!(
            Looker::look_then_park(&mut receiver),
            Some(Message::Flush(_))
        ));
        // Sent from another thread while the drain looks (or, later, sleeps).
        let late = std::thread::spawn({
            let sender = sender.clone();
            move || {
                sender
                    .send(Message::Flush(oneshot::channel().0))
                    .expect("sent")
            }
        });
        assert!(Looker::look_then_park(&mut receiver).is_some());
        late.join().expect("sender");
        drop(sender);
        assert!(Looker::look_then_park(&mut receiver).is_none());
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
