//! Tests of the SQLite journal against real files in a temporary directory.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::domain::routing::KeySource;
use crate::domain::{
    AcceptedRun, AdapterName, Attempt, EdgeFailure, EventOrigin, NodeId, Operation, RunEvent,
    RunEventKind, RunId, RunOutcome, RunQuery, RunStateFilter, Target, Usage,
};
use crate::ports::{JournalEntry, JournalError, RelayedEvent, RunJournal};

/// A time in the recent past, so the default retention keeps the runs.
fn recent(ms: u64) -> u64 {
    static BASE: std::sync::LazyLock<u64> =
        std::sync::LazyLock::new(|| crate::ports::clock::now_ms() - 60_000);
    *BASE + ms
}

fn config(_dir: &tempfile::TempDir) -> JournalConfig {
    JournalConfig {
        batch_linger_ms: 0,
        ..JournalConfig::default()
    }
}

/// The journal's file in `dir`.
fn file(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path().join("j").join("journal.sqlite3")
}

fn accepted(id: &str, queued_ms: u64) -> JournalEntry {
    JournalEntry::Accepted(Box::new(AcceptedRun {
        run_id: RunId::new(id),
        adapter: AdapterName::parse("echo").unwrap(),
        target: Target::parse("default").unwrap(),
        operation: Operation::Chat,
        pin: None,
        api_key_name: Some("team-a".into()),
        queued_ms: recent(queued_ms),
        deadline_ms: None,
        client_stream: Some(r#"{"api":"chat"}"#.into()),
        affinity: Some(KeySource::Session),
        budget_reserve: None,
    }))
}

fn placed(id: &str, node: &str) -> JournalEntry {
    JournalEntry::Placed {
        run_id: RunId::new(id),
        attempt: Attempt {
            number: 1,
            node: NodeId::parse(node).unwrap(),
            route_reason: "least_busy".into(),
            started_ms: recent(1_001),
        },
    }
}

/// One relayed event of run `id`, as the relay hands it on (also the hold's tests' entry).
pub(super) fn event(id: &str, index: u64, kind: RunEventKind) -> JournalEntry {
    JournalEntry::Events {
        run_id: RunId::new(id),
        events: vec![relayed(id, index, kind)],
    }
}

fn relayed(id: &str, index: u64, kind: RunEventKind) -> RelayedEvent {
    RelayedEvent {
        index,
        at_ms: recent(1_002 + index),
        first_output: index == 1,
        event: Arc::new(RunEvent {
            run_id: RunId::new(id),
            node: Some(NodeId::parse("node-a").unwrap()),
            adapter: AdapterName::parse("echo").unwrap(),
            target: Target::parse("default").unwrap(),
            seq: index + 1,
            origin: EventOrigin::Node,
            kind,
            route: None,
        }),
    }
}

pub(super) fn completed() -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage::new(5, 7)),
    }
}

/// Records a whole run: accepted, placed on `node`, started, one output, completed.
fn whole_run(journal: &dyn RunJournal, id: &str, queued_ms: u64, node: &str) {
    journal.record(accepted(id, queued_ms));
    journal.record(placed(id, node));
    journal.record(event(id, 0, RunEventKind::Started));
    journal.record(event(id, 1, RunEventKind::text("hi")));
    journal.record(event(id, 2, completed()));
}

#[tokio::test]
async fn a_finished_run_reads_back_with_its_attempts_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    whole_run(&journal, "r1", 1_000, "node-a");
    journal.flush().await;
    assert_eq!(journal.stats().write_errors, 0, "{:?}", journal.stats());
    assert!(
        journal.kept_for_takeover(),
        "a single edge's file is where it takes runs back"
    );
    let run = journal.run(&RunId::new("r1")).await.unwrap().unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed);
    assert_eq!(run.usage, Some(Usage::new(5, 7)));
    assert_eq!(run.accepted.api_key_name.as_deref(), Some("team-a"));
    assert_eq!(
        run.accepted.client_stream.as_deref(),
        Some(r#"{"api":"chat"}"#)
    );
    assert_eq!(run.accepted.affinity, Some(KeySource::Session));
    assert_eq!(run.node().map(NodeId::as_str), Some("node-a"));
    assert_eq!(run.started_ms(), Some(recent(1_001)));
    assert_eq!(run.first_output_ms, Some(recent(1_003)));
    assert_eq!(run.finished_ms, Some(recent(1_004)));
    assert_eq!((run.events, run.events_stored), (3, 3));
    let events = journal.events(&RunId::new("r1"), 1, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert!(
        events[0].json.contains("\"text\":\"hi\""),
        "{}",
        events[0].json
    );
    assert!(!events[0].json.ends_with('\n'));
    assert!(journal.run(&RunId::new("absent")).await.unwrap().is_none());
    journal.close().await;
}

#[tokio::test]
async fn listings_filter_and_page_newest_first_without_open_runs() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    for i in 0..5u64 {
        let node = if i % 2 == 0 { "node-a" } else { "node-b" };
        whole_run(&journal, &format!("r{i}"), 1_000 + i, node);
    }
    journal.record(accepted("open", 2_000));
    journal.flush().await;
    let mut query = RunQuery {
        limit: 2,
        ..RunQuery::default()
    };
    let ids = |runs: &[crate::domain::RunRecord]| -> Vec<String> {
        runs.iter().map(|r| r.run_id().to_string()).collect()
    };
    let page = journal.finished_runs(&query).await.unwrap();
    assert_eq!(ids(&page), ["r4", "r3"]);
    query.after = page.last().map(|r| r.cursor());
    assert_eq!(
        ids(&journal.finished_runs(&query).await.unwrap()),
        ["r2", "r1"]
    );
    let by_node = RunQuery {
        node: Some(NodeId::parse("node-b").unwrap()),
        state: RunStateFilter::Finished,
        limit: 10,
        ..RunQuery::default()
    };
    assert_eq!(
        ids(&journal.finished_runs(&by_node).await.unwrap()),
        ["r3", "r1"]
    );
    let failed = RunQuery {
        outcome: Some(RunOutcome::Failed),
        limit: 10,
        ..RunQuery::default()
    };
    assert!(journal.finished_runs(&failed).await.unwrap().is_empty());
    let by_key = |name: &str| RunQuery {
        api_key_name: Some(name.to_owned()),
        limit: 10,
        ..RunQuery::default()
    };
    assert_eq!(
        journal
            .finished_runs(&by_key("team-a"))
            .await
            .unwrap()
            .len(),
        5
    );
    assert!(
        journal
            .finished_runs(&by_key("team-b"))
            .await
            .unwrap()
            .is_empty()
    );
    journal.close().await;
}

