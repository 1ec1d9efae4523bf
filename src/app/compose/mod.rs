//! The composition root: reads the settings, builds every adapter from them, wires them to
//! the services (`app/runs`, `app/management`, `app/drains`), and owns the edge's start
//! and graceful stop, its CLI, logging, span export and metrics pipeline. The services
//! import none of it.
//!
//! [`App::build`] binds the listeners (so tests can use port 0 and ask [`App::node_addr`]
//! and [`App::http_addr`]),
//! and [`App::run_until_stopped`] serves until the stop signal, then drains.

mod admin;
pub mod cli;
mod cluster;
mod example_tokens;
pub(crate) mod identity;
pub mod logging;
pub(crate) mod metrics;
mod nats_metrics;
mod sd_notify;
pub mod settings;
pub mod telemetry;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;
use tracing::info;

use crate::adapters::admin::AdminServer;
use crate::adapters::api::Api;
use crate::adapters::api::{self as client_api, ApiState};
use crate::adapters::cluster::ClusterLease;
use crate::adapters::file_store::FileNodeStore;
use crate::adapters::http::{HttpServer, OpsState};
use crate::adapters::listen;
use crate::adapters::lock_registry::LockRegistry;
use crate::adapters::sinks::{SinkSet, build_sinks};
use crate::adapters::stdin_console::{self, ConsolePorts};
use crate::adapters::tcp::{ServerDeps, TcpServer, TcpTransport, TransportControl};
use crate::adapters::tls::{TlsAcceptor, TlsConfig};
use crate::app::drains::Drains;
use crate::app::loras::LoraService;
use crate::app::management::Management;
use crate::app::models::{self, ModelService};
use crate::app::node_events::NodeEvents;
use crate::app::runs::{self, RunService};
use crate::domain::models::ModelName;
use crate::domain::routing::Catalog;
use crate::ports::{EventSink, NodeStore, Registry, RunJournal, SiteRole};
use metrics::{MetricSources, Metrics};

pub use settings::Settings;

/// A built edge, listening but not yet serving.
pub struct App {
    settings: Settings,
    server: TcpServer,
    http: HttpServer,
    metrics: Metrics,
    /// Every configured sink, closed (drains joined) once everything else has stopped.
    sink: Arc<dyn EventSink>,
    parts: AppParts,
    /// The management API's own listener (none with `admin.on_http_listener`).
    admin: Option<AdminServer>,
    /// The site's lease, with `[cluster]`.
    lease: Option<ClusterLease>,
    /// The site's journal stream, with `[cluster]` and the journal on.
    replication: Option<cluster::Replication>,
}

/// The running edge's parts, for the console, the HTTP API and tests. Cheap to clone.
#[derive(Clone)]
pub struct AppParts {
    /// The pre-registered node definitions.
    pub store: Arc<dyn NodeStore>,
    /// The connected nodes.
    pub registry: Arc<dyn Registry>,
    /// Accepts and relays runs.
    pub runs: RunService,
    /// Drains and stops the node transport.
    pub transport: TransportControl,
    /// Cancel it to start the graceful stop.
    pub stop: CancellationToken,
    /// Node status, drains, run records and events: what the management API serves.
    pub management: Management,
    /// Which model is loaded where; loads and unloads.
    pub models: ModelService,
    /// The run journal (one that keeps nothing when `[journal] enabled = false`).
    pub journal: Arc<dyn RunJournal>,
    /// What this edge is to its site: alone ([`Role::Single`]: always acts, epoch 0),
    /// or the active member or a standby of a `[cluster]` site, as its lease says. The one
    /// role of the edge, made in [`App::build`]: the node transport stamps, refuses and
    /// sends nodes away by it; `/readyz`, the APIs and the admin API answer by it.
    ///
    /// [`Role::Single`]: crate::ports::Role::Single
    pub site: SiteRole,
}

impl AppParts {
    /// Runs the operator console (`edge serve --console`) over `input` and `output` until
    /// `quit` or the end of `input` (either stops the edge) or the edge's stop.
    pub async fn console<R, W>(self, input: R, output: W)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let ports = ConsolePorts {
            runs: Arc::new(self.runs),
            manage: Arc::new(self.management),
            stop: self.stop,
        };
        stdin_console::run(ports, input, output).await;
    }
}

