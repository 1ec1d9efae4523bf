//! The client-facing APIs: OpenAI's `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/embeddings` and `POST /v1/responses`, Anthropic's
//! `POST /v1/messages` and `/v1/messages/count_tokens`, and llama.cpp's (and vLLM's)
//! `POST /tokenize` and `/detokenize`; JSON or Server-Sent Events, each with its API's error shape, so the
//! official client libraries work unchanged. The edge's own `GET /v1/runs/{run_id}/stream`
//! resumes a streamed chat, completion or Messages answer ([`resume`]).
//!
//! This is the only place the external `model` notion exists: a model id is mapped to
//! `adapter + target` here ([`models`]) and every request becomes a run started through the
//! run service, which dispatches it over the node protocol. Nothing here reaches a node any
//! other way, runs an adapter, or interprets the body beyond the fields it needs.

mod anthropic;
mod auth;
mod config;
mod follow;
pub mod models;
mod openai;
mod request;
mod response;
mod responses;
mod resume;
mod routing;
mod run;
mod sse;
mod standby;
mod translate;
mod translators;

use translate::serve_chat_run;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router, middleware};

pub use config::{ApiConfig, ApiKey};
pub use models::ModelMap;
pub(crate) use response::ErrorShape;
pub use translators::ApiError;

use crate::adapters::http::LimitedRoutes;
use crate::ports::{KnownLoras, Manage, Registry, Runs, SiteRole};

/// What the API's handlers work with. Cheap to clone.
#[derive(Clone)]
pub struct ApiState {
    /// Accepts runs (the run service, through the inbound runs port).
    pub runs: Arc<dyn Runs>,
    /// The connected nodes.
    pub registry: Arc<dyn Registry>,
    /// The LoRAs nodes reported: a model id may name one.
    pub loras: Arc<dyn KnownLoras>,
    /// The API's settings and model map.
    pub api: Api,
    /// Run records and event feeds (the management port), for what the API finds again
    /// by id: background Responses, resumed streams.
    pub manage: Arc<dyn Manage>,
    /// Whether this edge acts for its site: a standby refuses every API request.
    pub site: SiteRole,
}

/// The API's settings and model map. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Api {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    config: ApiConfig,
    models: ModelMap,
    /// `routing.prefix_affinity`: key chat runs by their prompt prefix.
    prefix_affinity: bool,
}

/// `[api]` settings the API cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid [api] settings: {}", .problems.join("; "))]
pub struct ApiConfigError {
    /// Every problem, each naming its key.
    pub problems: Vec<String>,
}

impl Api {
    /// The API configured by `config`.
    ///
    /// # Errors
    /// [`ApiConfigError`] listing every problem of [`ApiConfig::problems`] (settings loaded
    /// through `Settings::load` have none).
    pub fn new(config: ApiConfig) -> Result<Self, ApiConfigError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(ApiConfigError { problems });
        }
        let models =
            ModelMap::new(&config.models).map_err(|problems| ApiConfigError { problems })?;
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                models,
                prefix_affinity: true,
            }),
        })
    }

    /// The same API, keying chat runs by their prompt prefix or not
    /// (`routing.prefix_affinity`, on by default).
    #[must_use]
    pub fn with_prefix_affinity(mut self, on: bool) -> Self {
        Arc::make_mut(&mut self.inner).prefix_affinity = on;
        self
    }

    /// Whether chat runs are keyed by their prompt prefix.
    pub fn prefix_affinity(&self) -> bool {
        self.inner.prefix_affinity
    }

    /// The settings.
    pub fn config(&self) -> &ApiConfig {
        &self.inner.config
    }

    /// The model map.
    pub fn models(&self) -> &ModelMap {
        &self.inner.models
    }
}

/// The API's routes for the HTTP server, in groups: each with the error shape its API's
/// clients read, set outermost so every layer that answers early answers in it
/// ([`ErrorShape::of`]), and with its refusal when the server's request limit is reached
/// (`503` with `Retry-After`, in that shape). Behind the API-key check (when keys are
/// configured), the standby refusal (`standby.rs`) and the body limit.
pub(crate) fn route_groups(state: &ApiState) -> Vec<LimitedRoutes> {
    let openai = Router::new()
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*model}", get(models::retrieve))
        .route("/v1/chat/completions", post(openai::chat::create))
        .route("/v1/completions", post(openai::completions::create))
        .route("/v1/embeddings", post(openai::embeddings::create))
        .route(
            "/v1/responses",
            post(|s, c, h, b| serve_chat_run(&responses::RESPONSES, s, c, h, b))
                .get(responses::websocket),
        )
        .route("/v1/responses/{id}", get(responses::retrieve))
        .route("/v1/responses/{id}/cancel", post(responses::cancel))
        .route("/v1/runs/{run_id}/stream", get(resume::resume))
        .route("/tokenize", post(openai::tokenize::tokenize))
        .route("/detokenize", post(openai::tokenize::detokenize));
    let anthropic = Router::new()
        .route(
            "/v1/messages",
            post(|s, c, h, b| serve_chat_run(&anthropic::MESSAGES, s, c, h, b)),
        )
        .route(
            anthropic::count_tokens::COUNT_TOKENS_PATH,
            post(anthropic::count_tokens::count),
        );
    [
        (ErrorShape::OpenAi, openai),
        (ErrorShape::Anthropic, anthropic),
    ]
    .into_iter()
    .map(|(shape, routes)| {
        let retry_after_secs = state.api.config().retry_after_secs;
        LimitedRoutes {
            // One layer of both: axum boxes each route once per `layer` call.
            routes: guarded(routes, state).with_state(state.clone()).layer((
                Extension(shape),
                DefaultBodyLimit::max(state.api.config().max_body_bytes),
            )),
            refuse: Arc::new(move || shape.render(&ApiError::overloaded(retry_after_secs))),
        }
    })
    .collect()
}

/// The answer to a path the server has no route for: 404 in OpenAI's shape.
pub(crate) fn unknown_routes() -> Router {
    Router::new().fallback(unknown_route)
}

/// `routes` behind the API-key check (when keys are configured), then the standby
/// refusal (for a member of a site: a single edge never stands by, and its requests pay
/// no layer for it).
fn guarded(routes: Router<ApiState>, state: &ApiState) -> Router<ApiState> {
    let routes = if state.site.is_member() {
        routes.route_layer(middleware::from_fn_with_state(
            state.clone(),
            standby::refuse_on_standby,
        ))
    } else {
        routes
    };
    if state.api.config().keys.is_empty() {
        routes
    } else {
        routes.route_layer(middleware::from_fn_with_state(
            state.api.clone(),
            auth::require_key,
        ))
    }
}

/// Any other path: 404 in OpenAI's shape.
async fn unknown_route(request: Request) -> Response {
    ApiError::unknown_url(request.method().as_str(), request.uri().path()).into_response()
}
