//! The node's life: dial the edge, register (with the process's instance id and resume
//! claims), serve the session, and after any disconnect dial again with exponential backoff
//! and full jitter, until told to stop; then drain. Given the addresses of a site's members,
//! it finds the one that acts ([`super::site`]): a standby's refusal naming the active member
//! is followed, a failure moves on to the next address. Every connection is fenced by the
//! process's one [`EpochFence`]: a command from an edge under an older epoch than the node
//! has seen is not run, and closes that connection.
//!
//! Draining (SIGTERM/SIGINT, or the caller's stop token): refuse new runs and report nothing
//! available, let running runs finish for up to the grace, cancel the rest (upstream too),
//! give the edge their terminal events, and return. Registration refusals that retrying
//! cannot fix (a wrong token or node id, an unsupported protocol) end the node with an error;
//! `ALREADY_CONNECTED` and `SHUTTING_DOWN` are retried with the same backoff. An edge's
//! `Shutdown` ends the node's open runs (the edge ended them first), except a standby's
//! (`reason = "standby"`): those runs are claimed on the active member.

use std::sync::Arc;
use std::time::Duration;

use edge::client::{
    Backoff, ClientError, EpochFence, Keepalive, LinkEnd, NodeClient, RegisterOutcome,
    Registration, ServerName, dial as dial_tcp, new_instance_id,
};
use edge::domain::{Bytes, Operation, RegisterRejection, ResumeClaim};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::adapters::AdapterSet;
use crate::inventory::{self, Prober};
use crate::openai;
use crate::options::{NodeOptions, host_of};
use crate::runs::{RunTable, Stop};
use crate::session::{self, SessionEnd};
use crate::shared::Core;
use crate::site::{Dial, EdgeAddresses};

/// The `Shutdown` reason of an edge that stopped acting for its site: its nodes' runs go on
/// and are claimed on the active member.
pub const STANDBY: &str = "standby";

/// The longest a dial, a TLS handshake or a registration answer may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the node gave up.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The edge refused the registration in a way retrying cannot fix.
    #[error("the edge refused the registration ({rejection:?}): {message}")]
    Rejected {
        /// The refusal.
        rejection: RegisterRejection,
        /// The edge's explanation.
        message: String,
    },
}

/// Runs the node until `stop` is cancelled and it has drained.
///
/// # Errors
/// [`NodeError::Rejected`] when the edge refuses the node for good.
pub async fn run(options: NodeOptions, stop: CancellationToken) -> Result<(), NodeError> {
    let prober = Arc::new(Prober::detect());
    let measuring = Arc::clone(&prober);
    let measured = tokio::task::spawn_blocking(move || measuring.measure())
        .await
        .unwrap_or_default();
    let devices: Vec<String> = measured
        .devices
        .iter()
        .map(|d| format!("{} {} ({})", d.index, d.name, Bytes(d.total_bytes)))
        .collect();
    tracing::info!(?devices, "the node's devices");
    let core = Arc::new(Core {
        table: RunTable::new(options.buffers),
        options,
        adapters: AdapterSet::default(),
        tasks: TaskTracker::new(),
        exit: CancellationToken::new(),
        draining: CancellationToken::new(),
        instance_id: new_instance_id(),
        fence: EpochFence::new(),
        inventory: watch::Sender::new(measured),
    });
    let current = core.inventory.clone();
    core.tasks
        .spawn(inventory::keep_current(prober, current, core.exit.clone()));
    let drainer = tokio::spawn(drain(Arc::clone(&core), stop));
    let result = connect_loop(&core).await;
    core.exit.cancel();
    core.adapters.stop();
    core.table.stop_all(&Stop::Forget);
    let _ = drainer.await;
    core.tasks.close();
    if tokio::time::timeout(core.options.flush_timeout, core.tasks.wait())
        .await
        .is_err()
    {
        tracing::warn!("some run tasks did not end in time");
    }
    result
}