#[tokio::test]
async fn events_past_the_cap_are_left_out_but_the_ending_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(
        &JournalConfig {
            max_events_per_run: 2,
            ..config(&dir)
        },
        &file(&dir),
    )
    .unwrap();
    journal.record(accepted("r", 1));
    for i in 0..5 {
        journal.record(event("r", i, RunEventKind::text("x")));
    }
    journal.record(event(
        "r",
        5,
        EdgeFailure::DeadlineExceeded.into_event_kind(),
    ));
    journal.flush().await;
    let run = journal.run(&RunId::new("r")).await.unwrap().unwrap();
    assert_eq!((run.events, run.events_stored), (6, 3));
    assert_eq!(run.code.as_deref(), Some("deadline_exceeded"));
    assert_eq!(journal.stats().events_over_cap, 3);
    journal.close().await;
}

#[tokio::test]
async fn runs_left_open_are_unknown_after_reopening_and_a_second_edge_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    let second = SqliteJournal::open(&config(&dir), &file(&dir));
    assert!(matches!(second, Err(OpenError::InUse { .. })));
    whole_run(&journal, "done", 1, "node-a");
    journal.record(accepted("midway", 2));
    journal.record(event("midway", 0, RunEventKind::Started));
    journal.flush().await;
    drop(journal);
    // The writer thread ends on drop; the lock goes with the journal.
    let journal = reopen(&dir).await;
    let midway = journal.run(&RunId::new("midway")).await.unwrap().unwrap();
    assert_eq!(midway.outcome, RunOutcome::Unknown);
    assert_eq!(midway.code.as_deref(), Some(crate::domain::EDGE_CRASHED));
    assert_eq!(midway.events_stored, 1);
    let done = journal.run(&RunId::new("done")).await.unwrap().unwrap();
    assert_eq!(done.outcome, RunOutcome::Completed);
    journal.close().await;
}

#[tokio::test]
async fn a_damaged_row_reads_as_damaged_not_as_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    whole_run(&journal, "r1", 1_000, "node-a");
    journal.flush().await;
    rusqlite::Connection::open(file(&dir))
        .unwrap()
        .execute("UPDATE batches SET ended = x'ff', frames = x'ff'", [])
        .unwrap();
    let read = journal.run(&RunId::new("r1")).await;
    assert!(matches!(read, Err(JournalError::Damaged(_))), "{read:?}");
    let events = journal.events(&RunId::new("r1"), 0, 10).await;
    assert!(
        matches!(events, Err(JournalError::Damaged(_))),
        "{events:?}"
    );
    journal.close().await;
}

