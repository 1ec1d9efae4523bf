//! What the `admin_*` test modules share: configs with admin keys, an HTTP client for
//! the management API, and a node driven by hand over the real protocol (the test decides
//! when each event goes out).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use edge::client::{NodeClient, heartbeat};
use edge::domain::{AdapterName, Availability, RunEventKind, RunId, Target};
use edge::ports::{NodeCommand, RunAssignment};
use edge::wire::ReceivedEdgeFrame;
use reqwest::{Method, StatusCode};
use serde_json::Value;

pub use crate::common::runs::echo_run;
use crate::common::{NodeTable, PATIENCE, TestApp};

/// The admin key of [`nodes_config`].
pub const ADMIN_KEY: &str = "adm-test-key";
/// The API key of [`nodes_config`].
pub const API_KEY: &str = "sk-test-key";

/// Nodes `node-a`/`gpu-a` and `node-b`/`gpu-b` (echo/default, 2 slots, heartbeats every
/// minute so hand-driven nodes are never evicted), one admin key and one API key.
pub fn nodes_config(extra: &str) -> String {
    let a = NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, 60_000)
        .echo(&["default"]);
    let b = NodeTable::new("node-b", "gpu-b", "token-b")
        .runtime(2, 60_000)
        .echo(&["default"]);
    format!("[admin]\nkeys = [\"{ADMIN_KEY}\"]\n[api]\nkeys = [\"{API_KEY}\"]\n{extra}\n{a}\n{b}\n")
}

/// An HTTP client that gives up after [`PATIENCE`].
pub fn client() -> reqwest::Client {
    crate::common::http()
        .timeout(PATIENCE)
        .build()
        .expect("client")
}

/// `method path` on the management API with the admin key; the status and JSON body.
pub async fn admin(
    app: &TestApp,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    admin_as(app, Some(ADMIN_KEY), method, path, body).await
}

/// `method path` on the management API presenting `key`.
pub async fn admin_as(
    app: &TestApp,
    key: Option<&str>,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut request = client().request(method, format!("http://{}{path}", app.admin_addr));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.expect("the management API answers");
    let status = response.status();
    let text = response.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// `GET path` with the admin key, expecting 200.
pub async fn get_ok(app: &TestApp, path: &str) -> Value {
    let (status, body) = admin(app, Method::GET, path, None).await;
    assert_eq!(status, StatusCode::OK, "GET {path}: {body}");
    body
}

/// A node whose every frame the test sends by hand.
pub struct HandNode {
    client: NodeClient,
    seq: BTreeMap<RunId, u64>,
}

impl HandNode {
    /// Connects to `app` and registers with `token`.
    pub async fn register(app: &TestApp, token: &str) -> Self {
        let (client, outcome) = app.register(token).await;
        assert!(outcome.accepted, "{outcome:?}");
        Self {
            client,
            seq: BTreeMap::new(),
        }
    }

    /// The next command from the edge.
    pub async fn next_command(&mut self) -> NodeCommand {
        loop {
            let frame = tokio::time::timeout(PATIENCE, self.client.next())
                .await
                .expect("a frame in time")
                .expect("a frame");
            if let ReceivedEdgeFrame::Command(command) = frame {
                return command;
            }
        }
    }

    /// The next run the edge sends.
    pub async fn next_run(&mut self) -> RunAssignment {
        match self.next_command().await {
            NodeCommand::Run(run) => run,
            other => panic!("expected a run, got {other:?}"),
        }
    }

    /// Sends `kind` for `run` with the next sequence number.
    pub async fn send(&mut self, run: &RunId, kind: RunEventKind) {
        let seq = self.seq.entry(run.clone()).or_insert(0);
        *seq += 1;
        self.client
            .event(run.as_str(), *seq, kind)
            .await
            .expect("send an event");
    }

    /// Sends a heartbeat reporting that it serves only `available` (`adapter/target` pairs)
    /// now.
    pub async fn report_available(&mut self, available: &[(&str, &str)]) {
        let with_windows: Vec<_> = available.iter().map(|&(a, t)| (a, t, 0)).collect();
        self.report_windows(&with_windows).await;
    }

    /// Sends a heartbeat reporting that it serves only `available` now, each
    /// `(adapter, target, context window)` (a window of 0: unknown).
    pub async fn report_windows(&mut self, available: &[(&str, &str, u32)]) {
        let parse = |adapter: &str, target: &str| {
            let adapter = AdapterName::parse(adapter).expect("adapter");
            (adapter, Target::parse(target).expect("target"))
        };
        let pairs = available
            .iter()
            .map(|&(adapter, target, _)| parse(adapter, target));
        let availability = available.iter().fold(
            Availability::new(pairs),
            |availability, &(adapter, target, window)| {
                let (adapter, target) = parse(adapter, target);
                availability.with_context_window(&adapter, &target, window)
            },
        );
        let frame = heartbeat(0, 0, Some(availability));
        self.client.send(frame).await.expect("send a heartbeat");
    }

    /// Sends `started`, an output `text` and `completed`.
    pub async fn complete(&mut self, run: &RunId, text: &str) {
        self.send(run, RunEventKind::Started).await;
        self.send(run, RunEventKind::text(text)).await;
        self.send(run, completed()).await;
    }
}

/// A `completed` event with token counts.
pub fn completed() -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(edge::domain::Usage::new(3, 2)),
    }
}

/// Polls `GET /admin/v1/runs/{id}` until `check` holds for the record; returns it.
pub async fn run_until(
    app: &TestApp,
    id: &RunId,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let what = format!("run {id} {what}");
    admin_until(app, &format!("/admin/v1/runs/{id}"), &what, check).await
}

/// Polls `GET path` until it answers 200 with a body `check` accepts, and returns that body;
/// panics naming `what` after [`PATIENCE`].
pub async fn admin_until(
    app: &TestApp,
    path: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (status, body) = admin(app, Method::GET, path, None).await;
        if status == StatusCode::OK && check(&body) {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `edge ARGS` (an operator command) against `app`'s management API, with `key` in
/// `EDGE_ADMIN_KEY`; its exit success, stdout and stderr.
pub async fn edge_command(
    app: &TestApp,
    key: Option<&str>,
    args: &[&str],
) -> (bool, String, String) {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_edge"));
    command
        .args(args)
        .env("EDGE_ADMIN_URL", format!("http://{}", app.admin_addr))
        .env_remove("EDGE_ADMIN_KEY")
        .env_remove("EDGE_ADMIN_CACERT")
        .kill_on_drop(true);
    if let Some(key) = key {
        command.env("EDGE_ADMIN_KEY", key);
    }
    let output = tokio::time::timeout(PATIENCE, command.output())
        .await
        .expect("the command ends in time")
        .expect("run the edge binary");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}
