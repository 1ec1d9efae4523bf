//! The NATS event sink against a real `nats-server` (Debian's package, on a free port):
//! events on their documented subjects in order and byte for byte the file sink's lines,
//! JetStream replay after a consumer restart, and a server killed and restarted under
//! load — runs keep being served, the sink reconnects, and its counters account for every
//! event.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull};
use bytes::Bytes;
use edge::domain::{RunEvent, RunId, RunSpec};
use futures::StreamExt as _;

use crate::common::engines::NatsServer;
use crate::common::runs::{echo_to, only_terminal, rest, start, words};
use crate::common::{NodeTable, PATIENCE, TestApp, eventually_ok, spawn_app};
use crate::mock_node::{MockNode, MockOptions};

/// The edge id and target of these tests: both hold a `.`, which the subject escapes.
const EDGE_ID: &str = "site.a";
const TARGET: &str = "m1.5:x";
/// `edge.<edge id>.runs.<adapter>.<target>.` with the tokens escaped.
const SUBJECT_HEAD: &str = "edge.site%2Ea.runs.echo.m1%2E5:x.";

/// One node serving `echo/m1.5:x`, the NATS sink (and `extra_sinks`) on `nats`, and the
/// `[events.nats]` keys in `nats_keys`.
/// The file sink, when in `extra_sinks`, writes `file`.
fn config(nats: &NatsServer, extra_sinks: &str, file: &Path, nats_keys: &str) -> String {
    let node = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(8, 1_000)
        .echo(&[TARGET]);
    format!(
        "[edge]\nid = {EDGE_ID:?}\n[events]\nsinks = [{extra_sinks}\"nats\"]\n\
         [events.file]\npath = {file:?}\nflush_interval_ms = 10\n\
         [events.nats]\nurl = {:?}\nreconnect_max_delay_ms = 100\n{nats_keys}\n{node}",
        nats.url()
    )
}

/// A config without the file sink.
fn nats_only(nats: &NatsServer, nats_keys: &str) -> String {
    config(nats, "", Path::new("unused.jsonl"), nats_keys)
}

/// A run of `echo/m1.5:x` echoing `count` words.
fn spec(count: usize) -> RunSpec {
    echo_to(TARGET, &words(count))
}

/// The edge with its node registered.
async fn edge_with_node(config: &str) -> (TestApp, MockNode) {
    let app = spawn_app(config).await;
    let node = MockNode::start(app.node_addr, MockOptions::new("token-a"))
        .await
        .expect("mock node registers");
    app.wait_for_nodes(1).await;
    (app, node)
}

/// Runs `runs` runs of `count` words to their end; returns each run's events.
async fn run_all(app: &TestApp, runs: usize, count: usize) -> Vec<(RunId, Vec<Arc<RunEvent>>)> {
    let handles: Vec<_> = (0..runs).map(|_| start(app, spec(count))).collect();
    let mut done = Vec::new();
    for mut handle in handles {
        let events = rest(&mut handle).await;
        only_terminal(&handle.run_id, &events);
        done.push((handle.run_id, events));
    }
    done
}

