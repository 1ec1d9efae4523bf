//! Writes the hand-made seed inputs of every fuzz target into `corpus/<target>/seed-*`.
//!
//! Run from `fuzz/`: `cargo +nightly run --example seed_corpus`. The seeds are valid
//! protocol traffic and config files the fuzzer would take long to find by itself; the
//! fuzzer grows the corpus from them and `cargo fuzz cmin` keeps what adds coverage.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use edge::components::FileNodeStore;
use edge::domain::{
    AdapterDefinition, AdapterName, NodeDefinition, RegisterAttempt, RegisterRejection,
    RunEventKind, RunId, Target, Token, Usage,
};
use edge::ports::{NodeCommand, NodeStore, ReportedEvent, RunAssignment};
use edge::wire::{EdgeCodec, EdgeFrame, NodeCodec, NodeFrame};
use tokio_util::codec::Encoder;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let write = |target: &str, name: &str, data: &[u8]| -> std::io::Result<()> {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("seed-{name}")), data)
    };

    // frame_decoder: [max_lo, max_hi, seed, stream...]
    let node_stream = node_frames(&all_node_frames(""));
    let edge_stream = edge_frames();
    for (name, max, seed, stream) in [
        ("node-frames", 4_096u16, 7u8, node_stream.clone()),
        ("node-frames-small-limit", 16, 1, node_stream.clone()),
        ("edge-frames", 4_096, 3, edge_stream),
        (
            "oversized-prefix",
            16,
            0,
            vec![0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2],
        ),
        (
            "ten-byte-varint",
            u16::MAX,
            9,
            [[0x80u8; 9].as_slice(), &[0x01]].concat(),
        ),
        ("eleven-byte-varint", u16::MAX, 9, vec![0x80; 11]),
        (
            "garbage-frame",
            1_024,
            5,
            vec![0x03, 0xff, 0xff, 0xff, 0x00],
        ),
        (
            "truncated",
            4_096,
            2,
            node_stream[..node_stream.len() - 3].to_vec(),
        ),
    ] {
        let mut data = max.to_le_bytes().to_vec();
        data.push(seed);
        data.extend_from_slice(&stream);
        write("frame_decoder", name, &data)?;
    }

    // register_handshake: [mode, bytes...]; mode 0x41 registers with token-a and starts a run.
    let events = node_frames(&all_node_frames("")[1..]);
    let raw_register = node_frames(&[register("token-a", "")]);
    for (name, mode, tail) in [
        ("register-a-then-events", 0x41u8, events.clone()),
        ("register-b-then-events", 0x4a, events.clone()),
        ("register-a-no-run", 0x01, events.clone()),
        (
            "raw-register",
            0x00,
            [raw_register.as_slice(), &events].concat(),
        ),
        (
            "heartbeat-first",
            0x00,
            node_frames(&[NodeFrame::Heartbeat { active_runs: 0, ping: 0, availability: None, inventory: None }]),
        ),
        ("unknown-token", 0x03, Vec::new()),
        ("mismatched-id", 0x09, Vec::new()),
        ("old-protocol", 0x21, Vec::new()),
        ("second-register", 0x41, raw_register.clone()),
        ("garbage-after-register", 0x41, vec![0x05, 0xff, 0xff]),
        ("silent-before-register", 0x80, Vec::new()),
        (
            "silent-after-register",
            0xc1,
            events[..events.len() / 2].to_vec(),
        ),
    ] {
        let mut data = vec![mode];
        data.extend_from_slice(&tail);
        write("register_handshake", name, &data)?;
    }

    // run_state_machine: [config, ops...]; see the target's `Op::read`.
    for (name, ops) in [
        // connect node-0, start echo/t0, started + output + completed from the holder.
        (
            "complete",
            vec![
                0x00, 0, 0, 2, 0, 0, 4, 0, 1, 0, 4, 0, 2, 1, 4, 0, 3, 3, 7, 1,
            ],
        ),
        // connect node-1, start two runs (one queued), close the node, let timers run.
        (
            "disconnect-with-queue",
            vec![0x05, 0, 1, 2, 1, 0, 2, 1, 0, 2, 1, 0, 1, 1, 2, 6, 4, 6, 5],
        ),
        // resume on (config 8): a resuming node-0 streams an output, leaves, comes back and
        // claims its run; the drain ends it.
        (
            "resume",
            vec![0x08, 0, 0x80, 2, 0, 0, 4, 0, 1, 1, 1, 0, 6, 0, 0, 0x80, 6, 6],
        ),
        // start with a short deadline, cancel another, stall a link, sleep past everything.
        (
            "deadline-cancel-stall",
            vec![
                0x63, 0, 0, 2, 0, 3, 2, 0, 4, 3, 1, 8, 0, 2, 0, 0, 6, 6, 6, 4,
            ],
        ),
    ] {
        write("run_state_machine", name, &ops)?;
    }

    // resume_claims: [shape, outputs, claims (3 bytes each)..., bytes...]; see the target.
    for (name, input) in RESUME_SEEDS {
        write("resume_claims", name, input)?;
    }

    // config_loader: whole config files.
    let shipped = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/edge.toml"))?;
    write("config_loader", "shipped", &shipped)?;
    for (name, text) in CONFIGS {
        write("config_loader", name, text.as_bytes())?;
    }
    Ok(())
}

