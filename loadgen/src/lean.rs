//! A lean simulated node: registers over the real protocol, then answers every run at once
//! with a fixed plan of events, written in one batch per run so the node side costs as
//! little of the shared CPU as possible. Output texts may carry the time they were sent
//! (nanoseconds since [`epoch`]), so the receiving side can measure node→caller latency.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use anyhow::{Context, bail};
use bytes::BytesMut;
use edge::client::{
    MAX_FRAME_BYTES, NodeClient, NodeFrame, ReceivedEdgeFrame, Registration, heartbeat, run_event,
};
use edge::domain::{RunEventKind, Usage};
use edge::ports::NodeCommand;
use edge::wire::NodeCodec;
use tokio::io::AsyncWriteExt;
use tokio::task::JoinHandle;
use tokio_util::codec::Encoder;

use crate::harness;

/// Digits of a send stamp at the start of an output text.
pub const STAMP_DIGITS: usize = 20;

/// The process-wide zero of send stamps.
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`].
pub fn now_nanos() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Reads the send stamp at the start of `text`, if it has one.
pub fn stamp_of(text: &str) -> Option<u64> {
    text.get(..STAMP_DIGITS)?.parse().ok()
}

/// What a lean node answers every run with.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Output events per run.
    pub outputs: usize,
    /// Bytes of text per output (at least [`STAMP_DIGITS`] when stamped).
    pub text_bytes: usize,
    /// Whether output texts start with a send stamp.
    pub stamped: bool,
    /// Fixed output texts to use in turn instead (for the API: chat words).
    pub texts: Vec<String>,
    /// Whether each run's events are followed by a heartbeat with a `ping` (in the same
    /// write), which the edge answers with an ack: the link check at its most frequent.
    pub ping: bool,
}

impl Plan {
    fn text(&self, index: usize) -> String {
        if !self.texts.is_empty() {
            return self.texts[index % self.texts.len()].clone();
        }
        let fill = if self.stamped {
            self.text_bytes.saturating_sub(STAMP_DIGITS)
        } else {
            self.text_bytes
        };
        let mut text = String::with_capacity(self.text_bytes);
        if self.stamped {
            text.push_str(&"@".repeat(STAMP_DIGITS));
        }
        text.push_str(&"x".repeat(fill));
        text
    }
}

/// Connects to the edge and registers as generated node `index`.
pub async fn register(edge: SocketAddr, token: &str) -> anyhow::Result<NodeClient> {
    let client = NodeClient::connect(edge)
        .await
        .context("cannot connect to the edge")?;
    register_over(client, token).await
}

/// Connects to the edge from loopback address `source` (any port) and registers: a node on
/// a host of its own, as far as the kernel's connection table can tell.
pub async fn register_from(
    source: std::net::Ipv4Addr,
    edge: SocketAddr,
    token: &str,
) -> anyhow::Result<NodeClient> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    let stream = socket
        .connect(edge)
        .await
        .context("cannot connect to the edge")?;
    register_over(NodeClient::over_tcp(stream)?, token).await
}

/// Registers over a connected client.
async fn register_over(mut client: NodeClient, token: &str) -> anyhow::Result<NodeClient> {
    let mut registration = Registration::with_token(token);
    registration.adapters = vec![crate::harness::ADAPTER.into()];
    let outcome = client.register(registration).await?;
    if !outcome.accepted {
        bail!(
            "registration refused: {:?} {}",
            outcome.rejection,
            outcome.message
        );
    }
    Ok(client)
}

/// Encodes the events of one run into `out`; returns where the send stamps go.
fn encode_run(run_id: &str, plan: &Plan, out: &mut BytesMut) -> anyhow::Result<Vec<usize>> {
    let mut codec = NodeCodec::new(MAX_FRAME_BYTES);
    let mut stamps = Vec::new();
    let mut seq = 0;
    let mut push = |kind: RunEventKind, out: &mut BytesMut| -> anyhow::Result<()> {
        seq += 1;
        let frame: NodeFrame = run_event(run_id, seq, kind);
        codec.encode(frame, out)?;
        Ok(())
    };
    for index in 0..plan.outputs {
        let start = out.len();
        push(RunEventKind::text(plan.text(index)), out)?;
        if plan.stamped && plan.texts.is_empty() {
            let frame = &out[start..];
            let at = frame
                .windows(STAMP_DIGITS)
                .position(|w| w.iter().all(|b| *b == b'@'))
                .context("the stamp placeholder is missing")?;
            stamps.push(start + at);
        }
    }
    let words = u32::try_from(plan.outputs).unwrap_or(u32::MAX);
    push(
        RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(Usage::new(words, words)),
        },
        out,
    )?;
    if plan.ping {
        codec.encode(heartbeat(0, 1, None), out)?;
    }
    Ok(stamps)
}

/// The encoded events of one run, reused for every run whose id has the same length: only
/// the id's bytes (at `ids`) and the send stamps (at `stamps`) change, so a node answers a
/// run with a copy and a few patches instead of encoding every event again.
struct Template {
    id_len: usize,
    bytes: BytesMut,
    ids: Vec<usize>,
    stamps: Vec<usize>,
}

impl Template {
    fn new(run_id: &str, plan: &Plan) -> anyhow::Result<Self> {
        let mut bytes = BytesMut::new();
        let stamps = encode_run(run_id, plan, &mut bytes)?;
        let id = run_id.as_bytes();
        let ids = (0..bytes.len().saturating_sub(id.len()) + 1)
            .filter(|&at| !id.is_empty() && bytes[at..].starts_with(id))
            .collect();
        Ok(Self {
            id_len: id.len(),
            bytes,
            ids,
            stamps,
        })
    }

    /// Writes the run's events into `out`: the template with `run_id` patched in.
    fn fill(&self, run_id: &str, out: &mut BytesMut) {
        out.extend_from_slice(&self.bytes);
        for &at in &self.ids {
            out[at..at + self.id_len].copy_from_slice(run_id.as_bytes());
        }
    }
}

/// Registers `count` lean nodes (the harness's node definitions `0..count`) with the edge at
/// `edge`, each answering runs with `plan` on its own task; the tasks end with the edge.
pub async fn start_nodes(
    edge: SocketAddr,
    count: usize,
    plan: &Arc<Plan>,
) -> anyhow::Result<Vec<JoinHandle<anyhow::Result<u64>>>> {
    let mut nodes = Vec::with_capacity(count);
    for i in 0..count {
        let client = register(edge, &harness::token(i)).await?;
        let plan = Arc::clone(plan);
        nodes.push(tokio::spawn(async move { serve(client, &plan).await }));
    }
    Ok(nodes)
}

/// Answers runs until the edge closes the connection or shuts down; returns how many runs
/// it answered.
pub async fn serve(mut client: NodeClient, plan: &Plan) -> anyhow::Result<u64> {
    let mut answered = 0;
    let mut out = BytesMut::with_capacity(64 * 1024);
    let mut template: Option<Template> = None;
    loop {
        let frame = match client.next().await {
            Ok(frame) => frame,
            Err(edge::client::ClientError::Closed) => return Ok(answered),
            Err(error) => return Err(error.into()),
        };
        match frame {
            ReceivedEdgeFrame::Command(NodeCommand::Run(run)) => {
                let run_id = run.run_id.as_str();
                if template.as_ref().is_none_or(|t| t.id_len != run_id.len()) {
                    template = Some(Template::new(run_id, plan)?);
                }
                let Some(template) = &template else {
                    continue;
                };
                out.clear();
                template.fill(run_id, &mut out);
                let stamps = &template.stamps;
                if !stamps.is_empty() {
                    let stamp = format!("{:0width$}", now_nanos(), width = STAMP_DIGITS);
                    for &at in stamps {
                        out[at..at + STAMP_DIGITS].copy_from_slice(stamp.as_bytes());
                    }
                }
                client.stream_mut().write_all(&out).await?;
                answered += 1;
            }
            ReceivedEdgeFrame::Command(NodeCommand::Shutdown { .. }) => return Ok(answered),
            _ => {}
        }
    }
}
