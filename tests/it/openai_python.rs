//! The official `openai` Python package drives a real edge, unchanged: the edge runs
//! in-process on port 0 with two mock nodes, and `tests/python/openai_client.py` (run by the
//! venv of `tests/common/python.rs`) lists models, runs chat completions (whole and
//! streamed), completions, and checks the SDK's exceptions. It asserts everything itself
//! and exits non-zero on the first failure.

use crate::common;
use crate::mock_node;

use common::python::run_client_script;
use common::{TWO_NODES, spawn_app};
use mock_node::{MockNode, MockOptions};

const API_KEY: &str = "sk-edge-python-test";

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_client_works_unchanged() {
    let config = format!(
        "{TWO_NODES}\n[api]\nkeys = [\"{API_KEY}\"]\n[api.models]\n\"gpt-4o-mini\" = \"echo/default\"\n"
    );
    let app = spawn_app(&config).await;
    let node_a = MockNode::start(app.node_addr, MockOptions::new("token-a"))
        .await
        .expect("node-a registers");
    let node_b = MockNode::start(app.node_addr, MockOptions::new("token-b"))
        .await
        .expect("node-b registers");
    app.wait_for_nodes(2).await;

    let base_url = format!("http://{}/v1", app.http_addr);
    run_client_script("openai_client.py", &[&base_url, API_KEY]).await;

    node_a.kill();
    node_b.kill();
    app.stop().await;
}
