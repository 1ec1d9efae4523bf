//! The reference node: puts OpenAI-compatible engines (llama.cpp's `llama-server`, vLLM,
//! Ollama, LM Studio, SGLang, TGI) behind an edge.
//!
//! It dials the edge, registers with its token, configures its adapters from the
//! `RegisterResponse`, reports which targets its engines can serve now, runs what the edge
//! sends by forwarding it to the engine, and streams the engine's answer back as run events.
//! It survives the edge going away (reconnect with backoff and full jitter, resume claims)
//! and the engine going away (availability reports, classified failures).
//!
//! Built only on the edge crate's public node client (`edge::client`), its domain value
//! types and the protocol; nothing in the edge imports it. `main.rs` is the `edge-node`
//! binary's CLI; the edge's integration tests take this library as a dev-dependency and run
//! the node in process. Modules:
//!
//! - [`lifecycle`]: dial, register, reconnect, drain; [`session`]: one connection's reader
//!   and writer; [`site`]: which member of the edge's site to dial next; [`options`]: the
//!   node's own settings.
//! - [`dispatch`]: admit or refuse a run and drive it; [`runs`]: the run table, event
//!   buffers, flow control and resume claims.
//! - [`adapters`]: the configured adapters and the availability board; [`probe`]: the
//!   engine prober; [`engine_health`]: its up and down, logged; [`openai`]: the adapter; [`upstream`]: its HTTP client; [`sse`]: the
//!   event-stream decoder.
//! - [`engine_models`]: the model lifecycle of managed adapters: their engines' catalogues
//!   and the edge's load and unload commands.

pub mod adapters;
pub mod buffer;
pub mod dispatch;
pub mod engine_health;
pub mod engine_models;
pub mod lifecycle;
pub mod openai;
pub mod options;
pub mod probe;
pub mod runs;
pub mod session;
pub mod site;
pub mod sse;
pub mod upstream;

pub use lifecycle::run;
pub use options::{NodeOptions, TlsOptions};
pub use runs::BufferLimits;
