//! Runs end to end over real TCP: a real edge on port 0, mock nodes speaking the real
//! protocol, and the run service's caller streams and event sinks.
//!
//! Every scenario ends by checking that the edge forgot its runs: no open run, and no
//! connected node still counting an active one.

use crate::common;
use crate::mock_node;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::runs::{echo_to, failure_code, mocked, next_event, only_terminal, rest, start, words};
use common::{TWO_NODES, TestApp, eventually, eventually_ok, spawn_app};
use edge::domain::routing::{Unroutable, WaitCause};
use edge::domain::{EventOrigin, RunEvent, RunEventKind, RunId, RunSpec};
use edge::ports::NodeCommand;
use edge::ports::{Placed, RunHandle, StartError};
use mock_node::{Behaviour, Ended, MockNode, MockOptions};

/// The longest any single asynchronous effect may take before a test gives up.
const PATIENCE: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// A run of `echo/<target>` with `input`, told to behave as `mock` on the mock node.
fn spec(target: &str, input: &str, mock: &str) -> RunSpec {
    mocked(echo_to(target, input), mock)
}

/// [`spec`] pinned to the node with id or alias `pin`.
fn pinned(pin: &str, input: &str, mock: &str) -> RunSpec {
    let mut spec = spec("default", input, mock);
    spec.selector.pin = Some(pin.to_owned());
    spec
}

/// Starts a run of `echo/default` with `input` that the mock node holds until cancelled.
fn start_hanging(app: &TestApp, input: &str) -> RunHandle {
    start(app, spec("default", input, "hang"))
}

/// Starts a 500-word run of `echo/default` behaving as `mock`: long enough to interrupt.
fn start_long_run(app: &TestApp, mock: &str) -> RunHandle {
    start(app, spec("default", &words(500), mock))
}

/// Starts a mock node for `token` whose runs pause `delay` between words.
async fn node(app: &TestApp, token: &str, delay: Duration, behaviour: Behaviour) -> MockNode {
    let options = MockOptions {
        delay,
        behaviour,
        ..MockOptions::new(token)
    };
    MockNode::start(app.node_addr, options)
        .await
        .expect("mock node registers")
}

/// Starts an edge with `TWO_NODES` and both nodes registered, each behaving as `behaviour`
/// at once.
async fn edge_with_both_nodes(behaviour: Behaviour) -> (TestApp, MockNode, MockNode) {
    let app = spawn_app(TWO_NODES).await;
    let a = node(&app, "token-a", Duration::ZERO, behaviour).await;
    let b = node(&app, "token-b", Duration::ZERO, behaviour).await;
    app.wait_for_nodes(2).await;
    (app, a, b)
}

/// Starts an edge with `config` and a `node-a` that holds every run until it is cancelled.
async fn edge_with_hanging_node_a(config: &str) -> (TestApp, MockNode) {
    let app = spawn_app(config).await;
    let node_a = node(&app, "token-a", Duration::ZERO, Behaviour::Hang).await;
    (app, node_a)
}

/// Starts an edge with `config` and a `node-a` echoing with a 20 ms pause between words,
/// so long runs stream a while.
async fn edge_with_slow_echo_node_a(config: &str) -> (TestApp, MockNode) {
    let app = spawn_app(config).await;
    let node_a = node(&app, "token-a", Duration::from_millis(20), Behaviour::Echo).await;
    (app, node_a)
}

/// Waits until a run is streaming: its first event is `started`, its second an output.
async fn wait_until_streaming(handle: &mut RunHandle) {
    assert_eq!(next_event(handle).await.kind.name(), "started");
    assert_eq!(next_event(handle).await.kind.name(), "output");
}

/// Checks that the edge forgot its runs, then stops it.
async fn settle_and_stop(app: TestApp) {
    app.assert_settled().await;
    app.stop().await;
}

/// Reads the rest of a run's events, checks they end in exactly one terminal event, and
/// returns them with that terminal event.
async fn run_to_end(handle: &mut RunHandle) -> (Vec<Arc<RunEvent>>, RunEvent) {
    let events = rest(handle).await;
    let last = only_terminal(&handle.run_id, &events).clone();
    (events, last)
}

/// Cancels a run that must still be open and returns the rest of its events.
async fn cancel_open(app: &TestApp, handle: &mut RunHandle, reason: &str) -> Vec<Arc<RunEvent>> {
    assert!(app.parts.runs.cancel(&handle.run_id, reason).await);
    rest(handle).await
}

