//! Varint-delimited protobuf framing.
//!
//! Every frame is a base-128 varint byte length followed by that many bytes of one protobuf
//! message. The decoder checks the length against the limit before it reserves any memory,
//! tells "incomplete" (wait for more bytes) from "invalid" (close the connection), and
//! rejects varints longer than 10 bytes.

use std::io;
use std::marker::PhantomData;

use bytes::{Buf, BytesMut};
use prost::Message;
use tokio_util::codec::{Decoder, Encoder};

use super::convert::{EdgeFrame, NodeFrame, ReceivedEdgeFrame, received_from_wire};
use super::fence::EpochFence;
use super::proto::{EdgeMessage, NodeMessage};

/// The longest valid varint.
const MAX_VARINT_BYTES: usize = 10;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The length prefix is above the limit; nothing was allocated for it.
    #[error("frame of {length} bytes exceeds the limit of {max} bytes")]
    Oversized {
        /// The announced length.
        length: u64,
        /// The limit in force.
        max: usize,
    },
    /// The length prefix is not a valid varint (longer than 10 bytes).
    #[error("length prefix is not a valid varint")]
    BadLength,
    /// The frame's bytes do not decode as the expected message.
    #[error("frame does not decode: {0}")]
    Decode(#[from] prost::DecodeError),
    /// A fenced node's codec read a message under an epoch below the highest the node has
    /// seen: it comes from an edge that no longer acts for the site, and is not obeyed.
    #[error(
        "a message under epoch {epoch}, below the highest epoch seen ({highest}): refused, \
         the edge no longer acts for its site"
    )]
    Stale {
        /// The message's epoch.
        epoch: u64,
        /// The highest epoch the node has seen.
        highest: u64,
    },
}

