//! `kill -9` of the real `edge` binary mid-load: the journal opens again, the runs that
//! finished are there with their events, and no run open at the crash is reported as
//! completed (they are `unknown`/`edge_crashed`).

use crate::admin_support;
use crate::common;
use crate::mock_node;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{Logs, PATIENCE, edge_serve, eventually, logged, watch_stderr, write_config};
use mock_node::{MockNode, MockOptions};
use serde_json::{Value, json};
use tokio::process::Child;

/// One node serving `echo/default` (streams its input back) and `echo/hang` (never
/// answers), with room for every run of the test; no keys (loopback only).
pub(crate) const CONFIG: &str = r#"
[events]
sinks = ["null"]

[runs]
resume_grace_ms = 300

[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "token-a"
[nodes.runtime]
max_concurrent_runs = 64
heartbeat_interval_ms = 60000
[[nodes.adapters]]
name = "echo"
targets = ["default", "hang"]
"#;

/// A running `edge serve` and its addresses (`usage.rs` uses it too).
pub(crate) struct Edge {
    pub(crate) child: Child,
    pub(crate) node: SocketAddr,
    pub(crate) http: SocketAddr,
    pub(crate) admin: SocketAddr,
    logs: Logs,
}

impl Edge {
    /// Every line it logged so far.
    pub(crate) fn logs(&self) -> Vec<String> {
        common::logged(&self.logs)
    }
}

pub(crate) async fn start_edge(config: &Path) -> Edge {
    start_edge_with(edge_serve(config)).await
}

/// A running edge from `command` (an `edge serve` command line).
pub(crate) async fn start_edge_with(mut command: tokio::process::Command) -> Edge {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the edge binary");
    let (logs, bound) = watch_stderr(child.stderr.take().expect("piped stderr"));
    let (node, http) = tokio::time::timeout(PATIENCE, bound)
        .await
        .expect("the edge serves in time")
        .expect("the serving line");
    // The serving line is kept just after the addresses are announced: wait for it.
    let admin_line = || logged(&logs).iter().find_map(|line| admin_address(line));
    eventually("the serving line names the admin address", || {
        admin_line().is_some()
    })
    .await;
    let admin = admin_line().expect("the admin address");
    Edge {
        child,
        node,
        http,
        admin,
        logs,
    }
}

fn admin_address(line: &str) -> Option<SocketAddr> {
    let record: Value = serde_json::from_str(line).ok()?;
    let admin = record
        .get("admin")
        .or_else(|| record.pointer("/fields/admin"))?;
    admin.as_str()?.parse().ok()
}

/// The record of run `run_id` on the management API at `admin`, once it shows `completed`
/// (`what` names the wait).
pub(crate) async fn completed_record(admin: SocketAddr, run_id: &str, what: &str) -> Value {
    let path = format!("/admin/v1/runs/{run_id}");
    crate::common::eventually_ok(what, || async {
        let record = get(admin, &path).await;
        if record["outcome"] == "completed" {
            Ok(record)
        } else {
            Err(record.to_string())
        }
    })
    .await
}

pub(crate) async fn get(admin: SocketAddr, path: &str) -> Value {
    admin_support::client()
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .expect("the management API answers")
        .json()
        .await
        .expect("JSON")
}

pub(crate) async fn text(admin: SocketAddr, path: &str) -> String {
    admin_support::client()
        .get(format!("http://{admin}{path}"))
        .send()
        .await
        .expect("the management API answers")
        .text()
        .await
        .expect("a body")
}

/// Sends `count` completions for `model` in the background; their outcome does not matter.
fn load(http: SocketAddr, model: &str, count: usize) {
    for i in 0..count {
        let body = json!({"model": model, "prompt": format!("w{i} x y z"), "max_tokens": 4});
        tokio::spawn(async move {
            let _ = admin_support::client()
                .post(format!("http://{http}/v1/completions"))
                .json(&body)
                .send()
                .await;
        });
    }
}

fn runs_of(list: &Value) -> Vec<Value> {
    list["runs"].as_array().cloned().unwrap_or_default()
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_mid_load_the_journal_opens_with_finished_runs_and_no_false_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), CONFIG);
    let mut edge = start_edge(&config).await;
    let node = MockNode::start(edge.node, MockOptions::new("token-a"))
        .await
        .expect("the mock node registers");
    load(edge.http, "echo/hang", 5);
    load(edge.http, "echo/default", 40);
    let admin = edge.admin;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let (finished, open) = loop {
        let finished = runs_of(&get(admin, "/admin/v1/runs?state=finished&limit=1000").await);
        let open = runs_of(&get(admin, "/admin/v1/runs?state=open&limit=1000").await);
        if finished.len() >= 20 && open.len() >= 5 {
            break (finished, open);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "load did not progress"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // More load in flight while the edge dies.
    load(edge.http, "echo/default", 100);
    edge.child.start_kill().expect("kill -9");
    common::bounded("the edge process to exit after kill -9", edge.child.wait())
        .await
        .expect("the edge is gone");
    node.kill();

    let journal = dir.path().join("journal.sqlite3");
    let conn = rusqlite::Connection::open(&journal).expect("the journal opens");
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .expect("integrity_check runs");
    assert_eq!(check, "ok");
    drop(conn);

    let edge = start_edge(&config).await;
    // Runs taken back for their node (gone for good here) end when the grace expires.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !runs_of(&get(edge.admin, "/admin/v1/runs?state=open").await).is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "runs stay open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for run in &finished {
        let id = run["id"].as_str().expect("an id");
        let record = get(edge.admin, &format!("/admin/v1/runs/{id}")).await;
        assert_eq!(record["outcome"], "completed", "{record}");
    }
    for run in &open {
        let id = run["id"].as_str().expect("an id");
        let record = get(edge.admin, &format!("/admin/v1/runs/{id}")).await;
        if run["target"] == "hang" {
            assert_eq!(record["outcome"], "unknown", "{record}");
            assert_eq!(record["code"], "edge_crashed", "{record}");
        }
    }
    // Whatever the journal holds as completed has its whole event stream, ending in it.
    let all = runs_of(&get(edge.admin, "/admin/v1/runs?limit=1000").await);
    assert!(all.len() >= finished.len() + open.len());
    for run in all.iter().filter(|r| r["outcome"] == "completed") {
        let id = run["id"].as_str().expect("an id");
        let lines = text(
            edge.admin,
            &format!("/admin/v1/runs/{id}/events?format=jsonl"),
        )
        .await;
        let lines: Vec<&str> = lines.lines().collect();
        assert_eq!(Some(lines.len() as u64), run["events"].as_u64(), "{run}");
        assert!(
            lines
                .last()
                .is_some_and(|l| l.contains("\"kind\":\"completed\"")),
            "{lines:?}"
        );
    }
    let unknown: Vec<&Value> = all.iter().filter(|r| r["outcome"] == "unknown").collect();
    assert!(unknown.len() >= 5, "the hanging runs at least: {all:?}");
    assert!(
        unknown.iter().all(|r| r["code"] == "edge_crashed"),
        "{unknown:?}"
    );
    let still_open = runs_of(&get(edge.admin, "/admin/v1/runs?state=open").await);
    assert!(still_open.is_empty(), "{still_open:?}");
    drop(edge);
}

#[crate::common::test]
async fn edge_serve_keeps_its_journal_in_the_data_directory_and_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), CONFIG);
    let data = dir.path().join("state");
    let mut child = edge_serve(&config)
        .env_remove("EDGE__JOURNAL__PATH")
        .arg("--data-dir")
        .arg(&data)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn the edge binary");
    let (logs, bound) = watch_stderr(child.stderr.take().expect("piped stderr"));
    tokio::time::timeout(PATIENCE, bound)
        .await
        .expect("the edge serves in time")
        .expect("the serving line");
    let file = data.join("journal.sqlite3");
    let named = format!("\"journal\":\"{}\"", file.display());
    eventually("the serving line names the journal", || {
        logged(&logs)
            .iter()
            .any(|line| line.contains("edge is serving") && line.contains(&named))
    })
    .await;
    assert!(file.exists(), "{}", file.display());
    assert!(
        !dir.path().join("data").exists(),
        "nothing is created in the working directory"
    );
    common::bounded("the edge process to exit after SIGKILL", child.kill())
        .await
        .expect("kill the edge");
}
