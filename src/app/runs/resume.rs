//! Resume: runs that outlive a blip in their node's connection.
//!
//! When a node that may resume (it registered with an instance id) loses its connection,
//! each of its runs that already produced output — or that failover could not place on any
//! other node — is **detached** ([`RunService::detach`]) for `runs.resume_grace_ms` instead
//! of ending: the attempt goes on, its caller's stream stays open, its deadline keeps
//! counting. When the node registers again, its claims are
//! answered under the table lock ([`RunService::resume_claims`]): a claimed run it holds is
//! re-attached to the new connection from the seq the domain's `decide_resume` picks (the
//! relay then drops any event already relayed), and every run of the node on another
//! connection that it did not claim, or whose claim is refused, ends `node_disconnected`
//! (one of which nothing was relayed never reached the node: it is sent again instead).
//! A run still attached to the node's older connection (a takeover that raced its close) is
//! claimed the same way. The grace timer (`timers.rs`) ends a run nobody claimed in time.
//!
//! It decides nothing about sequence numbers itself (the domain does) and sends nothing but
//! a cancel asked for while the run was away.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::info;

use super::adopt::PREVIOUS_EDGE;
use super::delivery::{Delivery, Source};
use super::service::RunService;
use super::table::{Placement, Route, Run, lock};
use crate::domain::{
    EdgeFailure, EventOrigin, NodeId, ResumeAnswer, ResumeClaim, ResumeRefusal, decide_resume,
};
use crate::ports::ConnectionId;

/// Why a run held for resume ended without being resumed (`edge_runs_resume_lost{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Loss {
    /// Its node did not come back within `runs.resume_grace_ms`.
    GraceExpired,
    /// Its node registered again without claiming it.
    NotClaimed,
    /// Its node claimed it, and the claim was refused for this reason.
    Refused(ResumeRefusal),
}

impl Loss {
    /// Every loss a run can have, for metrics that pre-declare their label values.
    pub(super) const ALL: [Loss; 4] = [
        Self::GraceExpired,
        Self::NotClaimed,
        Self::Refused(ResumeRefusal::SequenceBehind),
        Self::Refused(ResumeRefusal::EventsLost),
    ];

    /// A stable snake_case name for logs and metric labels.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Self::GraceExpired => "grace_expired",
            Self::NotClaimed => "not_claimed",
            Self::Refused(refusal) => refusal.as_str(),
        }
    }
}

/// A claim that re-attached its run.
struct Reattached {
    /// The seq the node sends from.
    from: u64,
    /// The connection the run was held on.
    held_on: ConnectionId,
    /// When it was detached; `None` when it was still attached to that connection.
    detached_since: Option<Instant>,
    /// The reason of a cancel asked for meanwhile, to send again.
    cancel: Option<String>,
}

/// Why a claim did not re-attach its run.
enum NotReattached {
    /// The run is not the node's to claim (or has ended): nothing changes.
    Unknown,
    /// The node's run, claimed in a way it cannot resume from: it ends.
    Lost(ResumeRefusal, ConnectionId),
}

impl RunService {
    /// Detaches `run`'s attempt on `node`'s `connection`, which has dropped, if resume is
    /// on, the edge is not draining, the run is still on that connection, and either it
    /// already produced output or failover could not place it anywhere else; arms the
    /// grace. Returns whether it did (else the caller ends the attempt, which may fail it
    /// over). `blame` says whether the run's loss, if it comes to that, counts against the
    /// node's breaker.
    pub(super) fn detach(
        &self,
        run: &Arc<Run>,
        delivery: &Delivery,
        node: &NodeId,
        connection: ConnectionId,
        blame: bool,
    ) -> bool {
        let Some(grace) = self.inner.config.resume_grace() else {
            return false;
        };
        if delivery.is_finished() || self.is_draining() {
            return false;
        }
        if !delivery.saw_output() && self.would_fail_over(run) {
            return false;
        }
        {
            let _table = lock(&self.inner.table);
            let mut route = lock(&run.route);
            if !matches!(&route.placement, Placement::Dispatched { node: n, connection: c } if n == node && *c == connection)
            {
                return false;
            }
            route.placement = Placement::Detached {
                node: node.clone(),
                connection,
                since: Instant::now(),
                blame,
            };
        }
        self.inner.metrics.resume.detached();
        info!(parent: &run.span, run_id = %run.id, grace_ms = millis(grace), "run detached: its node's connection dropped; holding it for the node to resume");
        self.arm_resume_grace(Arc::clone(run), node.clone(), connection, grace);
        true
    }

