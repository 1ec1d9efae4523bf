//! Recovery: the part of the run service that carries runs across what breaks around them
//! — a node's connection that drops and comes back and claims its runs (`resume.rs`), the
//! runs a previous edge left open in the journal (`adopt.rs`), a client whose stream
//! dropped and that may read it again (`stream_readers.rs`), and a drained node's deadline
//! (`drain_deadline.rs`). It owns no table of its own: it decides when a run is held, taken
//! back or moved, and asks the placer (the run's route) and the relay (its events) to do
//! it.

mod adopt;
mod drain_deadline;
mod resume;
mod stream_readers;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use super::observer::RunObserver;
use super::placer::Placer;
use super::relay::Relay;
use super::timers::Timers;
use crate::ports::RunJournal;

/// Carries runs across a node's reconnect, an edge's restart, a client's re-read and a
/// drain's deadline. Built once per run service.
pub(super) struct Recovery {
    placer: Arc<Placer>,
    relay: Arc<Relay>,
    timers: Arc<Timers>,
    /// Where the runs a previous edge left open are read from.
    journal: Arc<dyn RunJournal>,
    observer: Arc<dyn RunObserver>,
    /// How long a run is held for its node to claim it; `None`: runs are never held.
    resume_grace: Option<Duration>,
    /// How long a streamed run with no reader waits for one before it is cancelled.
    client_resume_grace: Duration,
}

/// What [`Recovery`] is built from.
pub(super) struct RecoveryParts {
    pub placer: Arc<Placer>,
    pub relay: Arc<Relay>,
    pub timers: Arc<Timers>,
    pub journal: Arc<dyn RunJournal>,
    pub observer: Arc<dyn RunObserver>,
    pub resume_grace: Option<Duration>,
    pub client_resume_grace: Duration,
}

impl Recovery {
    pub(super) fn new(parts: RecoveryParts) -> Self {
        let RecoveryParts {
            placer,
            relay,
            timers,
            journal,
            observer,
            resume_grace,
            client_resume_grace,
        } = parts;
        Self {
            placer,
            relay,
            timers,
            journal,
            observer,
            resume_grace,
            client_resume_grace,
        }
    }
}
