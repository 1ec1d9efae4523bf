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
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Inner, StreamStats, Writer};
use crate::adapters::cluster::snapshots::Covered;

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

impl Inner {
    /// Replaces the local journal with the newest snapshot (empties it when there is
    /// none), to fold the stream on from what it covers; returns that. This life's batches
    /// are folded again like any other's: the file no longer holds them.
    pub(super) async fn rebuild(&self) -> Result<Covered, String> {
        let _applying = self.applying.lock().await;
        let restore = sibling(self.journal.path(), "restore");
        let fetched = self.snapshots.fetch(&restore).await;
        let rebuilt = match &fetched {
            Ok(Some(_)) => self
                .journal
                .restore_from(&restore)
                .await
                .map_err(|e| e.to_string()),
            Ok(None) => self.journal.clear().await.map_err(|e| e.to_string()),
            Err(error) => Err(error.clone()),
        };
        let _ = tokio::fs::remove_file(&restore).await;
        let open = rebuilt?;
        let covered = fetched?.unwrap_or(Covered {
            sequence: 0,
            epoch: 0,
        });
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
    async fn snapshot_if_due(&self) -> Result<(), String> {
        let writing = self.writer().filter(|w| !w.fenced);
        let Some(writer) = writing.filter(|_| !self.unclean.load(Ordering::Acquire)) else {
            return Ok(());
        };
        let mut stream = self.stream().await?;
        let held = stream_bytes(&mut stream).await?;
        let kept = self.kept_bytes.load(Ordering::Acquire);
        if held.saturating_sub(kept) < self.policy.after_bytes {
            return Ok(());
        }
        let before = self.snapshots.newest().await?;
        let copy = sibling(self.journal.path(), "snapshot");
        let stored = self.copy_and_store(&copy, writer).await;
        let _ = tokio::fs::remove_file(&copy).await;
        let covered = stored?;
        let Some(before) = before.filter(|b| b.sequence < covered.sequence) else {
            // The first snapshot: nothing before it to purge below.
            self.kept_bytes.store(held, Ordering::Release);
            return Ok(());
        };
        let keep_from = before.sequence.min(*self.folded.borrow()) + 1;
        // NATS purges the whole stream when asked to keep from sequence 1 (or 0).
        if keep_from <= 1 {
            return Ok(());
        }
        stream
            .purge()
            .sequence(keep_from)
            .await
            .map_err(|error| format!("cannot purge the journal stream: {error}"))?;
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
    async fn copy_and_store(&self, copy: &Path, writer: Writer) -> Result<Covered, String> {
        let handed = self
            .journal
            .snapshot_to(copy)
            .await
            .map_err(|error| error.to_string())?;
        let sequence = if handed <= writer.handed_at_claim {
            writer.claim_seq
        } else {
            self.sequence_of(handed).await?
        };
        if self.unclean.load(Ordering::Acquire) {
            return Err("a batch stayed local meanwhile".to_owned());
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
    async fn sequence_of(&self, n: u64) -> Result<u64, String> {
        let mut handled = self.handled.subscribe();
        tokio::time::timeout(COPY_ACK_WAIT, handled.wait_for(|at| *at >= n))
            .await
            .map_err(|_| "the copy's last batch was not published in time".to_owned())?
            .map_err(|_| "the publisher stopped".to_owned())?;
        let acked = self.acked.lock().unwrap_or_else(|p| p.into_inner());
        acked
            .iter()
            .find(|(batch, _)| *batch == n)
            .map(|(_, seq)| *seq)
            .ok_or_else(|| "the copy's last batch was not published".to_owned())
    }
}

/// The bytes `stream` holds now.
async fn stream_bytes(stream: &mut jetstream::stream::Stream) -> Result<u64, String> {
    stream
        .info()
        .await
        .map(|info| info.state.bytes)
        .map_err(|error| format!("cannot read the journal stream: {error}"))
}

/// `<journal file>.<suffix>`, beside it.
fn sibling(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}
