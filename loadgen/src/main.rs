//! `cargo run --release -p edge-loadgen -- SCENARIO [OPTIONS]`: a load generator that
//! speaks the real node protocol and HTTP to an edge and reports what the edge sustains.
//!
//! Scenarios (each prints one `loadgen SCENARIO: ...` line per case, per repetition and as
//! the median over `--repeat` repetitions):
//! - `register`: N nodes connect and register; registrations/s, handshake p50/p99, the
//!   edge's RSS before and after (the `edge` binary as its own process).
//! - `relay`: M nodes stream runs of K output events as fast as the edge takes them;
//!   events/s into each sink kind and node→caller latency.
//! - `runs`: runs through the run service with instant nodes; runs/s and the latency the
//!   edge adds over the raw loopback round trip measured in the same run.
//! - `api`: OpenAI chat completions through the HTTP API next to a direct HTTP baseline;
//!   `--rig shared-core`: issue 50's topology, the edge, its nodes and a bare hyper
//!   baseline on one core, the client on the other.
//! - `storm`: N connected nodes, the edge killed and restarted, every node reconnecting at
//!   once (immediately, or with the reference node's jittered backoff); time until all are
//!   back, handshake p50/p99, the kernel's listen-queue counters, runs served afterwards.
//! - `readopt`: N streamed runs open on reference nodes, the edge killed and restarted on
//!   its journal; the time until the restarted edge serves and has taken every run back,
//!   and the runs lost and events missing or repeated.
//! - `slow-consumer`: a node that stops reading while large runs are offered to it; how
//!   far the edge's memory grows before it closes the node as a slow consumer.
//! - `churn`: nodes that drop and reconnect at random under streamed chat requests; the
//!   share of requests completed and of runs cut after their first output.
//! - `affinity`: four `llama-server` engines, forty multi-turn conversations with a long
//!   shared system prompt; prompt tokens the engines evaluated and reused with the edge's
//!   prefix affinity on and off, beside the usage API's cache hit rate.
//! - `latency`: a `llama-server` asked directly and through the edge and a reference node
//!   (and SMG), interleaved; time to first token and to the end, and the edge path's time
//!   to first token hop by hop, from the edge's and the node's hop events. With `--lora`,
//!   each path asked for a LoRA of the model too: what the LoRA costs, and what the edge adds.
//! - `sessions`: thirty-two agent sessions sharing eight long system prompts on four
//!   `llama-server` engines, through the shipped binaries and through SMG (`cache_aware`,
//!   `round_robin`); prompt tokens served from cache against the workload's ceiling, time
//!   to first token per turn, and the turns a client saw fail with one engine killed.
//!
//! It is a crate of the workspace, not part of the edge's release build. The method and the figures are in
//! `docs/benchmarks.md`; every load goes to loopback only and every loop is bounded in time.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario is one measured sequence (setup, load, baseline, report line) kept in \
              the order it runs, so the figures in docs/benchmarks.md can be read off the code; \
              this is the benchmark tool, not the edge"
)]

mod admin;
mod affinity;
mod api;
mod bare;
mod churn;
mod cold_start;
mod engine;
mod external;
mod floor;
mod harness;
mod hops;
mod http;
mod journal;
mod latency;
mod lean;
mod netstat;
mod readopt;
mod register;
mod relay;
mod runs;
mod sessions;
mod shared_core;
mod slow;
mod smg;
mod splice;
mod stats;
mod storm;

use std::process::{ExitCode, Output};

use edge_mock_node as mock_node;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use stats::Record;

#[derive(Debug, Parser)]
#[command(about = "Load generator for the edge: register, relay, runs, api, storm, churn, ...")]
struct Cli {
    #[command(flatten)]
    common: Common,
    #[command(subcommand)]
    scenario: Scenario,
}

