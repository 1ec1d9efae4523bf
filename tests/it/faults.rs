//! Fault injection: what the edge does when a node dies, goes half-open, stops reading or
//! sends garbage; when wrong tokens flood the node port; when an event sink cannot write;
//! and when it is told to stop with runs in flight.
//!
//! Each scenario runs a real edge (in process on port 0, or the real binary) against nodes
//! speaking the real protocol over real TCP, and checks the edge's guarantee — every
//! accepted run ends with exactly one terminal event — together with what must keep
//! working around the fault. Every wait is bounded by [`PATIENCE`]; no test asserts how
//! long anything took. The catalogue of these faults is `docs/operations.md`, "Fault
//! catalogue".

use crate::common;
use crate::mock_node;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use bytes::Bytes;
use common::runs::{failure_code, next_event, only_terminal, rest, start, words};
use common::{
    Logs, NodeTable, PATIENCE, TWO_NODES, TestApp, edge_serve, eventually, eventually_ok,
    file_sink, json_lines, logged, spawn_app, two_nodes_with_node_a_heartbeat, watch_stderr,
    write_config,
};
use edge::client::{ClientError, NodeClient, ReceivedEdgeFrame, Registration};
use edge::domain::{
    AdapterName, EventOrigin, NodeSelector, RegisterRejection, RunEvent, RunEventKind, RunSpec,
    Target,
};
use edge::ports::{CloseReason, NodeCommand};
use edge::ports::{Placed, RunHandle};
use futures::StreamExt;
use mock_node::{Behaviour, Ended, MockNode, MockOptions};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::Child;

// ---------------------------------------------------------------------------------------
// Helpers: runs and their events
// ---------------------------------------------------------------------------------------

/// A run of `echo/default` pinned to `pin`, with `input`, told to behave as `mock`.
fn pinned(pin: &str, input: impl Into<Bytes>, mock: &str) -> RunSpec {
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("echo").expect("adapter"),
            target: Target::parse("default").expect("target"),
            pin: Some(pin.to_owned()),
        },
        input: input.into(),
        content_type: "text/plain; charset=utf-8".into(),
        params: BTreeMap::from([("mock".to_owned(), mock.to_owned())]),
        deadline: None,
        operation: edge::domain::Operation::Unspecified,
        routing: Default::default(),
    }
}

/// The output texts of `events`, joined.
fn text_of(events: &[Arc<RunEvent>]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output { text, .. } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Runs `input` to completion on node `pin` and checks every word came back.
async fn completes_on(app: &TestApp, pin: &str, input: &str) {
    let mut handle = start(app, pinned(pin, input.to_owned(), "echo"));
    let events = rest(&mut handle).await;
    let last = only_terminal(&handle.run_id, &events);
    assert_eq!(last.kind.name(), "completed", "{events:#?}");
    assert_eq!(last.node.as_ref().map(|n| n.as_str()), Some(pin));
    assert_eq!(text_of(&events), input);
}

/// Waits for a run of `words(count)` to end and checks it completed having lost nothing.
async fn completes_with_every_word(handle: &mut RunHandle, count: usize) {
    let events = rest(handle).await;
    assert_eq!(
        only_terminal(&handle.run_id, &events).kind.name(),
        "completed"
    );
    assert_eq!(text_of(&events), words(count), "the run lost nothing");
}

/// Waits for a run's stream to end and checks it ended with `failed`/`code` from the edge.
async fn fails_with(handle: &mut RunHandle, code: &str) -> Vec<Arc<RunEvent>> {
    let events = rest(handle).await;
    let last = only_terminal(&handle.run_id, &events);
    assert_eq!(failure_code(last), code, "{events:#?}");
    assert_eq!(last.origin, EventOrigin::Edge);
    events
}

// ---------------------------------------------------------------------------------------
// Helpers: nodes, waiting, the edge's state
// ---------------------------------------------------------------------------------------

/// Starts a mock node for `token` whose runs pause `delay` between words.
async fn mock(addr: SocketAddr, token: &str, delay: Duration, behaviour: Behaviour) -> MockNode {
    let options = MockOptions {
        delay,
        behaviour,
        ..MockOptions::new(token)
    };
    tokio::time::timeout(PATIENCE, MockNode::start(addr, options))
        .await
        .expect("the mock node registers in time")
        .expect("mock node registers")
}

/// Starts a mock node for `token` that echoes its runs' input, pausing `delay` between
/// words.
async fn echo_mock(addr: SocketAddr, token: &str, delay: Duration) -> MockNode {
    mock(addr, token, delay, Behaviour::Echo).await
}

/// Registers a raw protocol client for `token`, offering the echo adapter; the test then
/// decides what it reads and writes.
async fn raw_node(app: &TestApp, token: &str) -> NodeClient {
    let mut client = NodeClient::connect(app.node_addr).await.expect("connect");
    let mut registration = Registration::with_token(token);
    registration.adapters = vec!["echo".into()];
    let outcome = within(client.register(registration))
        .await
        .expect("a register response");
    assert!(outcome.accepted, "{outcome:?}");
    client
}

/// Awaits `future`, failing the test if it has not finished within [`PATIENCE`].
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("the step did not finish in time")
}

