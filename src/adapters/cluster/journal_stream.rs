//! The site's journal of record: a JetStream stream (`edge-<site>-journal`) holding every
//! batch the active member's journal wrote, one message per batch (decision 49).
//!
//! Two owned tasks per member: the **publisher** takes the batches the journal's writer
//! hands over while this member publishes, sends each with a `Nats-Msg-Id` of
//! `<edge id>-<epoch>-<n>` (a retry after a lost answer is de-duplicated by the stream), and
//! tells the journal once the stream acknowledged it — only then does a flush that waits
//! for it return, so a node forgets no event the stream does not hold. The **folder** reads
//! the stream from its start with an ordered consumer and applies every batch another
//! member (or an earlier life of this one) wrote to the local journal, which is a cache of
//! the stream; its own batches of this life it skips (they are written already). A batch
//! that does not decode is skipped with a warning, never applied in part.
//!
//! It decides nothing about who acts: [`JournalStream::catch_up`] is what a member taking
//! over waits on before it acts.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, message::PublishMessage};
use futures::StreamExt as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::adapters::journal::{ReplicaBatch, ReplicaFeed, SqliteJournal};
use crate::ports::RunJournal;

/// The header naming the member that wrote a batch.
const EDGE_HEADER: &str = "Edge-Id";
/// The header naming the epoch it wrote it under.
const EPOCH_HEADER: &str = "Edge-Epoch";

/// How long the tasks wait before trying NATS again after a failure.
const RETRY: Duration = Duration::from_millis(250);

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
    /// The epoch batches are published under (set by [`JournalStream::publish_as`]).
    epoch: watch::Sender<u64>,
    /// The epochs this life of the member published under: its own batches to skip.
    own_epochs: Mutex<HashSet<u64>>,
    /// The stream sequence of the last message the folder handled (applied or skipped).
    folded: watch::Sender<u64>,
    /// The highest epoch among the batches folded: one written under a lower epoch comes
    /// from a member that lost the lease since, and is skipped.
    newest_epoch: AtomicU64,
}

/// The running tasks of a [`JournalStream`].
pub struct JournalStreamTasks {
    stop: CancellationToken,
    publisher: JoinHandle<()>,
    folder: JoinHandle<()>,
}

impl JournalStream {
    /// The stream of `site` (with `replicas`), for member `edge_id` whose journal is
    /// `journal`.
    pub fn new(
        js: jetstream::Context,
        site: &str,
        replicas: usize,
        edge_id: String,
        journal: Arc<SqliteJournal>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                js,
                stream: format!("edge-{site}-journal"),
                subject: format!("edge.{site}.journal"),
                replicas,
                edge_id,
                journal,
                epoch: watch::Sender::new(0),
                own_epochs: Mutex::new(HashSet::new()),
                folded: watch::Sender::new(0),
                newest_epoch: AtomicU64::new(0),
            }),
        }
    }

    /// Starts the publisher (fed by `feed`) and the folder; they end on
    /// [`JournalStreamTasks::stop`], the publisher once the journal closed and every batch
    /// it wrote is in the stream.
    pub fn start(&self, feed: ReplicaFeed) -> JournalStreamTasks {
        let stop = CancellationToken::new();
        let publisher = tokio::spawn(Arc::clone(&self.inner).publish(feed, stop.clone()));
        let folder = tokio::spawn(Arc::clone(&self.inner).fold(stop.clone()));
        JournalStreamTasks {
            stop,
            publisher,
            folder,
        }
    }

    /// Waits until the local journal holds every batch the stream held when called, and
    /// has written it.
    ///
    /// # Errors
    /// NATS's answer, as text, when the stream cannot be read.
    pub async fn catch_up(&self) -> Result<u64, String> {
        let inner = &self.inner;
        let mut stream = inner.stream().await?;
        let last = stream
            .info()
            .await
            .map_err(|error| format!("cannot read the journal stream: {error}"))?
            .state
            .last_sequence;
        let mut folded = inner.folded.subscribe();
        folded
            .wait_for(|seq| *seq >= last)
            .await
            .map_err(|_| "the journal stream's folder stopped".to_owned())?;
        inner.journal.flush().await;
        Ok(last)
    }

    /// From now on the journal's batches go to the stream under `epoch` (the folder skips
    /// them), or, with `None`, stay local.
    pub fn publish_as(&self, epoch: Option<u64>) {
        let inner = &self.inner;
        if let Some(epoch) = epoch {
            inner
                .own_epochs
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(epoch);
            inner.epoch.send_replace(epoch);
        }
        inner.journal.set_publishing(epoch.is_some());
    }
}

