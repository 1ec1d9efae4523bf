//! One write batch, grouped by run before it touches SQLite: a run accepted and ended in the
//! same batch is one `INSERT` with its final values, its consecutive events are one chunk
//! row, and a run that only progressed gets one `UPDATE`. This keeps the writer's cost per
//! run and per event small, so on a machine with few cores the journal takes little CPU
//! from the relay.

use std::collections::HashMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::batch::{Chunk, Finish, Queued};
use super::writer::to_sql;
use crate::domain::{AcceptedRun, Attempt, RunId, RunOutcome, Usage};

/// What the writer knows of a run the file holds as open.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenRun {
    pub(super) seq: i64,
    /// Events of it stored so far.
    pub(super) stored: u64,
}

/// Everything one batch does to one run, borrowed from the batch (which the writer keeps
/// until the transaction commits, to try again after making room).
struct RunWrite<'a> {
    seq: i64,
    stored_before: u64,
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
                open.insert(run_id.clone(), OpenRun { seq, stored: 0 });
                plan.write(run_id, OpenRun { seq, stored: 0 }).insert = Some(run);
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
                insert: None,
                attempts: Vec::new(),
                chunks: Vec::new(),
                first_output_ms: None,
                finish: None,
            }
        })
    }

    /// Writes the plan; `open` learns how many events each open run now has stored.
    pub(super) fn apply(
        self,
        tx: &Transaction<'_>,
        open: &mut HashMap<RunId, OpenRun>,
    ) -> rusqlite::Result<()> {
        let Plan { order, mut runs } = self;
        let mut joined = Vec::new();
        for run_id in order {
            let Some(write) = runs.remove(run_id) else {
                continue;
            };
            let stored = write.apply(tx, &mut joined)?;
            if let Some(known) = open.get_mut(run_id) {
                known.stored = stored;
            }
        }
        Ok(())
    }
}

/// The run's row number and stored events, from memory or (rarely) the file.
fn known(
    tx: &Transaction<'_>,
    open: &HashMap<RunId, OpenRun>,
    run_id: &RunId,
) -> rusqlite::Result<Option<OpenRun>> {
    if let Some(known) = open.get(run_id) {
        return Ok(Some(*known));
    }
    tx.prepare_cached("SELECT seq, events_stored FROM runs WHERE run_id = ?1")?
        .query_row([run_id.as_str()], |row| {
            Ok(OpenRun {
                seq: row.get(0)?,
                stored: u64::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
            })
        })
        .optional()
}

impl RunWrite<'_> {
    /// Writes the run's rows, consecutive chunks as one (joined in `joined`); returns how
    /// many of its events are stored now.
    fn apply(self, tx: &Transaction<'_>, joined: &mut Vec<u8>) -> rusqlite::Result<u64> {
        let mut stored = self.stored_before;
        let mut chunks = self.chunks.iter().peekable();
        while let Some(first) = chunks.next() {
            let mut count = first.count;
            let mut bytes = first.packed.bytes();
            if chunks
                .peek()
                .is_some_and(|next| next.first_idx == first.first_idx + count)
            {
                // A packed chunk says its node and numbering again at its start, so two
                // back to back read as one.
                joined.clear();
                joined.extend_from_slice(bytes);
                while let Some(next) =
                    chunks.next_if(|next| next.first_idx == first.first_idx + count)
                {
                    joined.extend_from_slice(next.packed.bytes());
                    count += next.count;
                }
                bytes = joined;
            }
            tx.prepare_cached(
                "INSERT OR IGNORE INTO events (run_seq, first_idx, count, json, packed)
                 VALUES (?1, ?2, ?3, '', ?4)",
            )?
            .execute(params![
                self.seq,
                to_sql(first.first_idx),
                to_sql(count),
                bytes
            ])?;
            stored += count;
        }
        for attempt in &self.attempts {
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
            Some(run) => insert_run(tx, self.seq, run, &self, stored)?,
            None => update_run(tx, &self, stored)?,
        }
        Ok(stored)
    }
}

/// The values of the columns a batch may set: outcome, times, codes, tokens, counts.
fn finish_values(write: &RunWrite, stored: u64) -> [rusqlite::types::Value; 12] {
    use rusqlite::types::Value;
    let text = |v: Option<&String>| v.map_or(Value::Null, |t| Value::Text(t.clone()));
    let int = |v: Option<u64>| v.map_or(Value::Null, |n| Value::Integer(to_sql(n)));
    let finish = write.finish;
    let usage = finish.and_then(|f| f.usage);
    let token =
        |read: fn(&Usage) -> u32| usage.map_or(Value::Null, |u| Value::Integer(read(&u).into()));
    [
        Value::Text(
            finish
                .map_or(RunOutcome::Open, |f| f.outcome)
                .as_str()
                .to_owned(),
        ),
        int(write.first_output_ms),
        int(finish.map(|f| f.at_ms)),
        text(finish.and_then(|f| f.code.as_ref())),
        text(finish.and_then(|f| f.message.as_ref())),
        text(finish.and_then(|f| f.finish_reason.as_ref())),
        token(|u| u.input_tokens),
        token(|u| u.output_tokens),
        token(|u| u.cached_input_tokens),
        token(|u| u.reasoning_tokens),
        int(finish.map(|f| f.events)),
        Value::Integer(to_sql(stored)),
    ]
}

fn insert_run(
    tx: &Transaction<'_>,
    seq: i64,
    run: &AcceptedRun,
    write: &RunWrite,
    stored: u64,
) -> rusqlite::Result<()> {
    let mut values: Vec<rusqlite::types::Value> = vec![
        seq.into(),
        run.run_id.as_str().to_owned().into(),
        run.adapter.as_str().to_owned().into(),
        run.target.as_str().to_owned().into(),
        run.operation.as_str().to_owned().into(),
        run.pin.clone().into(),
        run.api_key_name.clone().into(),
        to_sql(run.queued_ms).into(),
    ];
    values.extend(finish_values(write, stored));
    if matches!(values.get(18), Some(rusqlite::types::Value::Null)) {
        values[18] = 0i64.into();
    }
    tx.prepare_cached(
        "INSERT OR IGNORE INTO runs (seq, run_id, adapter, target, operation, pin, api_key_name,
            queued_ms, outcome, first_output_ms, finished_ms, code, message, finish_reason,
            input_tokens, output_tokens, cached_input_tokens, reasoning_tokens, events, events_stored)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
    )?
    .execute(rusqlite::params_from_iter(values))?;
    Ok(())
}

fn update_run(tx: &Transaction<'_>, write: &RunWrite, stored: u64) -> rusqlite::Result<()> {
    if write.finish.is_none() {
        if let Some(first) = write.first_output_ms {
            tx.prepare_cached(
                "UPDATE runs SET first_output_ms = coalesce(first_output_ms, ?2) WHERE seq = ?1",
            )?
            .execute(params![write.seq, to_sql(first)])?;
        }
        return Ok(());
    }
    let mut values: Vec<rusqlite::types::Value> = vec![write.seq.into()];
    values.extend(finish_values(write, stored));
    tx.prepare_cached(
        "UPDATE runs SET outcome = ?2, first_output_ms = coalesce(first_output_ms, ?3),
            finished_ms = ?4, code = ?5, message = ?6, finish_reason = ?7, input_tokens = ?8,
            output_tokens = ?9, cached_input_tokens = ?10, reasoning_tokens = ?11,
            events = ?12, events_stored = ?13
         WHERE seq = ?1",
    )?
    .execute(rusqlite::params_from_iter(values))?;
    Ok(())
}
