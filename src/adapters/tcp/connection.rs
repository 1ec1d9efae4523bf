//! One node connection as a type: [`Connection`] owns the framed stream and serves it —
//! [`Connection::handshake`] (in `handshake.rs`), then [`Connection::run`], the frame loop,
//! with [`Connection::handle_batch`] for what the node sent and
//! [`Connection::write_commands`] for what the edge sends — until the connection must
//! close; [`Connection::serve`] ties them together and says why it closed.
//!
//! It must not decide anything itself: registration is the domain's policy, runs are the
//! run service's (reached through `NodeEventHandler`), and frames are the wire module's.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use futures::{SinkExt, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::codec::{Decoder, Framed};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::link::LinkSignals;
use super::shared::Shared;
use crate::domain::{AdapterName, Availability, NodeRecord, Target};
use crate::hops;
use crate::ports::{CloseReason, ConnectionId, LastFrame, NodeCommand, ReportedEvent, Role};
use crate::wire::{EdgeCodec, EdgeFrame, FrameError, NodeFrame};

/// A byte stream a node connection runs over: TCP, TLS over TCP, or an in-memory pipe.
pub trait NodeIo: AsyncRead + AsyncWrite + Unpin + Send {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send> NodeIo for T {}

/// A node is evicted after this many heartbeat intervals without a frame.
const MISSED_HEARTBEATS: u32 = 3;

/// The registry's last-seen time is refreshed at most this often per connection.
const TOUCH_INTERVAL: Duration = Duration::from_secs(1);

/// The read buffer a node that sends several frames at a time gets (Framed's default).
/// An idle node keeps only what its last frame needed.
const READ_CAPACITY: usize = 8 * 1024;

/// At most this many frames already in the read buffer are handled in a row before the
/// frame loop looks at the edge's commands and stop signals again.
const MAX_BATCH: u64 = 128;

/// Within a batch, the edge's stop is looked at every this many frames: reading a
/// cancellation token takes its mutex, which per frame was ~1 % of a streamed request.
const STOP_CHECK_EVERY: u64 = 16;

/// At most this many queued commands are written to a node with one flush.
const MAX_COMMANDS_PER_WRITE: u64 = 64;

/// A link that wrote commands less than this long ago is busy: its writer yields once
/// before a write, so that the runs other tasks are starting go in the same write.
const BUSY_LINK: Duration = Duration::from_millis(1);

/// One node connection: the framed stream and what the transport shares with it.
pub(super) struct Connection<'a, S> {
    pub(super) shared: &'a Shared,
    pub(super) framed: Framed<S, EdgeCodec>,
    pub(super) peer: SocketAddr,
    pub(super) id: ConnectionId,
    /// Whether events were relayed since the last ping was answered: only then does an
    /// answer wait for them to be kept (an idle node's pings cost nothing).
    relayed_since_ack: AtomicBool,
    /// When commands were last written to the node (see [`BUSY_LINK`]).
    commands_written: Option<Instant>,
    /// This edge's role in its site, looked at before every command written: a command is
    /// never written once the edge stops acting, and carries the epoch it acts under.
    role: watch::Receiver<Role>,
    /// Whether `role` acted when last looked at.
    acting: bool,
    /// The targets the node's last availability report on this connection served: a report
    /// serving others is counted as a change (`edge_node_availability_changes_total`).
    served: Option<Vec<(AdapterName, Target)>>,
}

/// A registered node's side of the connection, made by the handshake.
pub(super) struct Session {
    /// The node's definition.
    pub(super) record: Arc<NodeRecord>,
    /// What the run service queued for the node (the registry's link is the other end).
    pub(super) commands: mpsc::Receiver<NodeCommand>,
    /// Set by the link when the node stops reading, or when a newer connection took over.
    pub(super) signals: LinkSignals,
    /// When the node last sent a frame, shared with the registry for takeover decisions.
    pub(super) last_frame: Arc<LastFrame>,
    /// Whether the node may come back and resume its runs (it sent an instance id).
    pub(super) resumable: bool,
}

/// What [`Connection::write_commands`] wrote.
enum Sent {
    /// Commands; the connection goes on.
    Commands,
    /// The last was the graceful stop's `Shutdown`: the connection ends.
    Shutdown,
    /// The edge's role changed before every queued command was written: the connection
    /// ends as `standby` if the edge stopped acting, and goes on under the new epoch
    /// otherwise.
    RoleChanged,
}

