//! The EventSink port: where relayed run events go (console, file, log, ...).

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::RunEvent;

/// Receives every relayed run event.
///
/// `publish` is called on the relay's hot path, for every run, so it must never block or
/// wait: an implementation hands the event to its own bounded queue and documents what it
/// does when that queue is full. Terminal events must never be dropped for lack of room.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait EventSink: Send + Sync {
    /// The sink's name, for logs and metric labels (`stdout`, `file`, `log`).
    fn name(&self) -> &str;

    /// Accepts one event without waiting.
    fn publish(&self, event: Arc<RunEvent>);

    /// Writes out everything accepted so far; called on shutdown. Returns when done.
    async fn flush(&self);

    /// Writes out everything accepted so far and stops: whatever drains the sink (a task,
    /// a thread) has ended when this returns, and events published afterwards are lost
    /// (and counted as such). Called once, as the edge stops. By default only flushes.
    async fn close(&self) {
        self.flush().await;
    }
}
