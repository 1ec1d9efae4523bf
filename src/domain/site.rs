//! The site's rules, decided: which member of a site acts, when it renews, when it must step
//! down, and when a standby may take the lease over (and how long it has seen the lease
//! unchanged); which batches of the site's journal stream a member folds, in which order,
//! from where, and when it may claim the stream; which commands a node obeys under which
//! epoch (the fence) — and the digest of the node definitions members compare before one
//! takes over from another.
//!
//! Pure: the caller reads the lease, the stream and the clocks and passes them in (`now_ms`
//! is the wall clock the lease's expiry is written in; `unchanged_for_ms` is measured on the
//! caller's monotonic clock), then acts on the returned step. Nothing here talks to NATS or
//! to a node. The cluster adapter (`adapters/cluster`) and the node's codec (`wire`) apply
//! these functions; the model checker (`site_model.rs`, a test) drives the same functions
//! through every interleaving of small sites.

use std::collections::HashSet;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::NodeRecord;

/// The lease as members write and read it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The holder's `[edge] id`.
    pub edge_id: String,
    /// Where its nodes dial (`HOST:PORT`).
    pub node_address: String,
    /// Where its HTTP API answers (`HOST:PORT`).
    pub api_address: String,
    /// When the lease lapses unless renewed, on the holder's wall clock (ms since the epoch).
    pub expires_at_ms: u64,
    /// The holder's [`definitions_digest`].
    pub node_definitions_digest: String,
}

/// What a member found under the site's lease key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Seen {
    /// No lease: never written, released, or purged.
    Absent,
    /// A value that is not a lease (written by something else, or damaged), at `revision`.
    Unreadable {
        /// The key's revision.
        revision: u64,
    },
    /// A lease, at `revision`.
    Held {
        /// The key's revision.
        revision: u64,
        /// The lease.
        lease: Lease,
    },
}

impl Seen {
    /// The key's revision, when there is a value.
    pub fn revision(&self) -> Option<u64> {
        match self {
            Seen::Absent => None,
            Seen::Unreadable { revision } | Seen::Held { revision, .. } => Some(*revision),
        }
    }
}

/// The lease's timing, the same on every member of a site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseTiming {
    /// How long a written lease lasts.
    pub lease_ms: u64,
    /// How often the holder renews it (and a standby looks at it); at most half the lease.
    pub renew_ms: u64,
}

impl LeaseTiming {
    /// How long before the expiry it wrote a holder that could not renew steps down: a
    /// quarter of the lease, so clocks that disagree by less than that never see two
    /// members act at once.
    pub fn margin_ms(&self) -> u64 {
        self.lease_ms / 4
    }

    /// How long a holder waits between two attempts at a renewal that failed to reach NATS.
    pub fn retry_ms(&self) -> u64 {
        (self.renew_ms / 4).max(1)
    }

    /// What is wrong with this timing, naming `section`'s keys; empty when it works.
    pub fn problems(&self, section: &str) -> Vec<String> {
        let mut problems = Vec::new();
        if self.lease_ms < 4 {
            problems.push(format!("`{section}.lease_ms` must be at least 4"));
        }
        if self.renew_ms == 0 || self.renew_ms.saturating_mul(2) > self.lease_ms {
            problems.push(format!(
                "`{section}.renew_ms` ({}) must be at least 1 and at most half of \
                 `{section}.lease_ms` ({}), so a renewal lands well inside the lease",
                self.renew_ms, self.lease_ms
            ));
        }
        problems
    }
}

/// What a member that does not hold the lease does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StandbyStep {
    /// No lease: create it (only if still absent).
    Create,
    /// The lease lapsed: take it over with a compare-and-set at `revision`.
    TakeOver {
        /// The revision read, which the write must still find.
        revision: u64,
    },
    /// Another member holds a live lease: stand by, pointing callers to it.
    Follow(Lease),
    /// The lease's expiry has passed on this clock, but it has not been seen unchanged for
    /// a whole lease yet (a guard against clocks that disagree): look again.
    AwaitLapse(Option<Lease>),
    /// The lease names node definitions other than this member's: stand by and never take
    /// over from it, even once it lapses.
    Mismatch(Lease),
}

