//! The pure core of the edge: validated node definitions, the registration policy,
//! routing, and the run state machine.
//!
//! Nothing here does I/O, reads a clock, spawns a task or knows a protobuf type: callers pass
//! in what a decision needs (the store's answer, the registry's state, `now`) and act on the
//! returned value, so every rule is a plain function tested without a runtime.

pub mod adoption;
pub mod continuation;
pub mod definitions;
pub mod drain;
pub mod event;
pub mod inventory;
pub mod models;
pub mod names;
pub mod node;
pub mod operation;
pub mod output;
pub mod registration;
pub mod resume;
pub mod routing;
pub mod run;
pub mod run_record;
pub mod selection;
pub mod site;
pub mod stats;
pub mod throttle;
pub mod token;
pub mod usage;

pub use continuation::{
    Continuation, ContinuationFacts, ContinuationRefusal, MaxContinuations, may_continue,
};
pub use definitions::{
    AdapterDefinition, DefinitionProblem, DefinitionsError, EntryRef, NodeDefinition,
    validate_definitions,
};
pub use drain::{Drain, NodeState};
pub use event::{EDGE_CRASHED, EdgeFailure, FailureClass, RunEventKind, RunId};
pub use inventory::{Bytes, BytesError, Device, DeviceKind, Inventory, parse_bytes};
pub use names::{AdapterName, Alias, EdgeId, NameError, NodeId, Target};
pub use node::{
    AdapterConfig, AdapterParts, Availability, NodeConfigError, NodeRecord, NodeRecordParts,
    RuntimeConfig, RuntimeParts,
};
pub use operation::{DeclaredOperations, Operation};
pub use output::{Embedding, StructuredOutput, TokenLogprob, ToolCallDelta, TopLogprob};
pub use registration::{
    LiveConnection, PROTOCOL_VERSION, RegisterAttempt, RegisterRejection, RegistrationDecision,
    TakeoverReason, TakeoverRefusal, decide_registration,
};
pub use resume::{ResumeAnswer, ResumeClaim, ResumeRefusal, decide_resume};
pub use run::{EventOrigin, EventVerdict, RunEvent, RunRouting, RunSpec, RunState};
pub use run_record::{
    AcceptedRun, Attempt, RunCursor, RunEnding, RunOutcome, RunPage, RunQuery, RunRecord,
    RunStateFilter, merge_page,
};
pub use selection::NodeSelector;
pub use stats::{FleetStats, StatsPoint, StatsWindow};
pub use throttle::RegistrationThrottle;
pub use token::{DigestError, Token, TokenDigest};
pub use usage::{
    Bucket, GroupBy, GroupByError, Rollup, Usage, UsageCounts, UsageGroup, UsageQuery, UsageRow,
    utc_month,
};
