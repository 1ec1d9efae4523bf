//! Runs that outlive a blip in their node's connection.
//!
//! When a node's connection closes, each of its runs ends its attempt
//! ([`Recovery::node_departed`]) — a disconnect, failed over when nothing was relayed yet —
//! unless the node may come back and resume its runs (it registered with an instance id):
//! then each run that already produced output, or that failover could not place on any
//! other node, is **detached** for `runs.resume_grace_ms` instead of ending: the attempt
//! goes on, its caller's stream stays open, its deadline keeps counting. When the node
//! registers again, its claims are answered under the placer's lock
//! ([`Recovery::resume_claims`]): a claimed run it holds is re-attached to the new
//! connection from the seq the domain's `decide_resume` picks (the relay then drops any
//! event already relayed), and every run of the node on another connection that it did not
//! claim, or whose claim is refused, ends `node_disconnected` (one of which nothing was
//! relayed never reached the node: it is sent again instead). A run still attached to the
//! node's older connection (a takeover that raced its close) is claimed the same way. The
//! grace timer ends a run nobody claimed in time.
//!
//! It decides nothing about sequence numbers itself (the domain does) and sends nothing but
//! a run its node never got and a cancel asked for while the run was away.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tracing::{debug, info};

use super::Recovery;
use super::adopt::PREVIOUS_EDGE;
use crate::app::runs::delivery::Delivery;
use crate::app::runs::observer::Loss;
use crate::app::runs::placer::held::{NotReattached, Reattached, held_on_other};
use crate::app::runs::relay::Source;
use crate::app::runs::run::{Run, millis};
use crate::domain::{
    EdgeFailure, EventOrigin, NodeId, ResumeAnswer, ResumeClaim, ResumeRefusal, decide_resume,
};
use crate::ports::{CloseReason, ConnectionId};

impl Recovery {
    /// `node`'s `connection` closed: each run it held ends its attempt or, when the node
    /// may resume (`resumable`), is held for it. One departure counts once against the
    /// node's breaker, however many runs it held.
    pub(in crate::app::runs) async fn node_departed(
        self: &Arc<Self>,
        node: &NodeId,
        connection: ConnectionId,
        resumable: bool,
        reason: &CloseReason,
    ) {
        let held = self.placer.runs_on(node, connection);
        if !held.is_empty() {
            debug!(%node, %reason, runs = held.len(), resumable, "ending or detaching the runs of a disconnected node");
        }
        for (index, run) in held.iter().enumerate() {
            self.lose_attempt(run, node, connection, index == 0, resumable)
                .await;
        }
    }

    /// Ends `run`'s attempt on `node`'s connection `connection`, which has closed: a
    /// disconnect, failed over when nothing was relayed yet. `first` says whether this is
    /// the run the departure counts with against the node's breaker. When the node may
    /// come back (`resumable`), a run whose attempt already produced output, or that
    /// failover could place nowhere else, is detached instead.
    async fn lose_attempt(
        self: &Arc<Self>,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
        first: bool,
        resumable: bool,
    ) {
        {
            let delivery = run.delivery().await;
            if !run.route().is_on(node, connection)
                || (resumable && self.detach(run, &delivery, node, connection, first))
            {
                // Resumed on a newer connection meanwhile, or held for that.
                return;
            }
        }
        // Should a newer connection of the node claim the run in between, the relay finds
        // the attempt moved on and drops this ending.
        let lost = EdgeFailure::NodeDisconnected.into_event_kind();
        let source = if first {
            Source::Attempt(node, connection)
        } else {
            Source::Departed(node, connection)
        };
        self.relay
            .relay_event(run, source, None, EventOrigin::Edge, lost)
            .await;
    }

    /// Detaches `run`'s attempt on `node`'s `connection`, which has dropped, if resume is
    /// on, the edge is not draining, the run is still on that connection, and either it
    /// already produced output or failover could not place it anywhere else; arms the
    /// grace. Returns whether it did (else the caller ends the attempt, which may fail it
    /// over). `blame` says whether the run's loss, if it comes to that, counts against the
    /// node's breaker.
    fn detach(
        self: &Arc<Self>,
        run: &Arc<Run>,
        delivery: &Delivery,
        node: &NodeId,
        connection: ConnectionId,
        blame: bool,
    ) -> bool {
        let Some(grace) = self.resume_grace else {
            return false;
        };
        if delivery.is_finished() || self.placer.is_draining() {
            return false;
        }
        if !delivery.saw_output() && self.placer.would_fail_over(run) {
            return false;
        }
        if !self.placer.detach(run, node, connection, blame) {
            return false;
        }
        self.observer.detached();
        info!(parent: run.span(), run_id = %run.id(), grace_ms = millis(grace), "run detached: its node's connection dropped; holding it for the node to resume");
        self.arm_resume_grace(Arc::clone(run), node.clone(), connection, grace);
        true
    }

    /// After `run` was detached from `node`'s `connection`: ends it with `node_disconnected`
    /// unless it ends or is resumed within `grace`.
    pub(super) fn arm_resume_grace(
        self: &Arc<Self>,
        run: Arc<Run>,
        node: NodeId,
        connection: ConnectionId,
        grace: Duration,
    ) {
        let recovery = Arc::clone(self);
        let ended = run.ended().clone();
        self.timers.after(&ended, grace, async move {
            recovery.expire_detached(&run, &node, connection).await;
        });
    }

