//! A mock node: registers with an edge, heartbeats, and answers runs with an `echo`
//! adapter that streams the input back word by word. A test double for demos and tests;
//! the edge itself never runs adapters.
//!
//! Behaviour per run comes from the run's `mock` param, else from its target when the
//! target is named after a behaviour (`echo/tools`: API requests carry no params), else from
//! the node's default: `echo` (stream and complete), `fail` (one output, then
//! `failed`/`mock_failure`), `hang` (never answer, though cancels are still honoured),
//! `drop` (one output, then drop the whole connection), `ignore_cancel` (echo, but never
//! answer a cancel), `stall` (the echo's words, then wait for the cancel and answer it with
//! the usage produced). The scripted behaviours of `scripts.rs` produce structured output:
//! `reasoning`, `tools` (two parallel streamed tool calls, or an answer to tool results),
//! `logprobs`, `length` and `filtered` (other finish reasons), and classed failures
//! `bad_request` (REQUEST, 400, `context_length_exceeded`), `node_error` (NODE) and
//! `refused` (REFUSED). Embeddings runs always get deterministic vectors; with `tokenize` set the
//! node declares tokenize and detokenize, and answers them with one token per byte of the
//! text (the byte's value) and the bytes of the tokens back.

pub mod churn;
pub mod engine;
mod scripts;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use edge::client::{
    ClientError, NodeClient, NodeFrame, NodeSender, ReceivedEdgeFrame, RegisterOutcome,
    Registration, run_event,
};
use edge::client::{NodeCommand, RunAssignment};
use edge::domain::{Operation, RunEventKind, Usage};
pub use engine::{EngineState, MockEngine};
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a mock node does with a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Stream the input back word by word, then complete.
    Echo,
    /// Send one output, then fail.
    Fail,
    /// Never answer (but honour cancels).
    Hang,
    /// Send one output, then drop the connection.
    Drop,
    /// Echo, but never answer a cancel.
    IgnoreCancel,
    /// Reasoning pieces, then the echo.
    Reasoning,
    /// Two parallel tool calls (or an answer to tool results).
    Tools,
    /// The echo with log probabilities.
    Logprobs,
    /// The echo, finishing with `length`.
    Length,
    /// The echo, finishing with `content_filter`.
    Filtered,
    /// A REQUEST-class failure (400 `context_length_exceeded`).
    BadRequest,
    /// A NODE-class failure.
    NodeError,
    /// A REFUSED-class failure.
    Refused,
    /// Stream the input back word by word, then never finish; answer the cancel with what
    /// was produced (`usage`: the words in, the words out).
    Stall,
}

impl Behaviour {
    /// Parses a behaviour's name (`echo`, `fail`, `hang`, `stall`, ...).
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "echo" => Self::Echo,
            "fail" => Self::Fail,
            "hang" => Self::Hang,
            "drop" => Self::Drop,
            "ignore_cancel" => Self::IgnoreCancel,
            "reasoning" => Self::Reasoning,
            "tools" => Self::Tools,
            "logprobs" => Self::Logprobs,
            "length" => Self::Length,
            "filtered" => Self::Filtered,
            "bad_request" => Self::BadRequest,
            "node_error" => Self::NodeError,
            "refused" => Self::Refused,
            "stall" => Self::Stall,
            _ => return None,
        })
    }
}

/// How to run a mock node.
#[derive(Debug, Clone)]
pub struct MockOptions {
    /// The pre-shared token.
    pub token: String,
    /// The id to claim; empty lets the token decide.
    pub node_id: String,
    /// Pause between output words.
    pub delay: Duration,
    /// What to do with runs that do not say.
    pub behaviour: Behaviour,
    /// Heartbeat period; `None` uses the interval the edge configured.
    pub heartbeat: Option<Duration>,
    /// Declare the tokenize and detokenize operations at registration (a node written
    /// before them does not).
    pub tokenize: bool,
    /// A managed engine behind the `echo` adapter: the node then loads and unloads its
    /// targets on the edge's command, and serves only the loaded ones.
    pub engine: Option<MockEngine>,
}

impl MockOptions {
    /// Echo runs instantly, heartbeating as configured.
    pub fn new(token: &str) -> Self {
        Self {
            token: token.into(),
            node_id: String::new(),
            delay: Duration::ZERO,
            behaviour: Behaviour::Echo,
            heartbeat: None,
            tokenize: false,
            engine: None,
        }
    }
}

/// A registered mock node serving runs in the background.
pub struct MockNode {
    /// The edge's answer to the registration.
    pub outcome: RegisterOutcome,
    commands: Arc<Mutex<Vec<NodeCommand>>>,
    kill: CancellationToken,
    task: JoinHandle<Ended>,
    engine: Option<EngineState>,
}

