//! The record of one run as the management API and the run journal show it: where it went,
//! when each step happened, how it ended — never its input or a secret.
//!
//! Pure data and rules: times are milliseconds since the Unix epoch, passed in by callers
//! (nothing here reads a clock), and [`RunQuery`] decides which records a listing shows and
//! in which order, so the live runs and the journal's finished runs page the same way.

use std::fmt;

use super::event::{EDGE_CRASHED, RunEventKind, RunId};
use super::names::{AdapterName, NodeId, Target};
use super::operation::Operation;
use super::routing::KeySource;
use super::usage::Usage;

/// How a run ended, or that it has not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunOutcome {
    /// Accepted and not ended yet.
    Open,
    /// Ended with `completed`.
    Completed,
    /// Ended with `failed`.
    Failed,
    /// Ended with `cancelled`.
    Cancelled,
    /// The edge stopped (crashed, was killed) while the run was open: how it ended is not
    /// known. Never shown as completed.
    Unknown,
}

impl RunOutcome {
    /// Every outcome, in the order the API documents them.
    pub const ALL: [RunOutcome; 5] = [
        Self::Open,
        Self::Completed,
        Self::Failed,
        Self::Cancelled,
        Self::Unknown,
    ];

    /// The stable snake_case name used in the API and the journal.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
            Self::Unknown => "unknown",
        }
    }

    /// The outcome named `name`, if any.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == name)
    }

    /// The outcome a terminal event gives; `None` for a non-terminal one. A failure with
    /// code [`EDGE_CRASHED`] (a run an edge left open that no node took back) is `unknown`.
    pub fn of_event(kind: &RunEventKind) -> Option<Self> {
        match kind {
            RunEventKind::Completed { .. } => Some(Self::Completed),
            RunEventKind::Failed { code, .. } if code == EDGE_CRASHED => Some(Self::Unknown),
            RunEventKind::Failed { .. } => Some(Self::Failed),
            RunEventKind::Cancelled { .. } => Some(Self::Cancelled),
            RunEventKind::Started | RunEventKind::Output { .. } => None,
        }
    }

    /// Whether the run has ended (or is known never to end here).
    pub fn is_finished(self) -> bool {
        self != Self::Open
    }
}

impl fmt::Display for RunOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// One placement of a run on a node. Without failover a run has at most one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// 1 for the first placement, 2 for the first retry, ...
    pub number: u32,
    /// The node it was sent to.
    pub node: NodeId,
    /// Why that node (`pinned`, `least_busy`, ...).
    pub route_reason: String,
    /// When it was sent to the node.
    pub started_ms: u64,
}

/// What the edge knows about a run when it accepts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcceptedRun {
    /// The run.
    pub run_id: RunId,
    /// Its adapter.
    pub adapter: AdapterName,
    /// Its target.
    pub target: Target,
    /// What kind of work it is.
    pub operation: Operation,
    /// The node id or alias it was pinned to, if any.
    pub pin: Option<String>,
    /// The name of the API key the caller used, when the API set one (never the key).
    pub api_key_name: Option<String>,
    /// When it was accepted (and queued, if it had to wait).
    pub queued_ms: u64,
    /// When its deadline passes, in milliseconds since the Unix epoch; `None` without one.
    /// Kept so a run taken back after an edge restart keeps its deadline.
    pub deadline_ms: Option<u64>,
    /// What the caller's API needs to render the run's client stream again
    /// ([`super::RunRouting::client_stream`]); `None` for runs whose stream cannot be resumed.
    pub client_stream: Option<String>,
    /// Where its affinity key came from (`None`: it had none), for the usage rollups.
    pub affinity: Option<KeySource>,
    /// The tokens admission reserved of its key's budget (`None`: the key has none), so
    /// whoever takes the open run back (an edge restarted on its journal, a member taking
    /// its site over) reserves them again until the run ends.
    pub budget_reserve: Option<u64>,
}