async fn drain(core: Arc<Core>, stop: CancellationToken) {
    tokio::select! {
        () = stop.cancelled() => {}
        () = core.exit.cancelled() => return,
    }
    let running = core.table.running();
    tracing::info!(
        running,
        grace_ms = core.options.shutdown_grace.as_millis() as u64,
        "stopping: no new runs, waiting for running ones"
    );
    core.draining.cancel();
    core.table.set_draining();
    core.adapters.board().set_draining();
    if !wait_until(&core.table, core.options.shutdown_grace, |t| {
        t.running() == 0
    })
    .await
    {
        tracing::info!(
            running = core.table.running(),
            "grace over: cancelling the remaining runs"
        );
        core.table.stop_all(&Stop::Shutdown);
    }
    if !wait_until(&core.table, core.options.flush_timeout, RunTable::is_empty).await {
        tracing::warn!("exiting before the edge took every last event");
    }
    core.exit.cancel();
}

/// Waits up to `limit` for `done`; returns whether it came true.
async fn wait_until(table: &RunTable, limit: Duration, done: impl Fn(&RunTable) -> bool) -> bool {
    let waiting = async {
        loop {
            let progress = table.progress();
            tokio::pin!(progress);
            progress.as_mut().enable();
            if done(table) {
                return;
            }
            progress.await;
        }
    };
    tokio::time::timeout(limit, waiting).await.is_ok()
}

async fn connect_loop(core: &Core) -> Result<(), NodeError> {
    let options = &core.options;
    let mut backoff = Backoff::new(options.reconnect_min, options.reconnect_max);
    let mut site = EdgeAddresses::new(options.edges());
    while !core.exit.is_cancelled() {
        match attempt(core, site.current()).await {
            Ok(SessionEnd::Exit) => break,
            Ok(end) => {
                site.registered();
                backoff.reset();
                session_ended(core, &end);
            }
            Err(Failure::Fatal(error)) => return Err(error),
            Err(Failure::Redirect(active)) => {
                tracing::info!(edge = %site.current(), %active, "the edge stands by: dialling the active member");
                // A member answered: the site is up, and a takeover may be under way (the
                // member it names may be the one that just died). The delays start over,
                // so the node reaches the member that takes over within one first delay
                // of it acting, not after a backoff grown while the old lease lapsed.
                backoff.reset();
                if site.redirected(&active) == Dial::Now {
                    continue;
                }
            }
            Err(Failure::Retry(reason)) => {
                tracing::warn!(edge = %site.current(), %reason, "could not register with the edge");
                site.failed();
            }
        }
        if core.exit.is_cancelled() {
            break;
        }
        let delay = backoff.next_delay(rand::random::<f64>());
        tracing::info!(
            delay_ms = delay.as_millis() as u64,
            edge = %site.current(),
            "reconnecting after a delay"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = core.exit.cancelled() => {}
        }
    }
    Ok(())
}

/// Counts and logs how a registered session ended; an edge's `Shutdown` ends the open runs
/// (the edge ended them before saying so), except a standby's, whose runs the active
/// member takes back through the resume claims.
fn session_ended(core: &Core, end: &SessionEnd) {
    log_link_end(core, end);
    if let SessionEnd::EdgeShutdown(reason) = end
        && reason != STANDBY
    {
        core.table.stop_all(&Stop::Forget);
    }
}

/// Counts how the session's link ended and logs it with the counts so far.
fn log_link_end(core: &Core, end: &SessionEnd) {
    let ended = match end {
        SessionEnd::LinkDead => LinkEnd::DeclaredDead,
        SessionEnd::Closed | SessionEnd::EdgeShutdown(_) => LinkEnd::ClosedByEdge,
        SessionEnd::Failed(_) => LinkEnd::Broken,
        SessionEnd::Exit => return,
    };
    let links = &core.options.link_stats;
    links.record(ended);
    tracing::warn!(
        ?end,
        links_declared_dead = links.count(LinkEnd::DeclaredDead),
        links_closed_by_edge = links.count(LinkEnd::ClosedByEdge),
        links_broken = links.count(LinkEnd::Broken),
        "disconnected from the edge"
    );
}

enum Failure {
    /// Dial again, the next address of the site.
    Retry(String),
    /// A standby refused, naming the node address of the member that acts.
    Redirect(String),
    /// Give up.
    Fatal(NodeError),
}