impl JournalStreamTasks {
    /// Stops folding, and waits for the publisher to have published what the (closed)
    /// journal wrote, for `grace` at most.
    pub async fn stop(mut self, grace: Duration) {
        self.folder.abort();
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
    /// The stream, created when absent (file storage, every batch kept).
    async fn stream(&self) -> Result<jetstream::stream::Stream, String> {
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
            .map_err(|error| format!("cannot open the journal stream {}: {error}", self.stream))
    }

    async fn publish(self: Arc<Self>, mut feed: ReplicaFeed, stop: CancellationToken) {
        let mut n: u64 = 0;
        while let Some(batch) = feed.next().await {
            n += 1;
            let epoch = *self.epoch.borrow();
            let id = format!("{}-{epoch}-{n}", self.edge_id);
            // Stopped without NATS, the batch stays local: its flush is released all the same.
            self.publish_one(&batch, &id, epoch, &stop).await;
            feed.acknowledged(&batch);
        }
    }

    /// Publishes `batch` as `id` until the stream acknowledges it; `false` when stopped
    /// first.
    async fn publish_one(
        &self,
        batch: &ReplicaBatch,
        id: &str,
        epoch: u64,
        stop: &CancellationToken,
    ) -> bool {
        let mut headers = HeaderMap::new();
        headers.insert(EDGE_HEADER, self.edge_id.as_str());
        headers.insert(EPOCH_HEADER, epoch.to_string().as_str());
        let mut warned = false;
        loop {
            let message = PublishMessage::build()
                .payload(batch.bytes.clone().into())
                .headers(headers.clone())
                .message_id(id);
            let sent = match self.js.send_publish(self.subject.clone(), message).await {
                Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
                Err(error) => Err(error.to_string()),
            };
            match sent {
                Ok(()) => return true,
                // Stood down meanwhile: the member that acts now writes the stream; this
                // batch of an older epoch stays local (folders would skip it anyway).
                Err(error) if !self.journal.publishing() => {
                    warn!(%error, batch = id, "a journal batch not published before this member stood down: kept local only");
                    return false;
                }
                Err(error) if !warned => {
                    warned = true;
                    warn!(%error, batch = id, "cannot publish a journal batch; trying again");
                }
                Err(_) => {}
            }
            tokio::select! {
                () = stop.cancelled() => return false,
                () = tokio::time::sleep(RETRY) => {}
            }
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

    /// Reads the stream from past what was folded, applying each batch in order.
    async fn fold_from_start(&self) -> Result<(), String> {
        let stream = self.stream().await?;
        let from = *self.folded.borrow() + 1;
        let config = jetstream::consumer::pull::OrderedConfig {
            filter_subject: self.subject.clone(),
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from,
            },
            ..Default::default()
        };
        let consumer = stream
            .create_consumer(config)
            .await
            .map_err(|error| format!("cannot read the journal stream: {error}"))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|error| format!("cannot read the journal stream: {error}"))?;
        info!(stream = %self.stream, from, "folding the site's journal stream");
        while let Some(message) = messages.next().await {
            let message = message.map_err(|error| error.to_string())?;
            let Ok(seq) = message.info().map(|info| info.stream_sequence) else {
                continue;
            };
            if seq <= *self.folded.borrow() {
                continue;
            }
            self.apply(&message, seq);
            self.folded.send_replace(seq);
        }
        Ok(())
    }

    /// Applies the batch at `seq` unless it was written under an older epoch than one already
    /// seen, by this life of the member, or while this member publishes (a batch of a
    /// member that lost the lease).
    fn apply(&self, message: &jetstream::Message, seq: u64) {
        let header = |name: &str| {
            message
                .headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.as_str().to_owned())
        };
        let epoch = header(EPOCH_HEADER).and_then(|e| e.parse::<u64>().ok());
        let newest = self
            .newest_epoch
            .fetch_max(epoch.unwrap_or(0), Ordering::AcqRel);
        if epoch.is_none_or(|epoch| epoch < newest) {
            warn!(
                seq,
                ?epoch,
                newest,
                "a journal batch of an older epoch (a member fenced since) is skipped"
            );
            return;
        }
        let mine = header(EDGE_HEADER).as_deref() == Some(self.edge_id.as_str())
            && epoch.is_some_and(|epoch| {
                self.own_epochs
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .contains(&epoch)
            });
        if mine {
            return;
        }
        if self.journal.publishing() {
            warn!(
                seq,
                "a journal batch written by another member while this one acts: skipped"
            );
            return;
        }
        if let Err(error) = self.journal.apply_replica(&message.payload) {
            warn!(seq, %error, "a journal batch from the stream is skipped");
        }
    }
}