/// Reads a varint length prefix from the front of `buf` without consuming it.
///
/// Returns `Ok(None)` when more bytes are needed, else the length and the prefix's size.
fn peek_length(buf: &[u8]) -> Result<Option<(u64, usize)>, FrameError> {
    let mut value: u64 = 0;
    for (i, byte) in buf.iter().take(MAX_VARINT_BYTES).enumerate() {
        let bits = u64::from(byte & 0x7f);
        if i == MAX_VARINT_BYTES - 1 && *byte > 1 {
            return Err(FrameError::BadLength);
        }
        value |= bits << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if buf.len() >= MAX_VARINT_BYTES {
        Err(FrameError::BadLength)
    } else {
        Ok(None)
    }
}

/// Splits one whole frame's message bytes off the front of `buf`, if it holds one.
fn next_frame(buf: &mut BytesMut, max: usize) -> Result<Option<BytesMut>, FrameError> {
    let Some((length, prefix)) = peek_length(buf)? else {
        return Ok(None);
    };
    let length = usize::try_from(length)
        .ok()
        .filter(|l| *l <= max)
        .ok_or(FrameError::Oversized { length, max })?;
    let total = prefix + length;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    buf.advance(prefix);
    Ok(Some(buf.split_to(length)))
}

/// The size on the wire of a frame whose message is `length` bytes.
fn frame_size(length: usize) -> u64 {
    let prefix = prost::encoding::encoded_len_varint(length as u64);
    (prefix + length) as u64
}

fn encode_frame(message: &impl Message, dst: &mut BytesMut) {
    dst.reserve(message.encoded_len() + MAX_VARINT_BYTES);
    // Encoding into a `BytesMut` after reserving cannot run out of room.
    let _ = message.encode_length_delimited(dst);
}

/// The framing shared by both ends; `R` is what it reads, `W` what it writes.
#[derive(Debug)]
pub struct FrameCodec<R, W> {
    max_frame: usize,
    bytes_read: u64,
    bytes_written: u64,
    /// The edge's end: the epoch every message it writes carries (0 unless set).
    epoch: u64,
    /// A node's end: the fence what it reads is checked against (none: nothing is refused).
    fence: Option<EpochFence>,
    direction: PhantomData<fn(W) -> R>,
}

impl<R, W> FrameCodec<R, W> {
    /// A codec that refuses frames longer than `max_frame` bytes.
    pub fn new(max_frame: usize) -> Self {
        Self {
            max_frame,
            bytes_read: 0,
            bytes_written: 0,
            epoch: 0,
            fence: None,
            direction: PhantomData,
        }
    }

    /// Bytes of whole frames read and written since the last call (prefixes included).
    pub fn take_byte_counts(&mut self) -> (u64, u64) {
        (
            std::mem::take(&mut self.bytes_read),
            std::mem::take(&mut self.bytes_written),
        )
    }

    fn next_frame(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, FrameError> {
        let frame = next_frame(buf, self.max_frame)?;
        if let Some(frame) = &frame {
            self.bytes_read += frame_size(frame.len());
        }
        Ok(frame)
    }

    fn encode_frame(&mut self, message: &impl Message, dst: &mut BytesMut) {
        let before = dst.len();
        encode_frame(message, dst);
        self.bytes_written += (dst.len() - before) as u64;
    }

    /// Changes the frame limit (the edge lowers it until a node has registered).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }
}

/// The edge's end: reads what nodes send, writes what the edge sends.
pub type EdgeCodec = FrameCodec<NodeFrame, EdgeFrame>;

/// A node's end: reads what the edge sends, writes what nodes send.
pub type NodeCodec = FrameCodec<ReceivedEdgeFrame, NodeFrame>;

impl EdgeCodec {
    /// Stamps every message written from now on with `epoch` (`EdgeMessage.epoch`).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.epoch = epoch;
    }
}

impl NodeCodec {
    /// Checks every message read from now on against `fence` (shared by all of a node's
    /// connections): a message under a lower epoch than the fence has seen is
    /// [`FrameError::Stale`], except a registration's refusal, which carries no authority
    /// (a standby's answer naming the active member). Every other message raises the fence
    /// to its epoch.
    pub fn set_fence(&mut self, fence: EpochFence) {
        self.fence = Some(fence);
    }
}

impl Decoder for EdgeCodec {
    type Item = NodeFrame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<NodeFrame>, FrameError> {
        match self.next_frame(src)? {
            Some(frame) => Ok(Some(NodeFrame::from(NodeMessage::decode(frame.freeze())?))),
            None => Ok(None),
        }
    }
}

impl Encoder<EdgeFrame> for EdgeCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: EdgeFrame, dst: &mut BytesMut) -> Result<(), FrameError> {
        let mut message = EdgeMessage::from(frame);
        message.epoch = self.epoch;
        self.encode_frame(&message, dst);
        Ok(())
    }
}

impl Decoder for NodeCodec {
    type Item = ReceivedEdgeFrame;
    type Error = FrameError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<ReceivedEdgeFrame>, FrameError> {
        let Some(frame) = self.next_frame(src)? else {
            return Ok(None);
        };
        let (epoch, frame) = received_from_wire(EdgeMessage::decode(frame.freeze())?);
        let refusal = matches!(&frame, ReceivedEdgeFrame::Registered(outcome) if !outcome.accepted);
        if let Some(fence) = &self.fence
            && !refusal
            && let Err(highest) = fence.observe(epoch)
        {
            let refused = described(&frame);
            tracing::warn!(
                epoch,
                highest,
                refused,
                "refusing a message from an edge under an older epoch"
            );
            return Err(FrameError::Stale { epoch, highest });
        }
        Ok(Some(frame))
    }
}

impl Encoder<NodeFrame> for NodeCodec {
    type Error = FrameError;

    fn encode(&mut self, frame: NodeFrame, dst: &mut BytesMut) -> Result<(), FrameError> {
        self.encode_frame(&NodeMessage::from(frame), dst);
        Ok(())
    }
}

