//! Issue 49 end to end: a site of two members (real `edge serve` processes) on a real
//! `nats-server` with JetStream, the reference node knowing both addresses.
//!
//! Through a load balancer that sends each new connection to the member whose `/readyz` is
//! 200, the official `openai` Python SDK streams a background response from `llama-server`
//! (the tiny model, greedy) and, mid-answer, the active member is killed with SIGKILL and
//! its data directory deleted: the standby becomes ready, the node moves to it, and the
//! SDK's `responses.retrieve(id, stream=True, starting_after=N)` through the same balancer
//! gets the rest — the whole text is the engine's own greedy answer; the survivor lists the
//! run completed after one attempt and counts its usage. A [`Gate`] between the node and its
//! engine holds the answer past the first deltas, so the kill is mid-answer however fast the
//! model is.
//!
//! Fencing under load: with runs streaming (and more queued) through the node, the active
//! member is paused with SIGSTOP past its lease; the standby takes over and the node moves
//! to it. Woken with SIGCONT, the old member turns standby and admits nothing, and no run
//! reaches the engine twice.

use std::collections::HashMap;
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::admin_crash::{completed_record, get};
use crate::common::engines::{LlamaServer, NatsServer};
use crate::common::{self, eventually_ok, http_client};
use crate::continuation_engine::Gate;
use crate::node_support::spawn_node;
use crate::node_support::upstream::ScriptedEngine;
use crate::readopt::{assert_every_delta_once, engine_with_deltas_behind};
use crate::readopt_engine::{SdkStream, assert_the_greedy_answer, edge_config, stored_kinds};
use crate::site_support::{
    Balancer, Member, cluster_section, node_connected, ready, readyz, runs_in, signal, standing_by,
};

