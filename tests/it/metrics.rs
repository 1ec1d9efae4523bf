//! `GET /metrics`, `GET /healthz` and `GET /readyz` over real HTTP, after real traffic.
//!
//! A scripted scenario (registrations accepted and refused, runs completed, failed and
//! cancelled, a node that drops its connection) runs against a real edge with mock nodes
//! speaking the real protocol; the scraped text is parsed by Prometheus' own text-format
//! parser (`prometheus_client`, through the test venv's Python) and every counter must equal
//! what the scenario did. Readiness is checked while a real graceful stop drains a run held
//! open by a hanging node. Counters of adapters are read at scrape time and some are
//! recorded after the event a caller sees (a disconnect is counted once its connection task
//! ends), so checks poll `/metrics` until the expected values appear, within a bound; no
//! test asserts how long anything took. The scrape helpers serve `routing.rs` too.

use crate::common;
use crate::mock_node;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use common::runs::{echo_to, mocked, rest};
use common::{TWO_NODES, TestApp, eventually, eventually_ok, spawn_app};
use edge::client::{NodeClient, NodeFrame, ReceivedEdgeFrame, Registration};
use edge::domain::{
    RegisterRejection, ResumeAnswer, ResumeClaim, RunEvent, RunEventKind, RunId, RunSpec,
};
use edge::ports::NodeCommand;
use edge::ports::{RunHandle, StartError};
use mock_node::{MockNode, MockOptions};
use serde::Deserialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

/// The longest any single asynchronous effect may take before a test gives up. It only
/// stops a broken edge from hanging the suite.
const PATIENCE: Duration = Duration::from_secs(10);

/// The token the refused registration presents.
const WRONG_TOKEN: &str = "not-a-configured-token";

/// The tokens of [`TWO_NODES`].
const CONFIG_TOKENS: [&str; 2] = ["token-a", "token-b"];

/// Parses Prometheus text on stdin with `prometheus_client` (which raises on anything a
/// Prometheus server would refuse) and prints one JSON line per sample.
const PARSE_SCRIPT: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
for family in text_string_to_metric_families(sys.stdin.read()):
    for sample in family.samples:
        print(json.dumps({
            "family": family.name,
            "type": family.type,
            "name": sample.name,
            "labels": sample.labels,
            "value": repr(float(sample.value)),
        }))
"#;

/// Every metric `docs/operations.md` lists, as `prometheus_client` names its family
/// (counters without `_total`), with its type.
const DOCUMENTED: [(&str, &str); 49] = [
    ("edge_nodes_configured", "gauge"),
    ("edge_nodes_draining", "gauge"),
    ("edge_journal_entries_written", "counter"),
    ("edge_journal_write_errors", "counter"),
    ("edge_journal_runs_expired", "counter"),
    ("edge_journal_events_dropped", "counter"),
    ("edge_journal_queue_depth", "gauge"),
    ("edge_journal_bytes", "gauge"),
    ("edge_nodes_connected", "gauge"),
    ("edge_node_registrations", "counter"),
    ("edge_node_disconnects", "counter"),
    ("edge_node_links_declared_dead", "counter"),
    ("edge_node_takeovers", "counter"),
    ("edge_node_takeover_refusals", "counter"),
    ("edge_node_availability_changes", "counter"),
    ("edge_connections_open", "gauge"),
    ("edge_connections_closed", "counter"),
    ("edge_connections_refused", "counter"),
    ("edge_frames_received", "counter"),
    ("edge_frames_sent", "counter"),
    ("edge_transport_received_bytes", "counter"),
    ("edge_transport_sent_bytes", "counter"),
    ("edge_runs_started", "counter"),
    ("edge_runs_finished", "counter"),
    ("edge_runs_active", "gauge"),
    ("edge_runs_queued", "gauge"),
    ("edge_run_queue_wait_seconds", "histogram"),
    ("edge_run_time_to_first_output_seconds", "histogram"),
    ("edge_run_duration_seconds", "histogram"),
    ("edge_run_events_relayed", "counter"),
    ("edge_run_events_dropped", "counter"),
    ("edge_runs_detached", "counter"),
    ("edge_runs_reattached", "counter"),
    ("edge_runs_resume_lost", "counter"),
    ("edge_run_detached_seconds", "histogram"),
    ("edge_run_placements", "counter"),
    ("edge_run_failovers", "counter"),
    ("edge_run_continuations", "counter"),
    ("edge_run_refusals", "counter"),
    ("edge_input_tokens", "counter"),
    ("edge_cached_input_tokens", "counter"),
    ("edge_output_tokens", "counter"),
    ("edge_runs_waiting", "gauge"),
    ("edge_breaker_transitions", "counter"),
    ("edge_breakers_open", "gauge"),
    ("edge_sink_events_written", "counter"),
    ("edge_sink_write_errors", "counter"),
    ("edge_sink_events_dropped", "counter"),
    ("edge_sink_queue_depth", "gauge"),
];

