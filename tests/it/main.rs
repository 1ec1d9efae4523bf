//! The integration tests: one binary, so a 2-core machine links the project once for all
//! of them instead of once per test file. Each module is one former test crate; `common`
//! (in `tests/common/`) is the shared harness, `mock_node` the mock node the tests drive
//! (the `edge-mock-node` crate) and `node` the reference node (`edge-node`), and the fuzz
//! targets' bodies are declared here for `fuzz_corpus` to replay.
//!
//! Every test is marked `#[crate::common::test]` (not `#[tokio::test]` or `#[test]`): it
//! runs under a deadline of its own and fails naming itself instead of hanging the suite
//! (`tests/common/deadline.rs`, decision 40).
//!
//! Every test here shares the process: none may set process-global state (environment
//! variables, the global tracing subscriber, the working directory) or assert on the
//! process as a whole (resident memory, thread count); such a test belongs in a binary of
//! its own.
//!
//! The size rule (`clippy::too_many_lines`, decision 18) is for production code: a test
//! here is one scenario read top to bottom — set up, act, assert — and splitting it would
//! scatter the story it tells, so the whole binary is exempt.
#![allow(
    clippy::too_many_lines,
    reason = "a test is one scenario read top to bottom; the size rule is for production code"
)]

#[path = "../common/mod.rs"]
mod common;
// The mock node and the reference node (crates of the workspace, dev-dependencies here),
// under the names the tests use; the reference node is driven in process by `node_*`.
use edge_mock_node as mock_node;
use edge_node as node;

// The fuzz targets, compiled unchanged from `fuzz/targets/` (they name each other from the
// crate root, as `crate::recording`), for `fuzz_corpus`.
#[path = "../../fuzz/targets/config_loader.rs"]
mod config_loader;
#[path = "../../fuzz/targets/frame_decoder.rs"]
mod frame_decoder;
#[path = "../../fuzz/targets/recording.rs"]
mod recording;
#[path = "../../fuzz/targets/register_handshake.rs"]
mod register_handshake;
#[path = "../../fuzz/targets/resume_claims.rs"]
mod resume_claims;
#[path = "../../fuzz/targets/run_state_machine.rs"]
mod run_state_machine;

mod admin_support;
mod api_support;
mod node_support;
mod packaging_support;
mod site_support;

mod admin_api;
mod admin_cli;
mod admin_crash;
mod admin_journal;
mod admin_models;
mod admin_openapi;
mod agents_e2e;
mod api;
mod api_anthropic;
mod api_embeddings;
mod api_responses;
mod api_routes;
mod api_sdks;
mod api_structured;
mod api_tokenize;
mod cli;
mod client_stop;
mod cluster;
mod console;
mod console_web;
mod continuation;
mod continuation_engine;
mod engine_fakes;
mod engine_idle;
mod engines_e2e;
mod engines_smoke;
mod engines_tokens;
mod faults;
mod fuzz_corpus;
mod harness;
mod http_limits;
mod layout;
mod link_faults;
mod link_protocol;
mod loras_engine;
mod loras_vllm;
mod metrics;
mod models;
mod models_engine;
mod models_engines;
mod models_fit;
mod nats;
mod nemesis;
mod node_engine;
mod node_lifecycle;
mod node_link;
mod node_reconnect;
mod openai_python;
mod otlp;
mod packaging;
mod protocol_v1;
mod readme;
mod readopt;
mod readopt_engine;
mod registration;
mod responses_background;
mod resume;
mod routing;
mod runs;
mod site_e2e;
mod site_journal;
mod site_node;
mod site_retention;
mod site_soak;
mod site_transport;
mod soak;
mod stream_resume;
mod tls;
mod usage;