/// Opens the journal again, waiting (bounded) for the dropped one's lock to be released.
async fn reopen(dir: &tempfile::TempDir) -> SqliteJournal {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match SqliteJournal::open(&config(dir), &file(dir)) {
            Ok(journal) => return journal,
            Err(OpenError::InUse { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(error) => panic!("reopen: {error}"),
        }
    }
}

#[tokio::test]
async fn retention_removes_old_runs_when_the_journal_opens() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    whole_run(&journal, "ancient", 1, "node-a");
    journal.record(accepted("open", 1));
    journal.flush().await;
    journal.close().await;
    drop(journal);
    // Retention runs when the journal opens.
    let journal = SqliteJournal::open(
        &JournalConfig {
            retention_max_age: HumanDuration(Duration::from_secs(1)),
            ..config(&dir)
        },
        &file(&dir),
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while journal.run(&RunId::new("ancient")).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention did not run"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        journal
            .events(&RunId::new("ancient"), 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Left open, so marked unknown when reopened: finished, old, and removed too.
    assert!(journal.run(&RunId::new("open")).await.unwrap().is_none());
    assert_eq!(journal.stats().runs_expired, 2);
    journal.close().await;
}

#[tokio::test]
async fn the_disabled_journal_keeps_nothing() {
    let journal = open_journal(
        &JournalConfig {
            enabled: false,
            ..JournalConfig::default()
        },
        std::path::Path::new("never-created.sqlite3"),
        true,
    )
    .unwrap();
    assert!(!journal.enabled());
    journal.record(accepted("r", 1));
    journal.flush().await;
    assert!(journal.run(&RunId::new("r")).await.unwrap().is_none());
}

#[tokio::test]
async fn retention_by_size_removes_the_oldest_batches_and_none_an_open_run_needs() {
    let dir = tempfile::tempdir().unwrap();
    let unlimited = JournalConfig {
        retention_max_bytes: 0,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&unlimited, &file(&dir)).unwrap();
    let padding = "x".repeat(4_000);
    for i in 0..200u64 {
        let id = format!("r{i}");
        if i == 100 {
            journal.record(accepted("open", 10 + i));
            journal.record(event("open", 0, RunEventKind::Started));
        }
        journal.record(accepted(&id, 10 + i));
        journal.record(event(&id, 0, RunEventKind::text(padding.as_str())));
        journal.record(event(&id, 1, completed()));
        journal.flush().await;
    }
    journal.close().await;
    drop(journal);
    let budget = budget::Budget::of(0);
    let opened = schema::open_writer(&file(&dir), &budget, true).unwrap();
    let conn = opened.conn;
    let open_from = log::open_from(&opened.open, opened.next_seq);
    // The batches before the open run's first one, and the runs they ended: r0 to r99 (a
    // flush may have split the writer's batches anywhere).
    let (older_batches, older_runs): (i64, i64) = conn
        .query_row(
            "SELECT count(*), coalesce(sum(ended_count), 0) FROM batches WHERE seq < ?1",
            [open_from],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert!(older_runs >= 99, "{older_runs}");
    let before = sql::used_bytes(&conn).unwrap();
    let rows = |conn: &rusqlite::Connection| -> (i64, i64) {
        conn.query_row("SELECT min(seq), count(*) FROM batches", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap()
    };
    let (_, rows_before) = rows(&conn);
    let retention = retention::Retention {
        max_age: Duration::ZERO,
        usage_max_age: Duration::ZERO,
        usage_minute_max_age: Duration::ZERO,
    };
    let mut removed = 0;
    let now = crate::ports::clock::now_ms();
    loop {
        let chunk = retention::retention_chunk(&conn, &retention, now, Some(before / 4), open_from)
            .unwrap();
        if chunk.batches == 0 {
            break;
        }
        removed += chunk.runs;
    }
    // Everything before the open run's first batch went, oldest first; nothing after.
    assert_eq!(removed as i64, older_runs);
    assert_eq!(rows(&conn), (open_from, rows_before - older_batches));
    assert!(sql::used_bytes(&conn).unwrap() < before);
}

/// The journal's files in `dir`, added up.
fn on_disk(dir: &tempfile::TempDir) -> u64 {
    budget::Files::of(&file(dir)).total_bytes()
}

#[tokio::test]
async fn a_flood_never_takes_more_disk_than_the_limit() {
    const LIMIT: u64 = budget::MIN_LIMIT;
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(
        &JournalConfig {
            retention_max_bytes: LIMIT,
            batch_max: 512,
            ..config(&dir)
        },
        &file(&dir),
    )
    .unwrap();
    // A run open through the whole flood, which retention must keep.
    journal.record(accepted("held", 0));
    journal.record(event("held", 0, RunEventKind::Started));
    let delta = "y".repeat(400);
    let mut largest = 0;
    // ~16 MiB of answers, four times the limit.
    for i in 0..2_000u64 {
        let id = format!("flood-{i}");
        journal.record(accepted(&id, 10 + i));
        journal.record(placed(&id, "node-a"));
        let events = (0..20)
            .map(|index| relayed(&id, index, RunEventKind::text(delta.as_str())))
            .chain([relayed(&id, 20, completed())])
            .collect();
        journal.record(JournalEntry::Events {
            run_id: RunId::new(id.as_str()),
            events,
        });
        if i % 50 == 0 {
            journal.flush().await;
            largest = largest.max(on_disk(&dir));
        }
    }
    journal.flush().await;
    largest = largest.max(on_disk(&dir));
    let stats = journal.stats();
    assert!(
        largest <= LIMIT,
        "{largest} bytes on disk, limit {LIMIT}: {stats:?}"
    );
    assert_eq!(stats.write_errors, 0, "{stats:?}");
    assert!(stats.runs_expired > 1_000, "{stats:?}");
    let newest = journal.run(&RunId::new("flood-1999")).await.unwrap();
    assert_eq!(newest.map(|r| r.outcome), Some(RunOutcome::Completed));
    let held = journal.run(&RunId::new("held")).await.unwrap();
    assert_eq!(
        held.map(|r| r.outcome),
        Some(RunOutcome::Open),
        "open runs are kept"
    );
    // Carried forward past the rows its first event was in: it goes on and ends whole,
    // the event it had before given up.
    journal.record(event("held", 1, RunEventKind::text("late")));
    journal.record(event("held", 2, completed()));
    journal.flush().await;
    let held = journal.run(&RunId::new("held")).await.unwrap().unwrap();
    assert_eq!(held.outcome, RunOutcome::Completed);
    assert_eq!((held.events, held.events_stored), (3, 2));
    let events = journal.events(&RunId::new("held"), 0, 10).await.unwrap();
    assert_eq!(events.iter().map(|e| e.index).collect::<Vec<_>>(), [1, 2]);
    journal.close().await;
    assert!(on_disk(&dir) <= LIMIT);
}

#[tokio::test]
async fn a_failed_transaction_leaves_the_runs_it_touched_as_the_file_has_them() {
    let dir = tempfile::tempdir().unwrap();
    let small = JournalConfig {
        retention_max_bytes: budget::MIN_LIMIT,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&small, &file(&dir)).unwrap();
    journal.record(accepted("r", 1));
    journal.record(event("r", 0, RunEventKind::Started));
    journal.flush().await;
    // A first output larger than the file may be: it cannot be left out, and it fails.
    let huge = "h".repeat(5 << 20);
    journal.record(event("r", 1, RunEventKind::text(huge.as_str())));
    journal.flush().await;
    assert_eq!(journal.stats().write_errors, 1, "{:?}", journal.stats());
    journal.record(event("r", 2, completed()));
    journal.flush().await;
    let run = journal.run(&RunId::new("r")).await.unwrap().unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed);
    // The lost output is not counted as stored.
    assert_eq!((run.events, run.events_stored), (3, 2));
    journal.close().await;
}

#[tokio::test]
async fn a_journal_of_schema_1_is_read_and_written_on() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("j")).unwrap();
    {
        let conn = rusqlite::Connection::open(file(&dir)).unwrap();
        conn.execute_batch(
            "CREATE TABLE runs (seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE,
                adapter TEXT NOT NULL, target TEXT NOT NULL, operation TEXT NOT NULL, pin TEXT,
                api_key_name TEXT, queued_ms INTEGER NOT NULL, first_output_ms INTEGER,
                finished_ms INTEGER, outcome TEXT NOT NULL, code TEXT, message TEXT,
                finish_reason TEXT, input_tokens INTEGER, output_tokens INTEGER,
                cached_input_tokens INTEGER, reasoning_tokens INTEGER,
                events INTEGER NOT NULL DEFAULT 0, events_stored INTEGER NOT NULL DEFAULT 0);
             CREATE TABLE events (run_seq INTEGER NOT NULL, first_idx INTEGER NOT NULL,
                count INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_seq, first_idx))
                WITHOUT ROWID;
             INSERT INTO events VALUES (1, 0, 2, '{\"kind\":\"started\"}' || char(10) || '{\"kind\":\"completed\"}');
             PRAGMA user_version = 1;",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (seq, run_id, adapter, target, operation, queued_ms, outcome, events)
             VALUES (1, 'old', 'echo', 'default', 'chat', ?1, 'completed', 2)",
            [recent(1) as i64],
        )
        .unwrap();
    }
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    let old = journal.events(&RunId::new("old"), 0, 10).await.unwrap();
    let lines: Vec<&str> = old.iter().map(|e| e.json.as_str()).collect();
    assert_eq!(
        lines,
        ["{\"kind\":\"started\"}", "{\"kind\":\"completed\"}"]
    );
    whole_run(&journal, "new", 5, "node-a");
    journal.flush().await;
    let new = journal.events(&RunId::new("new"), 0, 10).await.unwrap();
    assert_eq!(new.len(), 3, "{new:?}");
    assert!(new[1].json.contains("\"text\":\"hi\""), "{new:?}");
    journal.close().await;
}

