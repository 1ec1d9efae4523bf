//! The writer's hold on open runs' events: a run that is still streaming has its events
//! kept back and written together — when it ends, when it has gathered `RUN_MAX_BYTES`, or
//! when the oldest of them has waited `open_events_hold_ms` — instead of one chunk per
//! transaction it streamed through.
//!
//! A real answer streams for seconds at tens of tokens a second, so without the hold every
//! transaction (one per `batch_linger_ms`) writes a small chunk for each streaming run, with
//! the run's id and position: a few dozen bytes of framing per token delta. Held, a run's
//! events become one chunk per run for most runs, and one per hold interval for long ones.
//! Run records (accepted, placed) and endings are never held; a flush (the management
//! API's read-your-writes) writes everything held first; what a `kill -9` loses is at most
//! the held interval of each open run's events, which the node still buffers until
//! acknowledged (docs/operations.md).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::batch::Queued;
use crate::domain::RunId;

/// A run's held events are written once they reach this many bytes.
const RUN_MAX_BYTES: usize = 16 * 1024;

/// Everything held is written once the held events of all runs reach this many bytes.
const TOTAL_MAX_BYTES: usize = 32 * 1024 * 1024;

/// Events of open runs kept back from the next transaction.
#[derive(Default)]
pub(super) struct Held {
    /// How long a run's first held event may wait; zero holds nothing.
    hold: Duration,
    runs: HashMap<RunId, HeldRun>,
    /// Runs in the order their holds began (with when), to find the due ones in order; an
    /// entry whose run was written since is skipped.
    started: VecDeque<(Instant, RunId)>,
    bytes: usize,
}

struct HeldRun {
    entries: Vec<Queued>,
    bytes: usize,
    since: Instant,
}

impl Held {
    pub(super) fn new(hold: Duration) -> Self {
        Self {
            hold,
            ..Self::default()
        }
    }

    /// Takes `batch` (leaving it empty); appends what to write now to `out`, in order:
    /// records, and endings each after its run's held events.
    pub(super) fn absorb(&mut self, batch: &mut Vec<Queued>, now: Instant, out: &mut Vec<Queued>) {
        for entry in batch.drain(..) {
            match entry {
                Queued::Events(events) if events.finish.is_none() && !self.hold.is_zero() => {
                    let run_id = events.run_id.clone();
                    if self.keep(run_id.clone(), Queued::Events(events), now) >= RUN_MAX_BYTES {
                        self.release(&run_id, out);
                    }
                }
                Queued::Events(events) => {
                    self.release(&events.run_id, out);
                    out.push(Queued::Events(events));
                }
                record => out.push(record),
            }
        }
        if self.bytes > TOTAL_MAX_BYTES {
            self.release_all(out);
        }
    }

    /// Holds `entry`; returns the run's held bytes.
    fn keep(&mut self, run_id: RunId, entry: Queued, now: Instant) -> usize {
        let size = entry.estimated_bytes();
        let run = self.runs.entry(run_id).or_insert_with_key(|run_id| {
            self.started.push_back((now, run_id.clone()));
            HeldRun {
                entries: Vec::new(),
                bytes: 0,
                since: now,
            }
        });
        run.entries.push(entry);
        run.bytes += size;
        self.bytes += size;
        run.bytes
    }

    fn release(&mut self, run_id: &RunId, out: &mut Vec<Queued>) {
        // Nothing held (the hold is off by default): no need to hash the id.
        if self.runs.is_empty() {
            return;
        }
        if let Some(run) = self.runs.remove(run_id) {
            self.bytes -= run.bytes;
            out.extend(run.entries);
        }
    }

    /// Appends the held events of runs whose hold began `hold` ago or earlier to `out`.
    pub(super) fn release_due(&mut self, now: Instant, out: &mut Vec<Queued>) {
        while let Some((since, _)) = self.started.front() {
            if now.saturating_duration_since(*since) < self.hold {
                break;
            }
            let Some((since, run_id)) = self.started.pop_front() else {
                break;
            };
            if self.runs.get(&run_id).is_some_and(|run| run.since == since) {
                self.release(&run_id, out);
            }
        }
    }

