//! A run outlives its edge: the real `edge serve` is killed with SIGKILL mid-answer and
//! started again on the same journal and node address; the reference node (still
//! generating, its events buffered) reconnects and claims the run, and the restarted edge
//! takes it back from one past the last event its journal holds. The run's record ends
//! completed with every delta once and in order. A run whose node never comes back ends
//! `unknown`/`edge_crashed` after the grace. A background Responses stream read part-way
//! before the kill is resumed after the restart by the official `openai` SDK's
//! `responses.retrieve(id, stream=True, starting_after=N)`. In the soak, every chat client
//! resumes its own stream through `GET /v1/runs/{run_id}/stream` after each kill.

use crate::admin_crash::{Edge, get, start_edge_with};
use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;
use crate::resume::open_stream_at;
use crate::stream_resume::{Event, RESUMABLE, complete, events_in, read_until, resume, text_of};

use std::path::Path;
use std::sync::Arc;

use common::{edge_serve_on, eventually_ok, write_config};
use node_support::upstream::{Reply, ScriptedEngine, chat_chunks};
use node_support::{QWEN, RunningNode, edge_config, spawn_node};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// Deltas in the answer.
pub(crate) const DELTAS: usize = 20;

/// Deltas let out before the edge is killed.
const BEFORE_THE_KILL: usize = 7;

pub fn delta(n: usize) -> String {
    format!("d{n} ")
}

/// Checks a completed run's record and its stored events: the `deltas` deltas of
/// [`delta`] once each and in order, rising seqs, every stored event counted, one
/// `completed`.
pub fn assert_every_delta_once(record: &Value, stored: &[Value], deltas: usize) {
    let texts: Vec<&str> = stored
        .iter()
        .filter(|e| e["kind"] == "output")
        .filter_map(|e| e["text"].as_str())
        .collect();
    let expected: Vec<String> = (0..deltas).map(delta).collect();
    assert_eq!(texts, expected, "every delta once, in order");
    let seqs: Vec<u64> = stored.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(
        record["events"].as_u64(),
        Some(stored.len() as u64),
        "{record}"
    );
    assert_eq!(
        stored.iter().filter(|e| e["kind"] == "completed").count(),
        1
    );
}

/// An engine streaming [`DELTAS`] deltas, one per permit of the returned gate.
async fn gated_engine() -> (ScriptedEngine, Arc<Semaphore>) {
    let gate = Arc::new(Semaphore::new(0));
    (engine_behind(&gate).await, gate)
}

/// An engine streaming [`DELTAS`] deltas, one per permit of `gate` (shared by engines).
pub(crate) async fn engine_behind(gate: &Arc<Semaphore>) -> ScriptedEngine {
    engine_with_deltas_behind(DELTAS, gate).await
}

/// An engine streaming `deltas` deltas, one per permit of `gate`.
pub(crate) async fn engine_with_deltas_behind(
    deltas: usize,
    gate: &Arc<Semaphore>,
) -> ScriptedEngine {
    engine_listing_behind(&[QWEN], deltas, gate).await
}

/// An engine listing `models` whose [`QWEN`] streams `deltas` deltas, one per permit of
/// `gate` (the other models are the caller's to script).
pub(crate) async fn engine_listing_behind(
    models: &[&str],
    deltas: usize,
    gate: &Arc<Semaphore>,
) -> ScriptedEngine {
    let engine = ScriptedEngine::start(models).await;
    let chunks = chat_chunks((0..deltas).map(delta));
    let reply = Reply::Sse {
        chunks,
        gate: Some(Arc::clone(gate)),
        hang: false,
    };
    engine.script(QWEN, reply);
    engine
}

/// A free loopback address for the edge's node listener, kept across its restarts.
fn node_listen() -> String {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    socket.local_addr().expect("its address").to_string()
}

async fn edge_at(config: &Path, listen: &str) -> Edge {
    start_edge_with(edge_serve_on(config, listen)).await
}

/// Starts a streamed chat completion in the background; returns its run id once the
/// answer has begun. The stream itself dies with the edge.
async fn start_stream(edge: &Edge) -> String {
    let body = json!({
        "model": "llama/qwen",
        "stream": true,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    });
    let (response, run_id) = open_stream_at(edge.http, "/v1/chat/completions", &body).await;
    tokio::spawn(async move {
        let mut response = response;
        while let Ok(Some(_)) = response.chunk().await {}
    });
    run_id
}

