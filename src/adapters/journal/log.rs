//! The journal's log (schema 7): one row per write transaction in `batches`, holding the
//! records of the runs that batch ended, a snapshot of each run it left open, later
//! placements of open runs, and every event chunk it wrote (`frames.rs` says how they are
//! laid out), with a filter of the run ids it holds and one of what its ended runs may be
//! listed by (`bloom.rs`).
//!
//! A run costs no row and no index entry of its own: one `INSERT` per transaction carries
//! all of its runs, so the writer's cost per run is the bytes the run says. What the
//! readers need of a run they find from the rows: by id through the id filters, listings
//! through the range of acceptance times of the runs each batch ended (`batches_by_ended`)
//! and the facet filters, a run's events from the batch its events start in
//! (`events_from`) to its end.
//!
//! The writer keeps each open run's record in memory ([`OpenRun`]); the file has it from
//! the first batch that leaves the run open (a snapshot frame), so a restarted edge finds
//! the runs left open by reading from the oldest batch any of them is in (`open_from`,
//! stored with every batch) to the end ([`fold_open`]).

use std::borrow::Cow;
use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::batch::{Finish, PackedEvents, Queued};
use super::bloom::IdFilter;
use super::frames::{
    EventChunk, Frame, Stored, push_events, push_open, push_placed, push_record, read_frames,
    read_records,
};
use super::sql::{damaged, to_sql};
use crate::domain::routing::KeySource;
use crate::domain::{
    Bucket, NodeId, Rollup, RunId, RunOutcome, RunQuery, RunRecord, UsageCounts, UsageGroup,
};

/// A batch row holds at most about this many bytes of entries; a transaction with more
/// writes several. Retention removes whole rows, and a read by run id decodes whole rows:
/// small enough for both to be fine-grained, large enough that a row's own cost (its filter,
/// its index entry) is spread over hundreds of runs.
pub(super) const ROW_MAX_BYTES: usize = 256 << 10;

/// The open runs by id, as the writer keeps them (hashed with foldhash: the writer
/// looks a run up a few times per run, and SipHash was a tenth of its time).
pub(super) type OpenRuns = HashMap<RunId, OpenRun, foldhash::fast::RandomState>;

/// What the writer knows of a run still open.
#[derive(Debug, Clone)]
pub(super) struct OpenRun {
    /// Its record so far (outcome open), and the batch its events start in: a row after
    /// that one follows a snapshot of it, so its placements there are frames of their own.
    pub(super) stored: Stored,
    /// The last row whose id filter has it, so a row adds it once.
    pub(super) in_row: i64,
}

/// One batch row, built from a batch of queued entries (borrowed: the writer keeps the
/// batch until its transaction commits).
pub(super) struct BatchRow<'a> {
    seq: i64,
    ids: IdFilter,
    ended: Vec<Stored>,
    /// The ending each ended run came with, for the usage rollups (`None`: not counted).
    finishes: Vec<Option<&'a Finish>>,
    frames: Vec<u8>,
}

impl<'a> BatchRow<'a> {
    /// The row `batch` makes as batch `seq`; `open` follows the runs it accepts and ends.
    /// Entries of runs not open are skipped.
    pub(super) fn of(seq: i64, batch: &'a [Queued], open: &mut OpenRuns) -> Self {
        let mut row = Self {
            seq,
            // A run has two entries or more (accepted, events), most often three.
            ids: IdFilter::with_capacity(batch.len().div_ceil(2)),
            ended: Vec::with_capacity(batch.len() / 3),
            finishes: Vec::with_capacity(batch.len() / 3),
            frames: Vec::with_capacity(batch.iter().map(Queued::estimated_bytes).sum()),
        };
        let mut accepted: Vec<&RunId> = Vec::new();
        for entry in batch {
            let run_id = entry.run_id();
            if let Queued::Accepted(run) = entry {
                let stored = Stored {
                    record: RunRecord::open(run.as_ref().clone()),
                    events_from: seq,
                };
                row.ids.insert(run_id.as_str());
                let run = OpenRun {
                    stored,
                    in_row: seq,
                };
                open.insert(run_id.clone(), run);
                accepted.push(run_id);
                continue;
            }
            let Some(run) = open.get_mut(run_id) else {
                continue;
            };
            if run.in_row != seq {
                row.ids.insert(run_id.as_str());
                run.in_row = seq;
            }
            match entry {
                Queued::Placed { attempt, .. } => {
                    if run.stored.events_from < seq {
                        push_placed(run_id, attempt, &mut row.frames);
                    }
                    run.stored.record.attempts.push(attempt.clone());
                }
                Queued::Events(events) => {
                    row.add_events(events, run);
                    if let Some(finish) = &events.finish
                        && let Some(run) = open.remove(run_id)
                    {
                        row.end(run.stored, finish);
                    }
                }
                Queued::Accepted(_) => {}
            }
        }
        for run_id in accepted {
            if let Some(run) = open.get(run_id) {
                push_open(&run.stored, &mut row.frames);
            }
        }
        row
    }

