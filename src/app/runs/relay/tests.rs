//! The relay on its own, over a placer: events reach the sink and the caller in order with
//! one terminal event, late and stale events are dropped and counted, an attempt's
//! failure moves the run on unseen, and the edge's own endings (a queue wait, a cancel's
//! grace) — with no `RunService`.

use std::time::Duration;

use super::Source;
use crate::app::runs::parts_rig::{Rig, node, spec};
use crate::domain::{EventOrigin, FailureClass, RunEventKind};
use crate::ports::ReportedEvent;

fn reported(run: &str, seq: u64, kind: RunEventKind) -> ReportedEvent {
    ReportedEvent {
        run_id: run.into(),
        seq,
        kind,
    }
}

fn completed() -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_nodes_events_reach_the_sink_and_the_caller_in_order_once() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let (placer, _timers, relay) = rig.relay_parts();
    let (run, mut caller) = rig.start(&placer, &relay, spec());
    assert_eq!(rig.sent.runs(), [("a".into(), "run-1".into())]);
    let mut events = vec![
        reported("run-1", 1, RunEventKind::Started),
        reported("run-1", 2, RunEventKind::text("hi")),
        reported("run-1", 3, completed()),
        reported("run-1", 4, RunEventKind::text("late")),
    ];
    relay.node_events(&node("a"), 1, &mut events).await;
    assert_eq!(
        rig.published.of(run.id()),
        [(1, "started"), (2, "output"), (3, "completed")]
    );
    assert_eq!(relay.stats().dropped_after_terminal(), 1);
    let mut kinds = Vec::new();
    while let Some(event) = caller.recv().await {
        kinds.push(event.kind.name());
    }
    assert_eq!(kinds, ["started", "output", "completed"]);
    assert_eq!(placer.open_runs(), 0, "the run was retired");
}

#[tokio::test(start_paused = true)]
async fn events_from_a_connection_that_does_not_hold_the_run_are_dropped() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let (placer, _timers, relay) = rig.relay_parts();
    let (run, _) = rig.start(&placer, &relay, spec());
    let mut events = vec![reported("run-1", 1, RunEventKind::Started)];
    relay.node_events(&node("a"), 7, &mut events).await;
    let mut unknown = vec![reported("run-9", 1, RunEventKind::Started)];
    relay.node_events(&node("a"), 1, &mut unknown).await;
    assert!(rig.published.of(run.id()).is_empty());
    assert_eq!(relay.stats().dropped_unknown_run(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_is_not_relayed_when_the_run_moves_on() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    rig.connect("b", 1, 2);
    let (placer, _timers, relay) = rig.relay_parts();
    let (run, _) = rig.start(&placer, &relay, spec());
    let (first, connection) = {
        let route = run.route();
        let (node, connection) = route.placement().attempt().unwrap();
        (node.clone(), connection)
    };
    let failed = RunEventKind::Failed {
        context_window: None,
        code: "engine_down".into(),
        message: "down".into(),
        class: FailureClass::Node,
        status: None,
        usage: None,
    };
    let source = Source::Attempt(&first, connection);
    assert!(
        relay
            .relay_event(&run, source, Some(1), EventOrigin::Node, failed)
            .await
    );
    assert!(rig.published.of(run.id()).is_empty(), "nothing relayed yet");
    assert_eq!(rig.sent.runs().len(), 2, "sent again, to the other node");
    assert_eq!(placer.open_runs(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_queued_run_ends_when_its_wait_expires() {
    let mut rig = Rig::new();
    let (placer, _timers, relay) = rig.relay_parts();
    let (_run, mut caller) = rig.start(&placer, &relay, spec());
    let end = caller.recv().await.unwrap();
    match &end.kind {
        RunEventKind::Failed { code, .. } => assert_eq!(code, "no_node_available"),
        kind => panic!("ended with {kind:?}"),
    }
    assert_eq!(placer.open_runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancel_the_node_does_not_answer_ends_the_run_after_its_grace() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let (placer, _timers, relay) = rig.relay_parts();
    let (run, mut caller) = rig.start(&placer, &relay, spec());
    let started = tokio::time::Instant::now();
    assert!(relay.cancel(run.id(), "caller left").await);
    assert_eq!(rig.sent.cancels(), [("a".into(), "run-1".into())]);
    let end = caller.recv().await.unwrap();
    assert_eq!(end.kind.name(), "cancelled");
    assert_eq!(started.elapsed(), Duration::from_millis(500));
    assert_eq!(placer.open_runs(), 0);
}

#[tokio::test(start_paused = true)]
async fn runs_let_go_when_the_member_stops_acting_end_with_nothing() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let (placer, _timers, relay) = rig.relay_parts();
    let (run, mut caller) = rig.start(&placer, &relay, spec());
    let (queued, mut queued_caller) = rig.start(&placer, &relay, spec());
    let mut events = vec![
        reported("run-1", 1, RunEventKind::Started),
        reported("run-1", 2, RunEventKind::text("hi")),
    ];
    relay.node_events(&node("a"), 1, &mut events).await;

    assert_eq!(relay.let_go_open().await, 2);
    assert!(placer.is_standing_by(), "no new run while it does not act");
    // No terminal event anywhere, no cancel to the node, nothing open; the callers' streams
    // close after what they had.
    assert_eq!(rig.published.of(run.id()), [(1, "started"), (2, "output")]);
    assert!(rig.published.of(queued.id()).is_empty());
    assert!(rig.sent.cancels().is_empty());
    assert_eq!(placer.open_runs(), 0);
    let mut kinds = Vec::new();
    while let Some(event) = caller.recv().await {
        kinds.push(event.kind.name());
    }
    assert_eq!(kinds, ["started", "output"]);
    assert!(queued_caller.recv().await.is_none());
    // What the node still says of the run is not relayed: the run is gone here.
    let mut late = vec![reported("run-1", 3, completed())];
    relay.node_events(&node("a"), 1, &mut late).await;
    assert_eq!(rig.published.of(run.id()).len(), 2);
    // Its deadline, its waits and its grace are gone with it: nothing ends it later.
    tokio::time::sleep(Duration::from_secs(3_600)).await;
    assert_eq!(rig.published.of(run.id()).len(), 2);
    assert!(rig.published.of(queued.id()).is_empty());
}
