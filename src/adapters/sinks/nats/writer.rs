//! The NATS sink's writer: publishes each event, as the file sink's JSON line, on its
//! subject, and holds it until the server confirms it — a JetStream ack, or (core NATS)
//! the server's answer to a flush sent after it.
//!
//! It runs on the sink's own drain thread (`edge-sink-nats`) and blocks there on the
//! client's runtime, so the relay never waits for it. Events wait in a bounded backlog
//! while the server is unreachable or slow; an unconfirmed publish goes back to the front
//! of the backlog and is published again after a backoff (at least once: a consumer may
//! see an event twice, and JetStream drops the copy by its `Nats-Msg-Id` within the
//! stream's duplicate window). When the backlog is full the oldest non-terminal event is
//! dropped first, and counted; a terminal event only when none is left.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use async_nats::Client;
use async_nats::connection::State;
use async_nats::jetstream::context::PublishAckFuture;
use async_nats::jetstream::message::PublishMessage;
use bytes::Bytes;

use super::config::NatsSinkConfig;
use super::connect::NatsRuntime;
use super::stats::NatsStats;
use super::stream::Stream;
use super::subject::Subjects;
use crate::adapters::event_format::write_json_line;
use crate::adapters::sinks::writer::SinkWriter;
use crate::domain::{EdgeId, RunEvent};

/// The first wait before publishing again after a failure; it doubles up to the
/// configured reconnection maximum.
const FIRST_RETRY_DELAY: Duration = Duration::from_millis(100);

/// How often the drain looks at a held backlog while the client is not connected.
const DISCONNECTED_POLL: Duration = Duration::from_millis(20);

/// At most one warning per this long about dropped or unconfirmed events.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// A published event waiting for its confirmation.
struct InFlight {
    event: Arc<RunEvent>,
    /// JetStream's ack; `None` on core NATS, where a flush confirms.
    ack: Option<PublishAckFuture>,
}

/// The [`SinkWriter`] of the NATS sink.
pub(super) struct NatsWriter {
    runtime: NatsRuntime,
    client: Client,
    stream: Option<Stream>,
    subjects: Subjects,
    edge: EdgeId,
    ack_timeout: Duration,
    max_in_flight: usize,
    capacity: usize,
    max_retry_delay: Duration,
    backlog: VecDeque<Arc<RunEvent>>,
    in_flight: Vec<InFlight>,
    /// No publishing before this instant (after a failure).
    retry_at: Option<Instant>,
    retry_delay: Duration,
    last_warning: Option<Instant>,
    stats: NatsStats,
    line: Vec<u8>,
}

impl NatsWriter {
    pub(super) fn new(
        config: &NatsSinkConfig,
        edge: &EdgeId,
        runtime: NatsRuntime,
        client: Client,
        stats: NatsStats,
    ) -> Self {
        let subjects = Subjects::new(&config.subject_prefix, edge);
        let stream = config.jetstream.as_ref().map(|js| {
            let context = async_nats::jetstream::context::ContextBuilder::new()
                .timeout(config.ack_timeout())
                .max_ack_inflight(config.max_in_flight)
                .build(client.clone());
            Stream::new(context, js.clone(), subjects.wildcard())
        });
        Self {
            runtime,
            client,
            stream,
            subjects,
            edge: edge.clone(),
            ack_timeout: config.ack_timeout(),
            max_in_flight: config.max_in_flight,
            capacity: config.backlog_capacity,
            max_retry_delay: Duration::from_millis(config.reconnect_max_delay_ms),
            backlog: VecDeque::new(),
            in_flight: Vec::new(),
            retry_at: None,
            retry_delay: FIRST_RETRY_DELAY,
            last_warning: None,
            stats,
            line: Vec::with_capacity(512),
        }
    }

    /// Whether events may be published now: connected, past any backoff, and the stream
    /// (if any) is there.
    fn ready(&mut self) -> bool {
        if self.client.connection_state() != State::Connected {
            return false;
        }
        if self.retry_at.is_some_and(|at| Instant::now() < at) {
            return false;
        }
        let Some(stream) = &mut self.stream else {
            return true;
        };
        if stream.is_ready() {
            return true;
        }
        let handle = self.runtime.handle();
        match handle.block_on(stream.ensure(self.ack_timeout)) {
            Ok(()) => true,
            Err(error) => {
                self.failed(&format!("the JetStream stream is not there: {error}"));
                false
            }
        }
    }

    /// Publishes the backlog in order, confirming whenever `max_in_flight` events wait for
    /// it. Stops at the first publish that does not go through (it is tried again later).
    fn pump(&mut self) {
        if self.backlog.is_empty() || !self.ready() {
            return;
        }
        let handle = self.runtime.handle();
        if handle.block_on(self.publish_backlog()).is_err() {
            self.failed("a publish to the NATS server did not go through");
        }
    }

    /// Publishes until the backlog is empty, confirming whenever `max_in_flight` events
    /// are in flight. Each round of publishes may take up to the ack timeout (a publish
    /// waits only when the client's own buffer is full: the server is gone or slow); an
    /// event leaves the backlog only once its publish went through.
    async fn publish_backlog(&mut self) -> Result<(), ()> {
        while !self.backlog.is_empty() {
            if self.in_flight.len() >= self.max_in_flight {
                self.confirm_async().await;
                if self.retry_at.is_some_and(|at| Instant::now() < at) {
                    return Ok(());
                }
            }
            let room = self.max_in_flight - self.in_flight.len().min(self.max_in_flight);
            tokio::time::timeout(self.ack_timeout, self.publish_some(room.max(1)))
                .await
                .map_err(drop)
                .flatten()?;
        }
        Ok(())
    }

