//! Dead links between the reference node and a real edge, made by a relay that stops
//! forwarding both ways without closing either socket (a NAT entry that expired): the node
//! declares the link dead and its own reconnect takes over the half-open connection before
//! the edge's bound; a node that stays away is dropped by the edge within its bound; and two
//! node processes with one token do not flap each other.

use crate::common;
#[allow(dead_code, unused_imports)]
use crate::node;
use crate::node_support;

use std::net::SocketAddr;
use std::sync::Arc;

use common::runs::{only_terminal, rest, start};
use common::{TestApp, eventually};
use edge::client::LinkEnd;
use edge::components::TransportStats;
use edge::domain::{RunEventKind, TakeoverReason, TakeoverRefusal};
use edge::ports::CloseReason;
use node_support::relay::Relay;
use node_support::upstream::ScriptedEngine;
use node_support::{QWEN, answer, edge_config, edge_on, pings_answered, prompt, spawn_node};

/// The heartbeat interval the edge gives the node: the edge drops a silent link after three
/// of them, another instance may take over after two.
const HEARTBEAT_MS: u32 = 1_000;

async fn edge(engine: &ScriptedEngine) -> TestApp {
    engine.script(QWEN, answer("hi"));
    let config = edge_config(&engine.base_url(), &["qwen"], HEARTBEAT_MS);
    edge_on(&config, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

async fn completes(app: &TestApp) {
    let mut handle = start(app, prompt("hello"));
    let events = rest(&mut handle).await;
    let terminal = only_terminal(&handle.run_id, &events);
    assert!(
        matches!(terminal.kind, RunEventKind::Completed { .. }),
        "{events:#?}"
    );
}

fn stats(app: &TestApp) -> Arc<TransportStats> {
    app.parts.transport.stats()
}

fn instance(app: &TestApp) -> Option<String> {
    app.parts.registry.get("node-1").map(|n| n.instance_id)
}

#[crate::common::test]
async fn a_black_holed_link_is_declared_dead_by_the_node_whose_reconnect_takes_it_over() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let app = edge(&engine).await;
    let relay = Relay::start(app.node_addr).await;
    // One silent interval with a ping unanswered is enough for this node: it reconnects
    // well before the edge's three.
    let node = spawn_node(relay.addr, "token-1", |o| o.dead_after_intervals = 1);
    let links = Arc::clone(&node.links);
    app.wait_for_nodes(1).await;
    pings_answered(&app).await;
    let old = app.parts.registry.get("node-1").expect("live").connection;

    relay.black_hole();
    eventually("the node is back on a new connection", || {
        app.parts
            .registry
            .get("node-1")
            .is_some_and(|n| n.connection != old)
    })
    .await;
    let stats = stats(&app);
    eventually("the half-open connection has left", || {
        stats.disconnects(CloseReason::Superseded) == 1
    })
    .await;
    assert_eq!(links.count(LinkEnd::DeclaredDead), 1);
    assert_eq!(stats.takeovers(TakeoverReason::SameInstance), 1);
    assert_eq!(stats.links_declared_dead(true), 1);
    // The takeover came before the edge's own bound.
    assert_eq!(stats.disconnects(CloseReason::HeartbeatTimeout), 0);
    completes(&app).await;
    node.stop().await.expect("clean stop");
    app.assert_settled().await;
}

#[crate::common::test]
async fn a_node_that_stays_behind_a_black_hole_is_dropped_by_the_edge() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let app = edge(&engine).await;
    let relay = Relay::start(app.node_addr).await;
    // This node would wait a long time before judging the link: the edge's rule acts.
    let node = spawn_node(relay.addr, "token-1", |o| o.dead_after_intervals = 1_000);
    app.wait_for_nodes(1).await;
    pings_answered(&app).await;

    relay.black_hole();
    app.wait_until_left("node-1").await;
    let stats = stats(&app);
    assert_eq!(stats.disconnects(CloseReason::HeartbeatTimeout), 1);
    assert_eq!(stats.links_declared_dead(false), 1);
    assert_eq!(stats.links_declared_dead(true), 0);
    node.stop().await.expect("clean stop");
}

#[crate::common::test]
async fn a_second_process_with_the_same_token_waits_until_the_first_has_gone_silent() {
    let engine = ScriptedEngine::start(&[QWEN]).await;
    let app = edge(&engine).await;
    let relay = Relay::start(app.node_addr).await;
    let first = spawn_node(relay.addr, "token-1", |_| {});
    app.wait_for_nodes(1).await;
    pings_answered(&app).await;
    let first_instance = instance(&app).expect("registered");

    // A second process (its own instance) with the same token keeps being refused while
    // the first heartbeats.
    let second = spawn_node(app.node_addr, "token-1", |_| {});
    let stats = stats(&app);
    eventually("the second process has been refused a few times", || {
        stats.takeover_refusals(TakeoverRefusal::OtherInstanceAlive) >= 3
    })
    .await;
    assert_eq!(instance(&app).as_ref(), Some(&first_instance));
    completes(&app).await;

    // The first falls behind a black hole: once it has missed a whole heartbeat, the
    // second is admitted in its place, before the edge would have dropped it.
    relay.black_hole();
    eventually("the second process has taken over", || {
        instance(&app).is_some_and(|i| i != first_instance)
    })
    .await;
    assert_eq!(stats.takeovers(TakeoverReason::PresumedDead), 1);
    assert_eq!(stats.disconnects(CloseReason::HeartbeatTimeout), 0);
    completes(&app).await;
    first.stop().await.expect("clean stop");
    second.stop().await.expect("clean stop");
    app.assert_settled().await;
}
