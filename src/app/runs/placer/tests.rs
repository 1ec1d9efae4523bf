//! The placer on its own: admission, the queue, retiring, failover and the breaker's
//! cooldown, checked by the table it keeps, the commands it sends and the effects it hands
//! back — with no relay and no `RunService`.

use std::sync::Arc;

use crate::app::runs::parts_rig::{Rig, effects, node, spec};
use crate::domain::routing::WaitCause;
use crate::domain::{FailureClass, RunEventKind};
use crate::ports::{Placed, StartError};

fn node_failure() -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: "engine_down".into(),
        message: "the engine is down".into(),
        class: FailureClass::Node,
        status: None,
        usage: None,
    }
}

#[tokio::test(start_paused = true)]
async fn a_run_is_placed_on_a_free_node_and_waits_when_none_is() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let placer = rig.placer();
    let (first, _) = rig.run(spec());
    let (placed, fallout) = placer.admit(&first).unwrap();
    assert_eq!(placed, Placed::Sent(node("a")));
    assert_eq!(effects(fallout), ["send run-1 to a"]);
    let (second, _) = rig.run(spec());
    let (placed, fallout) = placer.admit(&second).unwrap();
    assert_eq!(placed, Placed::Waiting(WaitCause::AllBusy));
    assert_eq!(effects(fallout), ["wait run-2"]);
    assert_eq!((placer.open_runs(), placer.queued_runs()), (2, 1));
    assert!(
        rig.sent.runs().is_empty(),
        "the placer sends nothing until asked to"
    );
}

#[tokio::test(start_paused = true)]
async fn retiring_a_run_hands_its_slot_to_the_queue() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let placer = rig.placer();
    let (first, _) = rig.run(spec());
    let (second, _) = rig.run(spec());
    drop(placer.admit(&first).unwrap());
    drop(placer.admit(&second).unwrap());
    let fallout = placer.retire(&first, 0);
    assert_eq!(effects(fallout), ["send run-2 to a"]);
    assert_eq!((placer.open_runs(), placer.queued_runs()), (1, 0));
    placer.send(&second, &node("a")).unwrap();
    assert_eq!(rig.sent.runs(), [("a".into(), "run-2".into())]);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_or_displaces() {
    let mut rig = Rig::new();
    let placer = rig.placer();
    for _ in 0..2 {
        let (run, _) = rig.run(spec());
        drop(placer.admit(&run).unwrap());
    }
    let (third, _) = rig.run(spec());
    let Err(refused) = placer.admit(&third) else {
        panic!("a third run fit in a queue of two");
    };
    assert!(
        matches!(refused, StartError::QueueFull { capacity: 2, .. }),
        "{refused:?}"
    );
    assert_eq!(placer.open_runs(), 2, "a refused run is not entered");
}

