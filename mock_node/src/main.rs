//! `cargo run -p edge-mock-node -- --edge ADDR --token T`: a mock node for demos.
//!
//! It registers, prints the config the edge sent, heartbeats, and answers runs with an
//! `echo` adapter. See `lib.rs` for the behaviours. With `--tls-ca` it speaks TLS, and with
//! `--tls-cert`/`--tls-key` it presents a client certificate (mutual TLS).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use edge::client::{NodeClient, ServerName, tls_client_config};
use edge_mock_node::{Behaviour, Ended, MockNode, MockOptions};

#[derive(Debug, Parser)]
#[command(about = "A mock node that answers runs with an echo adapter")]
struct Args {
    /// The edge's node transport address.
    #[arg(long, default_value = "127.0.0.1:7100")]
    edge: SocketAddr,
    /// The node's pre-shared token.
    #[arg(long)]
    token: String,
    /// The node id to claim (empty: let the token decide).
    #[arg(long, default_value = "")]
    node_id: String,
    /// Milliseconds between output words.
    #[arg(long, default_value_t = 100)]
    delay_ms: u64,
    /// What to do with runs (a run's `mock` param, or a target named after a behaviour,
    /// overrides it); see lib.rs.
    #[arg(long, default_value = "echo", value_parser = [
        "echo", "fail", "hang", "drop", "ignore_cancel", "reasoning", "tools", "logprobs",
        "length", "filtered", "bad_request", "node_error", "refused", "stall",
    ])]
    behaviour: String,
    /// Speak TLS, trusting the CA certificates in this PEM file.
    #[arg(long, value_name = "PATH")]
    tls_ca: Option<PathBuf>,
    /// The client certificate (PEM) to present for mutual TLS; needs --tls-key.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    tls_key: Option<PathBuf>,
    /// The name the edge's certificate must be valid for (default: the --edge IP address).
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    tls_server_name: Option<String>,
}

/// Dials the edge, over TLS when `--tls-ca` is given.
async fn connect(args: &Args) -> Result<NodeClient, String> {
    let Some(ca) = &args.tls_ca else {
        return NodeClient::connect(args.edge)
            .await
            .map_err(|error| error.to_string());
    };
    let identity = args.tls_cert.as_deref().zip(args.tls_key.as_deref());
    let config = tls_client_config(ca, identity).map_err(|error| error.to_string())?;
    let name = match &args.tls_server_name {
        Some(name) => ServerName::try_from(name.clone())
            .map_err(|error| format!("invalid --tls-server-name {name:?}: {error}"))?,
        None => ServerName::from(args.edge.ip()),
    };
    NodeClient::connect_tls(args.edge, name, config)
        .await
        .map_err(|error| error.to_string())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let client = match connect(&args).await {
        Ok(client) => client,
        Err(error) => {
            eprintln!("mock_node: {error}");
            return ExitCode::FAILURE;
        }
    };
    let options = MockOptions {
        token: args.token,
        node_id: args.node_id,
        delay: Duration::from_millis(args.delay_ms),
        behaviour: Behaviour::parse(&args.behaviour).unwrap_or(Behaviour::Echo),
        heartbeat: None,
        tokenize: true,
        engine: None,
    };
    let node = match MockNode::start_on(client, options).await {
        Ok(node) => node,
        Err(error) => {
            eprintln!("mock_node: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "registered as {} (alias {})",
        node.outcome.node_id, node.outcome.alias
    );
    if let Some(config) = &node.outcome.config {
        for adapter in &config.adapters {
            println!(
                "  adapter {} targets {:?} settings {:?}",
                adapter.name, adapter.targets, adapter.settings
            );
        }
        println!(
            "  runtime max_concurrent_runs={} heartbeat_interval_ms={} settings {:?}",
            config.max_concurrent_runs, config.heartbeat_interval_ms, config.runtime_settings
        );
    }
    match node.ended().await {
        Ended::Shutdown(reason) => println!("edge shut down: {reason}"),
        Ended::Closed => println!("edge closed the connection"),
        Ended::Killed => println!("connection dropped"),
    }
    ExitCode::SUCCESS
}
