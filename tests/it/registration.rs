//! Registration and connection lifecycle of the node transport, over real TCP with the real
//! protocol client: what an accepted node is told, every reason a registration is refused,
//! hostile or broken peers, liveness, disconnects, graceful shutdown, and many nodes at once.

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::{
    NodeTable, TWO_NODES, TestApp, eventually, numbered_nodes, spawn_app, two_nodes_with_heartbeat,
};
use edge::client::{
    ClientError, NodeClient, NodeFrame, ReceivedAdapter, ReceivedConfig, ReceivedEdgeFrame,
    RegisterOutcome, Registration,
};
use edge::domain::{NodeId, RegisterRejection, RunId};
use edge::ports::NodeCommand;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// An upper bound on how long any single step may take before the test gives up. It only
/// stops a broken edge from hanging the suite; no test asserts on how long a step took.
const PATIENCE: Duration = Duration::from_secs(10);

/// Two nodes whose config exercises every field of the payload, with a short register
/// timeout for the silent-client test.
fn rich_nodes() -> String {
    let node_b = NodeTable::new("node-b", "gpu-b", "token-b")
        .runtime(1, 2500)
        .echo(&["default"]);
    format!(
        r#"
[server]
register_timeout_ms = 300

[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "token-a"
[nodes.runtime]
max_concurrent_runs = 3
heartbeat_interval_ms = 2500
[nodes.runtime.settings]
gpu = "0"
log_level = "debug"
[[nodes.adapters]]
name = "ollama"
targets = ["llama3.1:8b", "Qwen/Qwen2.5-7B"]
[nodes.adapters.settings]
url = "http://127.0.0.1:11434"
keep_alive = "5m"
[[nodes.adapters]]
name = "echo"
targets = ["default"]

{node_b}"#
    )
}

/// [`TWO_NODES`] with `server_keys` added to `[server]`, and with timeouts far beyond
/// [`PATIENCE`]: a connection that is closed within the test's patience was closed for what
/// the test did, not because it stayed silent until a register or heartbeat timeout.
fn patient(server_keys: &str) -> String {
    let nodes = two_nodes_with_heartbeat(60000);
    format!("[server]\nregister_timeout_ms = 60000\n{server_keys}\n{nodes}")
}

fn node_id(id: &str) -> NodeId {
    NodeId::parse(id).expect("valid node id")
}

/// A protocol-v1 registration with `token`, claiming `node_id` (empty for none).
fn registration(token: &str, node_id: &str) -> Registration {
    Registration {
        node_id: node_id.to_owned(),
        ..Registration::with_token(token)
    }
}

/// `registration` speaking `protocol_version`.
fn versioned(token: &str, protocol_version: u32) -> Registration {
    Registration {
        protocol_version,
        ..Registration::with_token(token)
    }
}

async fn connect(app: &TestApp) -> NodeClient {
    NodeClient::connect(app.node_addr).await.expect("connect")
}

/// Connects and registers with `registration`, returning the connection and the answer.
async fn attempt(app: &TestApp, registration: Registration) -> (NodeClient, RegisterOutcome) {
    let mut client = connect(app).await;
    let outcome = within(client.register(registration))
        .await
        .expect("a register response");
    (client, outcome)
}

/// Awaits `future`, failing the test if it has not finished within [`PATIENCE`].
async fn within<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(PATIENCE, future)
        .await
        .expect("the edge did not answer in time")
}

/// Asserts that `outcome` refuses the registration for `reason`.
fn assert_rejected(outcome: &RegisterOutcome, reason: RegisterRejection) {
    assert!(!outcome.accepted, "expected a rejection, got {outcome:?}");
    assert_eq!(outcome.rejection, Some(reason), "{outcome:?}");
    assert!(outcome.node_id.is_empty(), "{outcome:?}");
    assert!(outcome.alias.is_empty(), "{outcome:?}");
    assert_eq!(outcome.config, None, "{outcome:?}");
}

/// Asserts that `outcome` admits the node `id`.
fn assert_accepted(outcome: &RegisterOutcome, id: &str) {
    assert!(outcome.accepted, "expected acceptance, got {outcome:?}");
    assert_eq!(outcome.rejection, None, "{outcome:?}");
    assert_eq!(outcome.node_id, id, "{outcome:?}");
}

