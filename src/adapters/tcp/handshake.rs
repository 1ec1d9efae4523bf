//! The registration handshake of a node connection: read the `RegisterRequest`, apply the
//! domain's policy ([`decide_registration`]) to what the store and the registry say, enter
//! the registry, and answer. Everything the edge decides about a node joining is in
//! [`Connection::register`], one screen long.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::StreamExt;
use tokio::time::timeout;
use tracing::{debug, info};

use super::connection::{Connection, NodeIo, Session, frame_error_reason};
use super::link::ConnectionLink;
use crate::domain::{
    NodeRecord, RegisterAttempt, RegisterRejection, RegistrationDecision, decide_registration,
};
use crate::ports::{CloseReason, NewConnection};
use crate::wire::{EdgeFrame, NodeFrame};

impl<S: NodeIo> Connection<'_, S> {
    /// Registers the node: reads its request within the register timeout, applies the
    /// policy, enters the registry and answers `Accepted` with its config. On success the
    /// frame limit is raised and the run service told; otherwise the node got its refusal
    /// (or nothing, if it broke off) and the reason the connection closes is returned.
    pub(super) async fn handshake(&mut self) -> Result<Session, CloseReason> {
        let attempt = self.read_register().await?;
        let record = self.register(&attempt).await.ok_or(CloseReason::Rejected)?;
        let session = self.enter_registry(record, &attempt).await?;
        if let Err(reason) = self
            .send(EdgeFrame::Accepted {
                record: Arc::clone(&session.record),
                resumed: Vec::new(),
            })
            .await
        {
            self.count_bytes();
            return Err(self.leave(&session.record, reason).await);
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
    async fn register(&mut self, attempt: &RegisterAttempt) -> Option<Arc<NodeRecord>> {
        let shared = self.shared;
        let found = shared.deps.store.find_by_token(&attempt.token);
        let already_connected = found
            .as_ref()
            .is_some_and(|r| shared.deps.registry.is_connected(r.id()));
        let draining = shared.readiness.is_draining();
        let rejection =
            match decide_registration(attempt, found.as_deref(), already_connected, draining) {
                RegistrationDecision::Accept(_) => return found,
                RegistrationDecision::Reject(rejection) => rejection,
            };
        if rejection == RegisterRejection::InvalidToken {
            // Slow down guessing: the answer to a wrong token comes later and later for the
            // same address. Valid nodes are never delayed.
            let delay = shared
                .throttle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .record_failure(self.peer.ip(), std::time::Instant::now());
            tokio::select! {
                () = shared.close_all.cancelled() => return None,
                () = tokio::time::sleep(delay) => {}
            }
        }
        self.reject(rejection, &attempt.node_id).await;
        None
    }

    /// Puts the accepted node in the registry with the link its runs are sent through.
    /// Another connection of the same node may have won the race since the policy looked:
    /// that is answered `AlreadyConnected`.
    async fn enter_registry(
        &mut self,
        record: Arc<NodeRecord>,
        attempt: &RegisterAttempt,
    ) -> Result<Session, CloseReason> {
        let shared = self.shared;
        let (link, commands, slow_consumer) = ConnectionLink::new(shared.config.outbound_queue);
        let registered = NewConnection {
            record: Arc::clone(&record),
            connection: self.id,
            peer: self.peer,
            node_version: attempt.node_version.clone(),
            link: Arc::new(link),
        };
        if shared.deps.registry.insert(registered).is_err() {
            self.reject(RegisterRejection::AlreadyConnected, &attempt.node_id)
                .await;
            return Err(CloseReason::Rejected);
        }
        shared
            .stats
            .registrations_accepted
            .fetch_add(1, Ordering::Relaxed);
        let span = tracing::Span::current();
        span.record("node", tracing::field::display(&record.id()));
        span.record("alias", tracing::field::display(&record.alias()));
        info!(node_version = %attempt.node_version, adapters = ?attempt.adapters, "node registered");
        Ok(Session {
            record,
            commands,
            slow_consumer,
        })
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