/// Why a mock node stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The edge sent `Shutdown` with this reason.
    Shutdown(String),
    /// The edge closed the connection.
    Closed,
    /// The node was killed or dropped its connection on purpose.
    Killed,
}

#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error("registration rejected: {0:?}")]
    Rejected(RegisterOutcome),
    #[error("the edge did not answer the registration within {0:?}")]
    Unanswered(Duration),
}

/// The longest [`MockNode::start`] waits for the edge to take its connection and answer its
/// registration: an edge that never answers fails the caller, naming the wait, rather than
/// hang it.
pub const REGISTER_PATIENCE: Duration = Duration::from_secs(15);

impl MockNode {
    /// Connects to the edge at `edge`, registers, and starts serving runs.
    pub async fn start(edge: SocketAddr, options: MockOptions) -> Result<MockNode, MockError> {
        let started = async {
            let client = NodeClient::connect(edge).await?;
            Self::start_on(client, options).await
        };
        tokio::time::timeout(REGISTER_PATIENCE, started)
            .await
            .map_err(|_| MockError::Unanswered(REGISTER_PATIENCE))?
    }

    /// Registers over an already-open connection (such as one from
    /// [`NodeClient::connect_tls`]) and starts serving runs. Unbounded: the caller bounds it.
    pub async fn start_on(
        mut client: NodeClient,
        options: MockOptions,
    ) -> Result<MockNode, MockError> {
        let mut registration = Registration::with_token(&options.token);
        registration.node_id = options.node_id.clone();
        registration.adapters = vec!["echo".into()];
        if options.tokenize {
            registration = registration.operations([Operation::Tokenize, Operation::Detokenize]);
        }
        registration = registration.managing_models(options.engine.is_some());
        let outcome = client.register(registration).await?;
        if !outcome.accepted {
            return Err(MockError::Rejected(outcome));
        }
        let heartbeat = options.heartbeat.unwrap_or_else(|| {
            let configured = outcome
                .config
                .as_ref()
                .map_or(1_000, |c| c.heartbeat_interval_ms);
            Duration::from_millis(u64::from(configured.max(1)))
        });
        let commands = Arc::new(Mutex::new(Vec::new()));
        let kill = CancellationToken::new();
        let engine = options.engine.clone().map(EngineState::new);
        let link = Link {
            heartbeat,
            commands: Arc::clone(&commands),
            kill: kill.clone(),
            engine: engine.clone(),
        };
        let task = tokio::spawn(serve(client, options, link));
        Ok(MockNode {
            outcome,
            commands,
            kill,
            task,
            engine,
        })
    }

    /// The managed engine's state, when the node has one.
    pub fn engine(&self) -> Option<&EngineState> {
        self.engine.as_ref()
    }