const CONFIGS: &[(&str, &str)] = &[
    (
        "two-nodes",
        "[[nodes]]\nid = \"node-a\"\nalias = \"gpu-a\"\ntoken = \"secret-token-a\"\n\
         [nodes.runtime]\nmax_concurrent_runs = 2\nheartbeat_interval_ms = 1000\n\
         [[nodes.adapters]]\nname = \"echo\"\ntargets = [\"default\"]\n\
         [nodes.adapters.settings]\nmode = \"words\"\n\n\
         [[nodes]]\nid = \"node-b\"\nalias = \"gpu-b\"\ntoken = 'secret-token-b'\n\
         [[nodes.adapters]]\nname = \"echo\"\ntargets = [\"default\", \"fast\"]\n",
    ),
    (
        "duplicate-token",
        "[[nodes]]\nid = \"a\"\nalias = \"x\"\ntoken = \"same-secret\"\n\
         [[nodes]]\nid = \"b\"\nalias = \"y\"\ntoken = \"same-secret\"\n",
    ),
    (
        "syntax-error-after-token",
        "[[nodes]]\nid = \"a\"\ntoken = \"secret-on-a-bad-line\" oops\n",
    ),
    (
        "token-of-wrong-type",
        "[[nodes]]\nid = \"a\"\nalias = \"b\"\ntoken = 12345\nextra = \"hidden-secret\"\n",
    ),
    (
        "bad-names",
        "[[nodes]]\nid = \"bad id!\"\nalias = \"\"\ntoken = \"secret-bad-names\"\n\
         [[nodes.adapters]]\nname = \"\"\ntargets = [\"a b\"]\n",
    ),
    (
        "inline-nodes",
        "nodes = [{ id = \"a\", alias = \"b\", token = \"inline-secret\", token_sha256 = \"00\" }]\n",
    ),
    (
        "sections",
        "[server]\nlisten = \"127.0.0.1:0\"\nmax_frame_bytes = 0\n[runs]\nqueue_capacity = 0\n\
         [log]\nlevel = \"nope=[\"\n[events]\nsinks = [\"file\"]\n[http]\nlisten = \"x\"\n",
    ),
];

fn register(token: &str, node_id: &str) -> NodeFrame {
    NodeFrame::Register(RegisterAttempt {
        token: Token::new(token),
        node_id: node_id.to_owned(),
        node_version: "seed".to_owned(),
        protocol_version: 1,
        adapters: vec!["echo".to_owned()],
        instance_id: String::new(),
        resume: Vec::new(),
        operations: edge::domain::DeclaredOperations::default(),
    })
}