/// Asserts that the edge has closed `client`'s connection without sending anything more.
async fn assert_closed(client: &mut NodeClient) {
    match within(client.next()).await {
        Err(ClientError::Closed) => {}
        // A reset (the edge closed with our bytes still unread) is a close too.
        Err(ClientError::Frame(edge::client::FrameError::Io(_))) => {}
        other => panic!("expected the edge to close the connection, got {other:?}"),
    }
}

/// Asserts that the edge closed the raw connection: EOF or a reset, and no bytes.
async fn assert_raw_closed(client: &mut NodeClient) {
    let mut buf = [0u8; 64];
    match within(client.stream_mut().read(&mut buf)).await {
        Ok(0) | Err(_) => {}
        Ok(n) => panic!("expected the edge to close, it sent {:?}", &buf[..n]),
    }
}

/// Proves `client` (registered as `id`) is still served by the same connection: its
/// heartbeat is read without closing it, and a command the edge queues on its registry link
/// reaches it.
async fn assert_still_served(app: &TestApp, client: &mut NodeClient, id: &str, connection: u64) {
    within(client.heartbeat(0)).await.expect("heartbeat");
    let node = app.parts.registry.get(id).expect("still registered");
    assert_eq!(
        node.connection, connection,
        "the node's connection was replaced"
    );
    let probe = NodeCommand::Cancel {
        run_id: RunId::new("probe"),
        reason: "liveness probe".into(),
    };
    app.parts
        .registry
        .link(&node_id(id))
        .expect("a link to the node")
        .send(probe.clone())
        .expect("the link accepts a command");
    match within(client.next()).await {
        Ok(ReceivedEdgeFrame::Command(command)) => assert_eq!(command, probe),
        other => panic!("expected the probe command, got {other:?}"),
    }
    assert_eq!(
        app.parts.registry.get(id).map(|n| n.connection),
        Some(connection)
    );
}

/// The live connection id of node `id`.
fn connection_of(app: &TestApp, id: &str) -> u64 {
    app.parts
        .registry
        .get(id)
        .expect("node is registered")
        .connection
}

/// Registers `token`'s node and returns its client and connection id.
async fn registered(app: &TestApp, token: &str, id: &str) -> (NodeClient, u64) {
    let (client, outcome) = attempt(app, Registration::with_token(token)).await;
    assert_accepted(&outcome, id);
    eventually("the node is in the registry", || {
        app.parts.registry.get(id).is_some()
    })
    .await;
    (client, connection_of(app, id))
}

/// The exact bytes the real client writes for `frame`, captured on a loopback socket.
async fn encoded(frame: NodeFrame) -> Vec<u8> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut client = NodeClient::connect(addr).await.expect("connect");
    let (mut peer, _) = listener.accept().await.expect("accept");
    client.send(frame).await.expect("send");
    drop(client);
    let mut bytes = Vec::new();
    common::bounded("the client's bytes", peer.read_to_end(&mut bytes))
        .await
        .expect("read");
    bytes
}

#[crate::common::test]
async fn an_accepted_registration_returns_the_configured_node_and_config() {
    let app = spawn_app(&rich_nodes()).await;
    let (_client, outcome) = attempt(&app, registration("token-a", "node-a")).await;

    let settings = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let expected = RegisterOutcome {
        active_edge: None,
        accepted: true,
        rejection: None,
        message: outcome.message.clone(),
        node_id: "node-a".into(),
        alias: "gpu-a".into(),
        resumed: Vec::new(),
        // A node without an instance id cannot resume: it is not told about acks.
        acknowledges_pings: false,
        config: Some(ReceivedConfig {
            adapters: vec![
                ReceivedAdapter {
                    name: "ollama".into(),
                    targets: vec!["llama3.1:8b".into(), "Qwen/Qwen2.5-7B".into()],
                    settings: settings(&[("url", "http://127.0.0.1:11434"), ("keep_alive", "5m")]),
                },
                ReceivedAdapter {
                    name: "echo".into(),
                    targets: vec!["default".into()],
                    settings: BTreeMap::new(),
                },
            ],
            max_concurrent_runs: 3,
            heartbeat_interval_ms: 2500,
            runtime_settings: settings(&[("gpu", "0"), ("log_level", "debug")]),
        }),
    };
    assert_eq!(outcome, expected);

    app.wait_for_nodes(1).await;
    let by_id = app.parts.registry.get("node-a").expect("found by id");
    let by_alias = app.parts.registry.get("gpu-a").expect("found by alias");
    assert_eq!(by_id.record.id().as_str(), "node-a");
    assert_eq!(by_id.record.alias().as_str(), "gpu-a");
    assert_eq!(by_alias.record.id().as_str(), "node-a");
    assert_eq!(by_alias.connection, by_id.connection);
    assert_eq!(by_id.node_version, env!("CARGO_PKG_VERSION"));
    assert!(app.parts.registry.get("node-b").is_none());
    assert!(app.parts.registry.get("gpu-b").is_none());
    app.stop().await;
}

