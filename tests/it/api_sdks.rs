//! The official `openai` and `anthropic` Python packages drive a real edge, unchanged: the
//! edge runs in-process on port 0 with a mock node over real TCP whose targets are named
//! after its scripted behaviours, and `tests/python/sdk_clients.py` (run by the venv of
//! `tests/common/python.rs`) calls embeddings, Responses, chat with tools and reasoning,
//! and Anthropic Messages, and checks both SDKs' exception types. It asserts everything
//! itself and exits non-zero on the first failure.

use crate::api_support;
use crate::common;

use api_support::Edge;
use common::python::run_client_script;

const API_KEY: &str = "sk-edge-sdk-test";

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_and_anthropic_sdks_work_unchanged() {
    let edge = Edge::start(&format!("[api]\nkeys = [\"{API_KEY}\"]\n")).await;
    let base_url = format!("http://{}", edge.app.http_addr);
    run_client_script("sdk_clients.py", &[&base_url, API_KEY]).await;
    edge.stop().await;
}
