//! Recovery on its own, over a placer and a relay: a run whose node's connection drops
//! after output is held, re-attached when the node claims it and relayed on without a
//! repeat, or ended when the grace passes; a run nobody reads is cancelled after the
//! reader's grace — with no `RunService`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::Recovery;
use crate::app::runs::parts_rig::{Rig, node, spec};
use crate::app::runs::placer::Placer;
use crate::app::runs::relay::Relay;
use crate::app::runs::run::Run;
use crate::domain::{ResumeClaim, ResumeRefusal, RunEvent, RunEventKind};
use crate::ports::{CloseReason, ReportedEvent};

fn reported(seq: u64, kind: RunEventKind) -> ReportedEvent {
    ReportedEvent {
        run_id: "run-1".into(),
        seq,
        kind,
    }
}

fn claim(next_seq: u64) -> ResumeClaim {
    ResumeClaim {
        run_id: "run-1".into(),
        next_seq,
        first_buffered_seq: 2,
    }
}

/// The parts over a rig with node `a` connected on connection 1.
fn parts() -> (Rig, Arc<Placer>, Arc<Relay>, Arc<Recovery>) {
    let rig = Rig::new();
    rig.connect("a", 1, 1);
    let (placer, timers) = (rig.placer(), rig.timers());
    let relay = rig.relay(&placer, &timers);
    let recovery = rig.recovery(&placer, &relay, &timers);
    (rig, placer, relay, recovery)
}

/// A run on node `a` that relayed `started` and one output, whose node's connection then
/// dropped (the node may resume); its caller's stream.
async fn streamed_then_dropped(
    rig: &mut Rig,
    placer: &Placer,
    relay: &Arc<Relay>,
    recovery: &Arc<Recovery>,
) -> (Arc<Run>, mpsc::Receiver<Arc<RunEvent>>) {
    let (run, caller) = rig.run(spec());
    relay.settle(placer.admit(&run).unwrap().1);
    let mut events = vec![
        reported(1, RunEventKind::Started),
        reported(2, RunEventKind::text("one")),
    ];
    relay.node_events(&node("a"), 1, &mut events).await;
    rig.disconnect("a", 1);
    recovery
        .node_departed(&node("a"), 1, true, &CloseReason::Eof)
        .await;
    (run, caller)
}

#[tokio::test(start_paused = true)]
async fn a_run_held_across_a_reconnect_goes_on_from_where_it_was() {
    let (mut rig, placer, relay, recovery) = parts();
    let (run, _caller) = streamed_then_dropped(&mut rig, &placer, &relay, &recovery).await;
    assert!(run.route().detached().is_some(), "held for its node");
    rig.connect("a", 1, 2);
    let answers = recovery.resume_claims(&node("a"), 2, &[claim(3)]).await;
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].outcome, Ok(3));
    let mut again = vec![
        reported(2, RunEventKind::text("one")),
        reported(3, RunEventKind::text("two")),
        reported(
            4,
            RunEventKind::Completed {
                finish_reason: "stop".into(),
                usage: None,
            },
        ),
    ];
    relay.node_events(&node("a"), 2, &mut again).await;
    assert_eq!(
        rig.published.of(run.id()),
        [
            (1, "started"),
            (2, "output"),
            (3, "output"),
            (4, "completed")
        ]
    );
    assert_eq!(relay.stats().dropped_duplicate(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_held_run_its_node_never_claims_ends_after_the_grace() {
    let (mut rig, placer, relay, recovery) = parts();
    let (_run, mut caller) = streamed_then_dropped(&mut rig, &placer, &relay, &recovery).await;
    let started = tokio::time::Instant::now();
    let mut last = None;
    while let Some(event) = caller.recv().await {
        last = Some(event);
    }
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "the resume grace"
    );
    match last.map(|e| e.kind.clone()) {
        Some(RunEventKind::Failed { code, .. }) => assert_eq!(code, "node_disconnected"),
        kind => panic!("ended with {kind:?}"),
    }
    let refused = recovery.resume_claims(&node("a"), 3, &[claim(3)]).await;
    assert_eq!(refused[0].outcome, Err(ResumeRefusal::UnknownRun));
}

#[tokio::test(start_paused = true)]
async fn a_stream_nobody_reads_again_is_cancelled_after_the_readers_grace() {
    let (mut rig, placer, relay, recovery) = parts();
    let (run, _caller) = rig.run(spec());
    relay.settle(placer.admit(&run).unwrap().1);
    recovery.reader_gone(run.id(), "client left").await;
    assert!(recovery.reader_back(run.id()), "a reader came back in time");
    recovery.reader_gone(run.id(), "client left").await;
    tokio::time::sleep(Duration::from_millis(999)).await;
    assert!(rig.sent.cancels().is_empty());
    tokio::time::sleep(Duration::from_millis(2)).await;
    assert_eq!(rig.sent.cancels(), [("a".into(), "run-1".into())]);
}
