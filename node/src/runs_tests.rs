//! Tests of the run table: flow control, buffer bounds, resume claims and answers.

use edge::client::NodeFrame;
use edge::domain::{ResumeRefusal, Usage};

use super::*;

fn limits() -> BufferLimits {
    BufferLimits {
        window: 4,
        keep_sent: 2,
        run_events: 6,
        total_bytes: 1 << 20,
    }
}

fn seqs(unsent: &Unsent) -> Vec<(String, u64)> {
    unsent
        .frames
        .iter()
        .map(|frame| match frame {
            NodeFrame::RunEvent(event) => (event.run_id.clone(), event.seq),
            other => panic!("expected a run event, got {other:?}"),
        })
        .collect()
}

fn text(n: u64) -> RunEventKind {
    RunEventKind::text(format!("t{n}"))
}

fn done() -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: None,
    }
}

#[tokio::test]
async fn admission_counts_running_runs_and_refuses_while_draining() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (a, _sa) = table.admit("a", 2).expect("a");
    let _b = table.admit("b", 2).expect("b");
    assert_eq!(table.admit("c", 2).err(), Some(Refusal::Busy));
    assert_eq!(table.admit("a", 9).err(), Some(Refusal::Duplicate));
    a.emit(done()).await.expect("a ends");
    assert_eq!(table.running(), 1);
    let _c = table.admit("c", 2).expect("a slot is free again");
    table.set_draining();
    assert_eq!(table.admit("d", 9).err(), Some(Refusal::Draining));
}

#[tokio::test]
async fn events_go_out_in_order_and_delivered_runs_retire() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    run.emit(RunEventKind::Started).await.expect("emit");
    run.emit(text(2)).await.expect("emit");
    assert_eq!(
        seqs(&table.take_unsent(1, 100)),
        [("r".into(), 1), ("r".into(), 2)]
    );
    run.emit(done()).await.expect("emit");
    let last = table.take_unsent(2, 100);
    assert!(last.terminal);
    assert_eq!(seqs(&last), [("r".into(), 3)]);
    // An edge that never acknowledged: delivered means written.
    assert!(table.is_empty());
    assert_eq!(run.emit(text(9)).await, Err(Gone));
}

#[tokio::test]
async fn with_an_acking_edge_finished_runs_stay_until_acknowledged() {
    let table = RunTable::new(limits());
    table.link_up(false);
    table.acknowledged(0);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    run.emit(done()).await.expect("emit");
    table.take_unsent(7, 100);
    assert!(!table.is_empty());
    table.acknowledged(6);
    assert!(!table.is_empty());
    table.acknowledged(7);
    assert!(table.is_empty());
}

#[tokio::test]
async fn an_edge_that_says_it_acknowledges_keeps_a_run_ending_before_the_first_ack() {
    let table = RunTable::new(limits());
    // The first connection: no ack seen yet, but the edge said it answers every ping.
    table.link_up(true);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    run.emit(done()).await.expect("emit");
    table.take_unsent(1, 100);
    // Written, not acknowledged: a cut now must not lose the ending, so the run is kept
    // and claimed on the next connection.
    assert!(!table.is_empty());
    table.link_down();
    assert!(!table.is_empty());
    table.link_up(true);
    table.acknowledged(0);
    assert!(!table.is_empty());
}

#[tokio::test]
async fn an_edge_that_acknowledged_before_is_trusted_to_on_the_next_connection() {
    let table = RunTable::new(limits());
    table.link_up(false);
    table.acknowledged(0);
    table.link_down();
    // Reconnected; the run ends before this connection's first ack.
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    run.emit(done()).await.expect("emit");
    table.take_unsent(1, 100);
    // Kept: a cut now would lose the terminal event, and the node must claim the run.
    assert!(!table.is_empty());
    table.link_down();
    let claims = table.claims();
    assert_eq!(claims.len(), 1);
    assert_eq!((claims[0].next_seq, claims[0].first_buffered_seq), (2, 1));
}

#[tokio::test]
async fn a_connected_run_waits_when_it_is_a_window_ahead() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    for n in 1..=4 {
        run.emit(text(n)).await.expect("within the window");
    }
    let blocked = tokio::spawn({
        let run = run.clone();
        async move { run.emit(text(5)).await }
    });
    tokio::task::yield_now().await;
    assert!(!blocked.is_finished());
    assert_eq!(table.take_unsent(1, 100).frames.len(), 4);
    assert_eq!(blocked.await.expect("joins"), Ok(()));
}

#[tokio::test]
async fn a_detached_run_buffers_up_to_its_bound_then_is_given_up() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, mut signal) = table.admit("r", 1).expect("admitted");
    table.link_down();
    for n in 1..=6 {
        run.emit(text(n))
            .await
            .expect("buffered while disconnected");
    }
    assert_eq!(run.emit(text(7)).await, Err(Gone));
    assert_eq!(signal.stopped().await, Stop::Forget);
    assert!(table.claims().is_empty(), "a given-up run is not claimed");
}

