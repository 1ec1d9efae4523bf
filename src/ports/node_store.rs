//! The NodeStore port: the pre-registered node definitions, read-only after startup.

use std::sync::Arc;

use crate::domain::{NodeId, NodeRecord, Token};

/// Looks up pre-registered node definitions.
///
/// Implementations are seeded once (from the config file) and never change afterwards, so
/// every method is a cheap, infallible read.
pub trait NodeStore: Send + Sync {
    /// The record whose token is `token`, or `None` (also for an empty token).
    ///
    /// Must compare token digests in constant time, and must not reveal through its answer
    /// anything but "this record" or "no record".
    fn find_by_token(&self, token: &Token) -> Option<Arc<NodeRecord>>;

    /// The record with id `id`, or `None`.
    fn find_by_id(&self, id: &NodeId) -> Option<Arc<NodeRecord>>;

    /// Every record, in definition order.
    fn records(&self) -> Vec<Arc<NodeRecord>>;
}
