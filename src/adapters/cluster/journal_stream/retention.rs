//! Stream retention (decision 53), the active member's snapshotter and any member's rebuild:
//! a copy of the journal paired with the stream sequence of the last batch it holds, stored
//! in the site's object store (`snapshots.rs`), the stream purged below the snapshot before;
//! and the local journal replaced by the newest copy when the stream no longer holds what
//! this member lacks.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream;
use async_nats::jetstream::stream::PurgeError;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Inner, JournalStreamError, StreamStats, Writer};
use crate::adapters::cluster::snapshots::{Covered, SnapshotError};
use crate::ports::RebuildError;
use crate::ports::takeover::AdapterError;

/// How long a copy waits for its last batch to be published before it is given up.
const COPY_ACK_WAIT: Duration = Duration::from_secs(30);

/// When the active member snapshots the journal (stream retention, decision 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Snapshot once the stream holds this many bytes (0: never; the stream keeps every
    /// batch).
    pub after_bytes: u64,
    /// How often the active member looks.
    pub check: Duration,
}

impl SnapshotPolicy {
    /// Whether a stream holding `held` bytes, `kept` of them kept at the last purge (the
    /// batches since the snapshot before), is due for a snapshot.
    fn due(&self, held: u64, kept: u64) -> bool {
        self.after_bytes > 0 && held.saturating_sub(kept) >= self.after_bytes
    }
}

/// Why a snapshot was given up (the stream keeps its batches).
#[derive(Debug, thiserror::Error)]
enum SnapshotFailed {
    /// The stream could not be read.
    #[error(transparent)]
    Stream(#[from] JournalStreamError),
    /// The snapshot store could not be read or written.
    #[error(transparent)]
    Store(#[from] SnapshotError),
    /// The journal could not be copied (the journal's error).
    #[error(transparent)]
    Copy(AdapterError),
    /// The stream could not be purged below the snapshot before.
    #[error("cannot purge the journal stream: {0}")]
    Purge(#[source] PurgeError),
    /// A batch stayed local while the copy was made: the copy may hold what the stream
    /// lacks.
    #[error("a batch stayed local meanwhile")]
    KeptLocal,
    /// The copy's last batch was not published within [`COPY_ACK_WAIT`].
    #[error("the copy's last batch was not published in time")]
    NotInTime,
    /// The publisher stopped before it handled the copy's last batch.
    #[error("the publisher stopped")]
    PublisherStopped,
    /// The copy's last batch stayed local, or is no longer remembered.
    #[error("the copy's last batch was not published")]
    NotPublished,
}

/// What the active member purges once a copy covering `covered` is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purge {
    /// Nothing: there is no older snapshot to purge below (the first snapshot); the
    /// stream's bytes now are what it keeps.
    FirstSnapshot,
    /// Nothing yet: the stream would be purged whole (NATS purges every message when asked
    /// to keep from sequence 1).
    Nothing,
    /// Every message below this sequence.
    Below(u64),
}

/// What to purge once a copy covering `covered` is stored, the store's newest copy having
/// been `before` it and the folder having read up to `folded`: below the snapshot before
/// (so a standby folding within a snapshot of the stream's end never has to rebuild), and
/// never past what the folder read.
fn purge(before: Option<Covered>, covered: Covered, folded: u64) -> Purge {
    let Some(before) = before.filter(|b| b.sequence < covered.sequence) else {
        return Purge::FirstSnapshot;
    };
    let keep_from = before.sequence.min(folded) + 1;
    if keep_from <= 1 {
        Purge::Nothing
    } else {
        Purge::Below(keep_from)
    }
}

impl Writer {
    /// The sequence a copy holding the first `handed` batches of the feed covers when it
    /// holds none of this writer's epoch: its claim's. `None` when it holds some (it covers
    /// its last batch's sequence, once published).
    fn covered_by_claim(&self, handed: u64) -> Option<u64> {
        (handed <= self.handed_at_claim).then_some(self.claim_seq)
    }
}

impl Inner {
    /// Replaces the local journal with the newest snapshot (empties it when there is
    /// none), to fold the stream on from what it covers; returns that. This life's batches
    /// are folded again like any other's: the file no longer holds them.
    ///
    /// # Errors
    /// [`RebuildError::Snapshot`] when the newest copy cannot be fetched,
    /// [`RebuildError::Journal`] when the file cannot be replaced (it is then as it was).
    pub(super) async fn rebuild(&self) -> Result<Covered, RebuildError> {
        let _applying = self.applying.lock().await;
        let restore = sibling(self.journal.path(), "restore");
        let fetched = self.snapshots.fetch(&restore).await;
        let rebuilt = match &fetched {
            Ok(Some(_)) => self.journal.restore_from(&restore).await,
            Ok(None) => self.journal.clear().await,
            // Nothing replaced: the fetch's error is the answer.
            Err(_) => Ok(0),
        };
        let _ = tokio::fs::remove_file(&restore).await;
        let covered = fetched
            .map_err(|error| RebuildError::Snapshot(Box::new(error)))?
            .unwrap_or(Covered::NOTHING);
        let open = rebuilt.map_err(|error| RebuildError::Journal(error.into()))?;
        self.own_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.newest_epoch.store(covered.epoch, Ordering::Release);
        self.folded.send_replace(covered.sequence);
        let counters = &self.stats.counters;
        counters
            .folded_seq
            .store(covered.sequence, Ordering::Relaxed);
        counters
            .snapshot_seq
            .store(covered.sequence, Ordering::Relaxed);
        StreamStats::count(&counters.rebuilds);
        self.unclean.store(false, Ordering::Release);
        self.rebuilt.send_modify(|times| *times += 1);
        info!(
            stream_seq = covered.sequence,
            open, "the journal was rebuilt from the site's newest snapshot"
        );
        Ok(covered)
    }

    /// Every `policy.check` while this member writes the stream: a snapshot once the
    /// stream holds `policy.after_bytes`.
    pub(super) async fn snapshot_when_due(self: Arc<Self>, stop: CancellationToken) {
        if self.policy.after_bytes == 0 {
            return;
        }
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(self.policy.check) => {}
            }
            if let Err(error) = self.snapshot_if_due().await {
                StreamStats::count(&self.stats.counters.snapshot_failures);
                warn!(%error, "no snapshot of the journal this time; the stream keeps its batches");
            }
        }
    }