impl<'a, S: NodeIo> Connection<'a, S> {
    /// A connection over `stream`, reading frames no larger than a registration's limit.
    pub(super) fn new(shared: &'a Shared, stream: S, peer: SocketAddr, id: ConnectionId) -> Self {
        let mut codec = EdgeCodec::new(shared.config.max_register_frame_bytes);
        let mut role = shared.deps.site.watch();
        let (acting, epoch) = {
            let now = role.borrow_and_update();
            (now.acts(), now.epoch())
        };
        codec.set_epoch(epoch);
        Self {
            shared,
            framed: Framed::new(stream, codec),
            peer,
            id,
            relayed_since_ack: AtomicBool::new(false),
            commands_written: None,
            role,
            acting,
            served: None,
        }
    }

    /// Whether this edge still acts for its site, stamping what it writes from now on with
    /// the epoch it acts under when that changed. Costs an atomic load while nothing changed.
    pub(super) fn still_acts(&mut self) -> bool {
        if self.role.has_changed().unwrap_or(false) {
            let (acting, epoch) = {
                let now = self.role.borrow_and_update();
                (now.acts(), now.epoch())
            };
            self.acting = acting;
            // A member that stops acting says its last words under the epoch it acted under.
            if acting {
                self.framed.codec_mut().set_epoch(epoch);
            }
        }
        // Past its lease's bound (a pause longer than the lease) the edge acts no more,
        // whatever its lease task has not yet said.
        self.acting && self.shared.deps.site.within_lease()
    }

    /// Serves the connection until it closes: the handshake, then the frame loop, then
    /// the node's departure. Returns why it closed.
    pub(super) async fn serve(mut self) -> CloseReason {
        let mut session = match self.handshake().await {
            Ok(session) => session,
            Err(reason) => return reason,
        };
        let reason = self.run(&mut session).await;
        if reason == CloseReason::Standby {
            self.send_away().await;
        }
        self.count_bytes();
        self.leave(&session, reason).await
    }

    /// Tells the node this edge stopped acting for its site (`Shutdown { reason: "standby" }`,
    /// under the epoch it acted under), so the node goes to the active member. The
    /// connection closes next either way.
    async fn send_away(&mut self) {
        if !self.framed.write_buffer().is_empty() {
            // Commands fed before the edge stopped acting are still unwritten: they stay so,
            // and the connection closes without a word (the node reconnects as after a cut).
            info!("this edge no longer acts for its site: closing the node's connection");
            return;
        }
        info!("this edge no longer acts for its site: sending the node away");
        let shutdown = NodeCommand::Shutdown {
            reason: "standby".to_owned(),
        };
        let _ = self.send(EdgeFrame::Command(shutdown)).await;
    }

    /// The node leaves: out of the registry, counted, and the run service told (it ends
    /// the node's runs, or holds them for a node that may resume). Returns `reason`.
    pub(super) async fn leave(&self, session: &Session, reason: CloseReason) -> CloseReason {
        let shared = self.shared;
        let id = session.record.id();
        shared.deps.registry.remove(id, self.id);
        shared.stats.record_disconnect(reason);
        shared
            .deps
            .handler
            .node_disconnected(id, self.id, reason, session.resumable)
            .await;
        info!(%reason, "node disconnected");
        reason
    }

    /// Relays frames both ways until the connection must close; returns why.
    ///
    /// The stop signals and the silence timer are futures made once and kept across
    /// iterations (polling a fresh one registers a waiter or a timer entry every time), and
    /// every frame already buffered is handled before the next `select!`, at most
    /// [`MAX_BATCH`] in a row, so a node streaming events pays the loop's cost per read,
    /// not per frame.
    pub(super) async fn run(&mut self, session: &mut Session) -> CloseReason {
        let silence_limit = session.record.runtime().heartbeat_interval() * MISSED_HEARTBEATS;
        let mut last_frame = Instant::now();
        let mut touched_at = last_frame;
        let stop = stopped(
            &self.shared.close_all,
            &session.signals,
            self.shared.deps.site.watch(),
        );
        let silence = sleep_until(last_frame + silence_limit);
        tokio::pin!(stop, silence);
        loop {
            tokio::select! {
                biased;
                reason = &mut stop => return reason,
                command = session.commands.recv() => {
                    let Some(command) = command else { return CloseReason::Shutdown };
                    if let Some(reason) = self.command(command, &mut session.commands, stop.as_mut()).await {
                        return reason;
                    }
                }
                frame = self.framed.next() => {
                    let frame = match frame {
                        None => return CloseReason::Eof,
                        Some(Err(error)) => {
                            debug!(%error, "bad frame");
                            return frame_error_reason(&error);
                        }
                        Some(Ok(frame)) => frame,
                    };
                    last_frame = Instant::now();
                    session.last_frame.record(last_frame.into_std());
                    if last_frame.duration_since(touched_at) >= TOUCH_INTERVAL {
                        touched_at = last_frame;
                        self.shared.deps.registry.touch(session.record.id(), self.id, SystemTime::now());
                    }
                    if let Some(reason) = self.handle_frames(&session.record, frame).await {
                        return reason;
                    }
                }
                () = &mut silence => {
                    let deadline = last_frame + silence_limit;
                    if deadline <= Instant::now() {
                        // How long it was silent tells a node that stalled (a busy host, a
                        // paused process) from one that is gone.
                        let silent_ms = last_frame.elapsed().as_millis();
                        let limit_ms = silence_limit.as_millis();
                        warn!(silent_ms, limit_ms, "node silent past its heartbeat limit: declaring its link dead");
                        return CloseReason::HeartbeatTimeout;
                    }
                    silence.as_mut().reset(deadline);
                }
            }
        }
    }

