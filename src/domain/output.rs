//! Structured run output beyond plain text: reasoning, tool-call pieces, token log
//! probabilities, embedding vectors, token ids and the token counts so far, as a node
//! reports them.
//!
//! The edge relays these untouched; the API boundary renders them in each API's own shapes.
//! Nothing here knows a wire or HTTP type.

use super::usage::Usage;

/// What a piece of output carries besides its text, when it carries anything.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StructuredOutput {
    /// A piece of the model's reasoning (`reasoning_content`).
    pub reasoning: String,
    /// Pieces of tool calls.
    pub tool_calls: Vec<ToolCallDelta>,
    /// Log probabilities of this output's tokens, when the request asked for them.
    pub logprobs: Vec<TokenLogprob>,
    /// Embedding vectors.
    pub embeddings: Vec<Embedding>,
    /// Token ids (a tokenize run's answer).
    pub tokens: Vec<u32>,
    /// The run's token counts so far, when the engine reported them mid-stream: the
    /// prompt's as soon as it was evaluated (what a Messages stream's `message_start` says).
    pub usage: Option<Usage>,
}

impl StructuredOutput {
    /// Whether it carries nothing.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty()
            && self.tool_calls.is_empty()
            && self.logprobs.is_empty()
            && self.embeddings.is_empty()
            && self.tokens.is_empty()
            && self.usage.is_none()
    }
}

/// A piece of a tool call, OpenAI-style: a call's first piece carries its index, id and
/// name; later pieces carry the same index and more of the arguments' JSON text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCallDelta {
    /// Which call of the answer this piece belongs to (0, 1, ... for parallel calls).
    pub index: u32,
    /// The call's id; set on its first piece.
    pub id: String,
    /// The function's name; set on its first piece.
    pub name: String,
    /// More of the arguments' JSON text.
    pub arguments: String,
}

/// One output token's log probability, with the most likely alternatives.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TokenLogprob {
    /// The token.
    pub token: String,
    /// Its log probability.
    pub logprob: f64,
    /// The token's UTF-8 bytes (a token may be part of a character).
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    pub top: Vec<TopLogprob>,
}

/// One alternative token at a position.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TopLogprob {
    /// The token.
    pub token: String,
    /// Its log probability.
    pub logprob: f64,
    /// The token's UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// One embedding vector of an embeddings run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Embedding {
    /// Which input it embeds (its position in the request's `input`).
    pub index: u32,
    /// The vector.
    pub values: Vec<f32>,
}
