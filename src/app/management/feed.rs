//! A run's events for `GET /admin/v1/runs/{id}/events`: the stored ones replayed from the
//! journal, then the live ones while the run is open, with no gap and no repeat between
//! the two (the follower is registered first, and the journal flushed up to it).

use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::mpsc;

use super::{Follow, ManageError, Management};
use crate::domain::{RunEvent, RunId};
use crate::ports::{FeedEvent, FeedItem, RunJournal, StoredEvent};

/// Stored events read from the journal at a time.
const REPLAY_PAGE: usize = 256;

/// A run's events, from a position on.
pub struct EventFeed {
    journal: Arc<dyn RunJournal>,
    run_id: RunId,
    /// The next position to yield.
    next: u64,
    /// Replay stops here (the live events start); `u64::MAX` without a follower.
    live_from: u64,
    replay: VecDeque<StoredEvent>,
    replay_done: bool,
    live: Option<mpsc::Receiver<(u64, Arc<RunEvent>)>>,
}

impl Management {
    /// Run `id`'s events from position `from` on: stored ones first, then, when `follow`
    /// and the run is open, each as it is relayed until the terminal event.
    ///
    /// # Errors
    /// [`ManageError::UnknownRun`] when the run is neither open nor in the journal.
    pub async fn events(
        &self,
        id: &RunId,
        from: u64,
        follow: bool,
    ) -> Result<EventFeed, ManageError> {
        let live = if follow {
            self.inner.live.follow(id).await
        } else {
            None
        };
        let journal = Arc::clone(&self.inner.journal);
        // Everything relayed before the follower was registered is on its way to the
        // journal: wait for it, so the replay reaches where the live events start.
        journal.flush().await;
        let open = live.is_some() || self.inner.live.open_record(id).is_some();
        if !open && journal.run(id).await?.is_none() {
            return Err(ManageError::UnknownRun(id.to_string()));
        }
        let (live_from, live) = match live {
            Some(Follow { next_index, events }) => (next_index, Some(events)),
            None => (u64::MAX, None),
        };
        Ok(EventFeed {
            journal,
            run_id: id.clone(),
            next: from,
            live_from,
            replay: VecDeque::new(),
            replay_done: false,
            live,
        })
    }
}

impl EventFeed {
    /// The next event, or `None` at the end (the terminal event, the replay's end when not
    /// following, or a follower that fell behind).
    pub async fn next(&mut self) -> Option<FeedItem> {
        loop {
            if let Some(stored) = self.replay.pop_front() {
                if stored.index >= self.live_from {
                    self.replay.clear();
                    self.replay_done = true;
                    continue;
                }
                self.next = stored.index + 1;
                return Some(item_of_stored(stored));
            }
            if !self.replay_done && self.next < self.live_from {
                let page = self
                    .journal
                    .events(&self.run_id, self.next, REPLAY_PAGE)
                    .await
                    .unwrap_or_default();
                self.replay_done = page.len() < REPLAY_PAGE;
                self.replay.extend(page);
                if !self.replay.is_empty() {
                    continue;
                }
            }
            let (index, event) = self.live.as_mut()?.recv().await?;
            if index >= self.next {
                self.next = index + 1;
                return Some(item_of_live(index, &event));
            }
        }
    }

    /// The feed as a stream.
    pub fn into_stream(self) -> impl Stream<Item = FeedItem> + Send {
        futures::stream::unfold(self, |mut feed| async move {
            feed.next().await.map(|item| (item, feed))
        })
    }
}

fn item_of_stored(stored: StoredEvent) -> FeedItem {
    let kind = kind_of_json(&stored.json);
    FeedItem {
        index: stored.index,
        kind,
        event: FeedEvent::Stored(stored.json),
    }
}

fn item_of_live(index: u64, event: &RunEvent) -> FeedItem {
    FeedItem {
        index,
        kind: event.kind.name().to_owned(),
        event: FeedEvent::Live(Box::new(event.clone())),
    }
}

/// The `kind` field of a stored event line (the line format puts it in a fixed place).
fn kind_of_json(json: &str) -> String {
    json.split_once("\"kind\":\"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or_else(|| "event".to_owned(), |(kind, _)| kind.to_owned())
}