#[tokio::test]
async fn the_total_bound_gives_up_the_run_that_crosses_it() {
    let table = RunTable::new(BufferLimits {
        total_bytes: 400,
        ..limits()
    });
    table.link_up(false);
    let (a, _sa) = table.admit("a", 2).expect("a");
    let (b, _sb) = table.admit("b", 2).expect("b");
    table.link_down();
    a.emit(RunEventKind::text("x".repeat(250)))
        .await
        .expect("fits");
    assert_eq!(b.emit(RunEventKind::text("y".repeat(250))).await, Err(Gone));
    let claimed: Vec<String> = table.claims().into_iter().map(|c| c.run_id).collect();
    assert_eq!(claimed, ["a"]);
}

#[tokio::test]
async fn claims_name_the_next_seq_and_the_oldest_buffered_event() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    for n in 1..=5 {
        run.emit(text(n)).await.expect("emit");
        table.take_unsent(n, 100);
    }
    // Connected, the last `keep_sent` (2) sent events stay.
    table.link_down();
    run.emit(text(6)).await.expect("buffered");
    let claims = table.claims();
    assert_eq!(
        claims,
        [ResumeClaim {
            run_id: "r".into(),
            next_seq: 7,
            first_buffered_seq: 4
        }]
    );
}

#[tokio::test]
async fn an_accepted_claim_resends_from_the_edges_seq_then_goes_on() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    for n in 1..=3 {
        run.emit(text(n)).await.expect("emit");
    }
    table.take_unsent(1, 100);
    table.link_down();
    run.emit(text(4)).await.expect("buffered");
    let claims = table.claims();
    table.link_up(false);
    let answers = [ResumeAnswer {
        run_id: "r".into(),
        outcome: Ok(3),
    }];
    assert_eq!(
        table.apply_answers(&claims, &answers),
        Resumed {
            accepted: 1,
            refused: 0
        }
    );
    run.emit(text(5)).await.expect("goes on");
    let sent: Vec<u64> = seqs(&table.take_unsent(2, 100))
        .into_iter()
        .map(|(_, seq)| seq)
        .collect();
    assert_eq!(sent, [3, 4, 5]);
}

#[tokio::test]
async fn refused_and_unanswered_claims_stop_their_runs() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (a, mut stop_a) = table.admit("a", 3).expect("a");
    let (_b, mut stop_b) = table.admit("b", 3).expect("b");
    let (_c, mut stop_c) = table.admit("c", 3).expect("c");
    a.emit(text(1)).await.expect("emit");
    table.link_down();
    let claims = table.claims();
    let answers = [
        ResumeAnswer {
            run_id: "a".into(),
            outcome: Err(ResumeRefusal::EventsLost),
        },
        // A seq the node no longer holds (it never sent 1? it did, but 0 is invalid).
        ResumeAnswer {
            run_id: "c".into(),
            outcome: Ok(0),
        },
    ];
    table.link_up(false);
    assert_eq!(
        table.apply_answers(&claims, &answers),
        Resumed {
            accepted: 0,
            refused: 3
        }
    );
    for signal in [&mut stop_a, &mut stop_b, &mut stop_c] {
        assert_eq!(signal.stopped().await, Stop::Forget);
    }
    assert!(table.is_empty());
    assert_eq!(a.emit(text(2)).await, Err(Gone));
}

#[tokio::test]
async fn refusals_are_one_terminal_event_and_cancels_reach_the_run() {
    let table = RunTable::new(limits());
    table.link_up(false);
    table.refuse("x", RunEventKind::failed("node_busy", "busy"));
    assert_eq!(seqs(&table.take_unsent(1, 100)), [("x".into(), 1)]);
    let (_run, mut signal) = table.admit("r", 1).expect("admitted");
    assert!(table.stop("r", Stop::Cancel("caller".into())));
    assert!(!table.stop("unknown", Stop::Shutdown));
    table.stop_all(&Stop::Shutdown);
    assert_eq!(signal.stopped().await, Stop::Cancel("caller".into()));
}

#[tokio::test]
async fn a_run_reports_what_it_produced_when_it_fails_or_is_cancelled() {
    let table = RunTable::new(limits());
    table.link_up(false);
    let (run, _signal) = table.admit("r", 1).expect("admitted");
    assert_eq!(run.produced(), None, "nothing produced yet");
    run.emit(RunEventKind::Started).await.expect("emit");
    assert_eq!(run.produced(), None, "`started` is no output");
    run.emit(text(2)).await.expect("emit");
    run.emit(text(3)).await.expect("emit");
    // One output token per generated piece; the input is not known.
    let cancelled = run.with_produced(RunEventKind::cancelled("client_disconnected"));
    assert_eq!(cancelled.usage(), Some(Usage::new(0, 2)));
    // The engine's own counts, once it sent them, give the input side.
    let engine = Usage {
        input_tokens: 12,
        cached_input_tokens: 8,
        output_tokens: 3,
        reasoning_tokens: 0,
    };
    run.engine_counted(engine);
    let failed = run.with_produced(RunEventKind::failed("engine_error", "broke"));
    assert_eq!(failed.usage(), Some(engine));
    // A terminal event with usage of its own keeps it; a completion is left alone.
    let own = RunEventKind::Cancelled {
        reason: "x".into(),
        usage: Some(Usage::new(1, 1)),
    };
    assert_eq!(run.with_produced(own).usage(), Some(Usage::new(1, 1)));
    assert_eq!(run.with_produced(done()).usage(), None);
}
