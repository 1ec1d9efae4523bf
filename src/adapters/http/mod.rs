//! The HTTP server in front of the edge: operations endpoints (`/metrics`, `/healthz`,
//! `/readyz`) and the OpenAI-compatible API, served with axum.
//!
//! The API never reaches a node except through the run service, which speaks the node
//! protocol; this adapter only translates HTTP to runs and run events to HTTP.

pub mod admin;
mod config;
mod health;
mod limits;
pub mod openai;
mod serve;
mod server;
mod tls;
mod trace;

pub use config::HttpConfig;
pub use openai::{Api, ApiConfig};
pub use server::{HttpServer, HttpState};
