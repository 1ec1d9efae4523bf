//! One node connection: the registration handshake, then the relay loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::codec::{Decoder, Framed};
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

/// The read buffer a node that sends several frames at a time gets (Framed's default).
/// An idle node keeps only what its last frame needed.
const READ_CAPACITY: usize = 8 * 1024;

/// At most this many frames already in the read buffer are handled in a row before the
/// relay loop looks at the edge's commands and stop signals again.
const MAX_BATCH: u64 = 128;

/// At most this many queued commands are written to a node with one flush.
const MAX_COMMANDS_PER_WRITE: u64 = 64;

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
        EdgeFrame::Accepted {
            record: Arc::clone(&record),
            resumed: Vec::new(),
        },
    )
    .await
    {
        Ok(()) => {
            shared.deps.handler.node_connected(&record.id);
            framed
                .codec_mut()
                .set_max_frame(shared.config.max_frame_bytes);
            release_buffers(&mut framed);
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

/// Gives back the handshake's read and write buffers (8 KiB each), keeping any bytes the
/// node already sent: an idle node then holds almost no buffer memory, and a busy one
/// grows them again (see [`READ_CAPACITY`]).
fn release_buffers<S: NodeIo>(framed: &mut NodeStream<S>) {
    let read = framed.read_buffer_mut();
    *read = BytesMut::from(&read[..]);
    if framed.write_buffer().is_empty() {
        *framed.write_buffer_mut() = BytesMut::new();
    }
}

/// The next whole frame already in the read buffer, decoded without reading the socket.
fn buffered_frame<S: NodeIo>(framed: &mut NodeStream<S>) -> Result<Option<NodeFrame>, FrameError> {
    if framed.read_buffer().is_empty() {
        return Ok(None);
    }
    // The codec and the buffer are both inside `framed`: lend the buffer out meanwhile.
    let mut buffer = std::mem::take(framed.read_buffer_mut());
    let frame = framed.codec_mut().decode(&mut buffer);
    *framed.read_buffer_mut() = buffer;
    frame
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

/// What [`send_commands`] wrote.
enum Sent {
    /// Commands; the connection goes on.
    Commands,
    /// The last was the graceful stop's `Shutdown`: the connection ends.
    Shutdown,
}

/// Writes `first` and the commands queued behind it (at most [`MAX_COMMANDS_PER_WRITE`], up
/// to a `Shutdown`) with one flush, within the write timeout.
///
/// Before looking at the queue the task yields once, so the tasks already woken (HTTP
/// requests starting runs, say) queue their commands first: under load many runs go to a
/// node in one write; alone, a command waits only for that yield.
async fn send_commands<S: NodeIo>(
    framed: &mut NodeStream<S>,
    shared: &Shared,
    first: NodeCommand,
    commands: &mut mpsc::Receiver<NodeCommand>,
) -> Result<Sent, CloseReason> {
    let write = async {
        let mut command = first;
        let mut written = 0;
        let sent = loop {
            let shutdown = matches!(command, NodeCommand::Shutdown { .. });
            framed.feed(EdgeFrame::Command(command)).await?;
            written += 1;
            if shutdown {
                break Sent::Shutdown;
            }
            if written == 1 {
                tokio::task::yield_now().await;
            }
            if written == MAX_COMMANDS_PER_WRITE {
                break Sent::Commands;
            }
            match commands.try_recv() {
                Ok(next) => command = next,
                Err(_) => break Sent::Commands,
            }
        };
        framed.flush().await?;
        Ok::<_, FrameError>((written, sent))
    };
    match timeout(shared.config.write_timeout(), write).await {
        Ok(Ok((written, sent))) => {
            shared
                .stats
                .frames_out
                .fetch_add(written, Ordering::Relaxed);
            Ok(sent)
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

/// Handles `first` and then the frames already whole in the read buffer, up to
/// [`MAX_BATCH`]; returns how many frames it handled and, if the connection must close, why.
async fn handle_batch<S: NodeIo>(
    shared: &Shared,
    framed: &mut NodeStream<S>,
    record: &NodeRecord,
    connection: u64,
    first: NodeFrame,
) -> (u64, Option<CloseReason>) {
    let mut frame = first;
    let mut handled = 0;
    loop {
        handled += 1;
        match frame {
            NodeFrame::Register(_) => {
                debug!("second register request");
                return (handled, Some(CloseReason::ProtocolViolation));
            }
            NodeFrame::RunEvent(event) => {
                shared
                    .deps
                    .handler
                    .run_event(&record.id, connection, event)
                    .await;
            }
            NodeFrame::Heartbeat { .. } | NodeFrame::Unknown => {}
        }
        if handled == MAX_BATCH || shared.close_all.is_cancelled() {
            return (handled, None);
        }
        // Frames taken from the buffer touch no socket, which is what would otherwise
        // spend the task's cooperative budget: spend it here, so a streaming node yields
        // to the sinks' drain tasks and other nodes.
        tokio::task::coop::consume_budget().await;
        frame = match buffered_frame(framed) {
            Ok(Some(frame)) => frame,
            Ok(None) => return (handled, None),
            Err(error) => {
                debug!(%error, "bad frame");
                return (handled, Some(frame_error_reason(&error)));
            }
        };
    }
}

/// Relays frames both ways until the connection must close; returns why.
///
/// The stop signals and the silence timer are futures made once and kept across
/// iterations (polling a fresh one registers a waiter or a timer entry every time), and
/// every frame already buffered is handled before the next `select!`, at most
/// [`MAX_BATCH`] in a row, so a node streaming events pays the loop's cost per read, not
/// per frame.
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
    let mut last_frame = Instant::now();
    let mut touched_at = last_frame;
    let close_all = shared.close_all.cancelled();
    let slow = slow_consumer.cancelled();
    let silence = sleep_until(last_frame + silence_limit);
    tokio::pin!(close_all, slow, silence);
    loop {
        tokio::select! {
            biased;
            () = &mut close_all => return CloseReason::Shutdown,
            () = &mut slow => return CloseReason::SlowConsumer,
            command = commands.recv() => {
                let Some(command) = command else { return CloseReason::Shutdown };
                // A write to a node that does not read can take up to the write timeout; the
                // final close of a graceful stop must not wait for it.
                let sent = tokio::select! {
                    biased;
                    () = &mut close_all => return CloseReason::Shutdown,
                    sent = send_commands(framed, shared, command, &mut commands) => sent,
                };
                match sent {
                    Ok(Sent::Shutdown) => return CloseReason::Shutdown,
                    Ok(Sent::Commands) => {}
                    Err(reason) => return reason,
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
                let now = Instant::now();
                last_frame = now;
                if now.duration_since(touched_at) >= TOUCH_INTERVAL {
                    touched_at = now;
                    shared.deps.registry.touch(&record.id, connection, SystemTime::now());
                }
                let (handled, closed) = handle_batch(shared, framed, record, connection, frame).await;
                shared.stats.frames_in.fetch_add(handled, Ordering::Relaxed);
                count_bytes(shared, framed);
                if let Some(reason) = closed {
                    return reason;
                }
                let buffer = framed.read_buffer();
                if buffer.capacity() < READ_CAPACITY && (handled > 1 || !buffer.is_empty()) {
                    // Frames come faster than one per read (several arrived, or part of the
                    // next one did): read them in batches.
                    framed.read_buffer_mut().reserve(READ_CAPACITY);
                }
            }
            () = &mut silence => {
                let deadline = last_frame + silence_limit;
                if deadline <= Instant::now() {
                    return CloseReason::HeartbeatTimeout;
                }
                silence.as_mut().reset(deadline);
            }
        }
    }
}
