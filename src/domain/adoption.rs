//! Taking runs back after an edge restart: whether a run the journal holds as open can be
//! held for its node to claim again, and from where its numbering goes on.
//!
//! Pure: the run service reads the journal and passes in what it stored and the time; the
//! claim itself is then judged by [`decide_resume`](super::decide_resume) like any resume.

use std::time::Duration;

/// What one stored event of a run left open tells adoption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredStep {
    /// Its position among the run's relayed events.
    pub index: u64,
    /// Its sequence number as relayed (the node's, plus the earlier attempts').
    pub seq: u64,
    /// What kind of event it is.
    pub kind: StepKind,
}

/// The kinds of stored event adoption tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    /// An attempt's `started`: the node's numbering starts again after it.
    Started,
    /// An `output`.
    Output,
    /// A terminal event (the run ended; the record was not closed).
    Terminal,
}

/// A run the journal holds as open, as adoption sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeftOpen<'a> {
    /// How many times it was placed on a node (0: it never left the old edge's queue).
    pub attempts: usize,
    /// Its stored events, in position order.
    pub stored: &'a [StoredStep],
    /// When it was accepted, ms since the Unix epoch.
    pub queued_ms: u64,
    /// When its deadline passes, ms since the Unix epoch.
    pub deadline_ms: Option<u64>,
}

/// What to do with a run left open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adoption {
    /// Hold it for its node to claim, as a run detached from its node's connection.
    Hold,
    /// End it at once with `failed`/`deadline_exceeded`: its deadline passed meanwhile.
    Expired,
    /// End it at once as `unknown`/`edge_crashed`, for this reason.
    Crashed(NotAdoptable),
}

/// Where a run left open stands: what it relayed, and how old it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The last seq relayed (the run's numbering).
    pub last_seq: u64,
    /// What the current attempt's node numbers add to the run's numbering (the seq before
    /// its `started`): the node's last seq is `last_seq - seq_base`.
    pub seq_base: u64,
    /// The position of the next event relayed.
    pub next_index: u64,
    /// Whether an `output` was relayed.
    pub saw_output: bool,
    /// How long the run has been open.
    pub age: Duration,
    /// Its deadline, counted from acceptance.
    pub deadline: Option<Duration>,
}

/// Why a run left open cannot be held for its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAdoptable {
    /// Resume is off on this edge (`runs.resume_grace_ms = 0`).
    ResumeOff,
    /// It was never placed on a node.
    NeverPlaced,
    /// The journal holds none of its current attempt's events: the node may never have got
    /// it, and the edge cannot send it again (the journal keeps no input).
    NothingStored,
    /// The journal left out some of its events (over the per-run cap, a full queue), so
    /// its stream cannot be told again whole.
    EventsMissing,
    /// Its terminal event is stored: nothing is left to take back.
    AlreadyEnded,
}

impl NotAdoptable {
    /// A stable snake_case name for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ResumeOff => "resume_off",
            Self::NeverPlaced => "never_placed",
            Self::NothingStored => "nothing_stored",
            Self::EventsMissing => "events_missing",
            Self::AlreadyEnded => "already_ended",
        }
    }
}

/// Where run `left` stands at `now_ms`, and what to do with it when `resume_on`.
pub fn adopt(left: &LeftOpen<'_>, now_ms: u64, resume_on: bool) -> (Held, Adoption) {
    let last = left.stored.last();
    let seq_base = left
        .stored
        .iter()
        .rev()
        .find(|s| s.kind == StepKind::Started)
        .map_or(0, |s| s.seq.saturating_sub(1));
    let held = Held {
        last_seq: last.map_or(0, |s| s.seq),
        seq_base,
        next_index: last.map_or(0, |s| s.index + 1),
        saw_output: left.stored.iter().any(|s| s.kind == StepKind::Output),
        age: Duration::from_millis(now_ms.saturating_sub(left.queued_ms)),
        deadline: left
            .deadline_ms
            .map(|d| Duration::from_millis(d.saturating_sub(left.queued_ms))),
    };
    (held, decide(left, &held, now_ms, resume_on))
}

