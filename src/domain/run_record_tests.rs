//! Tests of run records, listing filters, cursors and page merging.

use proptest::prelude::*;

use super::*;
use crate::domain::EdgeFailure;

fn record(id: &str, queued_ms: u64, outcome: RunOutcome) -> RunRecord {
    let mut record = RunRecord::open(AcceptedRun {
        run_id: RunId::new(id),
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse("default").unwrap(),
        operation: Operation::Unspecified,
        pin: None,
        api_key_name: None,
        queued_ms,
        deadline_ms: None,
        client_stream: None,
        affinity: None,
        budget_reserve: None,
    });
    record.outcome = outcome;
    record
}

fn query(limit: usize) -> RunQuery {
    RunQuery {
        limit,
        ..RunQuery::default()
    }
}

#[test]
fn outcomes_round_trip_their_names() {
    for outcome in RunOutcome::ALL {
        assert_eq!(RunOutcome::parse(outcome.as_str()), Some(outcome));
    }
    assert_eq!(RunOutcome::parse("done"), None);
    assert!(!RunOutcome::Open.is_finished());
    assert!(RunOutcome::Unknown.is_finished());
}

#[test]
fn finishing_takes_the_terminal_event_and_ignores_others() {
    let mut run = record("r1", 10, RunOutcome::Open);
    run.finish(&RunEventKind::Started, 11);
    assert_eq!(run.outcome, RunOutcome::Open);
    run.finish(&EdgeFailure::QueueTimeout.into_event_kind(), 12);
    assert_eq!(run.outcome, RunOutcome::Failed);
    assert_eq!(run.code.as_deref(), Some("queue_timeout"));
    assert_eq!(run.finished_ms, Some(12));
    let mut done = record("r2", 10, RunOutcome::Open);
    let usage = Some(Usage::new(3, 4));
    done.finish(
        &RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage,
        },
        20,
    );
    assert_eq!(done.outcome, RunOutcome::Completed);
    assert_eq!(done.usage, usage);
    assert_eq!(done.finish_reason.as_deref(), Some("stop"));
}

#[test]
fn the_key_filter_keeps_runs_of_that_api_key_name_only() {
    let mut keyed = record("r1", 1, RunOutcome::Open);
    keyed.accepted.api_key_name = Some("team-a".into());
    let unkeyed = record("r2", 2, RunOutcome::Open);
    let by_key = |name: &str| RunQuery {
        api_key_name: Some(name.into()),
        ..query(10)
    };
    assert!(by_key("team-a").matches(&keyed));
    assert!(!by_key("team-b").matches(&keyed));
    assert!(!by_key("team-a").matches(&unkeyed));
    assert!(query(10).matches(&unkeyed));
}

#[test]
fn cursors_round_trip_and_refuse_garbage() {
    let cursor = record("run-0a-000001", 1_700_000_000_000, RunOutcome::Open).cursor();
    assert_eq!(RunCursor::decode(&cursor.encode()), Some(cursor));
    for bad in [
        "",
        ".",
        "12",
        "x.run",
        "12.",
        "12.run id",
        "-1.r",
        "12.r/../x",
    ] {
        assert_eq!(RunCursor::decode(bad), None, "{bad:?}");
    }
}

#[test]
fn filters_apply_to_every_field() {
    let mut run = record("r1", 100, RunOutcome::Failed);
    run.attempts.push(Attempt {
        number: 1,
        node: NodeId::parse("node-a").unwrap(),
        route_reason: "least_busy".into(),
        started_ms: 101,
    });
    let mut q = query(10);
    assert!(q.matches(&run));
    q.node = Some(NodeId::parse("node-b").unwrap());
    assert!(!q.matches(&run));
    q.node = Some(NodeId::parse("node-a").unwrap());
    q.state = RunStateFilter::Open;
    assert!(!q.matches(&run));
    q.state = RunStateFilter::Finished;
    q.outcome = Some(RunOutcome::Completed);
    assert!(!q.matches(&run));
    q.outcome = Some(RunOutcome::Failed);
    q.since_ms = Some(101);
    assert!(!q.matches(&run));
    q.since_ms = Some(100);
    q.adapter = Some(AdapterName::parse("other").unwrap());
    assert!(!q.matches(&run));
    q.adapter = None;
    q.after = Some(record("r1", 100, RunOutcome::Open).cursor());
    assert!(!q.matches(&run), "a cursor excludes its own run");
    q.after = Some(record("r2", 100, RunOutcome::Open).cursor());
    assert!(q.matches(&run));
}

#[test]
fn a_run_in_both_sources_is_shown_once_as_finished() {
    let open = vec![record("r2", 5, RunOutcome::Open)];
    let finished = vec![
        record("r2", 5, RunOutcome::Completed),
        record("r1", 4, RunOutcome::Completed),
    ];
    let page = merge_page(&query(10), open, finished);
    let ids: Vec<_> = page.runs.iter().map(|r| r.run_id().as_str()).collect();
    assert_eq!(ids, ["r2", "r1"]);
    assert_eq!(page.runs[0].outcome, RunOutcome::Completed);
    assert_eq!(page.next, None);
}

proptest! {
    /// Paging through open and finished runs with the returned cursors shows every run
    /// exactly once, newest first, whatever the page size.
    #[test]
    fn pages_show_every_run_once_in_order(
        times in proptest::collection::vec((0u64..20, any::<bool>()), 0..40),
        limit in 1usize..7,
    ) {
        let all: Vec<RunRecord> = times
            .iter()
            .enumerate()
            .map(|(i, (t, open))| {
                let outcome = if *open { RunOutcome::Open } else { RunOutcome::Completed };
                record(&format!("r{i:03}"), *t, outcome)
            })
            .collect();
        let mut seen = Vec::new();
        let mut q = query(limit);
        for _ in 0..=all.len() {
            let open: Vec<RunRecord> = all.iter().filter(|r| r.outcome == RunOutcome::Open).cloned().collect();
            let mut finished: Vec<RunRecord> = all
                .iter()
                .filter(|r| r.outcome.is_finished() && q.matches(r))
                .cloned()
                .collect();
            finished.sort_by_key(|r| std::cmp::Reverse(r.cursor()));
            finished.truncate(limit);
            let page = merge_page(&q, open, finished);
            prop_assert!(page.runs.len() <= limit);
            seen.extend(page.runs.iter().map(RunRecord::cursor));
            match page.next {
                Some(next) => q.after = Some(next),
                None => break,
            }
        }
        let mut expected: Vec<RunCursor> = all.iter().map(RunRecord::cursor).collect();
        expected.sort_by_key(|c| std::cmp::Reverse(c.clone()));
        prop_assert_eq!(seen, expected);
    }
}
