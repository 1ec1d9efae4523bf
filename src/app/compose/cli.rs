//! The `edge` command line: `serve`, `check-config`, `healthcheck` and `token generate`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use super::settings::{LogFormat, Settings};
use super::{App, example_tokens, logging, sd_notify};
use crate::adapters::file_store::FileNodeStore;
use crate::adapters::sinks::config::SinkKind;
use crate::domain::Token;
use crate::ports::NodeStore;

/// edge: binds model-execution nodes into one local execution group.
#[derive(Debug, Parser)]
#[command(name = "edge", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve nodes: accept their registrations, route runs to them, relay their events.
    Serve(ServeArgs),
    /// Validate a config file and print a summary (tokens are never printed).
    CheckConfig {
        /// The config file [default: config/edge.toml].
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Ask this edge's own `GET /healthz` and exit 0 if it answers 200, else 1 (a
    /// container's health check; never `/readyz`, which a standby answers 503 by design).
    Healthcheck(HealthcheckArgs),
    /// Node token helpers.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Operator commands against a running edge's management API.
    #[command(flatten)]
    Admin(crate::adapters::admin_client::AdminCommand),
}

#[derive(Debug, Subcommand)]
enum TokenCommand {
    /// Print a new random token (256 bits) and its SHA-256 for `token_sha256`.
    Generate,
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// The config file [default: config/edge.toml].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Listen for nodes here instead of `server.listen` (port 0 picks a free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Serve HTTP (metrics, health, the API) here instead of `http.listen` (port 0 picks
    /// a free port).
    #[arg(long)]
    http_listen: Option<SocketAddr>,
    /// Keep the edge's state (the run journal) in this directory instead of `edge.data_dir`
    /// (default: $STATE_DIRECTORY, else $XDG_STATE_HOME/edge, else ~/.local/state/edge).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Serve the management API here instead of `admin.listen` (port 0 picks a free port).
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Read run commands from standard input while serving (`help` lists them).
    #[arg(long)]
    console: bool,
    /// Log level or filter directives instead of `log.level` (RUST_LOG wins over both).
    #[arg(long)]
    log_level: Option<String>,
    /// Log format instead of `log.format`.
    #[arg(long, value_parser = ["pretty", "json"])]
    log_format: Option<String>,
}

#[derive(Debug, Args)]
struct HealthcheckArgs {
    /// The URL to ask [default: `/healthz` on the config's `http.listen`, loopback for a
    /// wildcard address].
    #[arg(long)]
    url: Option<String>,
    /// The config file whose `http.listen` to ask [default: config/edge.toml].
    #[arg(long, conflicts_with = "url")]
    config: Option<PathBuf>,
    /// The CA certificate (PEM) that signed an HTTPS listener's certificate.
    #[arg(long, env = "EDGE_API_CACERT")]
    cacert: Option<PathBuf>,
    /// How long to wait for the answer, in ms.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
}

