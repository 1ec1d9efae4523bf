//! Tests of the management service with a mocked run service and a real journal.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::adapters::file_store::FileNodeStore;
use crate::adapters::lock_registry::LockRegistry;
use crate::domain::{AcceptedRun, AdapterName, Operation, RunQuery, Target};
use crate::ports::NoopJournal;

fn record(id: &str, queued_ms: u64) -> RunRecord {
    RunRecord::open(AcceptedRun {
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
    })
}

fn management(live: MockLiveRuns) -> Management {
    Management::new(
        Arc::new(FileNodeStore::from_definitions(&[]).unwrap()),
        Arc::new(LockRegistry::new()),
        Arc::new(live),
        Arc::new(NoopJournal),
        Drains::new(),
    )
}

#[tokio::test]
async fn listings_show_open_runs_newest_first_without_a_journal() {
    let mut live = MockLiveRuns::new();
    live.expect_open_records()
        .returning(|| vec![record("r1", 1), record("r3", 3), record("r2", 2)]);
    let page = management(live)
        .runs(&RunQuery {
            limit: 2,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    let ids: Vec<&str> = page.runs.iter().map(|r| r.run_id().as_str()).collect();
    assert_eq!(ids, ["r3", "r2"]);
    assert!(page.next.is_some());
}

#[tokio::test]
async fn cancelling_a_run_that_is_not_open_says_whether_it_is_known() {
    let mut live = MockLiveRuns::new();
    live.expect_cancel().returning(|_, _| false);
    let error = management(live)
        .cancel(&RunId::new("r9"))
        .await
        .unwrap_err();
    assert!(matches!(error, ManageError::UnknownRun(_)), "{error}");
}

#[tokio::test]
async fn a_run_whose_record_is_still_on_its_way_to_the_journal_is_found() {
    use crate::adapters::journal::{JournalConfig, SqliteJournal};
    use crate::domain::{EventOrigin, RunEvent, RunEventKind};
    use crate::ports::{JournalEntry, RelayedEvent, RunJournal};
    let dir = tempfile::tempdir().unwrap();
    // A writer that lingers for a minute: only a flush writes what is queued.
    let config = JournalConfig {
        batch_linger_ms: 60_000,
        ..JournalConfig::default()
    };
    let journal = Arc::new(SqliteJournal::open(&config, &dir.path().join("j.sqlite3")).unwrap());
    journal.flush().await;
    let mut live = MockLiveRuns::new();
    live.expect_open_record().returning(|_| None);
    live.expect_cancel().returning(|_, _| false);
    let management = Management::new(
        Arc::new(FileNodeStore::from_definitions(&[]).unwrap()),
        Arc::new(LockRegistry::new()),
        Arc::new(live),
        Arc::clone(&journal) as Arc<dyn RunJournal>,
        Drains::new(),
    );
    // A short run, accepted and ended between two of the writer's transactions.
    let id = RunId::new("short");
    let accepted = record("short", crate::ports::clock::now_ms()).accepted;
    journal.record(JournalEntry::Accepted(Box::new(accepted.clone())));
    let ended = RunEvent {
        run_id: id.clone(),
        node: None,
        adapter: accepted.adapter.clone(),
        target: accepted.target.clone(),
        seq: 1,
        origin: EventOrigin::Edge,
        kind: RunEventKind::cancelled("by its caller"),
        route: None,
    };
    journal.record(JournalEntry::Events {
        run_id: id.clone(),
        events: vec![RelayedEvent {
            index: 0,
            at_ms: accepted.queued_ms,
            first_output: false,
            event: Arc::new(ended),
        }],
    });
    let found = management.run(&id).await.unwrap();
    assert_eq!(
        found.map(|r| r.outcome),
        Some(crate::domain::RunOutcome::Cancelled)
    );
    let error = management.cancel(&id).await.unwrap_err();
    assert!(matches!(error, ManageError::RunEnded(_)), "{error}");
    journal.close().await;
}

#[tokio::test]
async fn draining_an_unknown_node_is_an_error_and_changes_nothing() {
    let management = management(MockLiveRuns::new());
    let error = management
        .drain("nobody", Some(Duration::from_secs(1)))
        .unwrap_err();
    assert!(matches!(error, ManageError::UnknownNode(_)), "{error}");
    assert!(management.drains().is_empty());
    management.stop(Duration::from_secs(1)).await;
}
