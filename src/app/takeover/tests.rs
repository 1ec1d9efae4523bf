//! The takeover over its ports: mocks where a test asserts what is called and in which
//! order, an in-memory site (a stream that publishes only while claimed, a journal, runs)
//! where it follows a member through taking over, standing down and taking over again.

use std::error::Error as _;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use mockall::Sequence;
use mockall::predicate::eq;

use super::SiteTakeOver;
use crate::ports::takeover::{MockJournalCache, MockSiteRuns, MockSiteStream};
use crate::ports::{
    ClaimError, JournalCache, JournalError, RebuildError, SiteRuns, SiteStream, TakeOver,
    TakeOverError,
};

fn service(stream: MockSiteStream, journal: MockJournalCache, runs: MockSiteRuns) -> SiteTakeOver {
    SiteTakeOver::new(Arc::new(stream), Arc::new(journal), Arc::new(runs))
}

/// A stream whose file holds nothing unpublished, with `claim` answering `claimed`.
fn clean_stream(claimed: Result<u64, ClaimError>) -> MockSiteStream {
    let mut stream = MockSiteStream::new();
    stream.expect_holds_unpublished().return_const(false);
    stream.expect_rebuild().never();
    let mut claimed = Some(claimed);
    stream
        .expect_claim()
        .times(1)
        .returning(move |_| claimed.take().unwrap_or(Ok(0)));
    stream
}

/// Runs that must not be touched: the takeover failed before them.
fn untouched_runs() -> MockSiteRuns {
    let mut runs = MockSiteRuns::new();
    runs.expect_load_budgets().never();
    runs.expect_adopt_left_open().never();
    runs.expect_act().never();
    runs
}

#[tokio::test]
async fn a_takeover_claims_the_stream_then_reads_the_open_runs_loads_the_budgets_adopts_and_acts() {
    let mut order = Sequence::new();
    let mut stream = MockSiteStream::new();
    stream
        .expect_holds_unpublished()
        .times(1)
        .in_sequence(&mut order)
        .return_const(false);
    stream.expect_rebuild().never();
    stream
        .expect_claim()
        .with(eq(7))
        .times(1)
        .in_sequence(&mut order)
        .returning(|_| Ok(42));
    let mut journal = MockJournalCache::new();
    journal
        .expect_reload_left_open()
        .times(1)
        .in_sequence(&mut order)
        .returning(|| Ok(3));
    let mut runs = MockSiteRuns::new();
    runs.expect_load_budgets()
        .times(1)
        .in_sequence(&mut order)
        .returning(|| Ok(()));
    runs.expect_adopt_left_open()
        .times(1)
        .in_sequence(&mut order)
        .return_const(3_usize);
    runs.expect_act()
        .times(1)
        .in_sequence(&mut order)
        .return_const(());
    let take_over = service(stream, journal, runs);
    assert!(take_over.prepare(7).await.is_ok());
}

#[tokio::test]
async fn a_member_that_acted_before_rebuilds_its_journal_before_it_claims_the_stream() {
    let mut order = Sequence::new();
    let mut stream = MockSiteStream::new();
    stream.expect_holds_unpublished().return_const(true);
    stream
        .expect_rebuild()
        .times(1)
        .in_sequence(&mut order)
        .returning(|| Ok(()));
    stream
        .expect_claim()
        .times(1)
        .in_sequence(&mut order)
        .returning(|_| Ok(42));
    let mut journal = MockJournalCache::new();
    journal
        .expect_reload_left_open()
        .times(1)
        .in_sequence(&mut order)
        .returning(|| Ok(0));
    let mut runs = MockSiteRuns::new();
    runs.expect_load_budgets().returning(|| Ok(()));
    runs.expect_adopt_left_open().times(1).return_const(0_usize);
    runs.expect_act().times(1).return_const(());
    assert!(service(stream, journal, runs).prepare(8).await.is_ok());
}

#[tokio::test]
async fn a_journal_that_cannot_be_rebuilt_claims_nothing_and_takes_no_run_over() {
    let mut stream = MockSiteStream::new();
    stream.expect_holds_unpublished().return_const(true);
    stream.expect_rebuild().times(1).returning(|| {
        Err(RebuildError::Snapshot(
            "cannot read the journal snapshot: timed out".into(),
        ))
    });
    stream.expect_claim().never();
    let mut journal = MockJournalCache::new();
    journal.expect_reload_left_open().never();
    let take_over = service(stream, journal, untouched_runs());
    let error = take_over.prepare(8).await.unwrap_err();
    assert!(
        matches!(error, TakeOverError::Rebuild(RebuildError::Snapshot(_))),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "cannot read the journal snapshot: timed out",
        "the lease says why in the standby's reason, as the adapter put it"
    );
}

#[tokio::test]
async fn a_claim_the_stream_refuses_takes_no_run_over() {
    let refusals = [
        ClaimError::NewerEpoch {
            newest: 9,
            epoch: 7,
        },
        ClaimError::Stream("cannot read the journal stream: no responders".into()),
    ];
    let texts = [
        "the site's journal holds batches of epoch 9, newer than this member's 7",
        "cannot read the journal stream: no responders",
    ];
    for (refusal, text) in refusals.into_iter().zip(texts) {
        let mut journal = MockJournalCache::new();
        journal.expect_reload_left_open().never();
        let take_over = service(clean_stream(Err(refusal)), journal, untouched_runs());
        let error = take_over.prepare(7).await.unwrap_err();
        assert!(matches!(error, TakeOverError::Claim(_)), "{error:?}");
        assert_eq!(error.to_string(), text);
    }
}