/// What a standby does with what it `seen`: create an absent lease, take over one that has
/// lapsed — its expiry passed by `now_ms` and its revision unchanged for at least a lease
/// (`unchanged_for_ms`) — and otherwise follow the holder. A lease naming other node
/// definitions than `digest` is never taken over; an unreadable one only once unchanged
/// for a whole lease.
pub fn decide_standby(
    seen: &Seen,
    digest: &str,
    now_ms: u64,
    unchanged_for_ms: u64,
    timing: LeaseTiming,
) -> StandbyStep {
    let stale = unchanged_for_ms >= timing.lease_ms;
    match seen {
        Seen::Absent => StandbyStep::Create,
        Seen::Unreadable { revision } if stale => StandbyStep::TakeOver {
            revision: *revision,
        },
        Seen::Unreadable { .. } => StandbyStep::AwaitLapse(None),
        Seen::Held { lease, .. } if lease.node_definitions_digest != digest => {
            StandbyStep::Mismatch(lease.clone())
        }
        Seen::Held { lease, .. } if lease.expires_at_ms > now_ms => {
            StandbyStep::Follow(lease.clone())
        }
        Seen::Held { revision, .. } if stale => StandbyStep::TakeOver {
            revision: *revision,
        },
        Seen::Held { lease, .. } => StandbyStep::AwaitLapse(Some(lease.clone())),
    }
}

/// The lease this member holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Held {
    /// The revision at which it was acquired: the epoch the member acts under.
    pub epoch: u64,
    /// The revision of its last write, which the next renewal must still find.
    pub revision: u64,
    /// The expiry it last wrote.
    pub expires_at_ms: u64,
}

impl Held {
    /// A lease just acquired at `revision`, written to expire at `expires_at_ms`.
    pub fn acquired(revision: u64, expires_at_ms: u64) -> Self {
        Self {
            epoch: revision,
            revision,
            expires_at_ms,
        }
    }

    /// The same lease renewed: written again at `revision`, to expire at `expires_at_ms`.
    #[must_use]
    pub fn renewed(self, revision: u64, expires_at_ms: u64) -> Self {
        Self {
            revision,
            expires_at_ms,
            ..self
        }
    }

    /// When it is due for renewal: `renew_ms` after it was last written.
    pub fn renew_at_ms(&self, timing: LeaseTiming) -> u64 {
        self.expires_at_ms
            .saturating_sub(timing.lease_ms)
            .saturating_add(timing.renew_ms)
    }

    /// When its holder must have stepped down unless renewed: the margin before its expiry.
    pub fn step_down_at_ms(&self, timing: LeaseTiming) -> u64 {
        self.expires_at_ms.saturating_sub(timing.margin_ms())
    }

    /// Whether its holder may act (admit, place, command a node) at `now_ms`: only before
    /// [`Held::step_down_at_ms`], whether or not its lease task has run since — a holder
    /// paused past it wakes up acting on nothing.
    pub fn acts_at(&self, now_ms: u64, timing: LeaseTiming) -> bool {
        now_ms < self.step_down_at_ms(timing)
    }
}

/// How long a standby has seen the lease's revision unchanged, on its own monotonic clock:
/// the guard beside the expiry written on another machine's wall clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct LeaseWatch {
    /// The revision last seen (`None`: absent) and when it was first seen (monotonic ms).
    seen: Option<(Option<u64>, u64)>,
}

impl LeaseWatch {
    /// How long `revision` has been seen unchanged at monotonic `now_ms`, noting it: zero
    /// when it is new (a write, a release, or the first look).
    pub fn unchanged_for(&mut self, revision: Option<u64>, now_ms: u64) -> u64 {
        match self.seen {
            Some((seen, since)) if seen == revision => now_ms.saturating_sub(since),
            _ => {
                self.seen = Some((revision, now_ms));
                0
            }
        }
    }
}

