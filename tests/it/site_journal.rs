//! The journal of record is replicated (issue 49): two members of one site on a real
//! `nats-server` with JetStream, the reference node in front of a scripted engine knowing
//! both. A streamed run starts on the active member (a real `edge serve`); the standby
//! folds its batches from the site's stream as they come; mid-answer the active member is
//! killed with SIGKILL and its data directory deleted. The standby catches up, takes the
//! open run over as a restarted edge does, the node moves to it and resumes, and the run
//! completes there once: every delta once and in order, one request to the engine, its
//! usage counted; the client resumes its stream on the survivor with `Last-Event-ID` and
//! gets the rest once; a member started afterwards with an empty data directory folds the
//! same record from the stream. A member whose lease another writes lets its open run go
//! and ends nothing. The stream has one writer (decision 50): once another member claimed
//! it, a fenced member's batch is refused by the stream, the member stands down, and no
//! member folds the batch; a retried append is answered as a duplicate, not refused. A
//! taken-over run keeps its key's budget reservation and concurrency place; the members
//! count what they publish and fold (`edge_cluster_journal_*`, read by the Prometheus parser).

use crate::admin_crash::{Edge, completed_record, get, start_edge_with, text};
use crate::cluster::standing_by_behind;
use crate::common;
use crate::metrics::{scrape_until, want};
use crate::mock_node::{MockNode, MockOptions};
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;
use crate::node_support::relay::Relay;
use crate::readopt::{assert_every_delta_once, delta, engine_with_deltas_behind};
use crate::resume::open_stream_at;
use crate::site_support::ready;
use crate::stream_resume::{Event, read_until, resume, text_of};

use std::net::SocketAddr;
use std::sync::Arc;

use edge::client::{NodeClient, ReceivedEdgeFrame, RegisterOutcome, Registration};
use edge::domain::{RegisterRejection, ResumeClaim, ResumeRefusal, RunEventKind};
use edge::ports::NodeCommand;

use common::engines::NatsServer;
use common::{
    NodeTable, TestApp, edge_serve_on, eventually, eventually_ok, spawn_app, write_config,
};
use edge::ports::Role;
use node_support::upstream::ScriptedEngine;
use node_support::{edge_config, spawn_node};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// Deltas in the answer, and how many are let out before the kill.
const DELTAS: usize = 16;
const BEFORE_THE_KILL: usize = 6;

/// Member `id`'s config on `nats`: the engine's node, a long resume grace, a short lease.
pub(crate) fn member(nats: &NatsServer, engine: &ScriptedEngine, id: &str) -> String {
    format!(
        "[edge]\nid = {id:?}\n[events]\nsinks = [\"null\"]\n[runs]\nresume_grace_ms = 30000\n{}{}",
        crate::site_support::cluster_section(nats),
        edge_config(&engine.base_url(), &["qwen"], 500)
    )
}

