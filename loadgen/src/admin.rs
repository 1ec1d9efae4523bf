//! `admin`: the management API at scale: `GET /admin/v1/nodes` with N configured nodes, and
//! run listings, one run's record and its event replay over a journal pre-filled with R
//! finished runs (3 events each, spread over the nodes, 1 % failed). The journal is filled
//! through the `RunJournal` port (the writer thread the edge uses), which also gives the
//! journal's raw write rate.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use edge::components::SqliteJournal;
use edge::domain::{
    AcceptedRun, AdapterName, Attempt, EdgeFailure, EventOrigin, NodeId, Operation, RunEvent,
    RunEventKind, RunId, Target, Usage,
};
use edge::ports::{JournalEntry, RelayedEvent, RunJournal};
use edge::settings::JournalConfig;
use edge::settings::SinkKind;

use crate::Common;
use crate::harness::{self, InProcessEdge, Nodes};
use crate::stats::{Histogram, Record};

#[derive(Debug, Clone, Args)]
pub struct AdminArgs {
    /// Configured nodes.
    #[arg(long, default_value_t = 10_000)]
    pub nodes: usize,
    /// Finished runs in the journal.
    #[arg(long, default_value_t = 100_000)]
    pub runs: usize,
    /// Requests per measured route.
    #[arg(long, default_value_t = 20)]
    pub requests: usize,
    /// The prefill waits for the journal after this many runs: 1 writes each run in a
    /// transaction (a batch row) of its own, as an edge at low load does.
    #[arg(long, default_value_t = 5_000)]
    pub flush_every: usize,
}

/// When the first pre-filled run was accepted (ms since the epoch); run `i` came `i` ms later.
pub(crate) fn base_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        .saturating_sub(3_600_000)
}

pub(crate) fn run_id(i: usize) -> RunId {
    RunId::new(format!("run-prefill-{i:07}"))
}

/// Run `i`'s entries as the relay records them: accepted, placed, and one batch of its
/// events (started, `outputs` text outputs, its ending; 1 % fail).
pub(crate) fn entries(
    i: usize,
    nodes: usize,
    base: u64,
    outputs: usize,
) -> anyhow::Result<Vec<JournalEntry>> {
    let (adapter, target) = (
        AdapterName::parse(harness::ADAPTER)?,
        Target::parse(harness::TARGET)?,
    );
    let node = NodeId::parse(&format!("lg-{:06}", i % nodes.max(1)))?;
    let at = base + i as u64;
    let accepted = AcceptedRun {
        run_id: run_id(i),
        adapter: adapter.clone(),
        target: target.clone(),
        operation: Operation::Chat,
        pin: None,
        api_key_name: None,
        queued_ms: at,
        deadline_ms: None,
        client_stream: None,
        affinity: None,
        budget_reserve: None,
    };
    let attempt = Attempt {
        number: 1,
        node: node.clone(),
        route_reason: "least_busy".into(),
        started_ms: at,
    };
    let end = if i.is_multiple_of(100) {
        EdgeFailure::NodeDisconnected.into_event_kind()
    } else {
        RunEventKind::Completed {
            finish_reason: "stop".into(),
            usage: Some(Usage::new(12, 80)),
        }
    };
    let kinds = std::iter::once(RunEventKind::Started)
        .chain((0..outputs).map(|_| RunEventKind::text("a reply of a few words")))
        .chain(std::iter::once(end));
    let mut out = vec![
        JournalEntry::Accepted(Box::new(accepted)),
        JournalEntry::Placed {
            run_id: run_id(i),
            attempt,
        },
    ];
    let mut events = Vec::with_capacity(outputs + 2);
    for (index, kind) in kinds.into_iter().enumerate() {
        let event = RunEvent {
            run_id: run_id(i),
            node: Some(node.clone()),
            adapter: adapter.clone(),
            target: target.clone(),
            seq: index as u64 + 1,
            origin: EventOrigin::Node,
            kind,
            route: None,
        };
        events.push(RelayedEvent {
            index: index as u64,
            at_ms: at,
            event: Arc::new(event),
            first_output: index == 1,
        });
    }
    out.push(JournalEntry::Events {
        run_id: run_id(i),
        events,
    });
    Ok(out)
}

