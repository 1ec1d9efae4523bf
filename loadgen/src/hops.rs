//! The hop events of the edge and the reference node (`edge::hops`), collected in this
//! process: a `tracing` layer that stamps each one with the time it saw it, and the
//! breakdown of a streamed request's time to first token into the hops between them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use edge::domain::usage::days_from_civil;
use edge::hops;
use tracing::field::{Field, Visit};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;

/// The seq of a run's first output: the node emits `started` first.
const FIRST_OUTPUT_SEQ: u64 = 2;

/// One hop event as seen.
#[derive(Debug, Clone)]
struct Seen {
    hop: &'static str,
    seq: Option<u64>,
    at: Instant,
}

/// Every hop event seen, by run id.
#[derive(Debug, Clone, Default)]
pub struct HopLog {
    runs: Arc<Mutex<HashMap<String, Vec<Seen>>>>,
}

impl HopLog {
    fn runs(&self) -> MutexGuard<'_, HashMap<String, Vec<Seen>>> {
        self.runs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The layer that fills this log (to be filtered to `edge::hops::TARGET` at `TRACE`).
    pub fn layer(&self) -> HopLayer {
        HopLayer { log: self.clone() }
    }

    /// The time from `sent` (the caller wrote the request) to each hop of run `run_id`'s
    /// first output, then to `first_content` (the caller read it), in [`SEGMENTS`] order;
    /// `None` when a hop is missing.
    pub fn breakdown(
        &self,
        run_id: &str,
        sent: Instant,
        first_content: Instant,
    ) -> Option<Vec<Duration>> {
        let runs = self.runs();
        let seen = runs.get(run_id)?;
        let at = |hop: &str, seq: Option<u64>| {
            seen.iter()
                .find(|s| s.hop == hop && (seq.is_none() || s.seq == seq))
                .map(|s| s.at)
        };
        let first = Some(FIRST_OUTPUT_SEQ);
        let marks = [
            Some(sent),
            at(hops::API_ACCEPTED, None),
            at(hops::RUN_SENT, None),
            at(hops::RUN_RECEIVED, None),
            at(hops::ENGINE_REQUEST, None),
            at(hops::ENGINE_HEADERS, None),
            at(hops::ENGINE_FIRST_OUTPUT, None),
            at(hops::EVENT_SENT, first),
            at(hops::EVENT_RECEIVED, first),
            at(hops::API_FRAME, None),
            Some(first_content),
        ];
        let marks: Vec<Instant> = marks.into_iter().collect::<Option<_>>()?;
        Some(
            marks
                .windows(2)
                .map(|w| w[1].saturating_duration_since(w[0]))
                .collect(),
        )
    }

    /// Forgets every run.
    pub fn clear(&self) {
        self.runs().clear();
    }

    /// Notes that run `run_id` passed `hop` (event `seq`) at `at`.
    fn record(&self, run_id: String, hop: &'static str, seq: Option<u64>, at: Instant) {
        self.runs()
            .entry(run_id)
            .or_default()
            .push(Seen { hop, seq, at });
    }

    /// Reads the hop events out of processes' JSON log lines (`log.format = "json"` for
    /// `edge serve`, `--log-format json` for `edge-node`, both with `edge_hop=trace`): each
    /// stamped with its line's wall-clock `timestamp`, put on this process's clock by
    /// `clock` (an `Instant` and the `SystemTime` read with it). Other lines are skipped.
    pub fn read_json_lines(&self, text: &str, clock: (Instant, SystemTime)) {
        for line in text.lines() {
            let Ok(line) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            // The edge flattens an event's fields into the line; the node nests them.
            let field = |name: &str| line.get(name).or_else(|| line.get("fields")?.get(name));
            let text_of = |name: &str| field(name).and_then(serde_json::Value::as_str);
            let (Some(hop), Some(run_id), Some(wall)) = (
                text_of("hop").and_then(known_hop),
                text_of("run_id"),
                line.get("timestamp")
                    .and_then(serde_json::Value::as_str)
                    .and_then(parse_utc),
            ) else {
                continue;
            };
            // A timestamp no `Instant` can hold (on a platform whose clock starts at boot) is
            // no hop of this run.
            let at = match wall.duration_since(clock.1) {
                Ok(after) => clock.0.checked_add(after),
                Err(before) => clock.0.checked_sub(before.duration()),
            };
            let Some(at) = at else {
                continue;
            };
            let seq = field("seq").and_then(serde_json::Value::as_u64);
            self.record(run_id.to_owned(), hop, seq, at);
        }
    }
}

/// A UTC timestamp as `tracing-subscriber` writes it (`2026-12-03T18:09:55.613657Z`).
fn parse_utc(text: &str) -> Option<SystemTime> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let mut date = date.splitn(3, '-').map(str::parse::<i64>);
    let (year, month, day) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (clock, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut clock = clock.splitn(3, ':').map(str::parse::<u64>);
    let (hour, minute, second) = (
        clock.next()?.ok()?,
        clock.next()?.ok()?,
        clock.next()?.ok()?,
    );
    let nanos: u64 = format!("{fraction:0<9}").get(..9)?.parse().ok()?;
    let in_range = (1970..=9999).contains(&year)
        && (1..=12).contains(&month)
        && (1..=31).contains(&day)
        && hour < 24
        && minute < 60
        && second < 61;
    if !in_range {
        return None;
    }
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    let seconds = days * 86_400 + hour * 3_600 + minute * 60 + second;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(seconds) + Duration::from_nanos(nanos))
}