/// Cancels an open run and checks it ends in exactly one `cancelled`, which it returns.
async fn cancel_to_cancelled(app: &TestApp, handle: &mut RunHandle, reason: &str) -> RunEvent {
    let events = cancel_open(app, handle, reason).await;
    let last = only_terminal(&handle.run_id, &events);
    assert!(
        matches!(last.kind, RunEventKind::Cancelled { .. }),
        "{last:?}"
    );
    last.clone()
}

/// Checks that a run's terminal event `last` is `completed`, showing all its `events` if not.
fn assert_completed(last: &RunEvent, events: &[Arc<RunEvent>]) {
    assert!(
        matches!(last.kind, RunEventKind::Completed { .. }),
        "{events:#?}"
    );
}

/// The output texts of `events`, in order.
fn texts(events: &[Arc<RunEvent>]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect()
}

/// The node an event names, as a string (`-` when none).
fn node_of(event: &RunEvent) -> &str {
    event.node.as_ref().map_or("-", |n| n.as_str())
}

/// The runs the edge sent `node`, in order.
fn runs_sent(node: &MockNode) -> Vec<RunId> {
    node.commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Run(run) => Some(run.run_id),
            _ => None,
        })
        .collect()
}

/// The runs the edge told `node` to cancel, in order.
fn cancels_sent(node: &MockNode) -> Vec<RunId> {
    node.commands()
        .into_iter()
        .filter_map(|c| match c {
            NodeCommand::Cancel { run_id, .. } => Some(run_id),
            _ => None,
        })
        .collect()
}

/// An edge config with `TWO_NODES` plus `extra` sections.
fn config(extra: &str) -> String {
    format!("{TWO_NODES}\n{extra}\n")
}

/// `[events]` sending events to `sinks` with the file sink at `path`.
fn events_section(sinks: &[&str], path: &Path) -> String {
    let sinks: Vec<String> = sinks.iter().map(|s| format!("{s:?}")).collect();
    format!(
        "[events]\nsinks = [{}]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        sinks.join(", "),
        path.display().to_string(),
    )
}

/// A fresh temporary directory (kept alive by the caller) and `events.jsonl` inside it.
fn events_file() -> (tempfile::TempDir, PathBuf) {
    let out = tempfile::tempdir().expect("tempdir");
    let path = out.path().join("events.jsonl");
    (out, path)
}

/// Starts an edge sending events to `sinks` (the file sink writing `path`) and an echo
/// `node-a`.
async fn edge_with_sinks(sinks: &[&str], path: &Path) -> (TestApp, MockNode) {
    let app = spawn_app(&config(&events_section(sinks, path))).await;
    let node_a = node(&app, "token-a", Duration::ZERO, Behaviour::Echo).await;
    (app, node_a)
}

/// Every line of the file sink's file, parsed; panics on a line that is not JSON.
fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the event file {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"))
        })
        .collect()
}

/// The file lines of one run, in file order.
fn lines_of(lines: &[serde_json::Value], run_id: &RunId) -> Vec<serde_json::Value> {
    lines
        .iter()
        .filter(|l| l["run_id"] == run_id.as_str())
        .cloned()
        .collect()
}

/// Checks that the file lines of a run say the same as the events its caller received.
fn assert_file_matches(lines: &[serde_json::Value], events: &[Arc<RunEvent>]) {
    assert_eq!(
        lines.len(),
        events.len(),
        "file: {lines:#?}\ncaller: {events:#?}"
    );
    for (line, event) in lines.iter().zip(events) {
        assert_eq!(line["run_id"], event.run_id.as_str());
        assert_eq!(line["seq"], event.seq);
        assert_eq!(line["kind"], event.kind.name());
        assert_eq!(line["node"], node_of(event));
        assert_eq!(line["adapter"], event.adapter.as_str());
        assert_eq!(line["target"], event.target.as_str());
        if let RunEventKind::Output { text, .. } = &event.kind {
            assert_eq!(line["text"], text.as_str());
        }
    }
}

/// Runs one short echo on whatever node takes it and returns all its events.
async fn echo_run(app: &TestApp, input: &str) -> (RunId, Vec<Arc<RunEvent>>) {
    let mut handle = start(app, spec("default", input, "echo"));
    let (events, last) = run_to_end(&mut handle).await;
    assert_completed(&last, &events);
    (handle.run_id, events)
}

