//! The nemesis's checker: reads a [`History`] and the engines' own counts in it and names
//! every violation of the properties issue 66 lists, each with the minimal slice of history
//! that shows it (the operation, its executions and record, the faults around it).
//!
//! 1. Every run a client was told was accepted ended exactly once for it: completed, or with
//!    a terminal error it saw; the journal holds it ended.
//! 2. No prompt was executed by an engine more often than its run was placed (its record's
//!    attempts: failovers and continuations), nor at all when no run was made of it; an
//!    attempt its client got no answer to (or a `5xx`), whose run the client cannot name,
//!    at most as often as failover places a run (`runs.max_attempts`).
//! 3. No run is shown completed that did not complete: a client's completion and a record's
//!    are each backed by an execution that streamed to its end; and a run shown completed
//!    is in the journal (the site does not forget a run its client saw complete).
//! 4. Every completed stream's text is the engine's, and no event came twice.
//! 5. Usage is counted once per run (each completed record's tokens are the engine's, and
//!    the site's totals no more than the engines made), and the metered key's budget is
//!    never exceeded — across takeovers — by more than the one run admission lets straddle.
//! 6. After the last heal the site converged within the bound stated.

use std::fmt::Write as _;

use super::history::{Attempt, History, Op, Outcome};
use super::tap::Execution;

/// One property broken: which, and the history that shows it.
#[derive(Debug, Clone)]
pub(crate) struct Violation {
    pub(crate) property: &'static str,
    pub(crate) slice: String,
}

/// What the checker found, and the figures it counted.
#[derive(Debug, Default)]
pub(crate) struct Verdict {
    pub(crate) violations: Vec<Violation>,
    pub(crate) accepted: usize,
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    /// Accepted runs the site no longer knew (a resume answered 404): accepted within the
    /// dead member's last batch the stream had not acknowledged (docs/scaling.md).
    pub(crate) unknown_after_acceptance: usize,
    pub(crate) rejected: usize,
}