/// The run's stored events at the management API `admin`, as JSON lines.
pub(crate) async fn stored_events(admin: SocketAddr, run_id: &str) -> Vec<Value> {
    let path = format!("/admin/v1/runs/{run_id}/events?format=jsonl&follow=false");
    text(admin, &path)
        .await
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

pub(crate) async fn outputs(admin: SocketAddr, run_id: &str) -> usize {
    stored_events(admin, run_id)
        .await
        .iter()
        .filter(|e| e["kind"] == "output")
        .count()
}

/// The active member, a real process, with its data directory, once it acts (ready): a
/// member started after it then stands by behind it, never racing it for the lease.
pub(crate) async fn active_member(config: &str) -> (Edge, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(dir.path(), config);
    let listen = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .to_string();
    let edge = start_edge_with(edge_serve_on(&path, &listen)).await;
    ready(edge.http).await;
    (edge, dir)
}

/// A member, a real process, with its data directory, once it stands by (behind an active
/// member already acting).
pub(crate) async fn standby_member(config: &str) -> (Edge, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(dir.path(), config);
    let listen = crate::site_support::free_address().to_string();
    let edge = start_edge_with(edge_serve_on(&path, &listen)).await;
    crate::site_support::standing_by(edge.http).await;
    (edge, dir)
}

/// Member `edge`'s machine is gone: SIGKILLed, its data directory `dir` deleted.
pub(crate) async fn machine_gone(edge: &mut Edge, dir: tempfile::TempDir) {
    edge.child.start_kill().expect("kill -9");
    common::bounded("the killed member to exit", edge.child.wait())
        .await
        .expect("the member is gone");
    drop(dir);
}

pub(crate) async fn acts(app: &TestApp) {
    let site = app.parts.site.clone();
    eventually("the standby takes over", || {
        matches!(site.current(), Role::Active { .. })
    })
    .await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_takes_a_killed_members_open_run_over_from_the_stream_and_completes_it_once() {
    let nats = NatsServer::start_jetstream().await;
    let gate = Arc::new(Semaphore::new(0));
    let engine = engine_with_deltas_behind(DELTAS, &gate).await;
    let (mut a, a_dir) = active_member(&member(&nats, &engine, "edge-a")).await;
    let b = spawn_app(&member(&nats, &engine, "edge-b")).await;
    standing_by_behind(&b, "edge-a").await;

    // The node knows both members; it registers on the active one.
    let node = spawn_node(a.node, "token-1", |options| {
        options.edge = format!("{},{}", a.node, b.node_addr);
    });
    gate.add_permits(BEFORE_THE_KILL);
    let body = json!({
        "model": "llama/qwen",
        "stream": true,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    });
    let (response, run_id) = open_stream_at(a.http, "/v1/chat/completions", &body).await;
    let before: String = (0..BEFORE_THE_KILL).map(delta).collect();
    let first = read_until(response, move |events| text_of(events) == before).await;

    // The standby folds the stream as it goes: its own journal holds the first deltas.
    eventually_ok("the standby's journal holds the first deltas", || async {
        let n = outputs(b.admin_addr, &run_id).await;
        if n >= BEFORE_THE_KILL { Ok(()) } else { Err(n) }
    })
    .await;

    // The active member's machine is gone: SIGKILL, and its data directory deleted.
    machine_gone(&mut a, a_dir).await;
    gate.add_permits(DELTAS - BEFORE_THE_KILL + 2);

    // The standby takes over, the node moves to it, and the run completes there once.
    acts(&b).await;
    b.wait_for_nodes(1).await;
    let record = completed_record(b.admin_addr, &run_id, "the run completes on the survivor").await;
    let stored = stored_events(b.admin_addr, &run_id).await;
    assert_every_delta_once(&record, &stored, DELTAS);
    let chats = engine
        .seen()
        .iter()
        .filter(|seen| seen.path.ends_with("/chat/completions"))
        .count();
    assert_eq!(chats, 1, "taken over, not run again");

    // The client resumes its stream on the survivor after the last event it read: the rest
    // once, and the two parts are the run's whole stream.
    let last = first.last().map(|e| e.id.as_str());
    let rest = resume(b.http_addr, &run_id, last).await;
    let joined: Vec<Event> = first.into_iter().chain(rest).collect();
    let expected: String = (0..DELTAS).map(delta).collect();
    assert_eq!(text_of(&joined), expected, "every delta once, in order");
    assert_eq!(joined, resume(b.http_addr, &run_id, None).await);

    // Its usage is counted once, on the survivor.
    let usage = get(b.admin_addr, "/admin/v1/usage?group_by=model").await;
    assert_eq!(usage["totals"]["runs"], 1, "{usage}");
    if let Some(output) = record["usage"]["output_tokens"].as_u64() {
        assert_eq!(usage["totals"]["output_tokens"], output, "{usage}");
    }
    // A member started later with an empty data directory folds the whole stream — the dead
    // member's batches and the survivor's — into the same record.
    let c = spawn_app(&member(&nats, &engine, "edge-c")).await;
    let late = completed_record(
        c.admin_addr,
        &run_id,
        "the late member has folded the run's end",
    )
    .await;
    assert_eq!(late, record);
    assert_eq!(stored_events(c.admin_addr, &run_id).await, stored);
    c.stop().await;
    common::bounded("the node to stop", node.stop())
        .await
        .expect("clean stop");
    b.stop().await;
}

/// Reads `response`'s body to its end: what came, and whether the connection was broken off
/// rather than ended.
async fn read_to_the_end(mut response: reqwest::Response) -> (String, bool) {
    let mut text = String::new();
    loop {
        match common::bounded("the stream's next chunk", response.chunk()).await {
            Ok(Some(bytes)) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) => return (text, false),
            Err(_) => return (text, true),
        }
    }
}

/// Starts a resumable streamed `echo/stall` run on `a` and waits until it relayed output.
async fn stalled_run(a: &TestApp) -> (reqwest::Response, String) {
    let body = json!({
        "model": "echo/stall",
        "stream": true,
        "messages": [{"role": "user", "content": "one two three"}],
    });
    let (response, run_id) = open_stream_at(a.http_addr, "/v1/chat/completions", &body).await;
    eventually_ok("the run has relayed output", || async {
        let n = outputs(a.admin_addr, &run_id).await;
        if n >= 1 { Ok(()) } else { Err(n) }
    })
    .await;
    (response, run_id)
}

/// A member that loses its lease lets its open runs go and ends none of them. Its callers'
/// resumable streams — the one that started the run, and one resumed after a cut — are
/// broken off, not ended: an error event would tell the client its run failed while the
/// member that acts now completes it (found by the nemesis, seed 66, issue 66).
#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_loses_its_lease_lets_its_open_run_go_and_ends_nothing() {
    let nats = NatsServer::start_jetstream().await;
    let node = NodeTable::new("node-a", "gpu-a", "token-a").echo(&["stall", "hang"]);
    let config = format!(
        "[edge]\nid = \"edge-a\"\n[events]\nsinks = [\"null\"]\n[cluster]\nsite = \"s1\"\n\
         nats = {:?}\nlease_ms = 300\nrenew_ms = 100\n{node}",
        nats.url()
    );
    let a = spawn_app(&config).await;
    acts(&a).await;
    let _node = MockNode::start(a.node_addr, MockOptions::new("token-a"))
        .await
        .expect("the mock node");
    a.wait_for_nodes(1).await;
    let (response, run_id) = stalled_run(&a).await;
    // The second run's caller was cut and resumed its stream.
    let (cut, resumed_id) = stalled_run(&a).await;
    drop(cut);
    let resumed = common::http_client()
        .get(format!(
            "http://{}/v1/runs/{resumed_id}/stream",
            a.http_addr
        ))
        .header("last-event-id", "0")
        .send()
        .await
        .expect("the resumed stream");
    assert_eq!(resumed.status(), 200);
    // A third run has had no output yet: its caller has had no answer.
    let silent = tokio::spawn(
        common::http_client()
            .post(format!("http://{}/v1/chat/completions", a.http_addr))
            .json(&json!({
                "model": "echo/hang", "stream": true,
                "messages": [{"role": "user", "content": "one"}],
            }))
            .send(),
    );
    let runs = a.parts.runs.clone();
    eventually("the third run is open", || runs.open_runs() == 3).await;

    // Another member writes the lease (it took over one it thought lapsed): this one's next
    // renewal fails, it stands by and lets its open runs go.
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let kv = async_nats::jetstream::new(client)
        .get_key_value("edge-s1")
        .await
        .expect("the site's bucket");
    let lease = json!({
        "edge_id": "edge-z", "node_address": "10.9.9.9:7100", "api_address": "10.9.9.9:8080",
        "expires_at_ms": u64::MAX / 2, "node_definitions_digest": "sha256:whatever",
    });
    kv.put("lease", lease.to_string().into())
        .await
        .expect("write the lease");
    let runs = a.parts.runs.clone();
    eventually("the open runs are let go", || runs.open_runs() == 0).await;

    // The callers' streams are broken off, to be resumed where the runs act now; no ending
    // is relayed or journaled here (the member that acts now completes the runs).
    for (response, id) in [(response, &run_id), (resumed, &resumed_id)] {
        let (text, broken) = read_to_the_end(response).await;
        assert!(broken, "{id}'s stream is broken off, not ended: {text}");
        assert!(
            !text.contains("[DONE]") && !text.contains("error"),
            "{id}: {text}"
        );
    }
    // The caller with no answer yet gets a `503` to retry through the site's balancer,
    // not an internal error (the nemesis, seed 66).
    let silent = common::bounded("the third caller's answer", silent)
        .await
        .expect("the request task")
        .expect("an answer");
    assert_eq!(silent.status(), 503);
    let error: Value = silent.json().await.expect("a JSON error");
    assert_eq!(error["error"]["code"], "standby", "{error}");
    a.parts.journal.flush().await;
    for id in [&run_id, &resumed_id] {
        let record = get(a.admin_addr, &format!("/admin/v1/runs/{id}")).await;
        assert_eq!(record["outcome"], "open", "{record}");
        let stored = stored_events(a.admin_addr, id).await;
        let ends = ["completed", "failed", "cancelled"];
        assert!(
            stored
                .iter()
                .all(|e| !ends.contains(&e["kind"].as_str().unwrap_or_default())),
            "{stored:?}"
        );
    }
    a.stop().await;
}

