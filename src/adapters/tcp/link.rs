//! The outbound side of a node connection, and the `NodeTransport` built on it.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::domain::NodeId;
use crate::ports::{LinkError, NodeCommand, NodeLink, NodeTransport, Registry, TransportError};

/// Queues commands for one connection's task.
///
/// The queue is bounded (`server.outbound_queue`). A node whose queue is full is not reading
/// what the edge sends: the command is refused and the connection is closed as a slow
/// consumer, which ends its runs with `node_disconnected` instead of buffering without bound.
pub(super) struct ConnectionLink {
    commands: mpsc::Sender<NodeCommand>,
    signals: LinkSignals,
}

/// Why the link wants its connection closed, watched by the connection's task.
#[derive(Clone, Default)]
pub(super) struct LinkSignals {
    /// Cancelled when the node stops reading what the edge sends.
    pub(super) slow_consumer: CancellationToken,
    /// Cancelled when a newer connection of the node took over.
    pub(super) superseded: CancellationToken,
}

impl ConnectionLink {
    /// A link, the receiving end its connection task drains, and the signals it watches.
    pub(super) fn new(capacity: usize) -> (Self, mpsc::Receiver<NodeCommand>, LinkSignals) {
        let (commands, receiver) = mpsc::channel(capacity.max(1));
        let signals = LinkSignals::default();
        let link = Self {
            commands,
            signals: signals.clone(),
        };
        (link, receiver, signals)
    }
}

impl NodeLink for ConnectionLink {
    fn send(&self, command: NodeCommand) -> Result<(), LinkError> {
        match self.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.signals.slow_consumer.cancel();
                Err(LinkError::Full)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(LinkError::Closed),
        }
    }

    fn supersede(&self) {
        self.signals.superseded.cancel();
    }
}

/// Sends commands to connected nodes through the links their connections left in the
/// registry.
#[derive(Clone)]
pub struct TcpTransport {
    registry: Arc<dyn Registry>,
}

impl TcpTransport {
    /// A transport over the links in `registry`.
    pub fn new(registry: Arc<dyn Registry>) -> Self {
        Self { registry }
    }
}

impl NodeTransport for TcpTransport {
    fn send(&self, node: &NodeId, command: NodeCommand) -> Result<(), TransportError> {
        let link = self
            .registry
            .link(node)
            .ok_or_else(|| TransportError::NotConnected(node.clone()))?;
        link.send(command).map_err(|error| TransportError::Link {
            node: node.clone(),
            error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::RunId;

    fn cancel() -> NodeCommand {
        NodeCommand::Cancel {
            run_id: RunId::new("r"),
            reason: "test".into(),
        }
    }

    #[test]
    fn a_full_queue_marks_the_node_a_slow_consumer() {
        let (link, mut receiver, signals) = ConnectionLink::new(1);
        assert_eq!(link.send(cancel()), Ok(()));
        assert!(!signals.slow_consumer.is_cancelled());
        assert_eq!(link.send(cancel()), Err(LinkError::Full));
        assert!(signals.slow_consumer.is_cancelled());
        assert!(!signals.superseded.is_cancelled());
        link.supersede();
        assert!(signals.superseded.is_cancelled());
        assert_eq!(receiver.try_recv().ok(), Some(cancel()));
        receiver.close();
        assert_eq!(link.send(cancel()), Err(LinkError::Closed));
    }
}
