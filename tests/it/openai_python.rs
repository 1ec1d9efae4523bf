//! The official `openai` Python package drives a real edge, unchanged: the edge runs
//! in-process on port 0 with two mock nodes, and `tests/python/openai_client.py` (run by the
//! venv of `tests/common/python.rs`) lists models, runs chat completions (whole and
//! streamed), completions, and checks the SDK's exceptions. It asserts everything itself
//! and exits non-zero on the first failure.

use crate::common;
use crate::mock_node;

use std::path::Path;
use std::time::Duration;

use common::python::python;
use common::{TWO_NODES, spawn_app};
use mock_node::{MockNode, MockOptions};

/// How long the script may take (the venv is installed before it starts).
const SCRIPT_PATIENCE: Duration = Duration::from_secs(120);

const API_KEY: &str = "sk-edge-python-test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_client_works_unchanged() {
    // Installing the venv may take a while the first time; keep it off the runtime.
    let python = tokio::task::spawn_blocking(python).await.expect("venv");

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

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/openai_client.py");
    let base_url = format!("http://{}/v1", app.http_addr);
    let run = tokio::process::Command::new(&python)
        .arg(&script)
        .arg(&base_url)
        .arg(API_KEY)
        // The SDK must talk to the edge only: no proxies, no ambient OpenAI settings.
        .env_remove("OPENAI_BASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env("NO_PROXY", "*")
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(SCRIPT_PATIENCE, run)
        .await
        .expect("the script finished in time")
        .expect("the script ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        script.display(),
        output.status
    );
    assert!(
        stdout.starts_with("ok"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    node_a.kill();
    node_b.kill();
    app.stop().await;
}
