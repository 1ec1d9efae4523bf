//! `GET /admin/v1/openapi.json`: the management API's OpenAPI document, generated from the
//! route handlers and the view types (utoipa), so it cannot drift from what is served.
//! Open without a key: it describes the API and holds nothing secret.

use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AdminState;

/// The document's fixed parts: title, version, tags and the admin-key scheme.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "edge management API",
        description = "Nodes, drains, runs and their events, usage, models and their loads, for operators and the control plane. \
                       Every route but this document needs an admin key: `Authorization: Bearer <key>`.",
        version = "1"
    ),
    tags(
        (name = "nodes", description = "Configured nodes, their state, drain and resume"),
        (name = "runs", description = "Open and finished runs, their records, events and cancels"),
        (name = "usage", description = "What runs consumed, by key, model, node and affinity source, and the prompt-cache hit rate"),
        (name = "stats", description = "The last hour of runs in buckets, kept in memory"),
        (name = "models", description = "Models on the nodes' engines: where each is loaded, loads and unloads on request, and the feed of them"),
        (name = "meta", description = "This document"),
    ),
    modifiers(&AdminKeyScheme)
)]
pub(super) struct AdminDoc;

struct AdminKeyScheme;

impl Modify for AdminKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "admin_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An `[admin]` key (an `[api]` key is refused)"))
                    .build(),
            ),
        );
    }
}

pub(super) fn register(router: OpenApiRouter<AdminState>) -> OpenApiRouter<AdminState> {
    router.routes(routes!(openapi_json))
}

/// This document.
#[utoipa::path(
    get,
    path = "/admin/v1/openapi.json",
    tag = "meta",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)),
    security(())
)]
async fn openapi_json(State(state): State<AdminState>) -> Response {
    match state.openapi.get() {
        Some(json) => {
            let mut response = json.clone().into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            response
        }
        None => StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
}