/// Runs the command line; the process exits with the returned code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::CheckConfig { config } => check_config(config),
        Command::Healthcheck(args) => healthcheck(args),
        Command::Token {
            command: TokenCommand::Generate,
        } => {
            print!("{}", generate_token());
            Ok(())
        }
        Command::Admin(command) => admin(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            // A closed standard error must not panic the command: the exit code still says.
            let _ = writeln!(std::io::stderr(), "edge: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs an operator command on a small runtime of its own.
fn admin(command: crate::adapters::admin_client::AdminCommand) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(crate::adapters::admin_client::run(command))
        .map_err(anyhow::Error::from)
}

/// `edge healthcheck`: `GET /healthz` on this edge, on a small runtime of its own.
fn healthcheck(args: HealthcheckArgs) -> anyhow::Result<()> {
    let url = match args.url {
        Some(url) => url,
        None => health_url(&Settings::load(args.config.as_deref())?),
    };
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(crate::adapters::admin_client::healthcheck(
            &url,
            args.cacert.as_deref(),
            std::time::Duration::from_millis(args.timeout_ms),
        ))?;
    println!("healthy: {url}");
    Ok(())
}

/// `/healthz` on `http.listen`, asked on loopback when the edge listens on every address.
fn health_url(settings: &Settings) -> String {
    let mut address = settings.http.listen;
    if address.ip().is_unspecified() {
        address.set_ip(match address {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let scheme = if settings.http.tls.is_some() {
        "https"
    } else {
        "http"
    };
    format!("{scheme}://{address}/healthz")
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = Settings::load(args.config.as_deref())?;
    if let Some(listen) = args.listen {
        settings.server.listen = listen;
    }
    if let Some(listen) = args.http_listen {
        settings.http.listen = listen;
    }
    if let Some(listen) = args.admin_listen {
        settings.admin.listen = listen;
    }
    if let Some(dir) = args.data_dir {
        settings.data_dir = dir;
    }
    example_tokens::refuse_off_loopback(&settings.source, settings.server.listen)?;
    if let Some(level) = args.log_level {
        settings.log.level = level;
    }
    if let Some(format) = args.log_format.as_deref() {
        settings.log.format = if format == "json" {
            LogFormat::Json
        } else {
            LogFormat::Pretty
        };
    }
    if args.console && !settings.events.sinks.contains(&SinkKind::Stdout) {
        // Console mode shows events on the console: the stdout sink is its router.
        settings.events.sinks.push(SinkKind::Stdout);
    }
    let exporter = logging::init_with_tracing(
        &settings.log.level,
        settings.log.format,
        &settings.tracing,
        &settings.edge_id,
    )?;
    if let Some(slice) = settings.thread_slice {
        // Asked on this thread before the runtime starts, so every thread the edge starts
        // from here on (its workers, the journal's writer, the sinks' drains) inherits it.
        edge_thread_slice::request_slice_logged(slice);
    }
    let runtime = tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
    let served = runtime.block_on(async move {
        let app = App::build(settings).await?;
        let parts = app.parts();
        // Under systemd (`Type=notify`): started once the listeners are bound, stopping
        // when a graceful stop begins, whatever began it.
        sd_notify::notify(sd_notify::READY);
        tokio::spawn({
            let stop = parts.stop.clone();
            async move {
                stop.cancelled().await;
                sd_notify::notify(sd_notify::STOPPING);
            }
        });
        tokio::spawn(stop_on_signal(parts.stop.clone()));
        if args.console {
            tokio::spawn(parts.console(tokio::io::stdin(), tokio::io::stdout()));
        }
        app.run_until_stopped().await
    });
    // The edge has stopped and flushed its sinks. The console's stdin read is a blocking
    // read that cannot be cancelled: dropping the runtime would wait for it, keeping a
    // stopped edge alive after SIGTERM until someone types a line.
    runtime.shutdown_timeout(RUNTIME_SHUTDOWN_GRACE);
    // Last: the spans of the stop itself (connections closing) are exported too.
    if let Some(exporter) = exporter {
        exporter.shutdown();
    }
    served
}

/// How long the stopped runtime waits for blocking tasks (such as the console's pending
/// stdin read) before the process exits anyway.
const RUNTIME_SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Cancels `stop` on SIGINT or SIGTERM.
async fn stop_on_signal(stop: tokio_util::sync::CancellationToken) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    stop.cancel();
}

fn check_config(path: Option<PathBuf>) -> anyhow::Result<()> {
    let settings = Settings::load(path.as_deref())?;
    let store = FileNodeStore::load_from_config(&settings.source)?;
    super::model_policies(&settings, &store)?;
    example_tokens::refuse_off_loopback(&settings.source, settings.server.listen)?;
    print!("{}", summary(&settings, &store));
    Ok(())
}

/// What `check-config` prints: the effective settings and every node, never a token.
fn summary(settings: &Settings, store: &FileNodeStore) -> String {
    let mut out = String::new();
    let sinks: Vec<&str> = settings.events.sinks.iter().map(|s| s.as_str()).collect();
    let _ = writeln!(out, "config: {} (valid)", settings.source.path().display());
    let _ = writeln!(out, "node transport: {}", settings.server.listen);
    let _ = writeln!(out, "http: {}", settings.http.listen);
    let _ = writeln!(out, "event sinks: {}", sinks.join(", "));
    let admin = &settings.admin;
    let where_admin = if admin.on_http_listener {
        format!("on the http listener ({})", settings.http.listen)
    } else {
        admin.listen.to_string()
    };
    let _ = writeln!(
        out,
        "management api: {where_admin}; {} admin key(s)",
        admin.digests().len()
    );
    let journal = &settings.journal;
    let _ = match journal.enabled {
        true => writeln!(out, "run journal: {}", settings.journal_file().display()),
        false => writeln!(out, "run journal: off"),
    };
    let _ = match &settings.cluster {
        Some(cluster) => writeln!(
            out,
            "cluster: site {} (KV bucket {}) on {}; lease {} ms, renewed every {} ms",
            cluster.site,
            cluster.bucket(),
            cluster.nats,
            cluster.lease_ms,
            cluster.renew_ms
        ),
        None => writeln!(out, "cluster: none (this edge is the whole site)"),
    };
    let records = store.records();
    let _ = writeln!(out, "nodes: {}", records.len());
    for record in records {
        let adapters: Vec<String> = record
            .adapters()
            .iter()
            .map(|a| {
                let targets: Vec<&str> = a.targets().iter().map(|t| t.as_str()).collect();
                format!("{}[{}]", a.name(), targets.join(", "))
            })
            .collect();
        let _ = writeln!(
            out,
            "  - {} (alias {}): adapters {}; max_concurrent_runs {}; heartbeat {} ms; token <redacted>",
            record.id(),
            record.alias(),
            adapters.join(" "),
            record.runtime().max_concurrent_runs(),
            record.runtime().heartbeat_interval_ms(),
        );
    }
    out
}

/// A new 256-bit token, as config lines for both ways of writing it.
fn generate_token() -> String {
    let bytes: [u8; 32] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let digest = Token::new(token.clone()).digest().to_hex();
    format!(
        "# give the node the token; give the edge either line below\ntoken = \"{token}\"\ntoken_sha256 = \"{digest}\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::TokenDigest;

    #[test]
    fn generated_tokens_are_fresh_and_hash_to_their_digest() {
        let first = generate_token();
        assert_ne!(first, generate_token());
        let value = |key: &str| {
            first
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key} = \"")))
                .and_then(|v| v.strip_suffix('"'))
                .unwrap()
                .to_owned()
        };
        let token = value("token");
        assert_eq!(token.len(), 64);
        assert!(
            TokenDigest::from_hex(&value("token_sha256"))
                .unwrap()
                .matches(&Token::new(token).digest())
        );
    }
}
