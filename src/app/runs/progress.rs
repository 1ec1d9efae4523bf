//! [`Progress`]: what a run has relayed to its caller so far — the text a continuation
//! carries on from, and the output its usage counts when it fails or is cancelled. The
//! relay notes each event in it; the placer reads it to place a continuation.

use crate::domain::{RunEventKind, Usage};

/// What a run has relayed to its caller so far: as a continuation needs it (the text, kept
/// only when `runs.max_continuations` is above 0), and as its usage needs it when it fails
/// or is cancelled (the output pieces, always counted).
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Every relayed output's text, in order.
    text: String,
    /// Relayed output events that carried text: the output tokens as far as the edge can
    /// count them (engines stream one token per event).
    outputs: u32,
    /// Relayed output events of the current attempt that carried text, reasoning or a piece
    /// of a tool call: the output tokens it generated, as far as the edge can count them.
    generated: u32,
    /// Some of a tool call was relayed.
    tool_call: bool,
    /// Some reasoning was relayed.
    reasoning: bool,
    /// Output tokens of the attempts before the current one, added to its usage.
    carried: u32,
}

impl Progress {
    /// Notes an event about to be relayed, keeping its text when `keep_text` (continuations
    /// are on); a terminal one gets its usage settled ([`Self::settle`]).
    pub(super) fn note(&mut self, kind: &mut RunEventKind, keep_text: bool) {
        if kind.is_terminal() {
            self.settle(kind);
            return;
        }
        let RunEventKind::Output {
            text, structured, ..
        } = kind
        else {
            return;
        };
        let generated = !text.is_empty()
            || structured
                .as_ref()
                .is_some_and(|s| !s.reasoning.is_empty() || !s.tool_calls.is_empty());
        self.generated = self.generated.saturating_add(u32::from(generated));
        if !keep_text {
            return;
        }
        if !text.is_empty() {
            self.text.push_str(text);
            self.outputs = self.outputs.saturating_add(1);
        }
        if let Some(structured) = structured {
            self.tool_call |= !structured.tool_calls.is_empty();
            self.reasoning |= !structured.reasoning.is_empty();
        }
    }

    /// The next attempt is a continuation: what was relayed so far is carried.
    pub(super) fn carry(&mut self) {
        self.carried = self.outputs;
        self.generated = 0;
    }

    /// Settles a terminal event's usage. A completion's gets the carried output tokens
    /// added. A failure or a cancel counts what was produced: the output tokens its node
    /// reported, at least one per generated piece this attempt relayed (the edge's own
    /// endings, and nodes that report nothing), plus the carried ones; a run that produced
    /// nothing known keeps no usage.
    fn settle(&self, kind: &mut RunEventKind) {
        let completed = matches!(kind, RunEventKind::Completed { .. });
        let Some(usage) = kind.usage_mut() else {
            return;
        };
        if usage.is_none() && !completed && self.generated.saturating_add(self.carried) > 0 {
            *usage = Some(Usage::default());
        }
        if let Some(usage) = usage {
            if !completed {
                usage.output_tokens = usage.output_tokens.max(self.generated);
            }
            usage.output_tokens = usage.output_tokens.saturating_add(self.carried);
        }
    }
}

impl Progress {
    /// Every relayed output's text, in order (empty unless continuations are on).
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// The output tokens relayed, as far as the edge can count them.
    pub(super) fn outputs(&self) -> u32 {
        self.outputs
    }

    /// Whether some of a tool call was relayed.
    pub(super) fn tool_call_started(&self) -> bool {
        self.tool_call
    }

    /// Whether some reasoning was relayed.
    pub(super) fn reasoning_started(&self) -> bool {
        self.reasoning
    }
}
