//! Fuzz target `frame_decoder`: the varint-delimited frame decoders (`EdgeCodec` and
//! `NodeCodec`) fed one byte stream in different chunkings.
//!
//! Input: `[max_lo, max_hi, seed, stream...]`: the frame limit (a little-endian `u16`), the
//! seed of a chunk-size sequence, and the bytes a peer sends. Each codec decodes the stream
//! whole, one byte at a time, and in two seeded chunkings, and must:
//! - never panic;
//! - return a frame only once all of its bytes have arrived, and as soon as they have;
//! - return the same frames and stop at the same error with every chunking, where an
//!   independent reading of the length prefixes says it should;
//! - allocate nothing for a refused length prefix, and never reserve more than the frame it
//!   is waiting for (at most `max_frame` plus the prefix).
//!
//! Every `NodeFrame` the edge decodes must also survive re-encoding by a node unchanged.
//! This file is shared by the libFuzzer binary and the root crate's corpus replay test, so it
//! must build on stable and stay clippy-clean.

use std::fmt::Debug;

use bytes::BytesMut;
use edge::wire::{EdgeCodec, FrameError, NodeCodec, NodeFrame};
use tokio_util::codec::{Decoder, Encoder};

/// The longest valid varint length prefix.
const MAX_PREFIX: usize = 10;

/// The smallest capacity a growing `Vec<u8>` allocates.
const MIN_VEC_CAPACITY: usize = 8;

/// Runs one input.
pub fn run(data: &[u8]) {
    let Some((header, stream)) = data.split_first_chunk::<3>() else {
        return;
    };
    let max_frame = usize::from(u16::from_le_bytes([header[0], header[1]]));
    let seed = header[2];
    let reference = Reference::read(stream, max_frame);

    let frames = check(stream, max_frame, seed, &reference, || {
        EdgeCodec::new(max_frame)
    });
    for frame in frames {
        round_trip(frame);
    }
    check(stream, max_frame, seed, &reference, || {
        NodeCodec::new(max_frame)
    });
}

/// The framing of a stream as the protocol defines it, read independently of the codec:
/// where each whole frame lies, and how the stream ends after the last one.
struct Reference {
    /// Each whole frame as (start of its prefix, end of its message).
    frames: Vec<(usize, usize)>,
    /// What follows the last whole frame.
    end: ReferenceEnd,
    /// Where the bytes after the last whole frame start.
    rest: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReferenceEnd {
    /// Nothing.
    Clean,
    /// Part of a frame; `total` is its whole size once its prefix is complete.
    Incomplete { total: Option<usize> },
    /// A prefix announcing more than the limit.
    Oversized,
    /// A prefix that is not a varint of at most 10 bytes fitting in 64 bits.
    BadLength,
}

impl Reference {
    fn read(stream: &[u8], max_frame: usize) -> Self {
        let mut frames = Vec::new();
        let mut at = 0;
        let end = loop {
            if at == stream.len() {
                break ReferenceEnd::Clean;
            }
            let (length, prefix) = match read_varint(&stream[at..]) {
                Varint::Value { value, size } => (value, size),
                Varint::Short => break ReferenceEnd::Incomplete { total: None },
                Varint::Invalid => break ReferenceEnd::BadLength,
            };
            let Some(length) = usize::try_from(length).ok().filter(|l| *l <= max_frame) else {
                break ReferenceEnd::Oversized;
            };
            let total = prefix + length;
            if stream.len() - at < total {
                break ReferenceEnd::Incomplete { total: Some(total) };
            }
            frames.push((at, at + total));
            at += total;
        };
        Self {
            frames,
            end,
            rest: at,
        }
    }

    /// How many frames are whole once `fed` bytes have arrived.
    fn whole_within(&self, fed: usize) -> usize {
        self.frames
            .iter()
            .take_while(|(_, end)| *end <= fed)
            .count()
    }