    /// Answers the resume `claims` of `node`, just registered on `connection`: see the
    /// module docs. One answer per distinct run claimed, in the claims' order.
    pub(super) async fn resume_claims(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claims: &[ResumeClaim],
    ) -> Vec<ResumeAnswer> {
        let resuming = self.inner.config.resume_grace().is_some();
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
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claim: &ResumeClaim,
    ) -> Result<u64, ResumeRefusal> {
        let run = lock(&self.inner.table)
            .runs
            .get(claim.run_id.as_str())
            .cloned()
            .ok_or(ResumeRefusal::UnknownRun)?;
        let mut delivery = run.delivery.lock().await;
        match self.reattach(&run, &mut delivery, node, connection, claim) {
            Ok(reattached) => {
                drop(delivery);
                let Reattached {
                    from,
                    held_on,
                    detached_since,
                    cancel,
                } = reattached;
                let detached_for = detached_since.map(|since| since.elapsed());
                self.inner.metrics.resume.reattached(detached_for);
                info!(parent: &run.span, run_id = %run.id, from_seq = from, old_connection = held_on, detached_ms = detached_for.map(millis), "run resumed on the node's new connection");
                if let Some(reason) = cancel {
                    self.send_cancel(&run, &reason);
                }
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

    /// Under the table lock: moves `run` to `node`'s `connection` if the node holds it on
    /// another connection (detached, or still attached to an older one) and its claim can
    /// be resumed from; the new connection's slot is taken and repeats will be dropped.
    fn reattach(
        &self,
        run: &Run,
        delivery: &mut Delivery,
        node: &NodeId,
        connection: ConnectionId,
        claim: &ResumeClaim,
    ) -> Result<Reattached, NotReattached> {
        let _table = lock(&self.inner.table);
        let mut route = lock(&run.route);
        let (held_on, detached_since) = match &route.placement {
            Placement::Dispatched {
                node: n,
                connection: c,
            } if n == node && *c != connection => (*c, None),
            Placement::Detached {
                node: n,
                connection: c,
                since,
                ..
            } if n == node => (*c, Some(*since)),
            _ => return Err(NotReattached::Unknown),
        };
        if delivery.is_finished() {
            return Err(NotReattached::Unknown);
        }
        let from = decide_resume(claim, delivery.last_node_seq())
            .map_err(|refusal| NotReattached::Lost(refusal, held_on))?;
        self.move_attempt(&mut route, node, connection);
        delivery.resume();
        Ok(Reattached {
            from,
            held_on,
            detached_since,
            cancel: route.cancelling.clone(),
        })
    }

    /// Puts the attempt in `route` on `node`'s `connection`, taking a slot there (the
    /// connection it leaves took its slot with it, or is leaving).
    fn move_attempt(&self, route: &mut Route, node: &NodeId, connection: ConnectionId) {
        route.placement = Placement::Dispatched {
            node: node.clone(),
            connection,
        };
        self.inner.registry.adjust_active_runs(node, connection, 1);
    }

    /// Ends every run `node` holds on a connection other than `connection` (detached, or
    /// attached to an older one) that it did not claim — except a run of which nothing was
    /// relayed: its `run` command was lost with the old connection (the node would claim a
    /// run it had), so it is sent again on the new one.
    async fn lose_unclaimed(
        &self,
        node: &NodeId,
        connection: ConnectionId,
        claimed: &HashSet<&str>,
    ) {
        let elsewhere = |run: &Run| {
            lock(&run.route)
                .placement
                .attempt()
                .filter(|(n, c)| *n == node && *c != connection)
                .map(|(_, c)| c)
        };
        let unclaimed: Vec<Arc<Run>> = lock(&self.inner.table)
            .runs
            .values()
            .filter(|run| !claimed.contains(run.id.as_str()) && elsewhere(run).is_some())
            .cloned()
            .collect();
        for run in unclaimed {
            let delivery = run.delivery.lock().await;
            let Some(held_on) = elsewhere(&run) else {
                continue;
            };
            if delivery.last_node_seq() == 0 && !delivery.is_finished() {
                {
                    let _table = lock(&self.inner.table);
                    let mut route = lock(&run.route);
                    self.move_attempt(&mut route, node, connection);
                }
                drop(delivery);
                info!(parent: &run.span, run_id = %run.id, old_connection = held_on, "run sent again: its node never got it");
                self.send_run(&run, node);
                continue;
            }
            drop(delivery);
            self.lose_held(&run, node, held_on, Loss::NotClaimed).await;
        }
    }

    /// Ends `run`, detached from `node`'s `connection`, if it still is: the grace expired.
    pub(super) async fn expire_detached(
        &self,
        run: &Arc<Run>,
        node: &NodeId,
        connection: ConnectionId,
    ) {
        let detached = matches!(&lock(&run.route).placement, Placement::Detached { node: n, connection: c, .. } if n == node && *c == connection);
        if detached {
            self.lose_held(run, node, connection, Loss::GraceExpired)
                .await;
        }
    }

    /// Ends the attempt `node` held on `held_on` with `node_disconnected` (a run that never
    /// produced output may fail over), counting and logging the `loss`; nothing, if the
    /// attempt has moved on meanwhile (a newer connection claimed it: the relay sees that).
    async fn lose_held(&self, run: &Arc<Run>, node: &NodeId, held_on: ConnectionId, loss: Loss) {
        let (detached_since, blame) = match &lock(&run.route).placement {
            Placement::Detached { since, blame, .. } => (Some(*since), *blame),
            _ => (None, false),
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
            .relay_event(run, source, None, EventOrigin::Edge, lost)
            .await
        {
            self.inner.metrics.resume.lost(loss);
            let detached_ms = detached_since.map(|since| millis(since.elapsed()));
            info!(parent: &run.span, run_id = %run.id, reason = loss.as_str(), detached_ms, "run not resumed: its node's connection is gone");
        }
    }
}

/// `duration` in whole milliseconds, for logs.
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
