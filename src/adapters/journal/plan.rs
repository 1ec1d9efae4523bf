//! One write batch, grouped by run before it touches SQLite: a run accepted and ended in the
//! same batch is one `INSERT` with its final values, its consecutive events are one chunk
//! row, and a run that only progressed gets one `UPDATE`. This keeps the writer's cost per
//! run and per event small, so on a machine with few cores the journal takes little CPU
//! from the relay.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{CachedStatement, OptionalExtension, Transaction, params};

use super::batch::{Chunk, Finish, Queued};
use super::writer::to_sql;
use crate::domain::routing::KeySource;
use crate::domain::{
    AcceptedRun, Attempt, Bucket, NodeId, Rollup, RunId, RunOutcome, Usage, UsageCounts, UsageGroup,
};

/// What the writer knows of a run the file holds as open.
#[derive(Debug, Clone)]
pub(super) struct OpenRun {
    pub(super) seq: i64,
    /// Events of it stored so far.
    pub(super) stored: u64,
    /// The name of its API key, for the usage rollups.
    pub(super) key: Option<Arc<str>>,
    /// Its affinity source as metrics name it, for the usage rollups (empty: not known, a
    /// run a schema-5 edge accepted).
    pub(super) affinity: &'static str,
}

/// Everything one batch does to one run, borrowed from the batch (which the writer keeps
/// until the transaction commits, to try again after making room).
struct RunWrite<'a> {
    seq: i64,
    stored_before: u64,
    key: Option<Arc<str>>,
    affinity: &'static str,
    insert: Option<&'a AcceptedRun>,
    attempts: Vec<&'a Attempt>,
    chunks: Vec<&'a Chunk>,
    first_output_ms: Option<u64>,
    finish: Option<&'a Finish>,
}

/// A batch grouped by run, in first-seen order.
#[derive(Default)]
pub(super) struct Plan<'a> {
    order: Vec<&'a RunId>,
    runs: HashMap<&'a RunId, RunWrite<'a>>,
}

impl<'a> Plan<'a> {
    /// Groups `batch`; `open` is updated as runs are accepted and end, `next_seq` numbers
    /// new runs. Entries of runs the file does not hold are skipped.
    pub(super) fn of(
        tx: &Transaction<'_>,
        batch: &'a [Queued],
        open: &mut HashMap<RunId, OpenRun>,
        next_seq: &mut i64,
    ) -> rusqlite::Result<Self> {
        let mut plan = Plan::default();
        for entry in batch {
            let run_id = entry.run_id();
            if let Queued::Accepted(run) = entry {
                let seq = *next_seq;
                *next_seq += 1;
                let known = OpenRun {
                    seq,
                    stored: 0,
                    key: run.api_key_name.as_deref().map(Arc::from),
                    affinity: KeySource::label(run.affinity),
                };
                open.insert(run_id.clone(), known.clone());
                plan.write(run_id, known).insert = Some(run);
                continue;
            }
            let Some(known) = known(tx, open, run_id)? else {
                continue;
            };
            let write = plan.write(run_id, known);
            match entry {
                Queued::Placed { attempt, .. } => write.attempts.push(attempt),
                Queued::Events(events) => {
                    write.chunks.extend(&events.chunks);
                    if let Some(at_ms) = events.first_output_ms {
                        write.first_output_ms.get_or_insert(at_ms);
                    }
                    if let Some(finish) = &events.finish {
                        write.finish = Some(finish);
                        open.remove(run_id);
                    }
                }
                Queued::Accepted(_) => {}
            }
        }
        Ok(plan)
    }

