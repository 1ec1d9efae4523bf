//! Implementations of the ports, one folder per technology.

pub mod file_store;
pub mod http;
pub mod journal;
pub mod listen;
pub mod lock_registry;
pub mod sinks;
pub mod tcp;
pub mod tls;
