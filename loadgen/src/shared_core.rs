//! `api --rig shared-core`: issue 50's topology, where the simulated nodes share the edge's
//! core. On two CPUs this process is the client (the same closed-loop keep-alive client as
//! `api`, one connection per worker) pinned to core 0; a child of it (the hidden
//! `rig-server` scenario) pinned to core 1 runs the edge on the shipped defaults (journal
//! on, the stdout sink into `/dev/null`) on its own runtime, the nodes on a one-worker
//! runtime of theirs, and a bare hyper server ([`crate::bare`]) answering the edge's own
//! captured answer on a third. With `--floor`, the child runs the floor relay
//! ([`crate::floor`]) too, on a one-worker runtime `floor`, with nodes of its own (as many
//! as the edge's, the same kind) on another, `floor-nodes`, and the client drives it after
//! the bare server and before the edge. Every figure is taken by the client; CPU per
//! request is read from the child's threads by name (`edge*`, `nodes`, `bare`, `floor`,
//! `floor-nodes`), and so is the
//! per-thread account of the edge's window: each group's CPU time, time runnable but
//! waiting for the core (`schedstat`'s run-queue wait) and switches, per request. TTFB is from the
//! request's write to the first non-empty body frame (a streamed response's headers do not
//! count: the edge may send them before the node answers).
//!
//! With fewer than two CPUs it says so and runs unpinned. It measures; it asserts nothing
//! about the figures.

use std::cell::RefCell;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;

use crate::Common;
use crate::api::{self, ApiArgs, Driven, Load, PATH, drive};
use crate::bare;
use crate::floor;
use crate::harness::{self, InProcessEdge, SchedTimes};
use crate::http::post_json;
use crate::mock_node::MockNode;
use crate::stats::Record;

/// The client's core.
const CLIENT_CPU: usize = 0;
/// The core of the edge, its nodes and the bare server.
const SERVER_CPU: usize = 1;
/// The line the server child writes to its standard error once it serves.
const READY: &str = "@rig-ready ";
/// How long the server child may take to start, and to stop.
const START_LIMIT: Duration = Duration::from_secs(120);
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// The per-thread account of the edge's window: the child's thread groups, most specific
/// first (a thread counts in the first its name starts with), and the record's keys for
/// each one's CPU time, run-queue wait (runnable, not running) and switches per request.
const THREAD_GROUPS: [(&str, [&str; 3]); 4] = [
    (
        "edge-journal",
        [
            "journal_cpu_us_per_request",
            "journal_run_queue_us_per_request",
            "journal_switches_per_request",
        ],
    ),
    (
        "edge-sink",
        [
            "sink_cpu_us_per_request",
            "sink_run_queue_us_per_request",
            "sink_switches_per_request",
        ],
    ),
    (
        "nodes",
        [
            "nodes_cpu_us_per_request",
            "nodes_run_queue_us_per_request",
            "nodes_switches_per_request",
        ],
    ),
    (
        "edge",
        [
            "edge_runtime_cpu_us_per_request",
            "edge_runtime_run_queue_us_per_request",
            "edge_runtime_switches_per_request",
        ],
    ),
];

/// TTFB's end: the body has its first bytes.
fn first_frame(body: &[u8]) -> bool {
    !body.is_empty()
}

/// The server child and what it serves.
struct Server {
    child: Child,
    edge: SocketAddr,
    bare: SocketAddr,
    /// The floor relay's HTTP address, with `--floor`.
    floor: Option<SocketAddr>,
    /// Passes the child's other standard error lines on to ours.
    forwarder: Option<JoinHandle<()>>,
}

