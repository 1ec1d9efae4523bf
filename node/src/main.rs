//! `edge-node --edge HOST:PORT --token TOKEN` (`cargo install --path node`): the reference
//! node that puts OpenAI-compatible engines behind an edge (see `docs/node.md`).
//!
//! This file is the CLI: flags, logs, signals and the exit code. Everything else is in the
//! library (`lib.rs`), which the integration tests run in process.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use edge::client::{ServerName, tls_client_config};
use edge_node::options::host_of;
use edge_node::{BufferLimits, NodeOptions, TlsOptions};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "The reference node: puts OpenAI-compatible engines behind an edge"
)]
struct Args {
    /// The edge's node address (HOST:PORT), or the node addresses of a site's members,
    /// comma-separated (A,B[,C]): the node finds the one that acts.
    #[arg(long, env = "EDGE_NODE_EDGE", default_value = "127.0.0.1:7100")]
    edge: String,
    /// The node's pre-shared token (better: the EDGE_NODE_TOKEN environment variable).
    #[arg(
        long,
        env = "EDGE_NODE_TOKEN",
        hide_env_values = true,
        required_unless_present = "token_file",
        conflicts_with = "token_file"
    )]
    token: Option<String>,
    /// A file holding the node's token (its first line), such as a Kubernetes Secret's key
    /// mounted as a file; instead of --token.
    #[arg(long, env = "EDGE_NODE_TOKEN_FILE", value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// The node id to claim (empty: let the token decide).
    #[arg(long, env = "EDGE_NODE_ID", default_value = "")]
    node_id: String,
    /// Speak TLS, trusting the CA certificates in this PEM file.
    #[arg(long, value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// The client certificate (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// The name every edge's certificate must be valid for (default: the host of the
    /// address dialled).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
    /// The first reconnect delay's ceiling, in ms (delays are drawn from 0 to the ceiling).
    #[arg(long, default_value_t = 500)]
    reconnect_min_ms: u64,
    /// The largest reconnect delay ceiling, in ms.
    #[arg(long, default_value_t = 30_000)]
    reconnect_max_ms: u64,
    /// Heartbeat intervals without a word from a pinging edge before the link counts as dead.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    dead_after_intervals: u32,
    /// TCP keepalive idle time in seconds (0: off).
    #[arg(long, default_value_t = 30)]
    tcp_keepalive_secs: u64,
    /// How long running runs may finish after SIGTERM/SIGINT before they are cancelled, in ms.
    #[arg(long, default_value_t = 30_000)]
    shutdown_grace_ms: u64,
    /// Events one run may buffer while the edge is unreachable before it is given up.
    #[arg(long, default_value_t = 4_096)]
    resume_run_events: usize,
    /// Bytes all runs together may buffer while the edge is unreachable.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    resume_total_bytes: usize,
    /// Sent events each run keeps while connected, to resend after a cut.
    #[arg(long, default_value_t = 32)]
    keep_sent_events: usize,
    /// Worker threads: 1 runs every task on one thread (the fewest wake-ups between a
    /// run's steps: the lowest latency); more spread the runs over that many.
    #[arg(long, env = "EDGE_NODE_THREADS", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    threads: u16,
    /// The scheduling slice the node's threads ask Linux for, in µs (0: the kernel's
    /// default). The shortest, by default, so a node woken by its engine's or its edge's
    /// bytes takes a core from the engine's computing threads at once; its share of the
    /// CPU is unchanged (docs/node.md).
    #[arg(long, env = "EDGE_NODE_THREAD_SLICE_US", default_value_t = 100,
          value_parser = thread_slice_us)]
    thread_slice_us: u64,
    /// Log format: pretty or json (the filter comes from RUST_LOG, default info).
    #[arg(long, default_value = "pretty", value_parser = ["pretty", "json"])]
    log_format: String,
}

