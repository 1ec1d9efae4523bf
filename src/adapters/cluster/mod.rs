//! The site's lease over NATS JetStream KV (`[cluster]`): which member of a site is
//! active. `kv.rs` reads and writes the lease in the site's bucket (create if absent,
//! update at a revision); `lease.rs` runs the task that acts on the domain's decisions
//! (`crate::domain::site`) and sets the [`SiteRole`](crate::ports::SiteRole) the HTTP APIs,
//! `/readyz` and the node transport read; `config.rs` is `[cluster]`.
//!
//! `journal_stream.rs` replicates the journal's batches to the site's stream and folds
//! them into a standby's journal, and keeps the stream short with snapshots in the site's
//! object store (`snapshots.rs`); it is the [`SiteStream`](crate::ports::SiteStream) a
//! member's takeover (`crate::app::takeover`) claims before the run service re-adopts the
//! open runs, and the lease runs that takeover ([`TakeOver`](crate::ports::TakeOver)).
//! `replicas.rs` warns when the site's streams hold fewer replicas than the config asks.

pub mod config;
mod journal_stream;
mod kv;
mod lease;
mod replicas;
mod snapshots;

pub use config::{ClusterConfig, advertised};
pub use journal_stream::{JournalStream, JournalStreamTasks, StreamStats};
pub use lease::{ClusterLease, LeaseStats, Member};
