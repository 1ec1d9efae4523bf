//! Issue 31 end to end with real engines: two `llama-server`s serving the tiny model (greedy),
//! each behind a reference node running as a process of its own, and a real edge (in
//! process, port 0) with the file sink. The official `openai` Python SDK
//! (`tests/python/continuation_stream.py`) streams a chat completion or a completion; once it
//! has read [`BEFORE`] pieces the test `SIGKILL`s the node process serving it. The SDK's
//! stream completes; its text is the prefix it had plus what the second engine says when
//! asked itself to go on from that prefix (the request the node builds: a trailing assistant
//! message for chat, the prompt plus the prefix for completions); the sink has one terminal
//! event; the run's record has two attempts, the second routed by `continuation`.
//!
//! Determinism without sleeps: a [`Gate`] between the first node and its engine forwards the
//! engine's SSE events one by one and holds every text event past the number the test
//! allows, so the run is mid-answer when its node dies however fast the model is. The second
//! node starts only once the first piece arrived, so the first run can only have gone to the
//! first node. The engines stay real; the gate only delays bytes.
//!
//! The node processes are this test binary run again as [`node_process`] (the reference
//! node's library, as the `edge-node` binary runs it): `cargo test -p edge` does not build
//! the `edge-node` binary, and a process is what `SIGKILL` needs.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::watch;

use crate::admin_support::{ADMIN_KEY, run_until};
use crate::common::engines::LlamaServer;
use crate::common::python::client_script;
use crate::common::{PATIENCE, TestApp};
use crate::engines_e2e::{llama_node, llama_node_probed_as_shipped};
use crate::node_support::edge_on;
use crate::resume::{is_terminal, sunk};

/// Pieces of the answer the SDK reads from the first node before it is killed.
const BEFORE: usize = 3;
const API_KEY: &str = "sk-continuation-engine";
const MODEL: &str = "llama/tiny";
/// What the SDK asks (the tiny model answers anything with its one sentence).
const PROMPT: &str = "Say hello";
/// The environment of a [`node_process`]: the edge's node address and the node's token.
const NODE_EDGE_ENV: &str = "EDGE_IT_NODE_EDGE";
const NODE_TOKEN_ENV: &str = "EDGE_IT_NODE_TOKEN";
/// Set: a [`node_process`] logs at INFO to its stderr.
const NODE_LOG_ENV: &str = "EDGE_IT_NODE_LOG";

/// Not a test: the body of the node processes [`NodeProcess::spawn`] starts (this binary,
/// run again with `--ignored --exact` and the environment naming the edge and token). Run
/// without that environment it does nothing.
#[crate::common::test]
#[ignore = "the reference node process the engine continuation tests start, not a test"]
fn node_process() {
    let (Ok(edge), Ok(token)) = (std::env::var(NODE_EDGE_ENV), std::env::var(NODE_TOKEN_ENV))
    else {
        return;
    };
    let reconnect = (Duration::from_millis(20), Duration::from_millis(200));
    let log = std::env::var_os(NODE_LOG_ENV).is_some();
    crate::node_support::node_process(edge, token, reconnect, log);
}

/// A reference node running as a process of its own, killed on drop (`readopt_engine` uses
/// it too).
pub(crate) struct NodeProcess(Child);

impl NodeProcess {
    pub(crate) fn spawn(edge: SocketAddr, token: &str) -> Self {
        Self::start(edge, token, Stdio::null(), false)
    }

    /// [`NodeProcess::spawn`], the node logging at INFO into the file at `log`.
    pub(crate) fn spawn_logged(edge: SocketAddr, token: &str, log: &std::path::Path) -> Self {
        let file = std::fs::File::create(log)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        Self::start(edge, token, Stdio::from(file), true)
    }

    fn start(edge: SocketAddr, token: &str, stderr: Stdio, logged: bool) -> Self {
        let binary = std::env::current_exe().expect("the test binary");
        let mut command = Command::new(binary);
        command
            .args([
                "continuation_engine::node_process",
                "--exact",
                "--ignored",
                "--nocapture",
            ])
            .env(NODE_EDGE_ENV, edge.to_string())
            .env(NODE_TOKEN_ENV, token)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .kill_on_drop(true);
        if logged {
            command.env(NODE_LOG_ENV, "1");
        }
        Self(command.spawn().expect("the node process starts"))
    }

