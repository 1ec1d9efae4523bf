//! The ports the run service implements, each answered by the part that owns what it
//! asks: [`Runs`] for the HTTP APIs, [`NodeEventHandler`] for the node transport,
//! [`LiveRuns`] for the management service, and [`SiteRuns`] for a site member's takeover.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use super::service::RunService;
use crate::app::management::{Follow, LiveRuns};
use crate::domain::routing::BreakerState;
use crate::domain::{NodeId, ResumeAnswer, ResumeClaim, RunId, RunRecord, StatsWindow};
use crate::ports::{
    CloseReason, ConnectionId, JournalError, NodeEventHandler, ReportedEvent, RunHandle, Runs,
    SiteRuns, StartError,
};

/// How long a node's ping waits for the journal to hold the events read before it.
const JOURNAL_ACK_WAIT: Duration = Duration::from_millis(250);

/// Events a management follower may be behind before it is dropped (it can reconnect and
/// resume from the journal).
const FOLLOWER_BUFFER: usize = 1_024;

/// The runs of a member of a site, as its takeover changes them.
#[async_trait]
impl SiteRuns for RunService {
    async fn load_budgets(&self) -> Result<(), JournalError> {
        RunService::load_budgets(self).await
    }

    async fn adopt_left_open(&self) -> usize {
        RunService::adopt_left_open(self).await
    }

    fn act(&self) {
        RunService::act(self);
    }

    async fn let_go_open_runs(&self) -> usize {
        RunService::let_go_open_runs(self).await
    }
}

/// The inbound runs port, as the HTTP APIs call it.
#[async_trait]
impl Runs for RunService {
    fn start(&self, spec: crate::domain::RunSpec) -> Result<RunHandle, StartError> {
        RunService::start(self, spec)
    }

    async fn cancel(&self, run_id: &RunId, reason: &str) -> bool {
        RunService::cancel(self, run_id, reason).await
    }

    async fn reader_gone(&self, run_id: &RunId, reason: &str) {
        self.recovery().reader_gone(run_id, reason).await;
    }

    fn reader_back(&self, run_id: &RunId) -> bool {
        self.recovery().reader_back(run_id)
    }

    async fn ends_kept(&self) -> bool {
        !self.journal_shows_ends_once_kept() || self.events_kept().await
    }
}

#[async_trait]
impl NodeEventHandler for RunService {
    async fn events_kept(&self) -> bool {
        // The wait is bounded, so a journal that stalls (a checkpoint waiting for readers,
        // a slow disk, a starved machine) cannot hold up the node's connection: past it
        // this ping goes unanswered and the node keeps its copies until a later ping's
        // answer, so no event is ever in neither. A member that stopped writing its site's
        // stream answers none either: what it flushed is in its own file only.
        if let Some(journal) = self.journal_backs_resume() {
            let flushed = journal.flush();
            return tokio::time::timeout(JOURNAL_ACK_WAIT, flushed)
                .await
                .is_ok()
                && journal.kept_for_takeover();
        }
        true
    }

    fn node_connected(&self, node: &NodeId) {
        self.placer().node_connected(node);
        self.relay().settle(self.placer().pump_now());
    }

    fn node_changed(&self, _node: &NodeId) {
        self.relay().settle(self.placer().pump_now());
    }

    async fn run_events(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        events: &mut Vec<ReportedEvent>,
    ) {
        self.relay().node_events(node, connection, events).await;
    }

    async fn resume_runs(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        self.recovery()
            .resume_claims(node, connection, claims)
            .await
    }

    async fn node_disconnected(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        reason: CloseReason,
        resumable: bool,
    ) {
        self.placer().node_disconnected(node, connection);
        self.recovery()
            .node_departed(node, connection, resumable, &reason)
            .await;
    }
}

/// What the management service sees of the run service: records of the open runs, their
/// placements, following one run's events, cancelling.
#[async_trait]
impl LiveRuns for RunService {
    fn open_records(&self) -> Vec<RunRecord> {
        self.placer()
            .open_list()
            .iter()
            .map(|r| r.record())
            .collect()
    }

    fn open_record(&self, id: &RunId) -> Option<RunRecord> {
        Some(self.placer().find(id)?.record())
    }

    fn runs_on(&self, node: &NodeId) -> Vec<RunId> {
        self.placer()
            .open_list()
            .iter()
            .filter(|run| {
                let route = run.route();
                route.placement().attempt().is_some_and(|(n, _)| n == node)
            })
            .map(|run| run.id().clone())
            .collect()
    }

    async fn cancel(&self, id: &RunId, reason: &str) -> bool {
        RunService::cancel(self, id, reason).await
    }

    async fn move_off_drained(&self, node: &NodeId, id: &RunId, reason: &str) -> bool {
        RunService::move_off_drained(self, node, id, reason).await
    }

    async fn follow(&self, id: &RunId) -> Option<Follow> {
        let run = self.placer().find(id)?;
        let mut delivery = run.delivery().await;
        let (sender, events) = mpsc::channel(FOLLOWER_BUFFER);
        if !delivery.follow(sender) {
            return None;
        }
        Some(Follow {
            next_index: run.next_position(),
            events,
        })
    }

    fn set_drained(&self, node: &NodeId, drained: bool) {
        RunService::set_drained(self, node, drained);
    }

    fn breaker_state(&self, node: &NodeId) -> BreakerState {
        RunService::breaker_state(self, node)
    }

    fn stats(&self) -> StatsWindow {
        self.window()
    }
}
