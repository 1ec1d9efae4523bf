//! The site's lease, decided: which member of a site acts, when it renews, when it must step
//! down, and when a standby may take the lease over — and the digest of the node
//! definitions members compare before one takes over from another.
//!
//! Pure: the caller reads the lease and the clocks and passes them in (`now_ms` is the
//! wall clock the lease's expiry is written in; `unchanged_for_ms` is measured on the
//! caller's monotonic clock), then acts on the returned step. Nothing here talks to NATS.

use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::NodeRecord;

/// The lease as members write and read it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
}

/// Why a holder stops acting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    let step_down_at = held.step_down_at_ms(timing);
    if now_ms >= step_down_at {
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
