//! Fuzz target `resume_claims`: a node that reconnects and claims runs, through the real TCP
//! transport (`TransportControl::serve_stream` over in-memory duplex pipes) and the real run
//! service, with resume on.
//!
//! Input: `[shape, outputs, claims (3 bytes each)..., bytes...]`. The node registers as
//! `node-a` with an instance id, a run pinned to it starts, the node reports `started` and
//! `outputs % 8` outputs and closes its connection: the run is held for resume. Then, per
//! `shape`:
//! - bit 0: the second registration keeps the instance id (else a new one);
//! - bit 1: it is `node-b`'s (another node claims the run);
//! - bit 2: the grace expires before it (the run has ended by then);
//! - bits 3-4: how many claims it carries (0 to 3), each `[which, next_seq, first]`: `which`
//!   picks the run's id (even), an unknown id (1 mod 4) or the run's id again (3 mod 4);
//!   `next_seq` and `first_buffered_seq` are the bytes as they are;
//! - bit 5: after `bytes`, fall silent instead of closing.
//!
//! Then `bytes` follow the second registration as they are (run events with an empty
//! `run_id` are addressed to the run), and the node closes (or falls silent) and reads
//! until the edge closes; then time runs out every grace and timeout.
//!
//! Invariants: nothing panics; both connections end; afterwards the registry is empty, no
//! run is open, the run has exactly one terminal event, the last, and its sequence numbers
//! only grow (nothing relayed twice); the second answer has one answer per distinct claimed
//! run, in order, and accepts only the run, only when its own node claims it within the grace,
//! from one past the last event relayed.
//!
//! This file is shared by the libFuzzer binary and the root crate's corpus replay test, so it
//! must build on stable and stay clippy-clean.

use std::net::SocketAddr;
use std::sync::OnceLock;
use std::time::Duration;

use edge::components::FileNodeStore;
use edge::domain::routing::RoutingPolicy;
use edge::domain::{RegisterAttempt, ResumeClaim, RunEventKind, RunId, Token};
use edge::ports::{Registry, ReportedEvent};
use edge::settings::RunsConfig;
use edge::wire::NodeFrame;

use crate::recording::lock;
use crate::register_handshake::{
    HANG, Harness, PIPE_BYTES, check_reply, definition, encoded, node,
};

/// How long the edge holds a run for its node.
const GRACE: Duration = Duration::from_millis(1_000);