fn options(args: Args) -> Result<NodeOptions, String> {
    let tls = match &args.tls_ca {
        None => None,
        Some(ca) => {
            let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
            let config = tls_client_config(ca, identity).map_err(|error| error.to_string())?;
            let server_name = match args.tls_server_name.clone() {
                None => None,
                Some(host) => Some(
                    ServerName::try_from(host.clone())
                        .map_err(|error| format!("invalid TLS server name {host:?}: {error}"))?,
                ),
            };
            Some(TlsOptions {
                config,
                server_name,
            })
        }
    };
    let mut options = NodeOptions::new(args.edge, token(args.token, args.token_file.as_deref())?);
    if options.edges().is_empty() {
        return Err("--edge names no address".to_owned());
    }
    if tls.as_ref().is_some_and(|tls| tls.server_name.is_none()) {
        // Each member is checked against its own host: every one must be a valid name.
        for address in options.edges() {
            let host = host_of(&address);
            ServerName::try_from(host.clone()).map_err(|error| {
                format!("invalid TLS server name {host:?} (from --edge {address}): {error}")
            })?;
        }
    }
    options.node_id = args.node_id;
    options.tls = tls;
    options.reconnect_min = Duration::from_millis(args.reconnect_min_ms.max(1));
    options.reconnect_max = Duration::from_millis(args.reconnect_max_ms.max(1));
    options.dead_after_intervals = args.dead_after_intervals;
    options.tcp_keepalive =
        (args.tcp_keepalive_secs > 0).then(|| Duration::from_secs(args.tcp_keepalive_secs));
    options.shutdown_grace = Duration::from_millis(args.shutdown_grace_ms);
    options.buffers = BufferLimits {
        run_events: args.resume_run_events.max(1),
        total_bytes: args.resume_total_bytes.max(1),
        keep_sent: args.keep_sent_events,
        ..BufferLimits::default()
    };
    Ok(options)
}

/// The token: `--token`, or the first line of `--token-file` (never echoed).
fn token(token: Option<String>, file: Option<&std::path::Path>) -> Result<String, String> {
    let (token, source) = match (token, file) {
        (Some(token), _) => (token, "--token".to_owned()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).map_err(|error| {
                format!("cannot read the token file {}: {error}", path.display())
            })?;
            let first = text.lines().next().unwrap_or_default().trim().to_owned();
            (first, format!("the token file {}", path.display()))
        }
        (None, None) => return Err("give the node's token: --token or --token-file".to_owned()),
    };
    if token.is_empty() {
        return Err(format!("{source} holds no token"));
    }
    Ok(token)
}

/// `--thread-slice-us`: 0, or a slice Linux grants (100 µs to 100 ms).
fn thread_slice_us(value: &str) -> Result<u64, String> {
    let us: u64 = value.parse().map_err(|error| format!("{error}"))?;
    edge_thread_slice::configured_slice(us).map(|_| us)
}

fn init_logs(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: under systemd stderr is the journal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// Cancels `stop` on the first SIGTERM or SIGINT; a second one exits at once.
fn on_signals(stop: CancellationToken) -> Result<(), std::io::Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let mut first = true;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if !first {
                tracing::warn!("second signal: exiting now");
                std::process::exit(130);
            }
            first = false;
            stop.cancel();
        }
    });
    Ok(())
}

/// The node's runtime: one thread for `threads == 1` (a run's steps then hand over
/// within the thread, with no other worker to wake), else that many workers.
fn runtime(threads: u16) -> std::io::Result<tokio::runtime::Runtime> {
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(usize::from(threads));
        builder
    };
    builder.enable_all().thread_name("edge-node").build()
}