/// The fourth 30-minute nemesis (seed 6601, on nats-server 2.12.8): a member cut from NATS
/// stood down while its publisher retried a batch; it gave that batch up (kept it local) but
/// appended the batches queued behind it once NATS answered again, so the stream held its
/// batches with one missing in between — runs whose events there were never resumed to their
/// end, and one resume answered `internal_error`. Here the stream refuses one batch (over
/// its size limit) until the member stands down: the batches behind it stay local too, and
/// the stream holds the member's batches without a hole.
#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_gave_up_on_a_batch_appends_none_after_it() {
    let nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&echo_member(&nats, "edge-a")).await;
    acts(&a).await;
    let _node = MockNode::start(a.node_addr, MockOptions::new("token-a"))
        .await
        .expect("the mock node");
    a.wait_for_nodes(1).await;
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let mut stream = journal_stream(&nats).await;
    let mut config = stream
        .info()
        .await
        .expect("the stream's info")
        .config
        .clone();
    config.max_message_size = 4096;
    js.update_stream(&config)
        .await
        .expect("limit the stream's messages");

    let echo = |content: String| {
        let http = a.http_addr;
        tokio::spawn(async move {
            let body = json!({
                "model": "echo/echo", "stream": true,
                "messages": [{"role": "user", "content": content}],
            });
            open_stream_at(http, "/v1/chat/completions", &body).await
        })
    };
    // A run whose output makes a batch the stream refuses: the publisher tries it again and
    // again; a short run's batches queue behind it.
    let _big = echo("x".repeat(16_000));
    let metrics = common::http_client();
    let at_least = |name: &'static str, n: f64| {
        let (metrics, a) = (&metrics, &a);
        async move {
            eventually_ok(name, || async move {
                let have = crate::metrics::scrape(metrics, a).await.get(name, &[]);
                if have.is_some_and(|v| v >= n) {
                    Ok(())
                } else {
                    Err(format!("{have:?}"))
                }
            })
            .await;
        }
    };
    at_least("edge_cluster_journal_publish_failures_total", 1.0).await;
    let published = last_sequence(&nats).await;
    let (_small, small_id) = echo("one two".to_owned()).await.expect("the short run");
    // Ended, it left the open runs after handing its end to the journal (a read of its
    // record would wait for the stream); two more failed appends leave the journal's writer
    // ample time to hand that batch to the publisher.
    eventually_ok("the short run has ended", || async {
        let open = open_ids(a.admin_addr).await;
        if open.contains(&small_id) {
            Err(format!("{open:?}"))
        } else {
            Ok(())
        }
    })
    .await;
    let failures = crate::metrics::scrape(&metrics, &a)
        .await
        .get("edge_cluster_journal_publish_failures_total", &[])
        .unwrap_or(0.0);
    at_least(
        "edge_cluster_journal_publish_failures_total",
        failures + 2.0,
    )
    .await;

    // Another member writes the lease: this one stands down, gives up the refused batch,
    // and must keep every batch behind it local as well.
    let kv = js
        .get_key_value("edge-s1")
        .await
        .expect("the site's bucket");
    let lease = json!({
        "edge_id": "edge-z", "node_address": "10.9.9.9:7100", "api_address": "10.9.9.9:8080",
        "expires_at_ms": u64::MAX / 2, "node_definitions_digest": "sha256:whatever",
    });
    kv.put("lease", lease.to_string().into())
        .await
        .expect("write the lease");
    at_least("edge_cluster_journal_kept_local_total", 2.0).await;
    assert_eq!(
        last_sequence(&nats).await,
        published,
        "nothing appended after the batch given up"
    );
    a.stop().await;
}