/// A sample's value in a Prometheus scrape: `name` and `labels` (`""` or `{k="v"}`).
async fn metric(app: &TestApp, name: &str, labels: &str) -> f64 {
    let url = format!("http://{}/metrics", app.http_addr);
    let text = crate::common::http_get(&url)
        .await
        .expect("scrape")
        .text()
        .await
        .expect("scrape body");
    let wanted = format!("{name}{labels} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&wanted))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The NATS sink's accounting once nothing is pending: events handed to it, confirmed,
/// dropped (non-terminal, terminal).
async fn settled_accounting(app: &TestApp) -> (f64, f64, f64, f64) {
    eventually_ok("the NATS sink has nothing pending", || async {
        let written = metric(app, "edge_sink_events_written_total", "{sink=\"nats\"}").await;
        let published = metric(app, "edge_sink_nats_published_total", "").await;
        let dropped = metric(app, "edge_sink_nats_dropped_total", "{terminal=\"false\"}").await;
        let terminal = metric(app, "edge_sink_nats_dropped_total", "{terminal=\"true\"}").await;
        let pending = metric(app, "edge_sink_nats_pending", "").await;
        let settled = pending == 0.0 && written > 0.0 && written == published + dropped + terminal;
        settled
            .then_some((written, published, dropped, terminal))
            .ok_or(format!(
                "written {written}, published {published}, dropped {dropped}+{terminal}, pending {pending}"
            ))
    })
    .await
}

/// The payload of `message` as JSON.
fn json(payload: &[u8]) -> serde_json::Value {
    serde_json::from_slice(payload).expect("payload is JSON")
}

#[crate::common::test]
async fn events_arrive_on_their_documented_subjects_in_order_as_the_file_sinks_lines() {
    let nats = NatsServer::start().await;
    let listener = async_nats::connect(nats.url()).await.expect("listener");
    let mut subscription = listener
        .subscribe("edge.*.runs.>")
        .await
        .expect("subscribe");
    crate::common::bounded("nats-server to confirm the subscription", listener.flush())
        .await
        .expect("subscribed");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events.jsonl");
    let (app, _node) = edge_with_node(&config(&nats, "\"file\", ", &file, "")).await;

    let runs = run_all(&app, 3, 20).await;
    let mut received: HashMap<String, Vec<Bytes>> = HashMap::new();
    let mut terminals = 0;
    while terminals < runs.len() {
        let message = tokio::time::timeout(PATIENCE, subscription.next())
            .await
            .expect("an event in time")
            .expect("subscription open");
        let kind = json(&message.payload)["kind"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        terminals += usize::from(matches!(
            kind.as_str(),
            "completed" | "failed" | "cancelled"
        ));
        received
            .entry(message.subject.to_string())
            .or_default()
            .push(message.payload);
    }
    app.stop().await;
    let lines = std::fs::read_to_string(file).expect("file sink");

    assert_eq!(received.len(), runs.len(), "one subject per run");
    for (run_id, events) in &runs {
        let subject = format!("{SUBJECT_HEAD}{run_id}");
        let payloads = &received[&subject];
        assert_eq!(payloads.len(), events.len(), "every event of {run_id}");
        let seqs: Vec<u64> = payloads
            .iter()
            .map(|p| json(p)["seq"].as_u64().unwrap())
            .collect();
        let expected: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, expected, "in order");
        let file_lines: Vec<&str> = lines
            .lines()
            .filter(|line| json(line.as_bytes())["run_id"] == run_id.as_str())
            .collect();
        let nats_lines: Vec<&str> = payloads
            .iter()
            .map(|p| {
                std::str::from_utf8(p)
                    .expect("utf-8")
                    .trim_end_matches('\n')
            })
            .collect();
        assert_eq!(nats_lines, file_lines, "payload = the file sink's line");
    }
}

#[crate::common::test]
async fn jetstream_replays_to_a_durable_consumer_after_it_restarts() {
    let nats = NatsServer::start_jetstream().await;
    let keys = "[events.nats.jetstream]\nstream = \"EDGE_TEST\"\nmax_age_secs = 3600\n";
    let (app, _node) = edge_with_node(&nats_only(&nats, keys)).await;
    let runs = run_all(&app, 4, 10).await;
    let (written, published, _, _) = settled_accounting(&app).await;
    assert_eq!(written, published, "every event acked by the stream");
    let expected: Vec<(String, u64)> = runs
        .iter()
        .flat_map(|(id, events)| events.iter().map(move |e| (id.to_string(), e.seq)))
        .collect();
    let total = expected.len();

    let durable = pull::Config {
        durable_name: Some("reader".into()),
        filter_subject: "edge.site%2Ea.runs.>".into(),
        ..pull::Config::default()
    };
    let first_half = read_durable(&nats, durable.clone(), total / 2).await;
    // The consumer restarts: a new connection binds to the same durable consumer.
    let second_half = read_durable(&nats, durable, total - total / 2).await;
    let mut replayed: Vec<(String, u64)> = first_half.into_iter().chain(second_half).collect();
    assert_eq!(
        replayed.len(),
        total,
        "nothing lost or repeated across the restart"
    );
    replayed.sort();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(replayed, expected_sorted);
    app.stop().await;
}

/// Connects afresh, binds to the durable consumer `config` names, and reads and acks `n`
/// events, returning their `(run_id, seq)`; runs within one subject stay in order.
async fn read_durable(nats: &NatsServer, config: pull::Config, n: usize) -> Vec<(String, u64)> {
    let client = async_nats::connect(nats.url())
        .await
        .expect("reader connects");
    let stream = jetstream::new(client)
        .get_stream("EDGE_TEST")
        .await
        .expect("the edge created the stream");
    let consumer = stream
        .get_or_create_consumer("reader", config)
        .await
        .expect("durable consumer");
    let mut messages = consumer
        .fetch()
        .max_messages(n)
        .expires(PATIENCE)
        .messages()
        .await
        .expect("fetch");
    let mut read = Vec::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    while read.len() < n {
        let message = tokio::time::timeout(PATIENCE, messages.next())
            .await
            .expect("a stored event in time")
            .expect("fetch open")
            .expect("message");
        let event = json(&message.payload);
        let run = event["run_id"].as_str().expect("run_id").to_owned();
        let seq = event["seq"].as_u64().expect("seq");
        let previous = last_seq.insert(run.clone(), seq);
        assert!(previous.is_none_or(|p| p < seq), "in order within a run");
        message.ack().await.expect("ack");
        read.push((run, seq));
    }
    read
}

#[crate::common::test]
async fn a_killed_and_restarted_server_is_survived_and_the_counters_say_what_was_dropped() {
    let mut nats = NatsServer::start_jetstream().await;
    let keys = "backlog_capacity = 40\nack_timeout_ms = 1000\n\
                [events.nats.jetstream]\nstream = \"EDGE_TEST\"\n";
    let (app, _node) = edge_with_node(&nats_only(&nats, keys)).await;
    let before = run_all(&app, 3, 10).await;
    settled_accounting(&app).await;

    nats.stop().await;
    eventually_ok("the sink notices the server is gone", || async {
        let connected = metric(&app, "edge_sink_nats_connected", "").await;
        (connected == 0.0).then_some(()).ok_or("still connected")
    })
    .await;
    // The edge keeps serving runs: each still ends for its caller.
    let during = run_all(&app, 10, 10).await;
    eventually_ok(
        "events beyond the backlog are dropped and counted",
        || async {
            let dropped =
                metric(&app, "edge_sink_nats_dropped_total", "{terminal=\"false\"}").await;
            (dropped > 0.0).then_some(()).ok_or("none dropped yet")
        },
    )
    .await;

    nats.restart().await;
    eventually_ok("the sink reconnects and publishes what it held", || async {
        let connected = metric(&app, "edge_sink_nats_connected", "").await;
        let pending = metric(&app, "edge_sink_nats_pending", "").await;
        (connected == 1.0 && pending == 0.0)
            .then_some(())
            .ok_or(format!("connected {connected}, pending {pending}"))
    })
    .await;
    let after = run_all(&app, 3, 10).await;
    let (written, published, dropped, dropped_terminal) = settled_accounting(&app).await;
    assert!(
        metric(&app, "edge_sink_nats_connects_total", "").await >= 2.0,
        "reconnected"
    );
    assert_eq!(dropped_terminal, 0.0, "terminal events are dropped last");
    assert!(dropped > 0.0 && published < written);

    let stored = stored_events(&nats, "EDGE_TEST").await;
    for (run_id, events) in before.iter().chain(&after) {
        for event in events {
            assert!(
                stored.contains(&(run_id.to_string(), event.seq)),
                "{run_id} {}",
                event.seq
            );
        }
    }
    for (run_id, events) in &during {
        let terminal = events.last().expect("terminal");
        assert!(
            stored.contains(&(run_id.to_string(), terminal.seq)),
            "the terminal event of {run_id}, held while the server was down"
        );
    }
    app.stop().await;
}

/// Every `(run_id, seq)` stored in `stream`, read with an ephemeral consumer.
async fn stored_events(nats: &NatsServer, stream: &str) -> Vec<(String, u64)> {
    let client = async_nats::connect(nats.url())
        .await
        .expect("reader connects");
    let stream = jetstream::new(client)
        .get_stream(stream)
        .await
        .expect("stream survived the restart");
    let count = stream.get_info().await.expect("info").state.messages;
    let consumer = stream
        .create_consumer(pull::Config::default())
        .await
        .expect("consumer");
    let mut messages = consumer
        .fetch()
        .max_messages(usize::try_from(count).expect("count"))
        .expires(PATIENCE)
        .messages()
        .await
        .expect("fetch");
    let mut stored = Vec::new();
    while let Some(message) = tokio::time::timeout(Duration::from_secs(5), messages.next())
        .await
        .ok()
        .flatten()
    {
        let event = json(&message.expect("message").payload);
        stored.push((
            event["run_id"].as_str().expect("run_id").to_owned(),
            event["seq"].as_u64().expect("seq"),
        ));
    }
    stored
}
