//! Background Responses through the official `openai` Python package: a stream read
//! part-way and dropped is resumed by `responses.retrieve(id, stream=True,
//! starting_after=N)`, retrieved whole, and cancelled (`tests/python/responses_background.py`
//! asserts it all and exits non-zero on the first failure). The edge runs in-process on
//! port 0 with its journal and a mock node over real TCP.

use edge::ports::NodeCommand;

use crate::api_support::Edge;
use crate::common::python::run_client_script;

const API_KEY: &str = "sk-edge-background-test";

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_background_stream_resumes_where_it_stopped() {
    let edge = Edge::start(&format!("[api]\nkeys = [\"{API_KEY}\"]\n")).await;
    let base_url = format!("http://{}", edge.app.http_addr);
    run_client_script("responses_background.py", &[&base_url, API_KEY]).await;
    // The dropped streams cancelled nothing: the one cancel is the caller's.
    let reasons: Vec<String> = edge
        .node
        .commands()
        .into_iter()
        .filter_map(|command| match command {
            NodeCommand::Cancel { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, ["cancelled by its caller"]);
    edge.stop().await;
}
