//! Span export over OTLP/HTTP, received by a collector stand-in in the test that decodes
//! each export with the official protobuf definitions (`opentelemetry-proto`): a streamed
//! API request that carries a client's `traceparent` yields one trace from the client's
//! span through the API request and the run to the dispatch, linked to the node's
//! connection span.
//!
//! The export layer is installed as the test thread's default subscriber (never the
//! process's), in a process of its own (the test binary re-run with only this test), and
//! the edge, its node and the client run on a current-thread runtime on that thread, so
//! every span lands in it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use edge::domain::EdgeId;
use edge::telemetry::{self, TracingConfig};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt as _;

use crate::api_support::{Edge, read_events};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP receiver on a thread and runtime of its own (the exporter posts to it from
/// the SDK's thread while the test's runtime waits), keeping every span it was sent.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(Arc::clone(&spans));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("receiver runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                axum::serve(listener, router)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("receiver serves");
            });
        });
        Self {
            addr,
            spans,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.spans.lock().expect("spans").clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One OTLP export: decoded with the official definitions, its spans kept.
async fn receive(State(spans): State<Arc<Mutex<Vec<Span>>>>, body: Bytes) -> Vec<u8> {
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace export");
    let mut kept = spans.lock().expect("spans");
    for resource in request.resource_spans {
        for scope in resource.scope_spans {
            kept.extend(scope.spans);
        }
    }
    ExportTraceServiceResponse::default().encode_to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The string value of attribute `key` of `span`.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(|value| match value {
            AnyValue::StringValue(s) => s.clone(),
            AnyValue::IntValue(i) => i.to_string(),
            other => format!("{other:?}"),
        })
}

fn find<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    spans
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} span in {:#?}", names(spans)))
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// Set in the process [`a_streamed_api_request_is_one_trace_from_the_clients_traceparent_to_the_node`]
/// runs its body in.
const ALONE: &str = "EDGE_TEST_OTLP_ALONE";

/// Runs in a process of its own (this test binary, re-run with only this test): its
/// subscriber is a thread-local default, and tracing caches each callsite's interest
/// process-wide, so a callsite another test's thread registers while this one installs its
/// subscriber can stay disabled for it and lose a span.
#[crate::common::test]
fn a_streamed_api_request_is_one_trace_from_the_clients_traceparent_to_the_node() {
    if std::env::var_os(ALONE).is_none() {
        let name =
            "otlp::a_streamed_api_request_is_one_trace_from_the_clients_traceparent_to_the_node";
        let output = std::process::Command::new(std::env::current_exe().expect("this test binary"))
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .expect("run the test alone");
        assert!(
            output.status.success() && String::from_utf8_lossy(&output.stdout).contains("1 passed"),
            "the test alone failed:\n{}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    let receiver = Receiver::start();
    let endpoint = format!("http://{}", receiver.addr);
    let config = TracingConfig {
        otlp_endpoint: Some(endpoint.clone()),
        ..TracingConfig::default()
    };
    let edge_id = EdgeId::parse("site-t").expect("edge id");
    let (layer, exporter) = telemetry::export_layer(&config, &edge_id)
        .expect("exporter")
        .expect("export is on");
    let _default = tracing::subscriber::set_default(tracing_subscriber::registry().with(layer));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let edge = Edge::start(&format!("[tracing]\notlp_endpoint = {endpoint:?}\n")).await;
        let body = json!({"model": "echo/default", "stream": true,
            "messages": [{"role": "user", "content": "one two three"}]});
        let response = edge
            .post("/v1/chat/completions", &body)
            .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
            .send()
            .await
            .expect("a response");
        assert!(response.status().is_success());
        assert!(!read_events(response).await.is_empty());
        // Stopping closes the node's connection, which ends its span.
        edge.stop().await;
    });
    // Tasks still parked on the runtime (timers the stop cancelled but that have not run
    // since) hold the run service, and with it the ended runs' spans: dropping the runtime
    // drops them, so every span has ended before the export is flushed.
    drop(runtime);
    exporter.flush();
    let spans = receiver.spans();
    assert_all_kinds(&spans);

    let api = find(&spans, "POST /v1/chat/completions");
    assert_eq!(
        hex(&api.trace_id),
        CLIENT_TRACE,
        "the client's trace goes on"
    );
    assert_eq!(
        hex(&api.parent_span_id),
        CLIENT_SPAN,
        "under the client's span"
    );
    let run = find(&spans, "run");
    assert_eq!(run.trace_id, api.trace_id);
    assert_eq!(
        run.parent_span_id, api.span_id,
        "the run is the request's child"
    );
    assert_eq!(attribute(run, "adapter").as_deref(), Some("echo"));
    assert_eq!(attribute(run, "node").as_deref(), Some("node-a"));
    let dispatch = find(&spans, "dispatch");
    assert_eq!(dispatch.trace_id, api.trace_id);
    assert_eq!(
        dispatch.parent_span_id, run.span_id,
        "dispatch is the run's child"
    );
    assert_eq!(attribute(dispatch, "node").as_deref(), Some("node-a"));
    let connection = spans
        .iter()
        .find(|s| s.name == "connection" && attribute(s, "node").as_deref() == Some("node-a"))
        .unwrap_or_else(|| panic!("no connection span of node-a in {:?}", names(&spans)));
    let link = dispatch
        .links
        .first()
        .expect("dispatch links the node's connection");
    assert_eq!(
        (&link.trace_id, &link.span_id),
        (&connection.trace_id, &connection.span_id)
    );
}

/// Fails, naming the spans received, unless each of the four kinds is among them.
fn assert_all_kinds(spans: &[Span]) {
    let wanted = ["POST /v1/chat/completions", "run", "dispatch", "connection"];
    let missing: Vec<&str> = wanted
        .into_iter()
        .filter(|name| !spans.iter().any(|s| s.name == *name))
        .collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?} among {:?}",
        names(spans)
    );
}