    /// Every command the edge sent so far.
    pub fn commands(&self) -> Vec<NodeCommand> {
        self.commands.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Drops the connection at once, as if the node's process died.
    pub fn kill(&self) {
        self.kill.cancel();
    }

    /// Waits until the node stops, and says why.
    pub async fn ended(self) -> Ended {
        self.task.await.unwrap_or(Ended::Killed)
    }
}

/// What the serving task shares with the [`MockNode`] handle.
struct Link {
    heartbeat: Duration,
    commands: Arc<Mutex<Vec<NodeCommand>>>,
    kill: CancellationToken,
    engine: Option<EngineState>,
}

async fn serve(client: NodeClient, options: MockOptions, link: Link) -> Ended {
    let Link {
        heartbeat,
        commands,
        kill,
        engine,
    } = link;
    let (sender, mut receiver) = client.split();
    let (frames, outgoing) = mpsc::channel::<NodeFrame>(1024);
    let writer = tokio::spawn(write_frames(sender, outgoing, heartbeat, kill.clone()));
    if let Some(engine) = &engine {
        let _ = frames.send(engine.report()).await;
    }
    let mut runs: HashMap<String, CancellationToken> = HashMap::new();
    let ended = loop {
        let frame = tokio::select! {
            () = kill.cancelled() => break Ended::Killed,
            frame = receiver.next() => frame,
        };
        let command = match frame {
            Some(Ok(ReceivedEdgeFrame::Command(command))) => command,
            Some(Ok(_)) => continue,
            None | Some(Err(_)) => break Ended::Closed,
        };
        if let Ok(mut seen) = commands.lock() {
            seen.push(command.clone());
        }
        let command = match &engine {
            Some(engine) => match engine.intercept(command, &frames).await {
                Some(command) => command,
                None => continue,
            },
            None => command,
        };
        match command {
            NodeCommand::Run(run) => {
                let cancel = CancellationToken::new();
                runs.retain(|_, token| !token.is_cancelled());
                runs.insert(run.run_id.to_string(), cancel.clone());
                tokio::spawn(answer(
                    run,
                    options.clone(),
                    frames.clone(),
                    cancel,
                    kill.clone(),
                ));
            }
            NodeCommand::Cancel { run_id, .. } => {
                if let Some(token) = runs.remove(run_id.as_str()) {
                    token.cancel();
                }
            }
            NodeCommand::Shutdown { reason } => break Ended::Shutdown(reason),
            NodeCommand::Model(_) => {}
        }
    };
    kill.cancel();
    let _ = writer.await;
    ended
}

async fn write_frames(
    mut sender: NodeSender,
    mut outgoing: mpsc::Receiver<NodeFrame>,
    heartbeat: Duration,
    kill: CancellationToken,
) {
    let mut ticker = tokio::time::interval(heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let frame = tokio::select! {
            () = kill.cancelled() => return,
            _ = ticker.tick() => NodeFrame::Heartbeat { active_runs: 0, ping: 0, availability: None, inventory: None },
            frame = outgoing.recv() => match frame {
                Some(frame) => frame,
                None => return,
            },
        };
        if sender.send(frame).await.is_err() {
            return;
        }
    }
}

/// The text a run asks to echo: the last chat message's content or the prompt for JSON
/// bodies, the input itself otherwise.
fn input_text(run: &RunAssignment) -> String {
    let raw = String::from_utf8_lossy(&run.input).into_owned();
    if !run.content_type.starts_with("application/json") {
        return raw;
    }
    let Ok(body) = serde_json::from_str::<serde_json::Value>(&raw) else {
        return raw;
    };
    let from_messages = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| match &m["content"] {
            serde_json::Value::String(text) => Some(text.clone()),
            serde_json::Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(|part| part["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            _ => None,
        });
    from_messages
        .or_else(|| body["prompt"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The run's `mock` param, else its target when named after a behaviour, else `default`.
fn behaviour_of(run: &RunAssignment, default: Behaviour) -> Behaviour {
    run.params
        .get("mock")
        .and_then(|b| Behaviour::parse(b))
        .or_else(|| Behaviour::parse(run.target.as_str()))
        .unwrap_or(default)
}

#[allow(
    clippy::too_many_lines,
    reason = "the echo behaviours' one script, in the order its events go out"
)]
async fn answer(
    run: RunAssignment,
    options: MockOptions,
    frames: mpsc::Sender<NodeFrame>,
    cancel: CancellationToken,
    kill: CancellationToken,
) {
    let behaviour = behaviour_of(&run, options.behaviour);
    let id = run.run_id.to_string();
    let text = input_text(&run);
    if let Some(events) = scripts::script(behaviour, &run, &text) {
        scripts::play(&id, events, options.delay, &frames, &cancel).await;
        return;
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut seq = 0;
    let mut emit = |kind: RunEventKind| {
        seq += 1;
        run_event(&id, seq, kind)
    };
    let cancelled = RunEventKind::cancelled;
    if behaviour == Behaviour::Hang {
        cancel.cancelled().await;
        let _ = frames.send(emit(cancelled("cancelled by the edge"))).await;
        return;
    }
    let _ = frames.send(emit(RunEventKind::Started)).await;
    for (i, word) in words.iter().enumerate() {
        if !options.delay.is_zero() {
            tokio::select! {
                () = tokio::time::sleep(options.delay) => {}
                () = cancel.cancelled(), if behaviour != Behaviour::IgnoreCancel => {
                    let _ = frames.send(emit(cancelled("cancelled by the edge"))).await;
                    return;
                }
            }
        }
        if cancel.is_cancelled() && behaviour != Behaviour::IgnoreCancel {
            let _ = frames.send(emit(cancelled("cancelled by the edge"))).await;
            return;
        }
        let piece = if i + 1 < words.len() {
            format!("{word} ")
        } else {
            (*word).to_owned()
        };
        let _ = frames.send(emit(RunEventKind::text(piece))).await;
        match behaviour {
            Behaviour::Fail => {
                let failed = RunEventKind::failed("mock_failure", "the mock node was told to fail");
                let _ = frames.send(emit(failed)).await;
                return;
            }
            Behaviour::Drop => {
                // Let the output reach the socket, then drop everything.
                tokio::task::yield_now().await;
                kill.cancel();
                return;
            }
            _ => {}
        }
    }
    if behaviour == Behaviour::IgnoreCancel && cancel.is_cancelled() {
        return;
    }
    let usage = Usage::new(count(words.len()), count(words.len()));
    if behaviour == Behaviour::Stall {
        cancel.cancelled().await;
        let cancelled = RunEventKind::Cancelled {
            reason: "cancelled by the edge".into(),
            usage: Some(usage),
        };
        let _ = frames.send(emit(cancelled)).await;
        return;
    }
    let completed = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(usage),
    };
    let _ = frames.send(emit(completed)).await;
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}