/// Every label name a metric may carry; anything else (a run id, a token) would make the
/// label set unbounded. `key`, `model` and `node` (the token counters') take values from the
/// config only: API key names, configured routes, pre-registered node ids.
const LABEL_NAMES: [&str; 19] = [
    "result", "reason", "adapter", "target", "outcome", "code", "kind", "sink", "le", "by", "rule",
    "failover", "priority", "to", "limit", "key", "model", "node", "affinity",
];

// ---------------------------------------------------------------------------------------
// Scraping and parsing
// ---------------------------------------------------------------------------------------

/// One sample as the Python parser saw it.
#[derive(Debug, Clone, Deserialize)]
struct Sample {
    /// The metric family (counters without `_total`).
    family: String,
    /// `counter`, `gauge`, `histogram`, ...
    #[serde(rename = "type")]
    kind: String,
    /// The sample's own name (`..._total`, `..._bucket`, `..._count`).
    name: String,
    labels: BTreeMap<String, String>,
    /// Python's `repr` of the value (`1.0`, `inf`).
    value: String,
}

impl Sample {
    fn value(&self) -> f64 {
        self.value
            .parse()
            .unwrap_or_else(|e| panic!("sample value {:?} is not a number: {e}", self.value))
    }
}

/// One parsed scrape.
#[derive(Debug)]
pub(crate) struct Scrape {
    text: String,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The value of the sample `name` whose labels are exactly `labels`.
    pub(crate) fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let labels = label_map(labels);
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == labels)
            .map(Sample::value)
    }

    /// Every sample named `name`, by label set.
    pub(crate) fn all(&self, name: &str) -> BTreeMap<BTreeMap<String, String>, f64> {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .map(|s| (s.labels.clone(), s.value()))
            .collect()
    }

    /// The `edge_` metric families and their types.
    fn families(&self) -> BTreeMap<String, String> {
        self.samples
            .iter()
            .filter(|s| s.family.starts_with("edge_"))
            .map(|s| (s.family.clone(), s.kind.clone()))
            .collect()
    }
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The Python interpreter of the test venv, which has `prometheus_client`.
fn python() -> PathBuf {
    common::python::python()
}

/// `GET path` on the edge's HTTP address: the status and the body.
async fn get(client: &reqwest::Client, app: &TestApp, path: &str) -> (u16, String) {
    let url = format!("http://{}{path}", app.http_addr);
    let response = tokio::time::timeout(PATIENCE, client.get(&url).send())
        .await
        .unwrap_or_else(|_| panic!("GET {url} did not answer in time"))
        .unwrap_or_else(|e| panic!("GET {url} failed: {e}"));
    let status = response.status().as_u16();
    let body = response
        .text()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: unreadable body: {e}"));
    (status, body)
}

/// Scrapes `/metrics` and parses it with `prometheus_client`.
pub(crate) async fn scrape(client: &reqwest::Client, app: &TestApp) -> Scrape {
    let url = format!("http://{}/metrics", app.http_addr);
    let response = client
        .get(&url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url} failed: {e}"));
    assert_eq!(response.status().as_u16(), 200, "GET /metrics");
    let content_type = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "the Prometheus text format's content type, not {content_type:?}"
    );
    let text = response.text().await.expect("the /metrics body");
    let samples = parse(&text).await;
    Scrape { text, samples }
}

/// Parses Prometheus text with the Python parser; panics with the parser's error when the
/// text is not valid.
async fn parse(text: &str) -> Vec<Sample> {
    // The first call may create the venv: keep that off the edge's runtime threads.
    let python = tokio::task::spawn_blocking(python)
        .await
        .expect("the test venv is ready");
    let mut child = tokio::process::Command::new(&python)
        .arg("-c")
        .arg(PARSE_SCRIPT)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", python.display()));
    let mut stdin = child.stdin.take().expect("piped stdin");
    stdin
        .write_all(text.as_bytes())
        .await
        .expect("write the scrape to the parser");
    drop(stdin);
    let output = tokio::time::timeout(PATIENCE, child.wait_with_output())
        .await
        .expect("the parser finished in time")
        .expect("the parser ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "prometheus_client refused the scrape: {stderr}\n--- scrape ---\n{text}"
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("parser line {line:?}: {e}"))
        })
        .collect()
}

