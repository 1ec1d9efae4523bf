//! Routing over real TCP (issues 13 and 19): a real edge on port 0, mock nodes with their
//! scripted misbehaviours and hand-driven nodes speaking the real protocol, and real HTTP
//! clients. What a client sees — one answer, its status, `x-edge-node`, `x-edge-route`,
//! `Retry-After` — and what an operator sees — `/metrics` (parsed by Prometheus' parser,
//! as in `metrics.rs`), `/admin/v1/nodes`, the console's `nodes` and `run`, the file sink.
//!
//! Which node a session's runs go to is worked out the way the edge does it (rendezvous
//! order of the session key over the node ids), so every placement here is known in
//! advance. No test asserts how long anything took: waits poll for an effect, bounded by
//! the harness's patience; the breaker test's cooldown only has to outlast one request.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use edge::domain::NodeId;
use edge::domain::routing::hash::score;
use edge::domain::routing::{AffinityKey, BreakerState, KeySource, NodeHash};
use edge::ports::{NodeCommand, RunAssignment};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, DuplexStream, Lines};
use tokio::task::JoinHandle;

use crate::admin_support::{ADMIN_KEY, HandNode, get_ok};
use crate::api_support::{
    chat, chat_text, chunks_text, client, json_with, read_chunks, read_events,
};
use crate::common::{
    NodeTable, TestApp, bounded, bounded_for, eventually, file_sink, json_lines, numbered_nodes,
    spawn_app,
};
use crate::metrics::{scrape_until, want};
use crate::mock_node::{Behaviour, MockNode, MockOptions};
use edge_mock_node::churn::{self, Churn, Ending};

/// Two nodes.
const AB: [&str; 2] = ["node-a", "node-b"];

/// The model every test asks for, unless it asks for a scripted behaviour.
const MODEL: &str = "echo/default";

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// `[[nodes]]` for each of `ids` (`node-a` has alias `gpu-a` and token `token-a`): 4 slots,
/// heartbeats every minute (hand-driven nodes send none), serving `echo/default`,
/// `echo/bad_request` and `echo/hang`; the admin key; and `extra`.
fn config(ids: &[&str], extra: &str) -> String {
    let nodes: Vec<String> = ids
        .iter()
        .map(|id| {
            NodeTable::new(id, &id.replace("node-", "gpu-"), &token(id))
                .runtime(4, 60_000)
                .echo(&["default", "bad_request", "hang"])
                .to_string()
        })
        .collect();
    format!(
        "[admin]\nkeys = [\"{ADMIN_KEY}\"]\n{extra}\n{}",
        nodes.join("\n")
    )
}

fn token(id: &str) -> String {
    id.replace("node-", "token-")
}

/// A mock node registered as `id`, answering as `behaviour` (unless the target names one).
async fn mock(app: &TestApp, id: &str, behaviour: Behaviour) -> MockNode {
    let options = MockOptions {
        behaviour,
        ..MockOptions::new(&token(id))
    };
    MockNode::start(app.node_addr, options)
        .await
        .expect("the mock node registers")
}

/// The node among `nodes` (equal slots, all idle) that session `session`'s runs go to:
/// the highest rendezvous score of its key, as the edge ranks them.
fn home<'a>(session: &str, nodes: &[&'a str]) -> &'a str {
    let key = AffinityKey::from_client(KeySource::Session, session).expect("a session key");
    let rank = |id: &&str| score(key, NodeHash::of(&NodeId::parse(id).expect("an id")));
    nodes.iter().copied().max_by_key(rank).expect("some node")
}

/// The first of `s-0`, `s-1`, … whose runs go to `node` among `nodes`.
fn session_homed_on(node: &str, nodes: &[&str]) -> String {
    (0..)
        .map(|i| format!("s-{i}"))
        .find(|session| home(session, nodes) == node)
        .expect("some session")
}

/// A POST of `body` to the chat endpoint of the edge at `http`, in `session`.
fn post(http: SocketAddr, session: &str, body: &Value) -> RequestBuilder {
    client()
        .post(format!("http://{http}/v1/chat/completions"))
        .header("x-session-id", session)
        .json(body)
}

/// Sends `request`, which must get a response.
async fn send(request: RequestBuilder) -> Response {
    request.send().await.expect("a response")
}

