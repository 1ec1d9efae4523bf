//! `POST /v1/messages`: Anthropic's Messages API, whole and streamed, with Anthropic's
//! error shape. A request is translated ([`request`]) into the chat body the chat endpoint
//! would send, and runs as a chat run, so any node that serves chat serves Messages; the
//! run's events are translated back ([`stream`], [`message`]).
//!
//! This module is the HTTP plumbing; the translators and Anthropic's shapes are pure.

pub(super) mod count_tokens;

use serde_json::Value;

use super::response::ErrorShape;
use super::routing::ClientKeys;
use super::translate::{ChatApi, NamedEvents};
use crate::adapters::api::translators::anthropic::message::message;
use crate::adapters::api::translators::anthropic::request::{self, MessagesRequest};
use crate::adapters::api::translators::anthropic::stream::MessagesStream;
use crate::adapters::api::translators::anthropic::{message_id, session_in_user_id};
use crate::domain::RunId;

/// Messages as a chat run: `metadata.user_id` is the client's user key, and the session
/// Claude Code writes inside it (as JSON) its session key.
pub(super) const MESSAGES: ChatApi<MessagesRequest, MessagesStream> = ChatApi {
    translate: request::translate,
    keys: |value| {
        let user = value.pointer("/metadata/user_id").and_then(Value::as_str);
        ClientKeys {
            session: user.and_then(session_in_user_id),
            user,
            ..ClientKeys::default()
        }
    },
    error_shape: ErrorShape::Anthropic,
    stream: |request, run_id| {
        MessagesStream::new(message_id(run_id), request.model, request.thinking)
    },
    whole: |request, run_id, collected, finished| {
        let id = message_id(run_id);
        message(&id, &request.model, request.thinking, collected, finished)
    },
    accepted: None,
};

/// The writer of a Messages stream answering run `run_id` with `model` (a resumed stream).
pub(super) fn stream_writer(
    run_id: &RunId,
    model: String,
    thinking: bool,
) -> NamedEvents<MessagesStream> {
    NamedEvents(MessagesStream::new(message_id(run_id), model, thinking))
}
