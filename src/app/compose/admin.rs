//! Composition of the management side: the run journal, the management API's listener
//! (its own, or the HTTP listener's) with the operator console beside it, and their place
//! in the edge's start and stop.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::metrics::Metrics;
use super::{RunService, Settings};
use crate::adapters::admin::{AdminServer, AdminState, routes};
use crate::adapters::http::HttpServer;
use crate::adapters::journal::open_journal;
use crate::adapters::web_console;
use crate::app::drains::Drains;
use crate::app::loras::LoraService;
use crate::app::management::Management;
use crate::app::models::ModelService;
use crate::ports::{NodeStore, Registry, RunJournal, SiteRole};

/// The journal `[journal]` asks for, the runs a previous edge left open kept for the run
/// service to take back (`RunService::adopt_left_open`).
///
/// # Errors
/// The enabled journal's file cannot be used (the message names it).
pub(super) fn journal(settings: &Settings) -> anyhow::Result<Arc<dyn RunJournal>> {
    open_journal(&settings.journal, &settings.journal_file(), true)
        .context("cannot open the run journal")
}

/// The management service over the edge's parts, its metrics registered.
pub(super) fn management(
    store: &Arc<dyn NodeStore>,
    registry: &Arc<dyn Registry>,
    runs: &RunService,
    journal: &Arc<dyn RunJournal>,
    drains: Drains,
    metrics: &Metrics,
) -> Management {
    let live = Arc::new(runs.clone());
    let management = Management::new(
        Arc::clone(store),
        Arc::clone(registry),
        live,
        Arc::clone(journal),
        drains.clone(),
    );
    crate::app::management::metrics::observe(metrics.meter(), drains, Arc::clone(journal));
    management
}

/// Puts the management API on the HTTP listener (`admin.on_http_listener`), or binds its
/// own listener and returns it.
///
/// # Errors
/// The admin listener cannot be bound, or its TLS files cannot be loaded.
pub(super) async fn bind(
    settings: &Settings,
    (management, models, loras, site): (&Management, &ModelService, &LoraService, &SiteRole),
    http: HttpServer,
) -> anyhow::Result<(HttpServer, Option<AdminServer>)> {
    let state = AdminState::new(Arc::new(management.clone()), &settings.admin)
        .with_models(Arc::new(models.clone()))
        .with_loras(Arc::new(loras.clone()))
        .with_site(site.clone());
    // The console is a page that calls the management API: it is served where the API is.
    let router = routes(state).merge(web_console::routes());
    if settings.admin.on_http_listener {
        return Ok((http.merge(router), None));
    }
    let tls = super::load_tls(settings.admin.tls.as_ref(), "admin.tls", &[b"http/1.1"])
        .context("cannot set up TLS for the management API")?;
    let listen = settings.admin.listen;
    let mut server = AdminServer::bind(listen, settings.http.clone(), router)
        .await
        .with_context(|| format!("cannot listen for the management API on {listen}"))?;
    if let Some(tls) = tls {
        server = server.with_tls(tls);
    }
    Ok((http, Some(server)))
}

/// The admin listener, serving until `stop` is cancelled.
pub(super) struct AdminServing {
    stop: CancellationToken,
    serving: Option<JoinHandle<std::io::Result<()>>>,
}

impl AdminServing {
    /// Starts serving `server`, if there is one.
    pub(super) fn start(server: Option<AdminServer>) -> Self {
        let stop = CancellationToken::new();
        let serving = server.map(|server| tokio::spawn(server.run(stop.clone())));
        Self { stop, serving }
    }

    /// Stops the listener after open requests finish.
    ///
    /// # Errors
    /// The listener failed or panicked.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        self.stop.cancel();
        if let Some(serving) = self.serving {
            serving
                .await
                .context("the management API server panicked")?
                .context("the management API server failed")?;
        }
        Ok(())
    }
}

/// Where the management API answers: its own listener's address, or the HTTP one's.
pub(super) fn address(
    server: Option<&AdminServer>,
    http: SocketAddr,
) -> std::io::Result<SocketAddr> {
    server.map_or(Ok(http), AdminServer::local_addr)
}
