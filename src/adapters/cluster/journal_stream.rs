//! The site's journal of record: a JetStream stream (`edge-<site>-journal`) holding every
//! batch the active member's journal wrote, one message per batch (decision 49).
//!
//! Two owned tasks per member: the **publisher** takes the batches the journal's writer
//! hands over while this member writes the stream, sends each with a `Nats-Msg-Id` of
//! `<edge id>-<epoch>-<n>` (a retry after a lost answer is de-duplicated by the stream) and
//! the sequence it expects the stream to end at (`Nats-Expected-Last-Sequence`), and tells
//! the journal once the stream acknowledged it — only then does a flush that waits for it
//! return, so a node forgets no event the stream does not hold. The **folder** reads the
//! stream from its start with an ordered consumer and applies every batch another member
//! (or an earlier life of this one) wrote to the local journal, which is a cache of the
//! stream; its own batches of this life it skips (they are written already). A batch that
//! does not decode is skipped with a warning, never applied in part.
//!
//! Single writer (decision 50): a member taking over appends a *claim* (an empty batch
//! under its epoch) at the sequence it caught up to, and from then on appends each batch
//! at the sequence after its last. A member fenced since — another claimed after it — has
//! its next batch refused by the stream; it appends nothing more under that epoch and says
//! so ([`JournalStream::fenced`]), so its lease stands it down. Every member therefore
//! folds the same batches in the same order.
//!
//! Retention (decision 53, `retention.rs`): the active member's third task, the
//! **snapshotter**, copies its journal once `snapshot_after_bytes` were appended since its
//! last purge, at a batch boundary it pairs with the stream sequence of the last batch in the
//! copy, stores the copy in the site's object store (`snapshots.rs`) and purges the stream
//! below the snapshot before it. A member whose folder finds the stream starting past what it
//! folded (it started with an empty file, or stood by while the stream was purged) replaces
//! its file with the newest copy and folds on from there; so does a member taking over whose
//! file holds batches the stream lacks (it acted before in this life: what it wrote after it
//! stood down, or a batch the stream refused).
//!
//! What the tasks decide apart from their I/O — which batches are folded in which order,
//! where a fold starts, when a member may claim the stream — is the domain's
//! (`crate::domain::site`, model-checked with the lease's rules); a batch's id and headers
//! and what an append's answer means are `rules.rs`.
//!
//! It decides nothing about who acts: its [`SiteStream`] side is what a member taking over
//! waits on before it acts (`crate::app::takeover`).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::{self, pull::OrderedError};
use async_nats::jetstream::context::{CreateStreamError, PublishError, RequestError};
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::stream::ConsumerError;
use async_nats::jetstream::{self, message::PublishMessage};
use async_trait::async_trait;
use futures::StreamExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::snapshots::Snapshots;
use crate::adapters::journal::{ReplicaBatch, ReplicaFeed, SqliteJournal, empty_batch};
use crate::ports::{ClaimError, RebuildError, RunJournal, SiteStream};

mod retention;
mod rules;

use crate::domain::site::{self, Next, Start, Verdict, verdict};
pub use retention::SnapshotPolicy;
use rules::{Acked, Appended, Origin};

/// How long the tasks wait before trying NATS again after a failure.
const RETRY: Duration = Duration::from_millis(250);

/// How long one pull of the folder's consumer waits for messages.
const PULL_EXPIRES: Duration = Duration::from_secs(2);

