//! Re-adoption: the runs a previous edge left open in the journal (it was killed, or
//! crashed) taken back at start, before any node can connect.
//!
//! Each run the journal holds as open is rebuilt from its record and stored events and
//! judged by the domain's `adopt`: one that can go on is held **detached** from a connection
//! of the previous edge ([`PREVIOUS_EDGE`]) for `runs.resume_grace_ms`, exactly like a run
//! whose node's connection dropped, so its node's claim re-attaches it from one past the
//! last event the journal holds (`resume.rs`); one that cannot, or that no node claims in
//! time, ends `failed`/`edge_crashed` (its record's outcome `unknown`, never completed);
//! one whose deadline passed meanwhile ends `deadline_exceeded`. A taken-back run has no
//! input (the journal keeps none), so it is pinned to its node and never failed over or
//! continued. It counts among its key's open runs and reserves again what admission reserved
//! of its key's budget (its record's `budget_reserve`) while open, so a takeover admits no
//! more than the key's limits allow; its tokens are settled against the key when it ends.
//! Its place in the key's rate (starts per minute) is not counted again: it started before.

use std::sync::Arc;

use tokio::time::Instant;
use tracing::{info, info_span, warn};

use super::Recovery;
use crate::app::runs::delivery::Delivery;
use crate::app::runs::run::{Run, millis};
use crate::domain::adoption::{Adoption, Held, LeftOpen, StepKind, StoredStep, adopt};
use crate::domain::routing::TenantKey;
use crate::domain::{EdgeFailure, NodeId, NodeSelector, RunRecord, RunRouting, RunSpec};
use crate::ports::clock::now_ms;
use crate::ports::{ConnectionId, EXPORT_TARGET, StoredEvent};

/// The connection a taken-back run is held detached from: one of the previous edge's,
/// never the id of a connection of this one (they count from 1).
pub(super) const PREVIOUS_EDGE: ConnectionId = 0;

/// Stored events read per run at most (more than any run keeps: the journal caps them).
const MAX_STORED: usize = 1 << 20;

impl Recovery {
    /// Takes back the runs a previous edge left open in the journal; call once at start,
    /// before nodes may connect. Returns how many are held for their nodes.
    pub(in crate::app::runs) async fn adopt_left_open(self: &Arc<Self>) -> usize {
        let left = self.journal.take_left_open();
        let mut held = 0;
        for record in left {
            held += usize::from(self.adopt_one(record).await);
        }
        held
    }

    /// Rebuilds one run left open, and holds or ends it. Returns whether it is held.
    async fn adopt_one(self: &Arc<Self>, record: RunRecord) -> bool {
        let id = record.accepted.run_id.clone();
        let stored = match self.journal.events(&id, 0, MAX_STORED).await {
            Ok(stored) => stored,
            Err(error) => {
                warn!(run_id = %id, %error, "the stored events of a run left open cannot be read");
                Vec::new()
            }
        };
        let steps: Vec<StoredStep> = stored.iter().filter_map(step_of).collect();
        let facts = LeftOpen {
            attempts: record.attempts.len(),
            stored: &steps,
            queued_ms: record.accepted.queued_ms,
            deadline_ms: record.accepted.deadline_ms,
        };
        let resume_on = self.resume_grace.is_some();
        let (held, adoption) = adopt(&facts, now_ms(), resume_on);
        let node = record.attempts.last().map(|a| a.node.clone());
        let run = Arc::new(adopted_run(record, &held));
        self.placer.take_back(&run, node.as_ref());
        match adoption {
            Adoption::Hold => {
                if let Some(node) = node {
                    self.hold_adopted(&run, node);
                }
                true
            }
            Adoption::Expired => {
                info!(run_id = %run.id(), "run left open by the previous edge: its deadline passed meanwhile");
                let expired = EdgeFailure::DeadlineExceeded.into_event_kind();
                self.relay.end_run(&run, expired).await;
                false
            }
            Adoption::Crashed(why) => {
                info!(run_id = %run.id(), reason = why.as_str(), "run left open by the previous edge cannot be taken back");
                let crashed = EdgeFailure::EdgeCrashed.into_event_kind();
                self.relay.end_run(&run, crashed).await;
                false
            }
        }
    }

    /// Holds a taken-back run detached from its node's connection to the previous edge,
    /// for the grace, under its deadline.
    fn hold_adopted(self: &Arc<Self>, run: &Arc<Run>, node: NodeId) {
        let Some(grace) = self.resume_grace else {
            return;
        };
        self.placer.hold_taken_back(run, &node, PREVIOUS_EDGE);
        self.observer.detached();
        info!(run_id = %run.id(), %node, grace_ms = millis(grace), "run left open by the previous edge taken back; holding it for its node to resume");
        self.relay.watch(run);
        self.arm_resume_grace(Arc::clone(run), node, PREVIOUS_EDGE, grace);
    }
}

/// The run `record` describes, standing where `held` says, not yet in the table: pinned to
/// its node, and read by nobody (its caller's connection died with the previous edge).
fn adopted_run(record: RunRecord, held: &Held) -> Run {
    let accepted = record.accepted;
    let node = record.attempts.last().map(|a| a.node.clone());
    // Its key, as admission counted it (an unnamed caller's runs count as anonymous).
    let tenant = accepted
        .api_key_name
        .as_deref()
        .map_or_else(TenantKey::anonymous, |name| {
            TenantKey::parse(name).unwrap_or_else(|_| TenantKey::anonymous())
        });
    let routing = RunRouting {
        tenant,
        ..RunRouting::default()
    };
    let spec = RunSpec {
        selector: NodeSelector {
            adapter: accepted.adapter.clone(),
            target: accepted.target.clone(),
            pin: node.as_ref().map(|n| n.as_str().to_owned()),
        },
        input: bytes::Bytes::new(),
        content_type: String::new(),
        params: std::collections::BTreeMap::new(),
        deadline: held.deadline.map(|d| d.saturating_sub(held.age)),
        operation: accepted.operation,
        routing,
    };
    let span = info_span!(
        target: EXPORT_TARGET,
        "run",
        run_id = %accepted.run_id,
        adapter = %accepted.adapter,
        target = %accepted.target,
        node = tracing::field::Empty,
        attempt = tracing::field::Empty,
    );
    let delivery = Delivery::adopted(held.last_seq, held.seq_base, held.saw_output);
    let id = accepted.run_id.clone();
    let run = Run::new(id, spec, accepted, delivery, span, Instant::now());
    run.restore(held.next_index, record.first_output_ms);
    run.set_attempts(record.attempts);
    run
}

/// What adoption needs of one stored event: its position, seq and kind (`None` for a line
/// that does not say them, which then counts as missing).
fn step_of(stored: &StoredEvent) -> Option<StoredStep> {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        seq: u64,
        kind: &'a str,
    }
    let line: Line<'_> = serde_json::from_str(&stored.json).ok()?;
    let kind = match line.kind {
        "started" => StepKind::Started,
        "output" => StepKind::Output,
        _ => StepKind::Terminal,
    };
    Some(StoredStep {
        index: stored.index,
        seq: line.seq,
        kind,
    })
}
