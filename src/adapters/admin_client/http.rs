//! A small HTTP/1.1 client for the management API (and, for `edge agent-setup`, the client
//! APIs): one connection per request (an
//! operator command makes a handful), plain or TLS, with the admin key as a Bearer token.
//! Built on hyper's client connection, which the server side already brings in. Every
//! failure is an [`AdminClientError`]; it prints nothing itself.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::http::uri::InvalidUri;
use hyper::{Method, Request, Response, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{InvalidDnsNameError, ServerName};
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::adapters::admin::views::{ErrorBody, ErrorDetail};
use crate::client::{TlsError, tls_client_config};

/// Why a request to the management API (or the client APIs) failed. Each message says what
/// failed; the cause is the error's source, printed after it.
#[derive(Debug, thiserror::Error)]
pub enum AdminClientError {
    /// The URL does not parse.
    #[error("the {} URL {url:?} is not a URL", .listener.name())]
    InvalidUrl {
        /// Which listener the URL was for.
        listener: Listener,
        /// The URL as given.
        url: String,
        /// Why it is not one.
        #[source]
        source: InvalidUri,
    },
    /// The URL is neither `http://` nor `https://`.
    #[error("the {} URL {url:?} must start with http:// or https://", .listener.name())]
    UnsupportedScheme {
        /// Which listener the URL was for.
        listener: Listener,
        /// The URL as given.
        url: String,
    },
    /// The URL names no host.
    #[error("the {} URL {url:?} has no host", .listener.name())]
    NoHost {
        /// Which listener the URL was for.
        listener: Listener,
        /// The URL as given.
        url: String,
    },
    /// An `https://` URL without the CA that signed the listener's certificate.
    #[error(
        "an https {what} URL needs {flag} (or {env}): the CA that signed the {what} listener's certificate",
        what = .listener.name(),
        flag = .listener.cacert_flag(),
        env = .listener.cacert_env()
    )]
    NoCaCert {
        /// Which listener the URL was for.
        listener: Listener,
    },
    /// The CA file cannot be read or used (its message names the file).
    #[error(transparent)]
    CaCert(#[from] TlsError),
    /// The request cannot be put together (a path that is not one).
    #[error("cannot build the request")]
    Request(#[source] hyper::http::Error),
    /// No TCP connection to the listener.
    #[error("cannot reach the edge's {} at {host}:{port}", .listener.described())]
    Connect {
        /// Which listener.
        listener: Listener,
        /// The host from the URL.
        host: String,
        /// The port from the URL (or the scheme's).
        port: u16,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The URL's host cannot be checked against a certificate.
    #[error("{host:?} is not a TLS server name")]
    ServerName {
        /// The host from the URL.
        host: String,
        /// Why it is not one.
        #[source]
        source: InvalidDnsNameError,
    },
    /// The TLS handshake failed (a certificate the CA did not sign, a plain listener).
    #[error("the TLS handshake with the {} failed", .listener.described())]
    TlsHandshake {
        /// Which listener.
        listener: Listener,
        /// What rustls said.
        #[source]
        source: std::io::Error,
    },
    /// The connection is open but does not speak HTTP/1.1.
    #[error("cannot speak HTTP to the {}", .listener.described())]
    Http {
        /// Which listener.
        listener: Listener,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// The request was sent but no answer came.
    #[error("the {} did not answer", .listener.described())]
    NoAnswer {
        /// Which listener.
        listener: Listener,
        /// What hyper said.
        #[source]
        source: hyper::Error,
    },
    /// The edge answered with an error status.
    #[error("the edge refused: {}", refusal(*.status, .detail.as_ref()))]
    Refused {
        /// The answer's status.
        status: StatusCode,
        /// Its code and message, when the body is the API's error object.
        detail: Option<ErrorDetail>,
    },
    /// The answer's body ended before it was complete.
    #[error("the edge's answer broke off")]
    BrokeOff(#[source] hyper::Error),
    /// The answer is not the JSON the API promises for the request.
    #[error("the edge's answer is not the expected JSON")]
    NotExpectedJson(#[source] serde_json::Error),
}

/// Which of the edge's HTTP listeners a client talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// The management API (`[admin] listen`).
    Admin,
    /// The client APIs (`[http] listen`).
    Api,
}

impl Listener {
    fn name(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::Api => "API",
        }
    }

    /// What the edge serves there, for messages.
    fn described(self) -> &'static str {
        match self {
            Self::Admin => "management API",
            Self::Api => "API",
        }
    }

    /// The command-line flag that names the CA for this listener.
    fn cacert_flag(self) -> &'static str {
        match self {
            Self::Admin => "--cacert",
            Self::Api => "--api-cacert",
        }
    }

    fn cacert_env(self) -> &'static str {
        match self {
            Self::Admin => "EDGE_ADMIN_CACERT",
            Self::Api => "EDGE_API_CACERT",
        }
    }
}

