//! Composition of `[cluster]`: the one [`SiteRole`] of this edge (every part that acts on
//! it — `/readyz`, the client APIs, the management API, the node transport — gets a clone
//! of the handle made here), the lease task that sets it, and its metrics. Without
//! `[cluster]` the role stays [`Role::Single`], no NATS client starts and nothing here runs.
//!
//! With `[cluster]` and the journal on, the journal is replicated (decision 49): this
//! member's journal file is a cache of the site's stream ([`SiteJournal`]), folded in while
//! it stands by; taking the lease runs the takeover service ([`SiteTakeOver`]: catch up on
//! the stream, claim it under the new epoch, re-adopt the open runs) before the role turns
//! active, and, when the lease makes it stop acting (or the stream refused its batch), stop
//! publishing and let its open runs go without ending them. This module only wires it.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::Settings;
use crate::adapters::cluster::{
    ClusterLease, JournalStream, JournalStreamTasks, LeaseStats, Member, StreamStats, advertised,
};
use crate::adapters::journal::{ReplicaFeed, SqliteJournal};
use crate::app::runs::RunService;
use crate::app::takeover::SiteTakeOver;
use crate::domain::site::definitions_digest;
use crate::ports::{NodeStore, Role, RunJournal, SiteRole};

/// The journal of a member of a site: its local file (a cache of the site's stream) and
/// the feed of the batches it writes while it publishes.
pub(super) struct SiteJournal {
    journal: Arc<SqliteJournal>,
    feed: ReplicaFeed,
}

/// The run journal: replicated with `[cluster]` (and the journal on), else as without.
///
/// # Errors
/// The journal's file cannot be used.
pub(super) fn journal(
    settings: &Settings,
) -> anyhow::Result<(Arc<dyn RunJournal>, Option<SiteJournal>)> {
    if settings.cluster.is_none() || !settings.journal.enabled {
        return Ok((super::admin::journal(settings)?, None));
    }
    let (journal, feed) =
        SqliteJournal::open_replicated(&settings.journal, &settings.journal_file())
            .context("cannot open the run journal")?;
    let journal = Arc::new(journal);
    let shared: Arc<dyn RunJournal> = journal.clone();
    Ok((shared, Some(SiteJournal { journal, feed })))
}

/// The site's journal stream as this member runs it, once the lease is built.
pub(super) struct Replication {
    stream: JournalStream,
    feed: ReplicaFeed,
}

impl Replication {
    /// Starts the stream's tasks (before the lease, so a takeover can catch up).
    pub(super) fn start(self) -> JournalStreamTasks {
        self.stream.start(self.feed)
    }
}

/// The replication of `journal` over `lease`'s NATS, when both are there: the lease runs
/// the takeover before acting; the stream's metrics are registered on `meter`.
pub(super) fn replicate(
    settings: &Settings,
    lease: Option<ClusterLease>,
    journal: Option<SiteJournal>,
    runs: &RunService,
    meter: &Meter,
) -> (Option<ClusterLease>, Option<Replication>) {
    let (lease, SiteJournal { journal, feed }, config) = match (lease, journal, &settings.cluster) {
        (Some(lease), Some(journal), Some(config)) => (lease, journal, config),
        (lease, _, _) => return (lease, None),
    };
    let stream = JournalStream::new(
        lease.jetstream(),
        &config.site,
        config.replicas,
        settings.edge_id.to_string(),
        Arc::clone(&journal),
        config.snapshot_policy(),
    );
    observe_stream(meter, &stream);
    let take_over = SiteTakeOver::new(Arc::new(stream.clone()), journal, Arc::new(runs.clone()));
    let lease = lease.with_take_over(Arc::new(take_over));
    let replication = Replication { stream, feed };
    (Some(lease), Some(replication))
}

/// This edge's role: alone without `[cluster]`; with it, a standby until its lease says
/// otherwise.
pub(super) fn site_role(settings: &Settings) -> SiteRole {
    match settings.cluster {
        None => SiteRole::default(),
        Some(_) => SiteRole::new(Role::Standby {
            active: None,
            reason: "looking for the site's lease".to_owned(),
        }),
    }
}

/// The lease of this member, when `[cluster]` is set: it advertises `listeners` (the
/// node and HTTP listeners' bound addresses) unless `advertise_*` say otherwise, and the
/// digest of `store`'s definitions; its metrics are registered on `meter`.
///
/// # Errors
/// An address that cannot be advertised (a wildcard listener without `advertise_*`), or a
/// NATS credential or TLS file that cannot be read.
pub(super) async fn lease(
    settings: &Settings,
    store: &dyn NodeStore,
    site: &SiteRole,
    listeners: (SocketAddr, SocketAddr),
    meter: &Meter,
) -> anyhow::Result<Option<ClusterLease>> {
    let Some(config) = &settings.cluster else {
        return Ok(None);
    };
    let address = |key: &str, given: &Option<String>, listener| {
        advertised(given.as_deref(), listener)
            .map_err(|problem| anyhow::anyhow!("`cluster.{key}`: {problem}"))
    };
    let me = Member {
        edge_id: settings.edge_id.to_string(),
        node_address: address("advertise_nodes", &config.advertise_nodes, listeners.0)?,
        api_address: address("advertise_api", &config.advertise_api, listeners.1)?,
        digest: definitions_digest(&store.records()),
    };
    tracing::info!(
        site = %config.site,
        nodes = %me.node_address,
        api = %me.api_address,
        digest = %me.digest,
        "joining the site"
    );
    let lease = ClusterLease::connect(config, me, site.clone())
        .await
        .context("cannot join the site")?;
    observe(meter, site.clone(), lease.stats());
    Ok(Some(lease))
}

