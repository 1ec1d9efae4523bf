//! Where a run meets its node in an exported trace: while span export is on, the run
//! service keeps each connected node's `connection` span, and a run's dispatch becomes a
//! short `dispatch{node, connection}` span under the run's span, linked to that
//! connection span (which is a trace of its own: it lasts as long as the connection). So a
//! trace reads client → API request → run → dispatch, and the link leads to the node's
//! connection.
//!
//! With export off, `dispatch` is disabled at its call site and nothing is kept: the cost
//! is one cached interest check per registration and per dispatch.

use std::collections::HashMap;
use std::sync::Mutex;

use tracing::{Level, Span, info_span};

use super::route::Placement;
use super::run::{Run, lock};
use crate::domain::NodeId;
use crate::ports::ConnectionId;
use crate::ports::EXPORT_TARGET;

/// The `connection` span of each connected node, kept only while span export is on.
#[derive(Default)]
pub(super) struct NodeSpans {
    spans: Mutex<HashMap<NodeId, (ConnectionId, Span)>>,
}

impl NodeSpans {
    /// Keeps the current span — the node's `connection` span: the transport calls
    /// `node_connected` inside it — when export is on; `connection` looks up the node's
    /// connection (only then).
    pub(super) fn connected(
        &self,
        node: &NodeId,
        connection: impl FnOnce() -> Option<ConnectionId>,
    ) {
        if !tracing::enabled!(target: EXPORT_TARGET, Level::INFO) {
            return;
        }
        let (Some(connection), current) = (connection(), Span::current()) else {
            return;
        };
        if !current.is_disabled() {
            lock(&self.spans).insert(node.clone(), (connection, current));
        }
    }

    /// Forgets the span of `node`'s `connection` (a newer connection's stays).
    pub(super) fn disconnected(&self, node: &NodeId, connection: ConnectionId) {
        let mut spans = lock(&self.spans);
        if spans.get(node).is_some_and(|(held, _)| *held == connection) {
            spans.remove(node);
        }
    }

    /// Records `run`'s dispatch: a `dispatch` span under the run's, linked to the node's
    /// connection span.
    pub(super) fn dispatched(&self, run: &Run) {
        let span = info_span!(
            target: EXPORT_TARGET,
            parent: run.span(),
            "dispatch",
            node = tracing::field::Empty,
            connection = tracing::field::Empty,
        );
        if span.is_disabled() {
            return;
        }
        let (node, connection) = match run.route().placement() {
            Placement::Dispatched { node, connection } => (node.clone(), *connection),
            _ => return,
        };
        span.record("node", tracing::field::display(&node));
        span.record("connection", connection);
        if let Some((held, node_span)) = lock(&self.spans).get(&node)
            && *held == connection
        {
            span.follows_from(node_span);
        }
    }
}
