//! `journal`: the run journal's writer on its own: R runs shaped like the API scenario's
//! (accepted, placed, one batch of started, N outputs and the ending), written through the
//! `RunJournal` port in transactions of B runs (a flush after every B), on the shipped
//! default journal settings. Reports the writer thread's CPU per run — the journal's share
//! of a request's cost, free of the HTTP path's noise — runs/s and the files' size.

use std::time::Instant;

use anyhow::Context;
use clap::Args;
use edge::components::SqliteJournal;
use edge::ports::RunJournal;
use edge::settings::JournalConfig;

use crate::Common;
use crate::admin::{base_ms, entries};
use crate::harness;
use crate::stats::Record;

#[derive(Debug, Clone, Args)]
pub struct JournalArgs {
    /// Runs written.
    #[arg(long, default_value_t = 100_000)]
    pub runs: usize,
    /// Runs per transaction (recorded, then flushed).
    #[arg(long, default_value_t = 64)]
    pub per_batch: usize,
    /// Text outputs per run.
    #[arg(long, default_value_t = 16)]
    pub outputs: usize,
    /// Nodes the runs are spread over (the API scenario has 4): each node's runs are a
    /// separate place in the node index, dirtied by every transaction.
    #[arg(long, default_value_t = 16)]
    pub nodes: usize,
    /// A run's events come in the transaction after the one that accepts it, as when runs
    /// outlast the writer's linger (the API scenario's at high rates); else in the same.
    #[arg(long)]
    pub split: bool,
    /// `journal.retention_max_bytes` (the shipped default: 1 GiB).
    #[arg(long)]
    pub max_bytes: Option<u64>,
}

pub fn run(args: &JournalArgs, _common: &Common) -> anyhow::Result<Vec<Record>> {
    let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
    let path = dir.path().join("journal.sqlite3");
    let mut config = JournalConfig::default();
    if let Some(max_bytes) = args.max_bytes {
        config.retention_max_bytes = max_bytes;
    }
    let journal = SqliteJournal::open(&config, &path)?;
    let runtime = harness::runtime("journal-bench", 1)?;
    let base = base_ms();
    let cpu_before = harness::threads_cpu_ms("edge-journal");
    let started = Instant::now();
    let per_batch = args.per_batch.max(1);
    let mut later = Vec::new();
    for i in 0..args.runs {
        let mut run = entries(i, args.nodes, base, args.outputs)?;
        if args.split {
            later.extend(run.split_off(2));
        }
        for entry in run {
            journal.record(entry);
        }
        if (i + 1) % per_batch == 0 {
            runtime.block_on(journal.flush());
            for entry in later.drain(..) {
                journal.record(entry);
            }
        }
    }
    for entry in later {
        journal.record(entry);
    }
    runtime.block_on(journal.flush());
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_ms = harness::threads_cpu_ms("edge-journal") - cpu_before;
    let stats = journal.stats();
    runtime.block_on(journal.close());
    let runs = args.runs.max(1) as f64;
    Ok(vec![
        Record::new(format!(
            "runs={} per_batch={} outputs={} nodes={} split={}",
            args.runs, args.per_batch, args.outputs, args.nodes, args.split
        ))
        .with("writer_cpu_us_per_run", cpu_ms as f64 * 1000.0 / runs)
        .with("runs_per_s", runs / elapsed)
        .with("file_mib", stats.bytes as f64 / f64::from(1u32 << 20))
        .with("write_errors", stats.write_errors as f64),
    ])
}