/// Asserts the edge closed `client`'s connection (EOF or a reset), after any commands it
/// had already queued.
async fn assert_closed_by_edge(client: &mut NodeClient) {
    loop {
        match within(client.next()).await {
            Ok(ReceivedEdgeFrame::Command(_)) => {}
            Err(ClientError::Closed | ClientError::Frame(edge::client::FrameError::Io(_))) => {
                return;
            }
            other => panic!("expected the edge to close the connection, got {other:?}"),
        }
    }
}

/// The kinds of the lines of `run_id` in the file sink, in order.
fn kinds_in_file(lines: &[Value], run_id: &str) -> Vec<String> {
    lines
        .iter()
        .filter(|l| l["run_id"] == run_id)
        .map(|l| l["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

// ---------------------------------------------------------------------------------------
// Helpers: HTTP
// ---------------------------------------------------------------------------------------

fn http() -> reqwest::Client {
    crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// The sum of the samples of metric `name` whose labels include `label` (`key="value"`),
/// from the edge's `/metrics`.
async fn metric(http_addr: SocketAddr, name: &str, label: &str) -> f64 {
    let body = http()
        .get(format!("http://{http_addr}/metrics"))
        .send()
        .await
        .expect("scrape /metrics")
        .text()
        .await
        .expect("a metrics body");
    body.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits until metric `name{label}` is above zero, and returns it.
async fn metric_above_zero(http_addr: SocketAddr, name: &str, label: &str) -> f64 {
    eventually_ok(&format!("{name}{{{label}}} is above zero"), || async move {
        let value = metric(http_addr, name, label).await;
        if value > 0.0 {
            Ok(value)
        } else {
            Err("it is zero")
        }
    })
    .await
}

/// Asserts the edge at `http_addr` answers `/healthz` with success.
async fn assert_healthy(http_addr: SocketAddr) {
    let health = http()
        .get(format!("http://{http_addr}/healthz"))
        .send()
        .await
        .expect("healthz");
    assert!(health.status().is_success());
}

/// A legacy completion of `prompt` by `model`, answered whole.
fn completion(model: &str, prompt: &str) -> Value {
    json!({"model": model, "prompt": prompt})
}

// ---------------------------------------------------------------------------------------
// Helpers: the real binary
// ---------------------------------------------------------------------------------------

/// The real `edge` binary, serving on free ports, its stderr (JSON logs) collected.
struct EdgeProcess {
    child: Child,
    node_addr: SocketAddr,
    http_addr: SocketAddr,
    logs: Logs,
}

impl EdgeProcess {
    /// Starts `edge serve` with `config`; `close_stdout` closes the read end of its stdout
    /// pipe at once (otherwise stdout goes nowhere).
    async fn start(config: &Path, close_stdout: bool) -> EdgeProcess {
        let mut child = edge_serve(config)
            .stdin(Stdio::null())
            .stdout(if close_stdout {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn the edge binary");
        // Closing our end of the pipe: every write to the edge's stdout now fails (EPIPE).
        drop(child.stdout.take());
        let (logs, bound) = watch_stderr(child.stderr.take().expect("piped stderr"));
        let (node_addr, http_addr) = match tokio::time::timeout(PATIENCE, bound).await {
            Ok(Ok(addrs)) => addrs,
            _ => panic!(
                "the edge never logged `edge is serving`; stderr: {:#?}",
                logged(&logs)
            ),
        };
        EdgeProcess {
            child,
            node_addr,
            http_addr,
            logs,
        }
    }

    /// Its stderr lines so far.
    fn logs(&self) -> Vec<String> {
        logged(&self.logs)
    }

    /// Sends SIGTERM.
    fn terminate(&self) {
        common::terminate(&self.child);
    }

    /// Waits for the process to exit.
    async fn exit_status(&mut self) -> ExitStatus {
        match tokio::time::timeout(PATIENCE, self.child.wait()).await {
            Ok(status) => status.expect("wait for the edge"),
            Err(_) => panic!("the edge did not exit; stderr: {:#?}", self.logs()),
        }
    }

    /// Asserts the edge logged no panic.
    fn assert_no_panic(&self) {
        let logs = self.logs();
        assert!(
            !logs.iter().any(|l| l.contains("panicked")),
            "the edge panicked: {logs:#?}"
        );
    }

    /// Waits for the process to exit and checks it exited 0, logged no panic, and told each
    /// of `nodes` to shut down.
    async fn assert_clean_exit(&mut self, nodes: [MockNode; 2]) {
        let status = self.exit_status().await;
        assert!(
            status.success(),
            "exit {status}; stderr: {:#?}",
            self.logs()
        );
        self.assert_no_panic();
        for node in nodes {
            let ended = within(node.ended()).await;
            assert!(matches!(ended, Ended::Shutdown(_)), "{ended:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// A node dies
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_node_killed_mid_stream_fails_its_runs_and_the_other_node_streams_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let app = spawn_app(&format!("{TWO_NODES}\n{}", file_sink(&events))).await;
    let a = echo_mock(app.node_addr, "token-a", Duration::from_millis(20)).await;
    let _b = echo_mock(app.node_addr, "token-b", Duration::from_millis(10)).await;

    let mut doomed = start(&app, pinned("node-a", words(500), "echo"));
    let mut survivor = start(&app, pinned("node-b", words(60), "echo"));
    let mut seen = vec![next_event(&mut doomed).await, next_event(&mut doomed).await];
    assert_eq!(seen[1].kind.name(), "output", "node-a is streaming");
    assert_eq!(next_event(&mut survivor).await.kind.name(), "started");
    a.kill();

    seen.extend(fails_with(&mut doomed, "node_disconnected").await);
    let last = only_terminal(&doomed.run_id, &seen);
    assert_eq!(last.node.as_ref().map(|n| n.as_str()), Some("node-a"));
    completes_with_every_word(&mut survivor, 60).await;

    app.wait_until_left("node-a").await;
    let stats = app.parts.transport.stats();
    assert_eq!(
        stats.disconnects(CloseReason::Eof) + stats.disconnects(CloseReason::Io),
        1,
        "the killed node's connection counts as closed by the node"
    );
    // The node comes back and serves again.
    let _a = echo_mock(app.node_addr, "token-a", Duration::ZERO).await;
    completes_on(&app, "node-a", "back again").await;
    app.assert_settled().await;
    app.stop().await;

    // The sink recorded the killed run's one terminal event, and it was the edge's.
    let lines = json_lines(&events);
    let kinds = kinds_in_file(&lines, doomed.run_id.as_str());
    assert_eq!(
        kinds.iter().filter(|k| *k == "failed").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("failed"),
        "{kinds:?}"
    );
    assert_eq!(
        kinds_in_file(&lines, survivor.run_id.as_str())
            .last()
            .map(String::as_str),
        Some("completed")
    );
}

#[crate::common::test]
async fn a_half_open_node_is_evicted_by_the_heartbeat_timeout_and_its_run_fails() {
    // node-a must heartbeat every 300 ms; node-b keeps the default 1 s.
    let app = spawn_app(&two_nodes_with_node_a_heartbeat(300)).await;
    let _b = echo_mock(app.node_addr, "token-b", Duration::ZERO).await;
    let mut half_open = raw_node(&app, "token-a").await;
    within(half_open.heartbeat(0)).await.expect("heartbeat");

    let mut handle = start(&app, pinned("node-a", "never answered", "echo"));
    match within(half_open.next()).await {
        Ok(ReceivedEdgeFrame::Command(NodeCommand::Run(run))) => {
            assert_eq!(run.run_id, handle.run_id);
        }
        other => panic!("expected the run, got {other:?}"),
    }
    // From here the node neither sends nor reads, and never closes its socket: the edge
    // sees no FIN, only silence.
    let events = fails_with(&mut handle, "node_disconnected").await;
    assert_eq!(events.len(), 1, "the node never started: {events:#?}");
    assert_eq!(
        app.parts
            .transport
            .stats()
            .disconnects(CloseReason::HeartbeatTimeout),
        1
    );
    assert!(app.parts.registry.get("node-a").is_none());
    completes_on(&app, "node-b", "still here").await;

    // Seen from the node: the edge closed the connection.
    assert_closed_by_edge(&mut half_open).await;
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// A node stops reading
// ---------------------------------------------------------------------------------------

/// node-a (`echo/default`): takes many runs at once and heartbeats rarely, so only what
/// it reads or writes can be at fault.
fn greedy_node_a() -> NodeTable {
    NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(1000, 60000)
        .echo(&["default"])
}

/// node-a from [`greedy_node_a`] and node-b, an ordinary node. The edge queues 4 commands
/// per node and gives one write 200 ms.
fn not_reading() -> String {
    let node_b = NodeTable::new("node-b", "gpu-b", "token-b")
        .runtime(2, 1000)
        .echo(&["default"]);
    format!(
        "[server]\noutbound_queue = 4\nwrite_timeout_ms = 200\n\n{}\n{node_b}",
        greedy_node_a()
    )
}

/// Runs offered to the node that does not read; 1 MiB each. Buffering them all would
/// take this many MiB.
const OFFERED_RUNS: usize = 256;
const RUN_INPUT_BYTES: usize = 1024 * 1024;

#[crate::common::test]
async fn a_node_that_stops_reading_is_closed_as_a_slow_consumer_with_bounded_memory() {
    let app = spawn_app(&not_reading()).await;
    let _b = echo_mock(app.node_addr, "token-b", Duration::ZERO).await;
    // Registers, then never reads its socket again (and never closes it).
    let not_reading = raw_node(&app, "token-a").await;
    let input = Bytes::from(vec![b'x'; RUN_INPUT_BYTES]);
    let stats = app.parts.transport.stats();

    // Offer 1 MiB runs one at a time, so the edge's socket buffers fill before its
    // outbound queue does, until the edge gives up on the node.
    let mut handles = Vec::new();
    for _ in 0..OFFERED_RUNS {
        match app
            .parts
            .runs
            .start(pinned("node-a", input.clone(), "echo"))
        {
            Ok(handle) if matches!(handle.placed, Placed::Sent(_)) => handles.push(handle),
            // node-a has left, or its breaker opened on the sends that failed: a run pinned
            // to it now waits for it.
            Ok(mut waiting) => {
                app.parts.runs.cancel(&waiting.run_id, "node-a left").await;
                let events = rest(&mut waiting).await;
                assert_eq!(
                    only_terminal(&waiting.run_id, &events).kind.name(),
                    "cancelled"
                );
                break;
            }
            Err(other) => panic!("unexpected refusal: {other}"),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        handles.len() < OFFERED_RUNS,
        "the edge kept taking runs for a node that reads nothing"
    );
    app.wait_until_left("node-a").await;
    assert!(!handles.is_empty());
    for handle in &mut handles {
        fails_with(handle, "node_disconnected").await;
    }
    assert_eq!(stats.closed(CloseReason::SlowConsumer), 1);
    assert_eq!(stats.disconnects(CloseReason::SlowConsumer), 1);
    // The edge wrote what the socket took and dropped the rest with the connection.
    let written = stats.bytes_out.load(Relaxed);
    let offered = u64::try_from(handles.len() * RUN_INPUT_BYTES).unwrap_or(u64::MAX);
    assert!(
        written < offered,
        "{written} bytes written of {offered} offered"
    );
    // Memory stays bounded because nothing beyond the outbound queue is buffered: the
    // bytes above show it. The process's resident memory is not asserted here, since the
    // tests of this binary share one process; the load generator measures the edge's.

    completes_on(&app, "node-b", "unaffected by the slow one").await;
    drop(not_reading);
    app.assert_settled().await;
    app.stop().await;
}

/// node-a from [`greedy_node_a`] alone; one write may take a minute — far longer than the
/// graceful stop's 2 s grace (set by the harness) and than [`PATIENCE`].
fn stuck_write() -> String {
    format!("[server]\nwrite_timeout_ms = 60000\n\n{}", greedy_node_a())
}

#[crate::common::test]
async fn a_node_stuck_in_a_write_does_not_hold_up_a_graceful_stop() {
    let app = spawn_app(&stuck_write()).await;
    let not_reading = raw_node(&app, "token-a").await;
    // 32 MiB of runs: more than any socket buffer holds, so the edge's write blocks.
    let input = Bytes::from(vec![b'x'; RUN_INPUT_BYTES]);
    let mut handles: Vec<RunHandle> = (0..32)
        .map(|_| start(&app, pinned("node-a", input.clone(), "echo")))
        .collect();
    let stats = app.parts.transport.stats();
    let runs = app.parts.runs.clone();

    // The stop ends the runs after the grace and then closes the connection, although the
    // edge's write to it would not time out for a minute.
    within(app.stop()).await;
    for handle in &mut handles {
        fails_with(handle, "edge_shutdown").await;
    }
    assert_eq!(runs.open_runs(), 0);
    assert_eq!(stats.closed(CloseReason::Shutdown), 1);
    assert_eq!(stats.closed(CloseReason::SlowConsumer), 0);
    drop(not_reading);
}

// ---------------------------------------------------------------------------------------
// A node sends garbage
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn garbage_after_a_valid_registration_closes_that_node_and_fails_only_its_runs() {
    // Long heartbeats: only the garbage can close node-a.
    let app = spawn_app(&two_nodes_with_node_a_heartbeat(60000)).await;
    let _b = echo_mock(app.node_addr, "token-b", Duration::from_millis(10)).await;
    let mut bad = raw_node(&app, "token-a").await;

    let mut on_a = start(&app, pinned("node-a", "lost", "echo"));
    match within(bad.next()).await {
        Ok(ReceivedEdgeFrame::Command(NodeCommand::Run(run))) => {
            assert_eq!(run.run_id, on_a.run_id);
        }
        other => panic!("expected the run, got {other:?}"),
    }
    let mut on_b = start(&app, pinned("node-b", words(40), "echo"));
    assert_eq!(next_event(&mut on_b).await.kind.name(), "started");

    // A three-byte frame whose bytes are not a NodeMessage.
    bad.stream_mut()
        .write_all(&[0x03, 0xff, 0xff, 0xff])
        .await
        .expect("write garbage");
    assert_closed_by_edge(&mut bad).await;
    fails_with(&mut on_a, "node_disconnected").await;
    completes_with_every_word(&mut on_b, 40).await;

    app.wait_until_left("node-a").await;
    assert!(app.parts.registry.get("node-b").is_some());
    assert_eq!(
        app.parts
            .transport
            .stats()
            .disconnects(CloseReason::ProtocolViolation),
        1
    );
    // node-a may come back.
    let _a = echo_mock(app.node_addr, "token-a", Duration::ZERO).await;
    completes_on(&app, "node-a", "registered again").await;
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// A flood of wrong tokens
// ---------------------------------------------------------------------------------------

/// Wrong-token connections in the flood.
const BAD_TOKENS: usize = 1_000;
/// Wrong-token connections open at once.
const BAD_AT_ONCE: usize = 64;

#[crate::common::test]
async fn a_thousand_bad_tokens_are_refused_while_valid_nodes_keep_registering() {
    // A small brake: 1 ms, doubling per failure from the same address, up to 100 ms.
    let config = format!(
        "[server]\nregister_failure_delay_ms = 1\nregister_failure_max_delay_ms = 100\n{TWO_NODES}"
    );
    let app = spawn_app(&config).await;
    let addr = app.node_addr;

    let flood = tokio::spawn(async move {
        futures::stream::iter(0..BAD_TOKENS)
            .map(|i| async move {
                let mut client = within(NodeClient::connect(addr)).await.expect("connect");
                let outcome =
                    within(client.register(Registration::with_token(&format!("wrong-token-{i}"))))
                        .await
                        .expect("an answer to a wrong token");
                assert!(!outcome.accepted, "{outcome:?}");
                assert_eq!(outcome.rejection, Some(RegisterRejection::InvalidToken));
                assert_closed_by_edge(&mut client).await;
            })
            .buffer_unordered(BAD_AT_ONCE)
            .count()
            .await
    });

    // Meanwhile valid nodes, from the very same address, keep joining, serving a run and
    // leaving. Each must be let in (within the test's patience) while the flood lasts.
    let mut rounds = 0;
    while !flood.is_finished() || rounds < 3 {
        for (token, id) in [("token-a", "node-a"), ("token-b", "node-b")] {
            let node = echo_mock(addr, token, Duration::ZERO).await;
            assert_eq!(node.outcome.node_id, id);
            completes_on(&app, id, &format!("round {rounds}")).await;
            node.kill();
            within(node.ended()).await;
            app.wait_until_left(id).await;
        }
        rounds += 1;
    }
    let refused = within(flood).await.expect("the flood task");
    assert_eq!(refused, BAD_TOKENS);

    let stats = app.parts.transport.stats();
    assert_eq!(
        stats.rejected(RegisterRejection::InvalidToken),
        u64::try_from(BAD_TOKENS).unwrap_or(u64::MAX)
    );
    assert_eq!(
        stats.registrations_accepted.load(Relaxed),
        2 * u64::try_from(rounds).unwrap_or(u64::MAX)
    );
    eventually("every refused connection is closed", || {
        stats.connections_open.load(Relaxed) == 0
    })
    .await;
    app.assert_settled().await;
    app.stop().await;
}

// ---------------------------------------------------------------------------------------
// Event sinks that cannot write
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_file_sink_on_a_full_disk_counts_write_errors_while_runs_complete() {
    let app = spawn_app(&format!(
        "{TWO_NODES}\n{}",
        file_sink(Path::new("/dev/full"))
    ))
    .await;
    let _a = echo_mock(app.node_addr, "token-a", Duration::ZERO).await;
    let _b = echo_mock(app.node_addr, "token-b", Duration::ZERO).await;

    for i in 0..20 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        completes_on(&app, node, &format!("run {i} on a full disk")).await;
    }
    let errors = metric_above_zero(
        app.http_addr,
        "edge_sink_write_errors_total",
        "sink=\"file\"",
    )
    .await;
    assert!(errors >= 1.0);

    // Still serving: health, nodes, and new runs.
    assert_healthy(app.http_addr).await;
    assert_eq!(app.parts.registry.len(), 2);
    completes_on(&app, "node-a", "and one more").await;
    app.assert_settled().await;
    app.stop().await;
}

#[crate::common::test]
async fn a_closed_stdout_does_not_stop_the_binary_serving_and_sigterm_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = "[events]\nsinks = [\"stdout\"]\n[events.stdout]\nformat = \"text\"\n";
    let config = write_config(dir.path(), &format!("{TWO_NODES}\n{events}"));
    let mut edge = EdgeProcess::start(&config, true).await;
    let a = echo_mock(edge.node_addr, "token-a", Duration::ZERO).await;
    let b = echo_mock(edge.node_addr, "token-b", Duration::ZERO).await;

    let url = format!("http://{}/v1/completions", edge.http_addr);
    for i in 0..10 {
        let prompt = format!("run {i} with nowhere to print");
        let response = http()
            .post(&url)
            .json(&completion("echo/default", &prompt))
            .send()
            .await
            .expect("a completion");
        assert!(response.status().is_success(), "{response:?}");
        let answer: Value = response.json().await.expect("a JSON answer");
        assert_eq!(answer["choices"][0]["text"], prompt.as_str());
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    }
    metric_above_zero(
        edge.http_addr,
        "edge_sink_write_errors_total",
        "sink=\"stdout\"",
    )
    .await;
    // Still serving after the failed writes.
    let response = http()
        .post(&url)
        .json(&completion("echo/default", "after the errors"))
        .send()
        .await
        .expect("a completion");
    assert!(response.status().is_success(), "{response:?}");
    assert_healthy(edge.http_addr).await;

    edge.terminate();
    edge.assert_clean_exit([a, b]).await;
}

// ---------------------------------------------------------------------------------------
// SIGTERM with runs in flight
// ---------------------------------------------------------------------------------------

/// node-a serves `echo/stuck` and node-b `echo/quick`; a graceful stop waits 3 s for runs.
fn two_targets() -> String {
    let node_a = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, 1000)
        .echo(&["stuck"]);
    let node_b = NodeTable::new("node-b", "gpu-b", "token-b")
        .runtime(2, 1000)
        .echo(&["quick"]);
    format!("[server]\nshutdown_grace_ms = 3000\n\n{node_a}\n{node_b}")
}

#[crate::common::test]
async fn sigterm_lets_a_run_finish_within_the_grace_and_fails_the_one_that_never_ends() {
    let dir = tempfile::tempdir().expect("tempdir");
    let events = dir.path().join("events.jsonl");
    let config = write_config(
        dir.path(),
        &format!("{}\n{}", two_targets(), file_sink(&events)),
    );
    let mut edge = EdgeProcess::start(&config, false).await;
    let stuck = mock(edge.node_addr, "token-a", Duration::ZERO, Behaviour::Hang).await;
    let quick = echo_mock(edge.node_addr, "token-b", Duration::from_millis(50)).await;
    let url = format!("http://{}/v1/completions", edge.http_addr);

    // The run that never ends: answered only when the edge ends it.
    let never = tokio::spawn({
        let request = http()
            .post(&url)
            .json(&completion("echo/stuck", "wait forever"));
        async move { request.send().await.expect("an answer") }
    });
    eventually("node-a holds the stuck run", || {
        stuck
            .commands()
            .iter()
            .any(|c| matches!(c, NodeCommand::Run(_)))
    })
    .await;
    let stuck_run = stuck
        .commands()
        .into_iter()
        .find_map(|c| match c {
            NodeCommand::Run(run) => Some(run.run_id),
            _ => None,
        })
        .expect("the stuck run");

    // The run that finishes within the grace: streamed, and in flight when SIGTERM lands.
    let prompt = words(6);
    let mut body = completion("echo/quick", &prompt);
    body["stream"] = json!(true);
    let response = http()
        .post(&url)
        .json(&body)
        .send()
        .await
        .expect("a stream");
    assert!(response.status().is_success(), "{response:?}");
    let quick_run = response.headers()["x-edge-run-id"]
        .to_str()
        .expect("a run id")
        .to_owned();
    let mut stream = response.bytes_stream();
    let mut streamed = String::new();
    while !streamed.contains("\"text\":\"w0 \"") {
        let chunk = within(stream.next())
            .await
            .expect("the stream goes on")
            .expect("a chunk");
        streamed.push_str(&String::from_utf8_lossy(&chunk));
    }

    edge.terminate();
    while let Some(chunk) = within(stream.next()).await {
        streamed.push_str(&String::from_utf8_lossy(&chunk.expect("a chunk")));
    }
    assert!(streamed.contains("data: [DONE]"), "{streamed}");
    assert!(
        streamed.contains("\"finish_reason\":\"stop\""),
        "{streamed}"
    );
    let never = within(never).await.expect("the stuck request");
    let status = never.status();
    let answer = within(never.text()).await.unwrap_or_default();
    assert_eq!(
        status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{answer}\n{:#?}",
        logged(&edge.logs)
    );

    edge.assert_clean_exit([stuck, quick]).await;

    // The sink, flushed before exit, holds one terminal event per run.
    let lines = json_lines(&events);
    let terminal = |run: &str| -> Vec<Value> {
        lines
            .iter()
            .filter(|l| l["run_id"] == run)
            .filter(|l| {
                matches!(
                    l["kind"].as_str(),
                    Some("completed" | "failed" | "cancelled")
                )
            })
            .cloned()
            .collect()
    };
    let quick_end = terminal(&quick_run);
    assert_eq!(quick_end.len(), 1, "{lines:#?}");
    assert_eq!(quick_end[0]["kind"], "completed");
    let stuck_end = terminal(stuck_run.as_str());
    assert_eq!(stuck_end.len(), 1, "{lines:#?}");
    assert_eq!(stuck_end[0]["kind"], "failed");
    assert_eq!(stuck_end[0]["code"], "edge_shutdown");
    assert_eq!(stuck_end[0]["origin"], "edge");
    assert_eq!(
        kinds_in_file(&lines, &quick_run).concat(),
        format!("started{}completed", "output".repeat(6))
    );
}
