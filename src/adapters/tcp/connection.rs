//! One node connection: the registration handshake, then the relay loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use super::link::ConnectionLink;
use super::server::Shared;
use crate::domain::{
    NodeRecord, RegisterAttempt, RegisterRejection, RegistrationDecision, decide_registration,
};
use crate::ports::{CloseReason, NewConnection, NodeCommand};
use crate::wire::{EdgeCodec, EdgeFrame, FrameError, NodeFrame};

/// A byte stream a node connection runs over: TCP, TLS over TCP, or an in-memory pipe.
pub trait NodeIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> NodeIo for T {}

type NodeStream<S> = Framed<S, EdgeCodec>;

/// A node is evicted after this many heartbeat intervals without a frame.
const MISSED_HEARTBEATS: u32 = 3;

/// The registry's last-seen time is refreshed at most this often per connection.
const TOUCH_INTERVAL: Duration = Duration::from_secs(1);

/// Serves one connection until it closes; returns why it closed.
pub(super) async fn serve_connection<S: NodeIo>(
    shared: &Shared,
    stream: S,
    peer: SocketAddr,
    connection: u64,
) -> CloseReason {
    let mut framed = Framed::new(
        stream,
        EdgeCodec::new(shared.config.max_register_frame_bytes),
    );
    let first = tokio::select! {
        () = shared.close_all.cancelled() => return CloseReason::Shutdown,
        first = timeout(shared.config.register_timeout(), framed.next()) => first,
    };
    count_bytes(shared, &mut framed);
    let attempt = match first {
        Err(_elapsed) => return closed_before_registration(CloseReason::RegisterTimeout),
        Ok(None) => return closed_before_registration(CloseReason::Eof),
        Ok(Some(Err(error))) => return closed_before_registration(frame_error_reason(&error)),
        Ok(Some(Ok(NodeFrame::Register(attempt)))) => attempt,
        Ok(Some(Ok(_other))) => {
            shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);
            reject(
                &mut framed,
                shared,
                RegisterRejection::ProtocolViolation,
                "",
            )
            .await;
            return CloseReason::ProtocolViolation;
        }
    };
    shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);

    let Some(record) = register(shared, &mut framed, &attempt, peer).await else {
        return CloseReason::Rejected;
    };
    let (link, commands, slow_consumer) = ConnectionLink::new(shared.config.outbound_queue);
    let registered = NewConnection {
        record: Arc::clone(&record),
        connection,
        peer,
        node_version: attempt.node_version.clone(),
        link: Arc::new(link),
    };
    if shared.deps.registry.insert(registered).is_err() {
        // Another connection of the same node won the race since the policy looked.
        reject(
            &mut framed,
            shared,
            RegisterRejection::AlreadyConnected,
            &attempt.node_id,
        )
        .await;
        return CloseReason::Rejected;
    }
    shared
        .stats
        .registrations_accepted
        .fetch_add(1, Ordering::Relaxed);
    let span = tracing::Span::current();
    span.record("node", tracing::field::display(&record.id));
    span.record("alias", tracing::field::display(&record.alias));
    info!(node_version = %attempt.node_version, adapters = ?attempt.adapters, "node registered");

    let reason = match send(
        &mut framed,
        shared,
        EdgeFrame::Accepted(Arc::clone(&record)),
    )
    .await
    {
        Ok(()) => {
            shared.deps.handler.node_connected(&record.id);
            framed
                .codec_mut()
                .set_max_frame(shared.config.max_frame_bytes);
            relay(
                shared,
                &mut framed,
                &record,
                connection,
                commands,
                slow_consumer,
            )
            .await
        }
        Err(reason) => reason,
    };
    count_bytes(shared, &mut framed);

    shared.deps.registry.remove(&record.id, connection);
    shared.stats.record_disconnect(reason);
    shared
        .deps
        .handler
        .node_disconnected(&record.id, connection, reason)
        .await;
    info!(%reason, "node disconnected");
    reason
}

/// Moves the codec's byte counts into the transport's counters.
fn count_bytes<S: NodeIo>(shared: &Shared, framed: &mut NodeStream<S>) {
    let (read, written) = framed.codec_mut().take_byte_counts();
    shared.stats.bytes_in.fetch_add(read, Ordering::Relaxed);
    shared.stats.bytes_out.fetch_add(written, Ordering::Relaxed);
}

