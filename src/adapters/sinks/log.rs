//! The log sink's writer: one `tracing` record per event, at INFO on target `edge::events`,
//! with structured fields, so events reach whatever subscriber the edge installed.
//!
//! Fields: `run_id`, `node` (absent when the run never reached one), `adapter`, `target`,
//! `seq`, `origin`, `kind`, and the payload: `attempt` and `route` for a started event the
//! edge placed; `text` and `bytes` (the length of binary output) for output; `finish_reason`, `input_tokens`, `output_tokens` for completed;
//! `code` and `error_message` for failed (`message` is tracing's own field); `reason` for
//! cancelled. This writer never fails; the subscriber decides where records go.

use std::io;
use std::sync::Arc;

use crate::domain::{EventOrigin, NodeId, RunEvent, RunEventKind};

use super::writer::SinkWriter;

/// Emits one `edge::events` record for `$event` with the common fields and `$payload`.
macro_rules! event_record {
    ($event:expr, $($payload:tt)*) => {
        tracing::info!(
            target: "edge::events",
            run_id = $event.run_id.as_str(),
            node = $event.node.as_ref().map(NodeId::as_str),
            adapter = $event.adapter.as_str(),
            "target" = $event.target.as_str(),
            seq = $event.seq,
            origin = match $event.origin {
                EventOrigin::Node => "node",
                EventOrigin::Edge => "edge",
            },
            kind = $event.kind.name(),
            $($payload)*
        )
    };
}

/// A [`SinkWriter`] that turns events into `tracing` records.
#[derive(Debug, Default)]
pub(crate) struct LogWriter;

/// Emits the record for one event.
fn record(event: &RunEvent) {
    match &event.kind {
        RunEventKind::Started => match &event.route {
            Some(route) => event_record!(
                event,
                attempt = route.attempt,
                route = %route,
                "run event"
            ),
            None => event_record!(event, "run event"),
        },
        RunEventKind::Output {
            text,
            data,
            structured,
        } => {
            let structured = structured.as_deref();
            event_record!(
                event,
                text = text.as_str(),
                bytes = data.len(),
                reasoning = structured.map(|s| s.reasoning.as_str()),
                tool_calls = structured.map(|s| s.tool_calls.len()),
                logprobs = structured.map(|s| s.logprobs.len()),
                embeddings = structured.map(|s| s.embeddings.len()),
                "run event"
            );
        }
        RunEventKind::Completed { .. }
        | RunEventKind::Failed { .. }
        | RunEventKind::Cancelled { .. } => record_end(event),
    }
}

/// Emits the record for a terminal event.
fn record_end(event: &RunEvent) {
    match &event.kind {
        RunEventKind::Completed {
            finish_reason,
            usage,
        } => event_record!(
            event,
            finish_reason = finish_reason.as_str(),
            input_tokens = usage.map(|usage| usage.input_tokens),
            output_tokens = usage.map(|usage| usage.output_tokens),
            cached_input_tokens = usage.map(|usage| usage.cached_input_tokens),
            reasoning_tokens = usage.map(|usage| usage.reasoning_tokens),
            "run event"
        ),
        RunEventKind::Failed {
            context_window,
            code,
            message,
            class,
            status,
            usage,
        } => event_record!(
            event,
            code = code.as_str(),
            error_message = message.as_str(),
            class = class.as_str(),
            status = *status,
            context_window = *context_window,
            input_tokens = usage.map(|usage| usage.input_tokens),
            output_tokens = usage.map(|usage| usage.output_tokens),
            "run event"
        ),
        RunEventKind::Cancelled { reason, usage } => event_record!(
            event,
            reason = reason.as_str(),
            input_tokens = usage.map(|usage| usage.input_tokens),
            output_tokens = usage.map(|usage| usage.output_tokens),
            "run event"
        ),
        RunEventKind::Started | RunEventKind::Output { .. } => record(event),
    }
}

impl SinkWriter for LogWriter {
    fn write_batch(&mut self, events: &[Arc<RunEvent>]) -> io::Result<()> {
        for event in events {
            record(event);
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::sync::Mutex;

    use tokio::runtime::Handle;
    use tracing::field::{Field, Visit};
    use tracing_subscriber::layer::{Context, SubscriberExt};

    use super::*;
    use crate::adapters::event_format::tests::{completed, event, output};
    use crate::adapters::sinks::queue::QueuedSink;
    use crate::adapters::sinks::queue::tests::settings;
    use crate::ports::EventSink;

    type Record = (String, BTreeMap<String, String>);

    /// A layer keeping every record's target and fields.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<Record>>>);

    struct Fields<'a>(&'a mut BTreeMap<String, String>);

    impl Visit for Fields<'_> {
        fn record_str(&mut self, field: &Field, value: &str) {
            self.0.insert(field.name().into(), value.into());
        }

        fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
            self.0.insert(field.name().into(), format!("{value:?}"));
        }
    }

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
        fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
            let mut fields = BTreeMap::new();
            event.record(&mut Fields(&mut fields));
            let target = event.metadata().target().to_owned();
            self.0.lock().unwrap().push((target, fields));
        }
    }

    #[tokio::test]
    async fn events_become_structured_tracing_records() {
        let capture = Capture::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(capture.clone()));
        // The current-thread test runtime runs the drain task on this thread, under the
        // default subscriber set above.
        let sink = QueuedSink::on_task("log", LogWriter, settings(10), &Handle::current());
        sink.publish(output("hi"));
        sink.publish(Arc::new(event(RunEventKind::failed(
            "node_disconnected",
            "gone",
        ))));
        sink.publish(completed());
        sink.flush().await;
        assert_eq!(sink.stats().written(), 3);

        let records: Vec<Record> = capture
            .0
            .lock()
            .unwrap()
            .iter()
            .filter(|(target, _)| target == "edge::events")
            .cloned()
            .collect();
        assert_eq!(records.len(), 3);
        let out = &records[0].1;
        assert_eq!(out["run_id"], "r1");
        assert_eq!(out["node"], "node-a");
        assert_eq!(out["adapter"], "echo");
        assert_eq!(out["target"], "m1");
        assert_eq!(out["seq"], "3");
        assert_eq!(out["kind"], "output");
        assert_eq!(out["text"], "hi");
        assert_eq!(out["bytes"], "0");
        let failed = &records[1].1;
        assert_eq!(failed["code"], "node_disconnected");
        assert_eq!(failed["error_message"], "gone");
        let done = &records[2].1;
        assert_eq!(done["kind"], "completed");
        assert_eq!(done["finish_reason"], "stop");
        assert_eq!(done["output_tokens"], "7");
    }
}
