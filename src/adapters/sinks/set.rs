//! The fan-out: [`SinkSet`] is one [`EventSink`] that hands every event to each configured
//! sink, so the run service holds a single sink. It owns no queue of its own.

use std::sync::Arc;

use async_trait::async_trait;

use crate::domain::RunEvent;
use crate::ports::EventSink;

use super::builder::BuiltSink;

/// Publishes every event to each of its sinks, in order, and flushes them all.
#[derive(Clone, Default)]
pub struct SinkSet {
    sinks: Vec<Arc<dyn EventSink>>,
}

impl SinkSet {
    /// A set of `sinks`.
    pub fn new(sinks: Vec<Arc<dyn EventSink>>) -> Self {
        Self { sinks }
    }

    /// A set of the sinks [`build_sinks`](super::build_sinks) returned.
    pub fn from_built(built: &[BuiltSink]) -> Self {
        Self::new(built.iter().map(|b| Arc::clone(&b.sink)).collect())
    }

    /// How many sinks the set holds.
    pub fn len(&self) -> usize {
        self.sinks.len()
    }

    /// Whether the set holds no sink (events are then discarded).
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }
}

#[async_trait]
impl EventSink for SinkSet {
    fn name(&self) -> &str {
        "sinks"
    }

    /// Hands `event` to each sink; each applies its own overflow policy.
    fn publish(&self, event: Arc<RunEvent>) {
        for sink in &self.sinks {
            sink.publish(Arc::clone(&event));
        }
    }

    /// Flushes every sink concurrently; returns when all are done.
    async fn flush(&self) {
        futures::future::join_all(self.sinks.iter().map(|sink| sink.flush())).await;
    }

    /// Closes every sink concurrently; returns when every drain has ended.
    async fn close(&self) {
        futures::future::join_all(self.sinks.iter().map(|sink| sink.close())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::event_format::tests::completed;
    use crate::ports::event_sink::MockEventSink;

    fn expect_one_event_and_a_flush() -> Arc<dyn EventSink> {
        let mut sink = MockEventSink::new();
        sink.expect_publish()
            .withf(|event| event.kind.is_terminal())
            .times(1)
            .return_const(());
        sink.expect_flush().times(1).return_const(());
        Arc::new(sink)
    }

    #[tokio::test]
    async fn fans_out_to_every_sink() {
        let set = SinkSet::new(vec![
            expect_one_event_and_a_flush(),
            expect_one_event_and_a_flush(),
        ]);
        assert_eq!(set.len(), 2);
        set.publish(completed());
        set.flush().await;
        // The mocks check their expectations when dropped with the set.
    }
}
