//! Resuming a run across a node's reconnect: what a reconnecting node claims, and whether
//! the edge can continue the run from where its caller's stream stopped.
//!
//! [`decide_resume`] only compares sequence numbers; which runs may be claimed at all (held
//! detached for this node, within the grace) is the run service's bookkeeping.

/// A run a reconnecting node still holds, as it claims it in its registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeClaim {
    /// The run.
    pub run_id: String,
    /// The seq the node would give its next new event.
    pub next_seq: u64,
    /// The oldest seq the node can still send again; `next_seq` (or 0) when it holds none.
    pub first_buffered_seq: u64,
}

/// The edge's answer to one claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeAnswer {
    /// The claimed run.
    pub run_id: String,
    /// Re-attached from a seq, or refused.
    pub outcome: Result<u64, ResumeRefusal>,
}

/// Why a claim was refused; the node stops the run, and the run ends with
/// `node_disconnected` unless it already ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum ResumeRefusal {
    /// The edge holds no such run for this node (never, no longer, or another node's).
    #[error("the edge holds no such run for this node")]
    UnknownRun,
    /// The node claims fewer events than the edge already relayed.
    #[error("the claimed sequence is behind what the edge already relayed")]
    SequenceBehind,
    /// The node no longer has events the edge has not relayed yet.
    #[error("the node no longer holds events the caller has not seen")]
    EventsLost,
    /// Resume is off on this edge (`runs.resume_grace_ms = 0`).
    #[error("resume is off on this edge")]
    Disabled,
}

impl ResumeRefusal {
    /// The refusal named by [`ResumeRefusal::as_str`]; an unknown name reads as
    /// [`ResumeRefusal::UnknownRun`].
    pub fn from_code(code: &str) -> Self {
        [Self::SequenceBehind, Self::EventsLost, Self::Disabled]
            .into_iter()
            .find(|refusal| refusal.as_str() == code)
            .unwrap_or(Self::UnknownRun)
    }

    /// A stable snake_case name for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::UnknownRun => "unknown_run",
            Self::SequenceBehind => "sequence_behind",
            Self::EventsLost => "events_lost",
            Self::Disabled => "disabled",
        }
    }
}

/// From which seq the edge wants the claimed run's events, given the last seq it relayed
/// (0 when none): the one after it, if the node still holds everything from there on.
///
/// # Errors
/// [`ResumeRefusal::SequenceBehind`] when the node says it produced less than the edge has
/// seen, [`ResumeRefusal::EventsLost`] when the node dropped events the edge never got.
pub fn decide_resume(claim: &ResumeClaim, last_relayed_seq: u64) -> Result<u64, ResumeRefusal> {
    let wanted = last_relayed_seq.saturating_add(1);
    let first_buffered = if claim.first_buffered_seq == 0 {
        claim.next_seq
    } else {
        claim.first_buffered_seq
    };
    if claim.next_seq < wanted {
        Err(ResumeRefusal::SequenceBehind)
    } else if first_buffered > wanted {
        Err(ResumeRefusal::EventsLost)
    } else {
        Ok(wanted)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn claim(next_seq: u64, first_buffered_seq: u64) -> ResumeClaim {
        ResumeClaim {
            run_id: "r".into(),
            next_seq,
            first_buffered_seq,
        }
    }

    #[test]
    fn resumes_after_the_last_relayed_event() {
        // Relayed 1..=4; the node produced 1..=6 and still holds 3..=6.
        assert_eq!(decide_resume(&claim(7, 3), 4), Ok(5));
        // Nothing lost, nothing new.
        assert_eq!(decide_resume(&claim(5, 5), 4), Ok(5));
        assert_eq!(decide_resume(&claim(5, 0), 4), Ok(5));
        // Nothing relayed yet, everything buffered.
        assert_eq!(decide_resume(&claim(3, 1), 0), Ok(1));
    }

    #[test]
    fn refuses_impossible_or_lossy_claims() {
        assert_eq!(
            decide_resume(&claim(3, 1), 4),
            Err(ResumeRefusal::SequenceBehind)
        );
        assert_eq!(
            decide_resume(&claim(9, 7), 4),
            Err(ResumeRefusal::EventsLost)
        );
        assert_eq!(
            decide_resume(&claim(9, 0), 4),
            Err(ResumeRefusal::EventsLost)
        );
    }

    proptest! {
        /// An accepted resume continues exactly after the last relayed event, and only when
        /// the node still holds that event: nothing lost, nothing repeated.
        #[test]
        fn accepted_resumes_lose_and_repeat_nothing(last in 0u64..1000, next in 0u64..1000, first in 0u64..1000) {
            if let Ok(from) = decide_resume(&claim(next, first), last) {
                prop_assert_eq!(from, last + 1);
                prop_assert!(next >= from);
                prop_assert!(first == 0 || first <= from);
            }
        }
    }
}
