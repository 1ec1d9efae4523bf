//! Tests of routing inside the run service: failover before the first output, circuit
//! breakers, availability and drain, the fair queue, priorities, per-key limits and
//! affinity — through the service's public API and the transport's calls, on paused time.

use std::num::NonZeroU32;

use super::*;
use crate::domain::routing::{
    AffinityKey, BreakerState, KeySource, LimitPolicy, LimitRefusal, Priority, TenantKey,
};
use crate::domain::{Availability, FailureClass};

fn routed(routing: RunRouting) -> RunSpec {
    RunSpec { routing, ..spec() }
}

fn tenant(name: &str, priority: Priority) -> RunSpec {
    routed(RunRouting {
        tenant: TenantKey::parse(name).unwrap(),
        priority,
        ..RunRouting::default()
    })
}

fn session(key: &str) -> RunSpec {
    routed(RunRouting {
        affinity: AffinityKey::from_client(KeySource::Session, key),
        ..RunRouting::default()
    })
}

impl Harness {
    /// The node run `run` is on now (the last it was sent to) and that node's connection.
    pub(super) fn holder(&self, run: &RunId) -> (String, ConnectionId) {
        let node = self.sent_to(run).last().unwrap().to_string();
        let connection = self.connections[&node];
        (node, connection)
    }

    /// The node holding `run` reports `kinds`, numbered from 1.
    pub(super) async fn holder_reports(
        &self,
        run: &RunId,
        kinds: impl IntoIterator<Item = RunEventKind>,
    ) {
        let (node, connection) = self.holder(run);
        self.report_each(&node, connection, run, kinds).await;
    }

