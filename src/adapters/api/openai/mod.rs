//! OpenAI's own endpoints: chat completions and completions (whole, or streamed as
//! `chat.completion.chunk`/`text_completion` chunks), embeddings, and llama.cpp's tokenize and
//! detokenize. The handlers are thin over the shared plumbing beside this folder
//! (`request.rs`, `run.rs`, `sse.rs`); the answers' shapes are `../translators/openai/`.

pub(in crate::adapters::api) mod chat;
pub(in crate::adapters::api) mod completions;
pub(in crate::adapters::api) mod embeddings;
pub(in crate::adapters::api) mod reply;
pub(in crate::adapters::api) mod tokenize;
