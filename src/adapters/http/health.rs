//! `GET /healthz`, `GET /readyz` and `GET /metrics`: the operations endpoints, and the
//! one place the metrics registry is rendered in the Prometheus text format. They answer
//! on a standby member of a site too: `/readyz` says it stands by.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::ports::{Readiness, Role, SiteRole};

/// What the operations endpoints work with. Cheap to clone.
#[derive(Clone)]
pub struct OpsState {
    /// The registry `/metrics` renders.
    pub metrics: prometheus::Registry,
    /// For `/readyz`: whether the edge is draining.
    pub readiness: Readiness,
    /// For `/readyz`: whether this edge acts for its site (always, without `[cluster]`).
    pub site: SiteRole,
}

/// The process is alive and serving HTTP.
pub(super) async fn healthz() -> &'static str {
    "ok\n"
}

/// Ready for work: the node transport is listening, the config is loaded (both hold once
/// the server runs), the edge is not draining, and it acts for its site (alone, or as its
/// active member). The body says which: `ready`, `ready: active …, epoch N`, `draining`,
/// or `standby: <why>` with the active member when known (a digest mismatch is a why).
pub(super) async fn readyz(State(state): State<OpsState>) -> Response {
    if state.readiness.is_draining() {
        return (StatusCode::SERVICE_UNAVAILABLE, "draining\n").into_response();
    }
    match state.site.effective() {
        Role::Single => (StatusCode::OK, "ready\n").into_response(),
        Role::Active { epoch } => (
            StatusCode::OK,
            format!("ready: the active member of its site, epoch {epoch}\n"),
        )
            .into_response(),
        Role::Standby { active, reason } => {
            let mut body = format!("standby: {reason}\n");
            if let Some(active) = active {
                body.push_str(&format!(
                    "active member: edge {} (api {}, nodes {})\n",
                    active.edge_id, active.api_address, active.node_address
                ));
            }
            (StatusCode::SERVICE_UNAVAILABLE, body).into_response()
        }
    }
}

/// Every metric in the Prometheus text format.
pub(super) async fn metrics(State(state): State<OpsState>) -> Response {
    match render(&state.metrics) {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot render metrics: {error}\n"),
        )
            .into_response(),
    }
}

/// Renders `registry` in the Prometheus text format.
fn render(registry: &prometheus::Registry) -> Result<String, RenderError> {
    use prometheus::Encoder as _;
    let mut out = Vec::new();
    prometheus::TextEncoder::new().encode(&registry.gather(), &mut out)?;
    Ok(String::from_utf8(out)?)
}

/// Why the metrics could not be rendered.
#[derive(Debug, thiserror::Error)]
enum RenderError {
    /// The encoder refused a metric family.
    #[error(transparent)]
    Encode(#[from] prometheus::Error),
    /// The encoder wrote something that is not UTF-8.
    #[error(transparent)]
    Utf8(#[from] std::string::FromUtf8Error),
}