    /// Answers the resume `claims` of `node`, just registered on `connection`: see the
    /// module docs. One answer per distinct run claimed, in the claims' order.
    pub(in crate::app::runs) async fn resume_claims(
        self: &Arc<Self>,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        let resuming = self.resume_grace.is_some();
        let mut claimed: HashSet<&str> = HashSet::with_capacity(claims.len());
        let mut answers = Vec::with_capacity(claims.len());
        for claim in claims {
            if !claimed.insert(claim.run_id.as_str()) {
                continue;
            }
            let outcome = if resuming {
                self.claim(node, connection, claim).await
            } else {
                Err(ResumeRefusal::Disabled)
            };
            if let Err(refusal) = outcome {
                info!(%node, run_id = %claim.run_id, reason = refusal.as_str(), "resume claim refused");
            }
            answers.push(ResumeAnswer {
                run_id: claim.run_id.clone(),
                outcome,
            });
        }
        if resuming {
            self.lose_unclaimed(node, connection, &claimed).await;
        }
        answers
    }

    /// Answers one claim: re-attaches the run, refuses a run that is not the node's, or
    /// ends the node's run when its claim cannot be resumed from.
    async fn claim(
        self: &Arc<Self>,
        node: &NodeId,
        connection: ConnectionId,
        claim: &ResumeClaim,
    ) -> Result<u64, ResumeRefusal> {
        let run = self
            .placer
            .find(claim.run_id.as_str())
            .ok_or(ResumeRefusal::UnknownRun)?;
        let mut delivery = run.delivery().await;
        let mut from = 0;
        let resumable = || {
            if delivery.is_finished() {
                return Err(None);
            }
            from = decide_resume(claim, delivery.last_node_seq()).map_err(Some)?;
            Ok(())
        };
        match self.placer.reattach(&run, node, connection, resumable) {
            Ok(reattached) => {
                delivery.resume();
                drop(delivery);
                self.reattached(&run, from, reattached);
                Ok(from)
            }
            Err(NotReattached::Unknown) => Err(ResumeRefusal::UnknownRun),
            Err(NotReattached::Lost(refusal, held_on)) => {
                drop(delivery);
                let loss = Loss::Refused(refusal);
                self.lose_held(&run, node, held_on, loss).await;
                Err(refusal)
            }
        }
    }

    /// Counts and logs a run re-attached to its node's new connection from seq `from`,
    /// and sends again a cancel asked for while it was away.
    fn reattached(&self, run: &Run, from: u64, reattached: Reattached) {
        let Reattached {
            held_on,
            detached_since,
            cancel,
        } = reattached;
        let detached_for = detached_since.map(|since| since.elapsed());
        self.observer.reattached(detached_for);
        info!(parent: run.span(), run_id = %run.id(), from_seq = from, old_connection = held_on, detached_ms = detached_for.map(millis), "run resumed on the node's new connection");
        if let Some(reason) = cancel {
            self.placer.send_cancel(run, &reason);
        }
    }

    /// Ends every run `node` holds on a connection other than `connection` (detached, or
    /// attached to an older one) that it did not claim — except a run of which nothing was
    /// relayed: its `run` command was lost with the old connection (the node would claim a
    /// run it had), so it is sent again on the new one.
    async fn lose_unclaimed(
        self: &Arc<Self>,
        node: &NodeId,
        connection: ConnectionId,
        claimed: &HashSet<&str>,
    ) {
        let unclaimed = self
            .placer
            .held_elsewhere(node, connection, |run| !claimed.contains(run.id().as_str()));
        for run in unclaimed {
            let delivery = run.delivery().await;
            let Some(held_on) = held_on_other(&run, node, connection) else {
                continue;
            };
            if delivery.last_node_seq() == 0 && !delivery.is_finished() {
                self.placer.move_to(&run, node, connection);
                drop(delivery);
                info!(parent: run.span(), run_id = %run.id(), old_connection = held_on, "run sent again: its node never got it");
                self.relay.send_or_end(&run, node);
                continue;
            }
            drop(delivery);
            self.lose_held(&run, node, held_on, Loss::NotClaimed).await;
        }
    }

    /// Ends `run`, detached from `node`'s `connection`, if it still is: the grace expired.
    async fn expire_detached(
        self: &Arc<Self>,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
    ) {
        if run.route().is_detached_from(node, connection) {
            self.lose_held(run, node, connection, Loss::GraceExpired)
                .await;
        }
    }

    /// Ends the attempt `node` held on `held_on` with `node_disconnected` (a run that never
    /// produced output may fail over), counting and logging the `loss`; nothing, if the
    /// attempt has moved on meanwhile (a newer connection claimed it: the relay sees that).
    async fn lose_held(
        self: &Arc<Self>,
        run: &Arc<Run>,
        node: &NodeId,
        held_on: ConnectionId,
        loss: Loss,
    ) {
        let (detached_since, blame) = match run.route().detached() {
            Some((since, blame)) => (Some(since), blame),
            None => (None, false),
        };
        let source = if blame {
            Source::Attempt(node, held_on)
        } else {
            Source::Departed(node, held_on)
        };
        // A run taken back from the previous edge that its node does not resume: how it
        // ended is not known.
        let lost = if held_on == PREVIOUS_EDGE {
            EdgeFailure::EdgeCrashed.into_event_kind()
        } else {
            EdgeFailure::NodeDisconnected.into_event_kind()
        };
        if self
            .relay
            .relay_event(run, source, None, EventOrigin::Edge, lost)
            .await
        {
            self.observer.resume_lost(loss);
            let detached_ms = detached_since.map(|since| millis(since.elapsed()));
            info!(parent: run.span(), run_id = %run.id(), reason = loss.as_str(), detached_ms, "run not resumed: its node's connection is gone");
        }
    }
}