    /// The size of frame `index` once its prefix is known, if it is acceptable.
    fn total_of(&self, index: usize) -> Option<usize> {
        match self.frames.get(index) {
            Some((start, end)) => Some(end - start),
            None => match self.end {
                ReferenceEnd::Incomplete { total } => total,
                _ => None,
            },
        }
    }
}

enum Varint {
    Value { value: u64, size: usize },
    Short,
    Invalid,
}

/// Reads a base-128 varint: at most 10 bytes, the 10th holding only the 64th bit.
fn read_varint(bytes: &[u8]) -> Varint {
    let mut value = 0u64;
    for (i, byte) in bytes.iter().enumerate().take(MAX_PREFIX) {
        if i == MAX_PREFIX - 1 && *byte > 1 {
            return Varint::Invalid;
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Varint::Value { value, size: i + 1 };
        }
    }
    Varint::Short
}

/// How one decoding pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    /// Every byte was consumed by whole frames.
    Clean,
    /// The stream ended inside a frame; `left` bytes were never decoded.
    Truncated { left: usize },
    /// The decoder refused the stream.
    Failed { kind: ErrorKind, error: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ErrorKind {
    Oversized,
    BadLength,
    Decode,
    Io,
}

fn failed(error: &FrameError) -> End {
    let kind = match error {
        FrameError::Oversized { .. } => ErrorKind::Oversized,
        FrameError::BadLength => ErrorKind::BadLength,
        // `Stale` comes only from a fenced node codec; the ones here are not fenced.
        FrameError::Decode(_) | FrameError::Stale { .. } => ErrorKind::Decode,
        FrameError::Io(_) => ErrorKind::Io,
    };
    End::Failed {
        kind,
        error: format!("{error:?}"),
    }
}

/// Decodes `stream` four ways with fresh codecs from `codec`, checks every pass against the
/// reference and against each other, and returns the frames.
fn check<D>(
    stream: &[u8],
    max_frame: usize,
    seed: u8,
    reference: &Reference,
    codec: impl Fn() -> D,
) -> Vec<D::Item>
where
    D: Decoder<Error = FrameError>,
    D::Item: Debug,
{
    let mut whole = Pass::new(codec(), reference);
    whole.feed(stream);
    let (frames, end) = whole.finish();
    let expected: Vec<String> = frames.iter().map(|f| format!("{f:?}")).collect();
    agrees_with_reference(&end, frames.len(), stream.len(), reference);

    let mut bytewise = Pass::new(codec(), reference);
    for byte in stream.chunks(1) {
        bytewise.feed(byte);
    }
    same(&expected, &end, bytewise.finish(), "one byte at a time");

    let mut chunked = Pass::new(codec(), reference);
    for chunk in chunks(stream, seed) {
        chunked.feed(chunk);
    }
    same(&expected, &end, chunked.finish(), "seeded chunks");

    let fresh = fresh_buffers(codec(), stream, seed ^ 0x5a, max_frame, reference);
    same(&expected, &end, fresh, "fresh buffers");
    frames
}

fn agrees_with_reference(end: &End, decoded: usize, len: usize, reference: &Reference) {
    let whole = reference.frames.len();
    match (end, reference.end) {
        (End::Clean, ReferenceEnd::Clean) => assert_eq!(decoded, whole),
        (End::Truncated { left }, ReferenceEnd::Incomplete { .. }) => {
            assert_eq!(decoded, whole);
            assert_eq!(*left, len - reference.rest);
        }
        (
            End::Failed {
                kind: ErrorKind::Oversized,
                ..
            },
            ReferenceEnd::Oversized,
        )
        | (
            End::Failed {
                kind: ErrorKind::BadLength,
                ..
            },
            ReferenceEnd::BadLength,
        ) => assert_eq!(decoded, whole),
        // A whole frame whose bytes are not a message.
        (
            End::Failed {
                kind: ErrorKind::Decode,
                ..
            },
            _,
        ) => assert!(decoded < whole, "decode error outside a whole frame"),
        (end, expected) => panic!("decoder ended with {end:?}, the framing says {expected:?}"),
    }
}

fn same(frames: &[String], end: &End, pass: (Vec<impl Debug>, End), how: &str) {
    let decoded: Vec<String> = pass.0.iter().map(|f| format!("{f:?}")).collect();
    assert_eq!(decoded, frames, "{how}: other frames than a whole read");
    assert_eq!(&pass.1, end, "{how}: another ending than a whole read");
}

/// A chunking of `stream` into pieces of 1 to 64 bytes, drawn from `seed`.
fn chunks(stream: &[u8], seed: u8) -> impl Iterator<Item = &[u8]> {
    let mut state = u32::from(seed) | 0x100;
    let mut rest = stream;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        state = state.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        let size = 1 + (state >> 16) as usize % 64;
        let (head, tail) = rest.split_at(size.min(rest.len()));
        rest = tail;
        Some(head)
    })
}

/// One decoder reading a stream into one buffer, the way `Framed` drives it.
struct Pass<'r, D: Decoder> {
    codec: D,
    buf: BytesMut,
    fed: usize,
    frames: Vec<D::Item>,
    failed: Option<End>,
    reference: &'r Reference,
}