/// What a client can tell of where its run went.
#[derive(Debug)]
struct Placement {
    /// `x-edge-node`.
    node: String,
    /// `x-edge-route`.
    route: String,
}

/// The placement headers of `response`.
fn placement(response: &Response) -> Placement {
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_else(|| panic!("no {name} on {response:?}"))
            .to_owned()
    };
    Placement {
        node: header("x-edge-node"),
        route: header("x-edge-route"),
    }
}

/// A whole chat answer (`200`): where it ran and its text.
async fn answered(response: Response) -> (Placement, String) {
    let placed = placement(&response);
    let body = json_with(response, StatusCode::OK).await;
    (placed, chat_text(&body).to_owned())
}

/// Asks for a whole answer to `text` in `session`; where it ran and its text.
async fn ask(app: &TestApp, session: &str, text: &str) -> (Placement, String) {
    answered(send(post(app.http_addr, session, &chat(MODEL, text, false))).await).await
}

/// The runs the edge sent `node`.
fn runs_of(node: &MockNode) -> Vec<RunAssignment> {
    node.commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Run(run) => Some(run),
            _ => None,
        })
        .collect()
}

/// The run ids the edge sent `node`.
fn run_ids(node: &MockNode) -> Vec<String> {
    runs_of(node).iter().map(|r| r.run_id.to_string()).collect()
}

/// The file sink's events at `path`, by run, in order.
fn sink_runs(path: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut runs: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for line in json_lines(path) {
        let run = line["run_id"].as_str().expect("a run id").to_owned();
        runs.entry(run).or_default().push(line);
    }
    runs
}

/// The kinds of `events`, checking that exactly one is terminal and that it is last.
fn kinds_ending_once(run: &str, events: &[Value]) -> Vec<String> {
    let kinds: Vec<String> = events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or_default().to_owned())
        .collect();
    let terminal = |k: &String| ["completed", "failed", "cancelled"].contains(&k.as_str());
    assert_eq!(
        kinds.iter().filter(|k| terminal(k)).count(),
        1,
        "{run}: {kinds:?}"
    );
    assert!(kinds.last().is_some_and(terminal), "{run}: {kinds:?}");
    kinds
}

/// The `state` of node `id` in `/admin/v1/nodes`.
async fn admin_state(app: &TestApp, id: &str) -> String {
    let list = get_ok(app, "/admin/v1/nodes").await;
    let nodes = list["nodes"].as_array().expect("a node list");
    let node = nodes.iter().find(|n| n["id"] == id).expect("the node");
    node["state"].as_str().expect("a state").to_owned()
}

/// The edge's console, driven in process through a pipe (as `serve --console` drives it
/// through standard input). Closing it stops the edge, so it lives until the test ends.
struct Console {
    input: DuplexStream,
    output: Lines<BufReader<DuplexStream>>,
}

impl Console {
    async fn open(app: &TestApp) -> Self {
        let (input, console_input) = tokio::io::duplex(4096);
        let (console_output, output) = tokio::io::duplex(64 * 1024);
        let parts = app.parts.clone();
        tokio::spawn(parts.console(console_input, console_output));
        let mut console = Self {
            input,
            output: BufReader::new(output).lines(),
        };
        let greeting = console.line().await;
        assert!(greeting.starts_with("edge console ready"), "{greeting}");
        console
    }

    async fn line(&mut self) -> String {
        tokio::time::timeout(crate::common::PATIENCE, self.output.next_line())
            .await
            .expect("the console answers in time")
            .expect("the console's output")
            .expect("a line")
    }

    /// Sends `command` and reads its `lines` lines of answer.
    async fn ask(&mut self, command: &str, lines: usize) -> Vec<String> {
        let line = format!("{command}\n");
        self.input
            .write_all(line.as_bytes())
            .await
            .expect("write to the console");
        let mut answer = Vec::with_capacity(lines);
        for _ in 0..lines {
            answer.push(self.line().await);
        }
        answer
    }

