//! edge: the controller that binds model-execution nodes into one local execution group.
//!
//! Nodes dial the edge over TCP and speak length-delimited protobuf (see `docs/protocol.md`).
//! The edge checks their pre-shared tokens against definitions seeded from its config file,
//! keeps the connected ones in a registry, routes runs addressed as `adapter + target` to
//! them, and relays the events they stream back to event sinks and to the caller.
//!
//! The crate is hexagonal (`docs/architecture.md` draws it); the arrows point inward, and
//! `tests/it/layout.rs` checks them, with no import circle among the parts of any folder:
//!
//! - [`domain`] — the pure core: validated names and node records, the registration
//!   policy, routing (selection, breakers, the fair queue, limits, budgets), the run state
//!   machine and records, model placement, the site's lease, fencing and journal-fold
//!   rules (model-checked by a unit test, `domain/site_model.rs`). No I/O, no clock, no
//!   protobuf.
//! - [`ports`] — the traits around it: outbound (`NodeStore`, `Registry`, `EventSink`,
//!   `NodeTransport`, `NodeLink`, `RunJournal`, `SiteRole`) and inbound (`Runs` and `Manage`,
//!   what the HTTP adapters call; `NodeEventHandler`, what the node transport calls), and the
//!   `Readiness` flag.
//! - `adapters` — their implementations by technology: `tcp` (the node transport), `listen`
//!   (listening sockets), `lock_registry`, `file_store`, `sinks` (stdout, file, log, NATS),
//!   `event_format` (the event line they share), `journal` (SQLite), `nats` (what NATS
//!   clients share), `cluster` (the site's lease and journal stream over JetStream), `tls`,
//!   `http` (the server and operations endpoints), `api` (the OpenAI, Anthropic and
//!   Responses APIs and their pure translators), `admin` (`/admin/v1`), `web_console`
//!   (`/console/`), `stdin_console` (`serve --console`) and `admin_client` (the CLI's client
//!   of the management API).
//! - [`wire`] — the protocol's edge: the generated prost types (private), the frame codec,
//!   the conversions to and from domain frames, and the one mapper from a node record to
//!   the config a node receives (`wire/config_payload.rs`, the seed's `BuildConfigPayload`).
//! - `app` — the use-case services, on the domain and the ports only: `runs` (the run
//!   service), `models` (the model lifecycle), `management`, `drains`, `node_events` (what
//!   the node transport hears, handed on) and `takeover` (a member taking over its site); and
//!   `compose`, the composition root (`App::build`, settings, metrics, logging, the command
//!   line), the one layer that names adapters.
//! - [`client`] — the node side of the protocol: the public library the reference node
//!   (`edge-node`), the mock node, the load generator and the tests are built on.
//! - [`hops`] — the real path's hop timings, opt-in trace events (decision 34).
//!
//! Without the default `server` feature the crate is only the node side of the protocol —
//! [`client`], [`wire`], [`domain`], [`ports`], [`hops`] — what `edge-node` and the mock node
//! build on, free of the server's crates.
//!
//! What is public: [`App`] (build, serve, stop; [`AppParts`] for tests), [`settings`]
//! (every section's type), [`cli`], [`telemetry`], [`hops`], [`client`], [`domain`], [`ports`],
//! [`wire`], and [`components`], the few parts benchmarks and fuzz targets assemble by
//! hand. `adapters` and `app` are the crate's own (decision 28).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "server")]
pub(crate) mod adapters;
#[cfg(feature = "server")]
pub(crate) mod app;
pub mod client;
pub mod domain;
pub mod hops;
pub mod ports;
pub mod wire;

#[cfg(feature = "server")]
pub use app::compose::cli;
#[cfg(feature = "server")]
pub use app::compose::settings;
#[cfg(feature = "server")]
pub use app::compose::{App, AppParts, Settings};

/// Span export and the edge's own logs, as `edge serve` sets them up (`[tracing]`, `[log]`),
/// for programs that run an edge in process (the load generator, tests).
#[cfg(feature = "server")]
pub mod telemetry {
    pub use crate::app::compose::logging::{init, init_with_tracing};
    pub use crate::app::compose::telemetry::{Exporter, OtlpProtocol, TracingConfig, export_layer};
}

/// The edge's parts one by one, for the programs that build less than a whole [`App`]:
/// the benchmarks (`benches/`), the load generator's relay and journal modes and the fuzz
/// targets. A deliberately small list; an operator's program needs none of it, and
/// nothing here is a stable API.
#[cfg(feature = "server")]
pub mod components {
    pub use crate::adapters::event_format::{write_json_line, write_text_line};
    pub use crate::adapters::file_store::FileNodeStore;
    pub use crate::adapters::journal::SqliteJournal;
    pub use crate::adapters::lock_registry::LockRegistry;
    pub use crate::adapters::sinks::{SinkSet, build_sinks};
    pub use crate::adapters::tcp::{
        ServerDeps, TcpServer, TcpTransport, TransportControl, TransportStats,
    };
    pub use crate::app::runs::{Routing, RunService, policy};
}
