//! The one place the management API answers for a standby member of a site: while this
//! edge does not act, a call that changes something (any method but `GET`, `HEAD` and
//! `OPTIONS`) is refused with `503 standby`, `Retry-After` and the active member's address
//! when known; reads still answer, so operators can look at a standby — but a run its copy
//! of the journal does not hold is `503 standby`, not `404`, as it may not hold it yet.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AdminError, AdminState};
use crate::ports::ActiveMember;
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
    AdminError::standby(active.as_ref().map(address)).into_response()
}

/// The answer for `run`, which this member does not know: `404` where it acts; on a
/// standby, whose journal follows the site's stream and is rebuilt from it while the member
/// takes over, `503 standby` naming the active member — the run may be there and not yet
/// here (the nemesis's collection read completed runs as missing from a member refolding its
/// journal after taking the lease back, issue 66).
pub(super) fn run_not_known(state: &AdminState, run: &str) -> AdminError {
    match state.site.effective() {
        Role::Standby { active, .. } => {
            AdminError::run_not_yet_here(run, active.as_ref().map(address))
        }
        Role::Single | Role::Active { .. } => {
            AdminError::not_found(format!("no run has id {run:?}"))
        }
    }
}

/// The active member's edge id and API address.
fn address(member: &ActiveMember) -> (&str, &str) {
    (member.edge_id.as_str(), member.api_address.as_str())
}