    /// Writes `first` and the commands queued behind it, unless this edge no longer acts for
    /// its site; returns why the connection must close, if it must. A write to a node that
    /// does not read can take up to the write timeout: `stop` (the final close of a graceful
    /// stop, a takeover, the edge standing by) does not wait for it.
    async fn command(
        &mut self,
        first: NodeCommand,
        commands: &mut mpsc::Receiver<NodeCommand>,
        stop: Pin<&mut impl Future<Output = CloseReason>>,
    ) -> Option<CloseReason> {
        if !self.still_acts() {
            return Some(CloseReason::Standby);
        }
        let sent = tokio::select! {
            biased;
            reason = stop => return Some(reason),
            sent = self.write_commands(first, commands) => sent,
        };
        match sent {
            Ok(Sent::Shutdown) => Some(CloseReason::Shutdown),
            Ok(Sent::RoleChanged) if !self.still_acts() => Some(CloseReason::Standby),
            Ok(Sent::Commands | Sent::RoleChanged) => None,
            Err(reason) => Some(reason),
        }
    }

    /// Handles `first` and the frames buffered behind it, counts them, and grows the read
    /// buffer for a node that sends faster than one frame per read. Returns why the
    /// connection must close, if it must.
    async fn handle_frames(
        &mut self,
        record: &NodeRecord,
        first: NodeFrame,
    ) -> Option<CloseReason> {
        let mut events = Vec::new();
        let (handled, closed) = self.handle_batch(record, first, &mut events).await;
        self.relay(record, &mut events).await;
        self.shared
            .stats
            .frames_in
            .fetch_add(handled, Ordering::Relaxed);
        self.count_bytes();
        if closed.is_some() {
            return closed;
        }
        let buffer = self.framed.read_buffer();
        if buffer.capacity() < READ_CAPACITY && (handled > 1 || !buffer.is_empty()) {
            // Frames come faster than one per read (several arrived, or part of the next
            // one did): read them in batches.
            self.framed.read_buffer_mut().reserve(READ_CAPACITY);
        }
        None
    }

