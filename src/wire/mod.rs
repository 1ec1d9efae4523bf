//! The node protocol on the wire: the generated protobuf types, the varint-delimited frame
//! codecs, the only place where wire types and domain types meet, and what both sides'
//! sockets need under the frames ([`keepalive`], [`tls`] material).
//!
//! Generated code stays in the private `proto` module; nothing outside `wire` sees a prost
//! type. The edge's transport reads [`NodeFrame`]s and writes [`EdgeFrame`]s through
//! [`EdgeCodec`]; a node writes [`NodeFrame`]s and reads [`ReceivedEdgeFrame`]s through
//! [`NodeCodec`]. The edge's codec stamps every message with the epoch its member acts
//! under; a node's codec checks it against the node's [`EpochFence`].

mod codec;
mod config_payload;
mod convert;
mod events;
mod fence;
mod fit;
pub mod keepalive;
mod models;
pub mod tls;

pub use codec::{EdgeCodec, FrameError, NodeCodec};
pub use convert::{
    EdgeFrame, NodeFrame, ReceivedAdapter, ReceivedConfig, ReceivedEdgeFrame, RegisterOutcome,
};
pub use fence::EpochFence;

/// The code prost-build generates from `proto/iop/v1/edge.proto`. Never edited by hand.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
mod proto {
    include!(concat!(env!("OUT_DIR"), "/iop.v1.rs"));
}