/// A registration, a heartbeat, and one run event of every kind for `run_id`.
fn all_node_frames(run_id: &str) -> Vec<NodeFrame> {
    let event = |seq: u64, kind: RunEventKind| {
        NodeFrame::RunEvent(ReportedEvent {
            run_id: run_id.to_owned(),
            seq,
            kind,
        })
    };
    vec![
        register("token-a", "node-a"),
        NodeFrame::Heartbeat { active_runs: 1, ping: 0, availability: None, inventory: None },
        event(1, RunEventKind::Started),
        event(
            2,
            RunEventKind::Output { text: "hello".to_owned(), data: Bytes::from_static(b"\x00\x01"), structured: None },
        ),
        event(
            3,
            RunEventKind::Completed {
                finish_reason: "stop".to_owned(),
                usage: Some(Usage::new(3, 5)),
            },
        ),
        event(
            4,
            RunEventKind::failed("late".to_owned(), "after the end".to_owned()),
        ),
        event(
            5,
            RunEventKind::Cancelled {
                reason: "late".to_owned(),
                usage: Some(Usage::new(3, 2)),
            },
        ),
        NodeFrame::Unknown,
    ]
}

fn node_frames(frames: &[NodeFrame]) -> Vec<u8> {
    let mut codec = NodeCodec::new(usize::MAX);
    let mut buf = BytesMut::new();
    for frame in frames {
        codec.encode(frame.clone(), &mut buf).expect("encode");
    }
    buf.to_vec()
}

fn edge_frames() -> Vec<u8> {
    let store = FileNodeStore::from_definitions(&[NodeDefinition {
        id: "node-a".to_owned(),
        alias: "gpu-a".to_owned(),
        token: Some(Token::new("token-a")),
        adapters: vec![AdapterDefinition {
            name: "echo".to_owned(),
            targets: vec!["default".to_owned()],
            settings: BTreeMap::from([("mode".to_owned(), "words".to_owned())]),
        }],
        max_concurrent_runs: 2,
        heartbeat_interval_ms: 1_000,
        runtime_settings: BTreeMap::from([("gpu".to_owned(), "0".to_owned())]),
        ..NodeDefinition::default()
    }])
    .expect("valid definition");
    let record: Arc<_> = store.records().remove(0);
    let run_id = RunId::new("run-1");
    let frames = [
        EdgeFrame::Accepted(record),
        EdgeFrame::Rejected(RegisterRejection::InvalidToken),
        EdgeFrame::Command(NodeCommand::Run(RunAssignment {
            run_id: run_id.clone(),
            adapter: AdapterName::parse("echo").expect("adapter"),
            target: Target::parse("default").expect("target"),
            input: Bytes::from_static(b"hi"),
            content_type: "text/plain; charset=utf-8".to_owned(),
            params: BTreeMap::from([("k".to_owned(), "v".to_owned())]),
            deadline_ms: 1_000,
            operation: edge::domain::Operation::Unspecified,
        })),
        EdgeFrame::Command(NodeCommand::Cancel {
            run_id,
            reason: "caller".to_owned(),
        }),
        EdgeFrame::Command(NodeCommand::Shutdown {
            reason: "bye".to_owned(),
        }),
    ];
    let mut codec = EdgeCodec::new(usize::MAX);
    let mut buf = BytesMut::new();
    for frame in frames {
        codec.encode(frame, &mut buf).expect("encode");
    }
    buf.to_vec()
}

/// Seeds of `resume_claims`: each path a claim can take.
const RESUME_SEEDS: [(&str, &[u8]); 9] = [
    // Three events relayed; the same instance claims from 5: resumed.
    ("accepted", &[0x09, 3, 0, 5, 5]),
    // The claim says fewer events than the edge relayed.
    ("sequence-behind", &[0x09, 3, 0, 2, 1]),
    // The node no longer holds event 5.
    ("events-lost", &[0x09, 3, 0, 9, 7]),
    // node-b claims node-a's run.
    ("other-node", &[0x0b, 3, 0, 5, 5]),
    // The grace expired before the node came back.
    ("after-the-grace", &[0x0d, 3, 0, 5, 5]),
    // Back without claiming the run.
    ("not-claimed", &[0x01, 3]),
    // The run, an unknown run, the run again.
    ("repeated-and-unknown", &[0x19, 2, 0, 4, 4, 1, 1, 1, 3, 4, 4]),
    // Resumed, then silent: the edge's heartbeat bound ends it.
    ("resumed-then-silent", &[0x29, 1, 0, 3, 3]),
    // Nothing but `started` relayed (the pinned run is held anyway).
    ("no-output", &[0x08, 0, 0, 2, 2]),
];