/// A file as an edge of schema 5 left it: its tables without `affinity`, one usage row
/// per bucket size, a finished run.
fn schema_5_file(dir: &tempfile::TempDir) {
    std::fs::create_dir_all(dir.path().join("j")).unwrap();
    let conn = rusqlite::Connection::open(file(dir)).unwrap();
    conn.execute_batch(
        "CREATE TABLE runs (seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL UNIQUE,
            adapter TEXT NOT NULL, target TEXT NOT NULL, operation TEXT NOT NULL, pin TEXT,
            api_key_name TEXT, queued_ms INTEGER NOT NULL, node TEXT, route_reason TEXT,
            started_ms INTEGER, events_inline BLOB,
            events_inline_count INTEGER NOT NULL DEFAULT 0, first_output_ms INTEGER,
            finished_ms INTEGER, outcome TEXT NOT NULL, code TEXT, message TEXT,
            finish_reason TEXT, input_tokens INTEGER, output_tokens INTEGER,
            cached_input_tokens INTEGER, reasoning_tokens INTEGER,
            events INTEGER NOT NULL DEFAULT 0, events_stored INTEGER NOT NULL DEFAULT 0,
            deadline_ms INTEGER, client_stream TEXT);
         CREATE TABLE usage (bucket TEXT NOT NULL, start_ms INTEGER NOT NULL,
            key TEXT NOT NULL, model TEXT NOT NULL, node TEXT NOT NULL,
            runs INTEGER NOT NULL, errors INTEGER NOT NULL, input_tokens INTEGER NOT NULL,
            cached_input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL,
            reasoning_tokens INTEGER NOT NULL,
            PRIMARY KEY (bucket, start_ms, key, model, node)) WITHOUT ROWID;
         PRAGMA user_version = 5;",
    )
    .unwrap();
    conn.execute(
        "INSERT INTO runs (seq, run_id, adapter, target, operation, api_key_name, queued_ms,
            node, finished_ms, outcome, input_tokens, output_tokens, events)
         VALUES (1, 'old', 'echo', 'default', 'chat', 'team-a', ?1, 'node-a', ?1,
            'completed', 40, 4, 2)",
        [recent(1) as i64],
    )
    .unwrap();
    for bucket in crate::domain::Bucket::ALL {
        let start = bucket.start_of(recent(1)) as i64;
        conn.execute(
            "INSERT INTO usage VALUES (?1, ?2, 'team-a', 'echo/default', 'node-a',
                1, 0, 40, 30, 4, 0)",
            rusqlite::params![bucket.as_str(), start],
        )
        .unwrap();
    }
}

#[tokio::test]
async fn a_journal_of_schema_5_keeps_its_usage_and_rolls_up_by_affinity_on() {
    use crate::domain::{Bucket, GroupBy, UsageQuery};
    let dir = tempfile::tempdir().unwrap();
    schema_5_file(&dir);
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    let old = journal.run(&RunId::new("old")).await.unwrap().unwrap();
    assert_eq!(old.accepted.affinity, None);
    assert_eq!(old.attempts.len(), 1, "its first attempt was in its row");
    // A run of schema 6, keyed by its session, in the same buckets as the old row.
    whole_run(&journal, "new", 5, "node-a");
    journal.flush().await;
    for bucket in Bucket::ALL {
        let query = UsageQuery {
            group_by: GroupBy::parse("key,model,node,affinity").unwrap(),
            since_ms: 0,
            until_ms: u64::MAX / 2,
            bucket,
            per_bucket: false,
        };
        let rows = journal.usage(&query).await.unwrap();
        let affinity: Vec<_> = rows.iter().map(|r| r.group.affinity.as_deref()).collect();
        // Rows the old edge rolled up have no source (not known); the new run's is kept.
        assert_eq!(affinity, [None, Some("session")], "{bucket:?}: {rows:?}");
        assert_eq!(rows[0].counts.input_tokens, 40, "{rows:?}");
        assert_eq!(rows[0].counts.cache_hit_rate(), Some(0.75));
        assert_eq!(rows[1].counts.input_tokens, 5, "{rows:?}");
        assert!(
            rows.iter()
                .all(|r| r.group.key.as_deref() == Some("team-a"))
        );
        // Summed over the sources, as budgets read the daily rollups.
        let by_key = journal
            .usage(&UsageQuery {
                group_by: GroupBy::parse("key").unwrap(),
                ..query
            })
            .await
            .unwrap();
        assert_eq!(by_key.len(), 1, "{by_key:?}");
        assert_eq!(
            (by_key[0].counts.runs, by_key[0].counts.input_tokens),
            (2, 45)
        );
    }
    let new = journal.run(&RunId::new("new")).await.unwrap().unwrap();
    assert_eq!(new.accepted.affinity, Some(KeySource::Session));
    journal.close().await;
    let conn = rusqlite::Connection::open(file(&dir)).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    assert_eq!(version, 8);
    let old_tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name IN ('runs', 'attempts', 'events')",
            [],
            |row| row.get(0),
        )
        .unwrap();
    assert_eq!(old_tables, 0, "the rows were rewritten into batches");
}