/// Registers a node with `token-a` on `app`, claiming `claims`: the answer.
async fn register_claiming(app: &TestApp, claims: Vec<ResumeClaim>) -> RegisterOutcome {
    common::bounded("the edge to answer a registration", async {
        let mut client = NodeClient::connect(app.node_addr).await.expect("connect");
        let mut registration = Registration::with_token("token-a").instance("i-1");
        registration.resume = claims;
        client.register(registration).await.expect("an answer")
    })
    .await
}

/// While a member's site stream does not answer, what only its own file holds is shown to
/// nobody who would forget it: a run's end reaches its caller only once the stream keeps it
/// (shown earlier, the member taking over would never hear of a run its client saw
/// complete), and a node that comes back claiming its runs is refused (`SHUTTING_DOWN`,
/// retried later) — answering the claim of a run that ended here (`unknown_run`) would let
/// the node forget a run whose end only this member's file holds. Once the stream takes the
/// batches again, the end is shown and the claim answered (both found by the nemesis, seed
/// 6601, issue 66).
#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_end_and_a_nodes_claims_wait_until_the_sites_stream_keeps_them() {
    let mut nats = NatsServer::start_jetstream().await;
    let node = NodeTable::new("node-a", "gpu-a", "token-a").echo(&["default"]);
    // A lease long enough that the member acts on while its stream does not answer; a
    // renewal short enough that a publish lost with the server (each waits `renew_ms` for
    // its answer) is asked again well within the test's patience once the server is back.
    let config = format!(
        "[edge]\nid = \"edge-a\"\n[events]\nsinks = [\"null\"]\n[runs]\nresume_grace_ms = 30000\n\
         [cluster]\nsite = \"s1\"\nnats = {:?}\nlease_ms = 60000\nrenew_ms = 3000\n{node}",
        nats.url()
    );
    let a = spawn_app(&config).await;
    acts(&a).await;
    let mut client = NodeClient::connect(a.node_addr).await.expect("connect");
    let registration = Registration::with_token("token-a").instance("i-1");
    assert!(
        client
            .register(registration)
            .await
            .expect("an answer")
            .accepted
    );
    let mut handle = common::runs::start(&a, common::runs::echo_run("hello"));
    let run_id = handle.run_id.clone();
    let frame = common::bounded("the run to reach the node", client.next())
        .await
        .expect("a frame");
    assert!(
        matches!(&frame, ReceivedEdgeFrame::Command(NodeCommand::Run(r)) if r.run_id == run_id),
        "{frame:?}"
    );

    // The stream stops answering; the run ends here, its end in this member's file only.
    nats.stop().await;
    let completed = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    };
    client
        .event(run_id.as_str(), 1, completed)
        .await
        .expect("the event is written");
    let early = tokio::time::timeout(std::time::Duration::from_secs(1), handle.events.recv()).await;
    assert!(
        early.is_err(),
        "the end is shown before it is kept: {early:?}"
    );
    drop(client);

    let claim = ResumeClaim {
        run_id: run_id.as_str().to_owned(),
        next_seq: 2,
        first_buffered_seq: 1,
    };
    let refused = register_claiming(&a, vec![claim.clone()]).await;
    assert!(!refused.accepted, "answered before its run's end is kept");
    assert_eq!(refused.rejection, Some(RegisterRejection::ShuttingDown));

    nats.restart().await;
    let events = common::runs::rest(&mut handle).await;
    assert!(
        events.last().is_some_and(|e| e.kind.is_terminal()),
        "the end is shown once kept: {events:?}"
    );
    let answered = eventually_ok(
        "the claim is answered once the stream keeps the run",
        || {
            let claim = claim.clone();
            let a = &a;
            async move {
                let outcome = register_claiming(a, vec![claim]).await;
                if outcome.accepted {
                    Ok(outcome)
                } else {
                    Err(outcome.message)
                }
            }
        },
    )
    .await;
    assert_eq!(answered.resumed.len(), 1);
    assert_eq!(answered.resumed[0].outcome, Err(ResumeRefusal::UnknownRun));
    let stored = stored_events(a.admin_addr, run_id.as_str()).await;
    assert!(
        stored.iter().any(|e| e["kind"] == "completed"),
        "{stored:?}"
    );
    a.stop().await;
}