/// Runs one input.
pub fn run(data: &[u8]) {
    let [shape, outputs, rest @ ..] = data else {
        return;
    };
    let claims = usize::from((shape >> 3) & 0x03);
    let (claim_bytes, bytes) = rest.split_at((claims * 3).min(rest.len()));
    let harness = harness();
    harness.handler.reset(true);
    lock(&harness.sink.events).clear();

    let answer = harness.runtime.block_on(async {
        let outputs = u64::from(outputs % 8);
        let mut first = register("token-a", "i-1", Vec::new());
        // Addressed to the run by the handler (a node echoes the id it was sent).
        first.extend(encoded(event(1, RunEventKind::Started)));
        for seq in 2..=outputs + 1 {
            first.extend(encoded(event(seq, RunEventKind::text("x"))));
        }
        connect(harness, first, false).await;
        if shape & 0x04 != 0 {
            tokio::time::sleep(GRACE * 2).await;
        }

        let run = harness.handler.started().expect("a run on node-a");
        let relayed = last_seq(harness, &run);
        let claims: Vec<ResumeClaim> = claim_bytes
            .chunks_exact(3)
            .map(|c| ResumeClaim {
                run_id: match c[0] % 4 {
                    1 => "run-unknown".to_owned(),
                    _ => run.as_str().to_owned(),
                },
                next_seq: u64::from(c[1]),
                first_buffered_seq: u64::from(c[2]),
            })
            .collect();
        let token = if shape & 0x02 != 0 {
            "token-b"
        } else {
            "token-a"
        };
        let instance = if shape & 0x01 != 0 { "i-1" } else { "i-2" };
        let mut second = register(token, instance, claims.clone());
        second.extend_from_slice(bytes);
        let written = connect(harness, second, shape & 0x20 != 0).await;
        // Every grace, deadline and timeout runs out.
        tokio::time::sleep(HANG).await;
        let ours = token == "token-a" && shape & 0x04 == 0;
        (check_reply(&written), claims, run, relayed, ours)
    });

    let (outcome, claims, run, relayed, ours) = answer;
    assert!(harness.registry.is_empty(), "a node is still registered");
    assert_eq!(harness.service.open_runs(), 0, "a run outlived its node");
    let events: Vec<_> = lock(&harness.sink.events)
        .iter()
        .filter(|e| e.run_id == run)
        .cloned()
        .collect();
    assert_eq!(
        events.iter().filter(|e| e.kind.is_terminal()).count(),
        1,
        "run {run}: {events:?}"
    );
    assert!(events.last().is_some_and(|e| e.kind.is_terminal()));
    assert!(
        events.windows(2).all(|w| w[0].seq < w[1].seq),
        "run {run} relayed a seq twice: {events:?}"
    );
    let Some(outcome) = outcome.filter(|o| o.accepted) else {
        return;
    };
    let mut distinct: Vec<&str> = Vec::new();
    for claim in &claims {
        if !distinct.contains(&claim.run_id.as_str()) {
            distinct.push(&claim.run_id);
        }
    }
    let answered: Vec<&str> = outcome.resumed.iter().map(|a| a.run_id.as_str()).collect();
    assert_eq!(
        answered, distinct,
        "one answer per distinct claim, in order"
    );
    for answer in &outcome.resumed {
        if let Ok(from) = answer.outcome {
            assert!(ours && answer.run_id == run.as_str(), "{answer:?}");
            assert_eq!(from, relayed + 1, "resumed from where the edge stopped");
        }
    }
}

/// A run event for the started run (the handler fills in its id).
fn event(seq: u64, kind: RunEventKind) -> NodeFrame {
    NodeFrame::RunEvent(ReportedEvent {
        run_id: String::new(),
        seq,
        kind,
    })
}

/// A registration with `token`, `instance_id` and `resume` claims, encoded.
fn register(token: &str, instance_id: &str, resume: Vec<ResumeClaim>) -> Vec<u8> {
    encoded(NodeFrame::Register(RegisterAttempt {
        token: Token::new(token),
        node_id: String::new(),
        node_version: "fuzz".to_owned(),
        protocol_version: 1,
        adapters: vec!["echo".to_owned()],
        instance_id: instance_id.to_owned(),
        resume,
        can_continue: false,
        operations: edge::domain::DeclaredOperations::default(),
        can_manage_models: false,
        inventory: None,
    }))
}

/// Serves one connection that writes `input` (then closes, or falls silent when it
/// `lingers`) until it ends; returns what the edge wrote.
async fn connect(harness: &Harness, input: Vec<u8>, linger: bool) -> Vec<u8> {
    let (edge_side, node_side) = tokio::io::duplex(PIPE_BYTES);
    let peer = SocketAddr::from(([127, 0, 0, 1], 40_001));
    let serve = harness.control.serve_stream(edge_side, peer);
    let ((), written) = tokio::time::timeout(HANG, async {
        tokio::join!(serve, node(node_side, input, linger))
    })
    .await
    .expect("serve_stream did not return");
    written
}

/// The seq of the last event relayed for `run`; 0 for none.
fn last_seq(harness: &Harness, run: &RunId) -> u64 {
    lock(&harness.sink.events)
        .iter()
        .filter(|e| &e.run_id == run)
        .map(|e| e.seq)
        .max()
        .unwrap_or(0)
}

fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| {
        let store = FileNodeStore::from_definitions(&[
            definition("node-a", "gpu-a", "token-a", 2, 1_000),
            definition("node-b", "gpu-b", "token-b", 1, 1_000),
        ])
        .expect("valid definitions");
        let runs = RunsConfig {
            resume_grace_ms: u64::try_from(GRACE.as_millis()).unwrap_or(u64::MAX),
            ..RunsConfig::default()
        };
        Harness::new(store, runs, RoutingPolicy::default())
    })
}