/// The run's stored events, as JSON lines.
async fn events(edge: &Edge, run_id: &str) -> Vec<Value> {
    let url = format!(
        "http://{}/admin/v1/runs/{run_id}/events?format=jsonl&follow=false",
        edge.admin
    );
    let text = crate::admin_support::client()
        .get(url)
        .send()
        .await
        .expect("the events are answered")
        .text()
        .await
        .expect("a body");
    text.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits until the run's record says `outcome`; returns the record.
async fn outcome(edge: &Edge, run_id: &str, outcome: &str) -> Value {
    let path = format!("/admin/v1/runs/{run_id}");
    eventually_ok("the run's record says how it ended", || async {
        let record = get(edge.admin, &path).await;
        if record["outcome"] == outcome {
            Ok(record)
        } else {
            Err(record.to_string())
        }
    })
    .await
}

fn config(engine: &ScriptedEngine, dir: &Path, grace_ms: u64) -> std::path::PathBuf {
    let config = format!(
        "{}\n[runs]\nresume_grace_ms = {grace_ms}\n[events]\nsinks = [\"null\"]\n",
        edge_config(&engine.base_url(), &["qwen"], 500),
    );
    write_config(dir, &config)
}

/// Kills `edge` with SIGKILL once its journal holds `outputs` outputs of `run_id`.
async fn kill_after(mut edge: Edge, run_id: &str, outputs: usize) {
    eventually_ok("the journal holds the first deltas", || async {
        let stored = events(&edge, run_id).await;
        let n = stored.iter().filter(|e| e["kind"] == "output").count();
        if n >= outputs { Ok(()) } else { Err(n) }
    })
    .await;
    edge.child.start_kill().expect("kill -9");
    common::bounded("the killed edge to exit", edge.child.wait())
        .await
        .expect("the edge is gone");
}

/// A gated engine with [`BEFORE_THE_KILL`] deltas let out, the edge's config and node
/// address, and the reference node.
struct Stack {
    engine: ScriptedEngine,
    gate: Arc<Semaphore>,
    config: std::path::PathBuf,
    listen: String,
    node: RunningNode,
    _dir: tempfile::TempDir,
}

/// A [`Stack`] and its edge (resume grace `grace_ms`).
async fn stack(grace_ms: u64) -> (Stack, Edge) {
    let (engine, gate) = gated_engine().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(&engine, dir.path(), grace_ms);
    let listen = node_listen();
    let edge = edge_at(&config, &listen).await;
    let node = spawn_node(edge.node, "token-1", |_| {});
    gate.add_permits(BEFORE_THE_KILL);
    let stack = Stack {
        engine,
        gate,
        config,
        listen,
        node,
        _dir: dir,
    };
    (stack, edge)
}

/// A [`stack`]; a streamed run that has relayed [`BEFORE_THE_KILL`] deltas, and its edge
/// killed with SIGKILL. Returns the stack and the run's id.
async fn killed_mid_answer(grace_ms: u64) -> (Stack, String) {
    let (stack, edge) = stack(grace_ms).await;
    let run_id = start_stream(&edge).await;
    kill_after(edge, &run_id, BEFORE_THE_KILL).await;
    (stack, run_id)
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_outlives_a_kill_9_of_its_edge_and_completes_once() {
    let (killed, run_id) = killed_mid_answer(30_000).await;
    let (engine, gate, run_id) = (&killed.engine, &killed.gate, &run_id);

    // The engine goes on while the edge is away: the node buffers.
    gate.add_permits(DELTAS - BEFORE_THE_KILL + 2);
    let edge = edge_at(&killed.config, &killed.listen).await;
    let record = outcome(&edge, run_id, "completed").await;
    let stored = events(&edge, run_id).await;
    assert_every_delta_once(&record, &stored, DELTAS);
    // Taken back, not run again.
    assert_eq!(engine.seen().len(), 1);
    killed.node.stop().await.expect("clean stop");
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_no_node_takes_back_ends_edge_crashed() {
    let (killed, run_id) = killed_mid_answer(300).await;
    let (config, listen, run_id) = (&killed.config, &killed.listen, &run_id);
    killed.node.kill();

    let edge = edge_at(config, listen).await;
    let record = outcome(&edge, run_id, "unknown").await;
    assert_eq!(record["code"], "edge_crashed", "{record}");
}

/// What a caller read of a background Responses stream before its connection died.
struct ReadPart {
    response_id: String,
    last_seen: u64,
    text: String,
}

/// Reads the named SSE events of `response` until `deltas` text deltas have come.
async fn read_deltas(mut response: reqwest::Response, deltas: usize) -> ReadPart {
    let (mut buffer, mut part, mut seen) = (String::new(), None::<ReadPart>, 0);
    while seen < deltas {
        let chunk = response.chunk().await.expect("the stream goes on");
        buffer.push_str(&String::from_utf8_lossy(
            &chunk.expect("more of the stream"),
        ));
        while let Some((event, rest)) = buffer.split_once("\n\n") {
            let data = event.lines().find_map(|l| l.strip_prefix("data: "));
            let event: Value = data
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or_default();
            buffer = rest.to_owned();
            let part = part.get_or_insert_with(|| ReadPart {
                response_id: event["response"]["id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                last_seen: 0,
                text: String::new(),
            });
            part.last_seen = event["sequence_number"].as_u64().expect("numbered");
            if event["type"] == "response.output_text.delta" {
                part.text
                    .push_str(event["delta"].as_str().unwrap_or_default());
                seen += 1;
            }
        }
    }
    part.expect("events were read")
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_resumes_across_a_kill_9_of_its_edge() {
    let body = json!({
        "model": "llama/qwen", "input": "tell me a long story",
        "stream": true, "background": true,
    });
    let read = |response| read_deltas(response, BEFORE_THE_KILL);
    let (after, edge, run_id, read) = read_across_a_kill("/v1/responses", &body, read).await;
    assert_eq!(read.response_id, format!("resp_bg_{run_id}"));
    let base_url = format!("http://{}", edge.http);
    let expected: String = (0..DELTAS).map(delta).collect();
    let last_seen = read.last_seen.to_string();
    let args = [
        &base_url,
        &read.response_id,
        &last_seen,
        &read.text,
        &expected,
    ];
    crate::common::python::run_client_script("responses_resume.py", &args.map(String::as_str))
        .await;
    outcome(&edge, &run_id, "completed").await;
    assert_eq!(after.engine.seen().len(), 1, "taken back, not run again");
    after.node.stop().await.expect("clean stop");
}

/// A [`stack`]; a stream of `path` with `body` read by `read` (up to [`BEFORE_THE_KILL`]
/// deltas), its edge killed with SIGKILL, the rest of the answer let out and the edge
/// started again. Returns the stack, the restarted edge, the run's id and what `read` read.
async fn read_across_a_kill<R, F: std::future::Future<Output = R>>(
    path: &str,
    body: &Value,
    read: impl FnOnce(reqwest::Response) -> F,
) -> (Stack, Edge, String, R) {
    let (stack, edge) = stack(30_000).await;
    let (response, run_id) = open_stream_at(edge.http, path, body).await;
    let read = read(response).await;
    kill_after(edge, &run_id, BEFORE_THE_KILL).await;
    stack.gate.add_permits(DELTAS - BEFORE_THE_KILL + 2);
    let edge = edge_at(&stack.config, &stack.listen).await;
    (stack, edge, run_id, read)
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_messages_stream_resumes_across_a_kill_9_of_its_edge() {
    let body = json!({
        "model": "llama/qwen", "max_tokens": 100, "stream": true,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    });
    let before: String = (0..BEFORE_THE_KILL).map(delta).collect();
    let read = |response| read_until(response, move |events| text_of(events) == before);
    let (after, edge, run_id, first) = read_across_a_kill("/v1/messages", &body, read).await;
    let http = edge.http;
    let last = first.last().map(|e| e.id.as_str());
    let rest = resume(http, &run_id, last).await;
    let joined: Vec<Event> = first.into_iter().chain(rest).collect();
    let expected: String = (0..DELTAS).map(delta).collect();
    assert_eq!(text_of(&joined), expected, "every delta once, in order");
    let end = joined.last().and_then(|e| e.name.as_deref());
    assert_eq!(end, Some("message_stop"));
    // What the first stream and the resumed one wrote is the run's stream, event for event.
    assert_eq!(joined, resume(http, &run_id, None).await);
    outcome(&edge, &run_id, "completed").await;
    assert_eq!(after.engine.seen().len(), 1, "taken back, not run again");
    after.node.stop().await.expect("clean stop");
}

/// Soak client `n` (a task running [`soak_client`]) once it has read its run's answer
/// (within [`SOAK_PATIENCE`]), checked whole and once ([`assert_whole_answer_once`]): the
/// run's id and how often the client resumed.
pub(crate) async fn answered_soak_client(
    n: usize,
    client: tokio::task::JoinHandle<(String, Vec<Event>, usize)>,
    expected_text: &str,
) -> (String, usize) {
    let (id, streamed, resumed) = common::bounded_for(
        SOAK_PATIENCE,
        format_args!("soak client {n} to read its answer"),
        client,
    )
    .await
    .expect("the client finished");
    assert_whole_answer_once(&id, &streamed, expected_text);
    (id, resumed)
}

/// What a soak client read of run `id`: no event twice, the whole answer (`expected_text`)
/// once, to `[DONE]`.
fn assert_whole_answer_once(id: &str, streamed: &[Event], expected_text: &str) {
    let orders: Vec<(u64, u32)> = streamed.iter().map(Event::order).collect();
    assert!(
        orders.is_sorted_by(|a, b| a < b),
        "run {id}: no event twice: {orders:?}"
    );
    assert_eq!(
        text_of(streamed),
        expected_text,
        "run {id}: the whole answer, once"
    );
    assert_eq!(
        streamed.last().map(|e| e.data.as_str()),
        Some("[DONE]"),
        "run {id}"
    );
}

/// What the journal stored of run `id`: its outputs are `expected`, every delta once and in
/// order, and it has one ending.
pub(crate) fn assert_stored_once(id: &str, stored: &[Value], expected: &[String]) {
    let texts: Vec<&str> = stored
        .iter()
        .filter(|e| e["kind"] == "output")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert_eq!(texts, expected, "run {id}: every delta once, in order");
    let endings = stored
        .iter()
        .filter(|e| e["kind"] != "output" && e["kind"] != "started");
    assert_eq!(endings.count(), 1, "run {id}: one ending");
}

/// Runs in the soak.
pub(crate) const SOAK_RUNS: usize = 200;

/// How often a soak client's resume may be refused by an edge that is up (asked again
/// 50 ms later each time) before the test fails with the refusal.
const MAX_REFUSALS: usize = 200;

/// The longest a soak client may take to read its run's whole answer, resumes included;
/// within the test's deadline.
const SOAK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(120);

/// Engine chunks per run: the deltas, the finish chunk and `[DONE]`.
pub(crate) const CHUNKS: usize = DELTAS + 2;

/// The open runs' records, from the run service (no journal read).
pub(crate) async fn open_runs(admin: std::net::SocketAddr) -> Vec<Value> {
    let list = get(admin, "/admin/v1/runs?state=open&limit=1000").await;
    list["runs"].as_array().cloned().unwrap_or_default()
}

/// Waits until the runs took every one of the `released` chunks the engine may send: an
/// ended run took all [`CHUNKS`]; an open one its outputs, plus its finish when every delta
/// is out (the finish becomes `completed` only with the `[DONE]` after it). Every open run
/// has its `started` relayed, so each can be taken back.
pub(crate) async fn progressed(admin: std::net::SocketAddr, released: usize) {
    eventually_ok("the runs relay what the engine sent", || async {
        let open = open_runs(admin).await;
        let taken: u64 = open
            .iter()
            .filter_map(|r| r["events"].as_u64())
            .map(|events| events.saturating_sub(1) + u64::from(events == DELTAS as u64 + 1))
            .sum();
        let ended = SOAK_RUNS.saturating_sub(open.len()) as u64;
        let taken = taken + ended * CHUNKS as u64;
        let all_started = open.iter().all(|r| r["events"].as_u64() > Some(0));
        if all_started && taken >= released as u64 {
            Ok(())
        } else {
            // Look less often than `eventually` would: a listing is not free.
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            Err(format!(
                "{} open, {taken} chunks of {released} taken",
                open.len()
            ))
        }
    })
    .await;
}

/// One soak client: starts a streamed chat completion of `prompt` (counted in `begun` once answered)
/// and reads it to its `[DONE]`,
/// resuming after its last event id through `GET /v1/runs/{run_id}/stream` whenever the
/// connection ends before (at the edge `http` says now, waiting for the next one when the
/// edge is down). Returns the run's id, every event it read and how often it resumed.
pub(crate) async fn soak_client(
    client: reqwest::Client,
    mut http: tokio::sync::watch::Receiver<std::net::SocketAddr>,
    begun: Arc<std::sync::atomic::AtomicUsize>,
    prompt: String,
) -> (String, Vec<Event>, usize) {
    let body = json!({
        "model": "llama/qwen",
        "stream": true,
        "messages": [{"role": "user", "content": prompt}],
    });
    let url = format!("http://{}/v1/chat/completions", *http.borrow_and_update());
    let request = client.post(url).header(RESUMABLE, "true").json(&body);
    let response = send_as_sdks_do(request).await;
    let id = response.headers()["x-edge-run-id"]
        .to_str()
        .unwrap()
        .to_owned();
    begun.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    let mut streamed = read_events(response).await;
    let mut resumed = 0;
    let mut refusals = 0;
    let mut last_attempt = String::from("none yet");
    let give_up = tokio::time::Instant::now() + SOAK_PATIENCE;
    while streamed.last().is_none_or(|e| e.data != "[DONE]") {
        assert!(
            tokio::time::Instant::now() < give_up,
            "run {id}: no [DONE] within {SOAK_PATIENCE:?}: {} events read, {resumed} \
             resumes, the last attempt: {last_attempt}",
            streamed.len()
        );
        let url = format!("http://{}/v1/runs/{id}/stream", *http.borrow_and_update());
        let mut request = client.get(&url);
        if let Some(last) = streamed.last() {
            request = request.header("last-event-id", &last.id);
        }
        match request.send().await {
            Ok(response) if response.status().is_success() => {
                resumed += 1;
                streamed.extend(read_events(response).await);
                last_attempt = format!("{url} read to {:?}", streamed.last().map(|e| &e.id));
            }
            // The edge is down (or not yet the new one): wait for the next. A refusal by
            // the edge that is up is asked again a little later: it was seen once, under
            // the whole suite's load, to leave a client waiting for an edge that never came.
            refused => {
                last_attempt = match &refused {
                    Ok(response) => format!("{url} answered {}", response.status()),
                    Err(error) => format!("{url} failed: {error}"),
                };
                if let Ok(response) = refused {
                    refusals += 1;
                    assert!(
                        refusals < MAX_REFUSALS,
                        "run {id}: resume refused with {}",
                        response.status()
                    );
                }
                tokio::select! {
                    changed = http.changed() => changed.expect("the test still runs"),
                    () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {}
                }
            }
        }
    }
    (id, streamed, resumed)
}

/// Sends `request` as the OpenAI and Anthropic SDKs do: tried again, a moment later, when
/// it got no answer (nothing listened, or the connection closed before an answer — a
/// balancer with no member ready) or `503` (a standby, which admits nothing), as long as
/// [`SOAK_PATIENCE`] allows; the first other answer.
pub(crate) async fn send_as_sdks_do(request: reqwest::RequestBuilder) -> reqwest::Response {
    let give_up = tokio::time::Instant::now() + SOAK_PATIENCE;
    let mut wait = std::time::Duration::from_millis(50);
    loop {
        let attempt = request.try_clone().expect("a body that can be sent again");
        let last = match attempt.send().await {
            Ok(response) if response.status() != reqwest::StatusCode::SERVICE_UNAVAILABLE => {
                return response;
            }
            Ok(response) => format!("answered {}", response.status()),
            Err(error) => format!("failed: {error}"),
        };
        assert!(
            tokio::time::Instant::now() < give_up,
            "no answer within {SOAK_PATIENCE:?}: the last attempt {last}"
        );
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(std::time::Duration::from_secs(1));
    }
}

/// The complete events of `response` until it ends or breaks.
async fn read_events(mut response: reqwest::Response) -> Vec<Event> {
    let mut text = String::new();
    while let Ok(Some(bytes)) = response.chunk().await {
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    events_in(&complete(&text))
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_runs_outlive_three_kills_of_their_edge() {
    let (engine, gate) = gated_engine().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "{}\n[runs]\nresume_grace_ms = 30000\n[events]\nsinks = [\"null\"]\n",
        edge_config(&engine.base_url(), &["qwen"], 500)
            .replace("max_concurrent_runs = 8", "max_concurrent_runs = 256"),
    );
    let config = write_config(dir.path(), &config);
    let listen = node_listen();
    let mut edge = edge_at(&config, &listen).await;
    let node = spawn_node(edge.node, "token-1", |_| {});
    // No chunk yet: every run starts (the engine answers at once, its chunks wait), and
    // none can end before all are open.
    // The engine shares one gate among all runs, so which run gets a chunk is anyone's
    // guess: the streams are started in the background, the ids read from the listing.
    let (address, http) = tokio::sync::watch::channel(edge.http);
    // One client for all: building one loads the system's CA certificates.
    let client = common::http_client();
    let begun = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..SOAK_RUNS)
        .map(|_| {
            let begun = Arc::clone(&begun);
            tokio::spawn(soak_client(
                client.clone(),
                http.clone(),
                begun,
                "tell me a long story".into(),
            ))
        })
        .collect();
    // Every run open with its `started` relayed (the node has the engine's headers), and
    // the engine streaming each: only once every stream waits at the gate for its first
    // chunk do the permits below give one to each (the gate is fair to its waiters, but a
    // stream that got its first chunk before the last one came queues for its second ahead
    // of it).
    eventually_ok("every run is open and streaming", || async {
        let open = open_runs(edge.admin).await;
        let started = open
            .iter()
            .filter(|r| r["events"].as_u64() > Some(0))
            .count();
        let streaming = engine.seen().len();
        if (open.len(), started, streaming) == (SOAK_RUNS, SOAK_RUNS, SOAK_RUNS) {
            Ok(())
        } else {
            Err(format!(
                "{} open, {started} started, {streaming} engine requests",
                open.len()
            ))
        }
    })
    .await;
    let ids: Vec<String> = open_runs(edge.admin)
        .await
        .iter()
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect();
    // A client learns its run's id from the answer's headers, which wait for the first
    // output: one chunk each (the gate lets its waiters through in order), before any kill.
    gate.add_permits(SOAK_RUNS);
    let mut released = SOAK_RUNS;
    // How many kills cut each run's stream.
    let mut cut = std::collections::HashMap::<String, usize>::new();
    eventually_ok("every client has its run's id", || async {
        let begun = begun.load(std::sync::atomic::Ordering::Acquire);
        if begun == SOAK_RUNS {
            Ok(())
        } else {
            Err(begun)
        }
    })
    .await;
    for _ in 0..3 {
        let more = 6 * SOAK_RUNS;
        gate.add_permits(more);
        released += more;
        progressed(edge.admin, released).await;
        // Every released chunk is relayed: the runs open now are open at the kill.
        for run in open_runs(edge.admin).await {
            let id = run["id"].as_str().unwrap_or_default().to_owned();
            *cut.entry(id).or_default() += 1;
        }
        edge.child.start_kill().expect("kill -9");
        common::bounded("the killed edge to exit", edge.child.wait())
            .await
            .expect("the edge is gone");
        edge = edge_at(&config, &listen).await;
        address.send_replace(edge.http);
    }
    gate.add_permits(CHUNKS * SOAK_RUNS - released);
    let expected_text: String = (0..DELTAS).map(delta).collect();
    let mut resumes = 0;
    for (n, client) in clients.into_iter().enumerate() {
        let (id, resumed) = answered_soak_client(n, client, &expected_text).await;
        // A client cut by a kill resumes; one still waiting for the edge when the next kill
        // comes resumes once for both cuts (the site soak met that 1 run in 4): at least once
        // (and its whole answer, once, is checked above).
        let kills = cut.get(&id).copied().unwrap_or_default();
        assert!(
            kills == 0 || resumed > 0,
            "run {id}: cut {kills} times, never resumed"
        );
        resumes += resumed;
        // Shown completed: the run did complete.
        outcome(&edge, &id, "completed").await;
    }
    assert!(
        resumes >= SOAK_RUNS,
        "the runs open at the first kill resumed"
    );
    let expected: Vec<String> = (0..DELTAS).map(delta).collect();
    for id in &ids {
        outcome(&edge, id, "completed").await;
        assert_stored_once(id, &events(&edge, id).await, &expected);
    }
    // Taken back each time, never run again.
    assert_eq!(engine.seen().len(), SOAK_RUNS);
    node.stop().await.expect("clean stop");
}
