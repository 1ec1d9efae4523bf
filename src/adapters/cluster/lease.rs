//! The lease task: connects to the site's NATS, opens its bucket and, on every tick,
//! reads or renews the lease and acts on the domain's decision (`crate::domain::site`) —
//! setting the [`SiteRole`] the rest of the edge reads. A holder whose renewal meets
//! another write, that cannot reach NATS before the margin before its expiry, or whose
//! batch the site's journal refused ([`TakeOver::fenced`]), turns standby at once; on a clean stop it releases the lease so a standby takes it at once.
//!
//! Every NATS request is bounded (by the renewal interval, and never past the moment a
//! holder must have stepped down), so an unreachable server never holds the loop. It
//! decides nothing itself: the rules are the domain's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream;
use futures::StreamExt as _;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::ClusterConfig;
use super::kv::{NoAnswer, SiteBucket, WriteError};
use crate::adapters::nats::connect::{self, OptionsError};
use crate::domain::site::{
    ActiveStep, Held, Lease, LeaseTiming, LeaseWatch, RenewFailure, StandbyStep, StepDown,
    after_renew_failure, decide_active, decide_standby,
};
use crate::ports::clock::now_ms;
use crate::ports::{ActiveMember, Role, SiteRole, TakeOver, TakeOverError};

/// How a standby's reason starts when its node definitions are not the holder's.
const MISMATCH: &str = "node definitions differ";

/// Who this member is, as its lease says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its `[edge] id`.
    pub edge_id: String,
    /// Where its nodes dial.
    pub node_address: String,
    /// Where its HTTP API answers.
    pub api_address: String,
    /// Its node definitions' digest.
    pub digest: String,
}

/// The lease's counters, for the metrics export. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct LeaseStats {
    counters: Arc<Counters>,
}

#[derive(Debug, Default)]
struct Counters {
    acquisitions: AtomicU64,
    renewals: AtomicU64,
    renewal_failures: AtomicU64,
}

impl LeaseStats {
    /// Times this member acquired the lease (created it or took it over).
    pub fn acquisitions(&self) -> u64 {
        self.counters.acquisitions.load(Ordering::Relaxed)
    }

    /// Renewals NATS confirmed.
    pub fn renewals(&self) -> u64 {
        self.counters.renewals.load(Ordering::Relaxed)
    }