/// Options every scenario shares.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// Worker threads of the edge's runtime (in process) or of the `edge` process.
    #[arg(long, global = true, default_value_t = 1)]
    pub edge_threads: usize,
    /// Worker threads of the load generator's runtime (simulated nodes and clients).
    #[arg(long, global = true, default_value_t = 1)]
    pub load_threads: usize,
    /// Independent repetitions; the last lines give the median of each figure.
    #[arg(long, global = true, default_value_t = 1)]
    pub repeat: usize,
    /// The edge's log level (the shipped config says `info`).
    #[arg(long, global = true, default_value = "info")]
    pub edge_log_level: String,
    /// The run journal of the edges this starts: `on`, as the shipped config has it (SQLite,
    /// in the run's temporary directory), or `off` (`[journal] enabled = false`, a labelled
    /// variant).
    #[arg(long, global = true, default_value = "on", value_parser = ["on", "off"],
        num_args = 0..=1, default_missing_value = "on")]
    pub journal: String,
    /// The journal's disk limit (`[journal] retention_max_bytes`); the shipped 1 GiB when
    /// left out.
    #[arg(long, global = true)]
    pub journal_max_bytes: Option<u64>,
    /// Export the in-process edge's spans over OTLP/HTTP to a receiver in this program
    /// that discards them (`[tracing] otlp_endpoint`), to measure what tracing costs.
    #[arg(long, global = true)]
    pub otlp: bool,
    /// Internal: run as a child of another loadgen and report records on stderr.
    #[arg(long, global = true, hide = true)]
    pub child: bool,
}

impl Common {
    /// These options as arguments for a child process.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("--edge-threads={}", self.edge_threads),
            format!("--load-threads={}", self.load_threads),
            format!("--edge-log-level={}", self.edge_log_level),
        ]
        .into_iter()
        .chain([format!("--journal={}", self.journal)])
        .chain(
            self.journal_max_bytes
                .map(|bytes| format!("--journal-max-bytes={bytes}")),
        )
        .chain(self.otlp.then(|| "--otlp".to_owned()))
        .collect()
    }
}

#[derive(Debug, Subcommand)]
enum Scenario {
    /// N nodes connect and register: registrations/s, handshake latency, RSS per node.
    Register(register::RegisterArgs),
    /// M nodes stream run events as fast as the edge takes them, into each sink kind.
    Relay(relay::RelayArgs),
    /// Runs through the run service: runs/s and added latency over the raw round trip.
    Runs(runs::RunsArgs),
    /// OpenAI chat completions through the HTTP API versus a direct HTTP baseline.
    Api(api::ApiArgs),
    /// A node that stops reading: the edge's memory growth until it closes the node.
    SlowConsumer(slow::SlowArgs),
    /// The management API with many nodes and a large run journal.
    Admin(admin::AdminArgs),
    /// The run journal's writer alone: its CPU per run, on the shipped settings.
    Journal(journal::JournalArgs),
    /// Connected nodes, the edge killed and restarted: every node reconnects at once.
    Storm(storm::StormArgs),
    /// Streamed runs open on reference nodes, the edge killed and restarted on its journal:
    /// how long until the runs are taken back, and whether any event was lost or repeated.
    Readopt(readopt::ReadoptArgs),
    /// Nodes dropping and reconnecting under streamed chat: what share of requests completes.
    Churn(churn::ChurnArgs),
    /// Four llama-server engines, multi-turn conversations: prompt tokens evaluated and
    /// reused with the edge's affinity on and off, next to the usage API's hit rate.
    Affinity(affinity::AffinityArgs),
    /// A real llama-server asked directly and through the edge and a reference node (and
    /// SMG): time to first token and to the end, and the edge path's time per hop.
    Latency(latency::LatencyArgs),
    /// A request for a model loaded nowhere against one already loaded (issue 48).
    ColdStart(cold_start::ColdStartArgs),
    /// Agent sessions on four llama-server engines through the edge and through SMG
    /// (`cache_aware`, `round_robin`): prompt tokens served from cache against the
    /// workload's ceiling, time to first token per turn, turns failed with an engine killed.
    Sessions(sessions::SessionsArgs),
    /// Internal: the server side of `api --rig shared-core` (the edge, its nodes and the
    /// bare baseline), serving until its standard input closes.
    #[command(hide = true)]
    RigServer(api::ApiArgs),
}

