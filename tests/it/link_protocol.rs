//! The edge's side of the v1.1 link additions, over real TCP with the protocol client: every
//! ping answered at once and after the frames before it; takeover of a live connection by
//! the same node instance, by another instance only once the live one has missed a whole
//! heartbeat, never by a v1 node; and a clean close followed at once by a reconnect of the
//! same instance is never refused.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::runs::{echo_run, next_event, start};
use common::{NodeTable, TestApp, eventually, spawn_app};
use edge::client::{ClientError, NodeClient, ReceivedEdgeFrame, RegisterOutcome, Registration};
use edge::components::TransportStats;
use edge::domain::{RegisterRejection, RunEventKind, TakeoverReason, TakeoverRefusal};
use edge::ports::{CloseReason, NodeCommand};

/// An upper bound on one step; never a timing assertion.
const PATIENCE: Duration = Duration::from_secs(10);

/// One node, `node-a` (token `token-a`), heartbeating every `heartbeat_ms`.
fn one_node(heartbeat_ms: u64) -> String {
    NodeTable::new("node-a", "gpu-a", "token-a")
        .runtime(2, heartbeat_ms)
        .echo(&["default"])
        .to_string()
}

async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("the edge did not answer in time")
}

/// Connects and registers with `token`, presenting `instance` (empty: a v1 node).
async fn attempt(app: &TestApp, instance: &str) -> (NodeClient, RegisterOutcome) {
    let mut client = NodeClient::connect(app.node_addr).await.expect("connect");
    let registration = Registration::with_token("token-a").instance(instance);
    let outcome = within(client.register(registration))
        .await
        .expect("a register response");
    (client, outcome)
}

fn assert_refused(outcome: &RegisterOutcome) {
    assert!(!outcome.accepted, "{outcome:?}");
    assert_eq!(
        outcome.rejection,
        Some(RegisterRejection::AlreadyConnected),
        "{outcome:?}"
    );
}

/// Asserts that the edge has closed `client`'s connection.
async fn assert_closed(client: &mut NodeClient) {
    loop {
        match within(client.next()).await {
            Err(ClientError::Closed | ClientError::Frame(_)) => return,
            // Whatever the edge had queued before closing (acks) may still arrive.
            Ok(ReceivedEdgeFrame::HeartbeatAck { .. }) => {}
            other => panic!("expected the edge to close the connection, got {other:?}"),
        }
    }
}

/// Sends a heartbeat with `ping` and returns what the edge answers next.
async fn ping(client: &mut NodeClient, ping: u64) -> ReceivedEdgeFrame {
    within(client.send(edge::client::heartbeat(0, ping, None)))
        .await
        .expect("heartbeat");
    within(client.next()).await.expect("an answer")
}

fn instance_of(app: &TestApp) -> String {
    app.parts
        .registry
        .get("node-a")
        .expect("node-a is registered")
        .instance_id
}

fn stats(app: &TestApp) -> std::sync::Arc<TransportStats> {
    app.parts.transport.stats()
}

#[crate::common::test]
async fn every_ping_is_answered_with_its_value_after_the_frames_before_it() {
    let app = spawn_app(&one_node(60_000)).await;
    let (mut client, outcome) = attempt(&app, "i-1").await;
    assert!(outcome.accepted, "{outcome:?}");
    assert_eq!(
        ping(&mut client, 7).await,
        ReceivedEdgeFrame::HeartbeatAck { ping: 7 }
    );
    // A heartbeat without a ping gets no answer: the next thing the node reads is the ack
    // of the ping after it.
    within(client.heartbeat(0)).await.expect("heartbeat");
    assert_eq!(
        ping(&mut client, 8).await,
        ReceivedEdgeFrame::HeartbeatAck { ping: 8 }
    );
    // An ack confirms the events written before its ping: the caller has them already.
    let mut handle = start(&app, echo_run("hi"));
    let run_id = match within(client.next()).await.expect("a run") {
        ReceivedEdgeFrame::Command(NodeCommand::Run(run)) => run.run_id,
        other => panic!("expected a run, got {other:?}"),
    };
    let output = RunEventKind::Output {
        text: "one".into(),
        data: Bytes::new(),
        structured: Default::default(),
    };
    within(client.event(run_id.as_str(), 1, output))
        .await
        .expect("event");
    assert_eq!(
        ping(&mut client, 9).await,
        ReceivedEdgeFrame::HeartbeatAck { ping: 9 }
    );
    let relayed = handle.events.try_recv().expect("relayed before the ack");
    assert!(matches!(relayed.kind, RunEventKind::Output { .. }));
    let completed = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    };
    within(client.event(run_id.as_str(), 2, completed))
        .await
        .expect("event");
    assert!(next_event(&mut handle).await.kind.is_terminal());
    app.stop().await;
}

