//! The hop events of the edge and the reference node (`edge::hops`), collected in this
//! process: a `tracing` layer that stamps each one with the time it saw it, and the
//! breakdown of a streamed request's time to first token into the hops between them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
        let seen = Seen {
            hop,
            seq: fields.seq,
            at,
        };
        self.log.runs().entry(run_id).or_default().push(seen);
    }
}