/// Why the site's journal stream could not be read (or written).
#[derive(Debug, thiserror::Error)]
enum JournalStreamError {
    /// The stream could be neither found nor created.
    #[error("cannot open the journal stream {stream}: {source}")]
    Open {
        /// The stream.
        stream: String,
        /// NATS's answer.
        #[source]
        source: CreateStreamError,
    },
    /// Its state could not be read.
    #[error("cannot read the journal stream: {0}")]
    Info(#[source] RequestError),
    /// A consumer could not be created on it.
    #[error("cannot read the journal stream: {0}")]
    Consumer(#[source] ConsumerError),
    /// Its messages could not be asked for.
    #[error("cannot read the journal stream: {0}")]
    Messages(#[source] consumer::StreamError),
    /// A message could not be pulled.
    #[error(transparent)]
    Pull(OrderedError),
    /// A message came past the one after the last folded: the stream was purged under the
    /// consumer.
    #[error("the journal stream skipped from {folded} to {seq} (purged meanwhile)")]
    Skipped {
        /// The last sequence folded.
        folded: u64,
        /// The sequence that came.
        seq: u64,
    },
    /// The stream starts past the newest snapshot: neither holds the batches between.
    #[error(
        "the site's journal stream starts at {first}, past its newest snapshot ({snapshot}): \
         the batches in between are lost to this member until a newer snapshot is stored"
    )]
    PastSnapshot {
        /// The stream's first sequence.
        first: u64,
        /// The sequence the newest snapshot covers.
        snapshot: u64,
    },
    /// The folder stopped while a takeover waited for it.
    #[error("the journal stream's folder stopped")]
    FolderStopped,
    /// The journal could not be rebuilt from the newest snapshot.
    #[error(transparent)]
    Rebuild(#[from] RebuildError),
}

/// What the stream's tasks did, for the metrics export. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct StreamStats {
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    published: AtomicU64,
    publish_failures: AtomicU64,
    refused: AtomicU64,
    kept_local: AtomicU64,
    folded: AtomicU64,
    skipped_own: AtomicU64,
    skipped_stale: AtomicU64,
    undecodable: AtomicU64,
    folded_seq: AtomicU64,
    snapshots: AtomicU64,
    snapshot_failures: AtomicU64,
    rebuilds: AtomicU64,
    snapshot_seq: AtomicU64,
}

impl StreamStats {
    /// Batches (claims included) the stream acknowledged.
    pub fn published(&self) -> u64 {
        self.counters.published.load(Ordering::Relaxed)
    }

    /// Appends that failed (no answer, or an error other than a refusal) and were tried
    /// again.
    pub fn publish_failures(&self) -> u64 {
        self.counters.publish_failures.load(Ordering::Relaxed)
    }

    /// Batches the stream refused: another member claimed it (this one was fenced).
    pub fn refused(&self) -> u64 {
        self.counters.refused.load(Ordering::Relaxed)
    }

    /// Batches kept in this member's file only: refused, or not published before it stood
    /// down.
    pub fn kept_local(&self) -> u64 {
        self.counters.kept_local.load(Ordering::Relaxed)
    }

    /// Batches of other members (or earlier lives) applied to the local journal.
    pub fn folded(&self) -> u64 {
        self.counters.folded.load(Ordering::Relaxed)
    }

    /// Batches skipped as this life's own.
    pub fn skipped_own(&self) -> u64 {
        self.counters.skipped_own.load(Ordering::Relaxed)
    }

    /// Batches skipped as written under an epoch older than one folded.
    pub fn skipped_stale(&self) -> u64 {
        self.counters.skipped_stale.load(Ordering::Relaxed)
    }

    /// Batches skipped because they do not decode.
    pub fn undecodable(&self) -> u64 {
        self.counters.undecodable.load(Ordering::Relaxed)
    }

    /// The stream sequence of the last message the folder handled.
    pub fn folded_sequence(&self) -> u64 {
        self.counters.folded_seq.load(Ordering::Relaxed)
    }

    /// Snapshots of the journal this member stored.
    pub fn snapshots(&self) -> u64 {
        self.counters.snapshots.load(Ordering::Relaxed)
    }

    /// Snapshots begun and given up (the copy, the store or the purge failed).
    pub fn snapshot_failures(&self) -> u64 {
        self.counters.snapshot_failures.load(Ordering::Relaxed)
    }

    /// Times this member replaced its file with the newest snapshot (or emptied it, with
    /// none) to fold the stream on from there.
    pub fn rebuilds(&self) -> u64 {
        self.counters.rebuilds.load(Ordering::Relaxed)
    }