impl<'r, D> Pass<'r, D>
where
    D: Decoder<Error = FrameError>,
    D::Item: Debug,
{
    fn new(codec: D, reference: &'r Reference) -> Self {
        Self {
            codec,
            buf: BytesMut::new(),
            fed: 0,
            frames: Vec::new(),
            failed: None,
            reference,
        }
    }

    /// Appends `chunk` and decodes until the codec wants more bytes.
    fn feed(&mut self, chunk: &[u8]) {
        if self.failed.is_some() {
            return;
        }
        self.buf.extend_from_slice(chunk);
        self.fed += chunk.len();
        loop {
            let capacity = self.buf.capacity();
            match self.codec.decode(&mut self.buf) {
                Ok(Some(frame)) => {
                    let index = self.frames.len();
                    let &(_, end) = self
                        .reference
                        .frames
                        .get(index)
                        .expect("a frame the framing does not have");
                    assert!(
                        end <= self.fed,
                        "frame {index} returned before it was whole"
                    );
                    assert_eq!(self.buf.len(), self.fed - end, "frame {index} misconsumed");
                    self.frames.push(frame);
                }
                Ok(None) => {
                    assert_eq!(
                        self.frames.len(),
                        self.reference.whole_within(self.fed),
                        "a whole frame was not returned"
                    );
                    return;
                }
                Err(error) => {
                    if matches!(error, FrameError::Oversized { .. } | FrameError::BadLength) {
                        assert_eq!(self.buf.capacity(), capacity, "a refused prefix allocated");
                    }
                    self.failed = Some(failed(&error));
                    return;
                }
            }
        }
    }

    /// Ends the stream the way `Framed` does at EOF.
    fn finish(mut self) -> (Vec<D::Item>, End) {
        if let Some(end) = self.failed {
            return (self.frames, end);
        }
        let left = self.buf.len();
        let end = match self.codec.decode_eof(&mut self.buf) {
            Ok(None) => End::Clean,
            Ok(Some(frame)) => panic!("a frame at EOF that decode did not return: {frame:?}"),
            Err(FrameError::Io(_)) => End::Truncated { left },
            Err(error) => panic!("decode_eof failed where decode waited: {error:?}"),
        };
        (self.frames, end)
    }
}

/// Decodes `stream` in seeded chunks, giving the codec a fresh, exactly sized buffer of the
/// bytes not yet decoded on every call, so any capacity it adds is its own reservation.
fn fresh_buffers<D>(
    mut codec: D,
    stream: &[u8],
    seed: u8,
    max_frame: usize,
    reference: &Reference,
) -> (Vec<D::Item>, End)
where
    D: Decoder<Error = FrameError>,
{
    let mut pending: Vec<u8> = Vec::new();
    let mut frames = Vec::new();
    for chunk in chunks(stream, seed) {
        pending.extend_from_slice(chunk);
        loop {
            let mut buf = BytesMut::from(&pending[..]);
            let before = buf.capacity();
            let awaited = reference.total_of(frames.len());
            let result = codec.decode(&mut buf);
            let after = buf.capacity();
            match result {
                Ok(Some(frame)) => {
                    assert!(after <= before, "returning a frame allocated");
                    pending.drain(..pending.len() - buf.len());
                    frames.push(frame);
                }
                Ok(None) => {
                    let allowed = match awaited {
                        Some(total) => {
                            assert!(total <= max_frame + MAX_PREFIX);
                            // `Vec` growth: at least double, at least the request.
                            (2 * before).max(total).max(MIN_VEC_CAPACITY)
                        }
                        // The prefix is not complete yet: nothing to reserve for.
                        None => before,
                    };
                    assert!(
                        after <= allowed,
                        "reserved {after} bytes waiting for a frame of {awaited:?} bytes \
                         (had {before}, limit {max_frame})"
                    );
                    break;
                }
                Err(error) => {
                    assert!(after <= before, "a refused frame allocated");
                    return (frames, failed(&error));
                }
            }
        }
    }
    let left = pending.len();
    let mut buf = BytesMut::from(&pending[..]);
    let end = match codec.decode_eof(&mut buf) {
        Ok(None) => End::Clean,
        Ok(Some(_)) => panic!("a frame at EOF that decode did not return"),
        Err(FrameError::Io(_)) => End::Truncated { left },
        Err(error) => panic!("decode_eof failed where decode waited: {error:?}"),
    };
    (frames, end)
}

/// A frame the edge decoded reads back the same after a node re-encodes it.
fn round_trip(frame: NodeFrame) {
    let mut buf = BytesMut::new();
    NodeCodec::new(usize::MAX)
        .encode(frame.clone(), &mut buf)
        .expect("encoding into memory");
    let again = EdgeCodec::new(usize::MAX)
        .decode(&mut buf)
        .expect("a re-encoded frame decodes")
        .expect("a re-encoded frame is whole");
    assert!(buf.is_empty(), "re-encoding left bytes over");
    assert_eq!(format!("{again:?}"), format!("{frame:?}"));
    if let (NodeFrame::Register(first), NodeFrame::Register(second)) = (&frame, &again) {
        assert_eq!(first.token.expose_secret(), second.token.expose_secret());
    }
}
