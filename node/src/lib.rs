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
//! Layered top-down; a module imports only from the layers below it (none imports back up,
//! which `tests/it/layout.rs` checks):
//!
//! - [`lifecycle`]: dial, register, reconnect, drain; [`session`]: one connection's reader
//!   and writer; [`shared`]: the [`shared::Core`] they share; [`site`]: which member of the
//!   edge's site to dial next; [`options`]: the node's own settings.
//! - [`dispatch`]: admit or refuse a run and drive it; [`model_commands`]: carry out the
//!   edge's load and unload commands; [`runs`]: the run table, flow control and resume
//!   claims, over [`buffer`]: its events and bounds.
//! - [`adapters`]: the configured adapters, each with its prober and budget ([`budget`]:
//!   what each may use for models, checked against the node's devices); [`probe`]: the
//!   engine prober.
//! - [`openai`]: the adapter, with its managed engines' model lifecycle
//!   ([`openai::engine_models`]: their catalogues and their load and unload verbs).
//! - [`board`]: the availability board the probers report to; [`engine_health`]: an
//!   engine's up and down, logged; [`upstream`]: the engine's HTTP client; [`fault`]: what
//!   goes wrong talking to it; [`sse`]: the event-stream decoder; [`inventory`]: the
//!   node's devices (NVML's GPUs, or the machine's memory); [`gguf`]: a GGUF model's
//!   memory once loaded, from its header.

pub mod adapters;
pub mod board;
pub mod budget;
pub mod buffer;
pub mod dispatch;
pub mod engine_health;
pub mod fault;
pub mod gguf;
pub mod inventory;
pub mod lifecycle;
pub mod model_commands;
pub mod openai;
pub mod options;
pub mod probe;
pub mod runs;
pub mod session;
pub mod shared;
pub mod site;
pub mod sse;
pub mod upstream;

pub use lifecycle::run;
pub use options::{NodeOptions, TlsOptions};
pub use runs::BufferLimits;
