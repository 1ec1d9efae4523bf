//! Soak: 1,000 runs over four mock nodes that are killed, drop their connections and
//! reconnect at random, checking the edge's guarantee at volume — every accepted run ends
//! with exactly one terminal event, both on the caller's stream and in the event sink —
//! and that the edge keeps nothing afterwards: an empty registry and run table once the
//! nodes have left, and no task left alive once it has stopped. And resume at volume:
//! 1,000 streamed runs through the reference node whose connection a relay cuts at random
//! moments; the node always comes back within the grace, so no run is lost and no delta is
//! missed or repeated.
//!
//! The edge runs on a runtime of its own, so its task count is not mixed up with the mock
//! nodes' and the test's. Randomness comes from one seeded RNG: the seed is printed, and
//! `EDGE_SOAK_SEED=<n>` replays a run's plan and fault schedule (real sockets and timers
//! still make the interleavings differ). Every wait is bounded; nothing asserts how long
//! anything took.

use crate::common;
use crate::mock_node;
use crate::node_support;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{TestApp, eventually, eventually_ok, numbered_nodes, spawn_app};
use edge::components::RunService;
use edge::domain::{
    AdapterName, NodeSelector, RegisterRejection, RunEvent, RunEventKind, RunSpec, Target,
};
use edge::ports::Registry;
use edge::ports::{RunHandle, StartError};
use futures::StreamExt;
use mock_node::{Behaviour, MockError, MockNode, MockOptions};
use node_support::relay::Relay;
use node_support::upstream::{Reply, ScriptedEngine};
use node_support::{QWEN, edge_config, edge_on, prompt, spawn_node};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// Runs in the soak.
const RUNS: usize = 1_000;
/// Mock nodes, `node-0` .. `node-3`.
const NODES: usize = 4;
/// Runs the test keeps open at once (the nodes have 4 × 8 slots; the rest queue).
const IN_FLIGHT: usize = 48;
/// The seed when `EDGE_SOAK_SEED` is not set.
const DEFAULT_SEED: u64 = 0x5eed_0001;
/// The longest any single step may take before the test gives up.
const PATIENCE: Duration = Duration::from_secs(20);
/// The longest all of a soak's runs may take together: far above what they need, below
/// the test's deadline.
const SOAK_PATIENCE: Duration = Duration::from_secs(180);

/// What one run asks its mock node to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Echo this many words and complete.
    Echo(usize),
    /// One output, then `failed`/`mock_failure`.
    Fail,
    /// Never answer; the run has a deadline of this many milliseconds.
    Hang(u64),
    /// Stream many words; the caller cancels after the first event.
    Cancel,
    /// One output, then the node drops its whole connection.
    Drop,
}

impl Plan {
    fn random(rng: &mut StdRng) -> Plan {
        match rng.random_range(0..100) {
            0..70 => Plan::Echo(rng.random_range(1..=12)),
            70..80 => Plan::Fail,
            80..86 => Plan::Hang(rng.random_range(20..=80)),
            86..96 => Plan::Cancel,
            _ => Plan::Drop,
        }
    }

    fn spec(self, index: usize) -> RunSpec {
        let (mock, words, deadline) = match self {
            Plan::Echo(words) => ("echo", words, None),
            Plan::Fail => ("fail", 3, None),
            Plan::Hang(ms) => ("hang", 1, Some(Duration::from_millis(ms))),
            Plan::Cancel => ("echo", 200, None),
            Plan::Drop => ("drop", 3, None),
        };
        RunSpec {
            selector: NodeSelector {
                adapter: AdapterName::parse("echo").expect("adapter"),
                target: Target::parse("default").expect("target"),
                pin: None,
            },
            input: Bytes::from(input(index, words)),
            content_type: "text/plain; charset=utf-8".into(),
            params: BTreeMap::from([("mock".to_owned(), mock.to_owned())]),
            deadline,
            operation: edge::domain::Operation::Unspecified,
            routing: Default::default(),
        }
    }
}

