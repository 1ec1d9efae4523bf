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
    slow_consumer: CancellationToken,
}

impl ConnectionLink {
    /// A link and the receiving end its connection task drains.
    pub(super) fn new(capacity: usize) -> (Self, mpsc::Receiver<NodeCommand>, CancellationToken) {
        let (commands, receiver) = mpsc::channel(capacity.max(1));
        let slow_consumer = CancellationToken::new();
        (
            Self {
                commands,
                slow_consumer: slow_consumer.clone(),
            },
            receiver,
            slow_consumer,
        )
    }
}

impl NodeLink for ConnectionLink {
    fn send(&self, command: NodeCommand) -> Result<(), LinkError> {
        match self.commands.try_send(command) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.slow_consumer.cancel();
                Err(LinkError::Full)
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(LinkError::Closed),
        }
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
        let (link, mut receiver, slow) = ConnectionLink::new(1);
        assert_eq!(link.send(cancel()), Ok(()));
        assert!(!slow.is_cancelled());
        assert_eq!(link.send(cancel()), Err(LinkError::Full));
        assert!(slow.is_cancelled());
        assert_eq!(receiver.try_recv().ok(), Some(cancel()));
        receiver.close();
        assert_eq!(link.send(cancel()), Err(LinkError::Closed));
    }
}
