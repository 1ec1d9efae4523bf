//! A node written to the v1 baseline keeps working against the current edge.
//!
//! The messages below are the v1 baseline of `../shared/protocol.md`, written out by hand
//! with prost's derive (not generated from `proto/`, which has grown since): a node that
//! knows only these fields registers, heartbeats, takes a run, streams its events and is
//! cancelled, exactly as the baseline describes. Everything the edge sends it must decode
//! as v1, and the frames a v1 node cares about carry no field it does not know.

use crate::common;

use bytes::{Buf, BytesMut};
use common::spawn_app;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The v1 baseline schema, field for field.
mod v1 {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeMessage {
        #[prost(oneof = "node_message::Body", tags = "1, 2, 3")]
        pub body: Option<node_message::Body>,
    }
    pub mod node_message {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Body {
            #[prost(message, tag = "1")]
            Register(super::RegisterRequest),
            #[prost(message, tag = "2")]
            Heartbeat(super::Heartbeat),
            #[prost(message, tag = "3")]
            RunEvent(super::RunEvent),
        }
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EdgeMessage {
        #[prost(oneof = "edge_message::Body", tags = "1, 2, 3, 4")]
        pub body: Option<edge_message::Body>,
    }
    pub mod edge_message {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Body {
            #[prost(message, tag = "1")]
            Register(super::RegisterResponse),
            #[prost(message, tag = "2")]
            Run(super::RunRequest),
            #[prost(message, tag = "3")]
            Cancel(super::CancelRun),
            #[prost(message, tag = "4")]
            Shutdown(super::Shutdown),
        }
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegisterRequest {
        #[prost(string, tag = "1")]
        pub token: String,
        #[prost(string, tag = "2")]
        pub node_id: String,
        #[prost(string, tag = "3")]
        pub node_version: String,
        #[prost(uint32, tag = "4")]
        pub protocol_version: u32,
        #[prost(string, repeated, tag = "5")]
        pub adapters: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RegisterResponse {
        #[prost(bool, tag = "1")]
        pub accepted: bool,
        #[prost(int32, tag = "2")]
        pub error: i32,
        #[prost(string, tag = "3")]
        pub message: String,
        #[prost(string, tag = "4")]
        pub node_id: String,
        #[prost(string, tag = "5")]
        pub alias: String,
        #[prost(message, optional, tag = "6")]
        pub config: Option<NodeConfigPayload>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeConfigPayload {
        #[prost(message, repeated, tag = "1")]
        pub adapters: Vec<AdapterConfig>,
        #[prost(message, optional, tag = "2")]
        pub runtime: Option<RuntimeConfig>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AdapterConfig {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, repeated, tag = "2")]
        pub targets: Vec<String>,
        #[prost(map = "string, string", tag = "3")]
        pub settings: std::collections::HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RuntimeConfig {
        #[prost(uint32, tag = "1")]
        pub max_concurrent_runs: u32,
        #[prost(uint32, tag = "2")]
        pub heartbeat_interval_ms: u32,
        #[prost(map = "string, string", tag = "3")]
        pub settings: std::collections::HashMap<String, String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Heartbeat {
        #[prost(uint32, tag = "1")]
        pub active_runs: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunRequest {
        #[prost(string, tag = "1")]
        pub run_id: String,
        #[prost(string, tag = "2")]
        pub adapter: String,
        #[prost(string, tag = "3")]
        pub target: String,
        #[prost(bytes = "vec", tag = "4")]
        pub input: Vec<u8>,
        #[prost(string, tag = "5")]
        pub content_type: String,
        #[prost(map = "string, string", tag = "6")]
        pub params: std::collections::HashMap<String, String>,
        #[prost(uint32, tag = "7")]
        pub deadline_ms: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct CancelRun {
        #[prost(string, tag = "1")]
        pub run_id: String,
        #[prost(string, tag = "2")]
        pub reason: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Shutdown {
        #[prost(string, tag = "1")]
        pub reason: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunEvent {
        #[prost(string, tag = "1")]
        pub run_id: String,
        #[prost(uint64, tag = "2")]
        pub seq: u64,
        #[prost(oneof = "run_event::Kind", tags = "3, 4, 5, 6, 7")]
        pub kind: Option<run_event::Kind>,
    }
    pub mod run_event {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Kind {
            #[prost(message, tag = "3")]
            Started(super::RunStarted),
            #[prost(message, tag = "4")]
            Output(super::RunOutput),
            #[prost(message, tag = "5")]
            Completed(super::RunCompleted),
            #[prost(message, tag = "6")]
            Failed(super::RunFailed),
            #[prost(message, tag = "7")]
            Cancelled(super::RunCancelled),
        }
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunStarted {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunOutput {
        #[prost(string, tag = "1")]
        pub text: String,
        #[prost(bytes = "vec", tag = "2")]
        pub data: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunCompleted {
        #[prost(string, tag = "1")]
        pub finish_reason: String,
        #[prost(message, optional, tag = "2")]
        pub usage: Option<Usage>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Usage {
        #[prost(uint32, tag = "1")]
        pub input_tokens: u32,
        #[prost(uint32, tag = "2")]
        pub output_tokens: u32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunFailed {
        #[prost(string, tag = "1")]
        pub code: String,
        #[prost(string, tag = "2")]
        pub message: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct RunCancelled {
        #[prost(string, tag = "1")]
        pub reason: String,
    }
}

use v1::edge_message::Body as EdgeBody;
use v1::node_message::Body as NodeBody;
use v1::run_event::Kind;

const CONFIG: &str = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "token-a"
[nodes.runtime]
max_concurrent_runs = 2
heartbeat_interval_ms = 1000
[[nodes.adapters]]
name = "echo"
targets = ["default"]
"#;

/// A node that speaks only the v1 baseline, byte for byte.
struct V1Node {
    stream: TcpStream,
    buffer: BytesMut,
}

impl V1Node {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buffer: BytesMut::new(),
        }
    }

    async fn send(&mut self, body: NodeBody) {
        let bytes = v1::NodeMessage { body: Some(body) }.encode_length_delimited_to_vec();
        self.stream.write_all(&bytes).await.expect("write");
    }

    /// The next message from the edge, and whether v1 understood every byte of it (its v1
    /// re-encoding is exactly as long as the frame).
    async fn next(&mut self) -> (v1::EdgeMessage, bool) {
        loop {
            let mut peek = &self.buffer[..];
            if let Ok(len) = prost::encoding::decode_varint(&mut peek) {
                let prefix = self.buffer.len() - peek.len();
                let len = usize::try_from(len).expect("length");
                if peek.len() >= len {
                    self.buffer.advance(prefix);
                    let frame = self.buffer.split_to(len);
                    let message = v1::EdgeMessage::decode(&frame[..]).expect("v1 decodes it");
                    let understood = message.encoded_len() == frame.len();
                    return (message, understood);
                }
            }
            let read =
                tokio::time::timeout(common::PATIENCE, self.stream.read_buf(&mut self.buffer))
                    .await
                    .expect("the edge answers in time")
                    .expect("read");
            assert!(read > 0, "the edge closed the connection");
        }
    }

    async fn event(&mut self, run_id: &str, seq: u64, kind: Kind) {
        self.send(NodeBody::RunEvent(v1::RunEvent {
            run_id: run_id.to_owned(),
            seq,
            kind: Some(kind),
        }))
        .await;
    }
}

#[crate::common::test]
async fn a_v1_node_registers_runs_and_is_cancelled() {
    let app = spawn_app(CONFIG).await;
    let mut node = V1Node::connect(app.node_addr).await;
    node.send(NodeBody::Register(v1::RegisterRequest {
        token: "token-a".into(),
        node_id: String::new(),
        node_version: "v1-baseline".into(),
        protocol_version: 1,
        adapters: vec!["echo".into()],
    }))
    .await;
    let (answer, understood) = node.next().await;
    let Some(EdgeBody::Register(response)) = answer.body else {
        panic!("expected a register response, got {answer:?}");
    };
    assert!(response.accepted, "{response:?}");
    assert!(
        understood,
        "the register response carries fields v1 does not know"
    );
    assert_eq!(response.node_id, "node-a");
    let runtime = response.config.and_then(|c| c.runtime).expect("runtime");
    assert_eq!(runtime.max_concurrent_runs, 2);
    node.send(NodeBody::Heartbeat(v1::Heartbeat { active_runs: 0 }))
        .await;
    app.wait_for_nodes(1).await;

    // A console-style run: v1 reads all of it.
    let spec = edge::domain::RunSpec {
        selector: edge::domain::NodeSelector {
            adapter: edge::domain::AdapterName::parse("echo").expect("adapter"),
            target: edge::domain::Target::parse("default").expect("target"),
            pin: None,
        },
        input: bytes::Bytes::from_static(b"hello there"),
        content_type: "text/plain; charset=utf-8".into(),
        params: Default::default(),
        deadline: None,
        operation: edge::domain::Operation::Unspecified,
        routing: Default::default(),
    };
    let mut handle = app.parts.runs.start(spec.clone()).expect("accepted");
    let (message, understood) = node.next().await;
    let Some(EdgeBody::Run(run)) = message.body else {
        panic!("expected a run, got {message:?}");
    };
    assert!(understood, "a console run carries fields v1 does not know");
    assert_eq!(
        (run.adapter.as_str(), run.target.as_str()),
        ("echo", "default")
    );
    assert_eq!(run.input, b"hello there");
    node.event(&run.run_id, 1, Kind::Started(v1::RunStarted {}))
        .await;
    node.event(
        &run.run_id,
        2,
        Kind::Output(v1::RunOutput {
            text: "hello".into(),
            data: Vec::new(),
        }),
    )
    .await;
    node.event(
        &run.run_id,
        3,
        Kind::Completed(v1::RunCompleted {
            finish_reason: "stop".into(),
            usage: Some(v1::Usage {
                input_tokens: 2,
                output_tokens: 1,
            }),
        }),
    )
    .await;
    let mut kinds = Vec::new();
    loop {
        let what = format!("the console run's events (got {kinds:?})");
        let Some(event) = common::bounded(what, handle.events.recv()).await else {
            break;
        };
        kinds.push(event.kind.clone());
    }
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert_eq!(kinds[1], edge::domain::RunEventKind::text("hello"));
    assert_eq!(
        kinds[2],
        edge::domain::RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(edge::domain::Usage::new(2, 1)),
        }
    );

    // A cancelled run: the v1 node gets CancelRun and answers it.
    let handle = app.parts.runs.start(spec).expect("accepted");
    let (message, _) = node.next().await;
    let Some(EdgeBody::Run(run)) = message.body else {
        panic!("expected a run, got {message:?}");
    };
    assert!(app.parts.runs.cancel(&handle.run_id, "test").await);
    let (message, understood) = node.next().await;
    let Some(EdgeBody::Cancel(cancel)) = message.body else {
        panic!("expected a cancel, got {message:?}");
    };
    assert!(understood);
    assert_eq!(cancel.run_id, run.run_id);
    node.event(
        &run.run_id,
        1,
        Kind::Cancelled(v1::RunCancelled {
            reason: "asked".into(),
        }),
    )
    .await;
    let mut events = handle.events;
    let mut last = None;
    loop {
        let what = format!("the cancelled run's events (last {last:?})");
        let Some(event) = common::bounded(what, events.recv()).await else {
            break;
        };
        last = Some(event.kind.clone());
    }
    assert!(matches!(
        last,
        Some(edge::domain::RunEventKind::Cancelled { .. })
    ));

    // Heartbeats keep it registered; a graceful stop reaches it as a v1 Shutdown.
    node.send(NodeBody::Heartbeat(v1::Heartbeat { active_runs: 0 }))
        .await;
    app.assert_settled().await;
    let stopping = tokio::spawn(app.stop());
    let (message, understood) = node.next().await;
    assert!(
        matches!(message.body, Some(EdgeBody::Shutdown(_))),
        "expected a shutdown, got {message:?}"
    );
    assert!(understood);
    common::bounded("the edge to stop", stopping)
        .await
        .expect("stopped");
}

/// A member of a site (v1.5) to a v1 node: a standby's refusal is the `SHUTTING_DOWN` it
/// already retries (the active member's address is a field it skips), and once the member
/// acts it registers and takes runs whose epoch it skips too.
#[crate::common::test]
async fn a_v1_node_is_refused_by_a_standby_and_gets_in_once_it_acts() {
    use edge::ports::{ActiveMember, Role};

    let app = spawn_app(CONFIG).await;
    app.parts.site.set(Role::Standby {
        active: Some(ActiveMember {
            edge_id: "edge-b".into(),
            node_address: "10.0.0.2:7100".into(),
            api_address: "10.0.0.2:8080".into(),
        }),
        reason: "edge-b holds the lease".into(),
    });
    let register = || {
        NodeBody::Register(v1::RegisterRequest {
            token: "token-a".into(),
            node_id: String::new(),
            node_version: "v1-baseline".into(),
            protocol_version: 1,
            adapters: vec!["echo".into()],
        })
    };
    let mut node = V1Node::connect(app.node_addr).await;
    node.send(register()).await;
    let (answer, _) = node.next().await;
    let Some(EdgeBody::Register(refused)) = answer.body else {
        panic!("expected a register response, got {answer:?}");
    };
    assert!(!refused.accepted);
    assert_eq!(refused.error, 5, "SHUTTING_DOWN: {refused:?}");

    app.parts.site.set(Role::Active { epoch: 4 });
    let mut node = V1Node::connect(app.node_addr).await;
    node.send(register()).await;
    let (answer, _) = node.next().await;
    let Some(EdgeBody::Register(accepted)) = answer.body else {
        panic!("expected a register response, got {answer:?}");
    };
    assert!(accepted.accepted, "{accepted:?}");
    app.wait_for_nodes(1).await;
    let spec = crate::common::runs::echo_to("default", "hello");
    let _handle = app.parts.runs.start(spec).expect("accepted");
    let (message, _) = node.next().await;
    let Some(EdgeBody::Run(run)) = message.body else {
        panic!("expected a run, got {message:?}");
    };
    assert_eq!(run.input, b"hello");
}