    /// Copies the journal, stores the copy with the stream sequence it covers, and purges
    /// the stream below the snapshot before it (and below what this member's folder read):
    /// the stream keeps the batches since the previous snapshot, so a standby folding within
    /// a snapshot of the stream's end never has to rebuild. Only when this member writes the
    /// stream, its file holds nothing the stream lacks, and `policy.after_bytes` were
    /// appended since its last purge.
    async fn snapshot_if_due(&self) -> Result<(), SnapshotFailed> {
        let writing = self.writer().filter(|w| !w.fenced);
        let Some(writer) = writing.filter(|_| !self.unclean.load(Ordering::Acquire)) else {
            return Ok(());
        };
        let mut stream = self.stream().await?;
        let held = stream_bytes(&mut stream).await?;
        if !self
            .policy
            .due(held, self.kept_bytes.load(Ordering::Acquire))
        {
            return Ok(());
        }
        let before = self.snapshots.newest().await?;
        let copy = sibling(self.journal.path(), "snapshot");
        let stored = self.copy_and_store(&copy, writer).await;
        let _ = tokio::fs::remove_file(&copy).await;
        let covered = stored?;
        let keep_from = match purge(before, covered, *self.folded.borrow()) {
            Purge::FirstSnapshot => {
                self.kept_bytes.store(held, Ordering::Release);
                return Ok(());
            }
            Purge::Nothing => return Ok(()),
            Purge::Below(keep_from) => keep_from,
        };
        stream
            .purge()
            .sequence(keep_from)
            .await
            .map_err(SnapshotFailed::Purge)?;
        self.kept_bytes
            .store(stream_bytes(&mut stream).await?, Ordering::Release);
        info!(
            stream_seq = covered.sequence,
            keep_from,
            "the journal was snapshotted and the stream purged below the snapshot before"
        );
        Ok(())
    }

    /// Copies the journal to `copy`, and stores it as covering the stream up to the last
    /// batch it holds (the claim, when it holds none of this epoch's).
    async fn copy_and_store(&self, copy: &Path, writer: Writer) -> Result<Covered, SnapshotFailed> {
        let handed = self
            .journal
            .snapshot_to(copy)
            .await
            .map_err(|error| SnapshotFailed::Copy(error.into()))?;
        let sequence = match writer.covered_by_claim(handed) {
            Some(claim) => claim,
            None => self.sequence_of(handed).await?,
        };
        if self.unclean.load(Ordering::Acquire) {
            return Err(SnapshotFailed::KeptLocal);
        }
        let covered = Covered {
            sequence,
            epoch: writer.epoch,
        };
        if self.snapshots.put(copy, covered, &self.edge_id).await? {
            let counters = &self.stats.counters;
            StreamStats::count(&counters.snapshots);
            counters.snapshot_seq.store(sequence, Ordering::Relaxed);
        }
        Ok(covered)
    }

