//! The one place the client APIs answer for a standby member of a site: while this edge
//! does not act (`SiteRole::acts`), every API request is refused with `503`, `Retry-After`
//! and the route's error shape, naming the active member's API address when known — so a
//! balancer or client retries where the work is taken. The refusal also closes an HTTP/1
//! connection (`Connection: close`): a balancer that picks a member per connection (a TCP
//! one, as a Kubernetes Service is) would otherwise send every retry on a kept-alive
//! connection to the same standby — found by the nemesis, whose clients waited two minutes
//! for resumes a standby kept refusing (issue 66). A single edge or the active member
//! passes every request through untouched.

use axum::extract::{Request, State};
use axum::http::{HeaderValue, Version, header};
use axum::middleware::Next;
use axum::response::Response;

use super::response::ErrorShape;
use super::{ApiError, ApiState};
use crate::ports::Role;

/// Middleware: the request, unless this member stands by.
pub(super) async fn refuse_on_standby(
    State(state): State<ApiState>,
    request: Request,
    next: Next,
) -> Response {
    let Role::Standby { active, .. } = state.site.effective() else {
        return next.run(request).await;
    };
    let active = active
        .as_ref()
        .map(|member| (member.edge_id.as_str(), member.api_address.as_str()));
    let error = ApiError::standby(active, state.api.config().retry_after_secs);
    let mut response = ErrorShape::of(&request).render(&error);
    if request.version() < Version::HTTP_2 {
        let close = HeaderValue::from_static("close");
        response.headers_mut().insert(header::CONNECTION, close);
    }
    response
}