/// Why a holder stops acting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepDown {
    /// Another write came between: someone else holds the lease now.
    Lost,
    /// NATS did not confirm a renewal before the margin before the expiry.
    Unreachable,
    /// The site's journal refused this member's batch: another member claimed it, having
    /// acquired the lease since.
    Fenced,
}

/// What the holder of a lease does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActiveStep {
    /// Write the lease again (at its revision), with a new expiry.
    Renew,
    /// Nothing until `until_ms` (wall clock).
    Wait {
        /// When to decide again.
        until_ms: u64,
    },
    /// Stop acting at once and stand by.
    StepDown(StepDown),
}

/// What the holder of `held` does at `now_ms`: step down once the margin before its expiry
/// is reached, renew once due, else wait for whichever comes first.
pub fn decide_active(held: &Held, now_ms: u64, timing: LeaseTiming) -> ActiveStep {
    if !held.acts_at(now_ms, timing) {
        return ActiveStep::StepDown(StepDown::Unreachable);
    }
    let renew_at = held.renew_at_ms(timing);
    if now_ms >= renew_at {
        ActiveStep::Renew
    } else {
        ActiveStep::Wait { until_ms: renew_at }
    }
}

/// How a renewal failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RenewFailure {
    /// The key's revision was not the one last written: another member wrote it.
    Conflict,
    /// NATS did not answer (disconnected, timed out, an error).
    Unreachable,
}

/// What the holder of `held` does after a renewal failed at `now_ms`: a conflict means the
/// lease is lost (step down at once); an unreachable NATS is tried again shortly, until
/// the margin before the expiry, when it steps down.
pub fn after_renew_failure(
    failure: RenewFailure,
    held: &Held,
    now_ms: u64,
    timing: LeaseTiming,
) -> ActiveStep {
    let step_down_at = held.step_down_at_ms(timing);
    match failure {
        RenewFailure::Conflict => ActiveStep::StepDown(StepDown::Lost),
        RenewFailure::Unreachable if now_ms >= step_down_at => {
            ActiveStep::StepDown(StepDown::Unreachable)
        }
        RenewFailure::Unreachable => ActiveStep::Wait {
            until_ms: now_ms.saturating_add(timing.retry_ms()).min(step_down_at),
        },
    }
}

/// What the folder of the site's journal stream does with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// Written by another member, or an earlier life of this one: applied.
    Apply,
    /// Written by this life of this member: in its file already.
    Own,
    /// Written under an epoch older than one already folded (or under none).
    Stale,
}

/// The verdict on a batch `edge` wrote under `epoch`, for member `me` that published under
/// `own_epochs` in this life and folded batches up to epoch `newest` before this one.
pub fn verdict(
    edge: Option<&str>,
    epoch: Option<u64>,
    me: &str,
    own_epochs: &HashSet<u64>,
    newest: u64,
) -> Verdict {
    match epoch {
        Some(epoch) if epoch >= newest => {
            if edge == Some(me) && own_epochs.contains(&epoch) {
                Verdict::Own
            } else {
                Verdict::Apply
            }
        }
        _ => Verdict::Stale,
    }
}

/// What the folder does with the message at a stream sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Next {
    /// At or below what it folded: handled already (a redelivery).
    Handled,
    /// Right after what it folded (or past it, for the member writing the stream, whose
    /// own purge made the gap): fold it.
    Fold,
    /// Past the one after what it folded: the stream was purged under the consumer, and
    /// the read starts over.
    Gap,
}

/// What the folder that `folded` up to a sequence does with the message at `seq`; `writes`
/// when this member writes the stream.
pub fn next(seq: u64, folded: u64, writes: bool) -> Next {
    if seq <= folded {
        Next::Handled
    } else if seq > folded + 1 && !writes {
        Next::Gap
    } else {
        Next::Fold
    }
}

/// Where the folder reads the stream from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Start {
    /// Right after what it folded.
    Next,
    /// From the stream's first message: the stream starts past what it folded, but this
    /// member writes it, so what it lacks was purged by itself (its own batches, or folded
    /// before its claim). Never rebuilt under its own writer.
    First,
    /// From the newest snapshot, once its journal is rebuilt from it: the stream starts
    /// past what it folded (it started with an empty file, or stood by while the stream
    /// was purged).
    Snapshot,
}