    /// `SIGKILL`, and waits for the process to be gone.
    pub(crate) async fn kill(mut self) {
        crate::common::bounded("the node process to exit after SIGKILL", self.0.kill())
            .await
            .expect("the node process is killed");
    }
}

/// A TCP pass-through in front of an engine. On a connection that carries a `POST /v1/...`
/// (a completion), it forwards the engine's answer SSE event by SSE event, holding every
/// text-bearing event past the number allowed so far; anything else passes untouched
/// (`readopt_engine` uses it too).
pub(crate) struct Gate {
    pub(crate) addr: SocketAddr,
    allowed: watch::Sender<usize>,
}

impl Gate {
    /// A gate in front of `llama`.
    pub(crate) async fn before(llama: &LlamaServer) -> Self {
        let upstream = llama
            .base_url()
            .trim_start_matches("http://")
            .parse()
            .expect("llama-server's address");
        Self::start(upstream).await
    }

    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        let (allowed, watching) = watch::channel(0);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let gated = Arc::new(AtomicBool::new(false));
                tokio::spawn(requests(client_read, server_write, Arc::clone(&gated)));
                tokio::spawn(answers(server_read, client_write, gated, watching.clone()));
            }
        });
        Self { addr, allowed }
    }

    /// Lets `texts` more text events through.
    pub(crate) fn allow(&self, texts: usize) {
        self.allowed.send_modify(|allowed| *allowed += texts);
    }
}

/// Client to engine, untouched; a completion request turns the gate on for the connection.
async fn requests(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, gated: Arc<AtomicBool>) {
    let mut buffer = vec![0; 16 * 1024];
    while let Ok(n) = from.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let bytes = &buffer[..n];
        if bytes.windows(9).any(|w| w == b"POST /v1/") {
            gated.store(true, Ordering::SeqCst);
        }
        if to.write_all(bytes).await.is_err() {
            break;
        }
    }
}

/// Engine to client: untouched until the connection is gated, then up to each event's end
/// (`\n\n`) while text events are allowed.
async fn answers(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    gated: Arc<AtomicBool>,
    mut allowed: watch::Receiver<usize>,
) {
    let mut buffer = vec![0; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut released = 0;
    // The engine may finish (and close) long before the test lets its answer through.
    let mut engine_done = false;
    loop {
        // Forward every whole event that may go.
        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
            let event = &pending[..end + 2];
            if gated.load(Ordering::SeqCst) && carries_text(event) {
                if released >= *allowed.borrow() {
                    break;
                }
                released += 1;
            }
            if to.write_all(event).await.is_err() {
                return;
            }
            pending.drain(..end + 2);
        }
        if !gated.load(Ordering::SeqCst) && !pending.is_empty() {
            if to.write_all(&pending).await.is_err() {
                return;
            }
            pending.clear();
        }
        if engine_done && pending.is_empty() {
            return;
        }
        tokio::select! {
            read = from.read(&mut buffer), if !engine_done => match read {
                Ok(0) | Err(_) => engine_done = true,
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            },
            changed = allowed.changed() => if changed.is_err() { return },
        }
    }
}

/// Whether an SSE event (with whatever HTTP framing precedes it) carries answer text.
fn carries_text(event: &[u8]) -> bool {
    let text = String::from_utf8_lossy(event);
    let Some(data) = text.split("data: ").nth(1) else {
        return false;
    };
    let Ok(chunk) = serde_json::from_str::<Value>(data.trim()) else {
        return false;
    };
    let choice = &chunk["choices"][0];
    [&choice["delta"]["content"], &choice["text"]]
        .iter()
        .any(|t| t.as_str().is_some_and(|t| !t.is_empty()))
}

/// Chat or completion: the SDK's mode, and how to ask the second engine to go on.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Chat,
    Completion,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Completion => "completion",
        }
    }

    /// What `llama` adds when asked itself to go on from `prefix`, as the continuing node
    /// asks it (llama-server gives a continued chat's prefix back first; the node drops it).
    async fn continued_by(self, llama: &LlamaServer, prefix: &str) -> String {
        let (path, body) = match self {
            Self::Chat => (
                "chat/completions",
                json!({"model": llama.model(), "temperature": 0, "messages": [
                    {"role": "user", "content": PROMPT},
                    {"role": "assistant", "content": prefix},
                ]}),
            ),
            Self::Completion => (
                "completions",
                json!({"model": llama.model(), "temperature": 0,
                       "prompt": format!("{PROMPT}{prefix}")}),
            ),
        };
        let answer = llama.ask(path, &body).await;
        let choice = &answer["choices"][0];
        let text = match self {
            Self::Chat => choice["message"]["content"].as_str(),
            Self::Completion => choice["text"].as_str(),
        };
        let text = text.expect("an answer text");
        text.strip_prefix(prefix).unwrap_or(text).to_owned()
    }
}

