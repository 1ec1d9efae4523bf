//! The decisions of the stream's tasks, apart from their I/O (decisions 49, 50 and 53): how
//! a batch is named and signed (its `Nats-Msg-Id`, the headers saying who wrote it under
//! which epoch), what the stream's answer to an append means, which batches the folder
//! applies and in which order, where it starts reading, and which published batches it
//! remembers the sequence of. Pure: no NATS, no journal, no clock.

use std::collections::{HashSet, VecDeque};

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;

/// The header naming the member that wrote a batch.
const EDGE_HEADER: &str = "Edge-Id";
/// The header naming the epoch it wrote it under.
const EPOCH_HEADER: &str = "Edge-Epoch";

/// The published batches whose sequence is remembered, newest last: a copy is paired with
/// the sequence of the last batch it holds, looked up as soon as that batch is published.
pub(super) const ACKED_KEPT: usize = 4_096;

/// The `Nats-Msg-Id` of the `n`th batch member `edge` publishes under `epoch`: a retry
/// carries the same, so the stream stores it once.
pub(super) fn batch_id(edge: &str, epoch: u64, n: u64) -> String {
    format!("{edge}-{epoch}-{n}")
}

/// The `Nats-Msg-Id` of member `edge`'s claim of the stream under `epoch`.
pub(super) fn claim_id(edge: &str, epoch: u64) -> String {
    format!("{edge}-{epoch}-claim")
}

/// The headers of a batch member `edge` writes under `epoch`.
pub(super) fn signed(edge: &str, epoch: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(EDGE_HEADER, edge);
    headers.insert(EPOCH_HEADER, epoch.to_string().as_str());
    headers
}

/// Who wrote a batch, as its headers say: the member and the epoch, each when readable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Origin {
    pub(super) edge: Option<String>,
    pub(super) epoch: Option<u64>,
}

impl Origin {
    /// What `headers` say of a batch's writer.
    pub(super) fn of(headers: Option<&HeaderMap>) -> Self {
        let header = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        Self {
            edge: header(EDGE_HEADER),
            epoch: header(EPOCH_HEADER).and_then(|e| e.parse::<u64>().ok()),
        }
    }
}

/// What the stream answered to an append.
#[derive(Debug)]
pub(super) enum Appended {
    /// Stored at this sequence (or stored before, for a retried id: the stream's duplicate
    /// window answers with the first one's sequence).
    At(u64),
    /// The stream does not end where the writer expected: another member appended since.
    Refused,
    /// No answer, or another error: the same append may be tried again.
    Failed(PublishError),
}

impl Appended {
    pub(super) fn of(answer: Result<PublishAck, PublishError>) -> Self {
        match answer {
            Ok(ack) => Appended::At(ack.sequence),
            Err(error) if error.kind() == PublishErrorKind::WrongLastSequence => Appended::Refused,
            Err(error) => Appended::Failed(error),
        }
    }
}

/// What the folder does with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Written by another member, or an earlier life of this one: applied.
    Apply,
    /// Written by this life of this member: in its file already.
    Own,
    /// Written under an epoch older than one already folded (or under none).
    Stale,
}

/// The verdict on a batch `edge` wrote under `epoch`, for member `me` that published under
/// `own_epochs` in this life and folded batches up to epoch `newest` before this one.
pub(super) fn verdict(
    edge: Option<&str>,
    epoch: Option<u64>,
    me: &str,
    own_epochs: &HashSet<u64>,
    newest: u64,
) -> Verdict {
    match epoch {
        Some(epoch) if epoch >= newest => {
            if edge == Some(me) && own_epochs.contains(&epoch) {
                Verdict::Own
            } else {
                Verdict::Apply
            }
        }
        _ => Verdict::Stale,
    }
}

/// What the folder does with the message at a stream sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Next {
    /// At or below what it folded: handled already (a redelivery).
    Handled,
    /// Right after what it folded (or past it, for the member writing the stream, whose
    /// own purge made the gap): fold it.
    Fold,
    /// Past the one after what it folded: the stream was purged under the consumer, and
    /// the read starts over.
    Gap,
}

/// What the folder that `folded` up to a sequence does with the message at `seq`; `writes`
/// when this member writes the stream.
pub(super) fn next(seq: u64, folded: u64, writes: bool) -> Next {
    if seq <= folded {
        Next::Handled
    } else if seq > folded + 1 && !writes {
        Next::Gap
    } else {
        Next::Fold
    }
}

/// Where the folder reads the stream from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Start {
    /// Right after what it folded.
    Next,
    /// From the stream's first message: the stream starts past what it folded, but this
    /// member writes it, so what it lacks was purged by itself (its own batches, or folded
    /// before its claim). Never rebuilt under its own writer.
    First,
    /// From the newest snapshot, once its journal is rebuilt from it: the stream starts
    /// past what it folded (it started with an empty file, or stood by while the stream
    /// was purged).
    Snapshot,
}

/// Where a folder that `folded` up to a sequence reads a stream starting at `first` from;
/// `writes` when this member writes the stream.
pub(super) fn start(first: u64, folded: u64, writes: bool) -> Start {
    if first <= folded + 1 {
        Start::Next
    } else if writes {
        Start::First
    } else {
        Start::Snapshot
    }
}

/// The stream sequences of the latest published batches, by their number in the feed,
/// newest last, [`ACKED_KEPT`] at most.
#[derive(Debug, Default)]
pub(super) struct Acked(VecDeque<(u64, u64)>);

impl Acked {
    /// Batch `n` was stored at `seq`; the oldest remembered is forgotten past the limit.
    pub(super) fn push(&mut self, n: u64, seq: u64) {
        if self.0.len() == ACKED_KEPT {
            self.0.pop_front();
        }
        self.0.push_back((n, seq));
    }

    /// The sequence batch `n` was stored at, while it is remembered.
    pub(super) fn sequence_of(&self, n: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|(batch, _)| *batch == n)
            .map(|(_, seq)| *seq)
    }
}

#[cfg(test)]
mod tests;