fn main() -> ExitCode {
    let args = Args::parse();
    init_logs(&args.log_format);
    // Asked before the runtime starts: every thread of the node inherits it.
    if let Ok(Some(slice)) = edge_thread_slice::configured_slice(args.thread_slice_us) {
        edge_thread_slice::request_slice_logged(slice);
    }
    match runtime(args.threads) {
        Ok(runtime) => runtime.block_on(serve(args)),
        Err(error) => {
            tracing::error!(%error, "cannot start the runtime");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> ExitCode {
    // rustls' `ring` backend as the process default, for any TLS client a dependency builds
    // on its own; the node's clients pass it in themselves (`upstream::client_builder`), so
    // the node runs the same in process, in the tests, where nothing installs it.
    if rustls::crypto::ring::default_provider()
        .install_default()
        .is_err()
    {
        tracing::debug!("a crypto provider was already installed");
    }
    let options = match options(args) {
        Ok(options) => options,
        Err(error) => {
            tracing::error!(%error, "invalid options");
            return ExitCode::from(2);
        }
    };
    let stop = CancellationToken::new();
    if let Err(error) = on_signals(stop.clone()) {
        tracing::error!(%error, "cannot listen for signals");
        return ExitCode::FAILURE;
    }
    tracing::info!(edge = %options.edge, "node starting");
    match edge_node::run(options, stop).await {
        Ok(()) => {
            tracing::info!("node stopped");
            ExitCode::SUCCESS
        }
        Err(error) => {
            tracing::error!(%error, "node stopped");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::runtime::RuntimeFlavor;

    #[test]
    fn one_thread_is_a_current_thread_runtime_and_more_are_workers() {
        let flavor = |threads| {
            runtime(threads)
                .expect("runtime")
                .block_on(async { tokio::runtime::Handle::current().runtime_flavor() })
        };
        assert_eq!(flavor(1), RuntimeFlavor::CurrentThread);
        assert_eq!(flavor(3), RuntimeFlavor::MultiThread);
    }

    #[test]
    fn edge_takes_one_address_or_a_sites_members() {
        let options_of = |edge: &str| {
            let args = Args::try_parse_from(["edge-node", "--token", "t", "--edge", edge])
                .expect("parsed");
            options(args)
        };
        let one = options_of("127.0.0.1:7100").expect("valid");
        assert_eq!(one.edges(), ["127.0.0.1:7100"]);
        let site = options_of("10.0.0.1:7100,10.0.0.2:7100").expect("valid");
        assert_eq!(site.edges(), ["10.0.0.1:7100", "10.0.0.2:7100"]);
        assert!(options_of(" , ").is_err());
    }

    #[test]
    fn the_token_comes_from_the_flag_or_the_first_line_of_a_file() {
        let dir = std::env::temp_dir().join(format!("edge-node-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let file = dir.join("gpu-box-1");
        std::fs::write(&file, "s3cret-token\n").expect("the token file");
        let parsed = |argv: &[&str]| {
            Args::try_parse_from([&["edge-node"], argv].concat()).map_err(|e| e.to_string())
        };
        let from_file = parsed(&["--token-file", file.to_str().expect("utf-8")]).expect("parsed");
        assert_eq!(options(from_file).expect("valid").token, "s3cret-token");
        let from_flag = parsed(&["--token", "t", "--node-id", "gpu-box-1"]).expect("parsed");
        assert_eq!(from_flag.node_id, "gpu-box-1");
        assert_eq!(options(from_flag).expect("valid").token, "t");
        // One of the two, never both; an empty file is no token.
        assert!(parsed(&["--token", "t", "--token-file", "x"]).is_err());
        std::fs::write(&file, "\n").expect("the token file");
        let empty = parsed(&["--token-file", file.to_str().expect("utf-8")]).expect("parsed");
        assert!(options(empty).is_err_and(|e| e.contains("holds no token")));
        let missing = parsed(&["--token-file", "/nonexistent/edge-node-token"]).expect("parsed");
        assert!(options(missing).is_err_and(|e| e.contains("cannot read the token file")));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_thread_count_defaults_to_one_and_refuses_zero() {
        let parse =
            |extra: &[&str]| Args::try_parse_from([&["edge-node", "--token", "t"], extra].concat());
        assert_eq!(parse(&[]).expect("parsed").threads, 1);
        assert_eq!(parse(&["--threads", "4"]).expect("parsed").threads, 4);
        assert!(parse(&["--threads", "0"]).is_err());
    }

    #[test]
    fn the_thread_slice_defaults_to_the_kernels_shortest_and_refuses_what_it_does_not_grant() {
        let parse =
            |extra: &[&str]| Args::try_parse_from([&["edge-node", "--token", "t"], extra].concat());
        assert_eq!(parse(&[]).expect("parsed").thread_slice_us, 100);
        assert_eq!(
            parse(&["--thread-slice-us", "0"])
                .expect("parsed")
                .thread_slice_us,
            0
        );
        assert_eq!(
            parse(&["--thread-slice-us", "100000"])
                .expect("parsed")
                .thread_slice_us,
            100_000
        );
        for bad in ["50", "100001", "-1", "fast"] {
            assert!(parse(&["--thread-slice-us", bad]).is_err(), "{bad}");
        }
    }
}
