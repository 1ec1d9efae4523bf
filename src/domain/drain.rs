//! Draining a node: it takes no new runs, its running ones finish (or, at an optional
//! deadline, move to other nodes or are cancelled), and it stays registered until an operator resumes it.
//!
//! Pure: the state a node is shown in, and which nodes selection may consider. The drains
//! themselves (who is draining since when) are kept by the application.

use std::fmt;

/// An operator's drain of one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drain {
    /// When the drain began, in milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// When the node's remaining runs are moved off it (or cancelled); `None` to let them
    /// finish.
    pub deadline_ms: Option<u64>,
}

/// How a node is doing, as the management API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeState {
    /// Configured but not connected.
    Disconnected,
    /// Taking runs.
    Serving,
    /// Drained, still finishing runs.
    Draining,
    /// Drained, with no run left: safe to take down.
    Drained,
    /// Its circuit breaker is open: routing sends it nothing for now.
    BreakerOpen,
}

impl NodeState {
    /// Every state, in the order the API documents them.
    pub const ALL: [NodeState; 5] = [
        Self::Disconnected,
        Self::Serving,
        Self::Draining,
        Self::Drained,
        Self::BreakerOpen,
    ];

    /// The state of a node, connected or not, that holds `active_runs` runs, is drained or
    /// not, and whose breaker is open or not. A drain is the operator's word and wins over
    /// the breaker; a node that is not connected is `disconnected` whatever else holds.
    pub fn of(
        connected: bool,
        drain: Option<&Drain>,
        active_runs: u32,
        breaker_open: bool,
    ) -> Self {
        if !connected {
            return Self::Disconnected;
        }
        match (drain, breaker_open) {
            (Some(_), _) if active_runs > 0 => Self::Draining,
            (Some(_), _) => Self::Drained,
            (None, true) => Self::BreakerOpen,
            (None, false) => Self::Serving,
        }
    }

    /// The stable snake_case name used in the API and the console.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disconnected => "disconnected",
            Self::Serving => "serving",
            Self::Draining => "draining",
            Self::Drained => "drained",
            Self::BreakerOpen => "breaker_open",
        }
    }
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_shows_whether_runs_are_left_and_wins_over_the_breaker() {
        let drain = Drain {
            since_ms: 1,
            deadline_ms: None,
        };
        assert_eq!(NodeState::of(true, None, 3, false), NodeState::Serving);
        assert_eq!(NodeState::of(true, None, 0, true), NodeState::BreakerOpen);
        assert_eq!(
            NodeState::of(true, Some(&drain), 2, true),
            NodeState::Draining
        );
        assert_eq!(
            NodeState::of(true, Some(&drain), 0, false),
            NodeState::Drained
        );
        assert_eq!(
            NodeState::of(false, Some(&drain), 0, false),
            NodeState::Disconnected
        );
        let names: Vec<&str> = NodeState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            names,
            [
                "disconnected",
                "serving",
                "draining",
                "drained",
                "breaker_open"
            ]
        );
    }
}
