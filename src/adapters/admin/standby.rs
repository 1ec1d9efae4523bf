//! The one place the management API answers for a standby member of a site: while this
//! edge does not act, a call that changes something (any method but `GET`, `HEAD` and
//! `OPTIONS`) is refused with `503 standby`, `Retry-After` and the active member's address
//! when known; reads still answer, so operators can look at a standby.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AdminError, AdminState};
use crate::ports::Role;

/// Middleware: the request, unless it changes something and this member stands by.
pub(super) async fn refuse_changes_on_standby(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    let reads = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if reads {
        return next.run(request).await;
    }
    let Role::Standby { active, .. } = state.site.effective() else {
        return next.run(request).await;
    };
    let active = active
        .as_ref()
        .map(|member| (member.edge_id.as_str(), member.api_address.as_str()));
    AdminError::standby(active).into_response()
}
