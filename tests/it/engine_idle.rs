//! Issue 60: an engine is down only when it is down. A real `llama-server` closes an idle
//! kept-alive connection after 5 s, and the node probes it every 5 s (the defaults); a probe
//! that met such a connection used to report the engine gone for a second. Here the engine
//! idles for a minute (twelve keep-alive periods) behind a reference node process probing
//! as shipped: the edge never sees the model leave and counts no availability change, and
//! the node logs no `is down`. Then the engine is killed — reported down within one probe
//! interval — and restarted on its port — up again within one down-probe interval.
//!
//! Real time passes here because the engine's keep-alive is real time; the bounds on
//! "down" and "up again" are the probe intervals the issue promises, with the probe timeout
//! as slack, and each measured figure is printed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common::TestApp;
use crate::common::engines::LlamaServer;
use crate::continuation_engine::{NodeProcess, serving};
use crate::engines_e2e::llama_node_probed_as_shipped;
use crate::node_support::edge_on;

/// How long the engine idles: twelve of its 5 s keep-alive periods.
const IDLE: Duration = Duration::from_secs(60);
/// The node's default `probe_interval_ms`, `probe_down_interval_ms` and `probe_timeout_ms`.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const PROBE_DOWN_INTERVAL: Duration = Duration::from_secs(1);
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the edge's view of the node is looked at.
const SAMPLE: Duration = Duration::from_millis(50);

/// Whether node-1's last availability report serves `llama/tiny`.
fn serves(app: &TestApp) -> bool {
    let (adapter, target) = (
        edge::domain::AdapterName::parse("llama").expect("adapter name"),
        edge::domain::Target::parse("tiny").expect("target"),
    );
    app.parts.registry.get("node-1").is_some_and(|node| {
        node.availability
            .as_ref()
            .is_some_and(|a| a.serves(&adapter, &target))
    })
}

/// node-1's availability changes as the edge counts them.
fn changes(app: &TestApp) -> u64 {
    app.parts
        .transport
        .stats()
        .availability_changes()
        .into_iter()
        .find(|(node, _)| node.as_str() == "node-1")
        .map_or(0, |(_, changes)| changes)
}

/// Waits until node-1 serves the model (`true`) or not (`false`); fails past `bound`.
/// Returns how long it took.
async fn until_serving(app: &TestApp, serving: bool, bound: Duration, what: &str) -> Duration {
    let start = Instant::now();
    while serves(app) != serving {
        assert!(
            start.elapsed() <= bound,
            "{what}: not within {bound:?} (the node's log says why)"
        );
        tokio::time::sleep(SAMPLE).await;
    }
    start.elapsed()
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2, deadline_secs = 300)]
async fn an_engine_idle_for_a_minute_is_never_down_and_a_killed_one_is_down_within_a_probe() {
    let mut llama = LlamaServer::start().await;
    let config = llama_node_probed_as_shipped("node-1", "token-1", &llama.v1_url());
    let app = edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await;
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("node.log");
    let node = NodeProcess::spawn_logged(app.node_addr, "token-1", &log);
    serving(&app, "node-1").await;
    let node_log = || std::fs::read_to_string(&log).expect("the node's log");

    let idle_until = Instant::now() + IDLE;
    while Instant::now() < idle_until {
        assert!(
            serves(&app),
            "idle, the model left the edge:\n{}",
            node_log()
        );
        tokio::time::sleep(SAMPLE).await;
    }
    assert_eq!(changes(&app), 0, "an idle engine flapped:\n{}", node_log());
    assert!(!node_log().contains("is down"), "{}", node_log());

    llama.stop().await;
    let down = until_serving(&app, false, PROBE_INTERVAL + PROBE_TIMEOUT, "killed, down").await;
    llama.restart().await;
    let up = until_serving(&app, true, PROBE_DOWN_INTERVAL + PROBE_TIMEOUT, "back, up").await;
    println!("killed engine reported down after {down:?}; restarted engine up after {up:?}");
    assert_eq!(changes(&app), 2, "down once, up once");
    let logged = node_log();
    let down_line = logged
        .lines()
        .find(|line| line.contains("engine is down"))
        .unwrap_or_else(|| panic!("the node logs the engine down:\n{logged}"));
    let up_for: f64 = down_line
        .split("up_for=")
        .nth(1)
        .and_then(|rest| rest.split('s').next())
        .and_then(|seconds| seconds.parse().ok())
        .unwrap_or_else(|| panic!("how long the engine had been up: {down_line}"));
    assert!(
        up_for >= IDLE.as_secs_f64(),
        "up for the idle minute: {down_line}"
    );
    assert!(down_line.contains("fault="), "the cause: {down_line}");

    node.kill().await;
    app.stop().await;
}