impl App {
    /// Loads the node definitions, builds the sinks, and binds the node transport.
    ///
    /// # Errors
    /// Invalid node definitions, a sink that cannot start (such as an unwritable file path),
    /// TLS files (`server.tls`, `http.tls`) that cannot be read or hold no usable PEM, or an
    /// address that cannot be bound — each naming what is wrong.
    pub async fn build(settings: Settings) -> anyhow::Result<App> {
        let store: Arc<dyn NodeStore> =
            Arc::new(FileNodeStore::load_from_config(&settings.source)?);
        let registry: Arc<dyn Registry> = Arc::new(LockRegistry::new());
        // The edge's one site role (`cluster.rs`): every part that acts on it gets this handle.
        let site = cluster::site_role(&settings);
        let sinks = build_sinks(&settings.events, &settings.edge_id)
            .context("cannot start the event sinks")?;
        let sink: Arc<dyn EventSink> = Arc::new(SinkSet::from_built(&sinks));
        let transport = Arc::new(TcpTransport::new(Arc::clone(&registry)));
        let metrics = Metrics::new().context("cannot start the metrics exporter")?;
        let (journal, site_journal) = cluster::journal(&settings)?;
        let (models, loras) = model_services(&settings, store.as_ref(), &registry, &transport)?;
        let models = models(&metrics);
        let outbound = (Arc::clone(&registry), transport, Arc::clone(&sink));
        let runs = run_service(&settings, store.as_ref(), outbound, &journal, &metrics).await?;
        runs.attach_models(Arc::new(models.clone()));
        models.attach_runs(runs.waiting_runs());
        let deps = node_server_deps(&store, &registry, (&runs, &models, &loras), &site);
        let server = bind_node_server(&settings, deps).await?;
        metrics.observe(MetricSources {
            store: Arc::clone(&store),
            registry: Arc::clone(&registry),
            transport: server.control().stats(),
            runs: runs.clone(),
            sinks,
        });
        let management =
            admin::management(&store, &registry, &runs, &journal, Drains::new(), &metrics);
        let ops = ops_state(&metrics, &server, &site);
        let services = (&runs, &registry, &management, &models, &loras);
        let (http, admin) = bind_http_side(&settings, services, ops).await?;
        let listeners = (server.local_addr()?, http.local_addr()?);
        let lease = cluster::lease(&settings, store.as_ref(), &site, listeners, metrics.meter());
        let lease = lease.await?;
        let (lease, replication) =
            cluster::replicate(&settings, lease, site_journal, &runs, metrics.meter());
        let parts = AppParts {
            store,
            registry,
            runs,
            transport: server.control(),
            stop: CancellationToken::new(),
            management,
            models,
            journal,
            site,
        };
        Ok(App {
            settings,
            server,
            http,
            metrics,
            sink,
            parts,
            admin,
            lease,
            replication,
        })
    }

    /// The address of the HTTP server (`/metrics`, health, the API).
    ///
    /// # Errors
    /// The socket error, which does not happen for a bound listener.
    pub fn http_addr(&self) -> std::io::Result<SocketAddr> {
        self.http.local_addr()
    }

    /// The address of the management API (its own listener, or the HTTP one's).
    ///
    /// # Errors
    /// The socket error, which does not happen for a bound listener.
    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        admin::address(self.admin.as_ref(), self.http.local_addr()?)
    }

    /// The address nodes connect to.
    ///
    /// # Errors
    /// The socket error, which does not happen for a bound listener.
    pub fn node_addr(&self) -> std::io::Result<SocketAddr> {
        self.server.local_addr()
    }

    /// The running edge's parts.
    pub fn parts(&self) -> AppParts {
        self.parts.clone()
    }

    /// Serves until [`AppParts::stop`] is cancelled, then stops gracefully: refuses new
    /// nodes and runs, waits up to `server.shutdown_grace_ms` for open runs, ends the rest
    /// with `edge_shutdown`, sends `Shutdown` to every node and closes the connections.
    ///
    /// # Errors
    /// The HTTP server failed while serving.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        let App {
            settings,
            server,
            http,
            metrics,
            sink,
            parts,
            admin,
            lease,
            replication,
        } = self;
        info!(
            listen = %server.local_addr()?,
            http = %http.local_addr()?,
            admin = %admin::address(admin.as_ref(), http.local_addr()?)?,
            journal = %journal_shown(&settings),
            nodes = parts.store.records().len(),
            node_tls = settings.server.tls.is_some(),
            http_tls = settings.http.tls.is_some(),
            "edge is serving"
        );
        let accept_loop = tokio::spawn(server.run());
        let http_stop = CancellationToken::new();
        let http_serving = tokio::spawn(http.run(http_stop.clone()));
        let admin_serving = admin::AdminServing::start(admin);
        // The stream's folder runs before the lease, so a takeover can catch up on it.
        let replication = replication.map(cluster::Replication::start);
        let lease = lease.map(ClusterLease::start);
        let lifecycle = tokio::spawn({
            let (models, stop) = (parts.models.clone(), parts.stop.clone());
            async move { models.run(stop).await }
        });
        parts.stop.cancelled().await;
        info!("stopping: refusing new nodes and runs, draining open runs");
        let grace = settings.server.shutdown_grace();
        parts.transport.start_draining();
        parts.runs.drain(grace).await;
        parts.management.stop(grace).await;
        lifecycle.await.context("the model lifecycle panicked")?;
        // Every run has ended: its record and events go to disk before the edge exits.
        parts.journal.close().await;
        // The journal's last batches reach the stream before the lease is let go.
        if let Some(replication) = replication {
            replication.stop(grace).await;
        }
        // Open runs have ended here: a standby may take over at once, before the nodes are
        // told to go (they find it when they reconnect).
        if let Some(lease) = lease {
            lease.stop().await;
        }
        parts.transport.shut_down("edge shutting down", grace).await;
        accept_loop.await.context("the accept loop panicked")?;
        // HTTP stays up while draining, so /readyz reports it; open streams have ended now.
        http_stop.cancel();
        http_serving
            .await
            .context("the HTTP server panicked")?
            .context("the HTTP server failed")?;
        sink.close().await;
        admin_serving.stop().await?;
        metrics.shutdown();
        info!("edge stopped");
        Ok(())
    }
}

