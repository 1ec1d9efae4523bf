//! The node transport over TCP: varint-delimited protobuf frames, one connection per node.
//!
//! [`TcpServer`] accepts connections and runs one task per connection: the registration
//! handshake, then relaying frames both ways with heartbeat liveness, until the node leaves,
//! breaks the protocol, falls silent, stops reading, or the edge shuts down. Whatever ends a
//! connection, the node leaves the registry and the run service hears of it.
//! [`TcpTransport`] implements the `NodeTransport` port over the registry's links.

pub mod config;
mod connection;
mod handshake;
mod link;
mod server;
mod shared;
mod stats;

pub use link::TcpTransport;
pub use server::{TcpServer, TransportControl};
pub use shared::ServerDeps;
pub use stats::TransportStats;