/// How the edge and its nodes are tuned for a scenario.
#[derive(Clone, Copy)]
enum Tuning {
    /// Resume off (a killed node's runs are continued at once), probes every 200 ms.
    Quick,
    /// What an operator runs: the shipped resume grace (5 s) and the node's default probes
    /// (every 5 s, which an idle `llama-server` outlasts with its 5 s keep-alive).
    AsShipped,
}

/// The edge's config: `node-1` in front of `first`, `node-2` in front of `second` (both the
/// `llama` adapter's `tiny` target), tuned as `tuning` says, the file sink at `events`, an
/// admin key for the run's record.
fn edge_config(first: &str, second: &str, events: &str, tuning: Tuning) -> String {
    let runs = match tuning {
        Tuning::Quick => "[runs]\nresume_grace_ms = 0\n",
        Tuning::AsShipped => "",
    };
    let node = |id: &str, token: &str, url: &str| match tuning {
        Tuning::Quick => llama_node(id, token, url),
        Tuning::AsShipped => llama_node_probed_as_shipped(id, token, url),
    };
    format!(
        "[api]\nkeys = [\"{API_KEY}\"]\n[admin]\nkeys = [\"{ADMIN_KEY}\"]\n{runs}\
         [events]\nsinks = [\"file\"]\n[events.file]\npath = {events:?}\nflush_interval_ms = 20\n\
         {}{}",
        node("node-1", "token-1", first),
        node("node-2", "token-2", second),
    )
}

/// The next line the SDK script printed, as JSON (`readopt_engine` reads its script so too).
pub(crate) async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>) -> Value {
    next_line_within(lines, PATIENCE).await
}

/// [`next_line`], waiting at most `patience`.
async fn next_line_within(lines: &mut Lines<BufReader<ChildStdout>>, patience: Duration) -> Value {
    let line = tokio::time::timeout(patience, lines.next_line())
        .await
        .expect("the SDK goes on in time")
        .expect("the SDK's stdout reads")
        .expect("the SDK printed its whole answer");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"))
}

/// The whole scenario for `mode`, on engines of its own.
async fn killed_mid_answer(mode: Mode) {
    let (first, second) = tokio::join!(LlamaServer::start(), LlamaServer::start());
    continued_after_a_kill(&first, &second, mode, Tuning::Quick, Duration::ZERO).await;
}

