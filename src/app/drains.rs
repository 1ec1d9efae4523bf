//! The nodes an operator has drained: they take no new runs until resumed, whether they
//! are connected now or reconnect later. Kept in memory: an edge restart resumes every
//! node.
//!
//! These are the operator's records (since when, until which deadline); routing reads the
//! registry's drained flag, which the management service sets alongside.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::domain::{Drain, NodeId};

/// The drained nodes. Cheap to clone; clones share the set.
#[derive(Clone, Default)]
pub struct Drains {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    drains: RwLock<HashMap<NodeId, Drain>>,
    /// How many nodes are drained, read without the lock.
    count: AtomicUsize,
}

impl Drains {
    /// No node drained.
    pub fn new() -> Self {
        Self::default()
    }

    /// Drains `node` (again: a new drain replaces the old one, deadline included).
    pub fn drain(&self, node: NodeId, drain: Drain) {
        let mut drains = self.inner.drains.write().unwrap_or_else(|p| p.into_inner());
        drains.insert(node, drain);
        self.inner.count.store(drains.len(), Ordering::Release);
    }

    /// Ends `node`'s drain; returns the drain it had.
    pub fn undrain(&self, node: &NodeId) -> Option<Drain> {
        let mut drains = self.inner.drains.write().unwrap_or_else(|p| p.into_inner());
        let removed = drains.remove(node);
        self.inner.count.store(drains.len(), Ordering::Release);
        removed
    }

    /// `node`'s drain, if it is drained.
    pub fn get(&self, node: &NodeId) -> Option<Drain> {
        if self.is_empty() {
            return None;
        }
        let drains = self.inner.drains.read().unwrap_or_else(|p| p.into_inner());
        drains.get(node).copied()
    }

    /// How many nodes are drained.
    pub fn len(&self) -> usize {
        self.inner.count.load(Ordering::Acquire)
    }

    /// Whether no node is drained.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_are_kept_until_resumed() {
        let drains = Drains::new();
        let a = NodeId::parse("node-a").unwrap();
        assert!(drains.get(&a).is_none());
        let drain = Drain {
            since_ms: 5,
            deadline_ms: Some(10),
        };
        drains.drain(a.clone(), drain);
        assert_eq!(drains.get(&a), Some(drain));
        assert_eq!(drains.len(), 1);
        assert_eq!(drains.undrain(&a), Some(drain));
        assert!(drains.is_empty());
        assert_eq!(drains.undrain(&a), None);
    }
}