    /// Handles `first` and then the frames already whole in the read buffer, up to
    /// [`MAX_BATCH`]; returns how many frames it handled and, if the connection must close,
    /// why. Run events are gathered in `events` while they are of one run and go to the
    /// run service together (see [`Self::relay`]), before any other frame is handled and
    /// before the next one of another run; the caller relays what is left in `events`.
    async fn handle_batch(
        &mut self,
        record: &NodeRecord,
        first: NodeFrame,
        events: &mut Vec<ReportedEvent>,
    ) -> (u64, Option<CloseReason>) {
        let mut frame = first;
        let mut handled = 0;
        loop {
            handled += 1;
            let same_run =
                |event: &ReportedEvent| events.first().is_none_or(|e| e.run_id == event.run_id);
            let joins_batch = matches!(&frame, NodeFrame::RunEvent(event) if same_run(event));
            if !joins_batch {
                self.relay(record, events).await;
            }
            match frame {
                NodeFrame::Register(_) => {
                    debug!("second register request");
                    return (handled, Some(CloseReason::ProtocolViolation));
                }
                NodeFrame::RunEvent(event) => {
                    tracing::trace!(target: hops::TARGET, hop = hops::EVENT_RECEIVED, run_id = event.run_id, seq = event.seq);
                    events.push(event);
                }
                NodeFrame::Heartbeat {
                    ping,
                    availability,
                    inventory,
                    ..
                } => {
                    if let Some(availability) = availability {
                        self.availability(record, availability);
                    }
                    if let Some(inventory) = inventory {
                        let registry = &self.shared.deps.registry;
                        registry.set_inventory(record.id(), self.id, inventory);
                    }
                    // Answered after every frame before it was handled and is kept: the
                    // ack tells the node the edge has read, relayed and journaled all of
                    // those, so it may forget them.
                    if ping != 0
                        && self.events_kept().await
                        && let Err(reason) = self.send(EdgeFrame::HeartbeatAck { ping }).await
                    {
                        return (handled, Some(reason));
                    }
                }
                NodeFrame::ModelOutcome(outcome) => {
                    self.shared.deps.handler.model_outcome(record.id(), outcome);
                }
                NodeFrame::Unknown => {}
            }
            let look_at_stop = handled % STOP_CHECK_EVERY == 0;
            if handled == MAX_BATCH || (look_at_stop && self.shared.close_all.is_cancelled()) {
                return (handled, None);
            }
            // Frames taken from the buffer touch no socket, which is what would otherwise
            // spend the task's cooperative budget: spend it here, so a streaming node
            // yields to the sinks' drain tasks and other nodes.
            tokio::task::coop::consume_budget().await;
            frame = match self.buffered_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => return (handled, None),
                Err(error) => {
                    debug!(%error, "bad frame");
                    return (handled, Some(frame_error_reason(&error)));
                }
            };
        }
    }

    /// Hands the run service `events` (consecutive events of one run, or none), which it
    /// relays before this returns.
    async fn relay(&self, record: &NodeRecord, events: &mut Vec<ReportedEvent>) {
        if !events.is_empty() {
            self.relayed_since_ack.store(true, Ordering::Relaxed);
            let handler = &self.shared.deps.handler;
            handler.run_events(record.id(), self.id, events).await;
        }
    }

    /// Whether the events relayed since the last ack are kept (the run service waits a
    /// bounded time for its journal): a ping is answered only then, so the node never
    /// forgets an event a restarted edge would not have; unanswered, a later ping asks
    /// again.
    async fn events_kept(&self) -> bool {
        if !self.relayed_since_ack.swap(false, Ordering::Relaxed) {
            return true;
        }
        let kept = self.shared.deps.handler.events_kept().await;
        if !kept {
            self.relayed_since_ack.store(true, Ordering::Relaxed);
        }
        kept
    }

    /// Stores what the node reports it can serve now and, if that changed, tells the run
    /// service (queued runs may fit now); counts a change of the targets served.
    fn availability(&mut self, record: &NodeRecord, availability: Availability) {
        let served = availability.pairs();
        if self
            .served
            .as_deref()
            .is_some_and(|before| before != served)
        {
            self.shared.stats.record_availability_change(record.id());
        }
        if self.served.as_deref() != Some(served) {
            self.served = Some(served.to_vec());
        }
        let deps = &self.shared.deps;
        if deps
            .registry
            .set_availability(record.id(), self.id, availability)
        {
            debug!("availability changed");
            deps.handler.node_changed(record.id());
        }
    }

    /// Writes `first` and the commands queued behind it (at most
    /// [`MAX_COMMANDS_PER_WRITE`], up to a `Shutdown`) with one flush, within the write
    /// timeout.
    ///
    /// On a busy link ([`BUSY_LINK`]) the task yields once before looking at the queue, so
    /// the tasks already woken (HTTP requests starting runs, say) queue their commands
    /// first: under load many runs go to a node in one write. A command on a quiet link is
    /// written at once: a yield would queue this task behind nothing and wake another
    /// worker to steal it, and the `RunRequest` would wait for that wake-up (decision 37).
    async fn write_commands(
        &mut self,
        first: NodeCommand,
        commands: &mut mpsc::Receiver<NodeCommand>,
    ) -> Result<Sent, CloseReason> {
        let busy = self
            .commands_written
            .is_some_and(|at| at.elapsed() < BUSY_LINK);
        let framed = &mut self.framed;
        let role = &mut self.role;
        let mut traced = Vec::new();
        let write = async {
            let mut command = first;
            let mut written = 0;
            let sent = loop {
                let shutdown = matches!(command, NodeCommand::Shutdown { .. });
                if let NodeCommand::Run(run) = &command
                    && hops::enabled()
                {
                    traced.push(run.run_id.clone());
                }
                framed.feed(EdgeFrame::Command(command)).await?;
                written += 1;
                if shutdown {
                    break Sent::Shutdown;
                }
                if written == 1 && busy {
                    tokio::task::yield_now().await;
                }
                if written == MAX_COMMANDS_PER_WRITE {
                    break Sent::Commands;
                }
                // The caller looked at the role before the first command: a change since
                // ends the write here, before the next is taken, so a command is never
                // written once the edge stops acting, nor under an epoch it left.
                if role.has_changed().unwrap_or(false) {
                    break Sent::RoleChanged;
                }
                match commands.try_recv() {
                    Ok(next) => command = next,
                    Err(_) => break Sent::Commands,
                }
            };
            if role.has_changed().unwrap_or(false) && !role.borrow().acts() {
                // Fed while the edge acted, not flushed yet: left unsent, and the connection
                // closes as `standby` without them.
                return Ok((0, Sent::RoleChanged));
            }
            for run_id in &traced {
                tracing::trace!(target: hops::TARGET, hop = hops::RUN_SENT, %run_id);
            }
            framed.flush().await?;
            Ok::<_, FrameError>((written, sent))
        };
        let result = timeout(self.shared.config.write_timeout(), write).await;
        self.commands_written = Some(Instant::now());
        match result {
            Ok(Ok((written, sent))) => {
                let frames_out = &self.shared.stats.frames_out;
                frames_out.fetch_add(written, Ordering::Relaxed);
                Ok(sent)
            }
            Ok(Err(error)) => Err(frame_error_reason(&error)),
            Err(_elapsed) => Err(CloseReason::SlowConsumer),
        }
    }

    /// Writes one frame within the write timeout, under the epoch the edge acts under now
    /// (or last acted under, once it stopped).
    pub(super) async fn send(&mut self, frame: EdgeFrame) -> Result<(), CloseReason> {
        self.still_acts();
        match timeout(self.shared.config.write_timeout(), self.framed.send(frame)).await {
            Ok(Ok(())) => {
                self.shared.stats.frames_out.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Ok(Err(error)) => Err(frame_error_reason(&error)),
            Err(_elapsed) => Err(CloseReason::SlowConsumer),
        }
    }

    /// The next whole frame already in the read buffer, decoded without reading the
    /// socket.
    fn buffered_frame(&mut self) -> Result<Option<NodeFrame>, FrameError> {
        if self.framed.read_buffer().is_empty() {
            return Ok(None);
        }
        // The codec and the buffer are both inside `framed`: lend the buffer out meanwhile.
        let mut buffer = std::mem::take(self.framed.read_buffer_mut());
        let frame = self.framed.codec_mut().decode(&mut buffer);
        *self.framed.read_buffer_mut() = buffer;
        frame
    }

    /// Gives back the handshake's read and write buffers (8 KiB each), keeping any bytes
    /// the node already sent: an idle node then holds almost no buffer memory, and a busy
    /// one grows them again (see [`READ_CAPACITY`]).
    pub(super) fn release_buffers(&mut self) {
        let read = self.framed.read_buffer_mut();
        *read = BytesMut::from(&read[..]);
        if self.framed.write_buffer().is_empty() {
            *self.framed.write_buffer_mut() = BytesMut::new();
        }
    }

    /// Moves the codec's byte counts into the transport's counters.
    pub(super) fn count_bytes(&mut self) {
        let (read, written) = self.framed.codec_mut().take_byte_counts();
        let stats = &self.shared.stats;
        stats.bytes_in.fetch_add(read, Ordering::Relaxed);
        stats.bytes_out.fetch_add(written, Ordering::Relaxed);
    }
}

