//! The seams between the edge's core and the technology around it.
//!
//! Each trait speaks only domain types. Outbound ports (`NodeStore`, `Registry`,
//! `EventSink`, `NodeTransport`, `RunJournal`, and a site member's `SiteStream` and
//! `JournalCache`) are implemented by adapters in `crate::adapters` and called by the
//! application in `crate::app`; inbound ports (`Runs`, `Manage`, `NodeEventHandler`,
//! `TakeOver`) are implemented by the application and called by the adapters that take
//! requests and events in (the HTTP APIs, the management API, the node transport, the
//! cluster lease). Tests substitute mockall mocks or fakes.

pub mod clock;
pub mod event_sink;
pub mod journal;
pub mod management;
pub mod models;
pub mod node_store;
mod noop_journal;
pub mod readiness;
pub mod registry;
pub mod runs;
pub mod site;
pub mod takeover;
pub mod transport;

/// The tracing target of spans that exist only to be exported (the API request, the
/// dispatch of a run to a node), shared by the adapters and the run service that open them
/// and the telemetry that exports them. The log output never shows them; without an
/// exporter no layer wants them, and they are never built.
pub const EXPORT_TARGET: &str = "edge::otel";

pub use event_sink::EventSink;
pub use journal::{
    JournalEntry, JournalError, JournalStats, RelayedEvent, RunJournal, StoredEvent,
};
pub use management::{
    ConnectedNodeView, FeedEvent, FeedItem, FeedStream, Manage, ManageError, NodeStatus,
};
pub use models::{
    FeedAction, ManageModels, ModelCommandError, ModelDemand, ModelEvent, ModelOnNode, ModelView,
    NoModels, WaitingRuns,
};
pub use node_store::NodeStore;
pub use noop_journal::NoopJournal;
pub use readiness::Readiness;
pub use registry::{AlreadyConnected, ConnectedNode, LastFrame, NewConnection, Registry};
pub use runs::{Placed, RunHandle, Runs, StartError, waiting_for};
pub use site::{ActiveMember, Role, SiteRole};
pub use takeover::{
    ClaimError, JournalCache, RebuildError, SiteRuns, SiteStream, TakeOver, TakeOverError,
};
pub use transport::{
    CloseReason, ConnectionId, LinkError, ModelCommand, ModelOutcome, NodeCommand,
    NodeEventHandler, NodeLink, NodeTransport, ReportedEvent, RunAssignment, TransportError,
};