/// The site's journal stream, as a client of `nats` sees it.
pub(crate) async fn journal_stream(nats: &NatsServer) -> async_nats::jetstream::stream::Stream {
    let client = async_nats::connect(nats.url()).await.expect("connect");
    async_nats::jetstream::new(client)
        .get_stream("edge-s1-journal")
        .await
        .expect("the site's journal stream")
}

/// Appends `payload` as `id` under `epoch` (by `edge-z`), expecting the stream to end at
/// `last`; the stream's answer.
pub(crate) async fn append(
    nats: &NatsServer,
    id: &str,
    epoch: u64,
    last: u64,
) -> Result<async_nats::jetstream::publish::PublishAck, async_nats::jetstream::context::PublishError>
{
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = async_nats::jetstream::new(client);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Edge-Id", "edge-z");
    headers.insert("Edge-Epoch", epoch.to_string().as_str());
    // An empty batch: the replicated form's version byte and no entry.
    let message = async_nats::jetstream::message::PublishMessage::build()
        .payload(vec![1u8].into())
        .headers(headers)
        .message_id(id)
        .expected_last_sequence(last);
    js.send_publish("edge.s1.journal", message)
        .await
        .expect("sent")
        .await
}

/// The stream's last sequence now.
pub(crate) async fn last_sequence(nats: &NatsServer) -> u64 {
    let mut stream = journal_stream(nats).await;
    stream
        .info()
        .await
        .expect("the stream's info")
        .state
        .last_sequence
}

/// One member of site `s1` on `nats` with a mock node's definitions (`echo/echo`,
/// `echo/stall`).
fn echo_member(nats: &NatsServer, id: &str) -> String {
    let node = NodeTable::new("node-a", "gpu-a", "token-a").echo(&["echo", "stall"]);
    format!(
        "[edge]\nid = {id:?}\n[events]\nsinks = [\"null\"]\n[cluster]\nsite = \"s1\"\n\
         nats = {:?}\nlease_ms = 300\nrenew_ms = 100\n{node}",
        nats.url()
    )
}

