//! The Registry port: the nodes connected right now.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crate::domain::routing::NodeStatus;
use crate::domain::{
    AdapterName, Availability, DeclaredOperations, Inventory, NodeId, NodeRecord, Target,
};

use super::transport::{ConnectionId, NodeLink};

/// What the transport hands the registry when a node's registration is accepted.
#[derive(Clone)]
pub struct NewConnection {
    /// The node's definition.
    pub record: Arc<NodeRecord>,
    /// This connection's id.
    pub connection: ConnectionId,
    /// The node's address.
    pub peer: SocketAddr,
    /// The node software's version, as reported.
    pub node_version: String,
    /// The way to send to this node.
    pub link: Arc<dyn NodeLink>,
    /// The node process's instance id (`RegisterRequest.instance_id`); empty from a v1 node.
    pub instance_id: String,
    /// When this connection last sent a frame; the connection keeps it current.
    pub last_frame: Arc<LastFrame>,
    /// Active runs the connection starts with: slots its transport holds while the node's
    /// resume claims are answered (so no run is placed on the node before the runs it
    /// resumes are counted), and gives back with `adjust_active_runs` afterwards.
    pub reserved_runs: u32,
    /// The node can carry on runs another node began (`RegisterRequest.can_continue`).
    pub can_continue: bool,
    /// The operations needing a declaration that the node declared it serves.
    pub operations: DeclaredOperations,
    /// The node obeys model commands (`RegisterRequest.can_manage_models`).
    pub can_manage_models: bool,
    /// The node's devices as it registered them (`RegisterRequest.inventory`, v1.7).
    pub inventory: Option<Inventory>,
}

/// When a connection last sent a frame: written by the connection's task as frames arrive,
/// read by the registration policy to judge whether an old connection is still alive (see
/// `decide_registration`). Monotonic, microsecond resolution, one writer.
#[derive(Debug)]
pub struct LastFrame {
    origin: Instant,
    since_origin_us: AtomicU64,
}

impl LastFrame {
    /// A connection whose last frame (its registration) arrived at `at`.
    pub fn new(at: Instant) -> Self {
        Self {
            origin: at,
            since_origin_us: AtomicU64::new(0),
        }
    }

    /// Records a frame that arrived at `at` (an earlier time than the last one is ignored).
    pub fn record(&self, at: Instant) {
        let since = at.saturating_duration_since(self.origin).as_micros();
        let since = u64::try_from(since).unwrap_or(u64::MAX);
        self.since_origin_us.fetch_max(since, Ordering::Relaxed);
    }

    /// When the last frame arrived.
    pub fn at(&self) -> Instant {
        let since = Duration::from_micros(self.since_origin_us.load(Ordering::Relaxed));
        self.origin.checked_add(since).unwrap_or(self.origin)
    }
}

/// A connected node as the registry reports it: a copy, never a reference into its map.
#[derive(Debug, Clone)]
pub struct ConnectedNode {
    /// The node's definition.
    pub record: Arc<NodeRecord>,
    /// The connection's id.
    pub connection: ConnectionId,
    /// The node's address.
    pub peer: SocketAddr,
    /// The node software's version.
    pub node_version: String,
    /// When the registration was accepted.
    pub connected_since: SystemTime,
    /// When the node last sent a frame (wall clock, refreshed at most once a second).
    pub last_seen: SystemTime,
    /// When the node last sent a frame (monotonic, exact), for the registration policy.
    pub last_frame_at: Instant,
    /// The node process's instance id; empty from a v1 node.
    pub instance_id: String,
    /// Runs the edge has sent it that have not ended.
    pub active_runs: u32,
    /// What the node last reported it can serve now; `None` when it never reported
    /// (everything its config lists).
    pub availability: Option<Arc<Availability>>,
    /// An operator drained it: it keeps its runs but takes no new ones.
    pub drained: bool,
    /// It obeys model commands for the adapters its availability reports managed.
    pub can_manage_models: bool,
    /// Its devices as it last reported them (v1.7); `None` from an older node.
    pub inventory: Option<Arc<Inventory>>,
}

impl ConnectedNode {
    /// Whether the node could load `adapter + target` on command: it obeys model commands,
    /// its config serves the pair, it is not drained, and the adapter's last report lists
    /// the target among those its engine may hold.
    pub fn can_load(&self, adapter: &AdapterName, target: &Target) -> bool {
        self.can_manage_models
            && !self.drained
            && self.record.serves(adapter, target)
            && self
                .availability
                .as_ref()
                .and_then(|a| a.managed(adapter))
                .is_some_and(|m| m.targets.contains_key(target))
    }

