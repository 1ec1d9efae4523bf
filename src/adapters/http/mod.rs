//! The HTTP server in front of the edge: its listener, connection loop, limits and TLS,
//! and the operations endpoints (`/metrics`, `/healthz`, `/readyz`), served with axum. The
//! client APIs (`crate::adapters::api`) hand it their routes ([`LimitedRoutes`]); it
//! imports nothing of theirs. The management
//! API (`crate::adapters::admin`) reuses its connection loop and TLS on its own listener.
//!
//! The APIs never reach a node except through the run service, which speaks the node
//! protocol; this adapter only carries HTTP.

mod config;
mod health;
mod limits;
mod poll_again;
pub(crate) mod serve;
mod server;
pub(crate) mod tls;
mod trace;

pub use config::HttpConfig;
pub use health::OpsState;
pub use server::{HttpServer, LimitedRoutes};
