//! OpenAI's own endpoints: chat completions and completions (whole, or streamed as
//! `chat.completion.chunk`/`text_completion` chunks) and embeddings. The handlers are thin
//! over the shared plumbing beside this folder (`request.rs`, `run.rs`, `sse.rs`); the
//! Anthropic and Responses APIs are siblings (`../anthropic/`, `../responses/`).

pub(in crate::adapters::api) mod chat;
pub(in crate::adapters::api) mod chunks;
pub(in crate::adapters::api) mod completions;
pub(in crate::adapters::api) mod embeddings;
pub(in crate::adapters::api) mod reply;
pub(in crate::adapters::api) mod tokenize;