/// Everything recorded about a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRecord {
    /// What was known at acceptance.
    pub accepted: AcceptedRun,
    /// Its placements, in order.
    pub attempts: Vec<Attempt>,
    /// When its first output was relayed.
    pub first_output_ms: Option<u64>,
    /// When its terminal event was relayed.
    pub finished_ms: Option<u64>,
    /// How it ended.
    pub outcome: RunOutcome,
    /// The failure code (failed, unknown).
    pub code: Option<String>,
    /// The failure's message, or why the run was cancelled.
    pub message: Option<String>,
    /// Why generation stopped (completed).
    pub finish_reason: Option<String>,
    /// Token counts: a completion's usage, or what a failed or cancelled run produced.
    pub usage: Option<Usage>,
    /// Events relayed so far.
    pub events: u64,
    /// Of those, how many the journal holds (fewer when the per-run cap or an overloaded
    /// journal queue left some out).
    pub events_stored: u64,
}

/// How a run ended, as its terminal event says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEnding {
    /// Completed, failed or cancelled.
    pub outcome: RunOutcome,
    /// When the terminal event was relayed, in milliseconds since the Unix epoch.
    pub finished_ms: u64,
    /// A failure's code.
    pub code: Option<String>,
    /// A failure's message, or a cancel's reason.
    pub message: Option<String>,
    /// A completion's finish reason.
    pub finish_reason: Option<String>,
    /// Its token counts: a completion's usage, or what a failed or cancelled run produced;
    /// `None` when unknown.
    pub usage: Option<Usage>,
}

impl RunEnding {
    /// The ending terminal event `kind`, relayed at `at_ms`, makes; `None` for any other.
    pub fn of(kind: &RunEventKind, at_ms: u64) -> Option<Self> {
        let mut ending = Self {
            outcome: RunOutcome::of_event(kind)?,
            finished_ms: at_ms,
            code: None,
            message: None,
            finish_reason: None,
            usage: None,
        };
        match kind {
            RunEventKind::Completed { finish_reason, .. } => {
                ending.finish_reason = Some(finish_reason.clone());
            }
            RunEventKind::Failed { code, message, .. } => {
                ending.code = Some(code.clone());
                ending.message = Some(message.clone());
            }
            RunEventKind::Cancelled { reason, .. } => ending.message = Some(reason.clone()),
            RunEventKind::Started | RunEventKind::Output { .. } => {}
        }
        ending.usage = kind.usage();
        Some(ending)
    }
}

impl RunRecord {
    /// The record of a run just accepted.
    pub fn open(accepted: AcceptedRun) -> Self {
        Self {
            accepted,
            attempts: Vec::new(),
            first_output_ms: None,
            finished_ms: None,
            outcome: RunOutcome::Open,
            code: None,
            message: None,
            finish_reason: None,
            usage: None,
            events: 0,
            events_stored: 0,
        }
    }

    /// The run's id.
    pub fn run_id(&self) -> &RunId {
        &self.accepted.run_id
    }

    /// The node of its latest attempt.
    pub fn node(&self) -> Option<&NodeId> {
        self.attempts.last().map(|a| &a.node)
    }

    /// When it was first sent to a node.
    pub fn started_ms(&self) -> Option<u64> {
        self.attempts.first().map(|a| a.started_ms)
    }

    /// Records the terminal event `kind`, relayed at `at_ms`. Non-terminal events change
    /// nothing.
    pub fn finish(&mut self, kind: &RunEventKind, at_ms: u64) {
        let Some(ending) = RunEnding::of(kind, at_ms) else {
            return;
        };
        self.outcome = ending.outcome;
        self.finished_ms = Some(ending.finished_ms);
        self.code = ending.code;
        self.message = ending.message;
        if ending.finish_reason.is_some() {
            self.finish_reason = ending.finish_reason;
        }
        if ending.usage.is_some() {
            self.usage = ending.usage;
        }
    }

    /// The key listings are ordered by.
    pub fn cursor(&self) -> RunCursor {
        RunCursor {
            queued_ms: self.accepted.queued_ms,
            run_id: self.accepted.run_id.clone(),
        }
    }
}

/// A position in a listing: newest first, by acceptance time, then by id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RunCursor {
    /// The acceptance time of the last run shown.
    pub queued_ms: u64,
    /// Its id.
    pub run_id: RunId,
}