/// Where the management API (or the client APIs) is and how to open it.
pub struct AdminClient {
    listener: Listener,
    host: String,
    port: u16,
    /// A path the API sits under behind a proxy, without the trailing `/`.
    prefix: String,
    key: Option<String>,
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl AdminClient {
    /// A client for the management API at `url` (`http://host:port` or `https://...`),
    /// presenting `key`; `cacert` is the CA that signed an HTTPS listener's certificate.
    ///
    /// # Errors
    /// [`AdminClientError::InvalidUrl`], [`AdminClientError::UnsupportedScheme`] or
    /// [`AdminClientError::NoHost`] for a URL that is not one, [`AdminClientError::NoCaCert`]
    /// for HTTPS without `cacert`, [`AdminClientError::CaCert`] when the CA file cannot be
    /// read or used.
    pub fn new(
        url: &str,
        key: Option<String>,
        cacert: Option<&Path>,
    ) -> Result<Self, AdminClientError> {
        Self::to(Listener::Admin, url, key, cacert)
    }

    /// A client for `listener` at `url`, as [`AdminClient::new`] makes one for the
    /// management API.
    ///
    /// # Errors
    /// As [`AdminClient::new`].
    pub fn to(
        listener: Listener,
        url: &str,
        key: Option<String>,
        cacert: Option<&Path>,
    ) -> Result<Self, AdminClientError> {
        let uri: Uri = url.parse().map_err(|source| AdminClientError::InvalidUrl {
            listener,
            url: url.to_owned(),
            source,
        })?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => {
                return Err(AdminClientError::UnsupportedScheme {
                    listener,
                    url: url.to_owned(),
                });
            }
        };
        let host = uri
            .host()
            .ok_or_else(|| AdminClientError::NoHost {
                listener,
                url: url.to_owned(),
            })?
            .trim_matches(|c| c == '[' || c == ']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (https, cacert) {
            (false, _) => None,
            (true, Some(ca)) => Some(tls_client_config(ca, None)?),
            (true, None) => return Err(AdminClientError::NoCaCert { listener }),
        };
        Ok(Self {
            listener,
            host,
            port,
            prefix: uri.path().trim_end_matches('/').to_owned(),
            key: key.filter(|k| !k.is_empty()),
            tls,
        })
    }

    /// `GET path` and its JSON answer.
    ///
    /// # Errors
    /// The edge cannot be reached ([`AdminClientError::Connect`],
    /// [`AdminClientError::ServerName`], [`AdminClientError::TlsHandshake`],
    /// [`AdminClientError::Http`], [`AdminClientError::NoAnswer`]), answered an error
    /// ([`AdminClientError::Refused`], with its message), or sent something that is not the
    /// expected JSON ([`AdminClientError::BrokeOff`], [`AdminClientError::NotExpectedJson`]);
    /// [`AdminClientError::Request`] for a path that is not one.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, AdminClientError> {
        self.call(Method::GET, path, None).await
    }

    /// `method path` with a JSON `body`, and its JSON answer.
    ///
    /// # Errors
    /// As [`AdminClient::get`].
    pub async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, AdminClientError> {
        let response = self.send(method, path, body).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(AdminClientError::BrokeOff)?
            .to_bytes();
        serde_json::from_slice(&bytes).map_err(AdminClientError::NotExpectedJson)
    }

    /// `GET path`, handing each line of the answer to `line` as it arrives.
    ///
    /// # Errors
    /// As [`AdminClient::get`] ([`AdminClientError::BrokeOff`] when the answer breaks off;
    /// the lines are not read as JSON here).
    pub async fn lines(
        &self,
        path: &str,
        mut line: impl FnMut(&str),
    ) -> Result<(), AdminClientError> {
        let response = self.send(Method::GET, path, None).await?;
        let mut body = response.into_body();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(AdminClientError::BrokeOff)?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let text: Vec<u8> = pending.drain(..=end).collect();
                line(String::from_utf8_lossy(&text[..end]).as_ref());
            }
        }
        Ok(())
    }

    /// Sends one request; an error status becomes [`AdminClientError::Refused`] with the
    /// edge's message.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Response<Incoming>, AdminClientError> {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.prefix))
            .header(HOST, format!("{}:{}", self.host, self.port));
        if let Some(key) = &self.key {
            request = request.header(AUTHORIZATION, format!("Bearer {key}"));
        }
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(AdminClientError::Request)?;
        let listener = self.listener;
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| AdminClientError::Connect {
                listener,
                host: self.host.clone(),
                port: self.port,
                source,
            })?;
        let response = match &self.tls {
            None => exchange(tcp, request, listener).await?,
            Some(config) => {
                let name = ServerName::try_from(self.host.clone()).map_err(|source| {
                    AdminClientError::ServerName {
                        host: self.host.clone(),
                        source,
                    }
                })?;
                let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .map_err(|source| AdminClientError::TlsHandshake { listener, source })?;
                exchange(stream, request, listener).await?
            }
        };
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let bytes = response.into_body().collect().await.map(|b| b.to_bytes());
        let detail = bytes
            .ok()
            .and_then(|b| serde_json::from_slice::<ErrorBody>(&b).ok())
            .map(|body| body.error);
        Err(AdminClientError::Refused { status, detail })
    }
}