impl Verdict {
    pub(crate) fn holds(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The minimal slice of `history` around `op`: the op, its executions and record, and the
/// faults that overlapped it.
fn slice(history: &History, op: &Op) -> String {
    let mut text = format!("seed {}\n{op:?}\n", history.seed);
    for attempt in &op.attempts {
        let executions = history.executions.get(attempt.prompt());
        let _ = writeln!(text, "executions of {:?}: {executions:?}", attempt.prompt());
    }
    if let Some(id) = op.run_id() {
        let _ = writeln!(text, "record of {id}: {:?}", history.records.get(id));
    }
    for fault in history
        .faults
        .iter()
        .filter(|f| f.at_ms <= op.end_ms && f.healed_ms + 1_000 >= op.start_ms)
    {
        let _ = writeln!(text, "fault: {fault:?}");
    }
    text
}

/// Checks `history`.
pub(crate) fn check(history: &History) -> Verdict {
    let mut verdict = Verdict::default();
    for op in &history.ops {
        count(&mut verdict, op);
        let mut violated = |property| {
            verdict.violations.push(Violation {
                property,
                slice: slice(history, op),
            });
        };
        for property in op_violations(history, op) {
            violated(property);
        }
    }
    usage(history, &mut verdict);
    if history.convergence.after_ms.is_none() {
        verdict.violations.push(Violation {
            property: "the site converges after the last heal",
            slice: format!(
                "seed {}: not within {} ms: {}",
                history.seed, history.convergence.bound_ms, history.convergence.missing
            ),
        });
    }
    verdict
}

fn count(verdict: &mut Verdict, op: &Op) {
    match (&op.outcome, op.run_id()) {
        (Outcome::Rejected { .. }, _) => verdict.rejected += 1,
        (_, None) => {}
        (outcome, Some(_)) => {
            verdict.accepted += 1;
            match outcome {
                Outcome::Completed { .. } => verdict.completed += 1,
                Outcome::Failed { code } if code == "not_found" => {
                    verdict.unknown_after_acceptance += 1;
                }
                Outcome::Failed { .. } => verdict.failed += 1,
                _ => {}
            }
        }
    }
}

/// The properties operation `op` breaks.
fn op_violations(history: &History, op: &Op) -> Vec<&'static str> {
    let mut broken = Vec::new();
    let record = op.run_id().and_then(|id| history.records.get(id));
    if op.run_id().is_some() && matches!(op.outcome, Outcome::Abandoned { .. }) {
        broken.push("an accepted run ends for its client");
    }
    if let Some(record) = record
        && !["completed", "failed", "cancelled", "unknown"].contains(&record.outcome.as_str())
    {
        broken.push("an accepted run ends in the journal");
    }
    if matches!(op.outcome, Outcome::Failed { .. })
        && record.is_some_and(|r| r.outcome == "completed")
    {
        broken.push(
            "an accepted run ends exactly once: its client saw it fail, the site completed it",
        );
    }
    for attempt in &op.attempts {
        let executed = history.executions.get(attempt.prompt()).map_or(0, Vec::len);
        // An attempt the client got no answer to, or a `5xx` (its member stood down before
        // the first output), may still have made a run, placed as often as failover places
        // one before any output reached its client.
        let placed = match attempt {
            Attempt::Accepted { .. } => record.map_or(1, |r| r.attempts.max(1)),
            Attempt::NoAnswer { .. } => super::MAX_ATTEMPTS,
            Attempt::Refused { status, .. } if *status >= 500 => super::MAX_ATTEMPTS,
            Attempt::Refused { .. } => 1,
        };
        if executed > placed {
            broken.push("no prompt executed more often than its run was placed");
        }
    }
    let finished = finished_executions(history, op);
    if let Outcome::Completed { text } = &op.outcome {
        match finished.last() {
            None => broken.push("no run shown completed that did not complete"),
            Some(last) if !text_matches(text, last, &finished) => {
                broken.push("a completed stream's text is the engine's");
            }
            Some(_) => {}
        }
        if record.is_some_and(|r| r.outcome != "completed") {
            broken.push("no run shown completed that did not complete");
        }
        if record.is_none() {
            broken.push("a run shown completed is in the journal");
        }
    }
    if record.is_some_and(|r| r.outcome == "completed") && finished.is_empty() {
        broken.push("no run shown completed that did not complete");
    }
    if op.disordered {
        broken.push("no event reaches a client twice");
    }
    // A run placed once counts its engine's tokens (a continued one counts the text it was
    // continued from too).
    if let (Some(record), Some(last)) = (record, finished.last())
        && record.outcome == "completed"
        && record.attempts == 1
        && record.output_tokens != last.output_tokens
    {
        broken.push("usage is counted once per run");
    }
    broken
}

/// The executions of `op`'s accepted prompt that streamed to their end.
fn finished_executions<'a>(history: &'a History, op: &Op) -> Vec<&'a Execution> {
    op.attempts
        .iter()
        .filter(|a| matches!(a, Attempt::Accepted { .. }))
        .filter_map(|a| history.executions.get(a.prompt()))
        .flatten()
        .filter(|e| e.finished)
        .collect()
}

/// A client's text is the engine's: its one execution's, or, continued on another engine,
/// ending with the last execution's.
fn text_matches(text: &str, last: &Execution, finished: &[&Execution]) -> bool {
    if finished.len() == 1 {
        text == last.text
    } else {
        text.ends_with(&last.text)
    }
}

/// The site counts each run's usage once — its totals no more than the engines reported
/// (finished executions, and at most one answer's worth for each broken one) — and the
/// metered key's budget holds.
fn usage(history: &History, verdict: &mut Verdict) {
    let executions: Vec<&Execution> = history.executions.values().flatten().collect();
    let one_answer = executions
        .iter()
        .map(|e| e.output_tokens)
        .max()
        .unwrap_or(0);
    let reported: u64 = executions
        .iter()
        .map(|e| {
            if e.finished {
                e.output_tokens
            } else {
                one_answer
            }
        })
        .sum();
    if history.usage_output_tokens > reported {
        verdict.violations.push(Violation {
            property: "usage is counted once per run",
            slice: format!(
                "seed {}: the site counts {} output tokens, the engines made at most {reported}",
                history.seed, history.usage_output_tokens
            ),
        });
    }
    let one_run = executions
        .iter()
        .map(|e| e.input_tokens + e.output_tokens)
        .max()
        .unwrap_or(0);
    if history.metered_budget > 0 && history.metered_tokens > history.metered_budget + one_run {
        verdict.violations.push(Violation {
            property: "a budget is never exceeded across takeovers",
            slice: format!(
                "seed {}: the metered key used {} tokens of a budget of {} (one run: {one_run})",
                history.seed, history.metered_tokens, history.metered_budget
            ),
        });
    }
}

#[cfg(test)]
mod tests;