    /// Publishes up to `n` events from the front of the backlog.
    async fn publish_some(&mut self, n: usize) -> Result<(), ()> {
        for _ in 0..n {
            let Some(event) = self.backlog.front().cloned() else {
                break;
            };
            let ack = self.publish(&event).await?;
            self.backlog.pop_front();
            self.in_flight.push(InFlight { event, ack });
        }
        Ok(())
    }

    /// Publishes one event (left in the backlog on failure).
    async fn publish(&mut self, event: &RunEvent) -> Result<Option<PublishAckFuture>, ()> {
        let subject = self.subjects.of(event);
        self.line.clear();
        write_json_line(event, &mut self.line);
        let payload = Bytes::copy_from_slice(&self.line);
        match &self.stream {
            None => self
                .client
                .publish(subject, payload)
                .await
                .map(|()| None)
                .map_err(drop),
            Some(stream) => {
                let id = format!("{}.{}.{}", self.edge, event.run_id, event.seq);
                let message = PublishMessage::build().payload(payload).message_id(id);
                stream
                    .context()
                    .send_publish(subject, message)
                    .await
                    .map(Some)
                    .map_err(drop)
            }
        }
    }

    /// Waits for the confirmation of every event in flight; what is not confirmed goes
    /// back to the front of the backlog.
    fn confirm(&mut self) {
        if self.in_flight.is_empty() {
            return;
        }
        let handle = self.runtime.handle();
        handle.block_on(self.confirm_async());
    }

    async fn confirm_async(&mut self) {
        let in_flight = std::mem::take(&mut self.in_flight);
        let core_flushed = match self.stream {
            Some(_) => true,
            None => matches!(
                tokio::time::timeout(self.ack_timeout, self.client.flush()).await,
                Ok(Ok(()))
            ),
        };
        let mut failed = Vec::new();
        for InFlight { event, ack } in in_flight {
            let confirmed = match ack {
                Some(ack) => ack.await.is_ok(),
                None => core_flushed,
            };
            if confirmed {
                self.stats.counters.published.fetch_add(1, Relaxed);
            } else {
                failed.push(event);
            }
        }
        if failed.is_empty() {
            self.retry_delay = FIRST_RETRY_DELAY;
            return;
        }
        let count = failed.len() as u64;
        self.stats.counters.republished.fetch_add(count, Relaxed);
        for event in failed.into_iter().rev() {
            self.backlog.push_front(event);
        }
        self.failed("the server did not confirm some events; publishing them again");
    }

    /// Backs off before the next publish and warns (at most once per [`WARN_EVERY`]).
    fn failed(&mut self, what: &str) {
        self.retry_at = Some(Instant::now() + self.retry_delay);
        self.retry_delay = (self.retry_delay * 2).min(self.max_retry_delay);
        self.warn(what);
    }

    fn warn(&mut self, what: &str) {
        let now = Instant::now();
        if self
            .last_warning
            .is_some_and(|last| now.duration_since(last) < WARN_EVERY)
        {
            return;
        }
        self.last_warning = Some(now);
        tracing::warn!(
            sink = "nats",
            pending = self.backlog.len() + self.in_flight.len(),
            dropped = self.stats.dropped(),
            dropped_terminal = self.stats.dropped_terminal(),
            "{what}"
        );
    }

    /// Drops the oldest events beyond the backlog's capacity: non-terminal ones first.
    fn bound_backlog(&mut self) {
        let counters = &self.stats.counters;
        let mut dropped_any = false;
        while self.backlog.len() + self.in_flight.len() > self.capacity {
            let oldest_non_terminal = self.backlog.iter().position(|e| !e.kind.is_terminal());
            match oldest_non_terminal {
                Some(index) => {
                    self.backlog.remove(index);
                    counters.dropped.fetch_add(1, Relaxed);
                }
                None if self.backlog.pop_front().is_some() => {
                    counters.dropped_terminal.fetch_add(1, Relaxed);
                }
                None => break,
            }
            dropped_any = true;
        }
        if dropped_any {
            self.warn("the NATS backlog is full; dropping the oldest events");
        }
    }

    fn update_pending(&self) {
        let pending = self.backlog.len() + self.in_flight.len();
        self.stats.counters.pending.store(pending, Relaxed);
    }
}

impl SinkWriter for NatsWriter {
    fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()> {
        self.backlog.extend(events.iter().cloned());
        self.bound_backlog();
        self.pump();
        self.update_pending();
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.pump();
        self.confirm();
        self.update_pending();
        Ok(())
    }

    fn retry_in(&self) -> Option<Duration> {
        if self.backlog.is_empty() && self.in_flight.is_empty() {
            return None;
        }
        let until_retry = self
            .retry_at
            .map(|at| at.saturating_duration_since(Instant::now()));
        Some(
            until_retry
                .unwrap_or(DISCONNECTED_POLL)
                .max(Duration::from_millis(1)),
        )
    }
}

impl Drop for NatsWriter {
    fn drop(&mut self) {
        let (mut dropped, mut terminal) = (0, 0);
        let held = self.in_flight.drain(..).map(|f| f.event);
        for event in held.chain(self.backlog.drain(..)) {
            if event.kind.is_terminal() {
                terminal += 1;
            } else {
                dropped += 1;
            }
        }
        if dropped + terminal > 0 {
            let counters = &self.stats.counters;
            counters.dropped.fetch_add(dropped, Relaxed);
            counters.dropped_terminal.fetch_add(terminal, Relaxed);
            counters.pending.store(0, Relaxed);
            tracing::warn!(
                sink = "nats",
                dropped,
                dropped_terminal = terminal,
                "the edge stopped with events the NATS server had not confirmed"
            );
        }
    }
}
