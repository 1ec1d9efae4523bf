//! The edge under test: generated configs with N node definitions, an in-process edge on
//! its own runtime (for scenarios that drive the run service), and the `edge` binary as a
//! separate process (for RSS figures of the edge alone).

use std::io::{Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use edge::settings::SinkKind;
use edge::telemetry::TracingConfig;
use edge::{App, AppParts, Settings};

use crate::external;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// The adapter and target every generated node serves.
pub const ADAPTER: &str = "echo";
pub const TARGET: &str = "default";

/// The token of generated node `i`.
pub fn token(i: usize) -> String {
    format!("loadgen-token-{i:06}")
}

/// What the generated nodes look like.
#[derive(Debug, Clone, Copy)]
pub struct Nodes {
    pub count: usize,
    pub max_concurrent_runs: u32,
    pub heartbeat_interval_ms: u32,
}

/// A config with `nodes` definitions (ids `lg-000000`.., tokens [`token`]) and `extra` TOML
/// sections before them.
pub fn config(nodes: Nodes, extra: &str) -> String {
    let mut toml = String::with_capacity(256 * nodes.count + extra.len());
    toml.push_str(extra);
    toml.push('\n');
    for i in 0..nodes.count {
        toml.push_str(&format!(
            "[[nodes]]\nid = \"lg-{i:06}\"\nalias = \"lga-{i:06}\"\ntoken = \"{}\"\n\
             [nodes.runtime]\nmax_concurrent_runs = {}\nheartbeat_interval_ms = {}\n\
             [[nodes.adapters]]\nname = \"{ADAPTER}\"\ntargets = [\"{TARGET}\"]\n\n",
            token(i),
            nodes.max_concurrent_runs,
            nodes.heartbeat_interval_ms,
        ));
    }
    toml
}

/// Whether edges started here keep the run journal (`--journal`, on unless `off`), set
/// once by `main`.
static JOURNAL: std::sync::OnceLock<(bool, Option<u64>)> = std::sync::OnceLock::new();

/// Turns the run journal on (or off) for every edge this process starts, with its disk
/// limit when given.
pub fn keep_journal(on: bool, max_bytes: Option<u64>) {
    let _ = JOURNAL.set((on, max_bytes));
}

fn journal_on() -> bool {
    JOURNAL.get().is_none_or(|(on, _)| *on)
}

fn journal_max_bytes() -> Option<u64> {
    JOURNAL.get().and_then(|(_, max)| *max)
}

/// A runtime for the load (or another part that does not run as the edge or a node would),
/// with `threads` workers.
pub fn runtime(name: &str, threads: usize) -> anyhow::Result<Runtime> {
    runtime_with_slice(name, threads, None)
}

/// Ready sockets the I/O driver of [`crowd_runtime`] hands to its scheduler per turn.
const CROWD_EVENTS_PER_TICK: usize = 32;

/// [`runtime`] for a crowd of simulated nodes on few threads, where each node's latency
/// must be the edge's and the kernel's, not a queue inside this program: each turn of its
/// I/O driver wakes at most [`CROWD_EVENTS_PER_TICK`] tasks, the rest stay ready in the
/// kernel's list, in order. With tokio's default (1,024 a turn) one turn woke several
/// hundred nodes at once; past the 256 tasks a worker's local queue holds, tokio moves
/// tasks to its global queue, which a busy worker visits once every few dozen polls, so a
/// node the edge had answered could wait 100–190 ms for this program to read the answer
/// (docs/benchmarks.md, the storm's tail).
pub fn crowd_runtime(name: &str, threads: usize) -> anyhow::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .max_io_events_per_tick(CROWD_EVENTS_PER_TICK)
        .enable_all()
        .build()
        .with_context(|| format!("cannot start the {name} runtime"))
}

/// [`runtime`] whose threads ask for `slice` as they start, as the threads of `edge serve`
/// and `edge-node` do (`None`: the kernel's default); threads they start inherit it.
pub fn runtime_with_slice(
    name: &str,
    threads: usize,
    slice: Option<Duration>,
) -> anyhow::Result<Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(name)
        .enable_all()
        .on_thread_start(move || {
            if let Some(slice) = slice {
                let _ = edge_thread_slice::request_slice(slice);
            }
        })
        .build()
        .with_context(|| format!("cannot start the {name} runtime"))
}