    /// The stream sequence the last snapshot this member stored or rebuilt from covers.
    pub fn snapshot_sequence(&self) -> u64 {
        self.counters.snapshot_seq.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Told how long each batch took from its first append to the stream's acknowledgement.
pub type AckLatency = Box<dyn Fn(Duration) + Send + Sync>;

/// A member's end of the site's journal stream.
#[derive(Clone)]
pub struct JournalStream {
    inner: Arc<Inner>,
}

struct Inner {
    js: jetstream::Context,
    stream: String,
    subject: String,
    replicas: usize,
    edge_id: String,
    journal: Arc<SqliteJournal>,
    /// Where this member appends, once it claimed the stream ([`JournalStream::write_as`]).
    writer: Mutex<Option<Writer>>,
    /// The epoch under which the stream last refused this member's batch (0: never).
    fenced: watch::Sender<u64>,
    /// The epochs this life of the member published under: its own batches to skip.
    own_epochs: Mutex<HashSet<u64>>,
    /// The stream sequence of the last message the folder handled (applied or skipped).
    folded: watch::Sender<u64>,
    /// The highest stream sequence this member saw stored (folded, or acknowledged to its
    /// own appends), across rebuilds: a stream found ending before it lost acknowledged
    /// batches ([`JournalStream::catch_up`] says so).
    seen: AtomicU64,
    /// The highest epoch among the batches folded: one written under a lower epoch comes
    /// from a member that ignores the claims (an edge of another version), and is skipped.
    newest_epoch: AtomicU64,
    stats: StreamStats,
    /// Set once by [`JournalStream::on_ack`].
    ack_latency: OnceLock<AckLatency>,
    snapshots: Snapshots,
    policy: SnapshotPolicy,
    /// Held while a batch is applied and the fold's position moves, and while the file is
    /// replaced: the two never interleave.
    applying: tokio::sync::Mutex<()>,
    /// How many batches of the feed the publisher has handled (published or kept local).
    handled: watch::Sender<u64>,
    /// How many times the file was rebuilt: a read of the stream begun before starts over.
    rebuilt: watch::Sender<u64>,
    /// The stream sequences of the latest published batches, by their number in the feed.
    acked: Mutex<Acked>,
    /// The file holds batches the stream lacks (this member stood down, or kept a batch
    /// local): it takes no snapshot, and rebuilds its file before it takes over again.
    unclean: AtomicBool,
    /// The stream's bytes right after this member's last purge: the batches kept since the
    /// snapshot before, which do not count toward the next one.
    kept_bytes: AtomicU64,
    /// Whether its replicas were compared with the config's yet.
    replicas_checked: AtomicBool,
}

/// Where this member appends to the stream: under `epoch`, after `last_seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Writer {
    epoch: u64,
    /// The stream's last sequence as this member knows it: its claim's, then each ack's.
    last_seq: u64,
    /// The stream refused a batch at `last_seq`: another member claimed it since.
    fenced: bool,
    /// A batch of this writer stayed local (not published before its member stood down):
    /// every later one stays local too, or the stream would hold this writer's batches with
    /// one missing in between — a run's events without those in the batch left out (the
    /// fourth 30-minute nemesis, seed 6601, on nats-server 2.12.8).
    gave_up: bool,
    /// The claim's sequence, and how many batches the journal had handed over by then.
    claim_seq: u64,
    handed_at_claim: u64,
}

/// The running tasks of a [`JournalStream`].
pub struct JournalStreamTasks {
    stop: CancellationToken,
    publisher: JoinHandle<()>,
    folder: JoinHandle<()>,
    snapshotter: JoinHandle<()>,
}

impl JournalStream {
    /// The stream of `site` (with `replicas`), for member `edge_id` whose journal is
    /// `journal`, snapshotted as `policy` says.
    pub fn new(
        js: jetstream::Context,
        site: &str,
        replicas: usize,
        edge_id: String,
        journal: Arc<SqliteJournal>,
        policy: SnapshotPolicy,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                snapshots: Snapshots::new(js.clone(), site, replicas),
                policy,
                applying: tokio::sync::Mutex::new(()),
                handled: watch::Sender::new(0),
                rebuilt: watch::Sender::new(0),
                acked: Mutex::new(Acked::default()),
                unclean: AtomicBool::new(false),
                kept_bytes: AtomicU64::new(0),
                replicas_checked: AtomicBool::new(false),
                js,
                stream: format!("edge-{site}-journal"),
                subject: format!("edge.{site}.journal"),
                replicas,
                edge_id,
                journal,
                writer: Mutex::new(None),
                fenced: watch::Sender::new(0),
                own_epochs: Mutex::new(HashSet::new()),
                folded: watch::Sender::new(0),
                seen: AtomicU64::new(0),
                newest_epoch: AtomicU64::new(0),
                stats: StreamStats::default(),
                ack_latency: OnceLock::new(),
            }),
        }
    }

    /// What the stream's tasks did so far.
    pub fn stats(&self) -> StreamStats {
        self.inner.stats.clone()
    }

    /// Tells `latency` how long each published batch took from its first append to the
    /// stream's acknowledgement (once; a second call changes nothing).
    pub fn on_ack(&self, latency: AckLatency) {
        let _ = self.inner.ack_latency.set(latency);
    }

    /// Starts the publisher (fed by `feed`) and the folder; they end on
    /// [`JournalStreamTasks::stop`], the publisher once the journal closed and every batch
    /// it wrote is in the stream.
    pub fn start(&self, feed: ReplicaFeed) -> JournalStreamTasks {
        let stop = CancellationToken::new();
        let publisher = tokio::spawn(Arc::clone(&self.inner).publish(feed, stop.clone()));
        let folder = tokio::spawn(Arc::clone(&self.inner).fold(stop.clone()));
        let snapshotter = tokio::spawn(Arc::clone(&self.inner).snapshot_when_due(stop.clone()));
        JournalStreamTasks {
            stop,
            publisher,
            folder,
            snapshotter,
        }
    }

    /// Waits until the local journal holds every batch the stream held when called, and
    /// has written it; the stream's last sequence then. A stream that ends before a batch
    /// this member saw stored has lost batches NATS acknowledged: said as an error (the
    /// nemesis saw nats-server 2.9.10 do so, issue 66), and the takeover goes on from what
    /// the stream holds.
    async fn catch_up(&self) -> Result<u64, JournalStreamError> {
        let inner = &self.inner;
        let mut stream = inner.stream().await?;
        let last = stream
            .info()
            .await
            .map_err(JournalStreamError::Info)?
            .state
            .last_sequence;
        let seen = inner.seen.load(Ordering::Acquire);
        if last < seen {
            error!(
                stream = inner.stream,
                last_sequence = last,
                seen,
                "the site's journal stream ends before a batch this member saw stored: NATS \
                 lost batches it had acknowledged (runs in them are unknown to the site)"
            );
        }
        let mut folded = inner.folded.subscribe();
        folded
            .wait_for(|seq| *seq >= last)
            .await
            .map_err(|_| JournalStreamError::FolderStopped)?;
        inner.journal.flush().await;
        Ok(last)
    }
}