// ---------------------------------------------------------------------------------------
// Streaming and the sink
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn a_run_streams_every_delta_in_order_to_the_caller_and_the_file_sink() {
    let (_out, path) = events_file();
    let (app, _a) = edge_with_sinks(&["file"], &path).await;

    let mut handle = start(&app, spec("default", "hello brave new world", "echo"));
    let events = rest(&mut handle).await;

    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "started",
            "output",
            "output",
            "output",
            "output",
            "completed"
        ]
    );
    assert_eq!(texts(&events), ["hello ", "brave ", "new ", "world"]);
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    assert!(
        events
            .iter()
            .all(|e| e.origin == EventOrigin::Node && node_of(e) == "node-a")
    );
    let last = only_terminal(&handle.run_id, &events);
    assert!(
        matches!(&last.kind, RunEventKind::Completed { finish_reason, .. } if finish_reason == "stop"),
        "{last:?}"
    );

    settle_and_stop(app).await;
    let lines = json_lines(&path);
    assert_file_matches(&lines_of(&lines, &handle.run_id), &events);
    assert_eq!(
        lines.len(),
        events.len(),
        "only this run's events: {lines:#?}"
    );
}

// ---------------------------------------------------------------------------------------
// Placement
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn two_nodes_share_the_load() {
    let (app, a, b) = edge_with_both_nodes(Behaviour::Hang).await;

    let mut first = start_hanging(&app, "one");
    let mut second = start_hanging(&app, "two");
    eventually("both nodes received a run", || {
        runs_sent(&a).len() + runs_sent(&b).len() == 2
    })
    .await;
    assert_eq!(runs_sent(&a).len(), 1, "node-a got {:?}", runs_sent(&a));
    assert_eq!(runs_sent(&b).len(), 1, "node-b got {:?}", runs_sent(&b));
    let active: Vec<u32> = app
        .parts
        .registry
        .snapshot()
        .iter()
        .map(|n| n.active_runs)
        .collect();
    assert_eq!(active, [1, 1]);

    let mut ended_on = Vec::new();
    for handle in [&mut first, &mut second] {
        let last = cancel_to_cancelled(&app, handle, "test over").await;
        ended_on.push(node_of(&last).to_owned());
    }
    ended_on.sort();
    assert_eq!(ended_on, ["node-a", "node-b"]);
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn pinning_by_alias_and_by_id_picks_that_node() {
    let (app, _a, _b) = edge_with_both_nodes(Behaviour::Echo).await;

    for (pin, expected) in [
        ("gpu-b", "node-b"),
        ("node-a", "node-a"),
        ("gpu-a", "node-a"),
        ("node-b", "node-b"),
    ] {
        // Several in a row, so a round-robin tie cannot pass for a pin.
        for _ in 0..3 {
            let mut handle = start(&app, pinned(pin, "pinned run", "echo"));
            let (events, _) = run_to_end(&mut handle).await;
            assert!(
                events.iter().all(|e| node_of(e) == expected),
                "pin {pin}: {events:#?}"
            );
        }
    }

    // A pin never falls back to another node.
    let mut fast = spec("fast", "x", "echo");
    fast.selector.pin = Some("gpu-a".into());
    assert!(matches!(
        app.parts.runs.start(fast),
        Err(StartError::NoNode(Unroutable::PinDoesNotServe { .. }))
    ));
    assert!(matches!(
        app.parts.runs.start(pinned("gpu-z", "x", "echo")),
        Err(StartError::NoNode(Unroutable::UnknownNode { pin })) if pin == "gpu-z"
    ));
    settle_and_stop(app).await;
}

// ---------------------------------------------------------------------------------------
// Capacity and the queue
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn busy_nodes_queue_runs_and_dispatch_them_when_a_slot_frees() {
    let (app, a) = edge_with_hanging_node_a(TWO_NODES).await;

    // node-a takes two runs at a time.
    let mut first = start_hanging(&app, "one");
    let mut second = start_hanging(&app, "two");
    let mut third = start_hanging(&app, "three");
    eventually("node-a holds two runs", || runs_sent(&a).len() == 2).await;
    assert_eq!(app.parts.runs.queued_runs(), 1);
    assert_eq!(app.parts.runs.open_runs(), 3);
    assert_eq!(runs_sent(&a), [first.run_id.clone(), second.run_id.clone()]);

    // Ending one hands its slot to the queued run.
    cancel_to_cancelled(&app, &mut first, "make room").await;
    eventually("the queued run is dispatched", || runs_sent(&a).len() == 3).await;
    assert_eq!(runs_sent(&a)[2], third.run_id);
    assert_eq!(app.parts.runs.queued_runs(), 0);

    for handle in [&mut second, &mut third] {
        let last = cancel_to_cancelled(&app, handle, "test over").await;
        assert_eq!(last.origin, EventOrigin::Node);
        assert_eq!(node_of(&last), "node-a");
    }
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_short_run_ending_frees_its_slot_for_a_queued_one() {
    let (app, a) = edge_with_slow_echo_node_a(TWO_NODES).await;

    let mut hanging = start_hanging(&app, "one");
    let mut short = start(&app, spec("default", "a b c", "echo"));
    let mut queued = start(&app, spec("default", "d e", "echo"));
    // The queued run completes without anyone cancelling anything.
    let (events, last) = run_to_end(&mut queued).await;
    assert_completed(&last, &events);
    assert_eq!(texts(&events), ["d ", "e"]);
    let (events, last) = run_to_end(&mut short).await;
    assert_completed(&last, &events);
    assert_eq!(
        runs_sent(&a),
        [
            hanging.run_id.clone(),
            short.run_id.clone(),
            queued.run_id.clone()
        ]
    );

    cancel_open(&app, &mut hanging, "test over").await;
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_full_queue_refuses_and_an_unserved_target_fails_at_once() {
    let (app, _a) = edge_with_hanging_node_a(&config("[runs]\nqueue_capacity = 1\n")).await;

    let mut held = vec![
        start_hanging(&app, "one"),
        start_hanging(&app, "two"),
        start_hanging(&app, "three"),
    ];
    assert_eq!(app.parts.runs.queued_runs(), 1);
    match app.parts.runs.start(spec("default", "four", "hang")) {
        Err(StartError::QueueFull { cause, capacity }) => {
            assert_eq!(capacity, 1);
            assert_eq!(cause, WaitCause::AllBusy);
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
    assert_eq!(app.parts.runs.open_runs(), 3);

    // No node is configured for it: refused at once, even with a full queue and busy nodes.
    match app.parts.runs.start(spec("nope", "x", "echo")) {
        Err(StartError::NoNode(Unroutable::UnknownRoute { adapter, target })) => {
            assert_eq!(adapter.as_str(), "echo");
            assert_eq!(target.as_str(), "nope");
        }
        other => panic!("expected UnknownRoute, got {other:?}"),
    }
    // node-b serves echo/fast but is not connected: it would wait for node-b, but the queue
    // is full.
    assert!(matches!(
        app.parts.runs.start(spec("fast", "x", "echo")),
        Err(StartError::QueueFull {
            cause: WaitCause::NoNodeAvailable,
            ..
        })
    ));

    for handle in &mut held {
        cancel_to_cancelled(&app, handle, "test over").await;
    }
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_configured_target_waits_when_no_node_is_connected() {
    let app = spawn_app(TWO_NODES).await;
    let mut waiting = start(&app, spec("default", "x", "echo"));
    assert_eq!(waiting.placed, Placed::Waiting(WaitCause::NoNodeAvailable));
    assert_eq!(app.parts.runs.waiting_by_cause(), [0, 1]);
    cancel_to_cancelled(&app, &mut waiting, "test over").await;
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_queued_run_whose_wait_expires_fails_with_queue_timeout() {
    let (app, a) = edge_with_hanging_node_a(&config("[runs]\nqueue_timeout_ms = 200\n")).await;

    let mut busy = vec![start_hanging(&app, "one"), start_hanging(&app, "two")];
    let mut waiting = start_hanging(&app, "three");
    let events = rest(&mut waiting).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    let last = only_terminal(&waiting.run_id, &events);
    assert_eq!(failure_code(last), "queue_timeout");
    assert_eq!(last.origin, EventOrigin::Edge);
    assert_eq!(last.node, None, "it never reached a node");
    assert!(!runs_sent(&a).contains(&waiting.run_id));
    assert_eq!(app.parts.runs.queued_runs(), 0);

    for handle in &mut busy {
        cancel_open(&app, handle, "test over").await;
    }
    settle_and_stop(app).await;
}

// ---------------------------------------------------------------------------------------
// The edge's own terminal events
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn killing_a_node_mid_stream_fails_every_run_it_held() {
    let (app, a) = edge_with_slow_echo_node_a(TWO_NODES).await;

    let mut handles = vec![start_long_run(&app, "echo"), start_long_run(&app, "echo")];
    let mut seen = Vec::new();
    for handle in &mut handles {
        // Wait until each run is streaming: started, then a first output.
        let mut events = vec![next_event(handle).await, next_event(handle).await];
        assert_eq!(events[1].kind.name(), "output");
        seen.append(&mut events);
    }
    a.kill();

    for handle in &mut handles {
        let mut events: Vec<Arc<RunEvent>> = seen
            .iter()
            .filter(|e| e.run_id == handle.run_id)
            .cloned()
            .collect();
        events.extend(rest(handle).await);
        let last = only_terminal(&handle.run_id, &events);
        assert_eq!(failure_code(last), "node_disconnected");
        assert_eq!(last.origin, EventOrigin::Edge);
        assert_eq!(node_of(last), "node-a");
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "seq must grow: {seqs:?}"
        );
    }
    eventually("node-a left the registry", || app.parts.registry.is_empty()).await;
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_caller_cancel_mid_stream_reaches_the_node_which_ends_the_run() {
    let (app, a) = edge_with_slow_echo_node_a(TWO_NODES).await;

    let mut handle = start_long_run(&app, "echo");
    wait_until_streaming(&mut handle).await;
    let last = cancel_to_cancelled(&app, &mut handle, "caller changed their mind").await;
    assert_eq!(last.origin, EventOrigin::Node, "the node's own cancelled");
    assert!(
        a.commands().iter().any(|c| matches!(
            c,
            NodeCommand::Cancel { run_id, reason } if run_id == &handle.run_id && reason == "caller changed their mind"
        )),
        "{:?}",
        a.commands()
    );
    // A second cancel of an ended run says it was not open.
    assert!(!app.parts.runs.cancel(&handle.run_id, "again").await);
    assert!(!app.parts.runs.cancel(&RunId::new("no-such-run"), "x").await);
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_node_that_ignores_a_cancel_gets_the_edges_cancelled_after_the_grace() {
    let (app, a) = edge_with_slow_echo_node_a(&config("[runs]\ncancel_grace_ms = 200\n")).await;

    let mut handle = start_long_run(&app, "ignore_cancel");
    wait_until_streaming(&mut handle).await;
    let events = cancel_open(&app, &mut handle, "stop it").await;
    let last = only_terminal(&handle.run_id, &events);
    assert_eq!(
        last.origin,
        EventOrigin::Edge,
        "the edge's own cancelled: {last:?}"
    );
    assert!(
        matches!(&last.kind, RunEventKind::Cancelled { reason, .. } if reason == "stop it"),
        "{last:?}"
    );
    assert!(cancels_sent(&a).contains(&handle.run_id));
    app.assert_settled().await;
    // The node keeps streaming into the void: those events are dropped, not relayed.
    eventually("late events are dropped", || {
        let stats = app.parts.runs.stats();
        stats.dropped_after_terminal() + stats.dropped_unknown_run() > 0
    })
    .await;
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_missed_deadline_fails_the_run_and_cancels_it_on_the_node() {
    let (app, a) = edge_with_hanging_node_a(TWO_NODES).await;

    let mut run = spec("default", "never answered", "hang");
    run.deadline = Some(Duration::from_millis(200));
    let mut handle = start(&app, run);
    let (_, last) = run_to_end(&mut handle).await;
    assert_eq!(failure_code(&last), "deadline_exceeded");
    assert_eq!(last.origin, EventOrigin::Edge);
    assert_eq!(node_of(&last), "node-a");

    eventually("node-a is told to cancel", || {
        cancels_sent(&a).contains(&handle.run_id)
    })
    .await;
    let sent = a.commands().into_iter().find_map(|c| match c {
        NodeCommand::Run(run) if run.run_id == handle.run_id => Some(run),
        _ => None,
    });
    // The node is told the deadline (what is left of it when the run reaches the node).
    let deadline_ms = sent.expect("the run reached node-a").deadline_ms;
    assert!(
        (1..=200).contains(&deadline_ms),
        "deadline_ms {deadline_ms}"
    );
    settle_and_stop(app).await;
}

#[crate::common::test]
async fn a_graceful_stop_ends_a_run_that_never_ends_with_edge_shutdown() {
    let app = spawn_app(TWO_NODES).await;
    // Started, then silence far longer than the test; cancels are ignored.
    let a = node(
        &app,
        "token-a",
        Duration::from_secs(3_600),
        Behaviour::IgnoreCancel,
    )
    .await;

    let mut handle = start(&app, spec("default", "never finished", "ignore_cancel"));
    assert_eq!(next_event(&mut handle).await.kind.name(), "started");
    let parts = app.parts.clone();
    tokio::time::timeout(PATIENCE, app.stop())
        .await
        .expect("the edge stops within its grace");

    let (_, last) = run_to_end(&mut handle).await;
    assert_eq!(failure_code(&last), "edge_shutdown");
    assert_eq!(last.origin, EventOrigin::Edge);
    eventually("node-a receives Shutdown", || {
        a.commands()
            .iter()
            .any(|c| matches!(c, NodeCommand::Shutdown { .. }))
    })
    .await;
    // The edge also told the node to stop the run it gave up on.
    assert!(
        cancels_sent(&a).contains(&handle.run_id),
        "{:?}",
        a.commands()
    );
    let ended = tokio::time::timeout(PATIENCE, a.ended())
        .await
        .expect("the node stops");
    assert!(matches!(ended, Ended::Shutdown(_)), "{ended:?}");

    assert!(matches!(
        parts.runs.start(spec("default", "late", "echo")),
        Err(StartError::ShuttingDown)
    ));
    assert_eq!(parts.runs.open_runs(), 0);
    assert!(parts.registry.is_empty());
}

// ---------------------------------------------------------------------------------------
// Sinks
// ---------------------------------------------------------------------------------------

#[crate::common::test]
async fn the_file_sink_writes_json_lines_and_recovers_when_its_directory_returns() {
    let out = tempfile::tempdir().expect("tempdir");
    let sub: PathBuf = out.path().join("sub");
    std::fs::create_dir(&sub).expect("create the events directory");
    let path = sub.join("events.jsonl");
    let (app, _a) = edge_with_sinks(&["file"], &path).await;

    let (before, before_events) = echo_run(&app, "written normally").await;
    eventually("the first run is in the file", || {
        std::fs::read_to_string(&path).is_ok_and(|text| text.lines().count() == before_events.len())
    })
    .await;
    assert_file_matches(&lines_of(&json_lines(&path), &before), &before_events);

    // The directory disappears: the sink cannot write, the edge keeps serving.
    std::fs::remove_dir_all(&sub).expect("remove the events directory");
    let (lost, _) = echo_run(&app, "lost to a missing directory").await;
    // The sink tries (and fails) to write the lost run.
    eventually_ok("the file sink failed to write", || async {
        let url = format!("http://{}/metrics", app.http_addr);
        let text = crate::common::http_get(url)
            .await
            .map_err(|e| e.to_string())?
            .text()
            .await;
        let text = text.map_err(|e| e.to_string())?;
        let errors = text
            .lines()
            .find_map(|l| l.strip_prefix("edge_sink_write_errors_total{sink=\"file\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if errors > 0.0 {
            Ok(())
        } else {
            Err("no write error yet".to_owned())
        }
    })
    .await;

    // The directory is back: the sink writes to the path again by itself.
    std::fs::create_dir(&sub).expect("recreate the events directory");
    let (after, after_events) = echo_run(&app, "written after recovery").await;
    assert_eq!(app.parts.registry.len(), 1, "node-a stayed connected");
    settle_and_stop(app).await;

    let lines = json_lines(&path);
    assert_file_matches(&lines_of(&lines, &after), &after_events);
    // The new file holds nothing from before the directory went away (the lost run may
    // or may not be there, depending on whether its write came before the directory).
    assert!(lines_of(&lines, &before).is_empty(), "{lines:#?}");
    let others = lines
        .iter()
        .filter(|l| l["run_id"] != after.as_str() && l["run_id"] != lost.as_str());
    assert_eq!(others.count(), 0, "{lines:#?}");
}

#[crate::common::test]
async fn swapping_the_sink_by_config_changes_where_events_go() {
    for sinks in [&["file"][..], &["null"][..], &["log", "file"][..]] {
        let (_out, path) = events_file();
        let (app, _a) = edge_with_sinks(sinks, &path).await;

        let (run_id, events) = echo_run(&app, "where do I go").await;
        settle_and_stop(app).await;

        if sinks.contains(&"file") {
            let lines = json_lines(&path);
            assert_file_matches(&lines_of(&lines, &run_id), &events);
        } else {
            let empty = std::fs::read_to_string(&path).map_or(true, |text| text.is_empty());
            assert!(empty, "sinks {sinks:?} must not write the file");
        }
    }
}
