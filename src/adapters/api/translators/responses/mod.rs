//! OpenAI's Responses API, translated: a Responses request → the chat body a chat run gets
//! ([`request`]), the run's output → the response object and its output items ([`items`];
//! a compaction's one `compaction` item, [`compaction`])
//! or the typed Responses stream ([`stream`]), and a stored run's events read back as a
//! response ([`replay`]).

pub(in crate::adapters::api) mod compaction;
pub(in crate::adapters::api) mod items;
pub(in crate::adapters::api) mod replay;
pub(in crate::adapters::api) mod request;
pub(in crate::adapters::api) mod stream;
#[cfg(test)]
mod tests;