#[crate::common::test]
async fn a_registration_without_node_id_is_given_the_tokens_node() {
    let app = spawn_app(TWO_NODES).await;
    let (_client, outcome) = attempt(&app, Registration::with_token("token-b")).await;
    assert_accepted(&outcome, "node-b");
    assert_eq!(outcome.alias, "gpu-b");
    let config = outcome.config.expect("config");
    assert_eq!(config.adapters.len(), 1);
    assert_eq!(config.adapters[0].name, "echo");
    assert_eq!(config.adapters[0].targets, ["default", "fast"]);
    assert_eq!(
        (config.max_concurrent_runs, config.heartbeat_interval_ms),
        (2, 1000)
    );
    app.wait_for_nodes(1).await;
    assert!(app.parts.registry.get("gpu-b").is_some());
    app.stop().await;
}

/// On a fresh [`patient`] edge, checks that `registration` is refused for `reason`, its
/// connection closed, and no node registered.
async fn refused_on_a_fresh_edge(registration: Registration, reason: RegisterRejection) {
    let app = spawn_app(&patient("")).await;
    let (mut client, outcome) = attempt(&app, registration).await;
    assert_rejected(&outcome, reason);
    assert_closed(&mut client).await;
    assert!(app.parts.registry.is_empty());
    app.stop().await;
}

#[crate::common::test]
async fn an_unknown_token_is_rejected_and_the_connection_closed() {
    refused_on_a_fresh_edge(
        Registration::with_token("no-such-token"),
        RegisterRejection::InvalidToken,
    )
    .await;
}

#[crate::common::test]
async fn an_empty_token_is_rejected_and_the_connection_closed() {
    refused_on_a_fresh_edge(
        Registration::with_token(""),
        RegisterRejection::InvalidToken,
    )
    .await;
}

#[crate::common::test]
async fn a_node_id_that_is_not_the_tokens_node_is_rejected_and_the_connection_closed() {
    refused_on_a_fresh_edge(
        registration("token-a", "node-b"),
        RegisterRejection::NodeIdMismatch,
    )
    .await;
}

#[crate::common::test]
async fn a_second_connection_of_a_connected_node_is_rejected_and_the_live_one_keeps_working() {
    let app = spawn_app(&patient("")).await;
    let (mut live, connection) = registered(&app, "token-a", "node-a").await;

    for claimed in ["", "node-a"] {
        let (mut intruder, outcome) = attempt(&app, registration("token-a", claimed)).await;
        assert_rejected(&outcome, RegisterRejection::AlreadyConnected);
        assert_closed(&mut intruder).await;
    }

    assert_still_served(&app, &mut live, "node-a", connection).await;
    assert_eq!(app.parts.registry.len(), 1);
    app.stop().await;
}