#[tokio::test]
async fn open_runs_or_budgets_that_cannot_be_read_take_no_run_over_and_say_which() {
    let mut journal = MockJournalCache::new();
    journal
        .expect_reload_left_open()
        .returning(|| Err(JournalError::Unavailable("locked".into())));
    let take_over = service(clean_stream(Ok(5)), journal, untouched_runs());
    let error = take_over.prepare(7).await.unwrap_err();
    assert!(matches!(error, TakeOverError::OpenRuns(_)), "{error:?}");
    assert_eq!(error.to_string(), "the run journal cannot be read: locked");

    let mut journal = MockJournalCache::new();
    journal.expect_reload_left_open().returning(|| Ok(1));
    let mut runs = MockSiteRuns::new();
    runs.expect_load_budgets()
        .times(1)
        .returning(|| Err(JournalError::Damaged("a rollup".into())));
    runs.expect_adopt_left_open().never();
    runs.expect_act().never();
    let error = service(clean_stream(Ok(5)), journal, runs)
        .prepare(7)
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "cannot load the budgets: the run journal holds damaged data: a rollup"
    );
    let source = error.source().map(ToString::to_string);
    assert_eq!(
        source.as_deref(),
        Some("the run journal holds damaged data: a rollup"),
        "the journal's error is the source"
    );
}

#[tokio::test]
async fn a_member_that_stands_down_stops_publishing_before_it_lets_its_runs_go() {
    let mut order = Sequence::new();
    let mut stream = MockSiteStream::new();
    stream
        .expect_stop_writing()
        .times(1)
        .in_sequence(&mut order)
        .return_const(());
    let mut runs = MockSiteRuns::new();
    runs.expect_let_go_open_runs()
        .times(1)
        .in_sequence(&mut order)
        .return_const(4_usize);
    runs.expect_adopt_left_open().never();
    runs.expect_act().never();
    service(stream, MockJournalCache::new(), runs)
        .stand_down()
        .await;
}

#[tokio::test]
async fn fencing_is_the_streams_word_under_the_epoch_asked() {
    let mut stream = MockSiteStream::new();
    stream.expect_fenced().with(eq(7)).times(1).return_const(());
    service(stream, MockJournalCache::new(), MockSiteRuns::new())
        .fenced(7)
        .await;
}

/// What happened in the in-memory site, in order.
type Log = Arc<Mutex<Vec<String>>>;

fn note(log: &Log, what: impl Into<String>) {
    log.lock().unwrap().push(what.into());
}

/// A stream that takes batches only while this member writes it (claimed, not stopped),
/// and remembers that its journal may then hold what it lacks.
struct FakeStream {
    log: Log,
    state: Mutex<(Option<u64>, bool)>,
}

impl FakeStream {
    /// Appends a batch this member's journal wrote: published while it writes the stream.
    fn append(&self, batch: &str) {
        let (writer, _) = *self.state.lock().unwrap();
        match writer {
            Some(epoch) => note(&self.log, format!("published {batch} under {epoch}")),
            None => {
                self.state.lock().unwrap().1 = true;
                note(&self.log, format!("kept {batch} local"));
            }
        }
    }
}

#[async_trait]
impl SiteStream for FakeStream {
    fn holds_unpublished(&self) -> bool {
        self.state.lock().unwrap().1
    }

    async fn rebuild(&self) -> Result<(), RebuildError> {
        self.state.lock().unwrap().1 = false;
        note(&self.log, "rebuild");
        Ok(())
    }

    async fn claim(&self, epoch: u64) -> Result<u64, ClaimError> {
        self.state.lock().unwrap().0 = Some(epoch);
        note(&self.log, format!("claim {epoch}"));
        Ok(epoch)
    }

    fn stop_writing(&self) {
        *self.state.lock().unwrap() = (None, true);
        note(&self.log, "stop writing");
    }

    async fn fenced(&self, _epoch: u64) {
        std::future::pending::<()>().await;
    }
}

struct FakeSite {
    log: Log,
}

#[async_trait]
impl JournalCache for FakeSite {
    async fn reload_left_open(&self) -> Result<usize, JournalError> {
        note(&self.log, "reload");
        Ok(1)
    }
}

#[async_trait]
impl SiteRuns for FakeSite {
    async fn load_budgets(&self) -> Result<(), JournalError> {
        note(&self.log, "budgets");
        Ok(())
    }

    async fn adopt_left_open(&self) -> usize {
        note(&self.log, "adopt");
        1
    }

    fn act(&self) {
        note(&self.log, "act");
    }

    async fn let_go_open_runs(&self) -> usize {
        note(&self.log, "let go");
        1
    }
}

#[tokio::test]
async fn each_takeover_adopts_the_open_runs_once_and_nothing_is_published_once_it_stood_down() {
    let log = Log::default();
    let stream = Arc::new(FakeStream {
        log: Arc::clone(&log),
        state: Mutex::new((None, false)),
    });
    let site = Arc::new(FakeSite {
        log: Arc::clone(&log),
    });
    let take_over = SiteTakeOver::new(stream.clone(), site.clone(), site);
    take_over.prepare(5).await.unwrap();
    stream.append("a");
    take_over.stand_down().await;
    stream.append("b");
    take_over.prepare(9).await.unwrap();
    stream.append("c");
    let log = log.lock().unwrap().clone();
    assert_eq!(
        log,
        [
            "claim 5",
            "reload",
            "budgets",
            "adopt",
            "act",
            "published a under 5",
            "stop writing",
            "let go",
            "kept b local",
            "rebuild",
            "claim 9",
            "reload",
            "budgets",
            "adopt",
            "act",
            "published c under 9",
        ]
    );
}