/// What a refused message was, for the node's log (never its input: prompts stay out).
fn described(frame: &ReceivedEdgeFrame) -> String {
    use crate::ports::NodeCommand;
    match frame {
        ReceivedEdgeFrame::Command(NodeCommand::Run(run)) => format!("run {}", run.run_id),
        ReceivedEdgeFrame::Command(NodeCommand::Cancel { run_id, .. }) => {
            format!("cancel of run {run_id}")
        }
        ReceivedEdgeFrame::Command(NodeCommand::Shutdown { .. }) => "shutdown".into(),
        ReceivedEdgeFrame::Command(NodeCommand::Model(command)) => {
            format!("model command {}", command.command_id)
        }
        ReceivedEdgeFrame::Registered(_) => "registration answer".into(),
        ReceivedEdgeFrame::HeartbeatAck { .. } => "heartbeat ack".into(),
        ReceivedEdgeFrame::Unknown => "message".into(),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::domain::RegisterAttempt;
    use crate::domain::{RunEventKind, Token};
    use crate::ports::ReportedEvent;

    fn heartbeat(active_runs: u32) -> NodeFrame {
        NodeFrame::Heartbeat {
            active_runs,
            ping: 0,
            availability: None,
            inventory: None,
        }
    }

    fn encoded(frames: &[NodeFrame]) -> BytesMut {
        let mut codec = NodeCodec::new(1 << 20);
        let mut buf = BytesMut::new();
        for frame in frames {
            codec.encode(frame.clone(), &mut buf).unwrap();
        }
        buf
    }

    #[test]
    fn an_oversized_prefix_is_refused_before_allocation() {
        let mut codec = EdgeCodec::new(16);
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xff, 0x0f][..]);
        let capacity = buf.capacity();
        assert!(matches!(
            codec.decode(&mut buf),
            Err(FrameError::Oversized { max: 16, .. })
        ));
        assert_eq!(buf.capacity(), capacity);
    }

    #[test]
    fn an_eleven_byte_varint_is_refused() {
        let mut codec = EdgeCodec::new(usize::MAX);
        let mut buf = BytesMut::from(&[0x80u8; 11][..]);
        assert!(matches!(codec.decode(&mut buf), Err(FrameError::BadLength)));
        let mut short = BytesMut::from(&[0x80u8; 9][..]);
        assert!(matches!(codec.decode(&mut short), Ok(None)));
    }

    #[test]
    fn garbage_is_a_decode_error() {
        let mut codec = EdgeCodec::new(1024);
        let mut buf = BytesMut::from(&[0x03, 0xff, 0xff, 0xff][..]);
        assert!(matches!(codec.decode(&mut buf), Err(FrameError::Decode(_))));
    }

    #[test]
    fn frames_round_trip() {
        let frames = vec![
            NodeFrame::Register(RegisterAttempt {
                token: Token::new("t"),
                node_id: "n".into(),
                node_version: "1".into(),
                protocol_version: 1,
                adapters: vec!["echo".into()],
                instance_id: String::new(),
                resume: Vec::new(),
                can_continue: false,
                operations: crate::domain::DeclaredOperations::default(),
                can_manage_models: false,
                inventory: None,
            }),
            heartbeat(3),
            NodeFrame::RunEvent(ReportedEvent {
                run_id: "r1".into(),
                seq: 2,
                kind: RunEventKind::cancelled("x"),
            }),
        ];
        let mut buf = encoded(&frames);
        let mut codec = EdgeCodec::new(1024);
        let mut decoded = Vec::new();
        while let Some(frame) = codec.decode(&mut buf).unwrap() {
            decoded.push(frame);
        }
        assert_eq!(format!("{decoded:?}"), format!("{frames:?}"));
    }

    /// Every v1.1 addition survives a trip through the codecs, both ways.
    #[test]
    #[allow(
        clippy::too_many_lines,
        reason = "one frame of each v1.1 addition, listed whole so a missing one shows"
    )]
    fn v1_1_additions_round_trip() {
        use crate::domain::{
            AdapterName, Availability, FailureClass, Operation, ResumeClaim, RunId,
            StructuredOutput, Target, TokenLogprob, ToolCallDelta, TopLogprob, Usage,
        };
        use crate::ports::{NodeCommand, RunAssignment};
        use crate::wire::{EdgeFrame, ReceivedEdgeFrame};

        let pair = |a: &str, t: &str| (AdapterName::parse(a).unwrap(), Target::parse(t).unwrap());
        let structured = StructuredOutput {
            reasoning: "thinking".into(),
            tool_calls: vec![ToolCallDelta {
                index: 1,
                id: "call_1".into(),
                name: "get_weather".into(),
                arguments: "{\"city\":".into(),
            }],
            logprobs: vec![TokenLogprob {
                token: "hi".into(),
                logprob: -0.25,
                bytes: b"hi".to_vec(),
                top: vec![TopLogprob {
                    token: "ho".into(),
                    logprob: -1.5,
                    bytes: b"ho".to_vec(),
                }],
            }],
            embeddings: vec![crate::domain::Embedding {
                index: 0,
                values: vec![0.5, -1.0],
            }],
            tokens: vec![1, 15_043],
            usage: Some(Usage {
                input_tokens: 12,
                output_tokens: 1,
                cached_input_tokens: 3,
                reasoning_tokens: 0,
            }),
        };
        let node_frames = vec![
            NodeFrame::Register(RegisterAttempt {
                token: Token::new("t"),
                node_id: String::new(),
                node_version: "1".into(),
                protocol_version: 1,
                adapters: vec![],
                instance_id: "0123abcd".into(),
                resume: vec![ResumeClaim {
                    run_id: "r1".into(),
                    next_seq: 7,
                    first_buffered_seq: 3,
                }],
                can_continue: true,
                operations: crate::domain::DeclaredOperations::new([
                    Operation::Tokenize,
                    Operation::Detokenize,
                ]),
                can_manage_models: true,
                inventory: None,
            }),
            NodeFrame::Heartbeat {
                active_runs: 1,
                ping: 42,
                availability: Some(Availability::new([
                    pair("openai", "b"),
                    pair("openai", "a"),
                    pair("echo", "x"),
                ])),
                inventory: Some(crate::domain::Inventory {
                    devices: vec![crate::domain::Device {
                        index: 0,
                        kind: crate::domain::DeviceKind::Memory,
                        name: "memory".into(),
                        total_bytes: 24 << 30,
                        used_bytes: 3 << 30,
                    }],
                }),
            },
            NodeFrame::RunEvent(ReportedEvent {
                run_id: "r1".into(),
                seq: 2,
                kind: RunEventKind::Output {
                    text: "t".into(),
                    data: bytes::Bytes::new(),
                    structured: Some(Box::new(structured)),
                },
            }),
            NodeFrame::RunEvent(ReportedEvent {
                run_id: "r1".into(),
                seq: 3,
                kind: RunEventKind::Completed {
                    finish_reason: "tool_calls".into(),
                    usage: Some(Usage {
                        input_tokens: 9,
                        output_tokens: 5,
                        cached_input_tokens: 4,
                        reasoning_tokens: 2,
                    }),
                },
            }),
            NodeFrame::RunEvent(ReportedEvent {
                run_id: "r2".into(),
                seq: 1,
                kind: RunEventKind::Failed {
                    context_window: None,
                    code: "context_length_exceeded".into(),
                    message: "too long".into(),
                    class: FailureClass::Request,
                    status: Some(400),
                    usage: None,
                },
            }),
        ];
        let mut buf = encoded(&node_frames);
        let mut codec = EdgeCodec::new(1 << 20);
        let mut decoded = Vec::new();
        while let Some(frame) = codec.decode(&mut buf).unwrap() {
            decoded.push(frame);
        }
        assert_eq!(format!("{decoded:?}"), format!("{node_frames:?}"));

        let run = RunAssignment {
            run_id: RunId::new("r3"),
            adapter: AdapterName::parse("openai").unwrap(),
            target: Target::parse("qwen").unwrap(),
            input: bytes::Bytes::from_static(b"{}"),
            content_type: "application/json".into(),
            params: std::collections::BTreeMap::new(),
            deadline_ms: 5,
            operation: Operation::Embeddings,
            continuation: Some(crate::domain::Continuation {
                text: "so far".into(),
                output_tokens: 2,
                number: 1,
            }),
        };
        let mut edge = EdgeCodec::new(1 << 20);
        let mut out = BytesMut::new();
        edge.encode(EdgeFrame::HeartbeatAck { ping: 42 }, &mut out)
            .unwrap();
        edge.encode(EdgeFrame::Command(NodeCommand::Run(run.clone())), &mut out)
            .unwrap();
        let mut node = NodeCodec::new(1 << 20);
        assert_eq!(
            node.decode(&mut out).unwrap(),
            Some(ReceivedEdgeFrame::HeartbeatAck { ping: 42 })
        );
        assert_eq!(
            node.decode(&mut out).unwrap(),
            Some(ReceivedEdgeFrame::Command(NodeCommand::Run(run)))
        );
    }

    /// The edge stamps its epoch on every message; a fenced node refuses a command under a
    /// lower epoch than it has seen, but reads a standby's refusal naming the active member.
    #[test]
    fn epochs_are_stamped_and_fenced() {
        use crate::domain::RunId;
        use crate::ports::NodeCommand;
        use crate::wire::{EdgeFrame, EpochFence, ReceivedEdgeFrame};

        let cancel = |run: &str| {
            EdgeFrame::Command(NodeCommand::Cancel {
                run_id: RunId::new(run),
                reason: "test".into(),
            })
        };
        let mut out = BytesMut::new();
        let mut edge = EdgeCodec::new(1024);
        edge.set_epoch(2);
        edge.encode(cancel("under-2"), &mut out).unwrap();
        edge.set_epoch(0);
        edge.encode(
            EdgeFrame::StandingBy {
                active_edge: Some("10.0.0.2:7100".into()),
                message: "stands by".into(),
            },
            &mut out,
        )
        .unwrap();
        edge.set_epoch(1);
        edge.encode(cancel("under-1"), &mut out).unwrap();
        edge.set_epoch(3);
        edge.encode(cancel("under-3"), &mut out).unwrap();

        let fence = EpochFence::new();
        let mut node = NodeCodec::new(1024);
        node.set_fence(fence.clone());
        assert!(matches!(
            node.decode(&mut out).unwrap(),
            Some(ReceivedEdgeFrame::Command(NodeCommand::Cancel { run_id, .. })) if run_id.as_str() == "under-2"
        ));
        match node.decode(&mut out).unwrap() {
            Some(ReceivedEdgeFrame::Registered(outcome)) => {
                assert!(!outcome.accepted);
                assert_eq!(
                    outcome.rejection,
                    Some(crate::domain::RegisterRejection::ShuttingDown)
                );
                assert_eq!(outcome.active_edge.as_deref(), Some("10.0.0.2:7100"));
            }
            other => panic!("expected the standby's refusal, got {other:?}"),
        }
        assert!(matches!(
            node.decode(&mut out),
            Err(FrameError::Stale {
                epoch: 1,
                highest: 2
            })
        ));
        // Another connection of the same node shares the fence.
        let mut again = NodeCodec::new(1024);
        again.set_fence(fence.clone());
        assert!(matches!(
            again.decode(&mut out).unwrap(),
            Some(ReceivedEdgeFrame::Command(NodeCommand::Cancel { .. }))
        ));
        assert_eq!(fence.highest(), 3);
    }

    proptest! {
        /// Frames arrive whole however the byte stream is cut.
        #[test]
        fn chunking_never_changes_what_is_decoded(
            counts in proptest::collection::vec(0u32..100_000, 1..20),
            cuts in proptest::collection::vec(1usize..7, 1..200),
        ) {
            let frames: Vec<NodeFrame> = counts.iter().map(|c| heartbeat(*c)).collect();
            let bytes = encoded(&frames);
            let mut codec = EdgeCodec::new(1024);
            let mut buf = BytesMut::new();
            let mut decoded = Vec::new();
            let mut offset = 0;
            for cut in cuts.iter().cycle() {
                if offset >= bytes.len() {
                    break;
                }
                let end = (offset + cut).min(bytes.len());
                buf.extend_from_slice(&bytes[offset..end]);
                offset = end;
                while let Some(NodeFrame::Heartbeat { active_runs, .. }) = codec.decode(&mut buf).unwrap() {
                    decoded.push(active_runs);
                }
            }
            prop_assert_eq!(decoded, counts);
        }
    }
}