#[tokio::test]
async fn a_run_an_older_edge_left_open_is_rewritten_open_and_taken_back() {
    let dir = tempfile::tempdir().unwrap();
    schema_5_file(&dir);
    {
        let conn = rusqlite::Connection::open(file(&dir)).unwrap();
        conn.execute_batch(
            "CREATE TABLE events (run_seq INTEGER NOT NULL, first_idx INTEGER NOT NULL,
                count INTEGER NOT NULL, json TEXT NOT NULL, packed BLOB,
                PRIMARY KEY (run_seq, first_idx)) WITHOUT ROWID;
             INSERT INTO events VALUES (2, 0, 1, '{\"kind\":\"started\"}', NULL);",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO runs (seq, run_id, adapter, target, operation, queued_ms, node,
                route_reason, started_ms, outcome, deadline_ms)
             VALUES (2, 'midway', 'echo', 'default', 'chat', ?1, 'node-a', 'least_busy', ?1,
                'open', ?2)",
            [recent(2) as i64, recent(60_002) as i64],
        )
        .unwrap();
    }
    let journal = SqliteJournal::open_adopting(&config(&dir), &file(&dir)).unwrap();
    let left = journal.take_left_open();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].run_id().as_str(), "midway");
    assert_eq!(left[0].accepted.deadline_ms, Some(recent(60_002)));
    assert_eq!(left[0].attempts.len(), 1);
    assert_eq!(left[0].events_stored, 1);
    let events = journal.events(&RunId::new("midway"), 0, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].json, "{\"kind\":\"started\"}");
    journal.record(event("midway", 1, completed()));
    journal.flush().await;
    let midway = journal.run(&RunId::new("midway")).await.unwrap().unwrap();
    assert_eq!(midway.outcome, RunOutcome::Completed);
    assert_eq!((midway.events, midway.events_stored), (2, 2));
    let old = journal.run(&RunId::new("old")).await.unwrap().unwrap();
    assert_eq!(old.outcome, RunOutcome::Completed);
    journal.close().await;
}

#[tokio::test]
async fn a_transaction_is_one_row_whatever_runs_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("j")).unwrap();
    {
        // Two transactions written as the writer writes them, without its thread's timing.
        let budget = budget::Budget::of(0);
        let mut opened = schema::open_writer(&file(&dir), &budget, false).unwrap();
        let queued = |entries: Vec<JournalEntry>| -> Vec<batch::Queued> {
            entries
                .into_iter()
                .filter_map(|entry| batch::Queued::of(entry, 100).0)
                .collect()
        };
        let mut first = Vec::new();
        for i in 0..50 {
            let id = format!("r{i}");
            first.extend([
                accepted(&id, 1 + i),
                placed(&id, "node-a"),
                event(&id, 0, RunEventKind::Started),
                event(&id, 1, RunEventKind::text("hi")),
                event(&id, 2, completed()),
            ]);
        }
        first.extend([accepted("split", 100), placed("split", "node-a")]);
        let second = vec![
            event("split", 0, RunEventKind::Started),
            event("split", 1, completed()),
        ];
        for (seq, entries) in [(1, queued(first)), (2, queued(second))] {
            let row = log::BatchRow::of(seq, &entries, &mut opened.open);
            let tx = opened.conn.transaction().unwrap();
            row.insert(&tx, recent(0), log::open_from(&opened.open, seq + 1))
                .unwrap();
            tx.commit().unwrap();
        }
        let rows: i64 = opened
            .conn
            .query_row("SELECT count(*) FROM batches", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 2, "51 runs in two transactions, a row each");
    }
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    for id in ["r0", "r49", "split"] {
        let run = journal.run(&RunId::new(id)).await.unwrap().unwrap();
        assert_eq!(run.outcome, RunOutcome::Completed, "{id}");
        assert_eq!(run.attempts.len(), 1, "{id}");
    }
    let split = journal.events(&RunId::new("split"), 0, 10).await.unwrap();
    assert_eq!(split.len(), 2, "{split:?}");
    journal.close().await;
}

