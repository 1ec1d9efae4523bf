//! The node transport by its site role (issue 49), over real TCP with the real protocol
//! client: a standby refuses registrations with `SHUTTING_DOWN` naming the active member,
//! every message carries the epoch the edge acts under, and an edge that stops acting sends
//! no command more and sends its nodes away with `Shutdown { reason: "standby" }`.

use crate::common;

use common::runs::echo_run;
use common::{TWO_NODES, TestApp, bounded, spawn_app};
use edge::client::{
    ClientError, EpochFence, NodeClient, ReceivedEdgeFrame, RegisterOutcome, Registration,
};
use edge::domain::{RegisterRejection, RunEventKind, RunId};
use edge::ports::{ActiveMember, CloseReason, NodeCommand, Role};

fn standby(active: Option<&str>) -> Role {
    Role::Standby {
        active: active.map(|address| ActiveMember {
            edge_id: "edge-a".into(),
            node_address: address.into(),
            api_address: "10.0.0.1:8080".into(),
        }),
        reason: "another member holds the lease".into(),
    }
}

/// Connects a client fenced by `fence` and registers as node-a.
async fn register(app: &TestApp, fence: &EpochFence) -> (NodeClient, RegisterOutcome) {
    bounded("the edge to answer a registration", async {
        let client = NodeClient::connect(app.node_addr).await.expect("connect");
        let mut client = client.fenced(fence.clone());
        let outcome = client
            .register(Registration::with_token("token-a").instance("i-1"))
            .await
            .expect("an answer");
        (client, outcome)
    })
    .await
}

/// Reads the next frame, which must be the run `run_id`, and completes it.
async fn complete(client: &mut NodeClient, run_id: &RunId) {
    let run = bounded("the run to reach the node", client.next())
        .await
        .expect("a frame");
    assert!(
        matches!(&run, ReceivedEdgeFrame::Command(NodeCommand::Run(r)) if &r.run_id == run_id),
        "{run:?}"
    );
    let completed = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    };
    client
        .event(run_id.as_str(), 1, completed)
        .await
        .expect("the event is written");
    // A sign of life, so a slow machine does not evict the node meanwhile.
    client.heartbeat(0).await.expect("the heartbeat is written");
}

/// Every frame the edge sends until it closes the connection.
async fn until_closed(client: &mut NodeClient) -> Vec<ReceivedEdgeFrame> {
    let mut frames = Vec::new();
    bounded("the edge to close the connection", async {
        loop {
            match client.next().await {
                Ok(frame) => frames.push(frame),
                Err(ClientError::Closed | ClientError::Frame(_)) => return,
                Err(other) => panic!("unexpected: {other}"),
            }
        }
    })
    .await;
    frames
}

#[crate::common::test]
async fn a_standby_refuses_nodes_naming_the_active_member_and_takes_them_once_it_acts() {
    let app = spawn_app(TWO_NODES).await;
    app.parts.site.set(standby(Some("10.0.0.1:7100")));
    let fence = EpochFence::new();
    let (_client, refused) = register(&app, &fence).await;
    assert!(!refused.accepted);
    assert_eq!(refused.rejection, Some(RegisterRejection::ShuttingDown));
    assert_eq!(refused.active_edge.as_deref(), Some("10.0.0.1:7100"));
    assert!(refused.message.contains("stands by"), "{}", refused.message);
    assert!(
        refused.message.contains("10.0.0.1:7100"),
        "{}",
        refused.message
    );

    app.parts.site.set(standby(None));
    let (_client, refused) = register(&app, &fence).await;
    assert_eq!(refused.rejection, Some(RegisterRejection::ShuttingDown));
    assert_eq!(refused.active_edge, None);
    assert_eq!(app.parts.registry.len(), 0);
    // A standby's refusal carries no epoch the node would have to obey.
    assert_eq!(fence.highest(), 0);

    app.parts.site.set(Role::Active { epoch: 7 });
    let (_client, accepted) = register(&app, &fence).await;
    assert!(accepted.accepted, "{}", accepted.message);
    assert_eq!(accepted.active_edge, None);
    assert_eq!(fence.highest(), 7, "the acceptance carries the epoch");
    app.stop().await;
}

#[crate::common::test]
async fn commands_carry_the_epoch_and_an_edge_that_stops_acting_sends_its_nodes_away() {
    let app = spawn_app(TWO_NODES).await;
    app.parts.site.set(Role::Active { epoch: 5 });
    let fence = EpochFence::new();
    let (mut client, outcome) = register(&app, &fence).await;
    assert!(outcome.accepted);
    app.wait_for_nodes(1).await;
    let handle = app.parts.runs.start(echo_run("first")).expect("accepted");
    complete(&mut client, &handle.run_id).await;
    assert_eq!(fence.highest(), 5);

    // A new lease, a higher epoch: the next command carries it.
    app.parts.site.set(Role::Active { epoch: 6 });
    let handle = app.parts.runs.start(echo_run("again")).expect("accepted");
    complete(&mut client, &handle.run_id).await;
    assert_eq!(fence.highest(), 6);
    // The node is idle again: a run started now is placed on it.
    app.assert_settled().await;

    // The edge stops acting; a run started right after is never written to the node.
    app.parts.site.set(standby(Some("10.0.0.1:7100")));
    let _queued = app.parts.runs.start(echo_run("second"));
    let frames = until_closed(&mut client).await;
    assert!(
        !frames
            .iter()
            .any(|f| matches!(f, ReceivedEdgeFrame::Command(NodeCommand::Run(_)))),
        "a standby sent a run: {frames:?}"
    );
    assert!(
        frames.iter().any(|f| matches!(
            f,
            ReceivedEdgeFrame::Command(NodeCommand::Shutdown { reason }) if reason == "standby"
        )),
        "the node was not sent away: {frames:?}"
    );
    app.wait_until_left("node-a").await;
    let stats = app.parts.transport.stats();
    assert_eq!(stats.disconnects(CloseReason::Standby), 1);
    app.stop().await;
}

#[crate::common::test]
async fn a_single_edge_stamps_epoch_zero() {
    let app = spawn_app(TWO_NODES).await;
    let fence = EpochFence::new();
    let (mut client, outcome) = register(&app, &fence).await;
    assert!(outcome.accepted);
    app.wait_for_nodes(1).await;
    let handle = app.parts.runs.start(echo_run("x")).expect("accepted");
    let run = bounded("the run to reach the node", client.next())
        .await
        .expect("a frame");
    assert!(
        matches!(&run, ReceivedEdgeFrame::Command(NodeCommand::Run(r)) if r.run_id == handle.run_id)
    );
    assert_eq!(fence.highest(), 0);
    app.stop().await;
}
