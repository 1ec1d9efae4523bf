//! Continuation: a run whose node was lost after output reached the caller, carried on by
//! another node from the output already relayed — what such a second attempt is told, and
//! the pure decision whether a run may be continued at all, and if not, why.
//!
//! The edge never changes an answer silently: where the state cannot move (a tool call half
//! streamed, reasoning streamed, several choices, constrained decoding the target cannot resume, no capable
//! node, the limit reached) the run fails as it would without continuations, with the
//! refusal's reason.

use std::fmt;

/// What a continuation attempt is told besides the run's own input: the output the caller
/// already has. The node asks its engine to go on from exactly this text, with the run's
/// token budget less `output_tokens`, and relays only what comes after it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Continuation {
    /// The text relayed to the caller so far, every earlier attempt's together.
    pub text: String,
    /// The output tokens those attempts generated (as far as they were counted; 0 when no
    /// attempt reported any).
    pub output_tokens: u32,
    /// Which continuation this is: 1 for the run's first.
    pub number: u32,
}

/// How many continuations a run may get (`runs.max_continuations`); 0 turns them off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct MaxContinuations(u32);

impl MaxContinuations {
    /// The most `runs.max_continuations` may be.
    pub const MAX: u32 = 10;

    /// `n` continuations, 0 (off) to [`MaxContinuations::MAX`].
    ///
    /// # Errors
    /// The offending value when it is out of range.
    pub fn new(n: u32) -> Result<Self, u32> {
        if n <= Self::MAX { Ok(Self(n)) } else { Err(n) }
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for MaxContinuations {
    /// 1: a run outlives one lost node.
    fn default() -> Self {
        Self(1)
    }
}

/// What the decision needs to know about a run whose attempt was lost after output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ContinuationFacts {
    /// Some of a tool call reached the caller: its arguments cannot be resumed as text.
    pub tool_call_started: bool,
    /// Reasoning reached the caller: a continuation carries text only, so the next engine
    /// would reason again from the start and the caller would see a second, different
    /// reasoning.
    pub reasoning_started: bool,
    /// How many choices the run asked for (`n`); 0 or 1 is one.
    pub choices: u32,
    /// The run constrains its output (a JSON schema, a grammar, a regex).
    pub constrained: bool,
    /// The target can resume constrained output from a prefix.
    pub target_resumes_constrained: bool,
    /// Connected nodes serving the run's route that can continue runs, the lost one left
    /// out.
    pub capable_nodes: usize,
    /// Continuations the run already had.
    pub continuations_made: u32,
}

/// Why a run is not continued: its lost attempt ends it, with this reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ContinuationRefusal {
    /// `runs.max_continuations` is 0, or the run had that many.
    LimitReached,
    /// A tool call was half streamed.
    ToolCallStarted,
    /// Reasoning was streamed.
    ReasoningStarted,
    /// The run asked for more than one choice.
    ManyChoices,
    /// Its output is constrained and the target cannot resume constrained decoding.
    ConstrainedOutput,
    /// No other connected node serving the route can continue runs.
    NoCapableNode,
}

impl ContinuationRefusal {
    /// Every refusal, for metric labels.
    pub const ALL: [Self; 6] = [
        Self::LimitReached,
        Self::ToolCallStarted,
        Self::ReasoningStarted,
        Self::ManyChoices,
        Self::ConstrainedOutput,
        Self::NoCapableNode,
    ];

    /// A stable snake_case name for logs, metric labels and failure messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LimitReached => "limit_reached",
            Self::ToolCallStarted => "tool_call_started",
            Self::ReasoningStarted => "reasoning_started",
            Self::ManyChoices => "many_choices",
            Self::ConstrainedOutput => "constrained_output",
            Self::NoCapableNode => "no_capable_node",
        }
    }
}

