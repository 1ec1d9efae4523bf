//! Optional client authentication: `Authorization: Bearer <key>` or `x-api-key: <key>`
//! (Anthropic's header) against `[api] keys`, and the [`Caller`] a matched key makes: the
//! tenant, priority and limits its runs get.
//!
//! Keys are compared as SHA-256 digests in constant time, against every configured key
//! (no early exit), and never logged. With no keys configured the API is open (and this
//! middleware is not installed): every caller is the anonymous tenant. Only the `/v1`
//! routes are guarded; `/healthz`, `/readyz` and `/metrics` stay open.

use std::convert::Infallible;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;

use super::ApiError;
use super::response::ErrorShape;
use super::{Api, ApiKey};
use crate::domain::routing::{LimitPolicy, Priority, TenantKey, TokenBudget};
use crate::domain::{AcceptedRun, Token};

/// Who is calling, as routing sees it: set by the key check, read by the handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Caller {
    /// The key's name (its tenant), or `anonymous` on an open API.
    pub tenant: TenantKey,
    /// The priority class of its runs when it does not choose one.
    pub priority: Priority,
    /// Whether it may choose the class with `x-edge-priority`.
    pub allow_priority_header: bool,
    /// Its own limits; `None` applies `[limits]`.
    pub limits: Option<LimitPolicy>,
    /// Its token budget, if it has one.
    pub budget: Option<TokenBudget>,
    /// Whether its streams are resumable without asking (`x-edge-resumable`).
    pub resumable: bool,
}

impl Caller {
    /// Whether the caller may see run `accepted` again (retrieve, resume): the API key that
    /// started it, or anyone on an open API when it was started without one.
    pub fn owns(&self, accepted: &AcceptedRun) -> bool {
        let key = (self.tenant != TenantKey::anonymous()).then(|| self.tenant.as_str());
        accepted.api_key_name.as_deref() == key
    }
}

impl Default for Caller {
    /// An open API's caller: anonymous, interactive, and free to choose its class (every
    /// caller of an open API may, so the header favours nobody).
    fn default() -> Self {
        Self {
            tenant: TenantKey::anonymous(),
            priority: Priority::Interactive,
            allow_priority_header: true,
            limits: None,
            budget: None,
            resumable: false,
        }
    }
}

impl Caller {
    fn of(key: &ApiKey, index: usize) -> Self {
        Self {
            tenant: key.tenant(index),
            priority: key.priority(),
            allow_priority_header: key.allows_priority_header(),
            limits: key.limits(),
            budget: key.budget(),
            resumable: key.resumable(),
        }
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Infallible> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default())
    }
}

/// Anthropic's API-key header, accepted on every route besides `Authorization: Bearer`.
const API_KEY_HEADER: &str = "x-api-key";

/// Lets the request through, as its key's [`Caller`], when its key is one of `[api] keys`
/// (or none are configured); answers 401 `invalid_api_key` otherwise.
pub(super) async fn require_key(
    State(api): State<Api>,
    mut request: Request,
    next: Next,
) -> Response {
    match check(&api.config().keys, request.headers()) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(error) => ErrorShape::of(&request).render(&error),
    }
}

fn check(keys: &[ApiKey], headers: &HeaderMap) -> Result<Caller, ApiError> {
    if keys.is_empty() {
        return Ok(Caller::default());
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
    // Every key is compared (no early exit); the last match wins (keys are distinct).
    let matched = keys.iter().enumerate().fold(None, |matched, (index, key)| {
        if key.matches(&digest) {
            Some(index)
        } else {
            matched
        }
    });
    match matched {
        Some(index) => Ok(Caller::of(&keys[index], index)),
        None => Err(ApiError::invalid_api_key(false)),
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
    fn keys_are_checked_only_when_configured() {
        assert_eq!(check(&[], &HeaderMap::new()).unwrap(), Caller::default());
        let keys = [ApiKey::new("sk-one"), ApiKey::new("sk-two")];
        let second = check(&keys, &headers("Bearer sk-two")).unwrap();
        assert_eq!(second.tenant.as_str(), "key-2");
        assert!(!second.allow_priority_header);
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