/// Installs the edge's own logging once per process (the in-process edge logs like the
/// binary does, to standard error); with `--otlp`, the span export layer too, exporting
/// to [`external::otlp_endpoint`] for the rest of the process.
pub fn init_logging(common: &crate::Common) {
    use std::sync::OnceLock;
    static EXPORTER: OnceLock<Option<edge::telemetry::Exporter>> = OnceLock::new();
    EXPORTER.get_or_init(|| {
        let tracing = otlp_config(common.otlp);
        let edge_id = edge::domain::EdgeId::parse("loadgen").expect("a valid id");
        let format = edge::settings::LogFormat::Pretty;
        edge::telemetry::init_with_tracing(&common.edge_log_level, format, &tracing, &edge_id)
            .unwrap_or_else(|error| {
                eprintln!("loadgen: cannot install the edge's logging: {error:#}");
                None
            })
    });
}

/// `[tracing]` for the in-process edge: export to this program's receiver with `--otlp`.
fn otlp_config(otlp: bool) -> TracingConfig {
    OTLP_ON.store(otlp, std::sync::atomic::Ordering::Relaxed);
    TracingConfig {
        otlp_endpoint: otlp.then(|| external::otlp_endpoint().to_owned()),
        ..TracingConfig::default()
    }
}

/// Whether `--otlp` is on (the edges built here then export spans).
static OTLP_ON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// An edge running inside this process on its own runtime.
pub struct InProcessEdge {
    pub runtime: Runtime,
    pub node_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub parts: AppParts,
    serving: Option<JoinHandle<anyhow::Result<()>>>,
    /// Holds the config and the file sink's `events.jsonl`.
    _dir: tempfile::TempDir,
}

impl InProcessEdge {
    /// Builds and starts an edge with `config`, listening on loopback port 0, its events
    /// going to `sinks` (the file sink writes `events.jsonl` in [`Self::dir`], the stdout
    /// sink writes this process's standard output).
    pub fn start(config: &str, sinks: &[SinkKind], threads: usize) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
        let path = dir.path().join("edge.toml");
        std::fs::write(&path, config).context("cannot write the edge config")?;
        let mut settings = Settings::load(Some(&path))?;
        settings.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        settings.http.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        settings.admin.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        if !config.contains("[journal]") {
            settings.journal.enabled = journal_on();
            if let Some(max) = journal_max_bytes() {
                settings.journal.retention_max_bytes = max;
            }
            settings.journal.path = Some(dir.path().join("journal.sqlite3"));
        }
        settings.server.shutdown_grace_ms = 2_000;
        settings.events.sinks = sinks.to_vec();
        settings.events.file.path = dir.path().join("events.jsonl");
        settings.tracing = otlp_config(OTLP_ON.load(std::sync::atomic::Ordering::Relaxed));
        // `edge serve` asks for its threads' scheduling slice before it starts any: here the
        // edge's runtime threads ask as they start, and the edge is built on one of them, so
        // the threads it starts (the journal's writer, the sinks' drains) inherit it.
        let runtime = runtime_with_slice("edge", threads, settings.thread_slice)?;
        let app = runtime.block_on(async { tokio::spawn(App::build(settings)).await })??;
        let node_addr = app.node_addr()?;
        let http_addr = app.http_addr()?;
        let admin_addr = app.admin_addr()?;
        let parts = app.parts();
        let serving = runtime.spawn(app.run_until_stopped());
        Ok(Self {
            runtime,
            node_addr,
            http_addr,
            admin_addr,
            parts,
            serving: Some(serving),
            _dir: dir,
        })
    }

    /// Stops the edge gracefully (bounded) and drops its runtime.
    /// Waits until the edge acts for its site (a member of one holds the lease), for
    /// `limit` at most.
    pub fn wait_acting(&self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while !self.parts.site.acts() {
            if started.elapsed() > limit {
                bail!("the edge did not take its site's lease within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn stop(mut self) {
        self.parts.stop.cancel();
        if let Some(serving) = self.serving.take() {
            let stopped = self
                .runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(10), serving).await });
            match stopped {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(error))) => eprintln!("loadgen: the edge stopped with {error:#}"),
                Ok(Err(error)) => eprintln!("loadgen: the edge task failed: {error}"),
                Err(_) => eprintln!("loadgen: the edge did not stop within 10 s"),
            }
        }
        self.runtime.shutdown_timeout(Duration::from_secs(2));
    }
}

