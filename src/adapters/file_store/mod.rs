//! The node store backed by the config file: the `[[nodes]]` entries, read and validated once
//! at startup.
//!
//! This adapter only reads; it never writes the file back and never reloads it. Validation
//! rules live in the domain (`validate_definitions`); this module maps the file's shape onto
//! them and indexes the result for lookups.

mod config;
mod store;

pub use config::ConfigSource;
pub use store::FileNodeStore;