    /// The columns of node `id`'s row in the `nodes` table of `connected` nodes.
    async fn node_row(&mut self, id: &str, connected: usize) -> Vec<String> {
        let table = self.ask("nodes", connected + 1).await;
        let row = table
            .iter()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no row for {id}: {table:#?}"));
        row.split_whitespace().map(str::to_owned).collect()
    }
}

// ---------------------------------------------------------------------------------------
// Failover before the first output, and none after it
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_node_failing_before_output_is_failed_over_and_the_caller_gets_one_answer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let app = spawn_app(&config(&AB, &file_sink(&events))).await;
    let failing = mock(&app, "node-a", Behaviour::NodeError).await;
    let healthy = mock(&app, "node-b", Behaviour::Echo).await;
    app.wait_for_nodes(2).await;
    // The session's runs go to node-a first, which fails them (class NODE) before output.
    let session = session_homed_on("node-a", &AB);
    let retried = "affinity_miss; key=session; attempt=2; eligible=1";

    let (placed, text) = ask(&app, &session, "one answer please").await;
    assert_eq!(text, "one answer please");
    assert_eq!(
        (placed.node.as_str(), placed.route.as_str()),
        ("node-b", retried)
    );

    let streamed = send(post(
        app.http_addr,
        &session,
        &chat(MODEL, "streamed once", true),
    ))
    .await;
    let placed = placement(&streamed);
    assert_eq!(
        (placed.node.as_str(), placed.route.as_str()),
        ("node-b", retried)
    );
    assert_eq!(chunks_text(&read_chunks(streamed).await), "streamed once");

    // Each run went to node-a, then to node-b; nothing else was sent.
    assert_eq!(run_ids(&failing), run_ids(&healthy));
    assert_eq!(run_ids(&failing).len(), 2);
    app.assert_settled().await;
    failing.kill();
    healthy.kill();
    app.stop().await;

    // The sink: a started per attempt (with its node and attempt), the output of the
    // second, one terminal event; the first attempt's failure is not an event of the run.
    let runs = sink_runs(&events);
    assert_eq!(runs.len(), 2);
    for (run, events) in &runs {
        let kinds = kinds_ending_once(run, events);
        assert_eq!(kinds.first().map(String::as_str), Some("started"));
        assert_eq!(
            kinds.last().map(String::as_str),
            Some("completed"),
            "{kinds:?}"
        );
        let started: Vec<(&str, u64)> = events
            .iter()
            .filter(|e| e["kind"] == "started")
            .map(|e| {
                (
                    e["node"].as_str().unwrap_or_default(),
                    e["attempt"].as_u64().unwrap_or(0),
                )
            })
            .collect();
        assert_eq!(started, [("node-a", 1), ("node-b", 2)], "{run}");
        assert!(!kinds.contains(&"failed".to_owned()), "{kinds:?}");
    }
}

#[crate::common::test]
async fn a_node_dying_after_its_first_output_fails_the_run_without_a_retry() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let app = spawn_app(&config(&AB, &file_sink(&events))).await;
    let healthy = mock(&app, "node-b", Behaviour::Echo).await;
    let session = session_homed_on("node-a", &AB);

    // Streamed, then whole: each time node-a sends its first output, then dies.
    for stream in [true, false] {
        let mut doomed = HandNode::register(&app, "token-a").await;
        app.wait_for_nodes(2).await;
        let request = tokio::spawn(send(post(
            app.http_addr,
            &session,
            &chat(MODEL, "never finished", stream),
        )));
        let run = doomed.next_run().await;
        doomed
            .send(&run.run_id, edge::domain::RunEventKind::Started)
            .await;
        doomed
            .send(&run.run_id, edge::domain::RunEventKind::text("never "))
            .await;
        drop(doomed);
        let response = bounded("the request to node-a to be answered", request)
            .await
            .expect("the request task");
        let placed = placement(&response);
        assert_eq!(placed.node, "node-a");
        assert_eq!(
            placed.route,
            "affinity_hit; key=session; attempt=1; eligible=2"
        );
        if stream {
            // The client saw the output, then the error: never a second answer.
            let sse = read_events(response).await;
            let (last, before) = sse.split_last().expect("some events");
            assert_eq!(last.json()["error"]["code"], "node_disconnected", "{sse:?}");
            let chunks: Vec<Value> = before.iter().map(|e| e.json()).collect();
            assert_eq!(chunks_text(&chunks), "never ");
        } else {
            let error = json_with(response, StatusCode::BAD_GATEWAY).await;
            assert_eq!(error["error"]["code"], "node_disconnected");
        }
        app.wait_until_left("node-a").await;
    }
    assert!(runs_of(&healthy).is_empty(), "no run was tried again");
    app.assert_settled().await;
    healthy.kill();
    app.stop().await;

    let runs = sink_runs(&events);
    assert_eq!(runs.len(), 2);
    for (run, events) in &runs {
        let kinds = kinds_ending_once(run, events);
        assert_eq!(kinds, ["started", "output", "failed"], "{run}");
        assert_eq!(events[2]["code"], "node_disconnected");
    }
}