#[tokio::test]
async fn a_run_written_across_batches_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    journal.record(accepted("long", 1));
    journal.record(placed("long", "node-a"));
    journal.record(event("long", 0, RunEventKind::Started));
    journal.flush().await;
    journal.record(JournalEntry::Placed {
        run_id: RunId::new("long"),
        attempt: Attempt {
            number: 2,
            node: NodeId::parse("node-b").unwrap(),
            route_reason: "failover".into(),
            started_ms: recent(1_500),
        },
    });
    journal.record(event("long", 1, RunEventKind::text("one ")));
    journal.flush().await;
    journal.record(event("long", 2, RunEventKind::text("two")));
    journal.record(event("long", 3, completed()));
    journal.flush().await;

    let run = journal.run(&RunId::new("long")).await.unwrap().unwrap();
    let nodes: Vec<&str> = run.attempts.iter().map(|a| a.node.as_str()).collect();
    assert_eq!(nodes, ["node-a", "node-b"]);
    assert_eq!((run.events, run.events_stored), (4, 4));
    let all = journal.events(&RunId::new("long"), 0, 10).await.unwrap();
    let indices: Vec<u64> = all.iter().map(|e| e.index).collect();
    assert_eq!(indices, [0, 1, 2, 3]);
    assert!(all[2].json.contains("\"text\":\"two\""), "{all:?}");
    let tail = journal.events(&RunId::new("long"), 1, 2).await.unwrap();
    assert_eq!(tail.iter().map(|e| e.index).collect::<Vec<_>>(), [1, 2]);
    for node in ["node-a", "node-b"] {
        let query = RunQuery {
            node: Some(NodeId::parse(node).unwrap()),
            limit: 10,
            ..RunQuery::default()
        };
        let found = journal.finished_runs(&query).await.unwrap();
        assert_eq!(found.len(), 1, "by {node}");
    }
    journal.close().await;
}

#[tokio::test]
async fn a_limit_lowered_below_the_file_is_kept_from_the_next_start() {
    const LIMIT: u64 = budget::MIN_LIMIT;
    let dir = tempfile::tempdir().unwrap();
    let unlimited = JournalConfig {
        retention_max_bytes: 0,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&unlimited, &file(&dir)).unwrap();
    let delta = "z".repeat(400);
    for i in 0..1_500u64 {
        let id = format!("old-{i}");
        journal.record(accepted(&id, 10 + i));
        let events = (0..20)
            .map(|index| relayed(&id, index, RunEventKind::text(delta.as_str())))
            .chain([relayed(&id, 20, completed())])
            .collect();
        journal.record(JournalEntry::Events {
            run_id: RunId::new(id.as_str()),
            events,
        });
    }
    journal.close().await;
    drop(journal);
    assert!(on_disk(&dir) > 2 * LIMIT, "{} bytes", on_disk(&dir));

    let limited = JournalConfig {
        retention_max_bytes: LIMIT,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&limited, &file(&dir)).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while on_disk(&dir) > LIMIT && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stats = journal.stats();
    assert!(
        on_disk(&dir) <= LIMIT,
        "{} bytes, limit {LIMIT}: {stats:?}",
        on_disk(&dir)
    );
    let newest = journal.run(&RunId::new("old-1499")).await.unwrap();
    assert_eq!(newest.map(|r| r.outcome), Some(RunOutcome::Completed));
    journal.close().await;
}

#[tokio::test]
async fn usage_rolls_up_as_runs_end_and_survives_reopening() {
    use crate::domain::{Bucket, GroupBy, UsageQuery};
    let dir = tempfile::tempdir().unwrap();
    let query = UsageQuery {
        group_by: GroupBy::parse("key,model,node").unwrap(),
        since_ms: 0,
        until_ms: u64::MAX / 2,
        bucket: Bucket::Minute,
        per_bucket: false,
    };
    {
        let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
        whole_run(&journal, "r1", 1_000, "node-a");
        // Ended in a batch of its own, after the record was written.
        journal.record(accepted("r2", 1_000));
        journal.flush().await;
        journal.record(event("r2", 0, RunEventKind::failed("boom", "it broke")));
        // Still open: not counted.
        journal.record(accepted("r3", 1_000));
        journal.flush().await;
        let rows = journal.usage(&query).await.unwrap();
        assert_eq!(rows.len(), 1, "{rows:?}");
        let row = &rows[0];
        assert_eq!(row.group.key.as_deref(), Some("team-a"));
        assert_eq!(row.group.model.as_deref(), Some("echo/default"));
        assert_eq!(row.group.node.as_deref(), Some("node-a"));
        assert_eq!((row.counts.runs, row.counts.errors), (2, 1));
        assert_eq!((row.counts.input_tokens, row.counts.output_tokens), (5, 7));
        journal.close().await;
    }
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    for bucket in Bucket::ALL {
        let per_bucket = UsageQuery {
            group_by: GroupBy::default(),
            bucket,
            per_bucket: true,
            ..query
        };
        let rows = journal.usage(&per_bucket).await.unwrap();
        let runs: u64 = rows.iter().map(|r| r.counts.runs).sum();
        assert_eq!(runs, 2, "{bucket:?}: {rows:?}");
        assert!(
            rows.iter()
                .all(|r| r.start_ms.is_some() && r.group.key.is_none())
        );
    }
}

#[tokio::test]
async fn an_adopting_open_hands_runs_left_open_over_once_and_takes_their_endings() {
    use crate::domain::{Bucket, GroupBy, UsageQuery};
    let dir = tempfile::tempdir().unwrap();
    let journal = SqliteJournal::open(&config(&dir), &file(&dir)).unwrap();
    whole_run(&journal, "done", 1, "node-a");
    let JournalEntry::Accepted(mut midway) = accepted("midway", 2) else {
        unreachable!()
    };
    midway.deadline_ms = Some(recent(60_002));
    journal.record(JournalEntry::Accepted(midway));
    journal.record(placed("midway", "node-a"));
    journal.record(event("midway", 0, RunEventKind::Started));
    journal.record(event("midway", 1, RunEventKind::text("half")));
    journal.flush().await;
    drop(journal);
    let journal = loop {
        match SqliteJournal::open_adopting(&config(&dir), &file(&dir)) {
            Ok(journal) => break journal,
            Err(OpenError::InUse { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(error) => panic!("reopen: {error}"),
        }
    };
    // Left as it was, and handed over once, deadline and attempt included.
    let left = journal.take_left_open();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].outcome, RunOutcome::Open);
    assert_eq!(left[0].accepted.deadline_ms, Some(recent(60_002)));
    assert_eq!(left[0].accepted.affinity, Some(KeySource::Session));
    assert_eq!(left[0].attempts.len(), 1);
    assert!(journal.take_left_open().is_empty());
    // Taken back and then lost: its ending is recorded as unknown, in no rollup.
    let lost = EdgeFailure::EdgeCrashed.into_event_kind();
    journal.record(event("midway", 2, lost));
    journal.flush().await;
    let midway = journal.run(&RunId::new("midway")).await.unwrap().unwrap();
    assert_eq!(midway.outcome, RunOutcome::Unknown);
    assert_eq!(midway.code.as_deref(), Some(crate::domain::EDGE_CRASHED));
    assert_eq!((midway.events, midway.events_stored), (3, 3));
    let query = UsageQuery {
        group_by: GroupBy::parse("key").unwrap(),
        since_ms: 0,
        until_ms: u64::MAX / 2,
        bucket: Bucket::Minute,
        per_bucket: false,
    };
    let rows = journal.usage(&query).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.counts.runs).sum::<u64>(),
        1,
        "{rows:?}"
    );
    journal.close().await;
}