#[tokio::test(start_paused = true)]
async fn a_failed_attempt_moves_to_a_node_it_has_not_tried() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    rig.connect("b", 1, 2);
    let placer = rig.placer();
    let (run, _) = rig.run(spec());
    let (placed, _) = placer.admit(&run).unwrap();
    let Placed::Sent(first) = placed else {
        panic!("placed: {placed:?}");
    };
    let mut failed = node_failure();
    let (moved, fallout) = placer.fail_over(&run, None, &mut failed, true);
    assert!(moved);
    let other = if first == node("a") { "b" } else { "a" };
    assert_eq!(effects(fallout), [format!("send run-1 to {other}")]);
    let mut again = node_failure();
    let (moved, fallout) = placer.fail_over(&run, None, &mut again, true);
    assert!(!moved, "two attempts is the rig's most");
    assert!(effects(fallout).is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_breaker_that_opens_asks_for_a_pump_after_its_cooldown() {
    let mut rig = Rig::new();
    rig.connect("a", 1, 1);
    let placer = rig.placer();
    let mut asked = Vec::new();
    // The default breaker opens after consecutive node failures.
    for _ in 0..10 {
        let (run, _) = rig.run(spec());
        if placer.admit(&run).is_err() {
            break;
        }
        let mut failed = node_failure();
        let (_, fallout) = placer.fail_over(&run, None, &mut failed, true);
        asked.extend(effects(fallout));
        asked.extend(effects(placer.retire(&run, 0)));
        if placer.open_breakers() > 0 {
            break;
        }
    }
    assert_eq!(placer.open_breakers(), 1);
    assert!(
        asked.iter().any(|effect| effect.starts_with("pump after")),
        "{asked:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_cancel_takes_a_queued_run_out_and_a_drain_empties_the_queue() {
    let mut rig = Rig::new();
    let placer = rig.placer();
    let (queued, _) = rig.run(spec());
    let (other, _) = rig.run(spec());
    drop(placer.admit(&queued).unwrap());
    drop(placer.admit(&other).unwrap());
    assert!(placer.cancelling(&queued, "caller left"));
    assert_eq!(placer.queued_runs(), 1);
    rig.stopping.cancel();
    assert!(placer.is_draining());
    assert_eq!(placer.left_open().len(), 2);
    assert_eq!(placer.queued_runs(), 0);
    assert!(Arc::strong_count(&queued) >= 1);
}

/// A run of key `team-a` as admission routes it: a budget of 100 tokens a day, reserving
/// all of it, and one run at a time.
fn keyed_spec() -> crate::domain::RunSpec {
    use std::num::NonZeroU32;

    use crate::domain::routing::{BudgetClaim, LimitPolicy, TenantKey, TokenBudget};

    let mut keyed = spec();
    keyed.routing.tenant = TenantKey::parse("team-a").unwrap();
    keyed.routing.limits = Some(LimitPolicy {
        max_concurrent: NonZeroU32::new(1),
        ..LimitPolicy::default()
    });
    keyed.routing.budget = Some(BudgetClaim {
        budget: TokenBudget {
            per_day: Some(100),
            per_month: None,
            default_reserve: 0,
        },
        reserve: 100,
    });
    keyed
}

#[tokio::test(start_paused = true)]
async fn a_taken_back_run_holds_its_keys_reservation_and_place_until_it_ends_once() {
    use crate::app::runs::delivery::Delivery;
    use crate::app::runs::run::{Run, accepted};
    use crate::domain::RunId;
    use crate::domain::routing::{LimitRefusal, TenantKey};

    let mut rig = Rig::new();
    rig.connect("a", 1, 8);
    let placer = rig.placer();
    let team_a = TenantKey::parse("team-a").unwrap();
    let keyed = keyed_spec();
    // A run admitted before a restart (its record says it reserved 100), taken back.
    let id = RunId::new("run-taken-back");
    let record = accepted(&id, &keyed);
    assert_eq!(record.budget_reserve, Some(100));
    let (caller, _events) = tokio::sync::mpsc::channel(1);
    let now = tokio::time::Instant::now();
    let delivery = Delivery::new(caller);
    let taken_back = Arc::new(Run::new(
        id,
        keyed.clone(),
        record,
        delivery,
        tracing::Span::none(),
        now,
    ));
    placer.take_back(&taken_back, None);
    assert_eq!(placer.budget_state(&team_a), (0, 0, 100), "reserved again");

    // The key's next run finds it: one open already, 100 reserved.
    let (next, _) = rig.run(keyed.clone());
    let refused = placer.admit(&next).map(|_| ()).unwrap_err();
    assert!(
        matches!(
            refused,
            StartError::Limited(LimitRefusal::Concurrency { .. })
        ),
        "{refused:?}"
    );
    let mut budget_only = keyed.clone();
    budget_only.routing.limits = None;
    let (next, _) = rig.run(budget_only.clone());
    let refused = placer.admit(&next).map(|_| ()).unwrap_err();
    assert!(
        matches!(refused, StartError::Limited(LimitRefusal::Budget { .. })),
        "{refused:?}"
    );

    // It ends having used 12 tokens: settled once, its place freed.
    let _ = placer.retire(&taken_back, 12);
    let _ = placer.retire(&taken_back, 12);
    assert_eq!(placer.budget_state(&team_a), (12, 12, 0), "settled once");
    let (next, _) = rig.run(keyed);
    assert!(placer.admit(&next).is_ok(), "admitted once it ended");
}
