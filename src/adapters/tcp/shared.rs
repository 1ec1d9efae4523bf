//! What the accept loop and every connection task share: the transport's dependencies
//! ([`ServerDeps`]) and its state ([`Shared`]). Plain data; accepting and serving
//! connections belong to `server.rs` and `connection.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::config::ServerConfig;
use super::stats::TransportStats;
use crate::domain::RegistrationThrottle;
use crate::ports::{NodeEventHandler, NodeStore, Readiness, Registry, SiteRole};

/// What the transport works with.
#[derive(Clone)]
pub struct ServerDeps {
    /// The pre-registered node definitions.
    pub store: Arc<dyn NodeStore>,
    /// The connected nodes.
    pub registry: Arc<dyn Registry>,
    /// Who hears run events and node arrivals and departures.
    pub handler: Arc<dyn NodeEventHandler>,
    /// Whether this edge acts for its site, and under which epoch: every message to a node
    /// carries the epoch; while it does not act, registrations are refused (naming the
    /// active member) and, when it stops acting, every node is sent away. `SiteRole::default()`
    /// (a single edge) always acts, under epoch 0.
    pub site: SiteRole,
}

/// State shared by the accept loop and every connection task.
pub(super) struct Shared {
    pub(super) config: ServerConfig,
    pub(super) deps: ServerDeps,
    /// Set when draining: new registrations are refused.
    pub(super) readiness: Readiness,
    /// Cancelled to close every connection at once (the end of a graceful stop).
    pub(super) close_all: CancellationToken,
    pub(super) stats: Arc<TransportStats>,
    /// Failed registrations per peer address, for the brute-force brake.
    pub(super) throttle: Mutex<RegistrationThrottle>,
    /// The id the next accepted connection gets.
    pub(super) next_connection: AtomicU64,
}