/// Applies the registration policy; on refusal answers and returns `None`.
async fn register<S: NodeIo>(
    shared: &Shared,
    framed: &mut NodeStream<S>,
    attempt: &RegisterAttempt,
    peer: SocketAddr,
) -> Option<Arc<NodeRecord>> {
    let found = shared.deps.store.find_by_token(&attempt.token);
    let already_connected = found
        .as_ref()
        .is_some_and(|r| shared.deps.registry.is_connected(&r.id));
    let draining = shared.draining.load(Ordering::Acquire);
    match decide_registration(attempt, found.as_deref(), already_connected, draining) {
        RegistrationDecision::Accept(_) => found,
        RegistrationDecision::Reject(rejection) => {
            if rejection == RegisterRejection::InvalidToken {
                // Slow down guessing: the answer to a wrong token comes later and later for
                // the same address. Valid nodes are never delayed.
                let delay = shared
                    .throttle
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .record_failure(peer.ip(), std::time::Instant::now());
                tokio::select! {
                    () = shared.close_all.cancelled() => return None,
                    () = tokio::time::sleep(delay) => {}
                }
            }
            reject(framed, shared, rejection, &attempt.node_id).await;
            None
        }
    }
}

/// Answers a refused registration and lets the connection close.
async fn reject<S: NodeIo>(
    framed: &mut NodeStream<S>,
    shared: &Shared,
    rejection: RegisterRejection,
    claimed_node_id: &str,
) {
    shared.stats.record_rejection(rejection);
    info!(
        reason = rejection.as_str(),
        claimed_node_id, "registration rejected"
    );
    // The connection closes next either way; a failed write changes nothing.
    let _ = send(framed, shared, EdgeFrame::Rejected(rejection)).await;
    // Nothing counts this connection's bytes after the answer.
    count_bytes(shared, framed);
}

fn closed_before_registration(reason: CloseReason) -> CloseReason {
    debug!(%reason, "connection closed before registering");
    reason
}

/// Writes one frame within the write timeout.
async fn send<S: NodeIo>(
    framed: &mut NodeStream<S>,
    shared: &Shared,
    frame: EdgeFrame,
) -> Result<(), CloseReason> {
    match timeout(shared.config.write_timeout(), framed.send(frame)).await {
        Ok(Ok(())) => {
            shared.stats.frames_out.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Ok(Err(error)) => Err(frame_error_reason(&error)),
        Err(_elapsed) => Err(CloseReason::SlowConsumer),
    }
}

fn frame_error_reason(error: &FrameError) -> CloseReason {
    match error {
        FrameError::Io(_) => CloseReason::Io,
        FrameError::Oversized { .. } => CloseReason::OversizedFrame,
        FrameError::BadLength | FrameError::Decode(_) => CloseReason::ProtocolViolation,
    }
}

/// Relays frames both ways until the connection must close; returns why.
async fn relay<S: NodeIo>(
    shared: &Shared,
    framed: &mut NodeStream<S>,
    record: &NodeRecord,
    connection: u64,
    mut commands: mpsc::Receiver<NodeCommand>,
    slow_consumer: CancellationToken,
) -> CloseReason {
    let silence_limit =
        Duration::from_millis(u64::from(record.runtime.heartbeat_interval_ms)) * MISSED_HEARTBEATS;
    let mut silent_until = Instant::now() + silence_limit;
    let mut touched_at = Instant::now();
    loop {
        tokio::select! {
            biased;
            () = shared.close_all.cancelled() => return CloseReason::Shutdown,
            () = slow_consumer.cancelled() => return CloseReason::SlowConsumer,
            command = commands.recv() => {
                let Some(command) = command else { return CloseReason::Shutdown };
                let shutdown = matches!(command, NodeCommand::Shutdown { .. });
                if let Err(reason) = send(framed, shared, EdgeFrame::Command(command)).await {
                    return reason;
                }
                if shutdown {
                    return CloseReason::Shutdown;
                }
            }
            frame = framed.next() => {
                let frame = match frame {
                    None => return CloseReason::Eof,
                    Some(Err(error)) => {
                        debug!(%error, "bad frame");
                        return frame_error_reason(&error);
                    }
                    Some(Ok(frame)) => frame,
                };
                shared.stats.frames_in.fetch_add(1, Ordering::Relaxed);
                count_bytes(shared, framed);
                let now = Instant::now();
                silent_until = now + silence_limit;
                if now.duration_since(touched_at) >= TOUCH_INTERVAL {
                    touched_at = now;
                    shared.deps.registry.touch(&record.id, connection, SystemTime::now());
                }
                match frame {
                    NodeFrame::Register(_) => {
                        debug!("second register request");
                        return CloseReason::ProtocolViolation;
                    }
                    NodeFrame::RunEvent(event) => {
                        shared.deps.handler.run_event(&record.id, connection, event).await;
                    }
                    NodeFrame::Heartbeat { .. } | NodeFrame::Unknown => {}
                }
            }
            () = sleep_until(silent_until) => return CloseReason::HeartbeatTimeout,
        }
    }
}
