//! What a member of a site does between acquiring its lease and acting, and when it stops
//! acting (decisions 49, 50 and 53): [`TakeOver`], the port the lease runs, and the ports
//! the takeover itself builds on — the site's journal stream ([`SiteStream`]), this
//! member's journal file, a cache of that stream ([`JournalCache`]), and its runs
//! ([`SiteRuns`]).
//!
//! The stream's and the file's technology stays behind them: their errors reach the
//! takeover as the adapter's error, boxed as the source of a variant that says which step
//! failed.

use std::error::Error;

use async_trait::async_trait;

use super::journal::JournalError;

/// The error of an adapter behind a port of this module, kept whole as a source.
pub type AdapterError = Box<dyn Error + Send + Sync>;

/// Why a member cannot act after acquiring the lease.
#[derive(Debug, thiserror::Error)]
pub enum TakeOverError {
    /// Its journal may hold what the stream lacks, and could not be rebuilt from the site's
    /// newest snapshot.
    #[error(transparent)]
    Rebuild(#[from] RebuildError),
    /// The site's journal stream could not be caught up on or claimed under its epoch.
    #[error(transparent)]
    Claim(#[from] ClaimError),
    /// The runs its journal holds as open could not be read.
    #[error(transparent)]
    OpenRuns(JournalError),
    /// The keys' budgets could not be loaded from its journal's rollups.
    #[error("cannot load the budgets: {0}")]
    Budgets(#[source] JournalError),
}

/// What a member does after it acquired its site's lease and before it acts (its role set
/// to [`Role::Active`](super::Role::Active)): catch up on the site's journal and take the
/// open runs over; and what it does when it stops acting.
#[async_trait]
pub trait TakeOver: Send + Sync {
    /// Makes this member ready to act under `epoch`.
    ///
    /// # Errors
    /// Why it cannot act — [`TakeOverError::Rebuild`], [`TakeOverError::Claim`] (the site's
    /// journal cannot be read to its end, or a newer epoch writes it),
    /// [`TakeOverError::OpenRuns`], [`TakeOverError::Budgets`]: the member then does not
    /// turn active, and lets the lease lapse.
    async fn prepare(&self, epoch: u64) -> Result<(), TakeOverError>;

    /// This member stopped acting (its role is a standby's already): let go of what it
    /// held as the active member, ending nothing. The lease takes no step before it returns.
    async fn stand_down(&self);

    /// Returns once what this member acts on refused its writes under `epoch` (the site's
    /// journal ends with another member's claim): another member acquired the lease since,
    /// and this one must stop acting at once. Pending while its writes are taken.
    async fn fenced(&self, epoch: u64);
}

/// Why the site's journal stream could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// The stream holds batches of an epoch newer than the claim's: a member that acquired
    /// the lease after this one writes it.
    #[error("the site's journal holds batches of epoch {newest}, newer than this member's {epoch}")]
    NewerEpoch {
        /// The newest epoch folded from the stream.
        newest: u64,
        /// The epoch of the claim.
        epoch: u64,
    },
    /// The stream could not be read to its end or written (the adapter's error).
    #[error(transparent)]
    Stream(AdapterError),
}

/// Why this member's journal could not be rebuilt from the site's newest snapshot.
#[derive(Debug, thiserror::Error)]
pub enum RebuildError {
    /// The newest snapshot could not be read or fetched (the adapter's error).
    #[error(transparent)]
    Snapshot(AdapterError),
    /// The journal file could not be replaced by it, or emptied (the adapter's error); it
    /// is as it was.
    #[error(transparent)]
    Journal(AdapterError),
}

/// A member's end of the site's journal stream, as a takeover uses it.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait SiteStream: Send + Sync {
    /// Whether this member's journal may hold batches the stream lacks — it acted before in
    /// this life (it stood down, or a batch of its stayed local) — so that it must be
    /// rebuilt before this member claims the stream again.
    fn holds_unpublished(&self) -> bool;

    /// Replaces this member's journal with the site's newest snapshot (empties it, with
    /// none) and folds the stream on from there.
    ///
    /// # Errors
    /// [`RebuildError::Snapshot`] when the snapshot cannot be fetched,
    /// [`RebuildError::Journal`] when the file cannot be replaced (it is then as it was).
    async fn rebuild(&self) -> Result<(), RebuildError>;

    /// Makes this member the stream's only writer under `epoch`: waits until its journal
    /// holds every batch in the stream, then appends a claim expecting the stream to end
    /// there. From then on its journal's batches go to the stream. Returns the claim's
    /// sequence.
    ///
    /// # Errors
    /// [`ClaimError::NewerEpoch`] when a member that acquired the lease since writes the
    /// stream; [`ClaimError::Stream`] when it cannot be read or written.
    async fn claim(&self, epoch: u64) -> Result<u64, ClaimError>;

    /// From now on this member's journal's batches stay local (it stopped acting).
    fn stop_writing(&self);

    /// Returns once the stream refused a batch this member wrote under `epoch`: another
    /// member claimed it since. Pending while its batches are taken.
    async fn fenced(&self, epoch: u64);
}

/// This member's journal file, a cache of the site's stream.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait JournalCache: Send + Sync {
    /// Reads the runs the file now holds as open, for
    /// [`RunJournal::take_left_open`](super::RunJournal::take_left_open) to hand over; how
    /// many.
    ///
    /// # Errors
    /// [`JournalError`] when the file cannot be read.
    async fn reload_left_open(&self) -> Result<usize, JournalError>;
}

/// The runs of a member of a site, as taking over and standing down change them.
#[cfg_attr(test, mockall::automock)]
#[async_trait]
pub trait SiteRuns: Send + Sync {
    /// Loads every key's tokens used this UTC day and month from the journal.
    ///
    /// # Errors
    /// [`JournalError`] when the rollups cannot be read.
    async fn load_budgets(&self) -> Result<(), JournalError>;

    /// Takes back the runs the journal holds as open; how many are held for their nodes.
    async fn adopt_left_open(&self) -> usize;

    /// Admits runs again.
    fn act(&self);

    /// Lets every open run go without ending it; how many.
    async fn let_go_open_runs(&self) -> usize;
}
