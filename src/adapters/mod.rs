//! Implementations of the ports, one folder per technology.

pub mod file_store;
pub mod sinks;
pub mod tcp;
pub mod lock_registry;