impl RunCursor {
    /// The opaque text form given to API clients.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.queued_ms, self.run_id)
    }

    /// Reads a cursor from its text form; `None` when it is not one.
    pub fn decode(text: &str) -> Option<Self> {
        let (ms, id) = text.split_once('.')?;
        let queued_ms = ms.parse().ok()?;
        let valid = !id.is_empty()
            && id.len() <= 128
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        valid.then(|| Self {
            queued_ms,
            run_id: RunId::new(id),
        })
    }
}

/// Which runs a listing shows, by state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RunStateFilter {
    /// Open and finished.
    #[default]
    Any,
    /// Only runs not ended.
    Open,
    /// Only runs that ended (or whose end is unknown).
    Finished,
}

/// A listing's filters and page.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunQuery {
    /// Open, finished or both.
    pub state: RunStateFilter,
    /// Only runs placed on this node id (at any attempt).
    pub node: Option<NodeId>,
    /// Only runs for this adapter.
    pub adapter: Option<AdapterName>,
    /// Only runs for this target.
    pub target: Option<Target>,
    /// Only runs that ended this way.
    pub outcome: Option<RunOutcome>,
    /// Only runs whose caller used the API key of this name.
    pub api_key_name: Option<String>,
    /// Only runs accepted at or after this time.
    pub since_ms: Option<u64>,
    /// Only runs after this position (the previous page's last).
    pub after: Option<RunCursor>,
    /// At most this many runs.
    pub limit: usize,
}

impl RunQuery {
    /// Whether `record` belongs in the listing (the page position included).
    pub fn matches(&self, record: &RunRecord) -> bool {
        let state = match self.state {
            RunStateFilter::Any => true,
            RunStateFilter::Open => !record.outcome.is_finished(),
            RunStateFilter::Finished => record.outcome.is_finished(),
        };
        let accepted = &record.accepted;
        state
            && self
                .node
                .as_ref()
                .is_none_or(|n| record.attempts.iter().any(|a| &a.node == n))
            && self.adapter.as_ref().is_none_or(|a| &accepted.adapter == a)
            && self.target.as_ref().is_none_or(|t| &accepted.target == t)
            && self.outcome.is_none_or(|o| record.outcome == o)
            && self
                .api_key_name
                .as_ref()
                .is_none_or(|k| accepted.api_key_name.as_ref() == Some(k))
            && self.since_ms.is_none_or(|s| accepted.queued_ms >= s)
            && self.after.as_ref().is_none_or(|c| &record.cursor() < c)
    }
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RunPage {
    /// The runs, newest first.
    pub runs: Vec<RunRecord>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<RunCursor>,
}

/// Merges the open runs that match `query` with the journal's finished ones (each already
/// matching it and ordered newest first) into one page: newest first, at most
/// `query.limit`, with the next page's cursor when more may follow. A run in both (it
/// ended while the page was read) is shown once, as the journal has it.
pub fn merge_page(query: &RunQuery, open: Vec<RunRecord>, finished: Vec<RunRecord>) -> RunPage {
    let mut open: Vec<RunRecord> = open.into_iter().filter(|r| query.matches(r)).collect();
    open.sort_by_key(|r| std::cmp::Reverse(r.cursor()));
    let more_finished = finished.len() >= query.limit;
    let mut runs: Vec<RunRecord> = Vec::with_capacity(query.limit);
    let (mut open, mut finished) = (open.into_iter().peekable(), finished.into_iter().peekable());
    while runs.len() < query.limit {
        let take_open = match (open.peek(), finished.peek()) {
            (Some(o), Some(f)) => o.cursor() > f.cursor(),
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_open {
            open.next()
        } else {
            finished.next()
        };
        if let Some(run) = next
            && runs.last().is_none_or(|last| last.run_id() != run.run_id())
        {
            runs.push(run);
        }
    }
    let more = open.peek().is_some() || finished.peek().is_some() || more_finished;
    let next = (more && runs.len() == query.limit)
        .then(|| runs.last().map(RunRecord::cursor))
        .flatten();
    RunPage { runs, next }
}

#[cfg(test)]
#[path = "run_record_tests.rs"]
mod tests;
