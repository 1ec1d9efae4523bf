//! The JetStream stream the NATS sink publishes into: created (capturing
//! `<prefix>.<edge id>.runs.>`, file storage, the configured retention) or bound to an
//! existing one, once the client is first connected — not at startup, so an unreachable
//! server does not stop the edge.

use std::time::Duration;

use async_nats::jetstream::context::Context;
use async_nats::jetstream::stream::{Config, StorageType};

use super::config::JetStreamConfig;

/// The stream and whether it is known to be there.
pub(super) struct Stream {
    context: Context,
    config: JetStreamConfig,
    subjects: String,
    ready: bool,
}

impl Stream {
    /// The stream `config` names, capturing `subjects`, published to through `context`.
    pub(super) fn new(context: Context, config: JetStreamConfig, subjects: String) -> Self {
        Self {
            context,
            config,
            subjects,
            ready: false,
        }
    }

    /// The JetStream context publishes go through.
    pub(super) fn context(&self) -> &Context {
        &self.context
    }

    /// Whether the stream has been created or found.
    pub(super) fn is_ready(&self) -> bool {
        self.ready
    }

    /// Creates the stream if it is missing and `create` is set, or checks that it exists.
    ///
    /// # Errors
    /// The server's answer (or a timeout) as text, for the writer's warning.
    pub(super) async fn ensure(&mut self, limit: Duration) -> Result<(), String> {
        let config = &self.config;
        let found = if config.create {
            let wanted = Config {
                name: config.stream.clone(),
                subjects: vec![self.subjects.clone()],
                max_age: Duration::from_secs(config.max_age_secs),
                max_bytes: i64::try_from(config.max_bytes)
                    .ok()
                    .filter(|&bytes| bytes > 0)
                    .unwrap_or(-1),
                duplicate_window: Duration::from_secs(config.duplicate_window_secs),
                num_replicas: config.replicas,
                storage: StorageType::File,
                ..Config::default()
            };
            let created = self.context.get_or_create_stream(wanted);
            tokio::time::timeout(limit, created)
                .await
                .map_err(|_| "timed out".to_owned())?
                .map(drop)
                .map_err(|error| error.to_string())
        } else {
            let existing = self.context.get_stream(&config.stream);
            tokio::time::timeout(limit, existing)
                .await
                .map_err(|_| "timed out".to_owned())?
                .map(drop)
                .map_err(|error| error.to_string())
        };
        self.ready = found.is_ok();
        found
    }
}