/// A free loopback port (bound, read, released; the edge binds it right after).
fn free_port() -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?)
}

/// The `edge` binary running as a child process.
pub struct EdgeProcess {
    child: Child,
    pub node_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl EdgeProcess {
    /// Starts `binary serve` with `config` on free loopback ports, `threads` runtime
    /// workers and `log_level`, its output discarded, and waits until it serves HTTP.
    pub fn start(
        binary: &Path,
        config: &str,
        threads: usize,
        log_level: &str,
    ) -> anyhow::Result<Self> {
        Self::start_at(binary, config, threads, log_level, None, None, None)
    }

    /// [`Self::start`] on given (node, HTTP, management) addresses — those of an edge this
    /// one replaces — with the run journal at `journal` (one this process's temporary
    /// directory holds, when `None`), and the edge's log (its standard error) written to
    /// `log` (discarded, when `None`).
    pub fn start_at(
        binary: &Path,
        config: &str,
        threads: usize,
        log_level: &str,
        at: Option<(SocketAddr, SocketAddr, SocketAddr)>,
        journal: Option<&Path>,
        log: Option<std::fs::File>,
    ) -> anyhow::Result<Self> {
        let (node_addr, http_addr, admin_addr) = match at {
            Some(addrs) => addrs,
            None => (free_port()?, free_port()?, free_port()?),
        };
        let dir = tempfile::tempdir().context("cannot make a temporary directory")?;
        let journal = journal.map_or_else(|| dir.path().join("journal.sqlite3"), Path::to_path_buf);
        let path = dir.path().join("edge.toml");
        std::fs::write(&path, config).context("cannot write the edge config")?;
        let child = Command::new(binary)
            .arg("serve")
            .arg("--config")
            .arg(&path)
            .arg("--listen")
            .arg(node_addr.to_string())
            .arg("--http-listen")
            .arg(http_addr.to_string())
            .arg("--admin-listen")
            .arg(admin_addr.to_string())
            .env("EDGE__JOURNAL__ENABLED", journal_on().to_string())
            .env("EDGE__JOURNAL__PATH", journal)
            .envs(
                journal_max_bytes()
                    .map(|max| ("EDGE__JOURNAL__RETENTION_MAX_BYTES", max.to_string())),
            )
            .arg("--log-level")
            .arg(log_level)
            .env("TOKIO_WORKER_THREADS", threads.max(1).to_string())
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log.map_or_else(Stdio::null, Stdio::from))
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let mut edge = Self {
            child,
            node_addr,
            http_addr,
            admin_addr,
            _dir: dir,
        };
        edge.wait_ready(Duration::from_secs(60))?;
        Ok(edge)
    }

    /// Waits until the edge is ready, or, a member of a site (`[cluster]`), stands by: up
    /// and answering, the lease held by another member or not yet by any.
    fn wait_ready(&mut self, limit: Duration) -> anyhow::Result<()> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(status) = self.child.try_wait()? {
                bail!("the edge exited at startup with {status}");
            }
            if http_get(self.http_addr, "/readyz").is_ok_and(|r| is_ready(&r) || stands_by(&r)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("the edge was not ready within {limit:?}")
    }

    /// The edge's resident set size in KiB.
    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        rss_kib(self.child.id())
    }

    /// CPU time the edge process used so far, in ms.
    pub fn cpu_ms(&self) -> u64 {
        process_cpu_ms(self.child.id())
    }

    /// `GET path` against the edge's HTTP port.
    pub fn get(&self, path: &str) -> anyhow::Result<String> {
        http_get(self.http_addr, path)
    }

    /// Whether `/readyz` answers 200 now (a member of a site: whether it is the active one).
    pub fn is_ready(&self) -> bool {
        self.get("/readyz")
            .is_ok_and(|response| is_ready(&response))
    }
}

/// Whether `response` (to `GET /readyz`) says ready.
fn is_ready(response: &str) -> bool {
    response.starts_with("HTTP/1.1 200")
}

/// Whether `response` (to `GET /readyz`) is a member of a site standing by.
fn stands_by(response: &str) -> bool {
    response.starts_with("HTTP/1.1 503")
        && response
            .split_once("\r\n\r\n")
            .is_some_and(|(_, body)| body.starts_with("standby"))
}

