//! [`Readiness`]: whether the edge takes new work, shared by whoever decides it (the node
//! transport starts draining on the stop signal) and whoever reports it (`GET /readyz`).
//!
//! A concrete handle rather than a trait: one flag, one meaning, and nothing to mock. It
//! lets the HTTP adapter report readiness without holding the node transport.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A cheap-to-clone flag: ready until [`Readiness::start_draining`], draining after.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    draining: Arc<AtomicBool>,
}

impl Readiness {
    /// From now on the edge takes no new nodes or runs.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }

    /// Whether the edge is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}