/// One connection: dial and register (given up at once if the node exits meanwhile), then
/// serve until it ends.
async fn attempt(core: &Core, address: &str) -> Result<SessionEnd, Failure> {
    let claims = core.table.claims();
    let registered = tokio::select! {
        registered = register(core, address, &claims) => registered?,
        () = core.exit.cancelled() => return Ok(SessionEnd::Exit),
    };
    let (client, outcome) = registered;
    let config = outcome.config.unwrap_or_default();
    let inventory = core.inventory.borrow().clone();
    core.adapters
        .configure(&config.adapters, &inventory, &core.tasks);
    core.table.link_up(outcome.acknowledges_pings);
    let resumed = core.table.apply_answers(&claims, &outcome.resumed);
    tracing::info!(
        edge = address, node_id = %outcome.node_id, alias = %outcome.alias, instance_id = %core.instance_id,
        epoch = core.fence.highest(), claimed = claims.len(), resumed = resumed.accepted, dropped = resumed.refused, "registered with the edge"
    );
    let (sender, receiver) = client.split();
    let end = session::serve(sender, receiver, core, &config).await;
    core.table.link_down();
    Ok(end)
}

/// Dials and registers with this process's instance id and `claims`.
async fn register(
    core: &Core,
    address: &str,
    claims: &[ResumeClaim],
) -> Result<(NodeClient, RegisterOutcome), Failure> {
    let mut client = dial(&core.options, address)
        .await
        .map_err(|error| Failure::Retry(error.to_string()))?
        .fenced(core.fence.clone());
    // Every engine the openai adapter drives can go on from a prefix (request.rs).
    // Model commands are obeyed for the adapters whose availability says `managed`.
    let inventory = core.inventory.borrow().clone();
    let mut registration = Registration::with_token(&core.options.token)
        .instance(core.instance_id.clone())
        .continuing(true)
        .managing_models(true)
        .with_inventory(inventory);
    registration.node_id = core.options.node_id.clone();
    registration.adapters = vec![openai::KIND.to_owned()];
    registration.resume = claims.to_vec();
    // Served from the engine's tokenizer, or answered `not_supported` where it has none.
    let registration = registration.operations([Operation::Tokenize, Operation::Detokenize]);
    let outcome = tokio::time::timeout(DIAL_TIMEOUT, client.register(registration))
        .await
        .map_err(|_| Failure::Retry("no registration answer in time".into()))?
        .map_err(|error| Failure::Retry(error.to_string()))?;
    if outcome.accepted {
        return Ok((client, outcome));
    }
    Err(match (outcome.rejection, outcome.active_edge) {
        (Some(RegisterRejection::ShuttingDown), Some(active)) => Failure::Redirect(active),
        (Some(RegisterRejection::AlreadyConnected | RegisterRejection::ShuttingDown) | None, _) => {
            Failure::Retry(format!("refused: {}", outcome.message))
        }
        (Some(rejection), _) => Failure::Fatal(NodeError::Rejected {
            rejection,
            message: outcome.message,
        }),
    })
}

/// Dials the edge at `address`, with TCP keepalive and TLS as configured.
async fn dial(options: &NodeOptions, address: &str) -> Result<NodeClient, ClientError> {
    let keepalive = options.tcp_keepalive.map(Keepalive::after_idle);
    let connect = async {
        let stream = dial_tcp(address, keepalive.as_ref()).await?;
        match &options.tls {
            None => NodeClient::over_tcp(stream),
            Some(tls) => {
                let server_name = match &tls.server_name {
                    Some(name) => name.clone(),
                    None => ServerName::try_from(host_of(address)).map_err(|error| {
                        std::io::Error::new(std::io::ErrorKind::InvalidInput, error)
                    })?,
                };
                NodeClient::over_tls(stream, server_name, Arc::clone(&tls.config)).await
            }
        }
    };
    tokio::time::timeout(DIAL_TIMEOUT, connect)
        .await
        .map_err(|_| {
            ClientError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "dialling the edge timed out",
            ))
        })?
}
