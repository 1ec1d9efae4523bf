//! Optional client authentication: `Authorization: Bearer <key>` or `x-api-key: <key>`
//! (Anthropic's header) against `[api] keys`.
//!
//! Keys are compared as SHA-256 digests in constant time, against every configured key
//! (no early exit), and never logged. With no keys configured the API is open (and this
//! middleware is not installed). Only the `/v1` routes are guarded; `/healthz`, `/readyz`
//! and `/metrics` stay open.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;

use super::Api;
use super::error::ApiError;
use crate::domain::Token;

/// Anthropic's API-key header, accepted on every route besides `Authorization: Bearer`.
const API_KEY_HEADER: &str = "x-api-key";

/// Lets the request through when its key is one of `[api] keys` (or none are configured);
/// answers 401 `invalid_api_key` otherwise.
pub(super) async fn require_key(State(api): State<Api>, request: Request, next: Next) -> Response {
    match check(&api.config().keys, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => super::error_response_for(request.uri().path(), &error),
    }
}

fn check(keys: &[super::ApiKey], headers: &HeaderMap) -> Result<(), ApiError> {
    if keys.is_empty() {
        return Ok(());
    }
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            let (scheme, key) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| key.trim())
        });
    let api_key = headers
        .get(API_KEY_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::trim);
    let presented = bearer
        .filter(|key| !key.is_empty())
        .or(api_key.filter(|key| !key.is_empty()))
        .ok_or_else(|| ApiError::invalid_api_key(true))?;
    let digest = Token::new(presented).digest();
    let matched = keys
        .iter()
        .fold(false, |matched, key| matched | key.matches(&digest));
    if matched {
        Ok(())
    } else {
        Err(ApiError::invalid_api_key(false))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderValue, StatusCode};

    use super::super::ApiKey;
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
    fn keys_are_checked_only_when_configured() {
        assert!(check(&[], &HeaderMap::new()).is_ok());
        let keys = [ApiKey::new("sk-one"), ApiKey::new("sk-two")];
        assert!(check(&keys, &headers("Bearer sk-two")).is_ok());
        assert!(check(&keys, &headers("bearer sk-one")).is_ok());
        let wrong = check(&keys, &headers("Bearer sk-three")).unwrap_err();
        assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(wrong.error_code(), Some("invalid_api_key"));
        assert!(check(&keys, &HeaderMap::new()).is_err());
        assert!(check(&keys, &headers("Basic sk-one")).is_err());
        assert!(check(&keys, &headers("Bearer ")).is_err());
        let mut anthropic = HeaderMap::new();
        anthropic.insert(API_KEY_HEADER, HeaderValue::from_static("sk-two"));
        assert!(check(&keys, &anthropic).is_ok());
        anthropic.insert(API_KEY_HEADER, HeaderValue::from_static("sk-nope"));
        assert!(check(&keys, &anthropic).is_err());
    }
}