/// The model lifecycle (its `[[models]]` entries checked against the node definitions),
/// made once the metrics are, and the LoRA book, which checks the entries set aside and the
/// aliases as nodes report.
fn model_services(
    settings: &Settings,
    store: &dyn NodeStore,
    registry: &Arc<dyn Registry>,
    transport: &Arc<TcpTransport>,
) -> anyhow::Result<(impl FnOnce(&Metrics) -> ModelService, LoraService)> {
    let policies = model_policies(settings, store)?;
    let aliases = settings
        .api
        .models
        .iter()
        .filter_map(|(alias, model)| Some((alias.clone(), ModelName::parse(model).ok()?)))
        .collect();
    let catalog = Catalog::new(store.records());
    let loras = LoraService::new(Arc::clone(registry), catalog, aliases, policies.loras);
    let (registry, transport) = (Arc::clone(registry), Arc::clone(transport));
    let lifecycle = settings.lifecycle.clone();
    let models = move |metrics: &Metrics| {
        let transport = transport as Arc<dyn crate::ports::NodeTransport>;
        ModelService::new(
            registry,
            transport,
            policies.models,
            lifecycle,
            metrics.meter(),
        )
    };
    Ok((models, loras))
}

/// The `[[models]]` entries, checked against the node definitions.
///
/// # Errors
/// Every problem, naming the config file and each offending entry.
pub(crate) fn model_policies(
    settings: &Settings,
    store: &dyn NodeStore,
) -> anyhow::Result<models::Policies> {
    models::policies(&settings.models, &store.records()).map_err(|problems| {
        anyhow::anyhow!(
            "invalid `[[models]]` in config file {}: {}",
            settings.source.path().display(),
            problems.join("; ")
        )
    })
}

/// What the node transport works with: the definitions, the registry, the services that
/// hear what nodes say, and this edge's role in its site.
fn node_server_deps(
    store: &Arc<dyn NodeStore>,
    registry: &Arc<dyn Registry>,
    (runs, models, loras): (&RunService, &ModelService, &LoraService),
    site: &SiteRole,
) -> ServerDeps {
    let handler = NodeEvents::new(runs.clone(), models.clone(), loras.clone());
    ServerDeps {
        store: Arc::clone(store),
        registry: Arc::clone(registry),
        handler: Arc::new(handler),
        site: site.clone(),
    }
}

/// What `/readyz`, `/metrics` and the health routes read.
fn ops_state(metrics: &Metrics, server: &TcpServer, site: &SiteRole) -> OpsState {
    OpsState {
        metrics: metrics.registry(),
        readiness: server.control().readiness(),
        site: site.clone(),
    }
}

/// The run service, its keys' budget state loaded from the journal.
async fn run_service(
    settings: &Settings,
    store: &dyn NodeStore,
    (registry, transport, sink): (Arc<dyn Registry>, Arc<TcpTransport>, Arc<dyn EventSink>),
    journal: &Arc<dyn RunJournal>,
    metrics: &Metrics,
) -> anyhow::Result<RunService> {
    let runs = RunService::with_journal(
        registry,
        transport,
        sink,
        Arc::clone(journal),
        settings.runs.clone(),
        routing(settings, store)?,
        metrics.meter(),
    );
    runs.load_budgets()
        .await
        .context("cannot load the API keys' budget state from the run journal")?;
    let held = runs.adopt_left_open().await;
    if held > 0 {
        tracing::info!(
            runs = held,
            "runs left open by the previous edge are held for their nodes to resume"
        );
    }
    Ok(runs)
}

