//! The floor relay of the shared-core rig (`api --rig shared-core --floor`): the least a
//! relay with a protocol hop can do, so the floor any edge on this core must sit above. It
//! owns a node listener that speaks the edge's side of the node protocol with the edge's
//! own wire library ([`EdgeCodec`], [`EdgeFrame`], [`NodeFrame`]) — any registration is
//! accepted — and an HTTP/1.1 server, bare hyper as in [`crate::bare`]. Per request it reads
//! the body, sends a `RunRequest` to the next node in turn, and streams back, one body frame
//! per output event its node reports, the edge's own captured answer's SSE events
//! ([`Canned`]): output `i` is event `i`, the terminal event the rest. Per node it keeps one
//! writer task, which writes whatever commands are queued in one write, and one reader,
//! which hands each run event to its run's channel by run id. No JSON is read or rendered,
//! and there is no journal, sink, auth, admission or deadline: only the hop and the demux.
//!
//! It measures nothing and asserts nothing; the rig's client takes every figure.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use edge::client::MAX_FRAME_BYTES;
use edge::domain::{
    AdapterConfig, AdapterName, Alias, NodeId, NodeRecord, Operation, RunEventKind, RunId,
    RuntimeConfig, Target, Token,
};
use edge::ports::{NodeCommand, ReportedEvent, RunAssignment};
use edge::wire::{EdgeCodec, EdgeFrame, NodeFrame};
use futures::{Stream, StreamExt};
use http_body_util::{BodyExt, Either, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::codec::{Encoder, FramedRead};
use tokio_util::sync::CancellationToken;

use crate::bare::{self, Canned};
use crate::harness;

/// The most queued commands one write carries.
const BATCH: usize = 64;

/// Where the floor listens.
#[derive(Debug, Clone, Copy)]
pub struct Addrs {
    /// Its HTTP API.
    pub http: SocketAddr,
    /// Its node listener.
    pub nodes: SocketAddr,
}

/// One registered node's connection: its command queue and its runs in flight.
struct Link {
    commands: mpsc::UnboundedSender<EdgeFrame>,
    runs: Mutex<HashMap<RunId, mpsc::UnboundedSender<RunEventKind>>>,
}

impl Link {
    fn runs(&self) -> MutexGuard<'_, HashMap<RunId, mpsc::UnboundedSender<RunEventKind>>> {
        self.runs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands `event` to its run's channel; a terminal event ends the run's entry. An event
    /// of no run in flight (or whose caller left) is dropped.
    fn dispatch(&self, event: ReportedEvent) {
        let ReportedEvent { run_id, kind, .. } = event;
        let mut runs = self.runs();
        if kind.is_terminal() {
            if let Some(run) = runs.remove(run_id.as_str()) {
                drop(runs);
                let _ = run.send(kind);
            }
        } else if let Some(run) = runs.get(run_id.as_str()) {
            let _ = run.send(kind);
        }
    }
}

/// What the floor's tasks share.
struct Floor {
    canned: Canned,
    /// The registered nodes, in turn.
    links: Mutex<Vec<Arc<Link>>>,
    turn: AtomicUsize,
    runs: AtomicU64,
    adapter: AdapterName,
    target: Target,
    /// `runtime.max_concurrent_runs` of the nodes' config.
    max_concurrent_runs: u32,
}

impl Floor {
    fn links(&self) -> MutexGuard<'_, Vec<Arc<Link>>> {
        self.links.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next node in turn, if any is registered.
    fn pick(&self) -> Option<Arc<Link>> {
        let links = self.links();
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        links.get(turn.checked_rem(links.len())?).cloned()
    }

    /// A fresh run id, as long as the edge's.
    fn run_id(&self) -> RunId {
        let n = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        RunId::new(format!("run-f100f100-{n:06}"))
    }

    /// The definition node `index` is accepted as.
    fn record(&self, index: usize, token: &Token) -> anyhow::Result<Arc<NodeRecord>> {
        Ok(Arc::new(NodeRecord::new(
            NodeId::parse(&format!("floor-{index:06}"))?,
            Alias::parse(&format!("floora-{index:06}"))?,
            token.digest(),
            vec![AdapterConfig::new(
                self.adapter.clone(),
                vec![self.target.clone()],
                BTreeMap::new(),
            )?],
            RuntimeConfig::new(self.max_concurrent_runs, 600_000, BTreeMap::new())?,
        )))
    }
}

/// Binds loopback port 0 twice, for nodes and for HTTP, and serves both on the current
/// runtime until `stop`, answering with `canned`; nodes are told they may run
/// `max_concurrent_runs` at once. Connections still open at `stop` end with the runtime.
pub async fn start(
    canned: Canned,
    max_concurrent_runs: u32,
    stop: CancellationToken,
) -> anyhow::Result<Addrs> {
    let nodes = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let http = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addrs = Addrs {
        http: http.local_addr()?,
        nodes: nodes.local_addr()?,
    };
    let floor = Arc::new(Floor {
        canned,
        links: Mutex::new(Vec::new()),
        turn: AtomicUsize::new(0),
        runs: AtomicU64::new(0),
        adapter: AdapterName::parse(harness::ADAPTER)?,
        target: Target::parse(harness::TARGET)?,
        max_concurrent_runs: max_concurrent_runs.max(1),
    });
    tokio::spawn(accept_nodes(nodes, Arc::clone(&floor), stop.clone()));
    tokio::spawn(bare::serve_http(http, floor, answer, stop));
    Ok(addrs)
}

async fn accept_nodes(listener: TcpListener, floor: Arc<Floor>, stop: CancellationToken) {
    for index in 0.. {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let floor = Arc::clone(&floor);
        tokio::spawn(async move {
            // A node that fails or leaves is simply gone; the floor reports nothing.
            let _ = serve_node(tcp, index, &floor).await;
        });
    }
}

/// One node's connection: accepts its registration, then reads its run events until it
/// leaves, while [`write_commands`] writes what the requests queue for it.
async fn serve_node(tcp: TcpStream, index: usize, floor: &Floor) -> anyhow::Result<()> {
    tcp.set_nodelay(true)?;
    let (read, mut write) = tcp.into_split();
    let mut frames = FramedRead::new(read, EdgeCodec::new(MAX_FRAME_BYTES));
    let Some(Ok(NodeFrame::Register(attempt))) = frames.next().await else {
        anyhow::bail!("the node's first frame is no registration");
    };
    let mut codec = EdgeCodec::new(MAX_FRAME_BYTES);
    let mut out = BytesMut::new();
    let accepted = EdgeFrame::Accepted {
        record: floor.record(index, &attempt.token)?,
        resumed: Vec::new(),
        acknowledges_pings: true,
    };
    codec.encode(accepted, &mut out)?;
    write.write_all(&out).await?;
    let (commands, queue) = mpsc::unbounded_channel();
    let link = Arc::new(Link {
        commands,
        runs: Mutex::new(HashMap::new()),
    });
    floor.links().push(Arc::clone(&link));
    let writer = tokio::spawn(write_commands(write, codec, queue));
    while let Some(Ok(frame)) = frames.next().await {
        match frame {
            NodeFrame::RunEvent(event) => link.dispatch(event),
            NodeFrame::Heartbeat { ping, .. } if ping != 0 => {
                let _ = link.commands.send(EdgeFrame::HeartbeatAck { ping });
            }
            _ => {}
        }
    }
    floor.links().retain(|other| !Arc::ptr_eq(other, &link));
    // Its runs' callers see their channels close.
    link.runs().clear();
    writer.abort();
    Ok(())
}

/// Writes a node's queued commands, everything queued at once in one write (as a framed
/// sink's feed then flush would), until the queue or the socket closes.
async fn write_commands(
    mut write: OwnedWriteHalf,
    mut codec: EdgeCodec,
    mut queue: mpsc::UnboundedReceiver<EdgeFrame>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut out = BytesMut::with_capacity(64 * 1024);
    while queue.recv_many(&mut batch, BATCH).await > 0 {
        out.clear();
        for frame in batch.drain(..) {
            if codec.encode(frame, &mut out).is_err() {
                return;
            }
        }
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

type Answer = Either<StreamBody<Relay>, Either<Full<Bytes>, Empty<Bytes>>>;

/// An answer with `status` and no body.
fn status(status: StatusCode) -> Response<Answer> {
    let mut response = Response::new(Either::Right(Either::Right(Empty::new())));
    *response.status_mut() = status;
    response
}

async fn answer(floor: Arc<Floor>, request: Request<Incoming>) -> anyhow::Result<Response<Answer>> {
    let body = request.into_body().collect().await?.to_bytes();
    let stream = body.windows(13).any(|w| w == b"\"stream\":true");
    let Some(link) = floor.pick() else {
        return Ok(status(StatusCode::SERVICE_UNAVAILABLE));
    };
    let run_id = floor.run_id();
    let (events, relayed) = mpsc::unbounded_channel();
    link.runs().insert(run_id.clone(), events);
    let run = RunAssignment {
        run_id: run_id.clone(),
        adapter: floor.adapter.clone(),
        target: floor.target.clone(),
        input: body,
        content_type: "application/json".into(),
        params: BTreeMap::new(),
        deadline_ms: 0,
        operation: Operation::Chat,
        continuation: None,
        lora: None,
    };
    if link
        .commands
        .send(EdgeFrame::Command(NodeCommand::Run(run)))
        .is_err()
    {
        link.runs().remove(&run_id);
        return Ok(status(StatusCode::BAD_GATEWAY));
    }
    if stream {
        streamed(floor, relayed).await
    } else {
        whole(&floor, relayed).await
    }
}

/// The streamed answer, started (as the edge does) once the node's first event is in, so
/// the head and the first frame go out together.
async fn streamed(
    floor: Arc<Floor>,
    relayed: mpsc::UnboundedReceiver<RunEventKind>,
) -> anyhow::Result<Response<Answer>> {
    let mut relay = Relay {
        relayed,
        floor,
        sent: 0,
        closing: false,
        held: None,
    };
    match relay.next().await {
        Some(Err(_)) => return Ok(status(StatusCode::BAD_GATEWAY)),
        first => relay.held = first,
    }
    let mut response = Response::new(Either::Left(StreamBody::new(relay)));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// The whole answer, once the run's terminal event is in.
async fn whole(
    floor: &Floor,
    mut relayed: mpsc::UnboundedReceiver<RunEventKind>,
) -> anyhow::Result<Response<Answer>> {
    loop {
        match relayed.recv().await {
            Some(kind) if kind.is_terminal() => break,
            Some(_) => {}
            None => return Ok(status(StatusCode::BAD_GATEWAY)),
        }
    }
    let mut response = Response::new(Either::Right(Either::Left(Full::new(
        floor.canned.full.clone(),
    ))));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// A streamed answer's body: one canned SSE event per output event relayed (the last
/// canned event is kept for the end), then, at the terminal event, the canned events left,
/// one frame each. A run whose node leaves before its end fails the body.
struct Relay {
    relayed: mpsc::UnboundedReceiver<RunEventKind>,
    floor: Arc<Floor>,
    /// How many canned events were sent.
    sent: usize,
    /// Whether the terminal event is in.
    closing: bool,
    /// A frame taken before the body was handed over, sent first.
    held: Option<Result<Frame<Bytes>, io::Error>>,
}

impl Relay {
    /// The next canned event as a frame, if one is left (keeping `keep` for the end).
    fn canned(&mut self, keep: usize) -> Option<Result<Frame<Bytes>, io::Error>> {
        let events = &self.floor.canned.events;
        let event = events
            .get(self.sent)
            .filter(|_| self.sent + keep < events.len())?;
        self.sent += 1;
        Some(Ok(Frame::data(event.clone())))
    }
}

impl Stream for Relay {
    type Item = Result<Frame<Bytes>, io::Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(held) = self.held.take() {
            return Poll::Ready(Some(held));
        }
        loop {
            if self.closing {
                return Poll::Ready(self.canned(0));
            }
            match ready!(self.relayed.poll_recv(cx)) {
                Some(kind) if kind.is_terminal() => self.closing = true,
                Some(RunEventKind::Output { .. }) => {
                    if let Some(frame) = self.canned(1) {
                        return Poll::Ready(Some(frame));
                    }
                }
                Some(_) => {}
                None => {
                    self.closing = true;
                    self.sent = usize::MAX;
                    let left = io::Error::other("the node left before the run ended");
                    return Poll::Ready(Some(Err(left)));
                }
            }
        }
    }
}