#[async_trait]
impl SiteStream for JournalStream {
    fn holds_unpublished(&self) -> bool {
        self.inner.unclean.load(Ordering::Acquire)
    }

    async fn rebuild(&self) -> Result<(), RebuildError> {
        self.inner.rebuild().await.map(|_covered| ())
    }

    /// Appends a claim (an empty batch under `epoch`) once caught up, expecting the stream
    /// to end there — another batch that came in meanwhile is folded and the claim tried
    /// again. From then on each batch is expected right after the last, so a member that
    /// wrote before the claim can append nothing after it.
    async fn claim(&self, epoch: u64) -> Result<u64, ClaimError> {
        let inner = &self.inner;
        inner
            .own_epochs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(epoch);
        let id = rules::claim_id(&inner.edge_id, epoch);
        let claim = empty_batch();
        loop {
            let last = self
                .catch_up()
                .await
                .map_err(|error| ClaimError::Stream(Box::new(error)))?;
            let newest = inner.newest_epoch.load(Ordering::Acquire);
            if !site::may_claim(newest, epoch) {
                return Err(ClaimError::NewerEpoch { newest, epoch });
            }
            let claimed = loop {
                match Appended::of(inner.append(&claim, &id, epoch, last).await) {
                    Appended::At(seq) => break Some(seq),
                    Appended::Refused => break None,
                    // The same claim again: a duplicate is answered with its sequence.
                    Appended::Failed(_) => {
                        StreamStats::count(&inner.stats.counters.publish_failures);
                        tokio::time::sleep(RETRY).await;
                    }
                }
            };
            if let Some(seq) = claimed {
                StreamStats::count(&inner.stats.counters.published);
                let writer = Writer {
                    epoch,
                    last_seq: seq,
                    fenced: false,
                    gave_up: false,
                    claim_seq: seq,
                    handed_at_claim: inner.journal.handed(),
                };
                *inner.writer.lock().unwrap_or_else(|p| p.into_inner()) = Some(writer);
                inner.journal.set_publishing(true);
                return Ok(seq);
            }
        }
    }

