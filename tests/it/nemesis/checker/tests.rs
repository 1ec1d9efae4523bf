//! The checker checked: a clean history passes, and histories with a planted loss, a
//! duplicate execution and a false completion (shown completed, never finished by the
//! engine or unknown to the site) are each caught, naming the property and the operation.

use super::*;
use crate::nemesis::history::{Convergence, Fault, Record};

const TEXT: &str = " Hello from the tiny test model.";

fn execution(finished: bool) -> Execution {
    Execution {
        engine: 0,
        text: if finished { TEXT } else { " Hello" }.to_owned(),
        finished,
        input_tokens: 9,
        output_tokens: if finished { 8 } else { 0 },
    }
}

fn op(n: u64, outcome: Outcome) -> Op {
    Op {
        op: n,
        client: 0,
        key: "load".into(),
        start_ms: 100 * n,
        end_ms: 100 * n + 900,
        attempts: vec![
            Attempt::NoAnswer {
                prompt: format!("op {n} attempt 0"),
            },
            Attempt::Accepted {
                prompt: format!("op {n} attempt 1"),
                run_id: format!("run-{n}"),
            },
        ],
        outcome,
        resumes: 1,
        disordered: false,
    }
}

fn completed() -> Outcome {
    Outcome::Completed {
        text: TEXT.to_owned(),
    }
}

/// Three operations completed once each, across a takeover; the site converged.
fn clean() -> History {
    let mut history = History {
        seed: 7,
        duration_ms: 5_000,
        convergence: Convergence {
            after_ms: Some(1_200),
            bound_ms: 30_000,
            missing: String::new(),
        },
        faults: vec![Fault {
            at_ms: 150,
            kind: "kill-member".into(),
            target: "m1".into(),
            healed_ms: 700,
            converged_ms: Some(900),
            unconverged: None,
        }],
        ..History::default()
    };
    for n in 0..3 {
        history.ops.push(op(n, completed()));
        history
            .executions
            .insert(format!("op {n} attempt 1"), vec![execution(true)]);
        history.records.insert(
            format!("run-{n}"),
            Record {
                outcome: "completed".into(),
                attempts: 1,
                input_tokens: 9,
                output_tokens: 8,
            },
        );
    }
    history.usage_runs = 3;
    history.usage_output_tokens = 24;
    history
}

fn broken(history: &History) -> Vec<&'static str> {
    let verdict = check(history);
    for violation in &verdict.violations {
        eprintln!("{}: {}", violation.property, violation.slice);
    }
    verdict.violations.iter().map(|v| v.property).collect()
}

#[crate::common::test]
fn a_clean_history_holds() {
    let verdict = check(&clean());
    assert!(verdict.holds(), "{:?}", verdict.violations);
    assert_eq!((verdict.accepted, verdict.completed), (3, 3));
}

#[crate::common::test]
fn a_planted_loss_is_caught() {
    // Accepted, then its client never saw it end, and the journal lost it.
    let mut history = clean();
    history.ops[1].outcome = Outcome::Abandoned {
        why: "no end within the patience".into(),
    };
    history.records.remove("run-1");
    let broken = broken(&history);
    assert!(
        broken.contains(&"an accepted run ends for its client"),
        "{broken:?}"
    );
    let verdict = check(&history);
    assert!(
        verdict.violations[0].slice.contains("seed 7")
            && verdict.violations[0].slice.contains("op: 1"),
        "the seed and the operation: {}",
        verdict.violations[0].slice
    );
}

#[crate::common::test]
fn a_planted_duplicate_is_caught() {
    // The engine ran the accepted prompt twice, the run placed once.
    let mut history = clean();
    history
        .executions
        .get_mut("op 2 attempt 1")
        .expect("op 2's execution")
        .push(execution(true));
    assert!(
        broken(&history).contains(&"no prompt executed more often than its run was placed"),
        "a duplicate"
    );
    // A run failed over is placed twice: then two executions are no duplicate.
    history
        .records
        .get_mut("run-2")
        .expect("run 2's record")
        .attempts = 2;
    assert!(check(&history).holds());
    // An attempt that got no answer made a run placed at most as often as failover places
    // one.
    let unanswered = vec![execution(false); crate::nemesis::MAX_ATTEMPTS];
    history
        .executions
        .insert("op 0 attempt 0".into(), unanswered);
    assert!(check(&history).holds());
    history
        .executions
        .get_mut("op 0 attempt 0")
        .expect("op 0's first attempt")
        .push(execution(true));
    assert!(broken(&history).contains(&"no prompt executed more often than its run was placed"));
    // So did one answered `503` (its member stood down first); one answered `429` made none.
    let mut history = clean();
    history.ops[0].attempts[0] = Attempt::Refused {
        prompt: "op 0 attempt 0".into(),
        status: 503,
    };
    history
        .executions
        .insert("op 0 attempt 0".into(), vec![execution(true); 2]);
    assert!(check(&history).holds());
    history.ops[0].attempts[0] = Attempt::Refused {
        prompt: "op 0 attempt 0".into(),
        status: 429,
    };
    assert!(broken(&history).contains(&"no prompt executed more often than its run was placed"));
}

#[crate::common::test]
fn a_planted_false_completion_is_caught() {
    // The client was shown the whole answer, but the engine never finished it.
    let mut history = clean();
    history
        .executions
        .insert("op 0 attempt 1".into(), vec![execution(false)]);
    assert!(broken(&history).contains(&"no run shown completed that did not complete"));
    // The client saw it complete; the site does not know it.
    let mut history = clean();
    history.records.remove("run-1");
    assert!(broken(&history).contains(&"a run shown completed is in the journal"));
    // The record says completed for a run its client saw fail.
    let mut history = clean();
    history.ops[2].outcome = Outcome::Failed {
        code: "edge_crashed".into(),
    };
    history
        .executions
        .insert("op 2 attempt 1".into(), vec![execution(false)]);
    assert!(broken(&history).contains(&"no run shown completed that did not complete"));
}

#[crate::common::test]
fn a_run_its_client_saw_fail_and_the_site_completed_is_caught() {
    let mut history = clean();
    history.ops[1].outcome = Outcome::Failed {
        code: "internal_error".into(),
    };
    assert!(broken(&history).contains(
        &"an accepted run ends exactly once: its client saw it fail, the site completed it"
    ));
}

#[crate::common::test]
fn other_text_a_repeated_event_double_usage_and_no_convergence_are_caught() {
    let mut history = clean();
    history.ops[0].outcome = Outcome::Completed {
        text: format!("{TEXT}{TEXT}"),
    };
    history.ops[1].disordered = true;
    history.usage_output_tokens = 48;
    history.convergence.after_ms = None;
    let broken = broken(&history);
    for property in [
        "a completed stream's text is the engine's",
        "no event reaches a client twice",
        "usage is counted once per run",
        "the site converges after the last heal",
    ] {
        assert!(broken.contains(&property), "{property}: {broken:?}");
    }
}

#[crate::common::test]
fn a_budget_spent_twice_is_caught() {
    let mut history = clean();
    history.metered_budget = 100;
    history.metered_tokens = 117;
    assert!(check(&history).holds(), "one run may straddle the budget");
    history.metered_tokens = 200;
    assert!(broken(&history).contains(&"a budget is never exceeded across takeovers"));
}