impl Scenario {
    fn name(&self) -> &'static str {
        match self {
            Self::Register(_) => "register",
            Self::Relay(_) => "relay",
            Self::Runs(_) => "runs",
            Self::Api(_) => "api",
            Self::SlowConsumer(_) => "slow-consumer",
            Self::Admin(_) => "admin",
            Self::Journal(_) => "journal",
            Self::Storm(_) => "storm",
            Self::Readopt(_) => "readopt",
            Self::Churn(_) => "churn",
            Self::Affinity(_) => "affinity",
            Self::Latency(_) => "latency",
            Self::ColdStart(_) => "cold-start",
            Self::Sessions(_) => "sessions",
            Self::RigServer(_) => "rig-server",
        }
    }

    fn run_once(&self, common: &Common) -> anyhow::Result<Vec<Record>> {
        match self {
            Self::Register(args) => register::run(args, common),
            Self::Relay(args) => relay::run(args, common),
            Self::Runs(args) => runs::run(args, common),
            Self::Api(args) => api::run(args, common),
            Self::SlowConsumer(args) => slow::run(args, common),
            Self::Admin(args) => admin::run(args, common),
            Self::Journal(args) => journal::run(args, common),
            Self::Storm(args) => storm::run(args, common),
            Self::Readopt(args) => readopt::run(args, common),
            Self::Churn(args) => churn::run(args, common),
            Self::Affinity(args) => affinity::run(args, common),
            Self::Latency(args) => latency::run(args, common),
            Self::ColdStart(args) => cold_start::run(args, common),
            Self::Sessions(args) => sessions::run(args, common),
            Self::RigServer(args) => shared_core::serve(args, common),
        }
    }
}

/// The prefix of the machine-readable record lines a child writes to stderr.
const CHILD_RECORD: &str = "@record ";

/// Runs `scenario` with `args` in a child of this program whose standard output is
/// `/dev/null` — for the cases where the edge writes the stdout sink, which would otherwise
/// mix into this program's results — and returns the records it reported.
pub fn run_in_child(
    common: &Common,
    scenario: &str,
    args: &[String],
) -> anyhow::Result<Vec<Record>> {
    let exe = std::env::current_exe().context("cannot find this program")?;
    let output = std::process::Command::new(exe)
        .args(common.to_args())
        .arg("--child")
        .arg(scenario)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .with_context(|| format!("cannot start the child for {scenario}"))?;
    records_from_child(&output)
}

/// A record as one line for the parent: `KEY\tname=value\t...`.
fn child_line(record: &Record) -> String {
    let mut line = format!("{CHILD_RECORD}{}", record.key);
    for (name, value) in &record.values {
        line.push_str(&format!("\t{name}={value}"));
    }
    line
}

/// The records a child reported; its other stderr lines are passed on.
pub fn records_from_child(output: &Output) -> anyhow::Result<Vec<Record>> {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut records = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix(CHILD_RECORD) else {
            eprintln!("{line}");
            continue;
        };
        let mut fields = rest.split('\t');
        let mut record = Record::new(fields.next().unwrap_or_default());
        for field in fields {
            let (name, value) = field.split_once('=').context("a bad record line")?;
            // Names are a small fixed set; leaking them keeps `Record` simple.
            let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
            record
                .values
                .push((name, value.parse().context("a bad record value")?));
        }
        records.push(record);
    }
    if !output.status.success() {
        bail!("the child run failed with {}", output.status);
    }
    Ok(records)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    harness::keep_journal(cli.common.journal == "on", cli.common.journal_max_bytes);
    let scenario = cli.scenario.name();
    let repeat = cli.common.repeat.max(1);
    let mut repetitions = Vec::new();
    for index in 0..repeat {
        let records = match cli.scenario.run_once(&cli.common) {
            Ok(records) => records,
            Err(error) => {
                eprintln!("loadgen {scenario}: failed: {error:#}");
                return ExitCode::FAILURE;
            }
        };
        for record in &records {
            if cli.common.child {
                eprintln!("{}", child_line(record));
            } else {
                println!(
                    "{}",
                    stats::line(scenario, &format!("run {}/{repeat} ", index + 1), record)
                );
            }
        }
        repetitions.push(records);
    }
    if !cli.common.child {
        for record in stats::medians(&repetitions) {
            println!(
                "{}",
                stats::line(scenario, &format!("median of {repeat} "), &record)
            );
        }
    }
    ExitCode::SUCCESS
}

/// The edge binary's allocator, so the in-process edge measures what `edge serve` runs
/// (decision 26).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