    /// Those batches already handed over are still published under the epoch they were
    /// written in.
    fn stop_writing(&self) {
        self.inner.journal.set_publishing(false);
        self.inner.unclean.store(true, Ordering::Release);
    }

    async fn fenced(&self, epoch: u64) {
        let mut fenced = self.inner.fenced.subscribe();
        if fenced.wait_for(|at| *at == epoch).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl JournalStreamTasks {
    /// Stops folding, and waits for the publisher to have published what the (closed)
    /// journal wrote, for `grace` at most.
    pub async fn stop(mut self, grace: Duration) {
        self.folder.abort();
        self.snapshotter.abort();
        if tokio::time::timeout(grace, &mut self.publisher)
            .await
            .is_err()
        {
            warn!("the journal stream's publisher did not finish in time");
            self.stop.cancel();
            let _ = self.publisher.await;
        }
        self.stop.cancel();
    }
}

impl Inner {
    /// The stream, created when absent (file storage, every batch kept); the first time,
    /// a warning when it holds fewer replicas than the config asks.
    async fn stream(&self) -> Result<jetstream::stream::Stream, JournalStreamError> {
        let stream = self.open_stream().await?;
        if !self.replicas_checked.swap(true, Ordering::AcqRel) {
            let found = stream.cached_info().config.num_replicas;
            super::replicas::warn_if_fewer(&self.stream, found, self.replicas);
        }
        Ok(stream)
    }

    async fn open_stream(&self) -> Result<jetstream::stream::Stream, JournalStreamError> {
        let config = jetstream::stream::Config {
            name: self.stream.clone(),
            description: Some("the edge site's journal of record".to_owned()),
            subjects: vec![self.subject.clone()],
            storage: jetstream::stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: Duration::from_secs(120),
            ..jetstream::stream::Config::default()
        };
        self.js
            .get_or_create_stream(config)
            .await
            .map_err(|source| JournalStreamError::Open {
                stream: self.stream.clone(),
                source,
            })
    }

    /// Appends `bytes` as message `id` under `epoch`, expecting the stream to end at
    /// `last_seq`.
    async fn append(
        &self,
        bytes: &[u8],
        id: &str,
        epoch: u64,
        last_seq: u64,
    ) -> Result<PublishAck, PublishError> {
        let message = PublishMessage::build()
            .payload(bytes.to_vec().into())
            .headers(rules::signed(&self.edge_id, epoch))
            .message_id(id)
            .expected_last_sequence(last_seq);
        self.js
            .send_publish(self.subject.clone(), message)
            .await?
            .await
    }

    fn writer(&self) -> Option<Writer> {
        *self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this member writes the stream now (claimed it, not fenced since).
    fn writes(&self) -> bool {
        self.writer().is_some_and(|w| !w.fenced) && self.journal.publishing()
    }

    /// Sets what the writer `was` became, unless another claim replaced it meanwhile;
    /// whether it was still the writer.
    fn update_writer(&self, was: Writer, now: Writer) -> bool {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let current = writer.is_some_and(|w| w.epoch == was.epoch);
        if current {
            *writer = Some(now);
        }
        current
    }

    async fn publish(self: Arc<Self>, mut feed: ReplicaFeed, stop: CancellationToken) {
        let mut n: u64 = 0;
        while let Some(batch) = feed.next().await {
            n += 1;
            // Stopped without NATS, or fenced, the batch stays local: its flush is released
            // all the same.
            match self.publish_one(&batch, n, &stop).await {
                Some(seq) => self
                    .acked
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(n, seq),
                None => self.unclean.store(true, Ordering::Release),
            }
            self.handled.send_replace(n);
            feed.acknowledged(&batch);
        }
    }

    /// Appends `batch` (the `n`th) after the last sequence this member knows, trying again
    /// until the stream stores or refuses it, or this member stopped writing. Returns the
    /// sequence it was stored at; `None` when it stays local.
    async fn publish_one(
        &self,
        batch: &ReplicaBatch,
        n: u64,
        stop: &CancellationToken,
    ) -> Option<u64> {
        let counters = &self.stats.counters;
        // A batch handed over before the writer's claim is of an earlier acting period; one
        // after a batch the writer gave up on would leave a hole.
        let current = |w: &Writer| !w.fenced && !w.gave_up && site::publishes(n, w.handed_at_claim);
        let Some(writer) = self.writer().filter(current) else {
            StreamStats::count(&counters.kept_local);
            return None;
        };
        let id = rules::batch_id(&self.edge_id, writer.epoch, n);
        let started = Instant::now();
        let mut warned = false;
        loop {
            let answer = self
                .append(&batch.bytes, &id, writer.epoch, writer.last_seq)
                .await;
            let error = match Appended::of(answer) {
                Appended::At(seq) => {
                    self.seen.fetch_max(seq, Ordering::AcqRel);
                    StreamStats::count(&counters.published);
                    if let Some(latency) = self.ack_latency.get() {
                        latency(started.elapsed());
                    }
                    let now = Writer {
                        last_seq: seq,
                        ..writer
                    };
                    self.update_writer(writer, now);
                    return Some(seq);
                }
                Appended::Refused => {
                    StreamStats::count(&counters.refused);
                    StreamStats::count(&counters.kept_local);
                    self.fence(writer, &id);
                    return None;
                }
                Appended::Failed(error) => error,
            };
            StreamStats::count(&counters.publish_failures);
            let claimed_since = self.writer().is_none_or(|w| w.epoch != writer.epoch);
            if !self.journal.publishing() || claimed_since {
                // Stood down meanwhile (and maybe acting again under a new claim): the
                // member that acts now writes the stream, under its own epoch.
                warn!(%error, batch = id, "a journal batch not published before this member stood down: kept local only (and every later one of this acting period)");
                StreamStats::count(&counters.kept_local);
                self.update_writer(
                    writer,
                    Writer {
                        gave_up: true,
                        ..writer
                    },
                );
                return None;
            }
            if !warned {
                warned = true;
                warn!(%error, batch = id, "cannot publish a journal batch; trying again");
            }
            tokio::select! {
                () = stop.cancelled() => return None,
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// The stream refused a batch `writer` appended: another member claimed the stream
    /// after this one (it acquired the site's lease since). Nothing more is appended under
    /// this epoch; the lease hears of it and stands this member down.
    fn fence(&self, writer: Writer, id: &str) {
        warn!(
            epoch = writer.epoch,
            last_seq = writer.last_seq,
            batch = id,
            "the site's journal refused a batch: another member writes it now; this member \
             stops writing it (what it wrote since stays local) and stands by"
        );
        let now = Writer {
            fenced: true,
            ..writer
        };
        // A refusal of an earlier writer's batch (this member claimed again since) fences
        // nothing the member does now.
        if self.update_writer(writer, now) {
            self.journal.set_publishing(false);
            self.fenced.send_replace(writer.epoch);
        }
    }

    async fn fold(self: Arc<Self>, stop: CancellationToken) {
        loop {
            match self.fold_from_start().await {
                Ok(()) => {}
                Err(error) => warn!(%error, "the journal stream cannot be folded; trying again"),
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(RETRY) => {}
            }
        }
    }

    /// Reads the stream from past what was folded, applying each batch in order. A stream
    /// that starts past what was folded (purged below a snapshot) is folded on from the
    /// newest snapshot; a batch missing in between ends the read (the next one starts
    /// with that check).
    async fn fold_from_start(&self) -> Result<(), JournalStreamError> {
        let mut stream = self.stream().await?;
        let from = self.fold_start(&mut stream).await?;
        let config = jetstream::consumer::pull::OrderedConfig {
            filter_subject: self.subject.clone(),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            // Short pulls, so a connection lost under a pull is noticed (two missed idle
            // heartbeats, half of this each) in seconds rather than the client's default 30.
            max_expires: PULL_EXPIRES,
            ..Default::default()
        };
        let consumer = stream
            .create_consumer(config)
            .await
            .map_err(JournalStreamError::Consumer)?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(JournalStreamError::Messages)?;
        info!(stream = %self.stream, from, "folding the site's journal stream");
        let mut rebuilt = self.rebuilt.subscribe();
        let mut idle =
            tokio::time::interval_at(tokio::time::Instant::now() + PULL_EXPIRES, PULL_EXPIRES);
        idle.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut delivered = false;
        loop {
            let message = tokio::select! {
                message = messages.next() => message,
                // Rebuilt meanwhile: read again from what the new file covers.
                _ = rebuilt.changed() => return Ok(()),
                _ = idle.tick() => {
                    if !std::mem::take(&mut delivered) && self.behind(&mut stream).await {
                        // Sent to a connection lost since: the consumer counts it delivered
                        // and would not notice before the next message. Read again.
                        return Ok(());
                    }
                    continue;
                }
            };
            delivered = true;
            let Some(message) = message else {
                break;
            };
            let message = message.map_err(JournalStreamError::Pull)?;
            let Ok(seq) = message.info().map(|info| info.stream_sequence) else {
                continue;
            };
            let _applying = self.applying.lock().await;
            let folded = *self.folded.borrow();
            match site::next(seq, folded, self.writes()) {
                Next::Handled => continue,
                Next::Gap => return Err(JournalStreamError::Skipped { folded, seq }),
                Next::Fold => {}
            }
            self.apply(&message, seq);
            self.folded.send_replace(seq);
            self.seen.fetch_max(seq, Ordering::AcqRel);
            self.stats.counters.folded_seq.store(seq, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Whether the stream holds a batch past what was folded.
    async fn behind(&self, stream: &mut jetstream::stream::Stream) -> bool {
        let folded = *self.folded.borrow();
        stream
            .info()
            .await
            .is_ok_and(|info| info.state.last_sequence > folded)
    }

    /// Where to read the stream from: past what was folded, after a rebuild from the newest
    /// snapshot when the stream starts past that.
    async fn fold_start(
        &self,
        stream: &mut jetstream::stream::Stream,
    ) -> Result<u64, JournalStreamError> {
        let first = stream
            .info()
            .await
            .map_err(JournalStreamError::Info)?
            .state
            .first_sequence;
        let folded = *self.folded.borrow();
        match site::start(first, folded, self.writes()) {
            Start::Next => {}
            Start::First => {
                warn!(
                    first,
                    folded,
                    "the site's journal stream starts past what this member read; it writes the stream, so it reads on"
                );
                return Ok(first);
            }
            Start::Snapshot => {
                let covered = self.rebuild().await?;
                if !covered.reaches(first) {
                    return Err(JournalStreamError::PastSnapshot {
                        first,
                        snapshot: covered.sequence,
                    });
                }
            }
        }
        Ok(*self.folded.borrow() + 1)
    }

    /// Applies the batch at `seq` unless this life of the member wrote it or it is stale
    /// (see [`verdict`]).
    fn apply(&self, message: &jetstream::Message, seq: u64) {
        let Origin { edge, epoch } = Origin::of(message.headers.as_ref());
        let newest = self
            .newest_epoch
            .fetch_max(epoch.unwrap_or(0), Ordering::AcqRel);
        let own = self.own_epochs.lock().unwrap_or_else(|p| p.into_inner());
        let counters = &self.stats.counters;
        match verdict(edge.as_deref(), epoch, &self.edge_id, &own, newest) {
            Verdict::Own => StreamStats::count(&counters.skipped_own),
            Verdict::Stale => {
                StreamStats::count(&counters.skipped_stale);
                warn!(
                    seq,
                    ?epoch,
                    newest,
                    "a journal batch of an older epoch (a member fenced since) is skipped"
                );
            }
            Verdict::Apply => {
                drop(own);
                match self.journal.apply_replica(&message.payload) {
                    Ok(_) => StreamStats::count(&counters.folded),
                    Err(error) => {
                        StreamStats::count(&counters.undecodable);
                        warn!(seq, %error, "a journal batch from the stream is skipped");
                    }
                }
            }
        }
    }
}