impl Drop for EdgeProcess {
    fn drop(&mut self) {
        // Only the child this struct started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` of process `pid` in KiB.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/PID/status")
}

/// A blocking `GET` with `Connection: close`; returns the whole response.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    Ok(response)
}

/// The value of the Prometheus sample `name{...label...}` in `text` (the first match).
pub fn metric(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter(|line| {
            line.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .find(|line| line.contains(label))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

/// Clock ticks per second of `/proc` CPU times (`CLK_TCK`, 100 on Linux).
const TICKS_PER_S: u64 = 100;

/// User plus system CPU time in `stat` (the text of a `/proc/.../stat` file), in ms.
fn stat_cpu_ms(stat: &str) -> Option<u64> {
    // The command name may hold spaces: the fields start after its closing parenthesis.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000 / TICKS_PER_S)
}

/// CPU time used so far by process `pid`, in ms (10 ms resolution).
pub fn process_cpu_ms(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat_cpu_ms(&stat))
        .unwrap_or(0)
}

/// CPU time used so far by the in-process edge: its runtime and sink threads (`edge*`) and,
/// with `--otlp`, the span exporter's threads (the SDK's batch processor and its HTTP
/// client), in ms.
pub fn edge_cpu_ms() -> u64 {
    threads_cpu_ms("edge") + threads_cpu_ms("OpenTelemetry") + threads_cpu_ms("reqwest-intern")
}

/// CPU time used so far by this process's threads whose name starts with `prefix`
/// (`edge` for the edge's runtime, workers and blocking pool alike), in ms.
pub fn threads_cpu_ms(prefix: &str) -> u64 {
    tasks_cpu_ms(Path::new("/proc/self/task"), prefix)
}

/// [`threads_cpu_ms`] of process `pid` (another loadgen: the shared-core rig's servers).
pub fn process_threads_cpu_ms(pid: u32, prefix: &str) -> u64 {
    tasks_cpu_ms(Path::new(&format!("/proc/{pid}/task")), prefix)
}

/// What the scheduler counted for a group of threads so far: time on a CPU, time runnable
/// but waiting for one (the run queue), and how often they were switched out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedTimes {
    pub cpu_ns: u64,
    pub run_queue_ns: u64,
    pub switches: u64,
}

impl SchedTimes {
    /// What was counted between `earlier` and this.
    pub fn since(self, earlier: SchedTimes) -> SchedTimes {
        SchedTimes {
            cpu_ns: self.cpu_ns.saturating_sub(earlier.cpu_ns),
            run_queue_ns: self.run_queue_ns.saturating_sub(earlier.run_queue_ns),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }
}

/// The scheduler's counts (`schedstat`, and `status`'s context switches) of process
/// `pid`'s threads, summed per group: each thread counts in the first of `prefixes` its
/// name starts with, or nowhere.
pub fn process_threads_sched(pid: u32, prefixes: &[&str]) -> Vec<SchedTimes> {
    let mut groups = vec![SchedTimes::default(); prefixes.len()];
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return groups;
    };
    for task in tasks.flatten() {
        let read = |file: &str| std::fs::read_to_string(task.path().join(file)).ok();
        let (Some(name), Some(schedstat), Some(status)) =
            (read("comm"), read("schedstat"), read("status"))
        else {
            continue;
        };
        let Some(group) = prefixes.iter().position(|p| name.trim_end().starts_with(p)) else {
            continue;
        };
        let mut counts = schedstat
            .split_whitespace()
            .map(|n| n.parse::<u64>().unwrap_or(0));
        let (cpu_ns, run_queue_ns) = (counts.next().unwrap_or(0), counts.next().unwrap_or(0));
        let switches: u64 = status
            .lines()
            .filter(|line| line.contains("ctxt_switches:"))
            .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
            .sum();
        let sum = &mut groups[group];
        sum.cpu_ns += cpu_ns;
        sum.run_queue_ns += run_queue_ns;
        sum.switches += switches;
    }
    groups
}

/// CPU time of the threads in `tasks` (a `/proc/.../task` directory) whose name starts
/// with `prefix`, in ms.
fn tasks_cpu_ms(tasks: &Path, prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir(tasks) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
        .filter(|stat| {
            stat.find('(')
                .is_some_and(|at| stat[at + 1..].starts_with(prefix))
        })
        .filter_map(|stat| stat_cpu_ms(&stat))
        .sum()
}