/// What an error answer with `status` says: its code and message when the body was the
/// API's error object (`detail`), else the status.
fn refusal(status: StatusCode, detail: Option<&ErrorDetail>) -> String {
    detail.map_or_else(
        || status.to_string(),
        |e| format!("{} ({}): {}", status.as_u16(), e.code, e.message),
    )
}

/// One request over a fresh HTTP/1.1 connection on `io` to `listener`.
async fn exchange<IO>(
    io: IO,
    request: Request<Full<Bytes>>,
    listener: Listener,
) -> Result<Response<Incoming>, AdminClientError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|source| AdminClientError::Http { listener, source })?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .map_err(|source| AdminClientError::NoAnswer { listener, source })
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_refusal_says_the_status_and_the_api_s_code_and_message() {
        let refused = AdminClientError::Refused {
            status: StatusCode::NOT_FOUND,
            detail: Some(ErrorDetail {
                code: "not_found".into(),
                message: "no node has id or alias \"gpu-z\"".into(),
            }),
        };
        assert_eq!(
            refused.to_string(),
            "the edge refused: 404 (not_found): no node has id or alias \"gpu-z\""
        );
        let bare = AdminClientError::Refused {
            status: StatusCode::BAD_GATEWAY,
            detail: None,
        };
        assert_eq!(bare.to_string(), "the edge refused: 502 Bad Gateway");
    }

    #[test]
    fn a_url_that_cannot_be_used_is_told_apart_and_names_its_listener() {
        let scheme = AdminClient::to(Listener::Api, "ftp://gpu-box", None, None).err();
        assert!(
            matches!(
                &scheme,
                Some(AdminClientError::UnsupportedScheme {
                    listener: Listener::Api,
                    ..
                })
            ),
            "{scheme:?}"
        );
        assert_eq!(
            scheme.map(|e| e.to_string()).as_deref(),
            Some("the API URL \"ftp://gpu-box\" must start with http:// or https://")
        );
        let no_ca = AdminClient::new("https://gpu-box:8081", None, None).err();
        assert_eq!(
            no_ca.map(|e| e.to_string()).as_deref(),
            Some(
                "an https admin URL needs --cacert (or EDGE_ADMIN_CACERT): the CA that signed \
                 the admin listener's certificate"
            )
        );
    }

    #[tokio::test]
    async fn an_edge_that_is_not_there_is_a_connect_error_carrying_its_cause() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        drop(listener);
        let client =
            AdminClient::new(&format!("http://127.0.0.1:{port}"), None, None).expect("client");
        let error = client
            .get::<serde_json::Value>("/admin/v1/nodes")
            .await
            .expect_err("nothing listens there");
        assert_eq!(
            error.to_string(),
            format!("cannot reach the edge's management API at 127.0.0.1:{port}")
        );
        assert!(
            matches!(&error, AdminClientError::Connect { source, .. } if error.source().is_some() && source.kind() == std::io::ErrorKind::ConnectionRefused),
            "{error:?}"
        );
    }
}