    /// Adds `events`' chunks, and what they say of the run, to `run`.
    fn add_events(&mut self, events: &PackedEvents, run: &mut OpenRun) {
        let record = &mut run.stored.record;
        for (i, chunk) in events.chunks.iter().enumerate() {
            let chunk_frame = EventChunk {
                run_id: events.run_id.as_str(),
                first_idx: chunk.first_idx,
                count: chunk.count,
                first_output_ms: events.first_output_ms.filter(|_| i == 0),
                packed: chunk.packed.bytes(),
            };
            push_events(&chunk_frame, &mut self.frames);
            record.events_stored += chunk.count;
        }
        if let Some(at_ms) = events.first_output_ms {
            record.first_output_ms.get_or_insert(at_ms);
        }
    }

    /// A row of snapshots of `runs` (open runs carried forward, or a legacy file's open
    /// runs), their events starting in it.
    pub(super) fn carrying<'r>(seq: i64, runs: impl Iterator<Item = &'r mut OpenRun>) -> Self {
        let runs: Vec<&mut OpenRun> = runs.collect();
        let mut row = Self {
            seq,
            ids: IdFilter::with_capacity(runs.len()),
            ended: Vec::new(),
            finishes: Vec::new(),
            frames: Vec::new(),
        };
        for run in runs {
            run.stored.events_from = seq;
            run.stored.record.events_stored = 0;
            push_open(&run.stored, &mut row.frames);
            row.ids.insert(run.stored.record.run_id().as_str());
        }
        row
    }

    /// A row of `records` as they are (a legacy file's finished runs, or runs left open
    /// ended as unknown) and `frames` beside them, which are about the runs `frame_ids`.
    pub(super) fn of_records(
        seq: i64,
        records: Vec<Stored>,
        frames: Vec<u8>,
        frame_ids: &[&str],
    ) -> Self {
        let mut filter = IdFilter::with_capacity(records.len() + frame_ids.len());
        let ended_ids = records.iter().map(|s| s.record.run_id().as_str());
        for id in ended_ids.chain(frame_ids.iter().copied()) {
            filter.insert(id);
        }
        Self {
            seq,
            ids: filter,
            finishes: records.iter().map(|_| None).collect(),
            ended: records,
            frames,
        }
    }

    /// Ends `stored`'s run with `finish`.
    fn end(&mut self, mut stored: Stored, finish: &'a Finish) {
        let ending = &finish.ending;
        let record = &mut stored.record;
        record.outcome = ending.outcome;
        record.finished_ms = Some(ending.finished_ms);
        record.code.clone_from(&ending.code);
        record.message.clone_from(&ending.message);
        if ending.finish_reason.is_some() {
            record.finish_reason.clone_from(&ending.finish_reason);
        }
        if ending.usage.is_some() {
            record.usage = ending.usage;
        }
        record.events = finish.events;
        self.ended.push(stored);
        // A run whose ending is not known (an edge left it open) counts nowhere.
        self.finishes
            .push(Some(finish).filter(|f| f.ending.outcome != RunOutcome::Unknown));
    }

    /// Whether the row holds nothing (every entry was of a run not open).
    pub(super) fn is_empty(&self) -> bool {
        self.ended.is_empty() && self.frames.is_empty()
    }

    /// Writes the row and the usage of the runs it ends. `open_from` is the oldest batch an
    /// open run's events start in after this one; `now_ms` the row's time when it ends no
    /// run (else its time is the newest of its runs' ends, so age retention goes by when
    /// runs ended, not by when they were written).
    pub(super) fn insert(
        &self,
        tx: &Transaction<'_>,
        now_ms: u64,
        open_from: i64,
    ) -> rusqlite::Result<()> {
        let mut ended = Vec::with_capacity(self.ended.len() * 384);
        for stored in &self.ended {
            push_record(stored, &mut ended);
        }
        let queued = self.ended.iter().map(|s| s.record.accepted.queued_ms);
        let (from, to) = (queued.clone().min(), queued.max());
        let newest_ms = self
            .ended
            .iter()
            .map(|s| s.record.finished_ms.unwrap_or(s.record.accepted.queued_ms))
            .max()
            .unwrap_or(now_ms);
        // Most runs of a row share their key, outcome, adapter and target: about two
        // distinct values a run.
        let mut facets = IdFilter::with_capacity(self.ended.len() * 2);
        for stored in &self.ended {
            record_facets(&stored.record, |tag, value| {
                facets.insert_tagged(tag, value)
            });
        }
        tx.prepare_cached(
            "INSERT INTO batches (seq, newest_ms, ended_from_ms, ended_to_ms, ended_count,
                open_from, ids, facets, ended, frames)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        )?
        .execute(params![
            self.seq,
            to_sql(newest_ms),
            from.map(to_sql),
            to.map(to_sql),
            self.ended.len() as i64,
            open_from.min(self.seq),
            self.ids.bytes(),
            facets.bytes(),
            ended,
            self.frames,
        ])?;
        upsert_usage(tx, &self.rollup())
    }

    /// Every bucket size's rows for the runs this batch ends, summed per minute and group
    /// first with keys borrowed from the batch, so a run costs no allocation (an hour or a
    /// day starts on a minute).
    fn rollup(&self) -> Rollup {
        let mut sums: HashMap<EndingGroup<'_>, UsageCounts, foldhash::fast::RandomState> =
            HashMap::default();
        for (stored, finish) in self.ended.iter().zip(&self.finishes) {
            let Some(finish) = finish else {
                continue;
            };
            let ending = &finish.ending;
            let accepted = &stored.record.accepted;
            let group = (
                Bucket::Minute.start_of(ending.finished_ms),
                accepted.api_key_name.as_deref(),
                finish.adapter.as_str(),
                finish.target.as_str(),
                finish.node.as_ref().map(NodeId::as_str),
                KeySource::label(accepted.affinity),
            );
            let failed = ending.outcome == RunOutcome::Failed;
            sums.entry(group)
                .or_default()
                .add(&UsageCounts::of_run(ending.usage.as_ref(), failed));
        }
        let mut rollup = Rollup::default();
        for ((minute, key, adapter, target, node, affinity), counts) in &sums {
            let group = UsageGroup {
                key: key.map(str::to_owned),
                model: Some(format!("{adapter}/{target}")),
                node: node.map(str::to_owned),
                affinity: Some(Cow::Borrowed(*affinity)),
            };
            rollup.add(*minute, &group, counts);
        }
        rollup
    }
}