/// Text deltas the SDK reads before the active member is killed (the answer has seven).
const BEFORE: usize = 3;

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_through_the_balancer_outlives_the_loss_of_the_active_member() {
    let nats = NatsServer::start_jetstream().await;
    let llama = LlamaServer::start().await;
    let gate = Gate::before(&llama).await;
    let config = format!(
        "{}\n{}",
        edge_config(&format!("http://{}/v1", gate.addr), 30_000),
        cluster_section(&nats)
    );
    let mut a = Member::start("edge-a", &config).await;
    ready(a.http()).await;
    let b = Member::start("edge-b", &config).await;
    standing_by(b.http()).await;
    let balancer = Balancer::start(vec![a.http(), b.http()]).await;
    let node = spawn_node(a.node_addr(), "token-1", |options| {
        options.edge = format!("{},{}", a.node_addr(), b.node_addr());
    });
    node_connected(a.admin(), "node-1").await;

    // Mid-answer through the balancer; the standby has folded what the client read.
    let mut sdk = SdkStream::start(&balancer.v1_url()).await;
    gate.allow(BEFORE);
    let read = sdk.read_deltas(BEFORE).await;
    let run_id = read.run_id().to_owned();
    eventually_ok("the standby's journal holds the first deltas", || async {
        let kinds = stored_kinds(b.admin(), &run_id).await;
        let outputs = kinds.iter().filter(|k| *k == "output").count();
        if outputs >= BEFORE {
            Ok(())
        } else {
            Err(outputs)
        }
    })
    .await;

    // The active member's machine is lost; the engine goes on, the node buffers.
    a.kill(true).await;
    sdk.dropped().await;
    gate.allow(usize::from(u8::MAX));
    ready(b.http()).await;
    node_connected(b.admin(), "node-1").await;
    assert_eq!(
        readyz(b.http()).await.map(|(status, _)| status),
        Some(StatusCode::OK),
        "exactly one member is ready: the survivor"
    );

    // The client resumes through the same balancer and gets the engine's greedy answer.
    let resumed = sdk.resume(&balancer.v1_url()).await;
    assert_the_greedy_answer(&llama, &read, &resumed).await;

    // The survivor lists the run completed, taken over (one attempt), and counts its usage.
    let record = completed_record(b.admin(), &run_id, "the survivor lists the run completed").await;
    let attempts = record["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "taken over, not run again: {record:#}");
    let output_tokens = record["usage"]["output_tokens"].as_u64();
    assert!(output_tokens.is_some_and(|n| n > 0), "{record:#}");
    let usage = get(b.admin(), "/admin/v1/usage").await;
    assert_eq!(usage["totals"]["runs"], 1, "{usage}");
    assert_eq!(
        usage["totals"]["output_tokens"].as_u64(),
        output_tokens,
        "{usage}"
    );
    common::bounded("the node to stop", node.stop())
        .await
        .expect("clean stop");
}

/// Runs in the fencing test, and the node's slots: the rest wait in the member's queue.
const LOADED_RUNS: usize = 4;
const SLOTS: usize = 2;
/// Deltas per answer, and how many each running run has relayed before the pause.
const DELTAS: usize = 12;
const BEFORE_THE_PAUSE: usize = 2;

/// The prompt of run `n` of the fencing test: the engine's requests name their run by it.
fn prompt_of(n: usize) -> String {
    format!("run {n}: tell me a long story")
}

/// How often the engine was asked each prompt.
fn asked(engine: &ScriptedEngine) -> HashMap<String, usize> {
    let mut asked = HashMap::new();
    for seen in engine.seen() {
        if seen.path.ends_with("/chat/completions") {
            let prompt = seen.body["messages"][0]["content"]
                .as_str()
                .unwrap_or_default();
            *asked.entry(prompt.to_owned()).or_default() += 1;
        }
    }
    asked
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_active_member_under_load_wakes_standing_by_and_runs_nothing_twice() {
    let nats = NatsServer::start_jetstream().await;
    let gate = Arc::new(Semaphore::new(0));
    let engine = engine_with_deltas_behind(DELTAS, &gate).await;
    let node_table = crate::node_support::edge_config(&engine.base_url(), &["qwen"], 500).replace(
        "max_concurrent_runs = 8",
        &format!("max_concurrent_runs = {SLOTS}"),
    );
    let config = format!(
        "[runs]\nresume_grace_ms = 30000\n[events]\nsinks = [\"null\"]\n{}{node_table}",
        cluster_section(&nats)
    );
    let a = Member::start("edge-a", &config).await;
    ready(a.http()).await;
    let b = Member::start("edge-b", &config).await;
    standing_by(b.http()).await;
    let node = spawn_node(a.node_addr(), "token-1", |options| {
        options.edge = format!("{},{}", a.node_addr(), b.node_addr());
    });
    node_connected(a.admin(), "node-1").await;

    // Runs streaming through the node on the active member, and runs queued behind them.
    let http = a.http();
    for n in 0..LOADED_RUNS {
        let body = json!({
            "model": "llama/qwen", "stream": true,
            "messages": [{"role": "user", "content": prompt_of(n)}],
        });
        tokio::spawn(async move {
            let response = http_client()
                .post(format!("http://{http}/v1/chat/completions"))
                .header(crate::stream_resume::RESUMABLE, "true")
                .json(&body)
                .send()
                .await;
            if let Ok(mut response) = response {
                while let Ok(Some(_)) = response.chunk().await {}
            }
        });
    }
    // Deltas one at a time until each running run has relayed a few: which stream takes a
    // permit is the gate's choice, so the test counts what came through.
    let admin = a.admin();
    let relayed = || async {
        let open = runs_in(admin, "open").await;
        let running: Vec<(String, u64)> = open
            .iter()
            .filter(|r| !r["node"].is_null())
            .filter_map(|r| Some((r["id"].as_str()?.to_owned(), r["events"].as_u64()?)))
            .collect();
        running
    };
    let mut released = 0;
    let running = loop {
        let running = eventually_ok("the runs relay every delta let out", || async {
            let running = relayed().await;
            let outputs: u64 = running
                .iter()
                .map(|(_, events)| events.saturating_sub(1))
                .sum();
            let asked = asked(&engine).len();
            if running.len() == SLOTS && asked == SLOTS && outputs == released {
                Ok(running)
            } else {
                Err(format!(
                    "{running:?}, {outputs} of {released} out, {asked} asked"
                ))
            }
        })
        .await;
        if running
            .iter()
            .all(|(_, events)| *events > BEFORE_THE_PAUSE as u64)
        {
            break running;
        }
        assert!(released < (SLOTS * DELTAS) as u64 / 2, "{running:?}");
        gate.add_permits(1);
        released += 1;
    };
    let running: Vec<String> = running.into_iter().map(|(id, _)| id).collect();

    // Paused past its lease: the standby takes over, the node moves to it with its runs.
    let pid = a.pid();
    signal(pid, "-STOP");
    ready(b.http()).await;
    node_connected(b.admin(), "node-1").await;

    // Woken: it stands by behind the new active member and admits nothing.
    signal(pid, "-CONT");
    let body = standing_by(a.http()).await;
    assert!(body.starts_with("standby:"), "{body}");
    let refused = http_client()
        .post(format!("http://{}/v1/chat/completions", a.http()))
        .json(&json!({"model": "llama/qwen", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("an answer");
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The runs the node held complete on the new active member, each once.
    gate.add_permits(LOADED_RUNS * (DELTAS + 2));
    for run_id in &running {
        let record = completed_record(b.admin(), run_id, "a taken-over run completes").await;
        let path = format!("/admin/v1/runs/{run_id}/events?format=jsonl&follow=false");
        let stored: Vec<Value> = crate::admin_crash::text(b.admin(), &path)
            .await
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        assert_every_delta_once(&record, &stored, DELTAS);
    }
    // No run reached the engine twice: not the running ones, not the queued ones.
    let asked = asked(&engine);
    assert!(asked.values().all(|&n| n == 1), "{asked:?}");
    assert_eq!(
        readyz(a.http()).await.map(|(status, _)| status),
        Some(StatusCode::SERVICE_UNAVAILABLE),
        "the woken member still stands by"
    );
    common::bounded("the node to stop", node.stop())
        .await
        .expect("clean stop");
}
