//! What a resumable run's stream is rendered from besides its events ([`ResumableStream`]:
//! which API, the model as the client named it, ...), kept in the run's record from its
//! start so the stream can be rendered again after a drop or an edge restart.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::openai::Endpoint;

/// What a resumable run's stream is rendered from besides its events, kept in its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "api", rename_all = "snake_case")]
pub(in crate::adapters::api) enum ResumableStream {
    /// `chat.completion.chunk`s.
    Chat {
        /// The model as the client named it.
        model: String,
        /// The chunks' `created`.
        created: u64,
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
    /// Streamed `text_completion`s.
    Completion {
        /// The model as the client named it.
        model: String,
        /// The chunks' `created`.
        created: u64,
        /// `stream_options.include_usage`.
        include_usage: bool,
    },
    /// Anthropic Messages events.
    Messages {
        /// The model as the client named it.
        model: String,
        /// Whether the client asked for thinking.
        thinking: bool,
    },
}

impl ResumableStream {
    /// The OpenAI stream of `endpoint` answering with `model`.
    pub fn openai(endpoint: Endpoint, model: &str, created: u64, include_usage: bool) -> Self {
        let model = model.to_owned();
        match endpoint {
            Endpoint::Chat => Self::Chat {
                model,
                created,
                include_usage,
            },
            Endpoint::Completion => Self::Completion {
                model,
                created,
                include_usage,
            },
        }
    }

    /// As the run's spec carries it.
    pub fn to_json(&self) -> Arc<str> {
        // Serializing strings, numbers and booleans cannot fail.
        Arc::from(serde_json::to_string(self).unwrap_or_default())
    }
}
