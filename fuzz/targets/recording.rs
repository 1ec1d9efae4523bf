//! What the run-driving fuzz targets share: a sink that keeps every event, and a lock that
//! survives poisoning.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use edge::domain::RunEvent;
use edge::ports::EventSink;

/// Keeps every event it is given.
#[derive(Default)]
pub struct RecordingSink {
    /// The events, in the order they were published.
    pub events: Mutex<Vec<Arc<RunEvent>>>,
}

#[async_trait]
impl EventSink for RecordingSink {
    fn name(&self) -> &str {
        "recording"
    }

    fn publish(&self, event: Arc<RunEvent>) {
        lock(&self.events).push(event);
    }

    async fn flush(&self) {}
}

/// Locks a mutex; a panic elsewhere has already failed the input.
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