#[crate::common::test]
async fn an_unsupported_protocol_version_is_rejected_and_zero_is_read_as_one() {
    let app = spawn_app(&patient("")).await;
    for version in [2, 3, u32::MAX] {
        let (mut client, outcome) = attempt(&app, versioned("token-a", version)).await;
        assert_rejected(&outcome, RegisterRejection::UnsupportedProtocol);
        assert_closed(&mut client).await;
    }
    assert!(app.parts.registry.is_empty());

    let (_zero, outcome) = attempt(&app, versioned("token-a", 0)).await;
    assert_accepted(&outcome, "node-a");
    let (_one, outcome) = attempt(&app, versioned("token-b", 1)).await;
    assert_accepted(&outcome, "node-b");
    app.wait_for_nodes(2).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_first_message_that_is_not_a_registration_is_a_protocol_violation() {
    let app = spawn_app(&patient("")).await;
    for first in [
        NodeFrame::Heartbeat {
            active_runs: 0,
            ping: 0,
            availability: None,
            inventory: None,
        },
        NodeFrame::Unknown,
    ] {
        let mut client = connect(&app).await;
        within(client.send(first)).await.expect("send");
        match within(client.next()).await {
            Ok(ReceivedEdgeFrame::Registered(outcome)) => {
                assert_rejected(&outcome, RegisterRejection::ProtocolViolation);
            }
            other => panic!("expected a register response, got {other:?}"),
        }
        assert_closed(&mut client).await;
    }
    assert!(app.parts.registry.is_empty());
    app.stop().await;
}

/// `start_draining` also stops the accept loop, so a connection opened afterwards may never
/// be served. The connection under test is therefore opened, and known to be accepted,
/// before draining starts; it registers afterwards.
#[crate::common::test]
async fn a_registration_while_the_edge_drains_is_told_it_is_shutting_down() {
    let app = spawn_app(&patient("")).await;
    let mut early = connect(&app).await;
    // The accept loop takes connections in the order they were made, so once a later
    // connection has registered, `early` has been accepted and is waiting for its register.
    let (mut live, connection) = registered(&app, "token-b", "node-b").await;

    app.parts.transport.start_draining();
    assert!(app.parts.transport.is_draining());

    let outcome = within(early.register(Registration::with_token("token-a")))
        .await
        .expect("a register response");
    assert_rejected(&outcome, RegisterRejection::ShuttingDown);
    assert_closed(&mut early).await;
    assert!(app.parts.registry.get("node-a").is_none());

    // A connection attempted after draining started is never admitted: it is refused, reset,
    // or told the edge is shutting down.
    if let Ok(mut late) = NodeClient::connect(app.node_addr).await {
        match within(late.register(Registration::with_token("token-a"))).await {
            Ok(outcome) => assert_rejected(&outcome, RegisterRejection::ShuttingDown),
            Err(ClientError::Closed | ClientError::Frame(_)) => {}
            Err(other) => panic!("unexpected answer to a late registration: {other:?}"),
        }
    }
    assert!(app.parts.registry.get("node-a").is_none());

    // Draining refuses newcomers; it does not drop the nodes already connected.
    assert_still_served(&app, &mut live, "node-b", connection).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_registration_delivered_one_byte_at_a_time_is_accepted() {
    let app = spawn_app(&patient("")).await;
    let bytes = encoded(NodeFrame::Register(registration("token-a", "node-a"))).await;
    assert!(bytes.len() > 2, "{bytes:?}");

    let mut client = connect(&app).await;
    for byte in &bytes {
        let stream = client.stream_mut();
        stream.write_all(&[*byte]).await.expect("write");
        stream.flush().await.expect("flush");
        // Give the edge a chance to read each byte on its own.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    match within(client.next()).await {
        Ok(ReceivedEdgeFrame::Registered(outcome)) => assert_accepted(&outcome, "node-a"),
        other => panic!("expected a register response, got {other:?}"),
    }
    app.wait_for_nodes(1).await;
    let connection = connection_of(&app, "node-a");
    assert_still_served(&app, &mut client, "node-a", connection).await;
    app.stop().await;
}

/// Sends `bytes` (nothing when empty) on a fresh connection while node-a is registered, then
/// checks that the edge closed that connection, node-a is still served, and node-b can still
/// join.
async fn closes_without_harm(app: &TestApp, bytes: &[u8]) {
    let (mut live, connection) = registered(app, "token-a", "node-a").await;

    let mut bad = connect(app).await;
    if !bytes.is_empty() {
        bad.stream_mut().write_all(bytes).await.expect("write");
    }
    assert_raw_closed(&mut bad).await;
    assert!(app.parts.registry.get("node-b").is_none());

    assert_still_served(app, &mut live, "node-a", connection).await;
    let (mut fresh, fresh_connection) = registered(app, "token-b", "node-b").await;
    assert_still_served(app, &mut fresh, "node-b", fresh_connection).await;
    assert_eq!(app.parts.registry.len(), 2);
}

#[crate::common::test]
async fn an_oversized_length_prefix_is_closed_without_harm_to_other_nodes() {
    let app = spawn_app(&patient("")).await;
    // About 4 GiB announced, and nothing else sent: the edge must not wait for it.
    closes_without_harm(&app, &[0xff, 0xff, 0xff, 0xff, 0x0f]).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_length_prefix_just_above_the_register_frame_limit_is_closed() {
    let app = spawn_app(&patient("max_register_frame_bytes = 100")).await;
    // 101 as a varint.
    closes_without_harm(&app, &[101]).await;
    app.stop().await;
}

#[crate::common::test]
async fn garbage_bytes_are_closed_without_harm_to_other_nodes() {
    let app = spawn_app(&patient("")).await;
    // A three-byte frame whose bytes are not a NodeMessage.
    closes_without_harm(&app, &[0x03, 0xff, 0xff, 0xff]).await;
    app.stop().await;
}

#[crate::common::test]
async fn an_overlong_varint_is_closed_without_harm_to_other_nodes() {
    let app = spawn_app(&patient("")).await;
    closes_without_harm(&app, &[0x80; 11]).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_silent_client_is_closed_after_the_register_timeout_without_harm() {
    // rich_nodes() sets register_timeout_ms = 300.
    let app = spawn_app(&rich_nodes()).await;
    closes_without_harm(&app, &[]).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_client_that_sends_half_a_frame_is_closed_after_the_register_timeout() {
    let app = spawn_app(&rich_nodes()).await;
    let bytes = encoded(NodeFrame::Register(Registration::with_token("token-b"))).await;
    closes_without_harm(&app, &bytes[..bytes.len() / 2]).await;
    app.stop().await;
}

#[crate::common::test]
async fn an_oversized_frame_from_a_registered_node_closes_only_that_node() {
    let app = spawn_app(&patient("max_frame_bytes = 1024")).await;
    let (mut live, connection) = registered(&app, "token-a", "node-a").await;
    let (mut bad, _) = registered(&app, "token-b", "node-b").await;

    // 1025 as a varint.
    bad.stream_mut()
        .write_all(&[0x81, 0x08])
        .await
        .expect("write");
    assert_closed(&mut bad).await;
    app.wait_until_left("node-b").await;
    assert_still_served(&app, &mut live, "node-a", connection).await;
    app.stop().await;
}

#[crate::common::test]
async fn heartbeat_silence_evicts_the_node() {
    let app = spawn_app(&two_nodes_with_heartbeat(100)).await;
    let (mut silent, _) = registered(&app, "token-a", "node-a").await;

    assert_closed(&mut silent).await;
    app.wait_until_left("node-a").await;
    assert!(app.parts.registry.is_empty());

    // Eviction frees the node to register again.
    let (_back, outcome) = attempt(&app, Registration::with_token("token-a")).await;
    assert_accepted(&outcome, "node-a");
    app.stop().await;
}

#[crate::common::test]
async fn heartbeats_keep_a_node_registered() {
    let app = spawn_app(&two_nodes_with_heartbeat(200)).await;
    let (mut client, connection) = registered(&app, "token-a", "node-a").await;
    // Well past three intervals, heartbeating twice as often as configured.
    for _ in 0..15 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        within(client.heartbeat(0)).await.expect("heartbeat");
    }
    assert_still_served(&app, &mut client, "node-a", connection).await;
    app.stop().await;
}

#[crate::common::test]
async fn a_disconnect_removes_the_node_from_the_registry() {
    let app = spawn_app(&patient("")).await;
    let (client, _) = registered(&app, "token-a", "node-a").await;
    let (mut other, other_connection) = registered(&app, "token-b", "node-b").await;

    drop(client);
    app.wait_until_left("node-a").await;
    assert!(app.parts.registry.get("gpu-a").is_none());
    assert_still_served(&app, &mut other, "node-b", other_connection).await;

    // The node may come back at once.
    let (_back, outcome) = attempt(&app, Registration::with_token("token-a")).await;
    assert_accepted(&outcome, "node-a");
    app.stop().await;
}

#[crate::common::test]
async fn a_second_register_request_on_an_accepted_connection_closes_it() {
    let app = spawn_app(&patient("")).await;
    let (mut client, _) = registered(&app, "token-a", "node-a").await;

    within(client.send(NodeFrame::Register(Registration::with_token("token-a"))))
        .await
        .expect("send");
    assert_closed(&mut client).await;
    app.wait_until_left("node-a").await;
    app.stop().await;
}

#[crate::common::test]
async fn a_graceful_stop_sends_shutdown_to_every_node_and_ends_cleanly() {
    let app = spawn_app(&patient("")).await;
    let (mut a, _) = registered(&app, "token-a", "node-a").await;
    let (mut b, _) = registered(&app, "token-b", "node-b").await;

    app.parts.stop.cancel();
    for client in [&mut a, &mut b] {
        match within(client.next()).await {
            Ok(ReceivedEdgeFrame::Command(NodeCommand::Shutdown { reason })) => {
                assert!(!reason.is_empty());
            }
            other => panic!("expected Shutdown, got {other:?}"),
        }
        assert_closed(client).await;
    }
    within(app.serving)
        .await
        .expect("the serving task did not panic")
        .expect("the edge stopped cleanly");
    assert!(app.parts.registry.is_empty());
}

#[crate::common::test]
async fn a_rejection_never_tells_whether_a_node_exists() {
    // Six wrong tokens from one address: keep the brute-force brake's growing delay short.
    let app = spawn_app(&patient(
        "register_failure_delay_ms = 1\nregister_failure_max_delay_ms = 1",
    ))
    .await;
    let (_live, _) = registered(&app, "token-a", "node-a").await;

    let (_c, unknown) = attempt(&app, registration("no-such-token", "")).await;
    assert_rejected(&unknown, RegisterRejection::InvalidToken);
    // A wrong token claiming a connected node, a registered-but-absent node, a node that
    // does not exist, and an empty token: all get exactly the same answer.
    for (token, claimed) in [
        ("no-such-token", "node-a"),
        ("no-such-token", "node-b"),
        ("no-such-token", "node-z"),
        ("", "node-a"),
        ("", ""),
    ] {
        let (mut client, outcome) = attempt(&app, registration(token, claimed)).await;
        assert_eq!(outcome, unknown, "token {token:?}, node_id {claimed:?}");
        assert_closed(&mut client).await;
    }
    app.stop().await;
}

#[crate::common::test]
async fn a_burst_of_nodes_registers_concurrently_and_all_leave_on_disconnect() {
    // More than the accept loop takes ahead of the connections it has started (64): the
    // rest wait in the listen queue, and every one is still served.
    const NODES: usize = 300;
    let app = spawn_app(&numbered_nodes(NODES, "alias", 1, 60000)).await;
    let addr = app.node_addr;

    let joins: Vec<_> = (0..NODES)
        .map(|i| {
            tokio::spawn(async move {
                let mut client = NodeClient::connect(addr).await.expect("connect");
                let outcome = client
                    .register(Registration::with_token(&format!("token-{i}")))
                    .await
                    .expect("register");
                (i, client, outcome)
            })
        })
        .collect();
    let mut clients = Vec::new();
    for join in joins {
        let (i, client, outcome) = within(join).await.expect("registration task");
        assert_accepted(&outcome, &format!("node-{i}"));
        assert_eq!(outcome.alias, format!("alias-{i}"));
        clients.push(client);
    }

    app.wait_for_nodes(NODES).await;
    for i in 0..NODES {
        let by_alias = app
            .parts
            .registry
            .get(&format!("alias-{i}"))
            .expect("by alias");
        assert_eq!(by_alias.record.id().as_str(), format!("node-{i}"));
    }

    drop(clients);
    eventually("every node has left the registry", || {
        app.parts.registry.is_empty()
    })
    .await;
    app.stop().await;
}