// ---------------------------------------------------------------------------------------
// Circuit breakers
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_failing_node_gets_its_breaker_opened_is_avoided_then_probed_and_used_again() {
    // Two node failures in a row open the breaker for 2 s: long enough for one request to
    // see it open, short enough to wait out.
    let breaker = "[routing.breaker]\nfailure_threshold = 2\ncooldown_ms = 2000\n";
    let app = spawn_app(&config(&AB, breaker)).await;
    let failing = mock(&app, "node-a", Behaviour::NodeError).await;
    let _healthy = mock(&app, "node-b", Behaviour::Echo).await;
    app.wait_for_nodes(2).await;
    let session = session_homed_on("node-a", &AB);
    let http = client();

    // Two runs fail on node-a and are answered by node-b; the second opens the breaker.
    for text in ["first", "second"] {
        let (placed, answer) = ask(&app, &session, text).await;
        assert_eq!((placed.node.as_str(), answer.as_str()), ("node-b", text));
        assert!(placed.route.contains("attempt=2"), "{}", placed.route);
    }
    // While it is open, the session's runs go straight to node-b: a first attempt, and
    // node-a, its home, is left out.
    let (placed, _) = ask(&app, &session, "avoided").await;
    assert_eq!(placed.node, "node-b");
    assert_eq!(
        placed.route,
        "affinity_miss; key=session; attempt=1; eligible=1"
    );
    assert_eq!(runs_of(&failing).len(), 2, "node-a got nothing while open");

    // What an operator sees: the metrics (no probe has been let through: the request above
    // was placed while the breaker was open), the management API and the console.
    let open = [
        want("edge_breakers_open", &[], 1.0),
        want("edge_breaker_transitions_total", &[("to", "open")], 1.0),
        want(
            "edge_breaker_transitions_total",
            &[("to", "half_open")],
            0.0,
        ),
        want(
            "edge_run_failovers_total",
            &[("reason", "node_failure")],
            2.0,
        ),
    ];
    scrape_until(&http, &app, &open).await;
    assert_eq!(admin_state(&app, "node-a").await, "breaker_open");
    let mut console = Console::open(&app).await;
    let row = console.node_row("node-a", 2).await;
    assert_eq!(row[2], "breaker_open", "{row:?}");
    assert!(
        row.contains(&"open".to_owned()) || row.contains(&"half-open".to_owned()),
        "{row:?}"
    );

    // node-a is mended (a healthy process takes its place); the breaker outlives the
    // connection. Once the cooldown is over the next run of the session is its probe.
    failing.kill();
    app.wait_until_left("node-a").await;
    let _mended = mock(&app, "node-a", Behaviour::Echo).await;
    app.wait_for_nodes(2).await;
    let node_a = NodeId::parse("node-a").expect("an id");
    eventually("node-a's breaker has cooled down", || {
        matches!(app.parts.runs.breaker_state(&node_a), BreakerState::Open { until } if until <= Instant::now())
    })
    .await;
    let row = console.node_row("node-a", 2).await;
    assert!(row.contains(&"half-open".to_owned()), "{row:?}");
    let hit = "affinity_hit; key=session; attempt=1; eligible=2";
    for text in ["probe", "after"] {
        let (placed, answer) = ask(&app, &session, text).await;
        assert_eq!((placed.node.as_str(), answer.as_str()), ("node-a", text));
        assert_eq!(placed.route, hit);
    }
    let closed = [
        want("edge_breakers_open", &[], 0.0),
        want(
            "edge_breaker_transitions_total",
            &[("to", "half_open")],
            1.0,
        ),
        want("edge_breaker_transitions_total", &[("to", "closed")], 1.0),
    ];
    scrape_until(&http, &app, &closed).await;
    assert_eq!(admin_state(&app, "node-a").await, "serving");
    let row = console.node_row("node-a", 2).await;
    assert_eq!(
        (row[2].as_str(), row[row.len() - 2].as_str()),
        ("serving", "closed"),
        "{row:?}"
    );
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn a_request_error_is_not_retried_and_never_trips_a_breaker() {
    let app = spawn_app(&config(&AB, "")).await;
    let a = mock(&app, "node-a", Behaviour::Echo).await;
    let b = mock(&app, "node-b", Behaviour::Echo).await;
    app.wait_for_nodes(2).await;
    let session = session_homed_on("node-a", &AB);

    // More bad requests in a row than the breaker's threshold (3).
    for _ in 0..4 {
        let body = chat("echo/bad_request", "too long for the model", false);
        let response = send(post(app.http_addr, &session, &body)).await;
        let placed = placement(&response);
        assert_eq!(placed.node, "node-a");
        assert_eq!(
            placed.route,
            "affinity_hit; key=session; attempt=1; eligible=2"
        );
        let error = json_with(response, StatusCode::BAD_REQUEST).await;
        assert_eq!(error["error"]["code"], "context_length_exceeded");
    }
    assert_eq!(runs_of(&a).len(), 4);
    assert!(
        runs_of(&b).is_empty(),
        "a bad request is not tried elsewhere"
    );
    let nothing = [
        want("edge_breakers_open", &[], 0.0),
        want("edge_breaker_transitions_total", &[("to", "open")], 0.0),
        want(
            "edge_run_failovers_total",
            &[("reason", "node_failure")],
            0.0,
        ),
        want("edge_run_failovers_total", &[("reason", "refused")], 0.0),
        want(
            "edge_run_failovers_total",
            &[("reason", "node_disconnected")],
            0.0,
        ),
    ];
    scrape_until(&client(), &app, &nothing).await;
    assert_eq!(admin_state(&app, "node-a").await, "serving");
    // node-a still takes the session's runs.
    let (placed, text) = ask(&app, &session, "still welcome").await;
    assert_eq!(
        (placed.node.as_str(), text.as_str()),
        ("node-a", "still welcome")
    );
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Affinity
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn sessions_keep_their_nodes_and_every_key_source_keeps_its_runs_together() {
    let ids = ["node-a", "node-b", "node-c", "node-d"];
    let app = spawn_app(&config(&ids, "")).await;
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(mock(&app, id, Behaviour::Echo).await);
    }
    app.wait_for_nodes(4).await;

    // Two sessions homed on different nodes, their requests interleaved.
    let sessions = [
        (session_homed_on("node-a", &ids), "node-a"),
        (session_homed_on("node-c", &ids), "node-c"),
    ];
    for round in 0..4 {
        for (session, home) in &sessions {
            let (placed, _) = ask(&app, session, &format!("turn {round}")).await;
            assert_eq!(placed.node, *home, "{session}, turn {round}");
            assert_eq!(
                placed.route,
                "affinity_hit; key=session; attempt=1; eligible=4"
            );
        }
    }

    // Without a session: `prompt_cache_key`, then `user`, then the prompt's stable prefix
    // (system message and first user message: a conversation's later turns share it).
    let system = json!({"role": "system", "content": "be brief"});
    let first = json!({"role": "user", "content": "hello"});
    let later = [
        system.clone(),
        first.clone(),
        json!({"role": "assistant", "content": "hi"}),
        json!({"role": "user", "content": "and then?"}),
    ];
    let keyed = [
        (
            "prompt_cache_key",
            json!({"prompt_cache_key": "pck-7"}),
            json!({"prompt_cache_key": "pck-7"}),
        ),
        ("user", json!({"user": "user-7"}), json!({"user": "user-7"})),
        (
            "prefix",
            json!({"messages": [system, first]}),
            json!({"messages": later}),
        ),
    ];
    for (source, one, other) in keyed {
        let mut seen = Vec::new();
        for extra in [&one, &other] {
            let mut body = chat(MODEL, "keyed", false);
            for (field, value) in extra.as_object().expect("an object") {
                body[field] = value.clone();
            }
            let response = send(
                client()
                    .post(format!("http://{}/v1/chat/completions", app.http_addr))
                    .json(&body),
            )
            .await;
            let (placed, _) = answered(response).await;
            assert!(
                placed
                    .route
                    .starts_with(&format!("affinity_hit; key={source};")),
                "{}",
                placed.route
            );
            seen.push(placed.node);
        }
        assert_eq!(seen[0], seen[1], "{source}");
    }
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn with_prefix_affinity_off_a_prompt_keys_no_run() {
    let ids = ["node-a", "node-b"];
    let app = spawn_app(&config(&ids, "[routing]\nprefix_affinity = false\n")).await;
    let mut nodes = Vec::new();
    for id in ids {
        nodes.push(mock(&app, id, Behaviour::Echo).await);
    }
    app.wait_for_nodes(2).await;
    let response = send(
        client()
            .post(format!("http://{}/v1/chat/completions", app.http_addr))
            .json(&chat(MODEL, "the same prompt", false)),
    )
    .await;
    let (placed, _) = answered(response).await;
    assert!(!placed.route.contains("key=prefix"), "{}", placed.route);
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Fair queueing and per-key limits
// ---------------------------------------------------------------------------------------

/// `[[api.keys]]` tables: `(key, name, more)`.
fn api_keys(keys: &[(&str, &str, &str)]) -> String {
    keys.iter()
        .map(|(key, name, more)| format!("[[api.keys]]\nkey = {key:?}\nname = {name:?}\n{more}\n"))
        .collect()
}

/// A whole chat answer to `text` asked with API key `key`, sent in the background.
fn keyed_request(app: &TestApp, key: &str, text: &str) -> JoinHandle<Response> {
    let request = client()
        .post(format!("http://{}/v1/chat/completions", app.http_addr))
        .bearer_auth(key)
        .json(&chat(MODEL, text, false));
    tokio::spawn(send(request))
}

/// The prompt of a run the edge sent.
fn prompt_of(run: &RunAssignment) -> String {
    let body: Value = serde_json::from_slice(&run.input).expect("a JSON body");
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[crate::common::test]
async fn a_flooding_key_delays_another_key_by_one_slot_turnover_at_most() {
    let keys = api_keys(&[
        ("sk-flood", "flood", ""),
        ("sk-calm", "calm", ""),
        ("sk-batch", "nightly", "priority = \"batch\""),
    ]);
    let node = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(1, 60_000)
        .echo(&["default"]);
    let app = spawn_app(&format!("{keys}\n{node}")).await;
    let mut hand = HandNode::register(&app, "token-a").await;
    let runs = app.parts.runs.clone();

    // The flood takes the only slot and queues five more; then a batch run and one run of
    // another key queue behind them.
    let mut requests = vec![keyed_request(&app, "sk-flood", "flood 0")];
    let mut holding = hand.next_run().await;
    for i in 1..6 {
        requests.push(keyed_request(&app, "sk-flood", &format!("flood {i}")));
    }
    eventually("five flood runs queued", || runs.queued_runs() == 5).await;
    requests.push(keyed_request(&app, "sk-batch", "batch"));
    eventually("the batch run queued", || runs.queued_runs() == 6).await;
    requests.push(keyed_request(&app, "sk-calm", "calm"));
    eventually("the calm run queued", || runs.queued_runs() == 7).await;

    // The node finishes one run at a time; the order of what it gets next is the queue's.
    let mut order = vec![prompt_of(&holding)];
    loop {
        hand.complete(&holding.run_id, "done").await;
        if order.len() == requests.len() {
            break;
        }
        holding = hand.next_run().await;
        order.push(prompt_of(&holding));
    }
    let calm = order
        .iter()
        .position(|p| p == "calm")
        .expect("calm was served");
    assert!(
        calm <= 2,
        "calm waited for more than one flood run: {order:?}"
    );
    assert_eq!(order.last().map(String::as_str), Some("batch"), "{order:?}");
    assert_eq!(order.iter().filter(|p| p.starts_with("flood")).count(), 6);
    for (i, request) in requests.into_iter().enumerate() {
        let response = bounded(format!("queued request {i} to be answered"), request)
            .await
            .expect("the request task");
        assert_eq!(response.status(), StatusCode::OK);
    }
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn a_key_over_its_limits_is_answered_429_with_retry_after() {
    let keys = api_keys(&[
        ("sk-single", "single", "max_concurrent_runs = 1"),
        ("sk-slow", "slow", "requests_per_minute = 2"),
        ("sk-free", "free", ""),
    ]);
    let app = spawn_app(&config(&["node-a"], &keys)).await;
    let _node = mock(&app, "node-a", Behaviour::Echo).await;
    app.wait_for_nodes(1).await;
    let runs = app.parts.runs.clone();
    let ask_with = |key: &'static str, model: &str| {
        client()
            .post(format!("http://{}/v1/chat/completions", app.http_addr))
            .bearer_auth(key)
            .json(&chat(model, "limited", false))
            .send()
    };

    // One run open at a time: a second is refused while the first hangs on the node.
    let hanging = tokio::spawn(ask_with("sk-single", "echo/hang"));
    eventually("the hanging run is open", || runs.open_runs() == 1).await;
    let refused = ask_with("sk-single", MODEL).await.expect("a response");
    assert_eq!(refused.headers()["retry-after"], "1");
    let error = json_with(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["error"]["code"], "concurrency_limit_exceeded");
    assert_eq!(error["error"]["type"], "rate_limit_error");
    let other = ask_with("sk-free", MODEL).await.expect("a response");
    assert_eq!(other.status(), StatusCode::OK, "another key is not limited");
    hanging.abort();
    eventually("the hanging run was cancelled", || runs.open_runs() == 0).await;
    let again = ask_with("sk-single", MODEL).await.expect("a response");
    assert_eq!(again.status(), StatusCode::OK);

    // Two starts a minute (a burst of two): the third waits its turn, told how long.
    for _ in 0..2 {
        let ok = ask_with("sk-slow", MODEL).await.expect("a response");
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let refused = ask_with("sk-slow", MODEL).await.expect("a response");
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .ok()
        .and_then(|v| v.parse().ok())
        .expect("Retry-After in seconds");
    assert!((1..=30).contains(&retry_after), "{retry_after}");
    let error = json_with(refused, StatusCode::TOO_MANY_REQUESTS).await;
    assert_eq!(error["error"]["code"], "rate_limit_exceeded");

    let counted = [
        want("edge_run_refusals_total", &[("limit", "concurrency")], 1.0),
        want("edge_run_refusals_total", &[("limit", "rate")], 1.0),
    ];
    scrape_until(&client(), &app, &counted).await;
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Issue 19: a configured model whose nodes are away waits, then 503 — never 404
// ---------------------------------------------------------------------------------------

/// The ids `GET /v1/models` lists.
async fn listed_models(app: &TestApp) -> Vec<String> {
    let list = client()
        .get(format!("http://{}/v1/models", app.http_addr))
        .send()
        .await
        .expect("a response");
    let list = json_with(list, StatusCode::OK).await;
    list["data"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

#[crate::common::test]
async fn a_request_waits_for_the_only_node_to_reconnect_and_completes() {
    let app = spawn_app(&config(&["node-a"], "")).await;
    let node = mock(&app, "node-a", Behaviour::Echo).await;
    app.wait_for_nodes(1).await;
    assert!(listed_models(&app).await.contains(&MODEL.to_owned()));
    node.kill();
    app.wait_until_left("node-a").await;
    // Listed only while servable; but asked for, it waits.
    assert!(listed_models(&app).await.is_empty());
    let request = tokio::spawn(send(post(
        app.http_addr,
        "s",
        &chat(MODEL, "back soon", false),
    )));
    let runs = app.parts.runs.clone();
    eventually("the run waits for a node", || {
        runs.waiting_by_cause() == [0, 1]
    })
    .await;

    // The operator sees why it waits: the metrics and the console's `run`.
    let waiting = [
        want("edge_runs_waiting", &[("reason", "no_node_available")], 1.0),
        want("edge_runs_waiting", &[("reason", "all_busy")], 0.0),
    ];
    scrape_until(&client(), &app, &waiting).await;
    let mut console = Console::open(&app).await;
    let answer = console.ask("run echo default from the console", 1).await;
    assert!(
        answer[0].ends_with("accepted, waiting: no node serving it is connected and available now"),
        "{answer:?}"
    );

    // The node comes back within the wait: both runs are placed and complete.
    let _node = mock(&app, "node-a", Behaviour::Echo).await;
    let answered = bounded("the waiting request to be answered", request);
    let response = answered.await.expect("the request task");
    let placed = placement(&response);
    assert_eq!(placed.node, "node-a");
    assert!(placed.route.contains("queued_ms="), "{}", placed.route);
    let body = json_with(response, StatusCode::OK).await;
    assert_eq!(chat_text(&body), "back soon");
    app.assert_settled().await;
    let none = [want(
        "edge_runs_waiting",
        &[("reason", "no_node_available")],
        0.0,
    )];
    scrape_until(&client(), &app, &none).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_request_whose_node_never_comes_back_is_503_with_retry_after_never_404() {
    let app = spawn_app(&config(&["node-a"], "[runs]\nno_node_timeout_ms = 300\n")).await;
    let node = mock(&app, "node-a", Behaviour::Echo).await;
    app.wait_for_nodes(1).await;
    node.kill();
    app.wait_until_left("node-a").await;

    for stream in [false, true] {
        let response = send(post(
            app.http_addr,
            "s",
            &chat(MODEL, "nobody home", stream),
        ))
        .await;
        assert_eq!(response.headers()["retry-after"], "1");
        let error = json_with(response, StatusCode::SERVICE_UNAVAILABLE).await;
        assert_eq!(error["error"]["code"], "no_node_available", "{error}");
    }
    // A model no node is configured for is still unknown.
    let unknown = send(post(
        app.http_addr,
        "s",
        &chat("echo/elsewhere", "?", false),
    ))
    .await;
    let error = json_with(unknown, StatusCode::NOT_FOUND).await;
    assert_eq!(error["error"]["code"], "model_not_found");
    // Runs that never reached a node are measured too (through the attribute set: a
    // route's bound instruments are made at its first dispatch).
    let route = [("adapter", "echo"), ("target", "default")];
    let failed = [
        route[0],
        route[1],
        ("outcome", "failed"),
        ("code", "no_node_available"),
    ];
    let measured = [
        want("edge_runs_finished_total", &failed, 2.0),
        want("edge_run_duration_seconds_count", &route, 2.0),
    ];
    scrape_until(&client(), &app, &measured).await;
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_churn_every_request_completes_or_fails_5xx_and_none_is_404() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let nodes = numbered_nodes(4, "gpu", 4, 60_000);
    let app = spawn_app(&format!("{}\n{nodes}", file_sink(&events))).await;
    let plan = Churn {
        node_addr: app.node_addr,
        http_addr: app.http_addr,
        tokens: (0..4).map(|i| format!("token-{i}")).collect(),
        model: MODEL.to_owned(),
        requests: 300,
        concurrency: 16,
        words: 8,
        word_delay: Duration::from_millis(5),
        up_ms: 150..600,
        down_ms: 20..300,
        seed: 19,
    };
    let churned = churn::run(&plan);
    let report = bounded_for(
        Duration::from_secs(120),
        "the churn's 300 requests",
        churned,
    )
    .await;

    let wrong: Vec<&churn::Answer> = report
        .answers
        .iter()
        .filter(|a| match &a.ending {
            Ending::Completed | Ending::StreamError { .. } => false,
            Ending::Refused { status, .. } => *status < 500,
            Ending::Broken(_) => true,
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "neither complete nor a 5xx nor a stream error: {wrong:#?}"
    );
    assert_eq!(report.refused_with(404), 0);
    assert_eq!(report.answers.len(), 300);
    assert!(report.drops > 0, "the nodes churned");
    eprintln!(
        "churn: {} requests, {} completed, {} cut after output, {} drops",
        report.answers.len(),
        report.completed(),
        report.cut_after_output(),
        report.drops
    );
    app.assert_settled().await;
    app.stop().await;

    // Every accepted run ended exactly once in the sink, and nothing else ran.
    let runs = sink_runs(&events);
    let accepted: Vec<&String> = report
        .answers
        .iter()
        .filter_map(|a| a.run_id.as_ref())
        .collect();
    assert_eq!(runs.len(), accepted.len());
    for run in accepted {
        let events = runs
            .get(run)
            .unwrap_or_else(|| panic!("{run} is not in the sink"));
        kinds_ending_once(run, events);
    }
}