    /// Renewals that failed (a conflict, or NATS unreachable or too slow).
    pub fn renewal_failures(&self) -> u64 {
        self.counters.renewal_failures.load(Ordering::Relaxed)
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// A member's lease, built and connecting, not yet running.
pub struct ClusterLease {
    config: ClusterConfig,
    js: jetstream::Context,
    me: Member,
    role: SiteRole,
    stats: LeaseStats,
    /// Run between acquiring the lease and acting (`[cluster]` with a journal).
    take_over: Option<Arc<dyn TakeOver>>,
}

/// Why the lease could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The NATS client's options could not be built (a file they name cannot be read).
    #[error("cannot start the cluster's NATS client: {0}")]
    Options(#[source] OptionsError),
    /// The NATS client could not start.
    #[error("cannot start the cluster's NATS client: {0}")]
    Connect(#[source] async_nats::ConnectError),
}

/// Why a takeover ended without this member acting.
#[derive(Debug, thiserror::Error)]
enum NotTakenOver {
    /// The takeover itself failed.
    #[error(transparent)]
    Failed(#[from] TakeOverError),
    /// It did not finish within `cluster.takeover_timeout_ms`.
    #[error("it took longer than {} ms", .0.as_millis())]
    TooLong(Duration),
    /// A renewal meanwhile found another member's write.
    #[error("the lease was lost while taking over")]
    LeaseLost,
}

/// The shortest time between two pings of the site's NATS client.
const MIN_PING_INTERVAL: Duration = Duration::from_secs(1);

impl ClusterLease {
    /// The lease of member `me` of the site `config` names, setting `role` (standby until
    /// it holds the lease). The client connects in the background, so an unreachable NATS
    /// only keeps this member standing by.
    ///
    /// # Errors
    /// [`ClusterError::Options`] when a credential or TLS file cannot be read,
    /// [`ClusterError::Connect`] when the client cannot start.
    pub async fn connect(
        config: &ClusterConfig,
        me: Member,
        role: SiteRole,
    ) -> Result<Self, ClusterError> {
        let connection = config.connection();
        let options = connect::options(&connection, format!("edge {} (site)", me.edge_id))
            .map_err(ClusterError::Options)?
            // A link gone silent (a NAT entry expired, a cable pulled) is found dead after
            // two unanswered pings: within seconds, not the client's default minutes, so a
            // member is back in its site as soon as the network is. Not more often than a
            // second: a busy member's brief stall must not read as a dead link.
            .ping_interval(config.request_timeout().max(MIN_PING_INTERVAL));
        // With `retry_on_initial_connect` this only spawns the connection task.
        let client = options
            .connect(connection.servers())
            .await
            .map_err(ClusterError::Connect)?;
        let mut js = jetstream::new(client);
        js.set_timeout(config.request_timeout());
        role.set(standby(None, "looking for the site's lease".to_owned()));
        Ok(Self {
            config: config.clone(),
            js,
            me,
            role,
            stats: LeaseStats::default(),
            take_over: None,
        })
    }

    /// The JetStream context of the site's NATS client, for the site's journal stream.
    pub fn jetstream(&self) -> jetstream::Context {
        self.js.clone()
    }

    /// Runs `take_over` after each acquisition of the lease, before acting.
    #[must_use]
    pub fn with_take_over(mut self, take_over: Arc<dyn TakeOver>) -> Self {
        self.take_over = Some(take_over);
        self
    }

    /// The lease's counters.
    pub fn stats(&self) -> LeaseStats {
        self.stats.clone()
    }

    /// Runs the lease on a task of its own until [`LeaseTask::stop`] (or until the
    /// [`LeaseTask`] is dropped, which stops it too: the lease is released in the
    /// background, and never renewed by a task nobody owns).
    pub fn start(self) -> LeaseTask {
        let stop = CancellationToken::new();
        let task = tokio::spawn(self.run(stop.clone()));
        LeaseTask {
            stop,
            task: Some(task),
        }
    }

    async fn run(self, stop: CancellationToken) {
        let mut member = Ticks {
            lease: self,
            bucket: None,
            watch: None,
            state: State::Standby(Watching::default()),
            stood_down: false,
            pending_role: None,
            fenced: false,
        };
        loop {
            let next = member.tick().await;
            let fenced = member.fenced();
            member.fenced = tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep_until(next) => false,
                () = member.lease_written() => false,
                () = fenced => true,
            };
        }
        member.release().await;
    }
}

/// The running lease task; dropping it stops the task.
pub struct LeaseTask {
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl LeaseTask {
    /// Stops the task, releasing the lease if this member holds it, and waits for it.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take()
            && let Err(error) = task.await
        {
            tracing::error!(%error, "the cluster lease task failed");
        }
    }
}

impl Drop for LeaseTask {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Where this member stands.
enum State {
    Standby(Watching),
    Active(Held),
}

/// What a standby remembers of the lease it watches: the domain's [`LeaseWatch`] (its
/// revision, and since when it has not changed), on a monotonic clock started with it.
struct Watching {
    watch: LeaseWatch,
    /// The monotonic clock's zero.
    started: Instant,
    /// The reason last set, so a change is logged once.
    reason: String,
}

impl Default for Watching {
    fn default() -> Self {
        Self {
            watch: LeaseWatch::default(),
            started: Instant::now(),
            reason: String::new(),
        }
    }
}

impl Watching {
    /// How long `revision` has been seen unchanged, noting it.
    fn unchanged_for(&mut self, revision: Option<u64>) -> Duration {
        let now = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.watch.unchanged_for(revision, now))
    }
}

/// The loop's state.
struct Ticks {
    lease: ClusterLease,
    bucket: Option<SiteBucket>,
    /// While standing by: every write to the lease, so a release is taken at once.
    watch: Option<async_nats::jetstream::kv::Watch>,
    state: State,
    /// This member stopped acting in the current step.
    stood_down: bool,
    /// The standby role to show once the takeover's `stand_down` has let the open runs go
    /// (before it, the node transport would send the nodes away and their runs would end).
    pending_role: Option<Role>,
    /// The site's journal refused this member's batch: it stops acting at the next step.
    fenced: bool,
}

impl Ticks {
    fn timing(&self) -> LeaseTiming {
        self.lease.config.timing()
    }

    /// One step, then what stopping to act asks (when this step stopped it); when to take
    /// the next. Standing down completes before the next step may take the lease again.
    async fn tick(&mut self) -> Instant {
        let next = self.step().await;
        if std::mem::take(&mut self.stood_down)
            && let Some(take_over) = &self.lease.take_over
        {
            take_over.stand_down().await;
        }
        if let Some(role) = self.pending_role.take() {
            self.lease.role.set(role);
        }
        next
    }

    /// One step; when to take the next.
    async fn step(&mut self) -> Instant {
        let poll = Instant::now() + Duration::from_millis(self.timing().renew_ms);
        if self.bucket.is_none() {
            let config = &self.lease.config;
            match bounded(
                config.request_timeout(),
                SiteBucket::open(&self.lease.js, &config.bucket(), config.replicas),
            )
            .await
            {
                Ok(bucket) => self.bucket = Some(bucket),
                Err(error) => {
                    self.stand_by(None, format!("cannot reach the site's NATS: {error}"));
                    return poll;
                }
            }
        }
        match self.state {
            State::Standby(_) => self.standby_tick(poll).await,
            State::Active(_) if std::mem::take(&mut self.fenced) => {
                self.step_down(StepDown::Fenced);
                Instant::now()
            }
            State::Active(held) => self.active_tick(held).await,
        }
    }

    /// Returns when the site's journal refused this member's batch while it acts (never
    /// while standing by, or without a takeover).
    fn fenced(&self) -> impl Future<Output = ()> + use<> {
        let watched = match (&self.state, &self.lease.take_over) {
            (State::Active(held), Some(take_over)) => Some((held.epoch, Arc::clone(take_over))),
            _ => None,
        };
        async move {
            match watched {
                Some((epoch, take_over)) => take_over.fenced(epoch).await,
                None => std::future::pending().await,
            }
        }
    }

    /// Returns when the lease is written while this member stands by (never while active,
    /// or without a watch: then the poll alone looks).
    async fn lease_written(&mut self) {
        let Some(watch) = &mut self.watch else {
            return std::future::pending().await;
        };
        if !matches!(watch.next().await, Some(Ok(_))) {
            // Ended or failed: the next look makes another.
            self.watch = None;
        }
    }

    async fn standby_tick(&mut self, poll: Instant) -> Instant {
        let timeout = self.lease.config.request_timeout();
        let Some(bucket) = &self.bucket else {
            return poll;
        };
        if self.watch.is_none() {
            self.watch = bounded(timeout, bucket.watch()).await.ok();
        }
        let seen = match bounded(timeout, bucket.read()).await {
            Ok(seen) => seen,
            Err(error) => {
                self.stand_by(None, format!("cannot reach the site's NATS: {error}"));
                return poll;
            }
        };
        let State::Standby(watching) = &mut self.state else {
            return poll;
        };
        let unchanged = watching.unchanged_for(seen.revision());
        let unchanged_ms = u64::try_from(unchanged.as_millis()).unwrap_or(u64::MAX);
        let me = &self.lease.me;
        let step = decide_standby(&seen, &me.digest, now_ms(), unchanged_ms, self.timing());
        match standing(step, me) {
            Standing::Acquire(revision) => self.acquire(revision).await,
            Standing::StandBy(holder, reason) => self.stand_by(holder.as_ref(), reason),
        }
        poll
    }

    /// Writes the lease (create, or compare-and-set at `revision`); active on success.
    async fn acquire(&mut self, revision: Option<u64>) {
        let Some(bucket) = &self.bucket else {
            return;
        };
        let expires_at_ms = now_ms().saturating_add(self.timing().lease_ms);
        let lease = self.lease_value(expires_at_ms);
        let write = async {
            match revision {
                None => bucket.create(&lease).await,
                Some(revision) => bucket.update(&lease, revision).await,
            }
        };
        match bounded(self.lease.config.request_timeout(), write).await {
            Ok(acquired) => {
                LeaseStats::count(&self.lease.stats.counters.acquisitions);
                tracing::info!(
                    site = %self.lease.config.site,
                    epoch = acquired,
                    "this member holds the site's lease: active"
                );
                let Some(held) = self.prepared(Held::acquired(acquired, expires_at_ms)).await
                else {
                    return;
                };
                self.state = State::Active(held);
                self.watch = None;
                self.bound_acting(&held);
                self.lease.role.set(Role::Active { epoch: acquired });
            }
            // Someone else was faster: the next look shows who.
            Err(WriteError::Conflict) => {}
            Err(error) => {
                self.stand_by(None, format!("cannot reach the site's NATS: {error}"));
            }
        }
    }

    /// Runs the takeover of the lease `held` before acting, under a standby role, renewing
    /// the lease as an active member would meanwhile (a journal to fold or runs to adopt may
    /// take longer than a lease), for `takeover_timeout_ms` at most. The lease as renewed
    /// when it is done; `None` when it failed, took too long or lost the lease: this member
    /// then stands by, lets go of what the takeover took (`stand_down`, at the end of this
    /// step) and lets the lease lapse.
    async fn prepared(&mut self, mut held: Held) -> Option<Held> {
        let Some(take_over) = self.lease.take_over.clone() else {
            return Some(held);
        };
        let why = "taking over: catching up on the site's journal".to_owned();
        self.lease.role.set(standby(None, why));
        let limit = self.lease.config.takeover_timeout();
        let prepare = tokio::time::timeout(limit, take_over.prepare(held.epoch));
        tokio::pin!(prepare);
        // When to renew next: as an active member would, and after a failed renewal when
        // the domain says to try again (never at once, however fast NATS fails).
        let mut renew_at = match decide_active(&held, now_ms(), self.timing()) {
            ActiveStep::Wait { until_ms } => at_wall(until_ms),
            ActiveStep::Renew | ActiveStep::StepDown(_) => Instant::now(),
        };
        let problem = loop {
            tokio::select! {
                prepared = &mut prepare => match prepared {
                    Ok(Ok(())) => return Some(held),
                    Ok(Err(problem)) => break NotTakenOver::Failed(problem),
                    Err(_) => break NotTakenOver::TooLong(limit),
                },
                () = tokio::time::sleep_until(renew_at) => {
                    renew_at = match self.renew(held).await {
                        ActiveStep::StepDown(_) => break NotTakenOver::LeaseLost,
                        ActiveStep::Wait { until_ms } => at_wall(until_ms),
                        ActiveStep::Renew => Instant::now(),
                    };
                    if let State::Active(renewed) = self.state {
                        held = renewed;
                    }
                }
            }
        };
        tracing::warn!(%problem, "cannot take over: letting the lease lapse");
        self.stand_by(None, format!("cannot take over: {problem}"));
        self.stood_down = true;
        None
    }

    async fn active_tick(&mut self, held: Held) -> Instant {
        let timing = self.timing();
        let mut step = decide_active(&held, now_ms(), timing);
        if step == ActiveStep::Renew {
            step = self.renew(held).await;
        }
        match step {
            ActiveStep::Wait { until_ms } => at_wall(until_ms),
            ActiveStep::StepDown(why) => {
                self.step_down(why);
                Instant::now()
            }
            // `renew` never answers Renew.
            ActiveStep::Renew => Instant::now(),
        }
    }

    /// Renews `held`; what to do next.
    async fn renew(&mut self, held: Held) -> ActiveStep {
        let timing = self.timing();
        let Some(bucket) = &self.bucket else {
            return ActiveStep::StepDown(StepDown::Unreachable);
        };
        let now = now_ms();
        let until_step_down = held.step_down_at_ms(timing).saturating_sub(now);
        let timeout = self
            .lease
            .config
            .request_timeout()
            .min(Duration::from_millis(until_step_down));
        let expires_at_ms = now.saturating_add(timing.lease_ms);
        let lease = self.lease_value(expires_at_ms);
        let stats = &self.lease.stats.counters;
        let failure = match bounded(timeout, bucket.update(&lease, held.revision)).await {
            Ok(revision) => {
                LeaseStats::count(&stats.renewals);
                let renewed = held.renewed(revision, expires_at_ms);
                self.state = State::Active(renewed);
                self.bound_acting(&renewed);
                return decide_active(&renewed, now_ms(), timing);
            }
            Err(WriteError::Conflict) => RenewFailure::Conflict,
            Err(error) => {
                tracing::warn!(%error, "could not renew the site's lease; trying again");
                RenewFailure::Unreachable
            }
        };
        LeaseStats::count(&stats.renewal_failures);
        after_renew_failure(failure, &held, now_ms(), timing)
    }

    /// Bounds this member's acting by when `held` says it must step down, so a member
    /// paused past it wakes up refusing work before this task runs again.
    fn bound_acting(&self, held: &Held) {
        let step_down_at = at_wall(held.step_down_at_ms(self.timing()));
        self.lease.role.act_until(step_down_at.into_std());
    }

    fn step_down(&mut self, why: StepDown) {
        let reason = match why {
            StepDown::Lost => "lost the site's lease: another member wrote it",
            StepDown::Unreachable => {
                "could not renew the site's lease before it would lapse (NATS unreachable)"
            }
            StepDown::Fenced => {
                "the site's journal refused this member's batch: another member writes it now"
            }
        };
        tracing::warn!(site = %self.lease.config.site, "{reason}: standing by");
        self.state = State::Standby(Watching::default());
        self.stood_down = true;
        self.stand_by(None, reason.to_owned());
    }

    /// Stands by (from any state), pointing callers to `holder` when known.
    fn stand_by(&mut self, holder: Option<&Lease>, reason: String) {
        if let State::Active(_) = self.state {
            self.state = State::Standby(Watching::default());
            self.stood_down = true;
        }
        if let State::Standby(watching) = &mut self.state
            && watching.reason != reason
        {
            let site = &self.lease.config.site;
            // A digest mismatch needs an operator: it never resolves by waiting.
            if reason.starts_with(MISMATCH) {
                tracing::warn!(%site, %reason, "standing by");
            } else {
                tracing::info!(%site, %reason, "standing by");
            }
            watching.reason.clone_from(&reason);
        }
        let role = standby(holder, reason);
        if self.stood_down && self.lease.take_over.is_some() {
            self.pending_role = Some(role);
        } else {
            self.lease.role.set(role);
        }
    }

    /// On a clean stop: deletes the lease this member holds, so a standby takes it now.
    async fn release(&mut self) {
        let (State::Active(held), Some(bucket)) = (&self.state, &self.bucket) else {
            return;
        };
        let timeout = self.lease.config.request_timeout();
        match bounded(timeout, bucket.release(held.revision)).await {
            Ok(()) => tracing::info!(site = %self.lease.config.site, "released the site's lease"),
            Err(error) => tracing::warn!(%error, "the site's lease lapses on its own"),
        }
        self.stand_by(None, "stopped".to_owned());
    }

    fn lease_value(&self, expires_at_ms: u64) -> Lease {
        let me = &self.lease.me;
        Lease {
            edge_id: me.edge_id.clone(),
            node_address: me.node_address.clone(),
            api_address: me.api_address.clone(),
            expires_at_ms,
            node_definitions_digest: me.digest.clone(),
        }
    }
}

/// What a standby does on the domain's step.
#[derive(Debug, PartialEq, Eq)]
enum Standing {
    /// Writes the lease: creates it (`None`), or takes it over at the revision read.
    Acquire(Option<u64>),
    /// Stands by, pointing callers to the holder when it is another member, saying why.
    StandBy(Option<Lease>, String),
}

/// What member `me`, standing by, does on `step`: a lease it wrote itself (before it
/// stood by, or before a restart) points nobody to it.
fn standing(step: StandbyStep, me: &Member) -> Standing {
    match step {
        StandbyStep::Create => Standing::Acquire(None),
        StandbyStep::TakeOver { revision } => Standing::Acquire(Some(revision)),
        StandbyStep::Follow(lease) if lease.edge_id == me.edge_id => {
            let reason = "the site's lease is one this member wrote before it stood by (or \
                          before a restart); taking it again once it lapses";
            Standing::StandBy(None, reason.to_owned())
        }
        StandbyStep::Follow(lease) => {
            let reason = format!("edge {} holds the site's lease", lease.edge_id);
            Standing::StandBy(Some(lease), reason)
        }
        StandbyStep::AwaitLapse(lease) => {
            let reason = "the site's lease has expired; taking it over once it has stayed \
                          unchanged for a whole lease";
            Standing::StandBy(lease, reason.to_owned())
        }
        StandbyStep::Mismatch(lease) => {
            let reason = format!(
                "{MISMATCH} from those of edge {}, which holds the site's lease (digest {} \
                 here, {} there): this member never takes over from it",
                lease.edge_id, me.digest, lease.node_definitions_digest
            );
            Standing::StandBy(Some(lease), reason)
        }
    }
}

/// A standby role pointing to `holder`, when known.
fn standby(holder: Option<&Lease>, reason: String) -> Role {
    Role::Standby {
        active: holder.map(|lease| ActiveMember {
            edge_id: lease.edge_id.clone(),
            node_address: lease.node_address.clone(),
            api_address: lease.api_address.clone(),
        }),
        reason,
    }
}

/// The monotonic instant of wall-clock `at_ms` (now, if it has passed).
fn at_wall(at_ms: u64) -> Instant {
    Instant::now() + Duration::from_millis(at_ms.saturating_sub(now_ms()))
}

/// `request`, or [`NoAnswer`] once `timeout` has passed.
async fn bounded<T, E: From<NoAnswer>>(
    timeout: Duration,
    request: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    tokio::time::timeout(timeout, request)
        .await
        .unwrap_or_else(|_| Err(NoAnswer(timeout).into()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::site::StandbyStep;
    use crate::ports::JournalError;

    fn me() -> Member {
        Member {
            edge_id: "edge-b".into(),
            node_address: "10.0.0.2:7100".into(),
            api_address: "10.0.0.2:8080".into(),
            digest: "sha256:bb".into(),
        }
    }

    fn lease(edge_id: &str, digest: &str) -> Lease {
        Lease {
            edge_id: edge_id.into(),
            node_address: "10.0.0.1:7100".into(),
            api_address: "10.0.0.1:8080".into(),
            expires_at_ms: 1_000,
            node_definitions_digest: digest.into(),
        }
    }

    #[test]
    fn a_standby_writes_an_absent_or_lapsed_lease_and_follows_a_live_one_by_name() {
        assert_eq!(
            standing(StandbyStep::Create, &me()),
            Standing::Acquire(None)
        );
        assert_eq!(
            standing(StandbyStep::TakeOver { revision: 41 }, &me()),
            Standing::Acquire(Some(41))
        );
        let holder = lease("edge-a", "sha256:bb");
        assert_eq!(
            standing(StandbyStep::Follow(holder.clone()), &me()),
            Standing::StandBy(
                Some(holder.clone()),
                "edge edge-a holds the site's lease".into()
            )
        );
        let Standing::StandBy(pointed, reason) =
            standing(StandbyStep::AwaitLapse(Some(holder.clone())), &me())
        else {
            panic!("a lapsing lease is waited for");
        };
        assert_eq!(pointed, Some(holder));
        assert!(
            reason.starts_with("the site's lease has expired"),
            "{reason}"
        );
    }

    #[test]
    fn a_lease_this_member_wrote_points_nobody_to_it() {
        let mine = lease("edge-b", "sha256:bb");
        let Standing::StandBy(pointed, reason) = standing(StandbyStep::Follow(mine), &me()) else {
            panic!("its own live lease is followed, not taken");
        };
        assert_eq!(pointed, None, "callers are not sent to this member");
        assert!(reason.contains("one this member wrote"), "{reason}");
    }

    #[test]
    fn other_node_definitions_are_named_with_both_digests() {
        let other = lease("edge-a", "sha256:aa");
        let Standing::StandBy(pointed, reason) =
            standing(StandbyStep::Mismatch(other.clone()), &me())
        else {
            panic!("a mismatch stands by");
        };
        assert_eq!(pointed, Some(other));
        assert_eq!(
            reason,
            "node definitions differ from those of edge edge-a, which holds the site's lease \
             (digest sha256:bb here, sha256:aa there): this member never takes over from it"
        );
        assert!(reason.starts_with(MISMATCH), "logged as a warning");
    }

    #[test]
    fn a_takeover_that_did_not_finish_says_why_in_the_standbys_reason() {
        let failed = NotTakenOver::from(TakeOverError::Budgets(JournalError::Unavailable(
            "locked".into(),
        )));
        assert_eq!(
            failed.to_string(),
            "cannot load the budgets: the run journal cannot be read: locked"
        );
        assert_eq!(
            NotTakenOver::TooLong(Duration::from_secs(60)).to_string(),
            "it took longer than 60000 ms"
        );
        assert_eq!(
            NotTakenOver::LeaseLost.to_string(),
            "the lease was lost while taking over"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_an_answer_in_time_is_no_answer() {
        let limit = Duration::from_millis(250);
        let answered: Result<u64, WriteError> = bounded(limit, async { Ok(7) }).await;
        assert_eq!(answered.ok(), Some(7));
        let silent = bounded(limit, std::future::pending::<Result<u64, WriteError>>()).await;
        assert!(
            matches!(silent, Err(WriteError::NoAnswer(NoAnswer(after))) if after == limit),
            "{silent:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_counts_how_long_the_lease_stayed_unchanged_and_starts_over_on_a_write() {
        let mut watching = Watching::default();
        assert_eq!(watching.unchanged_for(Some(4)), Duration::ZERO);
        tokio::time::advance(Duration::from_millis(700)).await;
        assert_eq!(watching.unchanged_for(Some(4)), Duration::from_millis(700));
        assert_eq!(watching.unchanged_for(Some(5)), Duration::ZERO, "renewed");
        tokio::time::advance(Duration::from_millis(300)).await;
        assert_eq!(watching.unchanged_for(Some(5)), Duration::from_millis(300));
        assert_eq!(watching.unchanged_for(None), Duration::ZERO, "released");
    }
}
