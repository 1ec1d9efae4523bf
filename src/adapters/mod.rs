//! Implementations of the ports, one folder per technology, and the event line format they
//! share (`event_format`).

pub(crate) mod admin;
pub(crate) mod admin_client;
pub(crate) mod api;
pub mod cluster;
pub mod event_format;
pub mod file_store;
pub(crate) mod http;
pub mod journal;
pub(crate) mod listen;
pub mod lock_registry;
pub mod nats;
pub mod sinks;
pub(crate) mod stdin_console;
pub mod tcp;
pub(crate) mod tls;
pub(crate) mod web_console;