/// Fills the journal in `config.path`, paced so its queue never overflows; entries/s.
fn prefill(config: &JournalConfig, args: &AdminArgs, base: u64) -> anyhow::Result<f64> {
    let file = config.path.clone().context("the journal needs a path")?;
    let journal = SqliteJournal::open(config, &file)?;
    let runtime = harness::runtime("prefill", 1)?;
    let started = Instant::now();
    let mut written = 0usize;
    for i in 0..args.runs {
        for entry in entries(i, args.nodes, base, 1)? {
            journal.record(entry);
            written += 1;
        }
        if (i + 1) % args.flush_every.max(1) == 0 {
            runtime.block_on(journal.flush());
        }
    }
    runtime.block_on(journal.flush());
    let rate = written as f64 / started.elapsed().as_secs_f64();
    runtime.block_on(journal.close());
    if journal.stats().dropped_queue_full > 0 {
        bail!("the prefill overflowed the journal's queue");
    }
    Ok(rate)
}

/// `GET path` `count` times; p50 and p99 in ms, and the body's size.
fn measure(edge: &InProcessEdge, path: &str, count: usize) -> anyhow::Result<(f64, f64, usize)> {
    let mut latency = Histogram::default();
    let mut bytes = 0;
    for _ in 0..count.max(1) {
        let started = Instant::now();
        let response = harness::http_get(edge.admin_addr, path)?;
        latency.record_duration(started.elapsed());
        if !response.starts_with("HTTP/1.1 200") {
            bail!(
                "GET {path}: {}",
                response.lines().next().unwrap_or_default()
            );
        }
        bytes = response
            .split_once("\r\n\r\n")
            .map_or(0, |(_, body)| body.len());
    }
    let ms = |q: f64| latency.quantile(q) as f64 / 1e6;
    Ok((ms(0.5), ms(0.99), bytes))
}

pub fn run(args: &AdminArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let path = dir.path().join("journal.sqlite3");
    let journal = JournalConfig {
        path: Some(path.clone()),
        retention_max_age: Default::default(),
        retention_max_bytes: 0,
        ..JournalConfig::default()
    };
    let base = base_ms();
    let prefill_rate = prefill(&journal, args, base)?;
    let nodes = Nodes {
        count: args.nodes,
        max_concurrent_runs: 4,
        heartbeat_interval_ms: 60_000,
    };
    let extra = format!(
        "[journal]\npath = {:?}\nretention_max_age = \"0\"\nretention_max_bytes = 0\n",
        path.display().to_string()
    );
    let edge = InProcessEdge::start(
        &harness::config(nodes, &extra),
        &[SinkKind::Null],
        common.edge_threads,
    )?;
    let middle = args.runs / 2;
    let cursor = format!("{}.{}", base + middle as u64, run_id(middle));
    let routes = [
        ("nodes", "/admin/v1/nodes".to_owned()),
        ("runs_first_page", "/admin/v1/runs?limit=100".to_owned()),
        (
            "runs_deep_page",
            format!("/admin/v1/runs?limit=100&cursor={cursor}"),
        ),
        (
            "runs_by_node",
            "/admin/v1/runs?node=lg-000123&limit=100".to_owned(),
        ),
        (
            "runs_failed",
            "/admin/v1/runs?outcome=failed&limit=100".to_owned(),
        ),
        ("run_record", format!("/admin/v1/runs/{}", run_id(middle))),
        (
            "run_events",
            format!("/admin/v1/runs/{}/events?follow=false", run_id(middle)),
        ),
    ];
    let mut records = Vec::new();
    for (name, route) in routes {
        let (p50, p99, bytes) = measure(&edge, &route, args.requests)?;
        records.push(
            Record::new(format!(
                "route={name} nodes={} runs={} flush_every={}",
                args.nodes, args.runs, args.flush_every
            ))
            .with("p50_ms", p50)
            .with("p99_ms", p99)
            .with("bytes", bytes as f64),
        );
    }
    records.push(
        Record::new(format!("prefill runs={}", args.runs)).with("entries_per_s", prefill_rate),
    );
    edge.stop();
    Ok(records)
}
