//! edge: the controller that binds model-execution nodes into one local execution group.
//!
//! Nodes dial the edge over TCP and speak length-delimited protobuf (see `docs/protocol.md`).
//! The edge checks their pre-shared tokens against definitions seeded from its config file,
//! keeps the connected ones in a registry, routes runs addressed as `adapter + target` to
//! them, and relays the events they stream back to event sinks and to the caller.
//!
//! The crate is hexagonal (`docs/architecture.md` draws it):
//!
//! - [`domain`] — the pure core: validated names and node records, the registration
//!   policy, node selection, the run state machine. No I/O, no clock, no protobuf.
//! - [`ports`] — the traits around it: outbound (`NodeStore`, `Registry`, `EventSink`,
//!   `NodeTransport`, `NodeLink`, `RunJournal`) and inbound (`Runs` and `Manage`, what the
//!   HTTP adapters call; `NodeEventHandler`, what the node transport calls), and the
//!   `Readiness` flag.
//! - `adapters` — their implementations by technology: `tcp` (the node transport and its
//!   `Connection`), `lock_registry`, `file_store`, `sinks`, `journal`, `http` (operations
//!   endpoints, metrics rendering, the OpenAI-compatible and Anthropic APIs, the management
//!   API), `tls`, and `event_format`, the event line they share.
//! - [`wire`] — the protocol's edge: the generated prost types (private), the frame codec,
//!   the conversions to and from domain frames, and the one mapper from a node record to
//!   the config a node receives (`wire/config_payload.rs`, the seed's `BuildConfigPayload`).
//! - `app` — composition (`App::build`), the run and management services, settings, the
//!   metrics pipeline and the command line.
//! - [`client`] — the node side of the protocol: the public library the reference node
//!   (`edge-node`), the mock node, the load generator and the tests are built on.
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
