//! Admin keys: `Authorization: Bearer <key>` against `[admin] keys` and `key_sha256`.
//!
//! Compared as SHA-256 digests in constant time against every key (no early exit), never
//! logged. Only admin keys open the management API: an `[api]` key is just another
//! unknown key here. With no admin key configured (allowed on loopback only) the API is
//! open.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AdminState;
use super::error::AdminError;
use crate::domain::{Token, TokenDigest};

/// Lets the request through with an admin key; answers 401 otherwise.
pub(super) async fn require_key(
    State(state): State<AdminState>,
    request: Request,
    next: Next,
) -> Response {
    match check(&state.keys, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => error.into_response(),
    }
}

fn check(keys: &[TokenDigest], headers: &HeaderMap) -> Result<(), AdminError> {
    if keys.is_empty() {
        return Ok(());
    }
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, key) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        })
        .filter(|key| !key.is_empty())
        .ok_or_else(|| {
            AdminError::unauthorized("an admin key is required: Authorization: Bearer <key>")
        })?;
    let digest = Token::new(presented).digest();
    let matched = keys
        .iter()
        .fold(false, |matched, key| matched | key.matches(&digest));
    if matched {
        Ok(())
    } else {
        Err(AdminError::unauthorized("the admin key is not valid"))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, StatusCode};

    use super::*;

    fn headers(authorization: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(authorization).unwrap(),
        );
        headers
    }

    #[test]
    fn only_configured_admin_keys_pass() {
        assert!(check(&[], &HeaderMap::new()).is_ok());
        let keys = [Token::new("adm-1").digest(), Token::new("adm-2").digest()];
        assert!(check(&keys, &headers("Bearer adm-2")).is_ok());
        assert!(check(&keys, &headers("bearer adm-1")).is_ok());
        for bad in ["Bearer sk-api", "Basic adm-1", "Bearer ", "adm-1"] {
            let error = check(&keys, &headers(bad)).unwrap_err();
            assert_eq!(error.status(), StatusCode::UNAUTHORIZED, "{bad}");
        }
        assert!(check(&keys, &HeaderMap::new()).is_err());
    }
}