/// The hops of a first output, in order: the name of each figure (p50, p90) and what it
/// spans.
pub const SEGMENTS: [(&str, &str, &str); 10] = [
    (
        "caller_to_api_p50_us",
        "caller_to_api_p90_us",
        "caller writes → edge API accepts (HTTP, body, route)",
    ),
    (
        "api_to_link_p50_us",
        "api_to_link_p90_us",
        "→ edge writes RunRequest to the node",
    ),
    (
        "link_to_node_p50_us",
        "link_to_node_p90_us",
        "→ node read it",
    ),
    (
        "node_dispatch_p50_us",
        "node_dispatch_p90_us",
        "→ node sends the engine request",
    ),
    (
        "engine_headers_p50_us",
        "engine_headers_p90_us",
        "→ engine's response headers",
    ),
    (
        "engine_first_p50_us",
        "engine_first_p90_us",
        "→ first output decoded from the engine's stream",
    ),
    (
        "node_emit_p50_us",
        "node_emit_p90_us",
        "→ node writes its event to the edge",
    ),
    (
        "link_to_edge_p50_us",
        "link_to_edge_p90_us",
        "→ edge read it",
    ),
    (
        "edge_relay_p50_us",
        "edge_relay_p90_us",
        "→ edge handed the SSE frame to its HTTP server",
    ),
    (
        "api_to_caller_p50_us",
        "api_to_caller_p90_us",
        "→ caller read the first content",
    ),
];

/// Collects hop events into a [`HopLog`].
pub struct HopLayer {
    log: HopLog,
}

/// The fields of one hop event.
#[derive(Default)]
struct Fields {
    hop: Option<&'static str>,
    run_id: Option<String>,
    seq: Option<u64>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "hop" => self.hop = known_hop(value),
            "run_id" => self.run_id = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "seq" {
            self.seq = Some(value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `run_id = %id` arrives as a `Display` wrapped in `Debug`.
        if field.name() == "run_id" {
            self.run_id = Some(format!("{value:?}"));
        }
    }
}

/// The `'static` name of a hop the breakdown uses.
fn known_hop(name: &str) -> Option<&'static str> {
    [
        hops::API_ACCEPTED,
        hops::RUN_SENT,
        hops::RUN_RECEIVED,
        hops::ENGINE_REQUEST,
        hops::ENGINE_HEADERS,
        hops::ENGINE_FIRST_OUTPUT,
        hops::EVENT_SENT,
        hops::EVENT_RECEIVED,
        hops::API_FRAME,
    ]
    .into_iter()
    .find(|hop| *hop == name)
}

impl<S: tracing::Subscriber> Layer<S> for HopLayer {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        let at = Instant::now();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let (Some(hop), Some(run_id)) = (fields.hop, fields.run_id) else {
            return;
        };
        self.log.record(run_id, hop, fields.seq, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_timestamps_are_read_as_utc_to_the_microsecond() {
        let at = |secs, micros| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_micros(micros)
        };
        assert_eq!(parse_utc("1970-01-01T00:00:00.000001Z"), Some(at(0, 1)));
        assert_eq!(
            parse_utc("2026-12-03T18:14:18.405531Z"),
            Some(at(1_796_321_658, 405_531))
        );
        assert_eq!(parse_utc("2000-02-29T00:00:00Z"), Some(at(951_782_400, 0)));
        assert_eq!(parse_utc("2026-12-03 18:14:18Z"), None);
        assert_eq!(parse_utc("2026-13-03T18:14:18Z"), None);
        assert_eq!(parse_utc("99999999999-12-03T99999999999:14:18Z"), None);
        assert_eq!(parse_utc("yesterday"), None);
    }

    #[test]
    fn hop_events_are_read_from_the_edges_and_the_nodes_json_lines() {
        let log = HopLog::default();
        let clock = (
            Instant::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_321_658),
        );
        let lines = [
            r#"{"timestamp":"2026-12-03T18:14:18.000100Z","level":"TRACE","hop":"run_sent","run_id":"r1","target":"edge_hop"}"#,
            r#"{"timestamp":"2026-12-03T18:14:18.000250Z","level":"TRACE","fields":{"hop":"event_sent","run_id":"r1","seq":2},"target":"edge_hop"}"#,
            r#"{"timestamp":"2026-12-03T18:14:18.000300Z","level":"INFO","fields":{"message":"run ended"}}"#,
            "not json",
        ];
        log.read_json_lines(&lines.join("\n"), clock);
        let runs = log.runs();
        let seen = runs.get("r1").expect("r1");
        assert_eq!(seen.len(), 2);
        assert_eq!((seen[0].hop, seen[0].seq), (hops::RUN_SENT, None));
        assert_eq!(seen[0].at - clock.0, Duration::from_micros(100));
        assert_eq!((seen[1].hop, seen[1].seq), (hops::EVENT_SENT, Some(2)));
        assert_eq!(seen[1].at - clock.0, Duration::from_micros(250));
    }
}