    fn write(&mut self, run_id: &'a RunId, known: OpenRun) -> &mut RunWrite<'a> {
        self.runs.entry(run_id).or_insert_with(|| {
            self.order.push(run_id);
            RunWrite {
                seq: known.seq,
                stored_before: known.stored,
                key: known.key,
                affinity: known.affinity,
                insert: None,
                attempts: Vec::new(),
                chunks: Vec::new(),
                first_output_ms: None,
                finish: None,
            }
        })
    }

    /// Writes the plan and the usage of the runs it ends (summed per minute and group
    /// first, so a run costs no allocation; one upsert per row); `open` learns how many
    /// events each open run now has stored.
    pub(super) fn apply(
        self,
        tx: &Transaction<'_>,
        open: &mut HashMap<RunId, OpenRun>,
    ) -> rusqlite::Result<()> {
        let Plan { order, mut runs } = self;
        let mut endings = Endings::default();
        // Prepared once per transaction: looking a statement up hashes its whole text.
        let mut insert = tx.prepare_cached(INSERT_RUN)?;
        for run_id in order {
            let Some(write) = runs.remove(run_id) else {
                continue;
            };
            endings.add(&write);
            let stored = write.apply(tx, &mut insert)?;
            if let Some(known) = open.get_mut(run_id) {
                known.stored = stored;
            }
        }
        upsert_usage(tx, &endings.rollup())
    }
}

/// The usage of one transaction's endings by UTC minute, key, adapter, target, node and
/// affinity source, borrowed from the batch.
#[derive(Default)]
struct Endings<'a> {
    sums: HashMap<EndingGroup<'a>, UsageCounts>,
}

/// A minute's start, the key's name, the adapter, the target, the node and the affinity
/// source.
type EndingGroup<'a> = (
    u64,
    Option<Arc<str>>,
    &'a str,
    &'a str,
    Option<&'a str>,
    &'static str,
);

impl<'a> Endings<'a> {
    /// Counts `write`'s run when its batch ends it.
    fn add(&mut self, write: &RunWrite<'a>) {
        // A run whose ending is not known (an edge left it open) counts nowhere.
        let Some(finish) = write
            .finish
            .filter(|f| f.ending.outcome != RunOutcome::Unknown)
        else {
            return;
        };
        let ending = &finish.ending;
        let failed = ending.outcome == RunOutcome::Failed;
        let group = (
            Bucket::Minute.start_of(ending.finished_ms),
            write.key.clone(),
            finish.adapter.as_str(),
            finish.target.as_str(),
            finish.node.as_ref().map(NodeId::as_str),
            write.affinity,
        );
        self.sums
            .entry(group)
            .or_default()
            .add(&UsageCounts::of_run(ending.usage.as_ref(), failed));
    }

    /// Every bucket size's rows (an hour or a day starts on a minute).
    fn rollup(&self) -> Rollup {
        let mut rollup = Rollup::default();
        for ((minute, key, adapter, target, node, affinity), counts) in &self.sums {
            let group = UsageGroup {
                key: key.as_deref().map(str::to_owned),
                model: Some(format!("{adapter}/{target}")),
                node: node.map(str::to_owned),
                affinity: (!affinity.is_empty()).then_some(Cow::Borrowed(*affinity)),
            };
            rollup.add(*minute, &group, counts);
        }
        rollup
    }
}

/// The run's row number and stored events, from memory or (rarely) the file.
fn known(
    tx: &Transaction<'_>,
    open: &HashMap<RunId, OpenRun>,
    run_id: &RunId,
) -> rusqlite::Result<Option<OpenRun>> {
    if let Some(known) = open.get(run_id) {
        return Ok(Some(known.clone()));
    }
    // A run an earlier edge left open has only its inline count in `events_stored`: its
    // stored events are counted (a run taken back after a restart ends with the right count).
    tx.prepare_cached(
        "SELECT seq, CASE WHEN outcome = 'open' THEN events_inline_count
            + (SELECT coalesce(sum(count), 0) FROM events WHERE run_seq = runs.seq)
            ELSE events_stored END, api_key_name, affinity FROM runs WHERE run_id = ?1",
    )?
    .query_row([run_id.as_str()], |row| {
        Ok(OpenRun {
            seq: row.get(0)?,
            stored: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
            key: row.get::<_, Option<String>>(2)?.map(Arc::from),
            affinity: stored_affinity(row.get::<_, Option<String>>(3)?.as_deref()),
        })
    })
    .optional()
}

/// The affinity source of a run as its row holds it (NULL: accepted by a schema-5 edge,
/// not known), named as metrics name it.
fn stored_affinity(name: Option<&str>) -> &'static str {
    name.map_or("", |name| KeySource::label(KeySource::parse(name)))
}

/// Consecutive chunks of a run joined: where they start, how many events, their bytes.
struct Joined<'a> {
    first_idx: u64,
    count: u64,
    bytes: Cow<'a, [u8]>,
}

