//! edge: the controller that binds model-execution nodes into one local execution group.
//!
//! Nodes dial the edge over TCP and speak length-delimited protobuf (see `docs/protocol.md`).
//! The edge checks their pre-shared tokens against definitions seeded from its config file,
//! keeps the connected ones in a registry, routes runs addressed as `adapter + target` to
//! them, and relays the events they stream back to event sinks and to the caller.
//!
//! The crate is hexagonal: [`domain`] is the pure core, [`ports`] the traits around it,
//! [`adapters`] their implementations, and [`app`] composes everything. [`client`] is the
//! node side of the protocol, for the mock node, the load generator and the tests.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod adapters;
pub mod app;
pub mod client;
pub mod domain;
pub mod ports;
pub mod wire;
