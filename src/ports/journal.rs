//! The RunJournal port: where the record of every run and its events is kept, so the
//! management API can answer for finished runs, across restarts when the storage is
//! durable.
//!
//! Writes arrive from the run service's relay path and must never wait: an implementation
//! queues them and writes them elsewhere. Reads come from the management API.

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::{
    AcceptedRun, Attempt, RunEvent, RunId, RunQuery, RunRecord, UsageQuery, UsageRow,
};

/// One thing to record about a run. Each run's entries arrive in order: accepted first,
/// then its placements and events; its terminal event last.
#[derive(Debug, Clone)]
pub enum JournalEntry {
    /// The run was accepted.
    Accepted(Box<AcceptedRun>),
    /// The run was sent to a node.
    Placed {
        /// The run.
        run_id: RunId,
        /// Where, why and when.
        attempt: Attempt,
    },
    /// Consecutive relayed events of one run (one or more), in relay order. A terminal
    /// event among them ends the run's record.
    Events {
        /// The run.
        run_id: RunId,
        /// The events, their positions consecutive.
        events: Vec<RelayedEvent>,
    },
}

/// One event as the relay handed it on.
#[derive(Debug, Clone)]
pub struct RelayedEvent {
    /// The event's position among the run's relayed events (0, 1, ...).
    pub index: u64,
    /// When it was relayed, in milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// The event, as the sinks received it.
    pub event: Arc<RunEvent>,
    /// Whether it is the run's first `output` (for time to first output).
    pub first_output: bool,
}

/// One stored event of a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// Its position among the run's relayed events.
    pub index: u64,
    /// The event as one JSON object, exactly the line the `file` sink writes for it
    /// (without the newline; the format is in docs/sinks.md).
    pub json: String,
}

/// Counters of a journal, for metrics and the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JournalStats {
    /// Entries written to storage.
    pub written: u64,
    /// Events left out because the run already had `max_events_per_run` stored.
    pub events_over_cap: u64,
    /// Events left out because the write queue was full.
    pub dropped_queue_full: u64,
    /// Events left out because the storage was at its size limit with nothing finished
    /// left to remove (records and terminal events are still written).
    pub dropped_over_budget: u64,
    /// Entries waiting to be written.
    pub queue_depth: u64,
    /// Transactions that failed (their entries are lost).
    pub write_errors: u64,
    /// Runs removed by retention.
    pub runs_expired: u64,
    /// The storage's size on disk in bytes (0 for none).
    pub bytes: u64,
}

/// Why a read failed. Messages say how, never with a secret.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The storage could not be read now (it could not be opened, was busy or locked, an
    /// I/O call failed, or the read was abandoned); asking again may succeed.
    #[error("the run journal cannot be read: {0}")]
    Unavailable(String),
    /// What the storage holds is damaged (a row that does not decode, a corrupt file);
    /// asking again will not help.
    #[error("the run journal holds damaged data: {0}")]
    Damaged(String),
}

/// Keeps run records and their events.
///
/// Implementations are shared between tasks. `record` is called on the relay's hot path
/// for every batch of every run's events: it must not block, and it documents what
/// happens when its queue is full. It should copy what it keeps of the events before it
/// returns rather than hold on to them, so their memory is freed on the relay's thread. Records (accepted, placed) and terminal events must never be dropped
/// for lack of room while the storage works.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait RunJournal: Send + Sync {
    /// Whether anything is kept; a disabled journal lets callers skip building entries.
    fn enabled(&self) -> bool;

    /// Accepts one entry without waiting.
    fn record(&self, entry: JournalEntry);

    /// Returns once every entry accepted before the call is in storage (or failed).
    async fn flush(&self);

    /// Whether what a [`RunJournal::flush`] returned for is where a takeover finds it, so a
    /// node may forget it: always, but on a member of a site that no longer writes the
    /// site's stream (it stood down, or was fenced) — what it flushed since stays in its own
    /// file only, and a node that forgot it would leave a run its client saw complete
    /// unknown to the member that takes over (found by the nemesis, issue 66).
    fn kept_for_takeover(&self) -> bool {
        true
    }

    /// Whether a run's end may be shown (to its caller and followers) only once a
    /// [`RunJournal::flush`] returned and the entries are [kept for a
    /// takeover](RunJournal::kept_for_takeover): on a member of a site, whose own file is
    /// not where the member that takes over looks — a run shown completed there, its end
    /// never in the site's stream, would be one the site forgot (found by the nemesis,
    /// issue 66). `false` by default: a single edge's file is where it takes runs back.
    fn shows_ends_once_kept(&self) -> bool {
        false
    }

    /// The runs an earlier edge left open (it stopped without ending them), handed over
    /// once: the caller takes them back or ends them, each with a terminal event recorded
    /// as usual. Empty for a journal that marks them ended when it opens, keeps nothing, or
    /// was asked before.
    fn take_left_open(&self) -> Vec<RunRecord> {
        Vec::new()
    }

    /// The record of run `id`, open or finished.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the storage cannot be read.
    async fn run(&self, id: &RunId) -> Result<Option<RunRecord>, JournalError>;

    /// The finished runs that match `query` (its `state` is ignored: open runs are the
    /// run service's to list), newest first, at most `query.limit`.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the storage cannot be read.
    async fn finished_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, JournalError>;

    /// Run `id`'s stored events from position `from` on, in order, at most `limit`.
    ///
    /// # Errors
    /// [`JournalError::Storage`] when the storage cannot be read.
    async fn events(
        &self,
        id: &RunId,
        from: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, JournalError>;

    /// The usage rollups `query` asks for, as of the last write (call [`Self::flush`]
    /// first to include every run ended before the call).
    ///
    /// # Errors
    /// [`JournalError`] when the storage cannot be read.
    async fn usage(&self, query: &UsageQuery) -> Result<Vec<UsageRow>, JournalError>;

    /// The journal's counters.
    fn stats(&self) -> JournalStats;

    /// Writes out everything accepted and stops the writer; entries recorded afterwards
    /// are dropped. Called once, as the edge stops.
    async fn close(&self);
}
