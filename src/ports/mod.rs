//! The seams between the edge's core and the technology around it.
//!
//! Each trait speaks only domain types. Adapters in `crate::adapters` implement them; the
//! application in `crate::app` depends on them; tests substitute mockall mocks or fakes.

pub mod event_sink;
pub mod journal;
pub mod node_store;
pub mod readiness;
pub mod registry;
pub mod transport;

pub use event_sink::EventSink;
pub use journal::{
    JournalEntry, JournalError, JournalStats, RelayedEvent, RunJournal, StoredEvent,
};
pub use node_store::NodeStore;
pub use readiness::Readiness;
pub use registry::{
    AlreadyConnected, ConnectedNode, ConnectionId, LastFrame, NewConnection, Registry,
};
pub use transport::{
    CloseReason, LinkError, NodeCommand, NodeEventHandler, NodeLink, NodeTransport, ReportedEvent,
    RunAssignment, TransportError,
};