/// A counter read from the lease's stats: name, description, how to read it.
type LeaseCounter = super::nats_metrics::StatsCounter<LeaseStats>;

/// `edge_cluster_role`, `edge_cluster_epoch` and the lease's counters.
fn observe(meter: &Meter, site: SiteRole, stats: LeaseStats) {
    let role = site.clone();
    meter
        .u64_observable_gauge("edge_cluster_role")
        .with_description("1 for this member's role in its site (active or standby), else 0")
        .with_callback(move |o| {
            let active = u64::from(role.acts());
            o.observe(active, &[KeyValue::new("role", "active")]);
            o.observe(1 - active, &[KeyValue::new("role", "standby")]);
        })
        .build();
    meter
        .u64_observable_gauge("edge_cluster_epoch")
        .with_description("The epoch this member acts under while active, else 0")
        .with_callback(move |o| o.observe(site.epoch(), &[]))
        .build();
    let counters: [LeaseCounter; 3] = [
        (
            "edge_cluster_lease_acquisitions",
            "Times this member acquired the site's lease (created it or took it over)",
            LeaseStats::acquisitions,
        ),
        (
            "edge_cluster_lease_renewals",
            "Renewals of the site's lease NATS confirmed",
            LeaseStats::renewals,
        ),
        (
            "edge_cluster_lease_renewal_failures",
            "Renewals of the site's lease that failed (another member wrote it, or NATS did \
             not answer in time)",
            LeaseStats::renewal_failures,
        ),
    ];
    super::nats_metrics::observe_counters(meter, &stats, counters);
}

/// A counter read from the journal stream's stats.
type StreamCounter = super::nats_metrics::StatsCounter<StreamStats>;

/// Upper bounds (seconds) of the publish-to-acknowledgement histogram's bins: a local
/// JetStream answers in about a millisecond, a cluster of three in a few.
const ACK_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// The journal stream's plain counters.
const STREAM_COUNTERS: [StreamCounter; 8] = [
    (
        "edge_cluster_journal_published",
        "Journal batches (and claims) the site's stream acknowledged",
        StreamStats::published,
    ),
    (
        "edge_cluster_journal_publish_failures",
        "Appends to the site's stream that got no answer or an error and were tried again",
        StreamStats::publish_failures,
    ),
    (
        "edge_cluster_journal_refused",
        "Journal batches the site's stream refused because another member claimed it \
         (this member was fenced)",
        StreamStats::refused,
    ),
    (
        "edge_cluster_journal_kept_local",
        "Journal batches kept in this member's file only (refused, or not published before \
         it stood down)",
        StreamStats::kept_local,
    ),
    (
        "edge_cluster_journal_folded",
        "Journal batches of other members (or earlier lives) folded from the site's stream",
        StreamStats::folded,
    ),
    (
        "edge_cluster_journal_snapshots",
        "Snapshots of the journal this member stored in the site's object store (the stream \
         was then purged below them)",
        StreamStats::snapshots,
    ),
    (
        "edge_cluster_journal_snapshot_failures",
        "Snapshots begun and given up (the copy, the store or the purge failed)",
        StreamStats::snapshot_failures,
    ),
    (
        "edge_cluster_journal_rebuilds",
        "Times this member replaced its journal file with the site's newest snapshot (or \
         emptied it, with none) and folded the stream on from there",
        StreamStats::rebuilds,
    ),
];

/// The journal stream's instruments (`edge_cluster_journal_*`).
fn observe_stream(meter: &Meter, stream: &JournalStream) {
    let stats = stream.stats();
    super::nats_metrics::observe_counters(meter, &stats, STREAM_COUNTERS);
    let skipped = stats.clone();
    meter
        .u64_observable_counter("edge_cluster_journal_skipped")
        .with_description(
            "Journal batches from the site's stream not folded, by why: this life's own, of an \
             older epoch, or undecodable",
        )
        .with_callback(move |o| {
            o.observe(skipped.skipped_own(), &[KeyValue::new("reason", "own")]);
            o.observe(
                skipped.skipped_stale(),
                &[KeyValue::new("reason", "stale_epoch")],
            );
            o.observe(
                skipped.undecodable(),
                &[KeyValue::new("reason", "undecodable")],
            );
        })
        .build();
    let snapshot = stats.clone();
    meter
        .u64_observable_gauge("edge_cluster_journal_folded_sequence")
        .with_description("The site's stream sequence this member has folded up to")
        .with_callback(move |o| o.observe(stats.folded_sequence(), &[]))
        .build();
    meter
        .u64_observable_gauge("edge_cluster_journal_snapshot_sequence")
        .with_description(
            "The site's stream sequence covered by the last snapshot this member stored or \
             rebuilt its journal from",
        )
        .with_callback(move |o| o.observe(snapshot.snapshot_sequence(), &[]))
        .build();
    let acks = meter
        .f64_histogram("edge_cluster_journal_ack")
        .with_description(
            "Time from a journal batch's first append to the stream's acknowledgement",
        )
        .with_unit("s")
        .with_boundaries(ACK_BUCKETS.to_vec())
        .build();
    stream.on_ack(Box::new(move |latency| {
        acks.record(latency.as_secs_f64(), &[]);
    }));
}