/// Resolves when the connection must close for a reason outside it: the edge's final close,
/// a node that stopped reading, a newer connection of the node taking over, or this edge no
/// longer acting for its site.
async fn stopped(
    close_all: &CancellationToken,
    signals: &LinkSignals,
    role: watch::Receiver<Role>,
) -> CloseReason {
    tokio::select! {
        biased;
        () = close_all.cancelled() => CloseReason::Shutdown,
        () = signals.slow_consumer.cancelled() => CloseReason::SlowConsumer,
        () = signals.superseded.cancelled() => CloseReason::Superseded,
        () = stops_acting(role) => CloseReason::Standby,
    }
}

/// Resolves once `role` no longer acts; never, if its sender is gone.
async fn stops_acting(mut role: watch::Receiver<Role>) {
    if role.wait_for(|role| !role.acts()).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Why a frame error closes the connection.
pub(super) fn frame_error_reason(error: &FrameError) -> CloseReason {
    match error {
        FrameError::Io(_) => CloseReason::Io,
        FrameError::Oversized { .. } => CloseReason::OversizedFrame,
        // `Stale` is a fenced node codec's; the edge's never says it.
        FrameError::BadLength | FrameError::Decode(_) | FrameError::Stale { .. } => {
            CloseReason::ProtocolViolation
        }
    }
}
