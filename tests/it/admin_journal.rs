//! The run journal through the management API: event replay equals what the `file` sink
//! wrote and follows a live run to its end; finished runs answer after a restart; with the
//! journal off only open runs are known.

use crate::admin_support;
use crate::common;

use std::path::Path;

use admin_support::{HandNode, admin, echo_run, get_ok, nodes_config, run_until};
use common::runs::{rest, start};
use common::{PATIENCE, TestApp, eventually, spawn_app};
use edge::domain::RunEventKind;
use reqwest::{Method, StatusCode};

fn file_sink(dir: &Path) -> String {
    format!(
        "[events]\nsinks = [\"file\"]\n[events.file]\npath = {:?}\nflush_interval_ms = 10\n",
        dir.join("events.jsonl").display().to_string()
    )
}

/// The `file` sink's lines for `run`.
fn sink_lines(dir: &Path, run: &str) -> Vec<String> {
    std::fs::read_to_string(dir.join("events.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&format!("\"run_id\":\"{run}\"")))
        .map(str::to_owned)
        .collect()
}

/// Reads lines from a streamed answer until `count` have come (or the answer ends).
async fn read_lines(response: &mut reqwest::Response, lines: &mut Vec<String>, count: usize) {
    let mut pending = String::new();
    while lines.len() < count {
        let chunk = tokio::time::timeout(PATIENCE, response.chunk())
            .await
            .expect("a chunk in time")
            .expect("the stream holds");
        let Some(chunk) = chunk else { break };
        pending.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = pending.find('\n') {
            lines.push(pending[..end].to_owned());
            pending.drain(..=end);
        }
    }
}

#[crate::common::test]
async fn event_replay_equals_the_sink_and_follows_a_live_run_to_its_terminal_event() {
    let sink_dir = tempfile::tempdir().expect("tempdir");
    let app = spawn_app(&nodes_config(&file_sink(sink_dir.path()))).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut handle = start(&app, echo_run("live"));
    let run = node.next_run().await;
    node.send(&run.run_id, RunEventKind::Started).await;
    node.send(&run.run_id, RunEventKind::text("a\nfirst")).await;

    let url = format!(
        "http://{}/admin/v1/runs/{}/events?format=jsonl",
        app.admin_addr, run.run_id
    );
    let mut live = admin_support::client()
        .get(&url)
        .bearer_auth(admin_support::ADMIN_KEY)
        .send()
        .await
        .expect("the feed opens");
    assert_eq!(live.status(), StatusCode::OK);
    let mut lines = Vec::new();
    read_lines(&mut live, &mut lines, 2).await;
    assert_eq!(lines.len(), 2, "the replay: {lines:?}");
    node.send(&run.run_id, RunEventKind::text("second")).await;
    node.send(&run.run_id, admin_support::completed()).await;
    read_lines(&mut live, &mut lines, usize::MAX).await;
    rest(&mut handle).await;
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(lines[3].contains("\"kind\":\"completed\""), "{lines:?}");

    let id = run.run_id.to_string();
    eventually("the sink has written the run", || {
        sink_lines(sink_dir.path(), &id).len() == 4
    })
    .await;
    assert_eq!(
        lines,
        sink_lines(sink_dir.path(), &id),
        "the feed equals the sink"
    );

    // Replayed after the end, as SSE, and from a position on.
    let replay = admin_support::client()
        .get(format!(
            "http://{}/admin/v1/runs/{id}/events",
            app.admin_addr
        ))
        .header("accept", "text/event-stream")
        .bearer_auth(admin_support::ADMIN_KEY)
        .send()
        .await
        .expect("the replay")
        .text()
        .await
        .expect("the body");
    let data: Vec<&str> = replay
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data, lines.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(replay.contains("id: 3\nevent: completed\n"), "{replay}");
    let (status, tail) = admin(
        &app,
        Method::GET,
        &format!("/admin/v1/runs/{id}/events?format=jsonl&after=1"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tail.as_str().map(|t| t.lines().count()), Some(2), "{tail}");
    app.stop().await;
}

/// An edge whose journal lives in `dir` (so a second edge can reopen it).
async fn edge_on_journal(dir: &Path) -> TestApp {
    let journal = format!(
        "[journal]\npath = {:?}\n",
        dir.join("journal.sqlite3").display().to_string()
    );
    spawn_app(&nodes_config(&journal)).await
}

#[crate::common::test]
async fn a_finished_run_answers_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = edge_on_journal(dir.path()).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut handle = start(&app, echo_run("kept"));
    let run = node.next_run().await;
    node.complete(&run.run_id, "kept").await;
    rest(&mut handle).await;
    app.stop().await;

    let app = edge_on_journal(dir.path()).await;
    let path = format!("/admin/v1/runs/{}", run.run_id);
    let record = get_ok(&app, &path).await;
    assert_eq!(record["outcome"], "completed");
    assert_eq!(record["node"], "node-a");
    assert_eq!(
        (record["events"].as_u64(), record["events_stored"].as_u64()),
        (Some(3), Some(3))
    );
    let (_, events) = admin(
        &app,
        Method::GET,
        &format!("{path}/events?format=jsonl"),
        None,
    )
    .await;
    assert_eq!(
        events.as_str().map(|e| e.lines().count()),
        Some(3),
        "{events}"
    );
    let listed = get_ok(&app, "/admin/v1/runs?state=finished").await;
    assert_eq!(listed["runs"][0]["id"], run.run_id.as_str());
    app.stop().await;
}

#[crate::common::test]
async fn with_the_journal_off_only_open_runs_are_known() {
    let app = spawn_app(&nodes_config("[journal]\nenabled = false\n")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut done = start(&app, echo_run("gone"));
    let first = node.next_run().await;
    node.complete(&first.run_id, "gone").await;
    rest(&mut done).await;
    let mut open = start(&app, echo_run("open"));
    let second = node.next_run().await;
    run_until(&app, &second.run_id, "is open", |r| r["outcome"] == "open").await;
    let (status, _) = admin(
        &app,
        Method::GET,
        &format!("/admin/v1/runs/{}", first.run_id),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let listed = get_ok(&app, "/admin/v1/runs").await;
    assert_eq!(listed["runs"].as_array().map(Vec::len), Some(1), "{listed}");
    node.complete(&second.run_id, "open").await;
    rest(&mut open).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_run_its_caller_saw_finish_is_listed_at_once_every_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let app = edge_on_journal(dir.path()).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let mut missing = Vec::new();
    for i in 0..1_000 {
        let mut handle = start(&app, echo_run(&format!("seen-{i}")));
        let run = node.next_run().await;
        node.complete(&run.run_id, "done").await;
        rest(&mut handle).await;
        let listed = get_ok(&app, "/admin/v1/runs?limit=5").await;
        let found = listed["runs"]
            .as_array()
            .is_some_and(|runs| runs.iter().any(|r| r["id"] == run.run_id.as_str()));
        if !found {
            missing.push(i);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of 1,000 just-finished runs were missing from the listing: {missing:?}",
        missing.len()
    );
    app.stop().await;
}