#[crate::common::test]
async fn the_same_instance_takes_over_its_live_connection_at_once() {
    let app = spawn_app(&one_node(60_000)).await;
    let (mut old, outcome) = attempt(&app, "i-1").await;
    assert!(outcome.accepted, "{outcome:?}");
    let old_connection = app.parts.registry.get("node-a").expect("live").connection;

    // The old connection is alive as far as the edge knows (it just registered); the same
    // instance coming back takes it over anyway: the node knows best that it is gone.
    let (mut new, outcome) = attempt(&app, "i-1").await;
    assert!(outcome.accepted, "{outcome:?}");
    assert_closed(&mut old).await;
    let live = app.parts.registry.get("node-a").expect("live");
    assert_ne!(live.connection, old_connection);
    assert_eq!(app.parts.registry.len(), 1);

    let stats = stats(&app);
    eventually("the old connection has left as superseded", || {
        stats.disconnects(CloseReason::Superseded) == 1
    })
    .await;
    assert_eq!(stats.closed(CloseReason::Superseded), 1);
    assert_eq!(stats.takeovers(TakeoverReason::SameInstance), 1);
    assert_eq!(stats.links_declared_dead(true), 1);
    assert_eq!(stats.links_declared_dead(false), 0);
    // The old connection's departure did not take the new one with it.
    assert_eq!(
        app.parts.registry.get("node-a").map(|n| n.connection),
        Some(live.connection)
    );
    assert_eq!(
        ping(&mut new, 1).await,
        ReceivedEdgeFrame::HeartbeatAck { ping: 1 }
    );
    app.stop().await;
}

#[crate::common::test]
async fn another_instance_waits_until_the_live_one_has_missed_a_whole_heartbeat() {
    let interval = Duration::from_millis(1_000);
    let app = spawn_app(&one_node(1_000)).await;
    let (mut first, outcome) = attempt(&app, "first").await;
    assert!(outcome.accepted, "{outcome:?}");
    // A frame the edge has surely read (it answered it): the first is alive.
    ping(&mut first, 1).await;

    let (mut second, outcome) = attempt(&app, "second").await;
    assert_refused(&outcome);
    assert_closed(&mut second).await;
    // A v1 node never takes over, however long the live connection has been silent.
    let (_v1, outcome) = attempt(&app, "").await;
    assert_refused(&outcome);
    assert_eq!(instance_of(&app), "first");

    // The first goes silent; once the edge has heard nothing from it for two intervals,
    // another instance is admitted in its place (well before the edge's own three).
    let registry = &app.parts.registry;
    eventually(
        "the first has been silent for two heartbeat intervals",
        || {
            let last = registry.get("node-a").expect("live").last_frame_at;
            let now = tokio::time::Instant::now().into_std();
            now.saturating_duration_since(last) > 2 * interval
        },
    )
    .await;
    let (_third, outcome) = attempt(&app, "third").await;
    assert!(outcome.accepted, "{outcome:?}");
    assert_eq!(instance_of(&app), "third");
    assert_closed(&mut first).await;

    let stats = stats(&app);
    assert_eq!(stats.takeovers(TakeoverReason::PresumedDead), 1);
    assert_eq!(stats.takeovers(TakeoverReason::SameInstance), 0);
    assert_eq!(
        stats.takeover_refusals(TakeoverRefusal::OtherInstanceAlive),
        1
    );
    assert_eq!(stats.takeover_refusals(TakeoverRefusal::NoInstanceId), 1);
    assert_eq!(stats.disconnects(CloseReason::HeartbeatTimeout), 0);
    assert_eq!(stats.links_declared_dead(false), 1);
    app.stop().await;
}

#[crate::common::test]
async fn a_clean_close_followed_at_once_by_the_same_instance_is_never_refused() {
    let app = spawn_app(&one_node(60_000)).await;
    for _ in 0..20 {
        let (client, outcome) = attempt(&app, "i-1").await;
        assert!(outcome.accepted, "{outcome:?}");
        // Closed and redialled before the edge may have processed the close.
        drop(client);
    }
    let (_client, outcome) = attempt(&app, "i-1").await;
    assert!(outcome.accepted, "{outcome:?}");
    assert_eq!(stats(&app).rejected(RegisterRejection::AlreadyConnected), 0);
    eventually("one connection is left", || {
        stats(&app)
            .connections_open
            .load(std::sync::atomic::Ordering::Relaxed)
            == 1
    })
    .await;
    assert_eq!(app.parts.registry.len(), 1);
    app.stop().await;
}
