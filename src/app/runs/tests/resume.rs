//! Tests of resume inside the run service: a run whose node's connection drops after it
//! produced output is detached, and re-attached when the node registers again and claims
//! it — or ends `node_disconnected` when the grace expires, the node does not claim it or
//! its claim cannot be resumed from; cancels and deadlines while detached. Through the
//! service's public API and the transport's calls, on paused time.

use super::*;
use crate::domain::ResumeRefusal;

fn claim(run: &RunId, next_seq: u64, first_buffered_seq: u64) -> ResumeClaim {
    ResumeClaim {
        run_id: run.as_str().to_owned(),
        next_seq,
        first_buffered_seq,
    }
}

fn answer(run: &RunId, outcome: Result<u64, ResumeRefusal>) -> ResumeAnswer {
    ResumeAnswer {
        run_id: run.as_str().to_owned(),
        outcome,
    }
}

/// The kinds and seqs of the events published for `run`.
fn numbered(h: &Harness, run: &RunId) -> Vec<(u64, RunEventKind)> {
    h.published(run)
        .iter()
        .map(|e| (e.seq, e.kind.clone()))
        .collect()
}

impl Harness {
    /// Node `id` registers as a node that may resume, with no claims, and runs one run,
    /// which reports `started` and `outputs` outputs; returns the connection and the run.
    async fn streaming(&mut self, id: &str, outputs: usize) -> (ConnectionId, RunHandle) {
        let (connection, _) = self.resume(id, 3, &[]).await;
        let handle = self.start(pinned(id));
        let kinds = std::iter::once(RunEventKind::Started)
            .chain((1..=outputs).map(|n| output(&format!("out-{n}"))));
        self.report_each(id, connection, &handle.run_id, kinds)
            .await;
        (connection, handle)
    }

