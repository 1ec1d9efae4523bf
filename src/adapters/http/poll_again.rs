//! Polls an HTTP connection again at once when it wakes itself during its own poll,
//! instead of handing that wake to the runtime.
//!
//! hyper's request body channel wakes its sender — the connection's own task — when the
//! handler takes the body, so every request woke its task while it ran. Tokio treats such
//! a wake as a yield: it queues the task behind the others and wakes a parked worker to
//! steal it, a system call and a thread woken on the other core on every request's path
//! (decision 37). Wakes from elsewhere (the socket, a run's events) reach the task as
//! before, and so does a wake with the task's cooperative budget spent: that one asks the
//! runtime to let the other tasks run first, and a poll again would find the budget as
//! spent as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;

/// How many polls in a row one poll of the task may take: the body channel's wake needs
/// one more, and a future that woke itself again then yields to the others as it would
/// have.
const MAX_POLLS: usize = 2;

/// `future`, polled again in place while it wakes itself during its poll.
pub(crate) struct PollAgain<F> {
    future: Pin<Box<F>>,
    wakes: Arc<Wakes>,
    waker: Waker,
}

/// Where the future's wakes go: noted while it is being polled, else to the task.
#[derive(Default)]
struct Wakes {
    task: AtomicWaker,
    polling: AtomicBool,
    woken: AtomicBool,
}

impl Wake for Wakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Paired with `poll`'s store of `polling` and swap of `woken` (both SeqCst): a wake
        // racing the end of a poll is seen by the poll, or goes to the task, or both.
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F: Future> PollAgain<F> {
    pub(crate) fn new(future: F) -> Self {
        let wakes = Arc::new(Wakes::default());
        let waker = Waker::from(Arc::clone(&wakes));
        Self {
            future: Box::pin(future),
            wakes,
            waker,
        }
    }
}

impl<F: Future> Future for PollAgain<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.wakes.task.register(cx.waker());
        let mut inner = Context::from_waker(&this.waker);
        for _ in 0..MAX_POLLS {
            this.wakes.woken.store(false, Ordering::SeqCst);
            this.wakes.polling.store(true, Ordering::SeqCst);
            let polled = this.future.as_mut().poll(&mut inner);
            this.wakes.polling.store(false, Ordering::SeqCst);
            if polled.is_ready() || !this.wakes.woken.swap(false, Ordering::SeqCst) {
                return polled;
            }
            if !tokio::task::coop::has_budget_remaining() {
                break;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Wakes itself on each of its first `self_wakes` polls, then is ready.
    struct WakesItself {
        self_wakes: usize,
        polls: Arc<AtomicUsize>,
    }

    impl Future for WakesItself {
        type Output = ();

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            self.polls.fetch_add(1, Ordering::SeqCst);
            if self.self_wakes == 0 {
                return Poll::Ready(());
            }
            self.self_wakes -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// Counts the wakes the task gets.
    #[derive(Default)]
    struct TaskWakes(AtomicUsize);

    impl Wake for TaskWakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Polls a [`WakesItself`] in a [`PollAgain`] once: what it gave, how often it was
    /// polled, and how often its task was woken.
    fn polled_once(self_wakes: usize) -> (Poll<()>, usize, usize) {
        let polls = Arc::new(AtomicUsize::new(0));
        let task = Arc::new(TaskWakes::default());
        let waker = Waker::from(Arc::clone(&task));
        let mut future = PollAgain::new(WakesItself {
            self_wakes,
            polls: Arc::clone(&polls),
        });
        let polled = Pin::new(&mut future).poll(&mut Context::from_waker(&waker));
        (
            polled,
            polls.load(Ordering::SeqCst),
            task.0.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn a_future_that_woke_itself_is_polled_again_without_waking_its_task() {
        assert_eq!(polled_once(1), (Poll::Ready(()), 2, 0));
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_its_task() {
        assert_eq!(polled_once(10), (Poll::Pending, MAX_POLLS, 1));
    }

    #[tokio::test]
    async fn a_future_that_woke_itself_with_the_budget_spent_yields_to_its_task() {
        while tokio::task::coop::has_budget_remaining() {
            tokio::task::coop::consume_budget().await;
        }
        assert_eq!(polled_once(1), (Poll::Pending, 1, 1));
    }

    #[tokio::test]
    async fn a_wake_from_elsewhere_reaches_the_task() {
        let (sender, receiver) = tokio::sync::oneshot::channel::<u8>();
        let waiting = tokio::spawn(PollAgain::new(receiver));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        sender.send(7).unwrap();
        assert_eq!(waiting.await.unwrap(), Ok(7));
    }
}