/// A minute's start, the key's name, the adapter, the target, the node and the affinity
/// source of a run's ending, borrowed from the batch.
type EndingGroup<'a> = (
    u64,
    Option<&'a str>,
    &'a str,
    &'a str,
    Option<&'a str>,
    &'static str,
);

/// The kinds of value a listing filters ended runs by, as a row's facet filter tags them.
const NODE: u8 = 1;
const KEY: u8 = 2;
const OUTCOME: u8 = 3;
const ADAPTER: u8 = 4;
const TARGET: u8 = 5;

/// Calls `add` with each value `record` may be listed by: every node it was placed on, its
/// key, outcome, adapter and target.
fn record_facets<'r>(record: &'r RunRecord, mut add: impl FnMut(u8, &'r str)) {
    for attempt in &record.attempts {
        add(NODE, attempt.node.as_str());
    }
    if let Some(key) = &record.accepted.api_key_name {
        add(KEY, key);
    }
    add(OUTCOME, record.outcome.as_str());
    add(ADAPTER, record.accepted.adapter.as_str());
    add(TARGET, record.accepted.target.as_str());
}

/// The values every run `query` lists must have, tagged as [`record_facets`] tags them:
/// a row whose facet filter lacks one ends no run the listing wants.
pub(super) fn query_facets(query: &RunQuery) -> Vec<(u8, String)> {
    let mut facets = Vec::new();
    if let Some(node) = &query.node {
        facets.push((NODE, node.as_str().to_owned()));
    }
    if let Some(key) = &query.api_key_name {
        facets.push((KEY, key.clone()));
    }
    if let Some(outcome) = query.outcome {
        facets.push((OUTCOME, outcome.as_str().to_owned()));
    }
    if let Some(adapter) = &query.adapter {
        facets.push((ADAPTER, adapter.as_str().to_owned()));
    }
    if let Some(target) = &query.target {
        facets.push((TARGET, target.as_str().to_owned()));
    }
    facets
}

