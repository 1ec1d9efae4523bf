//! The site's lease over NATS JetStream KV (`[cluster]`): which member of a site is
//! active. `kv.rs` reads and writes the lease in the site's bucket (create if absent,
//! update at a revision); `lease.rs` runs the task that acts on the domain's decisions
//! (`crate::domain::site`) and sets the [`SiteRole`](crate::ports::SiteRole) the HTTP APIs,
//! `/readyz` and the node transport read; `config.rs` is `[cluster]`.
//!
//! Nothing here replicates the journal or takes over open runs: this is the lease only.

pub mod config;
mod kv;
mod lease;

pub use config::{ClusterConfig, advertised};
pub use lease::{ClusterLease, LeaseStats, Member};