/// `chunks` with each run of consecutive ones joined into one (a packed chunk says its node
/// and numbering again at its start, so two back to back read as one).
fn joined<'a>(chunks: &[&'a Chunk]) -> Vec<Joined<'a>> {
    let mut out: Vec<Joined<'a>> = Vec::with_capacity(chunks.len());
    for chunk in chunks {
        match out.last_mut() {
            Some(last) if last.first_idx + last.count == chunk.first_idx => {
                last.bytes.to_mut().extend_from_slice(chunk.packed.bytes());
                last.count += chunk.count;
            }
            _ => out.push(Joined {
                first_idx: chunk.first_idx,
                count: chunk.count,
                bytes: Cow::Borrowed(chunk.packed.bytes()),
            }),
        }
    }
    out
}

/// What of a new run goes into its own row: its first attempt and its first events, when
/// the batch that accepts it holds them — for most runs, all of them, so a run costs one
/// row.
struct Inline<'a> {
    attempt: Option<&'a Attempt>,
    events: Option<Joined<'a>>,
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

impl RunWrite<'_> {
    /// Writes the run's rows (a new run's with `insert`, [`INSERT_RUN`]); returns how many
    /// of its events are stored now.
    fn apply(
        self,
        tx: &Transaction<'_>,
        insert: &mut CachedStatement<'_>,
    ) -> rusqlite::Result<u64> {
        let mut chunks = joined(&self.chunks).into_iter().peekable();
        let mut attempts = self.attempts.iter().copied().peekable();
        // A run's first events go into its row whether the batch accepts it or a later
        // one brings them (the update rewrites the row anyway): no `events` row for them.
        let inline = Inline {
            attempt: attempts.next_if(|a| self.insert.is_some() && a.number == 1),
            events: chunks.next_if(|c| self.stored_before == 0 && c.first_idx == 0),
        };
        let mut stored = self.stored_before + inline.events.as_ref().map_or(0, |e| e.count);
        for chunk in chunks {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO events (run_seq, first_idx, count, json, packed)
                 VALUES (?1, ?2, ?3, '', ?4)",
            )?
            .execute(params![
                self.seq,
                to_sql(chunk.first_idx),
                to_sql(chunk.count),
                chunk.bytes.as_ref()
            ])?;
            stored += chunk.count;
        }
        for attempt in attempts {
            tx.prepare_cached(
                "INSERT OR REPLACE INTO attempts (run_seq, number, node, route_reason, started_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                self.seq,
                attempt.number,
                attempt.node.as_str(),
                attempt.route_reason,
                to_sql(attempt.started_ms),
            ])?;
        }
        match self.insert {
            Some(run) => insert_run(insert, run, &self, stored, &inline)?,
            None => update_run(tx, &self, stored, inline.events.as_ref())?,
        }
        Ok(stored)
    }
}

/// The values of the columns a batch may set: outcome, times, codes, tokens, counts —
/// borrowed from the batch, so binding them allocates nothing.
fn finish_values<'a>(write: &RunWrite<'a>, stored: u64) -> [ValueRef<'a>; 12] {
    let text = |v: Option<&'a String>| v.map_or(ValueRef::Null, |t| ValueRef::Text(t.as_bytes()));
    let int = |v: Option<u64>| v.map_or(ValueRef::Null, |n| ValueRef::Integer(to_sql(n)));
    let finish = write.finish;
    let usage = finish.and_then(|f| f.ending.usage);
    let token = |read: fn(&Usage) -> u32| {
        usage.map_or(ValueRef::Null, |u| ValueRef::Integer(read(&u).into()))
    };
    let outcome = finish
        .map_or(RunOutcome::Open, |f| f.ending.outcome)
        .as_str();
    [
        ValueRef::Text(outcome.as_bytes()),
        int(write.first_output_ms),
        int(finish.map(|f| f.ending.finished_ms)),
        text(finish.and_then(|f| f.ending.code.as_ref())),
        text(finish.and_then(|f| f.ending.message.as_ref())),
        text(finish.and_then(|f| f.ending.finish_reason.as_ref())),
        token(|u| u.input_tokens),
        token(|u| u.output_tokens),
        token(|u| u.cached_input_tokens),
        token(|u| u.reasoning_tokens),
        int(finish.map(|f| f.events)),
        ValueRef::Integer(to_sql(stored)),
    ]
}