fn routing(settings: &Settings, store: &dyn NodeStore) -> anyhow::Result<runs::Routing> {
    let policy = runs::policy(&settings.runs, &settings.routing, &settings.limits)
        .map_err(|problems| anyhow::anyhow!("invalid routing settings: {}", problems.join("; ")))?;
    Ok(runs::Routing {
        catalog: Catalog::new(store.records()),
        policy,
        key_limits: settings.api.key_limits(),
    })
}

/// Binds the node transport's listener, with TLS when `[server.tls]` is set.
async fn bind_node_server(settings: &Settings, deps: ServerDeps) -> anyhow::Result<TcpServer> {
    let tls = load_tls(settings.server.tls.as_ref(), "server.tls", &[])
        .context("cannot set up TLS for the node transport")?;
    let listen = settings.server.listen;
    let server = TcpServer::bind(settings.server.clone(), deps).await;
    let server = server.with_context(|| format!("cannot listen for nodes on {listen}"))?;
    listen::warn_if_capped("server.listen_backlog", settings.server.listen_backlog);
    Ok(tls.into_iter().fold(server, TcpServer::with_tls))
}

/// The run journal as the startup line shows it: its file, or `off`.
fn journal_shown(settings: &Settings) -> String {
    if settings.journal.enabled {
        settings.journal_file().display().to_string()
    } else {
        "off".to_owned()
    }
}

/// The HTTP listener (operations endpoints, client APIs) and the management API, on its
/// own listener or beside them; the API and the management API act on `ops.site`.
async fn bind_http_side(
    settings: &Settings,
    (runs, registry, management, models, loras): (
        &RunService,
        &Arc<dyn Registry>,
        &Management,
        &ModelService,
        &LoraService,
    ),
    ops: OpsState,
) -> anyhow::Result<(HttpServer, Option<AdminServer>)> {
    let site = ops.site.clone();
    let api = api_state((runs, registry, management, loras), settings, &site)?;
    let http = bind_http_server(settings, ops, &api).await?;
    admin::bind(settings, (management, models, loras, &site), http).await
}

/// What the client APIs' handlers work with.
fn api_state(
    (runs, registry, management, loras): (
        &RunService,
        &Arc<dyn Registry>,
        &Management,
        &LoraService,
    ),
    settings: &Settings,
    site: &SiteRole,
) -> anyhow::Result<ApiState> {
    Ok(ApiState {
        runs: Arc::new(runs.clone()),
        registry: Arc::clone(registry),
        loras: Arc::new(loras.clone()),
        api: Api::new(settings.api.clone())?.with_prefix_affinity(settings.routing.prefix_affinity),
        manage: Arc::new(management.clone()),
        site: site.clone(),
    })
}

/// Binds the HTTP listener with the operations endpoints and the client APIs' routes, with
/// TLS when `[http.tls]` is set.
async fn bind_http_server(
    settings: &Settings,
    ops: OpsState,
    api: &ApiState,
) -> anyhow::Result<HttpServer> {
    let tls = load_tls(settings.http.tls.as_ref(), "http.tls", &[b"http/1.1"])
        .context("cannot set up TLS for the HTTP server")?;
    let listen = settings.http.listen;
    let routes = client_api::route_groups(api);
    let http = HttpServer::bind(
        settings.http.clone(),
        ops,
        routes,
        client_api::unknown_routes(),
    );
    let mut http = http
        .await
        .with_context(|| format!("cannot listen for HTTP on {listen}"))?;
    listen::warn_if_capped("http.listen_backlog", settings.http.listen_backlog);
    if settings.tracing.enabled() {
        http = http.with_request_traces();
    }
    Ok(tls.into_iter().fold(http, HttpServer::with_tls))
}

/// Loads a listener's TLS files, when its section has a `tls` table; `alpn` lists the
/// application protocols offered.
pub(crate) fn load_tls(
    config: Option<&TlsConfig>,
    section: &str,
    alpn: &[&[u8]],
) -> anyhow::Result<Option<TlsAcceptor>> {
    config
        .map(|config| TlsAcceptor::from_config(config, section, alpn))
        .transpose()
        .map_err(anyhow::Error::from)
}