    /// Whether the node takes new runs of `adapter + target` now, load aside: its config
    /// serves them, its last availability report lists them, and it is not drained.
    pub fn serves_now(&self, adapter: &AdapterName, target: &Target) -> bool {
        !self.drained
            && self.record.serves(adapter, target)
            && self
                .availability
                .as_ref()
                .is_none_or(|a| a.serves(adapter, target))
    }
}

/// The node already has a live connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("node is already connected")]
pub struct AlreadyConnected;

/// The connected nodes, indexed by id and by alias.
///
/// Implementations are safe to share between tasks and never hand out their internal map:
/// every read returns values.
#[cfg_attr(test, mockall::automock)]
pub trait Registry: Send + Sync {
    /// Adds a node whose registration was accepted.
    ///
    /// # Errors
    /// [`AlreadyConnected`] when the node has a live connection; the registry is unchanged.
    fn insert(&self, connection: NewConnection) -> Result<(), AlreadyConnected>;

    /// Replaces the node's live connection `old` with `connection` in one step (a takeover),
    /// or inserts `connection` when the node has no live connection any more. Returns the
    /// replaced connection's link, so the caller can close it; the replaced connection's
    /// later `remove` finds nothing to remove.
    ///
    /// # Errors
    /// [`AlreadyConnected`] when the node's live connection is another one than `old` (a
    /// third connection won the race); the registry is unchanged.
    fn replace(
        &self,
        connection: NewConnection,
        old: ConnectionId,
    ) -> Result<Option<Arc<dyn NodeLink>>, AlreadyConnected>;

    /// Removes the node if `connection` is still its live connection; returns whether it did.
    fn remove(&self, id: &NodeId, connection: ConnectionId) -> bool;

    /// Whether the node has a live connection.
    fn is_connected(&self, id: &NodeId) -> bool;

    /// The connected node with this id or alias.
    fn get(&self, id_or_alias: &str) -> Option<ConnectedNode>;

    /// Every connected node, ordered by id.
    fn snapshot(&self) -> Vec<ConnectedNode>;

    /// Every connected node as routing sees it (definition, active runs, availability,
    /// drain), ordered by id.
    fn statuses(&self) -> Vec<NodeStatus>;

    /// [`Self::statuses`] of the nodes whose config serves `adapter + target` only (the
    /// candidates of a run of that route).
    fn statuses_serving(&self, adapter: &AdapterName, target: &Target) -> Vec<NodeStatus>;

    /// The live connection of the node with this id.
    fn connection(&self, id: &NodeId) -> Option<ConnectionId>;

    /// How many nodes are connected.
    fn len(&self) -> usize;

    /// Whether no node is connected.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The way to send to the node's live connection.
    fn link(&self, id: &NodeId) -> Option<Arc<dyn NodeLink>>;

    /// Records that the node's connection `connection` sent a frame at `at`.
    fn touch(&self, id: &NodeId, connection: ConnectionId, at: SystemTime);

    /// Adds `delta` to the node's active runs if `connection` is still its live connection.
    fn adjust_active_runs(&self, id: &NodeId, connection: ConnectionId, delta: i32);

    /// Replaces what the node's live connection `connection` can serve now (a heartbeat's
    /// `availability`). Returns whether that changed anything.
    fn set_availability(
        &self,
        id: &NodeId,
        connection: ConnectionId,
        availability: Availability,
    ) -> bool;

    /// Replaces the devices the node's live connection `connection` reported (a heartbeat's
    /// `inventory`). Shown to operators only: placement reads the adapters' budgets.
    fn set_inventory(&self, id: &NodeId, connection: ConnectionId, inventory: Inventory);

    /// Takes `adapter + target` out of what the node serves now (`withheld`), or puts it
    /// back, until the node's next availability report: no new run of it is placed there
    /// while its engine unloads it. Returns whether anything changed.
    fn set_withheld(
        &self,
        id: &NodeId,
        adapter: &AdapterName,
        target: &Target,
        withheld: bool,
    ) -> bool;

    /// Drains the node (it keeps its runs but takes no new ones) or undrains it. The flag
    /// belongs to the node id, not to a connection: a drained node that reconnects stays
    /// drained. Returns whether the flag changed.
    fn set_drained(&self, id: &NodeId, drained: bool) -> bool;
}
