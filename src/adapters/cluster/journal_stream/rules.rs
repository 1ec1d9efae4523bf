//! The stream's tasks' bookkeeping in NATS's terms (decisions 49, 50 and 53): how a batch
//! is named and signed (its `Nats-Msg-Id`, the headers saying who wrote it under which
//! epoch), what the stream's answer to an append means, and which published batches it
//! remembers the sequence of. Which batches the folder applies, in which order and from
//! where, and when a member may claim the stream, are the domain's (`crate::domain::site`).
//! No I/O, no clock.

use std::collections::VecDeque;

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
