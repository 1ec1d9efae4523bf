//! Following a run's events for a client stream picked up again (a resumed chat or Messages
//! stream, a background response): the management port's feed — the journal, then live —
//! opened again once from the next position when it ends before the run does (a follower
//! that fell behind is dropped by the relay).

use std::time::Duration;

use futures::StreamExt as _;

use crate::adapters::api::ApiState;
use crate::domain::RunId;
use crate::ports::{FeedItem, FeedStream};

/// Why a followed stream ends with the API's error event when its events stop early.
pub(super) const EVENTS_STOPPED: &str = "the run's events stopped before its end";

/// What following a run gave next.
pub(super) enum Followed {
    /// The run's next event.
    Event(FeedItem),
    /// Nothing for the whole silence asked for: time for a keep-alive.
    Silent,
    /// The events stopped before the run's end, even after following again.
    Stopped,
}

/// A run's events as a client stream reads them.
pub(super) struct RunFollower {
    state: ApiState,
    run_id: RunId,
    feed: FeedStream,
    /// The position after the last event yielded.
    next: u64,
    /// The feed was opened again and has yielded nothing since.
    reopened: bool,
}

impl RunFollower {
    /// Follows run `run_id` through `feed`, opened from its first event.
    pub(super) fn new(state: ApiState, run_id: RunId, feed: FeedStream) -> Self {
        Self {
            state,
            run_id,
            feed,
            next: 0,
            reopened: false,
        }
    }

    /// The position the next event should have.
    pub(super) fn next_position(&self) -> u64 {
        self.next
    }

    /// The next event; with a `silence`, [`Followed::Silent`] when none comes within it.
    pub(super) async fn next(&mut self, silence: Option<Duration>) -> Followed {
        loop {
            let item = match silence {
                Some(silence) => match tokio::time::timeout(silence, self.feed.next()).await {
                    Ok(item) => item,
                    Err(_) => return Followed::Silent,
                },
                None => self.feed.next().await,
            };
            match item {
                Some(item) => {
                    self.reopened = false;
                    self.next = item.index + 1;
                    return Followed::Event(item);
                }
                None if self.follow_again().await => {}
                None => return Followed::Stopped,
            }
        }
    }

    /// Opens the feed again from the next position, once per silence of the feed.
    async fn follow_again(&mut self) -> bool {
        if std::mem::replace(&mut self.reopened, true) {
            return false;
        }
        match self
            .state
            .manage
            .events(&self.run_id, self.next, true)
            .await
        {
            Ok(feed) => {
                self.feed = feed;
                true
            }
            Err(_) => false,
        }
    }
}