/// A sample the scrape must show: name, exact labels and value.
pub(crate) type Expected = (&'static str, Vec<(&'static str, &'static str)>, f64);

/// `name{labels}` must be `value`.
pub(crate) fn want(
    name: &'static str,
    labels: &[(&'static str, &'static str)],
    value: f64,
) -> Expected {
    (name, labels.to_vec(), value)
}

/// `name{key="v"}` must be `value`, for each `(v, value)`.
fn each(name: &'static str, key: &'static str, values: &[(&'static str, f64)]) -> Vec<Expected> {
    values
        .iter()
        .map(|(v, value)| (name, vec![(key, *v)], *value))
        .collect()
}

/// The expectations `scrape` does not meet, as readable lines.
fn unmet(scrape: &Scrape, expected: &[Expected]) -> Vec<String> {
    expected
        .iter()
        .filter_map(|(name, labels, value)| {
            let found = scrape.get(name, labels);
            (found != Some(*value))
                .then(|| format!("{name}{labels:?}: want {value}, have {found:?}"))
        })
        .collect()
}

/// Scrapes until every expectation holds, and returns that scrape; panics with what is
/// still missing when they do not hold within [`PATIENCE`].
pub(crate) async fn scrape_until(
    client: &reqwest::Client,
    app: &TestApp,
    expected: &[Expected],
) -> Scrape {
    eventually_ok("the metrics match", || async {
        let scrape = scrape(client, app).await;
        let missing = unmet(&scrape, expected);
        if missing.is_empty() {
            Ok(scrape)
        } else {
            Err(format!(
                "never matched:\n{}\n--- last scrape ---\n{}",
                missing.join("\n"),
                scrape.text
            ))
        }
    })
    .await
}

// ---------------------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------------------

/// A run of `echo/<target>` with `input`, told to behave as `mock` by the mock node, pinned
/// to the node with id or alias `pin`.
fn spec(target: &str, pin: &str, input: &str, mock: &str) -> RunSpec {
    let mut spec = mocked(echo_to(target, input), mock);
    spec.selector.pin = Some(pin.to_owned());
    spec
}

/// The terminal event of a finished run's events.
fn terminal(events: &[Arc<RunEvent>]) -> &RunEventKind {
    let last = events.last().expect("at least the terminal event");
    assert!(last.kind.is_terminal(), "{events:#?}");
    &last.kind
}

/// Waits until the mock node has received a `Run` command.
async fn wait_for_run_command(node: &MockNode) {
    eventually("the node received its run", || {
        node.commands()
            .iter()
            .any(|c| matches!(c, NodeCommand::Run(_)))
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// The scenario
// ---------------------------------------------------------------------------------------

/// An edge after the scripted scenario, and what the scenario saw.
struct Scenario {
    app: TestApp,
    /// Every event every run's caller received.
    events: Vec<Arc<RunEvent>>,
    run_ids: Vec<RunId>,
    /// Node `node-a`, still connected (held so it stays so).
    _node_a: MockNode,
    /// Holds the event file alive.
    _events_dir: tempfile::TempDir,
    events_file: PathBuf,
}

/// What the callers of the scenario's runs received.
#[derive(Default)]
struct Seen {
    events: Vec<Arc<RunEvent>>,
    run_ids: Vec<RunId>,
}

impl Seen {
    /// Reads an accepted run to its end; returns its events and keeps a copy.
    async fn collect_run(&mut self, handle: Result<RunHandle, StartError>) -> Vec<Arc<RunEvent>> {
        let mut handle = handle.expect("run accepted");
        let events = rest(&mut handle).await;
        self.run_ids.push(handle.run_id);
        self.events.extend(events.iter().cloned());
        events
    }
}

/// `TWO_NODES` with events going to the file sink at `path`.
fn config_with_file_sink(path: &Path) -> String {
    format!(
        "{TWO_NODES}\n[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 20\n",
        path.display().to_string()
    )
}

/// Registrations: one refused for its token, `node-a` and `node-b` accepted, a second
/// `node-a` refused as already connected. Runs: `echo/default` completed on `node-a`,
/// `echo/fast` completed on `node-b`, `echo/default` failed by `node-a`, `echo/default`
/// cancelled on `node-a`, and `echo/default` on `node-b`, which drops its connection
/// mid-run (the run fails `node_disconnected`; the node disconnects with `eof`).
async fn scripted_scenario() -> Scenario {
    let events_dir = tempfile::tempdir().expect("tempdir");
    let events_file = events_dir.path().join("events.jsonl");
    let app = spawn_app(&config_with_file_sink(&events_file)).await;

    let (refused, outcome) = app.register(WRONG_TOKEN).await;
    assert_eq!(outcome.rejection, Some(RegisterRejection::InvalidToken));
    drop(refused);
    let node_a = MockNode::start(app.node_addr, MockOptions::new("token-a"))
        .await
        .expect("node-a registers");
    let node_b = MockNode::start(app.node_addr, MockOptions::new("token-b"))
        .await
        .expect("node-b registers");
    app.wait_for_nodes(2).await;
    let (twin, outcome) = app.register("token-a").await;
    assert_eq!(outcome.rejection, Some(RegisterRejection::AlreadyConnected));
    drop(twin);

    let runs = &app.parts.runs;
    let mut seen = Seen::default();

    let got = seen
        .collect_run(runs.start(spec("default", "gpu-a", "one two three", "echo")))
        .await;
    assert!(matches!(terminal(&got), RunEventKind::Completed { .. }));

    let got = seen
        .collect_run(runs.start(spec("fast", "node-b", "quick", "echo")))
        .await;
    assert!(matches!(terminal(&got), RunEventKind::Completed { .. }));

    let got = seen
        .collect_run(runs.start(spec("default", "node-a", "doomed words", "fail")))
        .await;
    assert!(matches!(terminal(&got), RunEventKind::Failed { code, .. } if code == "mock_failure"));

    let hanging = runs.start(spec("default", "node-a", "never answered", "hang"));
    let run_id = hanging
        .as_ref()
        .map(|h| h.run_id.clone())
        .expect("accepted");
    wait_for_run_command(&node_a).await;
    assert!(runs.cancel(&run_id, "the test changed its mind").await);
    let got = seen.collect_run(hanging).await;
    assert!(matches!(terminal(&got), RunEventKind::Cancelled { .. }));

    let got = seen
        .collect_run(runs.start(spec("default", "node-b", "lost midway", "drop")))
        .await;
    assert!(
        matches!(terminal(&got), RunEventKind::Failed { code, .. } if code == "node_disconnected")
    );
    let ended = tokio::time::timeout(PATIENCE, node_b.ended()).await;
    assert_eq!(
        ended.ok(),
        Some(mock_node::Ended::Killed),
        "node-b dropped its connection"
    );
    app.wait_for_nodes(1).await;
    resumed_run(&app, &mut seen).await;

    Scenario {
        app,
        events: seen.events,
        run_ids: seen.run_ids,
        _node_a: node_a,
        _events_dir: events_dir,
        events_file,
    }
}

/// node-b comes back as a node that resumes (an instance id): it starts a run, sends one
/// output and drops its connection (the run is detached), registers again claiming the run
/// (it is resumed from seq 2), completes it, and leaves.
async fn resumed_run(app: &TestApp, seen: &mut Seen) {
    let register = |resume: Vec<ResumeClaim>| async move {
        let mut client = NodeClient::connect(app.node_addr).await.expect("connect");
        let mut registration = Registration::with_token("token-b").instance("node-b-1");
        registration.resume = resume;
        let outcome = common::bounded("node-b's registration", client.register(registration))
            .await
            .expect("register");
        assert!(outcome.accepted);
        (client, outcome)
    };
    let (mut first, _) = register(Vec::new()).await;
    app.wait_for_nodes(2).await;
    let mut handle = app
        .parts
        .runs
        .start(spec("default", "node-b", "kept", "echo"))
        .expect("accepted");
    let run_id = handle.run_id.as_str().to_owned();
    while !matches!(
        common::bounded("node-b's run", first.next())
            .await
            .expect("the run arrives"),
        ReceivedEdgeFrame::Command(NodeCommand::Run(_))
    ) {}
    first
        .event(&run_id, 1, RunEventKind::text("kept"))
        .await
        .expect("send");
    let output = common::bounded("the kept run's output", handle.events.recv());
    seen.events.push(output.await.expect("the output"));
    drop(first);
    let detached = [want("edge_runs_detached_total", &[], 1.0)];
    scrape_until(&crate::common::http_client(), app, &detached).await;

    let claim = ResumeClaim {
        run_id: run_id.clone(),
        next_seq: 2,
        first_buffered_seq: 2,
    };
    let (mut second, outcome) = register(vec![claim]).await;
    let resumed = ResumeAnswer {
        run_id: run_id.clone(),
        outcome: Ok(2),
    };
    assert_eq!(outcome.resumed, [resumed]);
    let completed = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    };
    second.event(&run_id, 2, completed).await.expect("send");
    let got = seen.collect_run(Ok(handle)).await;
    assert!(matches!(terminal(&got), RunEventKind::Completed { .. }));
    drop(second);
    app.wait_until_left("node-b").await;
}

/// How many of `events` are of kind `kind`.
fn count_kind(events: &[Arc<RunEvent>], kind: &str) -> f64 {
    events.iter().filter(|e| e.kind.name() == kind).count() as f64
}

// ---------------------------------------------------------------------------------------
// A counting relay between nodes and the edge
// ---------------------------------------------------------------------------------------

/// What crossed a [`CountingProxy`] in one direction.
#[derive(Debug, Default)]
struct Traffic {
    bytes: AtomicU64,
    /// Whole length-delimited frames (a varint length prefix and that many bytes).
    frames: AtomicU64,
}

/// A TCP relay that nodes dial instead of the edge; it counts the bytes and frames each way,
/// which is what the edge's transport counters must report.
struct CountingProxy {
    addr: SocketAddr,
    up: Arc<Traffic>,
    down: Arc<Traffic>,
    /// Relayed connections not yet closed in both directions.
    open: Arc<AtomicU64>,
    accept: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    async fn start(edge: SocketAddr) -> CountingProxy {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let up = Arc::new(Traffic::default());
        let down = Arc::new(Traffic::default());
        let open = Arc::new(AtomicU64::new(0));
        let (up2, down2, open2) = (Arc::clone(&up), Arc::clone(&down), Arc::clone(&open));
        let accept = tokio::spawn(async move {
            while let Ok((node, _)) = listener.accept().await {
                let Ok(edge) = TcpStream::connect(edge).await else {
                    continue;
                };
                let (node_read, node_write) = node.into_split();
                let (edge_read, edge_write) = edge.into_split();
                open2.fetch_add(2, SeqCst);
                for (from, to, traffic) in [
                    (node_read, edge_write, Arc::clone(&up2)),
                    (edge_read, node_write, Arc::clone(&down2)),
                ] {
                    let open = Arc::clone(&open2);
                    tokio::spawn(async move {
                        relay(from, to, &traffic).await;
                        open.fetch_sub(1, SeqCst);
                    });
                }
            }
        });
        CountingProxy {
            addr,
            up,
            down,
            open,
            accept,
        }
    }

    /// Waits until every relayed connection has closed both ways.
    async fn wait_closed(&self) {
        eventually("every relayed connection closed", || {
            self.open.load(SeqCst) == 0
        })
        .await;
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to` until either side closes, counting what was delivered.
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, traffic: &Traffic) {
    let mut buf = vec![0_u8; 16 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        traffic.bytes.fetch_add(n as u64, SeqCst);
        pending.extend_from_slice(&buf[..n]);
        while let Some(size) = whole_frame(&pending) {
            pending.drain(..size);
            traffic.frames.fetch_add(1, SeqCst);
        }
    }
    let _ = to.shutdown().await;
}

/// The size (prefix included) of the whole frame at the start of `bytes`, if it is all there.
fn whole_frame(bytes: &[u8]) -> Option<usize> {
    let mut len: usize = 0;
    for (i, byte) in bytes.iter().enumerate().take(10) {
        len |= usize::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            let size = i + 1 + len;
            return (bytes.len() >= size).then_some(size);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

/// Every counter after the scenario equals what the scenario did, in text a real
/// Prometheus parser accepts.
#[crate::common::test]
async fn metrics_after_a_scripted_scenario_count_what_happened() {
    let scenario = scripted_scenario().await;
    let app = &scenario.app;
    let events = &scenario.events;
    let http = crate::common::http_client();

    // Runs whose caller saw an output (the dropping node may lose its output with the
    // connection, so this one is counted, not assumed).
    let mut with_output: BTreeMap<&str, f64> = BTreeMap::new();
    for run_id in &scenario.run_ids {
        let run: Vec<&Arc<RunEvent>> = events.iter().filter(|e| &e.run_id == run_id).collect();
        if run
            .iter()
            .any(|e| matches!(e.kind, RunEventKind::Output { .. }))
        {
            *with_output.entry(run[0].target.as_str()).or_default() += 1.0;
        }
    }
    assert_eq!(with_output.get("fast"), Some(&1.0));
    // echo and fail always send an output; the dropping node may or may not.
    let first_output_default = with_output.get("default").copied().unwrap_or_default();
    assert!(
        first_output_default == 3.0 || first_output_default == 4.0,
        "default runs with an output: {first_output_default}"
    );
    let relayed = |kind| count_kind(events, kind);
    let total_events = events.len() as f64;

    let default = [("adapter", "echo"), ("target", "default")];
    let fast = [("adapter", "echo"), ("target", "fast")];
    let interactive = |route: [(&'static str, &'static str); 2]| {
        [route[0], route[1], ("priority", "interactive")]
    };
    let mut expected: Vec<Expected> = vec![
        want("edge_nodes_configured", &[], 2.0),
        want("edge_nodes_connected", &[], 1.0),
        // node-a's connection; the refused ones and node-b's are closed.
        want("edge_connections_open", &[], 1.0),
        want("edge_connections_refused_total", &[], 0.0),
        want("edge_runs_started_total", &default, 5.0),
        want("edge_runs_started_total", &fast, 1.0),
        want("edge_runs_active", &[], 0.0),
        want("edge_runs_queued", &[], 0.0),
        want("edge_run_duration_seconds_count", &default, 5.0),
        want("edge_run_duration_seconds_count", &fast, 1.0),
        want(
            "edge_run_queue_wait_seconds_count",
            &interactive(default),
            5.0,
        ),
        want("edge_run_queue_wait_seconds_count", &interactive(fast), 1.0),
        want("edge_runs_waiting", &[("reason", "all_busy")], 0.0),
        want("edge_runs_waiting", &[("reason", "no_node_available")], 0.0),
        want("edge_breakers_open", &[], 0.0),
        want(
            "edge_run_placements_total",
            &[("rule", "pinned"), ("failover", "false")],
            6.0,
        ),
        want(
            "edge_run_failovers_total",
            &[("reason", "node_failure")],
            0.0,
        ),
        want("edge_breaker_transitions_total", &[("to", "open")], 0.0),
        want("edge_run_refusals_total", &[("limit", "queue_full")], 0.0),
        want("edge_run_refusals_total", &[("limit", "budget")], 0.0),
        want(
            "edge_run_time_to_first_output_seconds_count",
            &default,
            first_output_default,
        ),
        want("edge_run_time_to_first_output_seconds_count", &fast, 1.0),
        // The configured sink wrote every relayed event.
        want(
            "edge_sink_events_written_total",
            &[("sink", "file")],
            total_events,
        ),
        want("edge_sink_write_errors_total", &[("sink", "file")], 0.0),
        want("edge_sink_events_dropped_total", &[("sink", "file")], 0.0),
        want("edge_sink_queue_depth", &[("sink", "file")], 0.0),
    ];
    expected.extend(each(
        "edge_node_registrations_total",
        "result",
        &[
            ("accepted", 4.0),
            ("invalid_token", 1.0),
            ("already_connected", 1.0),
            ("node_id_mismatch", 0.0),
            ("unsupported_protocol", 0.0),
            ("shutting_down", 0.0),
            ("protocol_violation", 0.0),
        ],
    ));
    expected.extend(each(
        "edge_node_links_declared_dead_total",
        "by",
        &[("edge", 0.0), ("node", 0.0)],
    ));
    expected.extend(each(
        "edge_node_takeovers_total",
        "reason",
        &[("same_instance", 0.0), ("presumed_dead", 0.0)],
    ));
    // The second connection of node-a is a v1 registration: it cannot take over.
    expected.extend(each(
        "edge_node_takeover_refusals_total",
        "reason",
        &[
            ("no_instance_id", 1.0),
            ("other_instance_alive", 0.0),
            ("raced", 0.0),
        ],
    ));
    // The mock nodes report no availability: nothing changed, counted from registration.
    expected.extend(each(
        "edge_node_availability_changes_total",
        "node",
        &[("node-a", 0.0), ("node-b", 0.0)],
    ));
    expected.extend(each(
        "edge_node_disconnects_total",
        "reason",
        &[("eof", 3.0), ("io_error", 0.0), ("heartbeat_timeout", 0.0)],
    ));
    expected.extend(each(
        "edge_connections_closed_total",
        "reason",
        &[
            ("rejected", 2.0),
            ("eof", 3.0),
            ("io_error", 0.0),
            ("protocol_violation", 0.0),
        ],
    ));
    expected.push(want("edge_runs_detached_total", &[], 1.0));
    expected.push(want("edge_runs_reattached_total", &[], 1.0));
    expected.push(want(
        "edge_run_detached_seconds_count",
        &[("outcome", "resumed")],
        1.0,
    ));
    expected.extend(each(
        "edge_runs_resume_lost_total",
        "reason",
        &[
            ("grace_expired", 0.0),
            ("not_claimed", 0.0),
            ("sequence_behind", 0.0),
            ("events_lost", 0.0),
        ],
    ));
    for (target, outcome, code, runs) in [
        ("default", "completed", "", 2.0),
        ("fast", "completed", "", 1.0),
        ("default", "failed", "node_reported", 1.0),
        ("default", "failed", "node_disconnected", 1.0),
        ("default", "cancelled", "", 1.0),
    ] {
        let labels = [
            ("adapter", "echo"),
            ("target", target),
            ("outcome", outcome),
            ("code", code),
        ];
        expected.push(want("edge_runs_finished_total", &labels, runs));
    }
    expected.extend(each(
        "edge_run_events_dropped_total",
        "reason",
        &[
            ("unknown_run", 0.0),
            ("after_terminal", 0.0),
            ("duplicate", 0.0),
        ],
    ));
    for kind in ["started", "output", "completed", "failed", "cancelled"] {
        let labels = [("kind", kind)];
        expected.push(want(
            "edge_run_events_relayed_total",
            &labels,
            relayed(kind),
        ));
    }
    let scrape = scrape_until(&http, app, &expected).await;

    // The fixed counts of the scenario, beyond "what the callers saw".
    assert_eq!(relayed("completed"), 3.0);
    assert_eq!(relayed("failed"), 2.0);
    assert_eq!(relayed("cancelled"), 1.0);

    // Nothing else was counted: every run, every relayed event, every close, every
    // registration is one of those above.
    let sum = |name: &str| scrape.all(name).values().sum::<f64>();
    assert_eq!(
        sum("edge_runs_finished_total"),
        6.0,
        "{:?}",
        scrape.all("edge_runs_finished_total")
    );
    assert_eq!(sum("edge_runs_started_total"), 6.0);
    assert_eq!(sum("edge_run_events_relayed_total"), total_events);
    assert_eq!(
        sum("edge_connections_closed_total"),
        5.0,
        "{:?}",
        scrape.all("edge_connections_closed_total")
    );
    assert_eq!(
        sum("edge_node_disconnects_total"),
        3.0,
        "{:?}",
        scrape.all("edge_node_disconnects_total")
    );
    assert_eq!(sum("edge_node_registrations_total"), 6.0);

    // Histograms: the +Inf bucket holds every observation, and buckets only grow.
    for (labels, count) in scrape.all("edge_run_duration_seconds_count") {
        let buckets: Vec<(f64, f64)> = scrape
            .all("edge_run_duration_seconds_bucket")
            .into_iter()
            .filter(|(l, _)| {
                l.iter()
                    .filter(|(k, _)| *k != "le")
                    .all(|(k, v)| labels.get(k) == Some(v))
            })
            .map(|(l, v)| (l["le"].parse::<f64>().expect("le is a number"), v))
            .collect();
        let mut sorted = buckets.clone();
        sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
        assert_eq!(
            sorted.last().map(|b| (b.0, b.1)),
            Some((f64::INFINITY, count)),
            "{labels:?}"
        );
        assert!(sorted.windows(2).all(|w| w[0].1 <= w[1].1), "{sorted:?}");
        assert_eq!(
            sorted.len(),
            19,
            "18 documented bounds and +Inf: {sorted:?}"
        );
    }

    // Traffic flowed both ways.
    for name in [
        "edge_frames_received_total",
        "edge_frames_sent_total",
        "edge_transport_received_bytes_total",
        "edge_transport_sent_bytes_total",
    ] {
        let value = scrape
            .get(name, &[])
            .unwrap_or_else(|| panic!("{name} missing"));
        assert!(value > 0.0, "{name} = {value}");
    }

    // The file sink's file holds what the sink counted as written.
    let lines = std::fs::read_to_string(&scenario.events_file).expect("the event file");
    assert_eq!(lines.lines().count() as f64, total_events);

    // Every documented metric is exported with its documented type, and nothing else.
    let documented: BTreeMap<String, String> = DOCUMENTED
        .iter()
        .map(|(name, kind)| ((*name).to_owned(), (*kind).to_owned()))
        .collect();
    assert_eq!(scrape.families(), documented);
}

/// No label value is a run id or a token, and no label name is outside the bounded set.
#[crate::common::test]
async fn no_label_value_is_a_run_id_or_a_token() {
    let scenario = scripted_scenario().await;
    let http = crate::common::http_client();
    // Wait for the last counters of the scenario so the scan sees every label in use.
    let scrape = scrape_until(
        &http,
        &scenario.app,
        &[want(
            "edge_node_disconnects_total",
            &[("reason", "eof")],
            3.0,
        )],
    )
    .await;
    assert!(!scenario.run_ids.is_empty());
    let allowed: BTreeSet<&str> = LABEL_NAMES.into_iter().collect();
    let secrets: Vec<&str> = CONFIG_TOKENS.into_iter().chain([WRONG_TOKEN]).collect();
    for sample in scrape
        .samples
        .iter()
        .filter(|s| s.name.starts_with("edge_"))
    {
        for (name, value) in &sample.labels {
            assert!(
                allowed.contains(name.as_str()),
                "unexpected label {name} on {sample:?}"
            );
            assert!(
                !value.starts_with("run-"),
                "a run id as a label: {sample:?}"
            );
            for run_id in &scenario.run_ids {
                assert!(
                    !value.contains(run_id.as_str()),
                    "a run id as a label: {sample:?}"
                );
            }
            for secret in &secrets {
                assert!(!value.contains(secret), "a token as a label: {sample:?}");
            }
        }
    }
    // The raw text, comments included, carries neither.
    for secret in &secrets {
        assert!(!scrape.text.contains(secret), "a token in /metrics");
    }
    for run_id in &scenario.run_ids {
        assert!(
            !scrape.text.contains(run_id.as_str()),
            "a run id in /metrics"
        );
    }
}

/// `/readyz` answers 200 while serving and 503 from the moment a graceful stop begins,
/// while `/healthz` still answers 200; the drain is held open by a run on a node that
/// never answers it.
#[crate::common::test]
async fn readyz_is_503_while_a_stop_drains_and_healthz_stays_200() {
    let app = spawn_app(TWO_NODES).await;
    let http = crate::common::http_client();
    assert_eq!(get(&http, &app, "/healthz").await, (200, "ok\n".to_owned()));
    assert_eq!(
        get(&http, &app, "/readyz").await,
        (200, "ready\n".to_owned())
    );

    let node = MockNode::start(app.node_addr, MockOptions::new("token-a"))
        .await
        .expect("node-a registers");
    app.wait_for_nodes(1).await;
    let mut held = app
        .parts
        .runs
        .start(spec("default", "node-a", "held open", "hang"))
        .expect("accepted");
    wait_for_run_command(&node).await;
    assert_eq!(
        get(&http, &app, "/readyz").await.0,
        200,
        "ready with a run open"
    );

    app.parts.stop.cancel();
    let readyz = eventually_ok("/readyz stops answering 200", || async {
        let answer = get(&http, &app, "/readyz").await;
        if answer.0 == 200 {
            Err("still 200")
        } else {
            Ok(answer)
        }
    })
    .await;
    assert_eq!(readyz, (503, "draining\n".to_owned()));
    assert_eq!(get(&http, &app, "/healthz").await, (200, "ok\n".to_owned()));

    // The run held the drain until the grace ran out, and was then ended by the edge.
    let events = rest(&mut held).await;
    assert!(
        matches!(terminal(&events), RunEventKind::Failed { code, .. } if code == "edge_shutdown"),
        "{events:#?}"
    );
    tokio::time::timeout(PATIENCE, app.serving)
        .await
        .expect("the edge stopped in time")
        .expect("serving task")
        .expect("clean stop");
}

/// The transport's byte and frame counters equal what crossed the wire, for refused
/// registrations (a wrong token, a first frame that is not a registration) and for a node
/// that registers, runs and leaves.
#[crate::common::test]
async fn transport_counters_equal_the_bytes_and_frames_on_the_wire() {
    let app = spawn_app(TWO_NODES).await;
    let proxy = CountingProxy::start(app.node_addr).await;
    let http = crate::common::http_client();

    let mut wrong = NodeClient::connect(proxy.addr).await.expect("connect");
    let answer = wrong.register(Registration::with_token(WRONG_TOKEN));
    let outcome = common::bounded("the answer to a wrong token", answer)
        .await
        .expect("an answer");
    assert_eq!(outcome.rejection, Some(RegisterRejection::InvalidToken));
    drop(wrong);

    let mut rude = NodeClient::connect(proxy.addr).await.expect("connect");
    rude.send(NodeFrame::Heartbeat {
        active_runs: 0,
        ping: 0,
        availability: None,
        inventory: None,
    })
    .await
    .expect("send");
    match tokio::time::timeout(PATIENCE, rude.next()).await {
        Ok(Ok(ReceivedEdgeFrame::Registered(outcome))) => {
            assert_eq!(
                outcome.rejection,
                Some(RegisterRejection::ProtocolViolation)
            );
        }
        other => panic!("expected a register response, got {other:?}"),
    }
    drop(rude);

    let node = MockNode::start(proxy.addr, MockOptions::new("token-a"))
        .await
        .expect("node-a registers");
    app.wait_for_nodes(1).await;
    let mut seen = Seen::default();
    let got = seen
        .collect_run(
            app.parts
                .runs
                .start(spec("default", "node-a", "counted on the wire", "echo")),
        )
        .await;
    assert!(matches!(terminal(&got), RunEventKind::Completed { .. }));
    node.kill();
    proxy.wait_closed().await;

    let up = &proxy.up;
    let down = &proxy.down;
    let count = |n: &AtomicU64| n.load(SeqCst) as f64;
    let mut expected: Vec<Expected> = vec![
        want("edge_connections_open", &[], 0.0),
        want("edge_transport_received_bytes_total", &[], count(&up.bytes)),
        want("edge_transport_sent_bytes_total", &[], count(&down.bytes)),
        want("edge_frames_received_total", &[], count(&up.frames)),
        want("edge_frames_sent_total", &[], count(&down.frames)),
    ];
    expected.extend(each(
        "edge_connections_closed_total",
        "reason",
        &[("rejected", 1.0), ("protocol_violation", 1.0), ("eof", 1.0)],
    ));
    expected.extend(each(
        "edge_node_registrations_total",
        "result",
        &[
            ("invalid_token", 1.0),
            ("protocol_violation", 1.0),
            ("accepted", 1.0),
        ],
    ));
    scrape_until(&http, &app, &expected).await;
    app.stop().await;
}
