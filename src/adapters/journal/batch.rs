//! What the journal's queue holds: entries as the relay handed them, with a batch of a
//! run's events already packed (`packed.rs`) on the relay's thread. Packing there costs a
//! copy of each delta's text, and in exchange the queue takes one push per batch instead
//! of one per event, and the events' memory is freed by the thread that allocated it
//! rather than by the writer.

use super::packed::Packer;
use crate::domain::{AcceptedRun, AdapterName, Attempt, NodeId, RunEnding, RunId, Target};
use crate::ports::{JournalEntry, RelayedEvent};

/// One entry waiting to be written.
pub(super) enum Queued {
    /// The run was accepted.
    Accepted(Box<AcceptedRun>),
    /// The run was sent to a node.
    Placed { run_id: RunId, attempt: Attempt },
    /// Some of the run's events.
    Events(PackedEvents),
}

/// Consecutive relayed events of one run, packed, with what they say of the run.
pub(super) struct PackedEvents {
    pub(super) run_id: RunId,
    /// The events in chunks of consecutive positions (one, unless the per-run cap left
    /// some out before a terminal event).
    pub(super) chunks: Vec<Chunk>,
    /// When the run's first output was relayed, if it is among them.
    pub(super) first_output_ms: Option<u64>,
    /// The run's end, if its terminal event is among them.
    pub(super) finish: Option<Finish>,
}

/// Events of one run at consecutive positions, packed.
pub(super) struct Chunk {
    pub(super) first_idx: u64,
    pub(super) count: u64,
    pub(super) packed: Packer,
}

/// A run's end, as its terminal event says.
pub(super) struct Finish {
    pub(super) ending: RunEnding,
    /// Events the run relayed, the terminal one included.
    pub(super) events: u64,
    /// The node that held the run at its end, if it was placed.
    pub(super) node: Option<NodeId>,
    /// The run's adapter and target (its model, `ADAPTER/TARGET`), for the usage rollups.
    pub(super) adapter: AdapterName,
    pub(super) target: Target,
}

impl Queued {
    /// `entry` as the queue keeps it; events at positions from `max_events_per_run` on are
    /// left out, unless terminal, and counted in the second value.
    pub(super) fn of(entry: JournalEntry, max_events_per_run: u64) -> (Option<Self>, u64) {
        match entry {
            JournalEntry::Accepted(run) => (Some(Self::Accepted(run)), 0),
            JournalEntry::Placed { run_id, attempt } => (Some(Self::Placed { run_id, attempt }), 0),
            JournalEntry::Events { run_id, events } => {
                let (packed, over_cap) = PackedEvents::of(run_id, &events, max_events_per_run);
                (packed.map(Self::Events), over_cap)
            }
        }
    }

    /// The run it is about.
    pub(super) fn run_id(&self) -> &RunId {
        match self {
            Self::Accepted(run) => &run.run_id,
            Self::Placed { run_id, .. } => run_id,
            Self::Events(events) => &events.run_id,
        }
    }

    /// About how many bytes writing it adds to the WAL: its packed events and a row's
    /// worth for everything else.
    pub(super) fn estimated_bytes(&self) -> usize {
        const ROW: usize = 256;
        match self {
            Self::Events(events) => {
                ROW + events
                    .chunks
                    .iter()
                    .map(|c| c.packed.bytes().len())
                    .sum::<usize>()
            }
            Self::Accepted(_) | Self::Placed { .. } => ROW,
        }
    }

    /// Whether it may be left out under overload: only events that neither end a run nor
    /// hold its first output.
    pub(super) fn droppable(&self) -> bool {
        match self {
            Self::Events(events) => events.first_output_ms.is_none() && events.finish.is_none(),
            Self::Accepted(_) | Self::Placed { .. } => false,
        }
    }
}

impl PackedEvents {
    fn of(run_id: RunId, events: &[RelayedEvent], cap: u64) -> (Option<Self>, u64) {
        let mut packed = Self {
            run_id,
            chunks: Vec::new(),
            first_output_ms: None,
            finish: None,
        };
        let mut over_cap = 0;
        for relayed in events {
            let terminal = relayed.event.kind.is_terminal();
            if relayed.index >= cap && !terminal {
                over_cap += 1;
                continue;
            }
            if relayed.first_output {
                packed.first_output_ms.get_or_insert(relayed.at_ms);
            }
            if terminal {
                packed.finish =
                    RunEnding::of(&relayed.event.kind, relayed.at_ms).map(|ending| Finish {
                        ending,
                        events: relayed.index + 1,
                        node: relayed.event.node.clone(),
                        adapter: relayed.event.adapter.clone(),
                        target: relayed.event.target.clone(),
                    });
            }
            match packed.chunks.last_mut() {
                Some(last) if last.first_idx + last.count == relayed.index => {
                    last.packed.push(&relayed.event);
                    last.count += 1;
                }
                _ => {
                    let mut chunk = Chunk {
                        first_idx: relayed.index,
                        count: 1,
                        packed: Packer::default(),
                    };
                    chunk.packed.push(&relayed.event);
                    packed.chunks.push(chunk);
                }
            }
        }
        let any = !packed.chunks.is_empty();
        (any.then_some(packed), over_cap)
    }
}