#[crate::common::test]
async fn the_stream_answers_a_retried_append_with_its_sequence_and_refuses_a_stale_one() {
    // What the publisher relies on (decision 50), on the real server: a retry after a lost
    // answer carries the same id and the same expected sequence, and is answered as the
    // duplicate it is, not refused; an append expecting a sequence the stream has moved
    // past is refused.
    let nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&echo_member(&nats, "edge-a")).await;
    acts(&a).await;
    let epoch = a.parts.site.epoch() + 1;
    a.stop().await;
    let last = last_sequence(&nats).await;
    let first = append(&nats, "edge-z-1", epoch, last)
        .await
        .expect("appended");
    assert_eq!(first.sequence, last + 1);
    let again = append(&nats, "edge-z-1", epoch, last)
        .await
        .expect("a duplicate");
    assert!(again.duplicate);
    assert_eq!(again.sequence, first.sequence);
    let stale = append(&nats, "edge-z-2", epoch, last).await;
    let error = stale.expect_err("refused");
    assert_eq!(
        error.kind(),
        async_nats::jetstream::context::PublishErrorKind::WrongLastSequence
    );
    assert_eq!(last_sequence(&nats).await, first.sequence);
}

/// `edge-a` acting on `nats` with a mock node, `edge-c` standing by behind it, and one
/// streamed echo run completed on `edge-a` and folded by `edge-c`: both members, the node and
/// the run's id.
pub(crate) async fn active_standby_and_a_folded_run(
    nats: &NatsServer,
) -> (TestApp, TestApp, MockNode, String) {
    let a = spawn_app(&echo_member(nats, "edge-a")).await;
    acts(&a).await;
    let c = spawn_app(&echo_member(nats, "edge-c")).await;
    standing_by_behind(&c, "edge-a").await;
    let node = MockNode::start(a.node_addr, MockOptions::new("token-a"))
        .await
        .expect("the mock node");
    a.wait_for_nodes(1).await;
    let run_id = echo_run_folded(&a, &c, "the standby folds the run").await;
    (a, c, node, run_id)
}

/// Runs one streamed echo chat to its end on `active` and waits until `standby` has folded
/// it (`what` names the wait); the run's id.
async fn echo_run_folded(active: &TestApp, standby: &TestApp, what: &str) -> String {
    let echo = json!({"model": "echo/echo", "stream": true,
        "messages": [{"role": "user", "content": "one two three"}]});
    let (response, run_id) = open_stream_at(active.http_addr, "/v1/chat/completions", &echo).await;
    response.text().await.expect("the whole answer");
    completed_record(standby.admin_addr, &run_id, what).await;
    run_id
}

