//! The operator console, `/console/`: a page in the browser that is a client of the
//! management API (`/admin/v1`) only — fleet, runs, a run's events, charts, usage, models.
//!
//! Its HTML, CSS and JavaScript modules are embedded in the binary (`include_bytes!`) and
//! served as they are: nothing is built with Node.js, nothing is loaded from another origin
//! (the Content-Security-Policy says so to the browser). The assets hold no secret and are
//! served without a key; every request the page makes goes to `/admin/v1` with the admin key
//! the operator typed in (kept in the tab's `sessionStorage`), so the console opens exactly
//! where the management API does. It never calls the edge's services itself.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

/// Where the console lives.
pub const PATH: &str = "/console/";

/// Every asset: its name under `/console/`, its media type, its bytes.
const ASSETS: [(&str, &str, &[u8]); 12] = [
    ("index.html", HTML, include_bytes!("assets/index.html")),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_bytes!("assets/console.css"),
    ),
    ("app.js", JS, include_bytes!("assets/app.js")),
    ("api.js", JS, include_bytes!("assets/api.js")),
    ("format.js", JS, include_bytes!("assets/format.js")),
    ("fleet.js", JS, include_bytes!("assets/fleet.js")),
    ("runs.js", JS, include_bytes!("assets/runs.js")),
    ("run.js", JS, include_bytes!("assets/run.js")),
    ("charts.js", JS, include_bytes!("assets/charts.js")),
    ("usage.js", JS, include_bytes!("assets/usage.js")),
    ("models.js", JS, include_bytes!("assets/models.js")),
    (
        "favicon.svg",
        "image/svg+xml",
        include_bytes!("assets/favicon.svg"),
    ),
];

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";

/// Only this origin's scripts, styles and API; no inline script, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes, for the management listener (or the HTTP one, with the
/// management API).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/console", get(|| async { Redirect::permanent(PATH) }))
        .route(PATH, get(|| async { asset("index.html") }))
        .route(
            "/console/{*file}",
            get(|Path(file): Path<String>| async move { asset(&file) }),
        )
}

/// The asset named `file`, or 404.
fn asset(file: &str) -> Response {
    let Some((_, media_type, bytes)) = ASSETS.iter().find(|(name, _, _)| *name == file) else {
        return (StatusCode::NOT_FOUND, "no such console file\n").into_response();
    };
    let mut response = bytes.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    // Revalidated each load: an upgraded edge serves its new console at once.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_the_page_names_is_served() {
        let html = String::from_utf8_lossy(ASSETS[0].2);
        for (name, _, _) in &ASSETS[1..] {
            let referenced = ASSETS
                .iter()
                .any(|(_, _, bytes)| String::from_utf8_lossy(bytes).contains(name));
            assert!(referenced, "{name} is embedded but nothing loads it");
        }
        assert!(
            !html.contains("http://") && !html.contains("https://"),
            "no remote asset"
        );
        assert_eq!(asset("nothing.js").status(), StatusCode::NOT_FOUND);
        assert_eq!(asset("../Cargo.toml").status(), StatusCode::NOT_FOUND);
    }
}
