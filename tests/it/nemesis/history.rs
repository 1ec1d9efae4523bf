//! What a nemesis run writes out and its checker reads: the seed, every fault with its time,
//! every client operation with its attempts and how it ended, every execution the engines'
//! taps saw, the journal's record of each run the clients were told of as the site's last
//! active member holds it, the usage it counts, and how the site converged. One JSON
//! document; times in milliseconds since the run began.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::tap::Execution;

/// How one attempt of an operation went (a client retries with a new attempt after no
/// answer or a 503, as the SDKs do).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Attempt {
    /// Headers came: the site accepted the run.
    Accepted { prompt: String, run_id: String },
    /// Refused with a status the client retries (503) or does not (any other).
    Refused { prompt: String, status: u16 },
    /// No answer (the connection failed, or no headers within the patience).
    NoAnswer { prompt: String },
}

impl Attempt {
    pub(crate) fn prompt(&self) -> &str {
        match self {
            Attempt::Accepted { prompt, .. }
            | Attempt::Refused { prompt, .. }
            | Attempt::NoAnswer { prompt } => prompt,
        }
    }
}

/// How an operation ended, as its client saw it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Outcome {
    /// The stream came to `[DONE]` after a finish: its text.
    Completed { text: String },
    /// The client saw a terminal error: an error event, or a resume refused for good
    /// (`404`: the site does not know the run).
    Failed { code: String },
    /// Never accepted: refused with a status the client does not retry (a budget's 429).
    Rejected { status: u16 },
    /// The client gave up waiting for its run's end (its patience ran out).
    Abandoned { why: String },
}

/// One client operation: a streamed chat completion asked until it ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Op {
    pub(crate) op: u64,
    pub(crate) client: usize,
    /// The API key it used (`load`, or `metered` with a daily budget).
    pub(crate) key: String,
    pub(crate) start_ms: u64,
    pub(crate) end_ms: u64,
    pub(crate) attempts: Vec<Attempt>,
    pub(crate) outcome: Outcome,
    /// Times the stream was resumed after a cut.
    pub(crate) resumes: u32,
    /// Whether an event came twice or out of order (by its id).
    pub(crate) disordered: bool,
}

impl Op {
    /// The run the site accepted for it, if any.
    pub(crate) fn run_id(&self) -> Option<&str> {
        self.attempts.iter().find_map(|a| match a {
            Attempt::Accepted { run_id, .. } => Some(run_id.as_str()),
            _ => None,
        })
    }
}

/// One fault the nemesis made: when, what, to which process, healed when, and how long the
/// site took to converge after the heal (`None`: not within the bound).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Fault {
    pub(crate) at_ms: u64,
    pub(crate) kind: String,
    pub(crate) target: String,
    pub(crate) healed_ms: u64,
    pub(crate) converged_ms: Option<u64>,
    /// What was still wrong when it did not converge within the bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) unconverged: Option<String>,
}

/// The journal's record of a run, as the last active member holds it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) outcome: String,
    pub(crate) attempts: usize,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
}

/// How the site stood once the last fault was healed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Convergence {
    /// From the last heal until one member was active, every node attached to it and the
    /// members' journals equal; `None` when that did not happen within `bound_ms`.
    pub(crate) after_ms: Option<u64>,
    pub(crate) bound_ms: u64,
    /// What was still wrong at the bound, when it did not converge.
    pub(crate) missing: String,
}

/// A change of the member that acts, as the monitor saw `/readyz`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct Takeover {
    pub(crate) at_ms: u64,
    pub(crate) to: String,
    /// Whether a fault was active (or its site not yet converged) then.
    pub(crate) provoked: bool,
}

/// A whole run's history.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct History {
    pub(crate) seed: u64,
    pub(crate) duration_ms: u64,
    pub(crate) lease_ms: u64,
    pub(crate) renew_ms: u64,
    /// The version the NATS servers said they were (`v2.12.8`).
    pub(crate) nats_server: String,
    /// Why partitions were not made, if they were not.
    pub(crate) partitions_skipped: Option<String>,
    pub(crate) faults: Vec<Fault>,
    pub(crate) ops: Vec<Op>,
    pub(crate) executions: BTreeMap<String, Vec<Execution>>,
    pub(crate) records: BTreeMap<String, Record>,
    /// The usage the last active member counts: runs, input and output tokens, all keys;
    /// and the metered key's tokens, with its daily budget.
    pub(crate) usage_runs: u64,
    pub(crate) usage_output_tokens: u64,
    pub(crate) metered_tokens: u64,
    pub(crate) metered_budget: u64,
    pub(crate) takeovers: Vec<Takeover>,
    pub(crate) convergence: Convergence,
}
