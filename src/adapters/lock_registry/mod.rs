//! The lock-based Registry adapter: connected nodes behind a read-write lock, with a
//! lazily rebuilt, lock-free snapshot for selection.

mod registry;

pub use registry::LockRegistry;