/// Fences `a` (acting on `nats`): another member claims the stream under a newer epoch (as
/// a member that acquired the lease does), at the sequence the stream ends at; `a` still
/// acts (its lease is its own) and admits a run, whose batch the stream refuses, so `a`
/// stops acting under that epoch (whether the caller hears of the run first is a race) and
/// the run stays in its file only. Returns the claim's sequence, the run's id and `a`'s
/// record of it.
pub(crate) async fn fenced_with_a_run(nats: &NatsServer, a: &TestApp) -> (u64, String, Value) {
    let epoch = a.parts.site.epoch();
    let claimed = eventually_ok("the claim is appended", || async {
        let last = last_sequence(nats).await;
        append(nats, "edge-z-claim", epoch + 1, last)
            .await
            .map(|ack| ack.sequence)
    })
    .await;
    let stall = json!({"model": "echo/stall", "stream": true,
        "messages": [{"role": "user", "content": "four five six"}]});
    let caller = common::http_client()
        .post(format!("http://{}/v1/chat/completions", a.http_addr))
        .json(&stall)
        .send()
        .await
        .expect("edge-a answers");
    let run = caller.headers()["x-edge-run-id"]
        .to_str()
        .expect("a run id")
        .to_owned();
    let a_site = a.parts.site.clone();
    eventually("edge-a stops acting under its epoch", || {
        a_site.epoch() != epoch
    })
    .await;
    let local = get(a.admin_addr, &format!("/admin/v1/runs/{run}")).await;
    assert_eq!(local["id"], run.as_str(), "written locally: {local}");
    (claimed, run, local)
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_members_batch_is_refused_by_the_stream_and_folded_by_no_member() {
    let nats = NatsServer::start_jetstream().await;
    // A run before the fence: in the stream, so every member has it.
    let (a, c, _node, before) = active_standby_and_a_folded_run(&nats).await;
    let epoch = a.parts.site.epoch();

    let (claimed, after, local) = fenced_with_a_run(&nats, &a).await;
    // Open, or — when the refusal came before the run was placed, so the stand-down did not
    // let it go — failed as its node was sent away: either way in edge-a's file only.
    assert_ne!(local["outcome"], "completed", "{local}");
    let client = common::http_client();
    scrape_until(
        &client,
        &a,
        &[want("edge_cluster_journal_refused_total", &[], 1.0)],
    )
    .await;
    a.stop().await;

    // Nothing of edge-a's epoch is in the stream after the claim.
    let stream = journal_stream(&nats).await;
    for seq in claimed + 1..=last_sequence(&nats).await {
        let message = stream.get_raw_message(seq).await.expect("a message");
        let epoch_of = message
            .headers
            .get("Edge-Epoch")
            .map(|v| v.as_str().to_owned());
        assert_ne!(
            epoch_of,
            Some(epoch.to_string()),
            "seq {seq} was written by the fenced member"
        );
    }
    // edge-c takes over once edge-a's lease lapses: it has folded the whole stream, the
    // run before the fence and not the refused one.
    acts(&c).await;
    let record = get(c.admin_addr, &format!("/admin/v1/runs/{before}")).await;
    assert_eq!(record["outcome"], "completed", "{record}");
    let refused = get(c.admin_addr, &format!("/admin/v1/runs/{after}")).await;
    assert!(
        refused.get("outcome").is_none(),
        "folded by edge-c: {refused}"
    );
    c.stop().await;
}

/// Member `id` of site `s1` on `nats` whose keys are limited: `metered` may spend 100
/// tokens a day, `single` may have one run open, `paced` may start one run a minute; `load`
/// is free. Its node serves
/// `echo/default` and `echo/stall` (its words, then it waits for a cancel).
fn limited_member(nats: &NatsServer, id: &str) -> String {
    let node = NodeTable::new("node-a", "gpu-a", "token-a").echo(&["default", "stall"]);
    format!(
        "[edge]\nid = {id:?}\n[events]\nsinks = [\"null\"]\n[runs]\nresume_grace_ms = 30000\n\
         [[api.keys]]\nkey = \"sk-metered\"\nname = \"metered\"\nbudget_tokens_per_day = 100\n\
         [[api.keys]]\nkey = \"sk-single\"\nname = \"single\"\nmax_concurrent_runs = 1\n\
         [[api.keys]]\nkey = \"sk-paced\"\nname = \"paced\"\nrequests_per_minute = 1\n\
         [[api.keys]]\nkey = \"sk-load\"\nname = \"load\"\n\
         [cluster]\nsite = \"s1\"\nnats = {:?}\nlease_ms = 300\nrenew_ms = 100\n{node}",
        nats.url()
    )
}

/// A completion of `model` as `key` at `http` reserving `max_tokens`: its status and the
/// error code, if any.
async fn complete_as(http: SocketAddr, key: &str, model: &str, max_tokens: u64) -> (u16, Value) {
    let body = json!({"model": model, "prompt": "a b c d", "max_tokens": max_tokens});
    let response = common::http_client()
        .post(format!("http://{http}/v1/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap_or_default();
    (status, body["error"]["code"].clone())
}

/// The ids of the runs open at the management API `admin`.
async fn open_ids(admin: SocketAddr) -> Vec<String> {
    let list = get(admin, "/admin/v1/runs?state=open").await;
    let runs = list["runs"].as_array().cloned().unwrap_or_default();
    runs.iter()
        .filter_map(|run| run["id"].as_str().map(str::to_owned))
        .collect()
}

/// Whether the journal at the management API `admin` holds run `id` as open.
async fn held_open(admin: SocketAddr, id: &str) -> bool {
    get(admin, &format!("/admin/v1/runs/{id}")).await["outcome"] == "open"
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_run_keeps_its_keys_budget_reservation_concurrency_place_and_rate() {
    let nats = NatsServer::start_jetstream().await;
    let (mut a, a_dir) = active_member(&limited_member(&nats, "edge-a")).await;
    let b = spawn_app(&limited_member(&nats, "edge-b")).await;
    standing_by_behind(&b, "edge-a").await;
    let node = MockNode::start(a.node, MockOptions::new("token-a"))
        .await
        .expect("the mock node");
    eventually_ok("edge-a serves", || async {
        match complete_as(a.http, "sk-load", "echo/default", 4).await {
            (200, _) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;

    // Open at the kill: a run of `metered` reserving its whole budget, one of `single`, one
    // of `paced`.
    for (key, max_tokens) in [("sk-metered", 100), ("sk-single", 4), ("sk-paced", 4)] {
        let body = json!({"model": "echo/stall", "prompt": "a b c d", "max_tokens": max_tokens});
        let request = common::http_client()
            .post(format!("http://{}/v1/completions", a.http))
            .bearer_auth(key)
            .json(&body);
        // Its caller goes with edge-a.
        tokio::spawn(async move { request.send().await.map(|r| r.status()) });
    }
    let ids = eventually_ok("the three runs are open on edge-a", || async {
        match open_ids(a.admin).await {
            ids if ids.len() == 3 => Ok(ids),
            ids => Err(format!("{ids:?}")),
        }
    })
    .await;
    for id in &ids {
        eventually_ok("edge-b's journal holds the run open", || async {
            if held_open(b.admin_addr, id).await {
                Ok(())
            } else {
                Err(id)
            }
        })
        .await;
    }
    let refused = (429, json!("token_budget_exceeded"));
    assert_eq!(
        complete_as(a.http, "sk-metered", "echo/default", 4).await,
        refused
    );
    let busy = (429, json!("concurrency_limit_exceeded"));
    assert_eq!(
        complete_as(a.http, "sk-single", "echo/default", 4).await,
        busy
    );
    let paced = (429, json!("rate_limit_exceeded"));
    assert_eq!(
        complete_as(a.http, "sk-paced", "echo/default", 4).await,
        paced
    );

    // edge-a's machine is gone; edge-b takes the open runs over, and with them what they
    // hold of their keys: the same requests are refused there.
    machine_gone(&mut a, a_dir).await;
    node.kill();
    acts(&b).await;
    assert_eq!(open_ids(b.admin_addr).await.len(), 3, "taken over");
    assert_eq!(
        complete_as(b.http_addr, "sk-metered", "echo/default", 4).await,
        refused
    );
    assert_eq!(
        complete_as(b.http_addr, "sk-single", "echo/default", 4).await,
        busy
    );
    assert_eq!(
        complete_as(b.http_addr, "sk-paced", "echo/default", 4).await,
        paced,
        "the taken-over run's start counts in its key's rate"
    );

    // The node comes back as a new process: it claims neither run, so both end (never
    // completed), and what they held is released — once.
    let _node = MockNode::start(b.node_addr, MockOptions::new("token-a"))
        .await
        .expect("the mock node on edge-b");
    b.wait_for_nodes(1).await;
    eventually("the taken-over runs end", || b.parts.runs.open_runs() == 0).await;
    assert_eq!(
        complete_as(b.http_addr, "sk-metered", "echo/default", 4)
            .await
            .0,
        200
    );
    assert_eq!(
        complete_as(b.http_addr, "sk-single", "echo/default", 4)
            .await
            .0,
        200
    );
    b.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_whose_link_to_nats_went_silent_reconnects_and_folds_on() {
    let nats = NatsServer::start_jetstream().await;
    let a = spawn_app(&echo_member(&nats, "edge-a")).await;
    acts(&a).await;
    // edge-b reaches NATS through a relay that can drop its packets without closing anything.
    let relay = Relay::start(nats.addr()).await;
    let b_config =
        echo_member(&nats, "edge-b").replace(&nats.url(), &format!("nats://{}", relay.addr));
    let b = spawn_app(&b_config).await;
    standing_by_behind(&b, "edge-a").await;
    let _node = MockNode::start(a.node_addr, MockOptions::new("token-a"))
        .await
        .expect("the mock node");
    a.wait_for_nodes(1).await;
    echo_run_folded(&a, &b, "edge-b folds the first run").await;

    // The link goes silent: edge-b's client finds it dead by its pings, connects again (the
    // relay relays new connections) and edge-b folds what was written meanwhile.
    relay.black_hole();
    echo_run_folded(&a, &b, "edge-b folds the run after the silence").await;
    b.stop().await;
    a.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_count_what_they_publish_and_fold_in_prometheus_text() {
    let nats = NatsServer::start_jetstream().await;
    let (a, c, _node, _run_id) = active_standby_and_a_folded_run(&nats).await;

    // Every message in the stream is edge-a's: its claim, then its batches.
    let last = last_sequence(&nats).await;
    let all = last as f64;
    let client = common::http_client();
    let active = scrape_until(
        &client,
        &a,
        &[
            want("edge_cluster_journal_published_total", &[], all),
            want("edge_cluster_journal_refused_total", &[], 0.0),
            want("edge_cluster_journal_kept_local_total", &[], 0.0),
            want("edge_cluster_journal_folded_total", &[], 0.0),
            want(
                "edge_cluster_journal_skipped_total",
                &[("reason", "own")],
                all,
            ),
            want("edge_cluster_journal_folded_sequence", &[], all),
            // The claim is not timed: only the batches.
            want("edge_cluster_journal_ack_seconds_count", &[], all - 1.0),
        ],
    )
    .await;
    assert_eq!(
        active.get(
            "edge_cluster_journal_skipped_total",
            &[("reason", "stale_epoch")]
        ),
        Some(0.0)
    );
    scrape_until(
        &client,
        &c,
        &[
            want("edge_cluster_journal_published_total", &[], 0.0),
            want("edge_cluster_journal_folded_total", &[], all),
            want(
                "edge_cluster_journal_skipped_total",
                &[("reason", "own")],
                0.0,
            ),
            want(
                "edge_cluster_journal_skipped_total",
                &[("reason", "undecodable")],
                0.0,
            ),
            want("edge_cluster_journal_folded_sequence", &[], all),
        ],
    )
    .await;
    c.stop().await;
    a.stop().await;
}