/// The batch rows that hold events of run `id`, and how many events they hold, read on a
/// connection of its own.
fn stored_events(dir: &tempfile::TempDir, id: &str) -> (usize, u64) {
    let conn = rusqlite::Connection::open(file(dir)).unwrap();
    let mut statement = conn.prepare("SELECT frames FROM batches").unwrap();
    let mut rows = statement.query([]).unwrap();
    let (mut batches, mut events) = (0, 0);
    while let Some(row) = rows.next().unwrap() {
        let frames =
            super::frames::read_frames(row.get_ref(0).unwrap().as_blob().unwrap()).unwrap();
        let counts: Vec<u64> = frames
            .iter()
            .filter_map(|frame| match frame {
                super::frames::Frame::Events(chunk) if chunk.run_id == id => Some(chunk.count),
                _ => None,
            })
            .collect();
        batches += usize::from(!counts.is_empty());
        events += counts.iter().sum::<u64>();
    }
    (batches, events)
}

/// Waits until `done` holds, polling; a writer that never gets there fails the test after a
/// generous deadline instead of hanging it.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

#[tokio::test]
async fn a_streaming_runs_events_are_written_together_when_it_ends() {
    let dir = tempfile::tempdir().unwrap();
    // One entry per transaction: without the hold, each delta would be a row of its own.
    let hold = JournalConfig {
        batch_max: 1,
        open_events_hold_ms: 3_600_000,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&hold, &file(&dir)).unwrap();
    journal.record(accepted("stream", 1));
    journal.record(placed("stream", "node-a"));
    journal.flush().await;
    for index in 0..40 {
        journal.record(event("stream", index, RunEventKind::text("tok ")));
    }
    journal.record(event("stream", 40, completed()));
    // Not a flush: one would write what is held at once (read-your-writes).
    until("all 43 entries are written", || {
        journal.stats().written >= 43
    })
    .await;
    // Written together, in one transaction's row.
    let stored = stored_events(&dir, "stream");
    assert_eq!(stored, (1, 41), "{:?}", journal.stats());
    let run = journal.run(&RunId::new("stream")).await.unwrap().unwrap();
    assert_eq!(run.outcome, RunOutcome::Completed);
    assert_eq!((run.events, run.events_stored), (41, 41));
    let events = journal.events(&RunId::new("stream"), 0, 100).await.unwrap();
    assert_eq!(events.len(), 41);
    assert!(events.iter().enumerate().all(|(i, e)| e.index == i as u64));
    journal.close().await;
}

#[tokio::test]
async fn a_flush_writes_the_events_held_for_an_open_run() {
    let dir = tempfile::tempdir().unwrap();
    let hold = JournalConfig {
        open_events_hold_ms: 3_600_000,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&hold, &file(&dir)).unwrap();
    journal.record(accepted("open", 1));
    journal.record(event("open", 0, RunEventKind::Started));
    journal.record(event("open", 1, RunEventKind::text("so far")));
    journal.flush().await;
    let events = journal.events(&RunId::new("open"), 0, 10).await.unwrap();
    assert_eq!(events.iter().map(|e| e.index).collect::<Vec<_>>(), [0, 1]);
    let run = journal.run(&RunId::new("open")).await.unwrap().unwrap();
    assert_eq!(run.outcome, RunOutcome::Open);
    // Closing writes what is held, too.
    journal.record(event("open", 2, RunEventKind::text(" and more")));
    journal.close().await;
    drop(journal);
    let journal = reopen(&dir).await;
    let events = journal.events(&RunId::new("open"), 0, 10).await.unwrap();
    assert_eq!(events.len(), 3, "{events:?}");
    journal.close().await;
}

#[tokio::test]
async fn held_events_are_written_when_their_hold_is_over() {
    let dir = tempfile::tempdir().unwrap();
    let hold = JournalConfig {
        open_events_hold_ms: 1,
        ..config(&dir)
    };
    let journal = SqliteJournal::open(&hold, &file(&dir)).unwrap();
    journal.record(accepted("slow", 1));
    journal.record(event("slow", 0, RunEventKind::text("a")));
    // No flush: the writer wakes for the hold's end by itself.
    let written = || stored_events(&dir, "slow").1;
    until("the held event is written", || written() > 0).await;
    assert_eq!(written(), 1);
    journal.close().await;
}

/// Flushes `journal` while acknowledging every batch `feed` hands over, as the stream's
/// publisher does; checks that the flush never returns before the batches it waits for are
/// acknowledged. Returns the batches' bytes, in order.
async fn flush_acknowledging(journal: &Arc<SqliteJournal>, feed: &mut ReplicaFeed) -> Vec<Vec<u8>> {
    let mut flush = tokio::spawn({
        let journal = Arc::clone(journal);
        async move { journal.flush().await }
    });
    let mut published = Vec::new();
    loop {
        tokio::select! {
            done = &mut flush => {
                done.unwrap();
                return published;
            }
            batch = feed.next() => {
                let batch = batch.expect("the journal is open");
                tokio::task::yield_now().await;
                assert!(!flush.is_finished(), "a flush returned before the stream acknowledged");
                feed.acknowledged(&batch);
                published.push(batch.bytes);
            }
        }
    }
}

