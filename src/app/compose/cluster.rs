//! Composition of `[cluster]`: the one [`SiteRole`] of this edge (every part that acts on
//! it — `/readyz`, the client APIs, the management API, the node transport — gets a clone
//! of the handle made here), the lease task that sets it, and its metrics. Without
//! `[cluster]` the role stays [`Role::Single`], no NATS client starts and nothing here runs.

use std::net::SocketAddr;

use anyhow::Context;
use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;

use super::Settings;
use crate::adapters::cluster::{ClusterLease, LeaseStats, Member, advertised};
use crate::domain::site::definitions_digest;
use crate::ports::{NodeStore, Role, SiteRole};

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
type LeaseCounter = (&'static str, &'static str, fn(&LeaseStats) -> u64);

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
    for (name, description, read) in counters {
        let stats = stats.clone();
        meter
            .u64_observable_counter(name)
            .with_description(description)
            .with_callback(move |o| o.observe(read(&stats), &[]))
            .build();
    }
}