    /// The stream sequence batch `n` of the feed was stored at, once the publisher handled
    /// it.
    async fn sequence_of(&self, n: u64) -> Result<u64, SnapshotFailed> {
        let mut handled = self.handled.subscribe();
        tokio::time::timeout(COPY_ACK_WAIT, handled.wait_for(|at| *at >= n))
            .await
            .map_err(|_| SnapshotFailed::NotInTime)?
            .map_err(|_| SnapshotFailed::PublisherStopped)?;
        let acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        acked.sequence_of(n).ok_or(SnapshotFailed::NotPublished)
    }
}

/// The bytes `stream` holds now.
async fn stream_bytes(stream: &mut jetstream::stream::Stream) -> Result<u64, JournalStreamError> {
    stream
        .info()
        .await
        .map(|info| info.state.bytes)
        .map_err(JournalStreamError::Info)
}

/// `<journal file>.<suffix>`, beside it.
fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(sequence: u64) -> Covered {
        Covered { sequence, epoch: 3 }
    }

    #[test]
    fn a_stream_is_due_once_it_grew_by_the_policys_bytes_since_the_last_purge() {
        let policy = SnapshotPolicy {
            after_bytes: 100,
            check: Duration::from_secs(30),
        };
        assert!(!policy.due(99, 0));
        assert!(policy.due(100, 0));
        assert!(
            !policy.due(150, 60),
            "what the last purge kept does not count"
        );
        assert!(policy.due(160, 60));
        assert!(!policy.due(10, 60), "smaller than what was kept: not due");
        let never = SnapshotPolicy {
            after_bytes: 0,
            ..policy
        };
        assert!(!never.due(u64::MAX, 0), "0: the stream keeps every batch");
    }

    #[test]
    fn the_stream_is_purged_below_the_snapshot_before_and_never_whole() {
        assert_eq!(purge(None, at(40), 40), Purge::FirstSnapshot);
        assert_eq!(
            purge(Some(at(40)), at(40), 40),
            Purge::FirstSnapshot,
            "the store held this copy already"
        );
        assert_eq!(purge(Some(at(20)), at(40), 40), Purge::Below(21));
        assert_eq!(
            purge(Some(at(20)), at(40), 12),
            Purge::Below(13),
            "never past what the folder read"
        );
        assert_eq!(purge(Some(at(0)), at(40), 40), Purge::Nothing);
        assert_eq!(purge(Some(at(20)), at(40), 0), Purge::Nothing);
    }

    #[test]
    fn a_copy_holding_no_batch_of_this_epoch_covers_the_claim() {
        let writer = Writer {
            epoch: 7,
            last_seq: 50,
            fenced: false,
            gave_up: false,
            claim_seq: 44,
            handed_at_claim: 12,
        };
        assert_eq!(writer.covered_by_claim(12), Some(44));
        assert_eq!(writer.covered_by_claim(3), Some(44));
        assert_eq!(
            writer.covered_by_claim(13),
            None,
            "its last batch's sequence"
        );
    }

    #[test]
    fn a_given_up_snapshot_says_why_as_before() {
        for (failed, text) in [
            (SnapshotFailed::KeptLocal, "a batch stayed local meanwhile"),
            (
                SnapshotFailed::NotInTime,
                "the copy's last batch was not published in time",
            ),
            (SnapshotFailed::PublisherStopped, "the publisher stopped"),
            (
                SnapshotFailed::NotPublished,
                "the copy's last batch was not published",
            ),
            (
                SnapshotFailed::Copy("the journal's writer has stopped".into()),
                "the journal's writer has stopped",
            ),
        ] {
            assert_eq!(failed.to_string(), text);
        }
    }

    #[test]
    fn a_copy_and_a_restore_sit_beside_the_journal() {
        let file = Path::new("/var/lib/edge/journal.sqlite");
        assert_eq!(
            sibling(file, "snapshot"),
            Path::new("/var/lib/edge/journal.sqlite.snapshot")
        );
    }

    proptest! {
        #[test]
        fn a_purge_keeps_every_batch_after_the_snapshot_before_and_what_the_folder_has_not_read(
            before in proptest::option::of(0_u64..100),
            covered in 0_u64..100,
            folded in 0_u64..100,
        ) {
            match purge(before.map(at), at(covered), folded) {
                Purge::FirstSnapshot => {
                    prop_assert!(before.is_none_or(|before| before >= covered));
                }
                Purge::Nothing => prop_assert!(before.is_some_and(|b| b.min(folded) == 0)),
                Purge::Below(keep_from) => {
                    let before = before.unwrap_or_default();
                    prop_assert!(keep_from > 1, "never the whole stream");
                    prop_assert!(keep_from <= before + 1 && keep_from <= folded + 1);
                    prop_assert!(keep_from == before + 1 || keep_from == folded + 1);
                }
            }
        }
    }
}
