//! The management API, `/admin/v1`: JSON over HTTP for operators and the control plane.
//!
//! One route per file, each with a `register` function that adds it to an
//! [`OpenApiRouter`], so the route and its OpenAPI description come from the same code.
//! Handlers are thin: they parse, call the management port (`crate::ports::Manage`, which
//! the management service implements, or `crate::ports::ManageModels`, the model
//! lifecycle's) and render a view (`views.rs`). Every route but the OpenAPI document needs an admin key
//! (`auth.rs`). The API controls nodes only through the edge's services, never directly.

mod auth;
pub mod config;
mod error;
mod feed;
pub mod fit_views;
mod model_command;
mod model_events;
mod model_load;
mod model_unload;
mod models_list;
mod node_drain;
mod node_get;
mod node_resume;
mod nodes_list;
mod openapi;
mod run_cancel;
mod run_events;
mod run_get;
mod runs_list;
mod server;
mod standby;
mod stats;
mod usage_get;
pub mod views;

use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request};
use axum::response::{IntoResponse, Response};
use axum::{Router, middleware};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;

pub use config::AdminConfig;
pub use error::AdminError;
pub use server::AdminServer;

use crate::domain::TokenDigest;
use crate::ports::{Manage, ManageModels, SiteRole};

/// The largest request body the management API reads.
const MAX_BODY_BYTES: usize = 64 * 1024;

/// What the admin handlers work with. Cheap to clone.
#[derive(Clone)]
pub struct AdminState {
    management: Arc<dyn Manage>,
    models: Option<Arc<dyn ManageModels>>,
    keys: Arc<[TokenDigest]>,
    openapi: Arc<OnceLock<String>>,
    site: SiteRole,
}

impl AdminState {
    /// The state for `management`, opened by the keys of `config`.
    pub fn new(management: Arc<dyn Manage>, config: &AdminConfig) -> Self {
        Self {
            management,
            models: None,
            keys: config.digests().into(),
            openapi: Arc::new(OnceLock::new()),
            site: SiteRole::default(),
        }
    }

    /// The same state, refusing changes while `site` says this edge stands by.
    #[must_use]
    pub fn with_site(mut self, site: SiteRole) -> Self {
        self.site = site;
        self
    }

    /// The same state, answering the model routes from `models` (without it, they list
    /// nothing and refuse loads).
    #[must_use]
    pub fn with_models(mut self, models: Arc<dyn ManageModels>) -> Self {
        self.models = Some(models);
        self
    }
}

/// Every route, documented, behind the key check (all but the document itself), then, for
/// a member of a site, the standby's refusal of changes (`standby.rs`).
fn documented(state: &AdminState) -> OpenApiRouter<AdminState> {
    let routes: [fn(OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState>; 14] = [
        nodes_list::register,
        node_get::register,
        node_drain::register,
        node_resume::register,
        runs_list::register,
        run_get::register,
        run_cancel::register,
        run_events::register,
        usage_get::register,
        stats::register,
        models_list::register,
        model_load::register,
        model_unload::register,
        model_events::register,
    ];
    let routes = routes.into_iter().fold(
        OpenApiRouter::with_openapi(openapi::AdminDoc::openapi()),
        |router, register| register(router),
    );
    let routes = if state.site.is_member() {
        routes.route_layer(middleware::from_fn_with_state(
            state.clone(),
            standby::refuse_changes_on_standby,
        ))
    } else {
        routes
    };
    let protected = routes.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_key,
    ));
    openapi::register(protected)
}

/// The management API's routes and its OpenAPI document, ready to serve with any outer
/// state (its own listener's, or the HTTP listener's).
pub fn routes<S: Clone + Send + Sync + 'static>(state: AdminState) -> Router<S> {
    let (router, doc) = documented(&state).split_for_parts();
    if let Ok(json) = doc.to_pretty_json() {
        let _ = state.openapi.set(json);
    }
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Any other path on the admin listener: 404 in the management API's shape.
pub(super) async fn unknown_route(request: Request) -> Response {
    AdminError::not_found(format!(
        "{} {} is not a management API route",
        request.method(),
        request.uri().path()
    ))
    .into_response()
}
