//! A small HTTP/1.1 client for the management API (and, for `edge agent-setup`, the client
//! APIs): one connection per request (an
//! operator command makes a handful), plain or TLS, with the admin key as a Bearer token.
//! Built on hyper's client connection, which the server side already brings in.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::adapters::admin::views::ErrorBody;
use crate::client::tls_client_config;

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
    /// The URL is not one, HTTPS without `cacert`, or the CA file cannot be read.
    pub fn new(url: &str, key: Option<String>, cacert: Option<&Path>) -> anyhow::Result<Self> {
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
    ) -> anyhow::Result<Self> {
        let what = listener.name();
        let uri: Uri = url
            .parse()
            .with_context(|| format!("the {what} URL {url:?} is not a URL"))?;
        let https = match uri.scheme_str() {
            Some("http") => false,
            Some("https") => true,
            _ => bail!("the {what} URL {url:?} must start with http:// or https://"),
        };
        let host = uri
            .host()
            .ok_or_else(|| anyhow!("the {what} URL {url:?} has no host"))?
            .trim_matches(|c| c == '[' || c == ']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (https, cacert) {
            (false, _) => None,
            (true, Some(ca)) => Some(tls_client_config(ca, None)?),
            (true, None) => bail!(
                "an https {what} URL needs --cacert (or {}): the CA that signed the {what} listener's certificate",
                listener.cacert_env()
            ),
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
    /// The edge cannot be reached, answered an error (its message is returned), or sent
    /// something that is not the expected JSON.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
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
    ) -> anyhow::Result<T> {
        let response = self.send(method, path, body).await?;
        let bytes = response
            .into_body()
            .collect()
            .await
            .context("the edge's answer broke off")?
            .to_bytes();
        serde_json::from_slice(&bytes).context("the edge's answer is not the expected JSON")
    }

    /// `GET path`, handing each line of the answer to `line` as it arrives.
    ///
    /// # Errors
    /// As [`AdminClient::get`], or the answer broke off.
    pub async fn lines(&self, path: &str, mut line: impl FnMut(&str)) -> anyhow::Result<()> {
        let response = self.send(Method::GET, path, None).await?;
        let mut body = response.into_body();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.context("the edge's answer broke off")?;
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

    /// Sends one request; an error status becomes an error with the edge's message.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<Response<Incoming>> {
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
            .context("cannot build the request")?;
        let tcp = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| {
                format!(
                    "cannot reach the edge's {} at {}:{}",
                    self.listener.described(),
                    self.host,
                    self.port
                )
            })?;
        let response = match &self.tls {
            None => exchange(tcp, request, self.listener).await?,
            Some(config) => {
                let name = ServerName::try_from(self.host.clone())
                    .with_context(|| format!("{:?} is not a TLS server name", self.host))?;
                let stream = tokio_rustls::TlsConnector::from(Arc::clone(config))
                    .connect(name, tcp)
                    .await
                    .with_context(|| {
                        format!(
                            "the TLS handshake with the {} failed",
                            self.listener.described()
                        )
                    })?;
                exchange(stream, request, self.listener).await?
            }
        };
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let bytes = response.into_body().collect().await.map(|b| b.to_bytes());
        bail!(
            "the edge refused: {}",
            refusal(status, bytes.ok().as_deref())
        )
    }
}

/// What an error answer with `status` and `body` says: its code and message when the body
/// is an error object, else the status.
fn refusal(status: hyper::StatusCode, body: Option<&[u8]>) -> String {
    body.and_then(|b| serde_json::from_slice::<ErrorBody>(b).ok())
        .map_or_else(
            || status.to_string(),
            |e| {
                format!(
                    "{} ({}): {}",
                    status.as_u16(),
                    e.error.code,
                    e.error.message
                )
            },
        )
}

/// One request over a fresh HTTP/1.1 connection on `io` to `listener`.
async fn exchange<IO>(
    io: IO,
    request: Request<Full<Bytes>>,
    listener: Listener,
) -> anyhow::Result<Response<Incoming>>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let what = listener.described();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .with_context(|| format!("cannot speak HTTP to the {what}"))?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    sender
        .send_request(request)
        .await
        .with_context(|| format!("the {what} did not answer"))
}
