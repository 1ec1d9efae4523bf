//! Turns `[events]` into running sinks: validates the settings, opens what must be opened
//! (so a bad file path fails at startup, naming the path) and starts one queued sink per
//! configured kind. It must not format or write events itself.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::domain::EdgeId;
use crate::ports::EventSink;

use super::config::EventsConfig;
use super::error::SinkError;
use super::file::file_writer;
use super::kind::SinkKind;
use super::log::LogWriter;
use super::nats::{NatsStats, nats_sink};
use super::null::NullWriter;
use super::queue::{QueueSettings, QueuedSink};
use super::stats::SinkStats;
use super::stdout::stdout_writer;

/// How often the console and the log sink are flushed at the latest while their queue never
/// runs empty (the file sink uses `[events.file] flush_interval_ms`).
const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_millis(100);

/// One running sink and its counters.
pub struct BuiltSink {
    /// Which sink this is (its name for logs and metric labels: [`SinkKind::as_str`]).
    pub kind: SinkKind,
    /// The sink.
    pub sink: Arc<dyn EventSink>,
    /// Its counters, for metrics export.
    pub stats: SinkStats,
    /// The NATS sink's own counters (confirmed, republished, dropped, connection).
    pub nats: Option<NatsStats>,
}

/// Builds the sinks `config` lists for the edge `edge`, in order, each behind its own
/// queue and drain (a task, or a thread for the file, stdout and NATS sinks, whose writes
/// block).
///
/// Must be called inside a tokio runtime. A sink's drain ends, after writing and flushing
/// what it holds, once every handle to the sink is dropped.
///
/// # Errors
/// [`SinkError::ZeroCapacity`] and [`SinkError::Duplicate`] for bad settings;
/// [`SinkError::FileIsDirectory`] and [`SinkError::FileOpen`] when the file sink's path is
/// unusable; [`SinkError::Nats`] when the NATS sink cannot start;
/// [`SinkError::Thread`] when a sink's thread cannot start;
/// [`SinkError::NoRuntime`] outside a tokio runtime. Nothing keeps running after
/// an error.
pub fn build_sinks(config: &EventsConfig, edge: &EdgeId) -> Result<Vec<BuiltSink>, SinkError> {
    let runtime = Handle::try_current().map_err(|_| SinkError::NoRuntime)?;
    if config.queue_capacity == 0 {
        return Err(SinkError::ZeroCapacity);
    }
    let mut seen = HashSet::new();
    if let Some(&kind) = config.sinks.iter().find(|&&kind| !seen.insert(kind)) {
        return Err(SinkError::Duplicate { kind });
    }
    config
        .sinks
        .iter()
        .map(|&kind| build_one(config, edge, kind, &runtime))
        .collect()
}

/// Starts one sink of `kind`.
fn build_one(
    config: &EventsConfig,
    edge: &EdgeId,
    kind: SinkKind,
    runtime: &Handle,
) -> Result<BuiltSink, SinkError> {
    let settings = |flush_interval| QueueSettings {
        capacity: config.queue_capacity,
        flush_interval,
    };
    let thread_error = |source| SinkError::Thread { kind, source };
    let mut nats = None;
    let sink = match kind {
        SinkKind::Stdout => QueuedSink::on_thread(
            kind.as_str(),
            stdout_writer(config.stdout.format),
            settings(DEFAULT_FLUSH_INTERVAL),
        )
        .map_err(thread_error)?,
        SinkKind::File => QueuedSink::on_thread(
            kind.as_str(),
            file_writer(&config.file.path)?,
            settings(Duration::from_millis(config.file.flush_interval_ms)),
        )
        .map_err(thread_error)?,
        SinkKind::Log => QueuedSink::on_task(
            kind.as_str(),
            LogWriter,
            settings(DEFAULT_FLUSH_INTERVAL),
            runtime,
        ),
        SinkKind::Null => QueuedSink::on_task(
            kind.as_str(),
            NullWriter,
            settings(DEFAULT_FLUSH_INTERVAL),
            runtime,
        ),
        SinkKind::Nats => {
            let (sink, stats) = nats_sink(&config.nats, edge, settings(DEFAULT_FLUSH_INTERVAL))?;
            nats = Some(stats);
            sink
        }
    };
    let stats = sink.stats();
    Ok(BuiltSink {
        kind,
        sink: Arc::new(sink),
        stats,
        nats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::event_format::tests::completed;
    use crate::adapters::sinks::config::FileSinkConfig;

    fn edge() -> EdgeId {
        EdgeId::parse("edge-test").unwrap()
    }

    fn config(sinks: Vec<SinkKind>) -> EventsConfig {
        EventsConfig {
            sinks,
            ..EventsConfig::default()
        }
    }

    #[tokio::test]
    async fn builds_every_configured_sink_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let config = EventsConfig {
            file: FileSinkConfig {
                path: path.clone(),
                flush_interval_ms: 50,
            },
            ..config(vec![SinkKind::File, SinkKind::Log, SinkKind::Null])
        };
        let built = build_sinks(&config, &edge()).unwrap();
        let names: Vec<&str> = built.iter().map(|b| b.sink.name()).collect();
        assert_eq!(names, ["file", "log", "null"]);
        for b in &built {
            b.sink.publish(completed());
            b.sink.flush().await;
            assert_eq!(b.stats.written(), 1, "{}", b.kind.as_str());
        }
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 1);
    }

    #[tokio::test]
    async fn rejects_bad_settings() {
        let zero = EventsConfig {
            queue_capacity: 0,
            ..config(vec![SinkKind::Null])
        };
        assert!(matches!(
            build_sinks(&zero, &edge()),
            Err(SinkError::ZeroCapacity)
        ));
        let twice = config(vec![SinkKind::Null, SinkKind::Log, SinkKind::Null]);
        let error = build_sinks(&twice, &edge()).err().unwrap();
        assert!(matches!(
            error,
            SinkError::Duplicate {
                kind: SinkKind::Null
            }
        ));
        assert!(error.to_string().contains("`null`"), "{error}");
    }

    #[tokio::test]
    async fn a_bad_file_path_fails_the_build_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("events.jsonl");
        let config = EventsConfig {
            file: FileSinkConfig {
                path: path.clone(),
                flush_interval_ms: 50,
            },
            ..config(vec![SinkKind::Null, SinkKind::File])
        };
        let error = build_sinks(&config, &edge()).err().unwrap();
        assert!(matches!(error, SinkError::FileOpen { .. }));
        assert!(
            error.to_string().contains(&path.display().to_string()),
            "{error}"
        );
    }

    #[test]
    fn outside_a_runtime_is_an_error() {
        let result = build_sinks(&config(vec![SinkKind::Null]), &edge());
        assert!(matches!(result, Err(SinkError::NoRuntime)));
    }
}
