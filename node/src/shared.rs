//! What a connection's session, the model commands and the drain share: the node's
//! [`Core`], built once per process by [`crate::lifecycle::run`] and lent to every session.
//!
//! Plain data: it holds the node's parts and decides nothing.

use edge::client::EpochFence;
use edge::domain::Inventory;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adapters::AdapterSet;
use crate::options::NodeOptions;
use crate::runs::RunTable;

/// Everything a session and the drain share.
#[derive(Debug)]
pub struct Core {
    /// The node's options.
    pub options: NodeOptions,
    /// The runs.
    pub table: RunTable,
    /// The adapters and what they serve now.
    pub adapters: AdapterSet,
    /// Run tasks and probers.
    pub tasks: TaskTracker,
    /// Cancelled once the node has drained (or failed): the session ends, the node returns.
    pub exit: CancellationToken,
    /// Cancelled when draining starts.
    pub draining: CancellationToken,
    /// This process's instance id, presented on every registration.
    pub instance_id: String,
    /// The highest epoch this process has seen from the edges of its site, shared by every
    /// connection.
    pub fence: EpochFence,
    /// The node's devices as last measured (told at registration, and in a heartbeat when
    /// they changed enough).
    pub inventory: watch::Sender<Inventory>,
}
