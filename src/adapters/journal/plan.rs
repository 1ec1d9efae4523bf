//! One write batch, grouped by run before it touches SQLite: a run accepted and ended in the
//! same batch is one `INSERT` with its final values, its consecutive events are one chunk
//! row, and a run that only progressed gets one `UPDATE`. This keeps the writer's cost per
//! run and per event small, so on a machine with few cores the journal takes little CPU
//! from the relay.

use std::collections::HashMap;

use rusqlite::{OptionalExtension, Transaction, params};

use super::writer::to_sql;
use crate::adapters::event_format::write_json_line;
use crate::domain::{AcceptedRun, Attempt, RunEventKind, RunId, RunOutcome, Usage};
use crate::ports::JournalEntry;

/// What the writer knows of a run the file holds as open.
#[derive(Debug, Clone, Copy)]
pub(super) struct OpenRun {
    pub(super) seq: i64,
    /// Events of it stored so far.
    pub(super) stored: u64,
}

/// A run's end, as its terminal event says.
struct Finish {
    outcome: RunOutcome,
    at_ms: u64,
    events: u64,
    code: Option<String>,
    message: Option<String>,
    finish_reason: Option<String>,
    usage: Option<Usage>,
}

/// Consecutive events of one run.
struct Chunk {
    first_idx: u64,
    count: u64,
    json: String,
}

/// Everything one batch does to one run.
struct RunWrite {
    seq: i64,
    stored_before: u64,
    insert: Option<Box<AcceptedRun>>,
    attempts: Vec<Attempt>,
    chunks: Vec<Chunk>,
    first_output_ms: Option<u64>,
    finish: Option<Finish>,
}

/// A batch grouped by run, in first-seen order.
#[derive(Default)]
pub(super) struct Plan {
    order: Vec<RunId>,
    runs: HashMap<RunId, RunWrite>,
}

impl Plan {
    /// Groups `batch`; `open` is updated as runs are accepted and end, `next_seq` numbers
    /// new runs. Entries of runs the file does not hold are skipped.
    pub(super) fn of(
        tx: &Transaction<'_>,
        batch: Vec<JournalEntry>,
        open: &mut HashMap<RunId, OpenRun>,
        next_seq: &mut i64,
    ) -> rusqlite::Result<Plan> {
        let mut plan = Plan::default();
        for entry in batch {
            let run_id = match &entry {
                JournalEntry::Accepted(run) => run.run_id.clone(),
                JournalEntry::Placed { run_id, .. } => run_id.clone(),
                JournalEntry::Event { event, .. } => event.run_id.clone(),
            };
            if let JournalEntry::Accepted(run) = entry {
                let seq = *next_seq;
                *next_seq += 1;
                open.insert(run_id.clone(), OpenRun { seq, stored: 0 });
                plan.write(&run_id, OpenRun { seq, stored: 0 }).insert = Some(run);
                continue;
            }
            let Some(known) = known(tx, open, &run_id)? else {
                continue;
            };
            let write = plan.write(&run_id, known);
            match entry {
                JournalEntry::Placed { attempt, .. } => write.attempts.push(attempt),
                JournalEntry::Event {
                    index,
                    at_ms,
                    event,
                    first_output,
                } => {
                    write.add_event(index, &event);
                    if first_output {
                        write.first_output_ms.get_or_insert(at_ms);
                    }
                    if let Some(finish) = finish_of(&event.kind, index + 1, at_ms) {
                        write.finish = Some(finish);
                        open.remove(&run_id);
                    }
                }
                JournalEntry::Accepted(_) => {}
            }
        }
        Ok(plan)
    }

    fn write(&mut self, run_id: &RunId, known: OpenRun) -> &mut RunWrite {
        if !self.runs.contains_key(run_id) {
            self.order.push(run_id.clone());
        }
        self.runs.entry(run_id.clone()).or_insert_with(|| RunWrite {
            seq: known.seq,
            stored_before: known.stored,
            insert: None,
            attempts: Vec::new(),
            chunks: Vec::new(),
            first_output_ms: None,
            finish: None,
        })
    }

    /// Writes the plan; `open` learns how many events each open run now has stored.
    pub(super) fn apply(
        self,
        tx: &Transaction<'_>,
        open: &mut HashMap<RunId, OpenRun>,
    ) -> rusqlite::Result<()> {
        let Plan { order, mut runs } = self;
        for run_id in order {
            let Some(write) = runs.remove(&run_id) else {
                continue;
            };
            let stored = write.apply(tx)?;
            if let Some(known) = open.get_mut(&run_id) {
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

fn finish_of(kind: &RunEventKind, events: u64, at_ms: u64) -> Option<Finish> {
    let outcome = RunOutcome::of_event(kind)?;
    let mut finish = Finish {
        outcome,
        at_ms,
        events,
        code: None,
        message: None,
        finish_reason: None,
        usage: None,
    };
    match kind {
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => {
            finish.finish_reason = Some(finish_reason.clone());
            finish.usage = *usage;
        }
        RunEventKind::Failed { code, message, .. } => {
            finish.code = Some(code.clone());
            finish.message = Some(message.clone());
        }
        RunEventKind::Cancelled { reason } => finish.message = Some(reason.clone()),
        RunEventKind::Started | RunEventKind::Output { .. } => {}
    }
    Some(finish)
}

impl RunWrite {
    /// Adds event `index` as the file sink's JSON line, to the open chunk when it follows
    /// on, else to a new one.
    fn add_event(&mut self, index: u64, event: &crate::domain::RunEvent) {
        let mut line = Vec::with_capacity(128);
        write_json_line(event, &mut line);
        while line.last() == Some(&b'\n') {
            line.pop();
        }
        let line = String::from_utf8_lossy(&line);
        match self.chunks.last_mut() {
            Some(chunk) if chunk.first_idx + chunk.count == index => {
                chunk.json.push('\n');
                chunk.json.push_str(&line);
                chunk.count += 1;
            }
            _ => self.chunks.push(Chunk {
                first_idx: index,
                count: 1,
                json: line.into_owned(),
            }),
        }
    }

    /// Writes the run's rows; returns how many of its events are stored now.
    fn apply(self, tx: &Transaction<'_>) -> rusqlite::Result<u64> {
        let mut stored = self.stored_before;
        for chunk in &self.chunks {
            tx.prepare_cached(
                "INSERT OR IGNORE INTO events (run_seq, first_idx, count, json) VALUES (?1, ?2, ?3, ?4)",
            )?
            .execute(params![self.seq, to_sql(chunk.first_idx), to_sql(chunk.count), chunk.json])?;
            stored += chunk.count;
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
        match &self.insert {
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
    let finish = write.finish.as_ref();
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