fn decide(left: &LeftOpen<'_>, held: &Held, now_ms: u64, resume_on: bool) -> Adoption {
    let crashed = Adoption::Crashed;
    if !resume_on {
        return crashed(NotAdoptable::ResumeOff);
    }
    if left.attempts == 0 {
        return crashed(NotAdoptable::NeverPlaced);
    }
    if !left.stored.iter().zip(0..).all(|(s, i)| s.index == i) {
        return crashed(NotAdoptable::EventsMissing);
    }
    if left.stored.iter().any(|s| s.kind == StepKind::Terminal) {
        return crashed(NotAdoptable::AlreadyEnded);
    }
    // Each attempt relays one `started`: fewer stored means the current attempt has none.
    let started = left.stored.iter().filter(|s| s.kind == StepKind::Started);
    if started.count() < left.attempts || held.last_seq <= held.seq_base {
        return crashed(NotAdoptable::NothingStored);
    }
    if left.deadline_ms.is_some_and(|deadline| deadline <= now_ms) {
        return Adoption::Expired;
    }
    Adoption::Hold
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(index: u64, seq: u64, kind: StepKind) -> StoredStep {
        StoredStep { index, seq, kind }
    }

    fn left(stored: &[StoredStep]) -> LeftOpen<'_> {
        LeftOpen {
            attempts: 1,
            stored,
            queued_ms: 1_000,
            deadline_ms: Some(61_000),
        }
    }

    #[test]
    fn a_run_with_output_is_held_from_its_last_stored_event() {
        let stored = [
            step(0, 1, StepKind::Started),
            step(1, 2, StepKind::Output),
            step(2, 3, StepKind::Output),
        ];
        let (held, adoption) = adopt(&left(&stored), 11_000, true);
        assert_eq!(adoption, Adoption::Hold);
        assert_eq!((held.last_seq, held.seq_base, held.next_index), (3, 0, 3));
        assert!(held.saw_output);
        assert_eq!(held.age, Duration::from_secs(10));
        assert_eq!(held.deadline, Some(Duration::from_secs(60)));
    }

    #[test]
    fn a_run_only_started_is_held_too() {
        let stored = [step(0, 1, StepKind::Started)];
        let (held, adoption) = adopt(&left(&stored), 2_000, true);
        assert_eq!(adoption, Adoption::Hold);
        assert_eq!((held.last_seq, held.seq_base), (1, 0));
        assert!(!held.saw_output);
    }

    #[test]
    fn a_later_attempt_numbers_from_its_own_started() {
        // Attempt 1 relayed started + output (seq 1, 2), failed over; attempt 2's started
        // is relayed as 3 (its node's 1), its output as 4 (its node's 2).
        let stored = [
            step(0, 1, StepKind::Started),
            step(1, 2, StepKind::Output),
            step(2, 3, StepKind::Started),
            step(3, 4, StepKind::Output),
        ];
        let run = LeftOpen {
            attempts: 2,
            ..left(&stored)
        };
        let (held, adoption) = adopt(&run, 2_000, true);
        assert_eq!(adoption, Adoption::Hold);
        assert_eq!((held.last_seq, held.seq_base), (4, 2));
        assert_eq!(held.last_seq - held.seq_base, 2);
    }

    #[test]
    fn runs_that_cannot_be_taken_back_crash() {
        let stored = [step(0, 1, StepKind::Started), step(2, 3, StepKind::Output)];
        let ended = [
            step(0, 1, StepKind::Started),
            step(1, 2, StepKind::Terminal),
        ];
        let cases: [(LeftOpen<'_>, bool, NotAdoptable); 5] = [
            (left(&[]), true, NotAdoptable::NothingStored),
            (left(&stored), true, NotAdoptable::EventsMissing),
            (left(&stored[..1]), false, NotAdoptable::ResumeOff),
            (
                LeftOpen {
                    attempts: 0,
                    ..left(&[])
                },
                true,
                NotAdoptable::NeverPlaced,
            ),
            (left(&ended), true, NotAdoptable::AlreadyEnded),
        ];
        for (run, resume_on, why) in cases {
            assert_eq!(adopt(&run, 2_000, resume_on).1, Adoption::Crashed(why));
        }
    }

    #[test]
    fn a_deadline_that_passed_meanwhile_ends_the_run() {
        let stored = [step(0, 1, StepKind::Started), step(1, 2, StepKind::Output)];
        assert_eq!(adopt(&left(&stored), 61_000, true).1, Adoption::Expired);
        let no_deadline = LeftOpen {
            deadline_ms: None,
            ..left(&stored)
        };
        let (held, adoption) = adopt(&no_deadline, u64::MAX, true);
        assert_eq!((held.deadline, adoption), (None, Adoption::Hold));
    }

    #[test]
    fn a_placed_attempt_with_nothing_of_its_own_stored_crashes() {
        // The second attempt was placed; only the first's events are stored.
        let stored = [step(0, 1, StepKind::Started), step(1, 2, StepKind::Output)];
        let run = LeftOpen {
            attempts: 2,
            ..left(&stored)
        };
        let why = NotAdoptable::NothingStored;
        assert_eq!(adopt(&run, 2_000, true).1, Adoption::Crashed(why));
    }
}
