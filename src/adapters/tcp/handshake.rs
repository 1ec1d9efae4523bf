//! The registration handshake of a node connection: read the `RegisterRequest`, apply the
//! domain's policy ([`decide_registration`]) to what the store and the registry say, enter
//! the registry (taking over the node's live connection when the policy says so), have the
//! run service answer the node's resume claims — once the journal keeps what nodes reported,
//! since an answer may let the node forget a run — and answer. Everything the edge decides
//! about a node joining is in [`Connection::register`], one screen long.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::time::{Instant, timeout};
use tracing::{debug, info};

use super::connection::{Connection, NodeIo, Session, frame_error_reason};
use super::link::ConnectionLink;
use crate::domain::{
    LiveConnection, NodeRecord, RegisterAttempt, RegisterRejection, RegistrationDecision,
    ResumeAnswer, TakeoverReason, TakeoverRefusal, decide_registration,
};
use crate::ports::{CloseReason, ConnectionId, LastFrame, NewConnection, Role};
use crate::wire::{EdgeFrame, NodeFrame};

/// A registration the policy admitted: the node, and the live connection it takes over.
struct Admission {
    record: Arc<NodeRecord>,
    takeover: Option<(ConnectionId, TakeoverReason)>,
}

impl<S: NodeIo> Connection<'_, S> {
    /// Registers the node: reads its request within the register timeout, applies the
    /// policy, enters the registry and answers `Accepted` with its config. On success the
    /// frame limit is raised and the run service told; otherwise the node got its refusal
    /// (or nothing, if it broke off) and the reason the connection closes is returned.
    pub(super) async fn handshake(&mut self) -> Result<Session, CloseReason> {
        let attempt = self.read_register().await?;
        let admission = self.register(&attempt).await.ok_or(CloseReason::Rejected)?;
        let session = self.enter_registry(admission, &attempt).await?;
        let resumed = self.resume(&session, &attempt).await;
        if let Err(reason) = self
            .send(EdgeFrame::Accepted {
                record: Arc::clone(&session.record),
                resumed,
                // `Connection::run` answers every ping (`handle_batch`); said only to a
                // node that may resume (a v1 node gets no field it did not ask for).
                acknowledges_pings: session.resumable,
            })
            .await
        {
            self.count_bytes();
            return Err(self.leave(&session, reason).await);
        }
        self.shared.deps.handler.node_connected(session.record.id());
        let limit = self.shared.config.max_frame_bytes;
        self.framed.codec_mut().set_max_frame(limit);
        self.release_buffers();
        Ok(session)
    }

    /// Reads the first frame, which must be a registration, within the register timeout.
    async fn read_register(&mut self) -> Result<RegisterAttempt, CloseReason> {
        let shared = self.shared;
        let first = tokio::select! {
            () = shared.close_all.cancelled() => return Err(CloseReason::Shutdown),
            first = timeout(shared.config.register_timeout(), self.framed.next()) => first,
        };
        self.count_bytes();
        let closed = |reason: CloseReason| {
            debug!(%reason, "connection closed before registering");
            Err(reason)
        };
        let attempt = match first {
            Err(_elapsed) => return closed(CloseReason::RegisterTimeout),
            Ok(None) => return closed(CloseReason::Eof),
            Ok(Some(Err(error))) => return closed(frame_error_reason(&error)),
            Ok(Some(Ok(NodeFrame::Register(attempt)))) => attempt,
            Ok(Some(Ok(_other))) => {
                shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);
                self.reject(RegisterRejection::ProtocolViolation, "").await;
                return Err(CloseReason::ProtocolViolation);
            }
        };
        shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);
        Ok(attempt)
    }

    /// Applies the registration policy to what the store and the registry say; on refusal
    /// answers (a wrong token later and later for the same address) and returns `None`.
    async fn register(&mut self, attempt: &RegisterAttempt) -> Option<Admission> {
        if !self.still_acts() {
            self.refuse_standing_by(&attempt.node_id).await;
            return None;
        }
        let shared = self.shared;
        let found = shared.deps.store.find_by_token(&attempt.token);
        let live = found
            .as_ref()
            .and_then(|record| shared.deps.registry.get(record.id().as_str()));
        let view = live.as_ref().map(|node| LiveConnection {
            instance_id: &node.instance_id,
            last_frame_at: node.last_frame_at,
        });
        let draining = shared.readiness.is_draining();
        let now = Instant::now().into_std();
        let decision = decide_registration(attempt, found.as_deref(), view, draining, now);
        let takeover = match decision {
            RegistrationDecision::Accept(_) => None,
            RegistrationDecision::TakeOver(_, reason) => {
                live.as_ref().map(|n| (n.connection, reason))
            }
            RegistrationDecision::KeepLive(refusal) => {
                self.reject_live(refusal, &attempt.node_id).await;
                return None;
            }
            RegistrationDecision::Reject(rejection) => {
                self.refuse(rejection, &attempt.node_id).await;
                return None;
            }
        };
        if !attempt.resume.is_empty() && !shared.deps.handler.events_kept().await {
            self.refuse_until_kept(&attempt.node_id).await;
            return None;
        }
        found.map(|record| Admission { record, takeover })
    }

    /// Answers `SHUTTING_DOWN` (the node retries with its backoff, its claims and what it
    /// holds for them untouched) because the events nodes reported are not yet kept where a
    /// restart or a takeover finds them: an answer to a claim may let the node forget its
    /// run — refused, the run ended here — and the run's end may be in this edge's file
    /// only (a member whose site's stream does not answer; found by the nemesis, issue 66).
    async fn refuse_until_kept(&mut self, claimed_node_id: &str) {
        info!(
            claimed_node_id,
            "registration refused until the journal keeps what nodes reported: the node retries"
        );
        self.reject(RegisterRejection::ShuttingDown, claimed_node_id)
            .await;
    }

    /// Answers a refusal other than a live connection's, a wrong token later and later for
    /// the same address (valid nodes are never delayed).
    async fn refuse(&mut self, rejection: RegisterRejection, claimed_node_id: &str) {
        if rejection == RegisterRejection::InvalidToken {
            let shared = self.shared;
            let delay = shared
                .throttle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .record_failure(self.peer.ip(), std::time::Instant::now());
            tokio::select! {
                () = shared.close_all.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
        }
        self.reject(rejection, claimed_node_id).await;
    }

    /// Answers `SHUTTING_DOWN` because this edge does not act for its site (a standby
    /// member), naming the active member's node address when it knows one: a v1 node
    /// retries with its backoff, a v1.5 node dials the address named.
    async fn refuse_standing_by(&mut self, claimed_node_id: &str) {
        let (active_edge, message) = match self.shared.deps.site.effective() {
            Role::Standby { active, reason } => match active {
                Some(active) => (
                    Some(active.node_address.clone()),
                    format!(
                        "this edge stands by ({reason}); the active member of its site, {}, takes nodes at {}",
                        active.edge_id, active.node_address
                    ),
                ),
                None => (
                    None,
                    format!("this edge stands by ({reason}); no member of its site acts now"),
                ),
            },
            // It acts again: the node retries and gets in.
            Role::Single | Role::Active { .. } => (None, "this edge stood by; retry".to_owned()),
        };
        let rejection = RegisterRejection::ShuttingDown;
        self.shared.stats.record_rejection(rejection);
        info!(
            reason = rejection.as_str(),
            claimed_node_id,
            active_edge = active_edge.as_deref().unwrap_or(""),
            "registration rejected: this edge stands by"
        );
        // The connection closes next either way; a failed write changes nothing.
        let _ = self
            .send(EdgeFrame::StandingBy {
                active_edge,
                message,
            })
            .await;
        self.count_bytes();
    }

    /// Answers `ALREADY_CONNECTED` because the node's live connection stays, saying why.
    async fn reject_live(&mut self, refusal: TakeoverRefusal, claimed_node_id: &str) {
        self.shared.stats.record_takeover_refusal(refusal);
        info!(
            refusal = refusal.as_str(),
            "the node's live connection stays"
        );
        self.reject(RegisterRejection::AlreadyConnected, claimed_node_id)
            .await;
    }

    /// Puts the accepted node in the registry with the link its runs are sent through,
    /// replacing (and closing) the live connection it takes over. Another connection of the
    /// same node may have won the race since the policy looked: that is answered
    /// `AlreadyConnected`.
    async fn enter_registry(
        &mut self,
        admission: Admission,
        attempt: &RegisterAttempt,
    ) -> Result<Session, CloseReason> {
        let shared = self.shared;
        let Admission { record, takeover } = admission;
        let (link, commands, signals) = ConnectionLink::new(shared.config.outbound_queue);
        let last_frame = Arc::new(LastFrame::new(Instant::now().into_std()));
        let registered = NewConnection {
            record: Arc::clone(&record),
            connection: self.id,
            peer: self.peer,
            node_version: attempt.node_version.clone(),
            link: Arc::new(link),
            instance_id: attempt.instance_id.clone(),
            last_frame: Arc::clone(&last_frame),
            reserved_runs: record.runtime().max_concurrent_runs(),
            can_continue: attempt.can_continue,
            operations: attempt.operations,
            can_manage_models: attempt.can_manage_models,
            inventory: attempt.inventory.clone(),
        };
        let entered = match takeover {
            None => shared.deps.registry.insert(registered).map(|()| None),
            Some((old, _)) => shared.deps.registry.replace(registered, old),
        };
        let Ok(replaced) = entered else {
            self.reject_live(TakeoverRefusal::Raced, &attempt.node_id)
                .await;
            return Err(CloseReason::Rejected);
        };
        let span = tracing::Span::current();
        span.record("node", tracing::field::display(&record.id()));
        span.record("alias", tracing::field::display(&record.alias()));
        if let (Some(old_link), Some((old, reason))) = (replaced, takeover) {
            old_link.supersede();
            shared.stats.record_takeover(reason);
            info!(
                reason = reason.as_str(),
                old_connection = old,
                "took over the node's previous connection"
            );
        }
        shared.stats.record_registration(record.id());
        info!(node_version = %attempt.node_version, adapters = ?attempt.adapters, "node registered");
        Ok(Session {
            record,
            commands,
            signals,
            last_frame,
            resumable: !attempt.instance_id.is_empty(),
        })
    }

    /// Hands the node's resume claims to the run service, which re-attaches what it can
    /// and ends the node's other runs it did not claim; returns the answers. Until then the
    /// node's whole capacity is held (it entered the registry with every slot reserved),
    /// so no new run is placed on it before the runs it resumes are counted.
    async fn resume(&self, session: &Session, attempt: &RegisterAttempt) -> Vec<ResumeAnswer> {
        let deps = &self.shared.deps;
        let node = session.record.id();
        let answers = deps
            .handler
            .resume_runs(node, self.id, &attempt.resume)
            .await;
        let reserved = session.record.runtime().max_concurrent_runs();
        let reserved = i32::try_from(reserved).unwrap_or(i32::MAX);
        deps.registry.adjust_active_runs(node, self.id, -reserved);
        if !answers.is_empty() {
            let resumed = answers.iter().filter(|a| a.outcome.is_ok()).count();
            info!(
                claimed = answers.len(),
                resumed, "answered the node's resume claims"
            );
        }
        answers
    }

    /// Answers a refused registration; the connection closes next.
    async fn reject(&mut self, rejection: RegisterRejection, claimed_node_id: &str) {
        self.shared.stats.record_rejection(rejection);
        info!(
            reason = rejection.as_str(),
            claimed_node_id, "registration rejected"
        );
        // The connection closes next either way; a failed write changes nothing.
        let _ = self.send(EdgeFrame::Rejected(rejection)).await;
        // Nothing counts this connection's bytes after the answer.
        self.count_bytes();
    }
}