/// A new run's row, its first attempt and first events inline.
const INSERT_RUN: &str = "INSERT OR IGNORE INTO runs (seq, run_id, adapter, target, operation,
        pin, api_key_name, queued_ms, node, route_reason, started_ms, events_inline,
        events_inline_count, outcome, first_output_ms, finished_ms, code, message, finish_reason,
        input_tokens, output_tokens, cached_input_tokens, reasoning_tokens, events, events_stored,
        deadline_ms, client_stream, affinity)
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
        ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28)";

fn insert_run<'a>(
    insert: &mut CachedStatement<'_>,
    run: &'a AcceptedRun,
    write: &RunWrite<'a>,
    stored: u64,
    inline: &'a Inline<'a>,
) -> rusqlite::Result<()> {
    let text = |v: Option<&'a str>| v.map_or(ValueRef::Null, |t| ValueRef::Text(t.as_bytes()));
    let attempt = inline.attempt;
    let events = inline.events.as_ref();
    let mut values = [ValueRef::Null; 28];
    values[..13].copy_from_slice(&[
        ValueRef::Integer(write.seq),
        ValueRef::Text(run.run_id.as_str().as_bytes()),
        ValueRef::Text(run.adapter.as_str().as_bytes()),
        ValueRef::Text(run.target.as_str().as_bytes()),
        ValueRef::Text(run.operation.as_str().as_bytes()),
        text(run.pin.as_deref()),
        text(run.api_key_name.as_deref()),
        ValueRef::Integer(to_sql(run.queued_ms)),
        text(attempt.map(|a| a.node.as_str())),
        text(attempt.map(|a| a.route_reason.as_str())),
        attempt.map_or(ValueRef::Null, |a| ValueRef::Integer(to_sql(a.started_ms))),
        events.map_or(ValueRef::Null, |e| ValueRef::Blob(&e.bytes)),
        ValueRef::Integer(to_sql(events.map_or(0, |e| e.count))),
    ]);
    values[13..25].copy_from_slice(&finish_values(write, stored));
    // `events` (the count relayed) is 0, not NULL, for a run not yet ended.
    if matches!(values[23], ValueRef::Null) {
        values[23] = ValueRef::Integer(0);
    }
    values[25] = run
        .deadline_ms
        .map_or(ValueRef::Null, |d| ValueRef::Integer(to_sql(d)));
    values[26] = text(run.client_stream.as_deref());
    values[27] = ValueRef::Text(write.affinity.as_bytes());
    insert.execute(rusqlite::params_from_iter(
        values.into_iter().map(ToSqlOutput::Borrowed),
    ))?;
    Ok(())
}

fn update_run(
    tx: &Transaction<'_>,
    write: &RunWrite,
    stored: u64,
    inline: Option<&Joined<'_>>,
) -> rusqlite::Result<()> {
    let (events, count) = inline.map_or((ValueRef::Null, 0), |e| {
        (ValueRef::Blob(&e.bytes), to_sql(e.count))
    });
    if write.finish.is_none() {
        if write.first_output_ms.is_some() || inline.is_some() {
            tx.prepare_cached(
                "UPDATE runs SET first_output_ms = coalesce(first_output_ms, ?2),
                    events_inline = coalesce(?3, events_inline),
                    events_inline_count = max(events_inline_count, ?4)
                 WHERE seq = ?1",
            )?
            .execute(rusqlite::params_from_iter(
                [
                    ValueRef::Integer(write.seq),
                    write
                        .first_output_ms
                        .map_or(ValueRef::Null, |at| ValueRef::Integer(to_sql(at))),
                    events,
                    ValueRef::Integer(count),
                ]
                .into_iter()
                .map(ToSqlOutput::Borrowed),
            ))?;
        }
        return Ok(());
    }
    let mut values = vec![ValueRef::Integer(write.seq)];
    values.extend(finish_values(write, stored));
    values.extend([events, ValueRef::Integer(count)]);
    tx.prepare_cached(
        "UPDATE runs SET outcome = ?2, first_output_ms = coalesce(first_output_ms, ?3),
            finished_ms = ?4, code = ?5, message = ?6, finish_reason = ?7, input_tokens = ?8,
            output_tokens = ?9, cached_input_tokens = ?10, reasoning_tokens = ?11,
            events = ?12, events_stored = ?13, events_inline = coalesce(?14, events_inline),
            events_inline_count = max(events_inline_count, ?15)
         WHERE seq = ?1",
    )?
    .execute(rusqlite::params_from_iter(
        values.into_iter().map(ToSqlOutput::Borrowed),
    ))?;
    Ok(())
}