/// One streamed `mode` run on `node-1` (in front of `first`, through a gate), whose node is
/// killed mid-answer `kill_after` once `node-2` (in front of `second`) serves: the run is
/// finished on `node-2`, nothing repeated at the seam, its record naming both nodes. The
/// edge and both nodes are new; the engines are the caller's.
async fn continued_after_a_kill(
    first: &LlamaServer,
    second: &LlamaServer,
    mode: Mode,
    tuning: Tuning,
    kill_after: Duration,
) {
    let gate = Gate::before(first).await;
    let events_dir = tempfile::tempdir().expect("tempdir");
    let events = events_dir.path().join("events.jsonl");
    let gated_url = format!("http://{}/v1", gate.addr);
    let config = edge_config(
        &gated_url,
        &second.v1_url(),
        &events.display().to_string(),
        tuning,
    );
    let app: TestApp = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let node_1 = NodeProcess::spawn(app.node_addr, "token-1");
    app.wait_for_nodes(1).await;

    let edge = format!("http://{}/v1", app.http_addr);
    let mut script = client_script(
        "continuation_stream.py",
        &[mode.name(), &edge, API_KEY, MODEL, PROMPT],
    )
    .await;
    let mut sdk = script
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the SDK script starts");
    let mut lines = BufReader::new(sdk.stdout.take().expect("piped stdout")).lines();
    // The edge answers a stream's headers with its first output.
    gate.allow(BEFORE);
    let run_id = next_line(&mut lines).await["run_id"]
        .as_str()
        .expect("the run's id")
        .to_owned();
    let mut prefix = String::new();
    for _ in 0..BEFORE {
        prefix.push_str(
            next_line(&mut lines).await["delta"]
                .as_str()
                .expect("a delta"),
        );
    }
    // The run is on node-1, held mid-answer by the gate: node-2 arrives, node-1 dies.
    let node_2 = NodeProcess::spawn(app.node_addr, "token-2");
    serving(&app, "node-2").await;
    // Not a timing assertion: where the kill falls in node-2's probe period.
    tokio::time::sleep(kill_after).await;
    node_1.kill().await;

    let mut rest = String::new();
    let end = loop {
        let line = next_line_within(&mut lines, CONTINUATION_PATIENCE).await;
        match line["delta"].as_str() {
            Some(delta) => rest.push_str(delta),
            None => break line,
        }
    };
    let status = tokio::time::timeout(PATIENCE, sdk.wait())
        .await
        .expect("the SDK ends in time")
        .expect("the SDK's status");
    assert!(status.success(), "the SDK script failed: {status}");
    let added = mode.continued_by(second, &prefix).await;
    assert!(!added.is_empty(), "the second engine adds something");
    assert_eq!(
        rest, added,
        "after the prefix {prefix:?}: only the continuation"
    );
    assert_eq!(end["text"], format!("{prefix}{added}"));
    assert_eq!(end["finish_reason"], "stop");

    let lines = sunk(&events, &run_id).await;
    assert_eq!(
        lines.iter().filter(|l| is_terminal(l)).count(),
        1,
        "{lines:#?}"
    );
    assert_eq!(
        lines.last().map(|l| l["kind"].clone()),
        Some(json!("completed"))
    );
    let id = edge::domain::RunId::new(run_id.clone());
    let record = run_until(&app, &id, "has finished", |r| r["outcome"] == "completed").await;
    let attempts = record["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 2, "{record:#}");
    assert_eq!(attempts[0]["node"], "node-1", "{record:#}");
    assert_eq!(attempts[1]["node"], "node-2", "{record:#}");
    assert_eq!(attempts[1]["route_reason"], "continuation", "{record:#}");

    node_2.kill().await;
    app.stop().await;
}

/// The longest the SDK may wait for the continuation once the node is killed: the shipped
/// resume grace (5 s) and the second engine's answer, well within.
const CONTINUATION_PATIENCE: Duration = Duration::from_secs(30);

/// Waits until node `id` is registered and its last availability report serves the
/// model.
pub(crate) async fn serving(app: &TestApp, id: &str) {
    let (adapter, target) = (
        edge::domain::AdapterName::parse("llama").expect("adapter name"),
        edge::domain::Target::parse("tiny").expect("target"),
    );
    let registry = &app.parts.registry;
    crate::common::eventually(&format!("{id} serves {MODEL}"), || {
        registry.get(id).is_some_and(|node| {
            node.availability
                .as_ref()
                .is_some_and(|a| a.serves(&adapter, &target))
        })
    })
    .await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_chat_whose_node_is_killed_mid_answer_is_finished_by_another_engine() {
    killed_mid_answer(Mode::Chat).await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_completion_whose_node_is_killed_mid_answer_is_finished_by_another_engine() {
    killed_mid_answer(Mode::Completion).await;
}

/// Issue 60 as an operator met it: two `llama-server`s idle past their 5 s keep-alive, the
/// shipped resume grace and probes, and the serving node killed mid-answer at ten moments
/// across the other node's 5 s probe period. Each run is finished by the other node: its
/// probe never took a connection the idle engine had closed for the engine gone, so that
/// node serves when the grace ends. (The quick tests above probe every 200 ms and continue
/// at once: they never met the keep-alive boundary.)
#[crate::common::test(flavor = "multi_thread", worker_threads = 2, deadline_secs = 420)]
async fn ten_streams_killed_across_the_probe_period_of_idle_engines_are_all_finished() {
    let (first, second) = tokio::join!(LlamaServer::start(), LlamaServer::start());
    for run in 0..10u64 {
        let kill_after = Duration::from_millis(500 * run);
        continued_after_a_kill(&first, &second, Mode::Chat, Tuning::AsShipped, kill_after).await;
    }
}