/// The input of run `index`: `words` words naming the run.
fn input(index: usize, words: usize) -> String {
    (0..words)
        .map(|w| format!("r{index}w{w}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a run ended, for the tally.
fn outcome(event: &RunEvent) -> String {
    match &event.kind {
        RunEventKind::Failed { code, .. } => format!("failed/{code}"),
        kind => kind.name().to_owned(),
    }
}

/// A run the test drove to its end: what it planned and every event its caller received.
struct Finished {
    index: usize,
    plan: Plan,
    run_id: String,
    events: Vec<Arc<RunEvent>>,
}

impl Finished {
    /// Checks the caller's stream: one terminal event, last, growing `seq`, and an ending
    /// the plan allows (any run may lose its node to a kill).
    fn check(&self) {
        let Finished {
            index,
            plan,
            run_id,
            events,
        } = self;
        let context = || format!("run #{index} {run_id} ({plan:?}): {events:#?}");
        assert!(
            events.iter().all(|e| e.run_id.as_str() == run_id),
            "{}",
            context()
        );
        let terminals = events.iter().filter(|e| e.kind.is_terminal()).count();
        assert_eq!(terminals, 1, "{}", context());
        let last = events.last().expect("a terminal event");
        assert!(last.kind.is_terminal(), "{}", context());
        assert!(
            events.windows(2).all(|w| w[0].seq < w[1].seq),
            "{}",
            context()
        );
        let ended = outcome(last);
        // Any run may lose its node to a kill, and wait in vain while every node is away.
        if ended == "failed/node_disconnected" || ended == "failed/no_node_available" {
            return;
        }
        match plan {
            Plan::Echo(words) => {
                assert_eq!(ended, "completed", "{}", context());
                let text: String = events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        RunEventKind::Output { text, .. } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect();
                assert_eq!(text, input(*index, *words), "{}", context());
            }
            Plan::Fail => assert_eq!(ended, "failed/mock_failure", "{}", context()),
            Plan::Hang(_) => assert_eq!(ended, "failed/deadline_exceeded", "{}", context()),
            Plan::Cancel => assert!(
                ended == "cancelled" || ended == "completed",
                "{}",
                context()
            ),
            Plan::Drop => panic!("a dropped connection must end the run: {}", context()),
        }
    }
}

/// `NODES` nodes serving `echo/default`, 8 slots each; a long queue; the file sink with a
/// queue large enough that it never drops an event.
fn config(events: &Path) -> String {
    let sections = format!(
        r#"
[runs]
queue_capacity = 4096
queue_timeout_ms = 60000
cancel_grace_ms = 500

[events]
sinks = ["file"]
queue_capacity = 1000000
[events.file]
path = {:?}
flush_interval_ms = 50
"#,
        events.display().to_string()
    );
    format!("{sections}\n{}", numbered_nodes(NODES, "mock", 8, 1000))
}

/// Starts `spec` on the edge's runtime (so the timers it spawns belong to the edge),
/// retrying while no node is connected at all.
async fn start(edge: &Handle, runs: &RunService, spec: &RunSpec) -> RunHandle {
    eventually_ok("a node takes the run", || {
        let started = {
            let _edge = edge.enter();
            runs.start(spec.clone())
        };
        std::future::ready(match started {
            Ok(handle) => Ok(handle),
            Err(error @ StartError::NoNode(_)) => Err(error),
            Err(error) => panic!("run refused: {error}"),
        })
    })
    .await
}

/// Every event of a run until its stream ends.
async fn rest(handle: &mut RunHandle, events: &mut Vec<Arc<RunEvent>>) {
    loop {
        match tokio::time::timeout(PATIENCE, handle.events.recv()).await {
            Ok(Some(event)) => events.push(event),
            Ok(None) => return,
            Err(_) => panic!("run {} did not end in time: {events:#?}", handle.run_id),
        }
    }
}

/// Starts run `index` as `plan` says and follows it to its end.
async fn drive(edge: Handle, runs: RunService, index: usize, plan: Plan) -> Finished {
    let mut handle = start(&edge, &runs, &plan.spec(index)).await;
    let mut events = Vec::new();
    if plan == Plan::Cancel {
        match tokio::time::timeout(PATIENCE, handle.events.recv()).await {
            Ok(Some(first)) => {
                let open = !first.kind.is_terminal();
                events.push(first);
                if open {
                    let (runs, id) = (runs.clone(), handle.run_id.clone());
                    let what = format!("the cancel of run {id}");
                    let cancel = edge.spawn(async move { runs.cancel(&id, "soak cancel").await });
                    common::bounded(what, cancel)
                        .await
                        .expect("the cancel task");
                }
            }
            Ok(None) => {}
            Err(_) => panic!("run {} sent nothing in time", handle.run_id),
        }
    }
    rest(&mut handle, &mut events).await;
    Finished {
        index,
        plan,
        run_id: handle.run_id.to_string(),
        events,
    }
}

// ---------------------------------------------------------------------------------------
// Chaos: kills and reconnects
// ---------------------------------------------------------------------------------------

/// Connects mock node `k`, retrying while the edge still holds its previous connection.
async fn connect(addr: SocketAddr, k: usize) -> MockNode {
    let options = MockOptions {
        delay: Duration::from_millis(2),
        behaviour: Behaviour::Echo,
        ..MockOptions::new(&format!("token-{k}"))
    };
    // Its previous connection may not have left the registry yet.
    eventually_ok(&format!("node-{k} reconnects"), || async {
        match MockNode::start(addr, options.clone()).await {
            Ok(node) => Ok(node),
            Err(MockError::Rejected(outcome))
                if outcome.rejection == Some(RegisterRejection::AlreadyConnected) =>
            {
                Err("its old connection is still registered")
            }
            Err(error) => panic!("node-{k} could not reconnect: {error}"),
        }
    })
    .await
}

/// Kills node `k` (if it still runs) and waits for its task to end.
async fn kill(node: MockNode) {
    node.kill();
    tokio::time::timeout(PATIENCE, node.ended())
        .await
        .expect("a killed node stops");
}

/// What the chaos task did, and the nodes it leaves connected.
struct Chaos {
    nodes: Vec<MockNode>,
    kills: usize,
    reconnects: usize,
}

/// Until `stop`: every 5–30 ms, reconnects the nodes that are gone (killed, or dropped
/// by a `drop` run), then kills one node at random (with probability 0.6).
async fn chaos(
    addr: SocketAddr,
    registry: Arc<dyn Registry>,
    mut rng: StdRng,
    stop: CancellationToken,
) -> Chaos {
    let mut nodes: Vec<Option<MockNode>> = Vec::new();
    for k in 0..NODES {
        nodes.push(Some(connect(addr, k).await));
    }
    let (mut kills, mut reconnects) = (0, 0);
    loop {
        let pause = Duration::from_millis(rng.random_range(5..=30));
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
        for (k, slot) in nodes.iter_mut().enumerate() {
            if registry.get(&format!("node-{k}")).is_none() {
                if let Some(gone) = slot.take() {
                    kill(gone).await;
                }
                *slot = Some(connect(addr, k).await);
                reconnects += 1;
            }
        }
        if rng.random_bool(0.6) {
            let k = rng.random_range(0..NODES);
            if let Some(victim) = nodes[k].take() {
                kill(victim).await;
                kills += 1;
            }
        }
    }
    Chaos {
        nodes: nodes.into_iter().flatten().collect(),
        kills,
        reconnects,
    }
}

// ---------------------------------------------------------------------------------------
// The soak
// ---------------------------------------------------------------------------------------

/// The events the file sink wrote, one JSON object per line.
fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("the event file")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a JSON line"))
        .collect()
}

/// The soak's seed: `EDGE_SOAK_SEED`, else [`DEFAULT_SEED`]; printed for a replay.
fn seed() -> u64 {
    let seed = std::env::var("EDGE_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("soak seed {seed} (replay with EDGE_SOAK_SEED={seed})");
    seed
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_runs_through_random_kills_each_end_once_and_leave_nothing_behind() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let plans: Vec<Plan> = (0..RUNS).map(|_| Plan::random(&mut rng)).collect();

    let edge_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("soak-edge")
        .enable_all()
        .build()
        .expect("the edge's runtime");
    let edge = edge_runtime.handle().clone();
    let baseline = edge.metrics().num_alive_tasks();

    let dir = tempfile::tempdir().expect("tempdir");
    let events_path = dir.path().join("events.jsonl");
    let config = config(&events_path);
    let started = edge.spawn(async move { spawn_app(&config).await });
    let app: TestApp = common::bounded("the edge to start on its runtime", started)
        .await
        .expect("the edge starts");
    let runs = app.parts.runs.clone();
    let registry = Arc::clone(&app.parts.registry);

    let stop_chaos = CancellationToken::new();
    let chaos = tokio::spawn(chaos(
        app.node_addr,
        Arc::clone(&registry),
        StdRng::seed_from_u64(seed.wrapping_add(1)),
        stop_chaos.clone(),
    ));
    eventually("the first nodes are connected", || !registry.is_empty()).await;

    let driven = futures::stream::iter(plans.into_iter().enumerate())
        .map(|(index, plan)| drive(edge.clone(), runs.clone(), index, plan))
        .buffer_unordered(IN_FLIGHT)
        .collect();
    let finished: Vec<Finished> =
        common::bounded_for(SOAK_PATIENCE, "the soak's 1,000 runs to end", driven).await;
    stop_chaos.cancel();
    let Chaos {
        nodes,
        kills,
        reconnects,
    } = tokio::time::timeout(PATIENCE, chaos)
        .await
        .expect("the chaos task stops")
        .expect("the chaos task");

    // The callers: one terminal event each, as the plan allows.
    assert_eq!(finished.len(), RUNS);
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    for run in &finished {
        run.check();
        let last = run.events.last().expect("a terminal event");
        *tally.entry(outcome(last)).or_default() += 1;
    }
    eprintln!("soak: {kills} kills, {reconnects} reconnects, outcomes {tally:?}");
    assert!(kills > 0, "the chaos never killed a node");
    for expected in [
        "completed",
        "cancelled",
        "failed/mock_failure",
        "failed/deadline_exceeded",
        "failed/node_disconnected",
    ] {
        assert!(
            tally.contains_key(expected),
            "no run ended {expected}: {tally:?}"
        );
    }

    // The nodes leave: nothing stays in the registry or the run table.
    for node in nodes {
        kill(node).await;
    }
    eventually("every node has left the registry", || registry.is_empty()).await;
    eventually("the run table is empty", || runs.open_runs() == 0).await;
    assert_eq!(runs.queued_runs(), 0);
    drop(runs);
    drop(registry);

    // The edge stops, and every task it started ends.
    tokio::time::timeout(PATIENCE, app.stop())
        .await
        .expect("the edge stops in time");
    eventually("the edge's tasks have all ended", || {
        edge.metrics().num_alive_tasks() == baseline
    })
    .await;

    // The sink recorded the very events the callers got: one terminal event per run.
    let lines = json_lines(&events_path);
    let mut by_run: HashMap<&str, Vec<&Value>> = HashMap::new();
    for line in &lines {
        let run_id = line["run_id"].as_str().expect("a run id");
        by_run.entry(run_id).or_default().push(line);
    }
    assert_eq!(by_run.len(), RUNS, "runs in the event file");
    for run in &finished {
        let recorded = by_run
            .get(run.run_id.as_str())
            .unwrap_or_else(|| panic!("run {} is missing from the event file", run.run_id));
        let recorded: Vec<(u64, &str)> = recorded
            .iter()
            .map(|l| {
                (
                    l["seq"].as_u64().unwrap_or(0),
                    l["kind"].as_str().unwrap_or(""),
                )
            })
            .collect();
        let streamed: Vec<(u64, &str)> =
            run.events.iter().map(|e| (e.seq, e.kind.name())).collect();
        assert_eq!(
            recorded, streamed,
            "run {} in the file vs its caller",
            run.run_id
        );
    }
    edge_runtime.shutdown_background();
}

/// Streamed runs in the resume soak.
const RESUMED_RUNS: usize = 1_000;
/// Deltas in each of their answers.
const RESUMED_DELTAS: usize = 8;

/// The text of delta `n`.
fn resumed_delta(n: usize) -> String {
    format!("w{n} ")
}

/// Cuts the node's relayed connection at random moments while it is registered, until
/// `stop`; returns how many cuts it made.
async fn cut_at_random(
    relay: Arc<Relay>,
    registry: Arc<dyn Registry>,
    mut rng: StdRng,
    stop: CancellationToken,
) -> usize {
    let mut cuts = 0;
    while !stop.is_cancelled() {
        eventually("the node is back", || registry.get("node-1").is_some()).await;
        let pause = Duration::from_millis(rng.random_range(10..80));
        tokio::select! {
            () = stop.cancelled() => break,
            () = tokio::time::sleep(pause) => {}
        }
        relay.cut();
        cuts += 1;
    }
    cuts
}

/// Starts run `index` and reads it to its end; returns its events.
async fn stream_one(runs: RunService, index: usize) -> Vec<Arc<RunEvent>> {
    let mut handle = runs
        .start(prompt(&format!("story {index}")))
        .expect("accepted");
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(PATIENCE, handle.events.recv())
        .await
        .unwrap_or_else(|_| panic!("run {} stalled: {events:?}", handle.run_id))
    {
        events.push(event);
    }
    events
}

/// A counter's value in the edge's `/metrics`.
async fn scraped(app: &TestApp, counter: &str) -> f64 {
    let text = crate::common::http_get(format!("http://{}/metrics", app.http_addr))
        .await
        .expect("scrape")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(counter)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{counter} is not in /metrics"))
}

/// 1,000 streamed runs through the reference node, whose connection the relay cuts at
/// random moments (about every 10-80 ms while it is registered): every run completes with
/// every delta once and in order, and nothing stays in the registry or the run table.
#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumed_runs_survive_random_cuts() {
    let seed = seed();
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let mut chunks: Vec<Value> = (0..RESUMED_DELTAS)
        .map(|n| json!({"choices": [{"index": 0, "delta": {"content": resumed_delta(n)}}]}))
        .collect();
    chunks.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
    engine.script(QWEN, Reply::sse(&chunks, true));
    // The node is back within milliseconds; the grace is far above that.
    let config =
        edge_config(&engine.base_url(), &["qwen"], 1_000) + "[runs]\nresume_grace_ms = 10000\n";
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let relay = Arc::new(Relay::start(app.node_addr).await);
    let node = spawn_node(relay.addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;
    let runs = app.parts.runs.clone();
    let registry = Arc::clone(&app.parts.registry);

    let stop_cuts = CancellationToken::new();
    let cutting = tokio::spawn(cut_at_random(
        Arc::clone(&relay),
        Arc::clone(&registry),
        StdRng::seed_from_u64(seed.wrapping_add(2)),
        stop_cuts.clone(),
    ));
    let streamed = futures::stream::iter(0..RESUMED_RUNS)
        .map(|index| stream_one(runs.clone(), index))
        .buffer_unordered(IN_FLIGHT)
        .collect();
    let finished: Vec<Vec<Arc<RunEvent>>> =
        common::bounded_for(SOAK_PATIENCE, "the 1,000 resumed runs to end", streamed).await;
    stop_cuts.cancel();
    let cuts = tokio::time::timeout(PATIENCE, cutting)
        .await
        .expect("the cuts stop")
        .expect("the cutting task");

    // Every run completed, with every delta once and in order: none lost, none repeated.
    let expected: Vec<String> = (0..RESUMED_DELTAS).map(resumed_delta).collect();
    for events in &finished {
        let run = &events.first().expect("events").run_id;
        let terminals: Vec<&Arc<RunEvent>> =
            events.iter().filter(|e| e.kind.is_terminal()).collect();
        assert_eq!(terminals.len(), 1, "run {run}: {events:?}");
        assert!(
            matches!(
                events.last().map(|e| &e.kind),
                Some(RunEventKind::Completed { .. })
            ),
            "run {run} was lost: {events:?}"
        );
        let texts: Vec<&str> = events
            .iter()
            .filter_map(|e| match &e.kind {
                RunEventKind::Output { text, .. } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(texts, expected, "run {run}'s deltas");
        assert!(
            events.windows(2).all(|w| w[0].seq < w[1].seq),
            "run {run}'s seqs: {events:?}"
        );
    }
    let reattached = scraped(&app, "edge_runs_reattached_total").await;
    eprintln!("resume soak: {cuts} cuts, {reattached} runs resumed");
    assert!(cuts > 0, "the relay never cut the node");
    assert!(reattached > 0.0, "no run was resumed");

    // The node leaves: nothing stays in the registry or the run table.
    node.stop().await.expect("clean stop");
    eventually("the node has left the registry", || registry.is_empty()).await;
    eventually("the run table is empty", || runs.open_runs() == 0).await;
    assert_eq!(runs.queued_runs(), 0);
    app.stop().await;
}
