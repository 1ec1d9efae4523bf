//! What every NATS client of the edge shares: how `[events.nats]` and `[cluster]` say where
//! the servers are and how to authenticate (`config.rs`: [`NatsConnection`], [`Secret`],
//! [`NatsTlsConfig`]), and the client options built from it (`connect.rs`: credentials,
//! TLS, background reconnection with backoff).
//!
//! It connects nothing by itself and keeps no state: the NATS sink and the cluster lease
//! each start their own client from these options. Secrets go to the client only; nothing
//! here logs them.

pub mod config;
pub(crate) mod connect;

pub use config::{NatsConnection, NatsTlsConfig, Secret};