impl Server {
    /// Starts `loadgen rig-server` with `args`, pinned to `cpu` when given, and waits until
    /// it serves.
    fn start(args: &ApiArgs, common: &Common, cpu: Option<usize>) -> anyhow::Result<Self> {
        let exe = std::env::current_exe().context("cannot find this program")?;
        let mut server_args = args.clone();
        server_args.server_cpu = cpu;
        let mut child = Command::new(exe)
            .args(common.to_args())
            .arg("rig-server")
            .args(api::child_args(&server_args))
            // Closed by `stop`: the child's signal to end.
            .stdin(Stdio::piped())
            // The edge's stdout sink writes here, as `edge serve`'s would.
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("cannot start the rig's server child")?;
        let stderr = child.stderr.take().context("the child has no stderr")?;
        let (ready, addrs) = mpsc::channel();
        let forwarder = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                match line.strip_prefix(READY) {
                    Some(rest) => {
                        let _ = ready.send(rest.to_owned());
                    }
                    None => eprintln!("{line}"),
                }
            }
        });
        let mut server = Self {
            child,
            edge: SocketAddr::from(([127, 0, 0, 1], 0)),
            bare: SocketAddr::from(([127, 0, 0, 1], 0)),
            floor: None,
            forwarder: Some(forwarder),
        };
        let line = addrs
            .recv_timeout(START_LIMIT)
            .context("the rig's server child did not start")?;
        for field in line.split_whitespace() {
            match field.split_once('=') {
                Some(("edge", addr)) => server.edge = addr.parse()?,
                Some(("bare", addr)) => server.bare = addr.parse()?,
                Some(("floor", addr)) => server.floor = Some(addr.parse()?),
                _ => bail!("a bad ready line from the rig's server child: {line:?}"),
            }
        }
        Ok(server)
    }

    /// The scheduler's counts of the child's [`THREAD_GROUPS`] so far.
    fn sched(&self) -> Vec<SchedTimes> {
        let prefixes = THREAD_GROUPS.map(|(prefix, _)| prefix);
        harness::process_threads_sched(self.child.id(), &prefixes)
    }

    /// CPU time used so far by the child's threads whose name starts with `prefix`, in ms.
    fn cpu_ms(&self, prefix: &str) -> u64 {
        harness::process_threads_cpu_ms(self.child.id(), prefix)
    }

    /// Closes the child's standard input, waits for it to end (killing it after
    /// [`STOP_LIMIT`]), and reports how it ended.
    fn stop(mut self) -> anyhow::Result<()> {
        drop(self.child.stdin.take());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > STOP_LIMIT {
                // Only the child this struct started.
                let _ = self.child.kill();
                bail!("the rig's server child did not stop within {STOP_LIMIT:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(forwarder) = self.forwarder.take() {
            let _ = forwarder.join();
        }
        if !status.success() {
            bail!("the rig's server child ended with {status}");
        }
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Only the child this struct started; after `stop`, it has ended already.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The client side: starts the server child, drives the bare server, the floor relay (with
/// `--floor`) and then the edge at each mode and concurrency, and reports one record per
/// case.
pub fn run(args: &ApiArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    // Counted once, before the first repetition pins this process to one CPU (which the
    // count would see afterwards).
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, std::num::NonZero::get));
    let pinned = cores >= 2;
    if pinned {
        // The load runtime's threads, started below, inherit it.
        edge_thread_slice::pin_to_cpu(CLIENT_CPU)
            .with_context(|| format!("cannot pin the client to CPU {CLIENT_CPU}"))?;
    } else {
        eprintln!("loadgen api: {cores} CPU here: the shared-core rig runs unpinned");
    }
    let server = Server::start(args, common, pinned.then_some(SERVER_CPU))?;
    let load = harness::runtime("load", common.load_threads)?;
    let warmup = Duration::from_millis(args.warmup_ms);
    let duration = Duration::from_millis(args.duration_ms);
    let bare_cpu = || (server.cpu_ms("bare"), 0);
    // `floor` counts the floor's nodes (`floor-nodes`) too: they are taken back out.
    let floor_cpu = || {
        let nodes = server.cpu_ms("floor-nodes");
        (server.cpu_ms("floor").saturating_sub(nodes), nodes)
    };
    // The thread groups' counts are taken with the CPU's, at the window's two edges.
    let window = RefCell::new(Vec::new());
    let edge_cpu = || {
        window.borrow_mut().push(server.sched());
        (server.cpu_ms("edge"), server.cpu_ms("nodes"))
    };
    let on_bare = Driven {
        cpu_ms: &bare_cpu,
        watch: Some(first_frame),
    };
    let on_floor = Driven {
        cpu_ms: &floor_cpu,
        watch: Some(first_frame),
    };
    let on_edge = Driven {
        cpu_ms: &edge_cpu,
        watch: Some(first_frame),
    };
    let mut records = Vec::new();
    for mode in &args.modes {
        let stream = api::streams(mode)?;
        for &concurrency in &args.concurrency {
            let concurrency = concurrency.max(1);
            let request = |addr| Arc::new(post_json(addr, PATH, &api::body(args.chunks, stream)));
            let bare = drive(
                &load,
                server.bare,
                request(server.bare),
                concurrency,
                warmup,
                duration,
                &on_bare,
            )?;
            let floor = match server.floor {
                Some(addr) => Some(drive(
                    &load,
                    addr,
                    request(addr),
                    concurrency,
                    warmup,
                    duration,
                    &on_floor,
                )?),
                None => None,
            };
            window.borrow_mut().clear();
            let edge = drive(
                &load,
                server.edge,
                request(server.edge),
                concurrency,
                warmup,
                duration,
                &on_edge,
            )?;
            let requests = edge.requests_per_s * duration.as_secs_f64();
            let account = thread_account(&window.take(), requests);
            let errors = edge.errors + bare.errors + floor.as_ref().map_or(0, |f| f.errors);
            records.push(
                Record::new(format!("rig=shared-core mode={mode} c={concurrency}"))
                    .with("edge_rps", edge.requests_per_s)
                    .with("bare_rps", bare.requests_per_s)
                    .with("ratio", edge.requests_per_s / bare.requests_per_s.max(1e-9))
                    .with("edge_ttfb_p50_us", edge.first_byte.quantile_us(0.5))
                    .with("edge_ttfb_p99_us", edge.first_byte.quantile_us(0.99))
                    .with("bare_ttfb_p50_us", bare.first_byte.quantile_us(0.5))
                    .with("bare_ttfb_p99_us", bare.first_byte.quantile_us(0.99))
                    .with(
                        "ttfb_p99_overhead_us",
                        edge.first_byte.quantile_us(0.99) - bare.first_byte.quantile_us(0.99),
                    )
                    .with("edge_total_p99_us", edge.total.quantile_us(0.99))
                    .with("bare_total_p99_us", bare.total.quantile_us(0.99))
                    .with("edge_cpu_us_per_request", edge.cpu_us_per_request)
                    .with("bare_cpu_us_per_request", bare.cpu_us_per_request)
                    .with_all(
                        floor.map_or_else(Vec::new, |floor| floor_figures(&floor, &edge, &bare)),
                    )
                    .with("pinned", f64::from(u8::from(pinned)))
                    .with("errors", errors as f64)
                    .with_all(account),
            );
        }
    }
    load.shutdown_timeout(Duration::from_secs(2));
    server.stop()?;
    Ok(records)
}

/// The floor relay's figures beside the bare server's and the edge's.
fn floor_figures(floor: &Load, edge: &Load, bare: &Load) -> Vec<(&'static str, f64)> {
    vec![
        ("floor_rps", floor.requests_per_s),
        (
            "floor_ratio",
            floor.requests_per_s / bare.requests_per_s.max(1e-9),
        ),
        (
            "edge_floor_ratio",
            edge.requests_per_s / floor.requests_per_s.max(1e-9),
        ),
        ("floor_ttfb_p50_us", floor.first_byte.quantile_us(0.5)),
        ("floor_ttfb_p99_us", floor.first_byte.quantile_us(0.99)),
        ("floor_total_p99_us", floor.total.quantile_us(0.99)),
        ("floor_cpu_us_per_request", floor.cpu_us_per_request),
        (
            "floor_nodes_cpu_us_per_request",
            floor.other_cpu_us_per_request,
        ),
    ]
}

/// The floor relay in the server child (`--floor`): the relay on its runtime, its nodes on
/// theirs.
struct FloorRig {
    runtime: tokio::runtime::Runtime,
    nodes: tokio::runtime::Runtime,
    http: SocketAddr,
    servers: Vec<tokio::task::JoinHandle<anyhow::Result<u64>>>,
    mocks: Vec<MockNode>,
}

impl FloorRig {
    /// Starts the floor answering `canned` and registers nodes of `args`'s kind with it, as
    /// many as the edge has.
    fn start(
        args: &ApiArgs,
        canned: bare::Canned,
        stop: CancellationToken,
    ) -> anyhow::Result<Self> {
        let runtime = harness::runtime("floor", 1)?;
        let addrs = runtime.block_on(floor::start(canned, api::most_concurrent(args), stop))?;
        let nodes = harness::runtime("floor-nodes", 1)?;
        let (servers, mocks) =
            nodes.block_on(api::start_nodes(args, addrs.nodes, args.nodes.max(1)))?;
        Ok(Self {
            runtime,
            nodes,
            http: addrs.http,
            servers,
            mocks,
        })
    }

    /// Ends the floor (its connections close with its runtime), then its nodes.
    fn stop(self) {
        self.runtime.shutdown_timeout(Duration::from_secs(1));
        for server in self.servers {
            let _ = self.nodes.block_on(server);
        }
        for mock in self.mocks {
            mock.kill();
            let _ = self.nodes.block_on(mock.ended());
        }
        self.nodes.shutdown_timeout(Duration::from_secs(2));
    }
}

/// The server child (`rig-server`): pins itself, starts the edge, its nodes, the bare
/// server and (with `--floor`) the floor relay and its nodes, says where they listen, and
/// serves until its standard input closes.
pub fn serve(args: &ApiArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    if let Some(cpu) = args.server_cpu {
        // Before any thread starts: every thread of this process inherits it.
        edge_thread_slice::pin_to_cpu(cpu)
            .with_context(|| format!("cannot pin the rig's servers to CPU {cpu}"))?;
    }
    harness::init_logging(common);
    let edge = InProcessEdge::start(
        &api::edge_config(args, None),
        &[api::sink_kind(args)],
        common.edge_threads,
    )?;
    let nodes = harness::runtime("nodes", 1)?;
    let (servers, mocks) =
        nodes.block_on(api::start_nodes(args, edge.node_addr, args.nodes.max(1)))?;
    let canned = nodes
        .block_on(api::capture(edge.http_addr, args.chunks))
        .context("the edge's API did not answer as expected")?;
    let bare_runtime = harness::runtime("bare", 1)?;
    let stop = CancellationToken::new();
    let floor = args
        .floor
        .then(|| FloorRig::start(args, canned.clone(), stop.clone()))
        .transpose()?;
    let bare = bare_runtime.block_on(bare::start(canned, stop.clone()))?;
    let floor_addr = floor
        .as_ref()
        .map_or_else(String::new, |floor| format!(" floor={}", floor.http));
    eprintln!("{READY}edge={} bare={bare}{floor_addr}", edge.http_addr);
    // The parent closes it when it is done (or by ending).
    let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
    stop.cancel();
    bare_runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(floor) = floor {
        floor.stop();
    }
    edge.stop();
    for server in servers {
        let _ = nodes.block_on(server);
    }
    for mock in mocks {
        mock.kill();
        let _ = nodes.block_on(mock.ended());
    }
    nodes.shutdown_timeout(Duration::from_secs(2));
    Ok(Vec::new())
}

/// Each thread group's CPU time, run-queue wait and switches per request over the window
/// whose two samples `window` holds (nothing when it holds fewer).
fn thread_account(window: &[Vec<SchedTimes>], requests: f64) -> Vec<(&'static str, f64)> {
    let [start, end] = window else {
        return Vec::new();
    };
    let per_request = |n: u64| n as f64 / requests.max(1.0);
    THREAD_GROUPS
        .iter()
        .zip(end.iter().zip(start).map(|(end, start)| end.since(*start)))
        .flat_map(|((_, [cpu, run_queue, switches]), spent)| {
            [
                (*cpu, per_request(spent.cpu_ns) / 1_000.0),
                (*run_queue, per_request(spent.run_queue_ns) / 1_000.0),
                (*switches, per_request(spent.switches)),
            ]
        })
        .collect()
}
