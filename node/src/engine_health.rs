//! Whether an engine is up, as its prober last found it: each change is logged once — up,
//! or down with its cause and how long the engine had been up — so an engine that flaps
//! shows as one in the node's log (the edge counts the changes it is told of:
//! `edge_node_availability_changes_total`).

use std::time::{Duration, Instant};

use crate::fault::UpstreamFault;

/// An engine's health between probes.
#[derive(Debug)]
pub struct EngineHealth {
    /// The adapter the engine serves, for the log.
    adapter: String,
    /// What the log calls it: `"engine"`, or `"managed engine"`.
    what: &'static str,
    /// Since when it has been up; `None` while down or before the first probe.
    up_since: Option<Instant>,
    /// Whether any probe has answered yet.
    probed: bool,
}

impl EngineHealth {
    /// Before the first probe of `adapter`'s engine (`what` names it in the log).
    pub fn new(adapter: &str, what: &'static str) -> Self {
        Self {
            adapter: adapter.to_owned(),
            what,
            up_since: None,
            probed: false,
        }
    }

    /// A probe found the engine up. Returns whether that is news (the first probe, or the
    /// engine was down): the caller logs what it found then.
    pub fn up(&mut self) -> bool {
        self.probed = true;
        if self.up_since.is_some() {
            return false;
        }
        self.up_since = Some(Instant::now());
        true
    }

    /// A probe found the engine down for `fault`: logged when that is news, with how long
    /// the engine had been up.
    pub fn down(&mut self, fault: &UpstreamFault) {
        let was_up = self.up_since.take().map(|since| since.elapsed());
        if self.probed && was_up.is_none() {
            return;
        }
        self.probed = true;
        tracing::warn!(
            adapter = %self.adapter,
            %fault,
            up_for = %UpFor(was_up),
            "{} is down: reporting none of its targets",
            self.what
        );
    }
}

/// How long an engine had been up, for the log: `"never seen up"` before its first answer.
struct UpFor(Option<Duration>);

impl std::fmt::Display for UpFor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(up) => write!(f, "{:.1}s", up.as_secs_f64()),
            None => f.write_str("never seen up"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_are_news() {
        let mut health = EngineHealth::new("llama", "engine");
        assert!(health.up(), "the first probe");
        assert!(!health.up(), "still up");
        health.down(&UpstreamFault::Timeout("probe_timeout_ms"));
        assert!(health.up_since.is_none());
        assert!(health.up(), "up again");
    }

    #[test]
    fn how_long_it_was_up_reads_plainly() {
        assert_eq!(
            UpFor(Some(Duration::from_millis(33_240))).to_string(),
            "33.2s"
        );
        assert_eq!(UpFor(None).to_string(), "never seen up");
    }
}
