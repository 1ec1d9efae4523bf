//! Every integration test under a deadline of its own: the runtime `#[common::test]`
//! (`edge-test-deadline`) runs a test's body on, and the watchdog that turns a hang into a
//! failure naming the test.
//!
//! A test that has not finished by its deadline is failed with a message naming it, printed
//! at once (to the process's stderr, past the test harness's capture) so a hung run says
//! where it hangs while it hangs. Its runtime is then shut down with a bounded wait, so a
//! blocking task stuck in it cannot hold the test either; a test whose runtime cannot even
//! be reached (every worker thread blocked) ends the whole test process after a grace,
//! naming the test, rather than leave CI waiting for its limit. The waits inside a test are
//! bounded too ([`super::PATIENCE`], [`super::bounded`]); this is the bound of last resort.

use std::future::Future;
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// A test's deadline unless it names its own (`deadline_secs`): well above the slowest test
/// on a busy 2-core machine, well below CI's limit.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(240);

/// How long a test's runtime waits for its blocking tasks once the test has ended.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

/// How long a test that missed its deadline has to stop (its runtime's tasks dropped, its
/// blocking threads given up on) before the watchdog ends the process.
const STOP_GRACE: Duration = Duration::from_secs(30);

/// The runtime a test asks for, as `tokio::test`'s `flavor` and `worker_threads` say.
#[derive(Clone, Copy, Debug)]
pub enum Flavor {
    /// tokio's default for tests: one thread, the test's own.
    CurrentThread,
    /// A multi-thread runtime with this many workers.
    MultiThread(usize),
}

/// Runs the async test `name`'s `body` on a runtime of `flavor`; fails it once `deadline`
/// (seconds, or [`DEFAULT_DEADLINE`]) has passed.
pub fn run<T>(
    name: &'static str,
    flavor: Flavor,
    deadline: Option<u64>,
    body: impl Future<Output = T>,
) -> T {
    let deadline = deadline.map_or(DEFAULT_DEADLINE, Duration::from_secs);
    let runtime = match flavor {
        Flavor::CurrentThread => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Flavor::MultiThread(workers) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build(),
    }
    .expect("a test runtime");
    let (watchdog, expired) = Watchdog::start(name, deadline);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        runtime.block_on(async move {
            tokio::select! {
                biased;
                value = body => Some(value),
                // Not a tokio timer: a test that pauses tokio's clock keeps its deadline.
                Ok(()) = expired => None,
            }
        })
    }));
    // A task stuck in a blocking call would hold a plain drop (and so `#[tokio::test]`)
    // forever, the test's failure unreported.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    watchdog.finish();
    match outcome {
        Ok(Some(value)) => value,
        Ok(None) => panic!(
            "{name} did not finish within its deadline of {deadline:?}: the last wait it \
             was in never ended (see the watchdog's line above, and the test's output)"
        ),
        Err(panic) => resume_unwind(panic),
    }
}

/// Runs the synchronous test `name`'s `body`; a body still running at the deadline cannot
/// be interrupted, so the watchdog ends the process after [`STOP_GRACE`], naming it.
pub fn run_blocking<T>(name: &'static str, deadline: Option<u64>, body: impl FnOnce() -> T) -> T {
    let deadline = deadline.map_or(DEFAULT_DEADLINE, Duration::from_secs);
    let (watchdog, _) = Watchdog::start(name, deadline);
    let outcome = catch_unwind(AssertUnwindSafe(body));
    watchdog.finish();
    outcome.unwrap_or_else(|panic| resume_unwind(panic))
}

/// A thread that waits out a test's deadline: it tells the test when the deadline passes,
/// and ends the process if the test has not stopped [`STOP_GRACE`] later.
struct Watchdog {
    done: mpsc::Sender<()>,
    thread: thread::JoinHandle<()>,
}

impl Watchdog {
    /// Starts the watchdog of test `name`; the receiver is told when the deadline passes.
    fn start(name: &'static str, deadline: Duration) -> (Self, oneshot::Receiver<()>) {
        let (done, finished) = mpsc::channel::<()>();
        let (expire, expired) = oneshot::channel();
        let clock = TestClock::start();
        let thread = thread::Builder::new()
            .name(format!("deadline {name}"))
            .spawn(move || {
                while clock.elapsed() < deadline {
                    if finished.recv_timeout(LOOK_EVERY) != Err(mpsc::RecvTimeoutError::Timeout) {
                        return;
                    }
                }
                say(&format!(
                    "test {name} has run {:?} (not counting one-time installs), past its \
                     deadline of {deadline:?}: failing it",
                    clock.elapsed()
                ));
                let _ = expire.send(());
                if finished.recv_timeout(STOP_GRACE) == Err(mpsc::RecvTimeoutError::Timeout) {
                    say(&format!(
                        "test {name} did not stop within {STOP_GRACE:?} of its deadline (its \
                         threads are blocked): ending the test process"
                    ));
                    std::process::exit(101);
                }
            })
            .expect("the watchdog thread");
        (Self { done, thread }, expired)
    }

    /// The test has returned (or panicked): the watchdog stands down.
    fn finish(self) {
        let _ = self.done.send(());
        let _ = self.thread.join();
    }
}

/// How often a watchdog looks at its test's clock.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Runs `install`, a one-time installation the first test to need it waits for (an engine
/// built from source, a venv, a generated model: tens of minutes on a fresh machine), with
/// every test's deadline clock stopped meanwhile: a deadline bounds a test, not the
/// machine's set-up.
pub fn installing<T>(install: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    INSTALLS_RUNNING.fetch_add(1, Ordering::AcqRel);
    let result = catch_unwind(AssertUnwindSafe(install));
    INSTALLS_RUNNING.fetch_sub(1, Ordering::AcqRel);
    let took = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    INSTALL_MILLIS.fetch_add(took, Ordering::AcqRel);
    result.unwrap_or_else(|panic| resume_unwind(panic))
}

/// Installs running now, and the milliseconds spent in installs that have ended.
static INSTALLS_RUNNING: AtomicUsize = AtomicUsize::new(0);
static INSTALL_MILLIS: AtomicU64 = AtomicU64::new(0);

/// A test's running time, less the time one-time installs ran meanwhile.
struct TestClock {
    started: Instant,
    installs_before: u64,
    /// While installs run, when the watchdog first saw them running.
    install_seen: std::cell::Cell<Option<Instant>>,
}

impl TestClock {
    fn start() -> Self {
        Self {
            started: Instant::now(),
            installs_before: INSTALL_MILLIS.load(Ordering::Acquire),
            install_seen: std::cell::Cell::new(None),
        }
    }

    fn elapsed(&self) -> Duration {
        let running = INSTALLS_RUNNING.load(Ordering::Acquire) > 0;
        let now = Instant::now();
        // An install still running counts from when it was first seen; an ended one by
        // what it recorded.
        let ongoing = if running {
            let seen = self.install_seen.get().unwrap_or(now);
            self.install_seen.set(Some(seen));
            now - seen
        } else {
            self.install_seen.set(None);
            Duration::ZERO
        };
        let ended = INSTALL_MILLIS.load(Ordering::Acquire) - self.installs_before;
        (now - self.started).saturating_sub(Duration::from_millis(ended) + ongoing)
    }
}

/// Writes `line` to the process's stderr directly, past the test harness's capture, so it
/// shows while the test still hangs.
fn say(line: &str) {
    let mut stderr = std::io::stderr().lock();
    let _ = writeln!(stderr, "\n[deadline] {line}");
}