/// Where a folder that `folded` up to a sequence reads a stream starting at `first` from;
/// `writes` when this member writes the stream.
pub fn start(first: u64, folded: u64, writes: bool) -> Start {
    if first <= folded + 1 {
        Start::Next
    } else if writes {
        Start::First
    } else {
        Start::Snapshot
    }
}

/// Whether a member that acquired the lease under `epoch`, and folded the stream to its end
/// where the newest batch was written under epoch `newest`, may claim the stream: not when
/// a member that acquired the lease after it writes it already.
pub fn may_claim(newest: u64, epoch: u64) -> bool {
    newest <= epoch
}

/// Whether a member's publisher appends the `n`th batch its journal handed over in this life
/// under the writer that claimed the stream once `handed_at_claim` batches had been handed:
/// only a batch handed since that claim. One handed before it comes from an earlier time this
/// member acted and was not published before it stood down; appended now it would go under
/// an epoch it was not written in, after the claim, and every other member would fold what
/// this one — rebuilt since — does not hold. It stays local.
pub fn publishes(n: u64, handed_at_claim: u64) -> bool {
    n > handed_at_claim
}

/// What a node does with a message from an edge of its site under `epoch`, having seen
/// epochs up to `highest` (on any of its connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fence {
    /// Obeyed; the highest epoch seen is now `highest`.
    Obey {
        /// The highest epoch seen, this one counted.
        highest: u64,
    },
    /// Refused: it comes from a member that lost the lease since (a paused ex-leader).
    Stale {
        /// The highest epoch seen, unchanged.
        highest: u64,
    },
}

/// The fence a node keeps (docs/protocol.md, "Fencing"): a message under an epoch below
/// the highest seen is refused; any other is obeyed and raises the highest to its epoch.
/// Epoch 0 (a single edge, or an edge before v1.5) is obeyed only while nothing higher was
/// seen. So a node obeys one epoch's commands at a time, and never an older one after a
/// newer.
pub fn fence(highest: u64, epoch: u64) -> Fence {
    if epoch < highest {
        Fence::Stale { highest }
    } else {
        Fence::Obey { highest: epoch }
    }
}

/// A digest of the node definitions, the same on every member configured with the same
/// ones whatever their order in the file: `sha256:` and the hex SHA-256 of a canonical
/// form (records by id; each field length-prefixed; settings in key order; tokens by their
/// digest, so no token is hashed in the clear).
pub fn definitions_digest(records: &[Arc<NodeRecord>]) -> String {
    let mut sorted: Vec<&NodeRecord> = records.iter().map(Arc::as_ref).collect();
    sorted.sort_by(|a, b| a.id().as_str().cmp(b.id().as_str()));
    let mut hasher = Sha256::new();
    let mut field = |text: &str| {
        hasher.update((text.len() as u64).to_be_bytes());
        hasher.update(text.as_bytes());
    };
    field("edge node definitions v1");
    field(&sorted.len().to_string());
    for record in sorted {
        let parts = record.parts();
        field(parts.id.as_str());
        field(parts.alias.as_str());
        field(&parts.token.to_hex());
        let runtime = parts.runtime.parts();
        field(&runtime.max_concurrent_runs.to_string());
        field(&runtime.heartbeat_interval_ms.to_string());
        settings(&mut field, runtime.settings);
        field(&parts.adapters.len().to_string());
        for adapter in parts.adapters {
            let adapter = adapter.parts();
            field(adapter.name.as_str());
            field(&adapter.targets.len().to_string());
            for target in adapter.targets {
                field(target.as_str());
            }
            settings(&mut field, adapter.settings);
        }
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("sha256:{hex}")
}

fn settings(field: &mut impl FnMut(&str), settings: &std::collections::BTreeMap<String, String>) {
    field(&settings.len().to_string());
    for (key, value) in settings {
        field(key);
        field(value);
    }
}

#[cfg(test)]
#[path = "site_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "site_model.rs"]
mod model;