    fn breaker(&self, node: &str) -> BreakerState {
        self.service.breaker_state(&node_id(node))
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_failure_before_output_is_retried_on_another_node() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(2));
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    let first = h.holder(&run).0;
    h.holder_reports(&run, [RunEventKind::Started, classed(FailureClass::Node)])
        .await;
    let second = h.holder(&run).0;
    assert_ne!(
        first, second,
        "a retry never goes back to the node that failed it"
    );
    h.holder_reports(&run, [RunEventKind::Started, output("ok"), completed()])
        .await;

    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, completed());
    let kinds: Vec<&str> = h.published(&run).iter().map(|e| e.kind.name()).collect();
    // The failed attempt's `started` was relayed; its failure was not.
    assert_eq!(kinds, ["started", "started", "output", "completed"]);
    assert_eq!(h.breaker(&first), BreakerState::Closed { failures: 1 });
    assert_eq!(h.active_runs(&first), 0);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_failover_inside_a_batch_drops_what_the_failed_attempt_sent_after() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(2));
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    let (first, connection) = h.holder(&run);
    let failed = [
        RunEventKind::Started,
        classed(FailureClass::Node),
        output("stale"),
    ];
    h.report_batch(&first, connection, &run, 1, failed).await;
    assert_ne!(first, h.holder(&run).0);
    assert_eq!(h.dropped_after_terminal(), 1);
    h.holder_reports(&run, [RunEventKind::Started, output("ok"), completed()])
        .await;

    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, completed());
    let published = h.published(&run);
    let kinds: Vec<&str> = published.iter().map(|e| e.kind.name()).collect();
    assert_eq!(kinds, ["started", "started", "output", "completed"]);
    assert_eq!(published[2].kind, output("ok"));
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn request_failures_output_and_cancels_are_never_retried() {
    let mut h = Harness::expecting(Expect::terminals(3).runs_sent(3));
    h.connect("a", 3).await;
    h.connect("b", 3).await;
    // The request itself is bad: final, and says nothing about the node.
    let mut bad = h.start(spec());
    let failed = classed(FailureClass::Request);
    h.holder_reports(&bad.run_id, [failed.clone()]).await;
    assert_eq!(h.assert_ended_once(&mut bad).kind, failed);
    // Output reached the caller: a second attempt would repeat it.
    let mut late = h.start(spec());
    let node_failure = classed(FailureClass::Node);
    h.holder_reports(&late.run_id, [output("half"), node_failure.clone()])
        .await;
    let counted_failure = counted(node_failure.clone(), 1);
    assert_eq!(h.assert_ended_once(&mut late).kind, counted_failure);
    // Cancelled by its caller: the node's failure while cancelling ends it.
    let mut cancelled = h.start(spec());
    h.service.cancel(&cancelled.run_id, "caller").await;
    h.holder_reports(&cancelled.run_id, [node_failure.clone()])
        .await;
    assert_eq!(h.assert_ended_once(&mut cancelled).kind, node_failure);
    for run in [&bad, &late, &cancelled] {
        assert_eq!(h.sent_to(&run.run_id).len(), 1);
    }
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn failover_stops_at_max_attempts_with_the_last_failure() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(3));
    for node in ["a", "b", "c", "d"] {
        h.connect(node, 1).await;
    }
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    for attempt in 1..=3 {
        let refused = classed(FailureClass::Refused);
        h.holder_reports(&run, [RunEventKind::Started, refused])
            .await;
        assert_eq!(h.sent_to(&run).len(), (attempt + 1).min(3));
    }
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, classed(FailureClass::Refused));
    let started: Vec<u32> = h
        .published(&run)
        .iter()
        .filter_map(|e| e.route.as_ref().map(|r| r.attempt))
        .collect();
    assert_eq!(started, [1, 2, 3]);
    // A refusal is not held against a node.
    for node in ["a", "b", "c", "d"] {
        assert_eq!(h.breaker(node), BreakerState::Closed { failures: 0 });
    }
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_failing_node_is_avoided_while_its_breaker_is_open_then_probed() {
    // The probe run waits out the breaker's 5 s cooldown in the queue.
    let waits_out_the_cooldown = RunsConfig {
        queue_timeout_ms: 10_000,
        ..config()
    };
    let mut h = Harness::new(waits_out_the_cooldown, Expect::default());
    let a = h.connect("a", 4).await;
    h.connect("b", 4).await;
    // Three node failures in a row on `a`, each failed over to `b`.
    for _ in 0..3 {
        let mut handle = h.start(RunSpec {
            selector: NodeSelector {
                pin: None,
                ..spec().selector
            },
            ..spec()
        });
        let run = handle.run_id.clone();
        while h.holder(&run).0 != "a" {
            // Least busy rotates; give `b`'s run back and try again.
            h.holder_reports(&run, [completed()]).await;
            h.assert_ended_once(&mut handle);
            handle = h.start(spec());
        }
        let run = handle.run_id.clone();
        h.report("a", a, &run, 1, classed(FailureClass::Node)).await;
        h.holder_reports(&run, [completed()]).await;
        h.assert_ended_once(&mut handle);
    }
    assert!(matches!(h.breaker("a"), BreakerState::Open { .. }));
    assert_eq!(h.service.open_breakers(), 1);
    // While open, every run goes to `b`.
    let mut held = Vec::new();
    for _ in 0..4 {
        let handle = h.start(spec());
        assert_eq!(h.sent_to(&handle.run_id), [node_id("b")]);
        held.push(handle);
    }
    // `b` is full: the next run waits, and after the cooldown it is `a`'s probe.
    let mut probe = h.start(spec());
    assert_eq!(h.service.queued_runs(), 1);
    sleep(Duration::from_millis(5_010)).await;
    assert_eq!(h.sent_to(&probe.run_id), [node_id("a")]);
    assert_eq!(h.breaker("a"), BreakerState::HalfOpen { probing: true });
    h.report("a", a, &probe.run_id, 1, completed()).await;
    h.assert_ended_once(&mut probe);
    assert_eq!(h.breaker("a"), BreakerState::Closed { failures: 0 });
    assert_eq!(h.service.open_breakers(), 0);
    for mut handle in held {
        h.holder_reports(&handle.run_id, [completed()]).await;
        h.assert_ended_once(&mut handle);
    }
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_node_without_the_target_available_gets_no_runs_until_it_reports_it() {
    let mut h = Harness::expecting(Expect::terminals(1).runs_sent(1));
    let a = h.connect("a", 1).await;
    let echo = AdapterName::parse(ADAPTER).unwrap();
    let nothing = Availability::new([]);
    assert!(h.registry.set_availability(&node_id("a"), a, nothing));
    let mut handle = h.start(spec());
    assert_eq!(h.service.waiting_by_cause(), [0, 1]);
    // The engine comes back: the heartbeat's report re-pumps the queue.
    let back = Availability::new([(echo, Target::parse(TARGET).unwrap())]);
    assert!(h.registry.set_availability(&node_id("a"), a, back));
    h.service.node_changed(&node_id("a"));
    assert_eq!(h.sent_to(&handle.run_id), [node_id("a")]);
    h.complete("a", a, &mut handle).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_drained_node_keeps_its_runs_and_gets_none_until_undrained() {
    let mut h = Harness::expecting(Expect::terminals(2).runs_sent(2));
    let a = h.connect("a", 2).await;
    let mut first = h.start(spec());
    assert!(h.service.set_drained(&node_id("a"), true));
    let mut second = h.start(spec());
    assert!(h.sent_to(&second.run_id).is_empty());
    h.complete("a", a, &mut first).await;
    assert!(h.service.set_drained(&node_id("a"), false));
    assert_eq!(h.sent_to(&second.run_id), [node_id("a")]);
    h.complete("a", a, &mut second).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_flooding_key_does_not_delay_another_beyond_a_slot_turnover() {
    let mut h = Harness::expecting(Expect::default());
    let a = h.connect("a", 1).await;
    let mut busy = h.start(tenant("flood", Priority::Interactive));
    let mut flood: Vec<RunHandle> = (0..5)
        .map(|_| h.start(tenant("flood", Priority::Interactive)))
        .collect();
    let mut other = h.start(tenant("other", Priority::Interactive));
    let mut batch = h.start(tenant("other", Priority::Batch));
    // One slot turnover: the other key's run goes next, ahead of four older flood runs.
    h.complete("a", a, &mut busy).await;
    assert_eq!(h.sent_to(&flood[0].run_id), [node_id("a")]);
    h.complete("a", a, &mut flood[0]).await;
    assert_eq!(h.sent_to(&other.run_id), [node_id("a")]);
    h.complete("a", a, &mut other).await;
    // Batch waits behind every interactive run.
    for handle in flood.iter_mut().skip(1) {
        assert!(h.sent_to(&batch.run_id).is_empty());
        h.complete("a", a, handle).await;
    }
    h.complete("a", a, &mut batch).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_key_over_its_limit_is_refused_with_a_retry_hint() {
    let mut h = Harness::expecting(Expect::terminals(2));
    let a = h.connect("a", 4).await;
    let limited = RunRouting {
        tenant: TenantKey::parse("small").unwrap(),
        limits: Some(LimitPolicy {
            max_concurrent: NonZeroU32::new(1),
            ..LimitPolicy::default()
        }),
        ..RunRouting::default()
    };
    let mut first = h.start(routed(limited.clone()));
    let refused = h.service.start(routed(limited.clone())).unwrap_err();
    let StartError::Limited(refusal @ LimitRefusal::Concurrency { .. }) = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(refusal.retry_after_secs(), 1);
    // Another key is not affected, and the first key may start again once its run ended.
    let mut other = h.start(spec());
    h.complete("a", a, &mut first).await;
    let mut again = h.start(routed(limited));
    h.complete("a", a, &mut other).await;
    h.complete("a", a, &mut again).await;
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn runs_of_one_session_stay_on_one_node() {
    let mut h = Harness::expecting(Expect::default());
    for node in ["a", "b", "c", "d"] {
        h.connect(node, 8).await;
    }
    let mut homes = Vec::new();
    for key in ["alice", "bob"] {
        let mut nodes = Vec::new();
        for _ in 0..4 {
            let mut handle = h.start(session(key));
            nodes.push(h.holder(&handle.run_id).0);
            h.holder_reports(&handle.run_id, [completed()]).await;
            h.assert_ended_once(&mut handle);
        }
        assert!(nodes.windows(2).all(|w| w[0] == w[1]), "{key}: {nodes:?}");
        homes.push(nodes[0].clone());
    }
    let mut handle = h.start(session("alice"));
    let route = h.published(&handle.run_id);
    assert!(route.is_empty(), "nothing relayed before the node speaks");
    h.holder_reports(&handle.run_id, [RunEventKind::Started, completed()])
        .await;
    let started = h.assert_ended_once(&mut handle);
    assert_eq!(started.kind, completed());
    let reason = h.published(&handle.run_id)[0].route.clone().unwrap();
    assert_eq!(reason.label(), "affinity_hit");
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_token_budget_admits_while_used_and_reserved_are_under_it() {
    use crate::domain::Usage;
    use crate::domain::routing::{BudgetClaim, BudgetWindow, TokenBudget};
    let mut h = Harness::expecting(Expect::terminals(3));
    let a = h.connect("a", 8).await;
    let budgeted = RunRouting {
        tenant: TenantKey::parse("metered").unwrap(),
        budget: Some(BudgetClaim {
            budget: TokenBudget {
                per_day: Some(100),
                per_month: None,
                default_reserve: 0,
            },
            reserve: 40,
        }),
        ..RunRouting::default()
    };
    // Reserved 0, then 40, then 80: three open runs; a fourth would make 120.
    let mut open: Vec<RunHandle> = (0..3).map(|_| h.start(routed(budgeted.clone()))).collect();
    let refused = h.service.start(routed(budgeted.clone())).unwrap_err();
    let StartError::Limited(LimitRefusal::Budget {
        window: BudgetWindow::Day,
        limit: 100,
        ..
    }) = refused
    else {
        panic!("{refused:?}");
    };
    // The first ends having used 95 tokens: used 95 + reserved 80 is over; still refused.
    let used = RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage::new(90, 5)),
    };
    h.report("a", a, &open[0].run_id, 1, used).await;
    h.assert_ended_once(&mut open[0]);
    assert!(h.service.start(routed(budgeted.clone())).is_err());
    // The others end having used nothing: 95 < 100, one more is admitted.
    for handle in &mut open[1..] {
        h.complete("a", a, handle).await;
    }
    let mut last = h.start(routed(budgeted.clone()));
    assert!(
        h.service.start(routed(budgeted)).is_err(),
        "95 + 40 reserved"
    );
    h.complete("a", a, &mut last).await;
    h.finish().await;
}
