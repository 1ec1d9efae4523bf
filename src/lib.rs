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
//!   `NodeTransport`, `NodeLink`, `NodeEventHandler`, `RunJournal`) and inbound (`Runs`,
//!   `Manage`, what the HTTP adapters call), and the `Readiness` flag.
//! - [`adapters`] — their implementations by technology: `tcp` (the node transport and its
//!   `Connection`), `lock_registry`, `file_store`, `sinks`, `journal`, `http` (operations
//!   endpoints, metrics rendering, the OpenAI-compatible and Anthropic APIs, the management
//!   API), `tls`, and `event_format`, the event line they share.
//! - [`wire`] — the protocol's edge: the generated prost types (private), the frame codec,
//!   the conversions to and from domain frames, and the one mapper from a node record to
//!   the config a node receives (`wire/config_payload.rs`, the seed's `BuildConfigPayload`).
//! - [`app`] — composition (`App::build`), the run service (`app::runs`), settings, the
//!   metrics pipeline, the console and the command line.
//! - [`client`] — the node side of the protocol: the public library the reference node
//!   (`edge-node`), the mock node, the load generator and the tests are built on.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adapters;
pub mod app;
pub mod client;
pub mod domain;
pub mod ports;
pub mod wire;