/// The oldest batch an open run's events start in (`next_seq` when none is open).
pub(super) fn open_from(open: &OpenRuns, next_seq: i64) -> i64 {
    open.values()
        .map(|run| run.stored.events_from)
        .min()
        .unwrap_or(next_seq)
}

/// Adds every row of `rollup` to the `usage` table.
fn upsert_usage(tx: &Transaction<'_>, rollup: &Rollup) -> rusqlite::Result<()> {
    if rollup.is_empty() {
        return Ok(());
    }
    let mut statement = tx.prepare_cached(
        "INSERT INTO usage (bucket, start_ms, key, model, node, affinity, runs, errors,
            input_tokens, cached_input_tokens, output_tokens, reasoning_tokens)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (bucket, start_ms, key, model, node, affinity) DO UPDATE SET
            runs = runs + excluded.runs, errors = errors + excluded.errors,
            input_tokens = input_tokens + excluded.input_tokens,
            cached_input_tokens = cached_input_tokens + excluded.cached_input_tokens,
            output_tokens = output_tokens + excluded.output_tokens,
            reasoning_tokens = reasoning_tokens + excluded.reasoning_tokens",
    )?;
    for (bucket, start, group, counts) in rollup.rows() {
        let name = |v: &Option<String>| v.clone().unwrap_or_default();
        statement.execute(params![
            bucket.as_str(),
            to_sql(start),
            name(&group.key),
            name(&group.model),
            name(&group.node),
            group.affinity.as_deref().unwrap_or_default(),
            to_sql(counts.runs),
            to_sql(counts.errors),
            to_sql(counts.input_tokens),
            to_sql(counts.cached_input_tokens),
            to_sql(counts.output_tokens),
            to_sql(counts.reasoning_tokens),
        ])?;
    }
    Ok(())
}

/// The runs the file holds as open, as the writer keeps them, and the next batch's number:
/// read from the oldest batch the last one says an open run's events start in.
///
/// # Errors
/// What SQLite reported; a damaged row as `InvalidColumnType`.
pub(super) fn fold_open(conn: &Connection) -> rusqlite::Result<(OpenRuns, i64)> {
    let last: Option<(i64, i64)> = conn
        .query_row(
            "SELECT seq, open_from FROM batches ORDER BY seq DESC LIMIT 1",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .optional()?;
    let Some((last, from)) = last else {
        return Ok((OpenRuns::default(), 1));
    };
    let mut open = OpenRuns::default();
    let mut statement =
        conn.prepare("SELECT ended, frames FROM batches WHERE seq >= ?1 ORDER BY seq")?;
    let mut rows = statement.query([from])?;
    while let Some(row) = rows.next()? {
        for frame in read_frames(row.get_ref(1)?.as_blob()?).map_err(damaged)? {
            match frame {
                Frame::Open(stored) => {
                    let id = stored.record.run_id().clone();
                    open.insert(
                        id,
                        OpenRun {
                            stored: *stored,
                            in_row: 0,
                        },
                    );
                }
                Frame::Placed { run_id, attempt } => {
                    if let Some(run) = open.get_mut(&RunId::new(run_id)) {
                        run.stored.record.attempts.push(attempt);
                    }
                }
                Frame::Events(chunk) => {
                    if let Some(run) = open.get_mut(&RunId::new(chunk.run_id)) {
                        let record = &mut run.stored.record;
                        record.events_stored += chunk.count;
                        if record.first_output_ms.is_none() {
                            record.first_output_ms = chunk.first_output_ms;
                        }
                    }
                }
            }
        }
        for ended in read_records(row.get_ref(0)?.as_blob()?).map_err(damaged)? {
            open.remove(ended.record.run_id());
        }
    }
    Ok((open, last + 1))
}