    /// Appends everything held to `out`, the runs in the order their holds began.
    pub(super) fn release_all(&mut self, out: &mut Vec<Queued>) {
        for (since, run_id) in std::mem::take(&mut self.started) {
            if self.runs.get(&run_id).is_some_and(|run| run.since == since) {
                self.release(&run_id, out);
            }
        }
    }

    /// How long until the next hold may be over (`None`: nothing was held). It may be one
    /// whose run was written since: waking for it early costs one empty look.
    pub(super) fn next_due(&self, now: Instant) -> Option<Duration> {
        let (since, _) = self.started.front()?;
        Some((*since + self.hold).saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests as journal_tests;
    use super::*;
    use crate::domain::RunEventKind;

    fn entry(run: &str, index: u64, kind: RunEventKind) -> Queued {
        Queued::of(journal_tests::event(run, index, kind), u64::MAX)
            .0
            .unwrap()
    }

    fn runs(entries: &[Queued]) -> Vec<&str> {
        entries.iter().map(|e| e.run_id().as_str()).collect()
    }

    fn absorb(held: &mut Held, entries: Vec<Queued>, now: Instant) -> Vec<Queued> {
        let mut out = Vec::new();
        held.absorb(&mut { entries }, now, &mut out);
        out
    }

    fn all(held: &mut Held) -> Vec<Queued> {
        let mut out = Vec::new();
        held.release_all(&mut out);
        out
    }

    fn due(held: &mut Held, now: Instant) -> Vec<Queued> {
        let mut out = Vec::new();
        held.release_due(now, &mut out);
        out
    }

    #[test]
    fn a_runs_events_wait_for_its_ending_and_come_out_before_it() {
        let now = Instant::now();
        let mut held = Held::new(Duration::from_secs(60));
        let out = absorb(&mut held, vec![entry("a", 0, RunEventKind::text("x"))], now);
        assert!(out.is_empty());
        let out = absorb(
            &mut held,
            vec![
                entry("b", 0, RunEventKind::text("y")),
                entry("a", 1, RunEventKind::text("z")),
                entry("a", 2, journal_tests::completed()),
            ],
            now,
        );
        assert_eq!(runs(&out), ["a", "a", "a"]);
        assert_eq!(runs(&all(&mut held)), ["b"]);
    }

    #[test]
    fn holds_end_in_the_order_they_began_and_a_large_run_is_written_at_once() {
        let start = Instant::now();
        let hold = Duration::from_millis(100);
        let mut held = Held::new(hold);
        assert!(
            absorb(
                &mut held,
                vec![entry("first", 0, RunEventKind::text("x"))],
                start
            )
            .is_empty()
        );
        let later = start + Duration::from_millis(50);
        assert!(
            absorb(
                &mut held,
                vec![entry("second", 0, RunEventKind::text("x"))],
                later
            )
            .is_empty()
        );
        assert_eq!(held.next_due(start), Some(hold));
        assert_eq!(runs(&due(&mut held, start + hold)), ["first"]);
        assert_eq!(held.next_due(start + hold), Some(Duration::from_millis(50)));
        let big = "w".repeat(RUN_MAX_BYTES);
        let out = absorb(
            &mut held,
            vec![entry("second", 1, RunEventKind::text(big))],
            later,
        );
        assert_eq!(runs(&out), ["second", "second"]);
        assert!(due(&mut held, start + hold * 2).is_empty());
    }

    #[test]
    fn a_zero_hold_holds_nothing() {
        let mut held = Held::new(Duration::ZERO);
        let out = absorb(
            &mut held,
            vec![entry("a", 0, RunEventKind::text("x"))],
            Instant::now(),
        );
        assert_eq!(runs(&out), ["a"]);
        assert_eq!(held.next_due(Instant::now()), None);
    }
}
