//! Anthropic's Messages API, translated: a Messages request → the chat body a chat run gets
//! ([`request`]), and the run's output → the whole `message` ([`message`]) or the streamed
//! Messages events ([`stream`]).

pub(in crate::adapters::api) mod message;
pub(in crate::adapters::api) mod request;
pub(in crate::adapters::api) mod stream;
#[cfg(test)]
mod tests;

use serde::Deserialize;

use crate::domain::RunId;

/// The `session_id` of a `metadata.user_id` that is itself JSON, as Claude Code sends it
/// (`{"device_id": …, "session_id": …}`); `None` for a plain user id.
pub(in crate::adapters::api) fn session_in_user_id(user_id: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct UserId {
        session_id: String,
    }
    if !user_id.starts_with('{') {
        return None;
    }
    serde_json::from_str::<UserId>(user_id)
        .ok()
        .map(|id| id.session_id)
        .filter(|session| !session.is_empty())
}

/// The id of the message answering run `run_id`.
pub(in crate::adapters::api) fn message_id(run_id: &RunId) -> String {
    format!("msg_{run_id}")
}