#[tokio::test]
async fn a_members_replicated_batches_rebuild_another_members_journal_once_acknowledged() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, mut feed) = SqliteJournal::open_replicated(&config(&dir_a), &file(&dir_a)).unwrap();
    let (b, _unused) = SqliteJournal::open_replicated(&config(&dir_b), &file(&dir_b)).unwrap();
    let a = Arc::new(a);
    a.set_publishing(true);
    a.record(accepted("r1", 1));
    a.record(placed("r1", "node-a"));
    a.record(event("r1", 0, RunEventKind::Started));
    a.record(event("r1", 1, RunEventKind::text("hi")));
    let batches = flush_acknowledging(&a, &mut feed).await;
    assert!(!batches.is_empty());

    // Folded into the other member's journal, the run is open there, as a takeover finds it.
    assert!(
        b.apply_replica(&[super::replica::VERSION, 9]).is_err(),
        "damaged: refused whole"
    );
    for bytes in &batches {
        b.apply_replica(bytes).expect("a batch applies");
    }
    b.flush().await;
    assert_eq!(b.reload_left_open().await.unwrap(), 1);
    let left = b.take_left_open();
    assert_eq!(left[0].accepted.run_id, RunId::new("r1"));
    assert_eq!(left[0].attempts.len(), 1);
    assert_eq!(b.events(&RunId::new("r1"), 0, 10).await.unwrap().len(), 2);

    // Its ending follows, with its usage.
    a.record(event("r1", 2, completed()));
    for bytes in flush_acknowledging(&a, &mut feed).await {
        b.apply_replica(&bytes).expect("a batch applies");
    }
    b.flush().await;
    let record = b.run(&RunId::new("r1")).await.unwrap().unwrap();
    assert_eq!(record.outcome, RunOutcome::Completed);
    assert_eq!((record.events, record.events_stored), (3, 3));
    assert_eq!(b.reload_left_open().await.unwrap(), 0);
    assert!(
        a.kept_for_takeover(),
        "publishing: a flush's entries are in the stream"
    );
    // Standing by, the journal hands nothing over: its flush returns with nothing
    // acknowledged (a batch handed over would hold it until acknowledged), and what it
    // returned for is in this file only — no node may forget it (the nemesis, issue 66).
    a.set_publishing(false);
    a.record(accepted("r2", 2));
    a.flush().await;
    assert!(!a.kept_for_takeover());
    a.close().await;
    b.close().await;
}

#[tokio::test]
async fn a_copy_holds_the_batches_handed_over_and_replaces_a_running_members_content() {
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, mut feed) = SqliteJournal::open_replicated(&config(&dir_a), &file(&dir_a)).unwrap();
    let (b, _unused) = SqliteJournal::open_replicated(&config(&dir_b), &file(&dir_b)).unwrap();
    let a = Arc::new(a);
    a.set_publishing(true);
    a.record(accepted("open", 1));
    a.record(placed("open", "node-a"));
    a.record(event("open", 0, RunEventKind::Started));
    a.record(accepted("done", 2));
    a.record(event("done", 0, completed()));
    let batches = flush_acknowledging(&a, &mut feed).await;
    let copy = dir_a.path().join("copy.sqlite3");
    let handed = a.snapshot_to(&copy).await.expect("a copy");
    assert_eq!(
        handed,
        batches.len() as u64,
        "the copy holds every batch handed over"
    );

    // Written after the copy: not in it, and counted past it.
    a.record(accepted("later", 3));
    let after = flush_acknowledging(&a, &mut feed).await;
    assert!(!after.is_empty());

    // A member holding other content (a fenced member's own batches) is replaced while it
    // runs: its readers see the copy's runs, its open runs are the copy's, and it writes on.
    b.record(accepted("stale", 4));
    b.flush().await;
    assert_eq!(b.restore_from(&copy).await.expect("replaced"), 1);
    assert!(b.run(&RunId::new("stale")).await.unwrap().is_none());
    assert!(b.run(&RunId::new("later")).await.unwrap().is_none());
    let done = b
        .run(&RunId::new("done"))
        .await
        .unwrap()
        .expect("in the copy");
    assert_eq!(done.outcome, RunOutcome::Completed);
    assert_eq!(b.reload_left_open().await.unwrap(), 1);
    assert_eq!(b.take_left_open()[0].accepted.run_id, RunId::new("open"));
    for bytes in &after {
        b.apply_replica(bytes).expect("a batch applies");
    }
    b.record(event("open", 1, completed()));
    b.flush().await;
    assert!(b.run(&RunId::new("later")).await.unwrap().is_some());
    let ended = b.run(&RunId::new("open")).await.unwrap().unwrap();
    assert_eq!(ended.outcome, RunOutcome::Completed);
    assert_eq!(b.reload_left_open().await.unwrap(), 1, "`later` is open");

    // A file that is no journal replaces nothing.
    let garbage = dir_b.path().join("garbage.sqlite3");
    std::fs::write(&garbage, b"not a database").unwrap();
    for from in [dir_b.path().join("missing.sqlite3"), garbage] {
        assert!(b.restore_from(&from).await.is_err(), "{}", from.display());
        assert!(b.run(&RunId::new("later")).await.unwrap().is_some());
    }
    // Emptied, it holds nothing, and writes on.
    assert_eq!(b.clear().await.expect("emptied"), 0);
    assert!(b.run(&RunId::new("done")).await.unwrap().is_none());
    b.record(accepted("fresh", 5));
    b.flush().await;
    assert!(b.run(&RunId::new("fresh")).await.unwrap().is_some());
    a.close().await;
    b.close().await;
}