    fn dropped_duplicate(&self) -> u64 {
        self.service.stats().dropped_duplicate()
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_resumed_within_the_grace_continues_with_nothing_lost_or_repeated() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1).cancels_sent(0));
    let (_, mut handle) = h.streaming("a", 2).await;
    let run = handle.run_id.clone();

    h.disconnect("a").await;
    // Held: no terminal event, the caller's stream stays open, the run stays in the table.
    sleep(Duration::from_millis(1_500)).await;
    assert_eq!(h.service.open_runs(), 1);
    assert_eq!(handle.events.len(), 3);
    assert!(!handle.events.is_closed());

    // The node produced 1..=4 meanwhile and still holds 2..=4; the edge relayed 1..=3.
    let (a, answers) = h.resume("a", 2, &[claim(&run, 5, 2)]).await;
    assert_eq!(answers, [answer(&run, Ok(4))]);
    assert_eq!(h.active_runs("a"), 1);
    // A node that sends from too early has its repeats dropped.
    h.report("a", a, &run, 2, output("out-1")).await;
    h.report("a", a, &run, 3, output("out-2")).await;
    h.report("a", a, &run, 4, output("out-3")).await;
    h.report("a", a, &run, 5, completed()).await;
    assert_eq!(h.dropped_duplicate(), 2);

    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.origin, EventOrigin::Node);
    let mut expected = vec![(1, RunEventKind::Started)];
    expected.extend((2..=4).map(|n| (n, output(&format!("out-{}", n - 1)))));
    expected.push((5, completed()));
    assert_eq!(numbered(&h, &run), expected);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_not_resumed_within_the_grace_fails_node_disconnected() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let (_, mut handle) = h.streaming("a", 1).await;
    let run = handle.run_id.clone();
    h.disconnect("a").await;

    sleep(Duration::from_millis(1_990)).await;
    assert_eq!(h.service.open_runs(), 1);
    sleep(Duration::from_millis(20)).await;
    let terminal = h.assert_edge_failed(&mut handle, "node_disconnected");
    assert_eq!(terminal.seq, 3);
    assert_eq!(terminal.node, Some(node_id("a")));

    // Too late: the node's claim finds nothing, and it stops the run.
    let (_, answers) = h.resume("a", 2, &[claim(&run, 4, 3)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::UnknownRun))]);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_that_comes_back_without_claiming_a_run_ends_it_at_once() {
    let mut h = Harness::expecting(Expect::terminals(2));
    let (a, mut kept) = h.streaming("a", 1).await;
    let mut dropped = h.start(pinned("a"));
    h.report_each("a", a, &dropped.run_id, [output("x")]).await;
    h.disconnect("a").await;
    assert_eq!(h.service.open_runs(), 2);

    let (a, answers) = h.resume("a", 2, &[claim(&kept.run_id, 3, 3)]).await;
    assert_eq!(answers, [answer(&kept.run_id, Ok(3))]);
    // Not claimed: the node no longer has it. It ends now, not after the grace.
    h.assert_edge_failed(&mut dropped, "node_disconnected");
    assert_eq!(h.active_runs("a"), 1);

    h.report("a", a, &kept.run_id, 3, completed()).await;
    assert_eq!(h.assert_ended_once(&mut kept).kind, completed());
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn claims_that_cannot_be_resumed_from_end_their_runs() {
    let mut h = Harness::expecting(Expect::terminals(2));
    let (a, mut behind) = h.streaming("a", 2).await;
    let mut lost = h.start(pinned("a"));
    h.report_each("a", a, &lost.run_id, [output("x"), output("y")])
        .await;
    h.disconnect("a").await;

    // The edge relayed 1..=3 of `behind` and 1..=2 of `lost`.
    let claims = [
        // Says it made only one event: its numbering cannot be trusted.
        claim(&behind.run_id, 2, 1),
        // Made 1..=5 but keeps only 4..=5: event 3 is gone.
        claim(&lost.run_id, 6, 4),
    ];
    let (_, answers) = h.resume("a", 2, &claims).await;
    assert_eq!(
        answers,
        [
            answer(&behind.run_id, Err(ResumeRefusal::SequenceBehind)),
            answer(&lost.run_id, Err(ResumeRefusal::EventsLost)),
        ]
    );
    let terminal = h.assert_edge_failed(&mut behind, "node_disconnected");
    assert_eq!(terminal.seq, 4);
    h.assert_edge_failed(&mut lost, "node_disconnected");
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn another_node_cannot_claim_a_run() {
    let mut h = Harness::expecting(Expect::terminals(1));
    let (_, mut handle) = h.streaming("a", 1).await;
    let run = handle.run_id.clone();
    // Attached to a: b's claim changes nothing.
    let (_, answers) = h.resume("b", 1, &[claim(&run, 3, 1)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::UnknownRun))]);
    h.disconnect("a").await;
    // Detached from a: still b's claim changes nothing.
    h.disconnect("b").await;
    let (b, answers) = h.resume("b", 1, &[claim(&run, 3, 1)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::UnknownRun))]);
    assert_eq!(h.active_runs("b"), 0);
    h.report("b", b, &run, 3, completed()).await;
    assert_eq!(h.dropped_unknown_run(), 1);
    assert_eq!(h.service.open_runs(), 1);

    // Its own node does not come back: the grace ends it as usual.
    sleep(Duration::from_millis(2_010)).await;
    h.assert_edge_failed(&mut handle, "node_disconnected");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_detached_reaches_the_node_when_it_resumes() {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(1));
    let (_, mut handle) = h.streaming("a", 1).await;
    let run = handle.run_id.clone();
    h.disconnect("a").await;

    assert!(h.service.cancel(&run, "caller").await);
    // Nobody to tell yet.
    assert!(h.cancels(&run).is_empty());
    sleep(Duration::from_millis(200)).await;
    let (a, answers) = h.resume("a", 2, &[claim(&run, 3, 1)]).await;
    assert_eq!(answers, [answer(&run, Ok(3))]);
    assert_eq!(h.cancels(&run), [(node_id("a"), "caller".to_owned())]);

    h.report("a", a, &run, 3, cancelled("caller")).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, counted(cancelled("caller"), 1));
    assert_eq!(terminal.origin, EventOrigin::Node);
    assert_eq!(h.active_runs("a"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_cancel_while_detached_ends_the_run_after_the_cancel_grace() {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(0));
    let (_, mut handle) = h.streaming("a", 1).await;
    let run = handle.run_id.clone();
    h.disconnect("a").await;

    assert!(h.service.cancel(&run, "caller").await);
    sleep(Duration::from_millis(510)).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, counted(cancelled("caller"), 1));
    assert_eq!(terminal.origin, EventOrigin::Edge);

    let (_, answers) = h.resume("a", 2, &[claim(&run, 3, 1)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::UnknownRun))]);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn the_deadline_keeps_counting_while_detached() {
    let mut h = Harness::expecting(Expect::terminals(1).cancels_sent(0));
    let (connection, _) = h.resume("a", 1, &[]).await;
    let mut handle = h.start(with_deadline(Duration::from_millis(1_500)));
    let run = handle.run_id.clone();
    h.report_each("a", connection, &run, [output("x")]).await;
    sleep(Duration::from_millis(1_000)).await;
    h.disconnect("a").await;

    // The deadline passes within the resume grace: it ends the run.
    sleep(Duration::from_millis(510)).await;
    let terminal = h.assert_edge_failed(&mut handle, "deadline_exceeded");
    assert_eq!(terminal.seq, 2);
    let (_, answers) = h.resume("a", 1, &[claim(&run, 2, 1)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::UnknownRun))]);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_takeover_claims_runs_still_on_the_old_connection_and_resends_one_never_received() {
    let mut h = Harness::expecting(Expect::terminals(3).runs_sent(4));
    let (old, mut kept) = h.streaming("a", 1).await;
    // Sent, but lost with the old connection before the node saw it: nothing relayed.
    let mut unseen = h.start(spec());
    // Started on the old connection, then lost by the node: not claimed, it fails over.
    let mut started = h.start(spec());
    h.report("a", old, &started.run_id, 1, RunEventKind::Started)
        .await;
    let b = h.connect("b", 1).await;

    // The node's new connection takes over before the edge has seen the old one close.
    let (new, answers) = h.resume("a", 3, &[claim(&kept.run_id, 3, 3)]).await;
    assert_eq!(answers, [answer(&kept.run_id, Ok(3))]);
    assert_eq!(h.sent_to(&unseen.run_id), [node_id("a"), node_id("a")]);
    assert_eq!(h.sent_to(&started.run_id), [node_id("a"), node_id("b")]);
    assert_eq!(h.active_runs("a"), 2);
    // The old connection's last words and its close change nothing.
    h.report("a", old, &kept.run_id, 3, output("stale")).await;
    h.close("a", old, true).await;
    assert_eq!(h.service.open_runs(), 3);

    h.report("a", new, &kept.run_id, 3, completed()).await;
    assert_eq!(h.assert_ended_once(&mut kept).kind, completed());
    h.report("a", new, &unseen.run_id, 1, completed()).await;
    assert_eq!(h.assert_ended_once(&mut unseen).kind, completed());
    h.report("b", b, &started.run_id, 1, completed()).await;
    assert_eq!(h.assert_ended_once(&mut started).kind, completed());
    assert_eq!(h.active_runs("a"), 0);
    assert_eq!(h.active_runs("b"), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_without_output_fails_over_at_once_and_a_v1_node_is_not_waited_for() {
    let mut h = Harness::expecting(Expect::terminals(2));
    // Resumable, but nothing reached the caller: placed again at once.
    let (a, _) = h.resume("a", 1, &[]).await;
    let mut quiet = h.start(spec());
    h.report("a", a, &quiet.run_id, 1, RunEventKind::Started)
        .await;
    h.disconnect("a").await;
    assert_eq!(h.service.queued_runs(), 1);
    let b = h.connect("b", 1).await;
    h.report("b", b, &quiet.run_id, 1, completed()).await;
    h.assert_ended_once(&mut quiet);

    // A v1 node cannot claim anything: its runs end as soon as it leaves.
    let mut v1 = h.start(spec());
    h.report("b", b, &v1.run_id, 1, output("x")).await;
    h.disconnect("b").await;
    h.assert_edge_failed(&mut v1, "node_disconnected");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn with_resume_off_runs_fail_at_once_and_claims_are_refused() {
    let mut h = Harness::new(
        RunsConfig {
            resume_grace_ms: 0,
            ..config()
        },
        Expect::terminals(1),
    );
    let (_, mut handle) = h.streaming("a", 1).await;
    let run = handle.run_id.clone();
    h.disconnect("a").await;
    h.assert_edge_failed(&mut handle, "node_disconnected");
    let (_, answers) = h.resume("a", 2, &[claim(&run, 3, 1)]).await;
    assert_eq!(answers, [answer(&run, Err(ResumeRefusal::Disabled))]);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_no_other_node_could_take_is_held_even_without_output() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1));
    // Pinned to a: failover has nowhere to go, so the run waits for a like one with output.
    let (_, mut handle) = h.streaming("a", 0).await;
    let run = handle.run_id.clone();
    h.disconnect("a").await;
    assert_eq!(h.service.open_runs(), 1);
    assert_eq!(h.service.queued_runs(), 0);

    let (a, answers) = h.resume("a", 2, &[claim(&run, 2, 2)]).await;
    assert_eq!(answers, [answer(&run, Ok(2))]);
    h.report_each(
        "a",
        a,
        &run,
        [RunEventKind::Started, output("late"), completed()],
    )
    .await;
    assert_eq!(h.dropped_duplicate(), 1);
    let kinds: Vec<_> = numbered(&h, &run).into_iter().map(|(_, k)| k).collect();
    assert_eq!(kinds, [RunEventKind::Started, output("late"), completed()]);
    h.assert_ended_once(&mut handle);
    h.finish().await;
}

/// A node's ping is answered (the node may forget the events read before it) only once the
/// journal holds them where a takeover finds them: a member of a site that stopped writing
/// the site's stream — stood down, or fenced — answers none, or a run its client saw
/// complete would be unknown to the member that takes over (found by the nemesis, seed 66,
/// issue 66).
#[tokio::test]
async fn a_ping_is_answered_only_while_the_journal_keeps_events_for_a_takeover() {
    for (kept, answered) in [(true, true), (false, false)] {
        let mut journal = crate::ports::journal::MockRunJournal::new();
        journal.expect_enabled().return_const(true);
        journal.expect_flush().return_const(());
        journal.expect_kept_for_takeover().return_const(kept);
        let service = RunService::with_journal(
            Arc::new(LockRegistry::new()),
            Arc::new(MockNodeTransport::new()),
            Arc::new(MockEventSink::new()),
            Arc::new(journal),
            config(),
            routing(&config(), &RoutingConfig::default()),
            &opentelemetry::global::meter("edge-test"),
        );
        assert_eq!(
            service.events_kept().await,
            answered,
            "kept for a takeover: {kept}"
        );
    }
}