impl fmt::Display for ContinuationRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::LimitReached => {
                "the run had as many continuations as runs.max_continuations allows"
            }
            Self::ToolCallStarted => "a tool call was half streamed",
            Self::ReasoningStarted => "reasoning was streamed and only text can be carried on",
            Self::ManyChoices => "the run asked for more than one choice",
            Self::ConstrainedOutput => "constrained output the target cannot resume",
            Self::NoCapableNode => "no other node serving the route can continue runs",
        })
    }
}

/// Whether a run whose attempt was lost after output may be continued on another node:
/// the number of the continuation to make, or why not. The run's own state is checked
/// before the fleet's, so the reason names what the caller could change first.
///
/// # Errors
/// The refusal, when the run must fail as it would without continuations.
pub fn may_continue(
    facts: &ContinuationFacts,
    max: MaxContinuations,
) -> Result<u32, ContinuationRefusal> {
    if facts.continuations_made >= max.get() {
        Err(ContinuationRefusal::LimitReached)
    } else if facts.tool_call_started {
        Err(ContinuationRefusal::ToolCallStarted)
    } else if facts.reasoning_started {
        Err(ContinuationRefusal::ReasoningStarted)
    } else if facts.choices > 1 {
        Err(ContinuationRefusal::ManyChoices)
    } else if facts.constrained && !facts.target_resumes_constrained {
        Err(ContinuationRefusal::ConstrainedOutput)
    } else if facts.capable_nodes == 0 {
        Err(ContinuationRefusal::NoCapableNode)
    } else {
        Ok(facts.continuations_made + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain() -> ContinuationFacts {
        ContinuationFacts {
            choices: 1,
            capable_nodes: 1,
            ..ContinuationFacts::default()
        }
    }

    #[test]
    fn a_plain_run_with_a_capable_node_is_continued_once_by_default() {
        let max = MaxContinuations::default();
        assert_eq!(may_continue(&plain(), max), Ok(1));
        let again = ContinuationFacts {
            continuations_made: 1,
            ..plain()
        };
        assert_eq!(
            may_continue(&again, max),
            Err(ContinuationRefusal::LimitReached)
        );
        let three = MaxContinuations::new(3).unwrap();
        assert_eq!(may_continue(&again, three), Ok(2));
        let zero_choices = ContinuationFacts {
            choices: 0,
            ..plain()
        };
        assert_eq!(may_continue(&zero_choices, max), Ok(1));
    }

    #[test]
    fn each_state_that_cannot_move_is_refused_with_its_reason() {
        let max = MaxContinuations::default();
        let cases = [
            (
                ContinuationFacts {
                    tool_call_started: true,
                    ..plain()
                },
                ContinuationRefusal::ToolCallStarted,
            ),
            (
                ContinuationFacts {
                    reasoning_started: true,
                    ..plain()
                },
                ContinuationRefusal::ReasoningStarted,
            ),
            (
                ContinuationFacts {
                    choices: 2,
                    ..plain()
                },
                ContinuationRefusal::ManyChoices,
            ),
            (
                ContinuationFacts {
                    constrained: true,
                    ..plain()
                },
                ContinuationRefusal::ConstrainedOutput,
            ),
            (
                ContinuationFacts {
                    capable_nodes: 0,
                    ..plain()
                },
                ContinuationRefusal::NoCapableNode,
            ),
        ];
        for (facts, refusal) in cases {
            assert_eq!(may_continue(&facts, max), Err(refusal), "{facts:?}");
        }
        let resumable = ContinuationFacts {
            constrained: true,
            target_resumes_constrained: true,
            ..plain()
        };
        assert_eq!(may_continue(&resumable, max), Ok(1));
    }

    #[test]
    fn zero_turns_continuations_off_and_the_limit_is_bounded() {
        let off = MaxContinuations::new(0).unwrap();
        assert_eq!(
            may_continue(&plain(), off),
            Err(ContinuationRefusal::LimitReached)
        );
        assert_eq!(MaxContinuations::new(11), Err(11));
        let names: std::collections::HashSet<_> = ContinuationRefusal::ALL
            .iter()
            .map(|r| r.as_str())
            .collect();
        assert_eq!(names.len(), ContinuationRefusal::ALL.len());
    }
}
