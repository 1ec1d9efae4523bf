//! The composition root.
