//! The HTTP side of an engine: one `reqwest` client per adapter, POSTs whose answers are
//! read chunk by chunk, and the `GET /models` probe, each under its timeouts. HTTPS engines
//! are checked against the system's CA certificates, or the adapter's `tls_ca` file; the
//! TLS is rustls with the `ring` provider passed in ([`client_builder`]), so nothing here
//! depends on a process-wide crypto provider (decision 15).
//!
//! Failures come back as [`UpstreamFault`]s ([`crate::fault`]) for the classification
//! table; nothing here decides whose fault they are. The API key goes only into the
//! `Authorization` header and never into an error or a log line. Dropping a
//! [`reqwest::Response`] before its end closes its connection, which is how a cancelled run
//! tells the engine to stop.
//!
//! After a streamed answer the next request's connection is opened ahead of it
//! ([`Upstream::preconnect`]): llama.cpp's `llama-server` closes the connection after every
//! streamed answer, so without it every streamed request would first wait for a fresh one.
//!
//! Every request to the engine — runs, probes, `/props`, the lifecycle's calls, the
//! connection opened ahead — is sent by one function (`Upstream::send`) under one rule: a
//! kept-alive connection is dropped from the pool before the engine would close it
//! ([`POOL_IDLE`]), and a request that fails on a reused connection before any byte of an
//! answer came back goes again at once on a fresh one. Only a failure of that second send,
//! a refused connection or a timeout is the engine's.

use std::collections::BTreeMap;
use std::error::Error as _;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use edge::client::TlsError;
use serde_json::Value;

use crate::fault::UpstreamFault;

/// The most of an error body kept for its message.
const MAX_ERROR_BODY: usize = 64 * 1024;

/// The most of a whole (non-streamed) answer accepted: embeddings of a large batch.
pub const MAX_WHOLE_BODY: usize = 256 * 1024 * 1024;

/// A probe (or a connection opened ahead) that took longer than `probe_timeout_ms`.
const PROBE_LATE: UpstreamFault = UpstreamFault::Timeout("probe_timeout_ms");

/// The most of a `GET /models` answer read: an engine listing hundreds of models.
const MAX_MODEL_LIST: usize = MAX_ERROR_BODY * 16;

/// How long an idle kept-alive connection stays in the pool: shorter than any engine keeps
/// one (`llama-server`'s cpp-httplib and vLLM's uvicorn close theirs after 5 s), so a
/// request rarely meets a connection the engine is closing (docs/node.md, "Connections to
/// the engine").
pub const POOL_IDLE: Duration = Duration::from_secs(3);

/// An engine's HTTP endpoint.
#[derive(Clone)]
pub struct Upstream {
    client: reqwest::Client,
    /// The same client keeping no connection: the second send of a request whose reused
    /// connection the engine had closed goes on a connection of its own.
    fresh: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
    idle_timeout: Duration,
    probe_timeout: Duration,
    /// A connection opened ahead ([`Upstream::preconnect`]) is on its way or waits in the
    /// pool: one at a time, since each holds one of `llama-server`'s HTTP threads (a
    /// thread per connection) while it waits.
    spare: Arc<AtomicBool>,
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// Timeouts of an [`Upstream`].
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// To open a TCP connection.
    pub connect: Duration,
    /// Of silence: before the headers, and between chunks.
    pub idle: Duration,
    /// Of one probe, start to end.
    pub probe: Duration,
}

/// Why an engine's HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// The adapter's `tls_ca` file cannot be read or holds no usable certificate (the TLS
    /// error names the file).
    #[error("`tls_ca`: {source}")]
    TlsCa {
        /// Why.
        #[source]
        source: Box<TlsError>,
    },
    /// The system's trust store cannot be loaded.
    #[error("cannot load the system's CA certificates: {source}")]
    SystemCas {
        /// Why.
        #[source]
        source: Box<TlsError>,
    },
    /// rustls refused the TLS settings of a plain-HTTP engine's client.
    #[error("cannot set up the HTTP client's TLS: {source}")]
    Tls {
        /// Why.
        #[source]
        source: rustls::Error,
    },
    /// `reqwest` refused the client's settings.
    #[error("cannot build the HTTP client: {source}")]
    Build {
        /// Why.
        #[source]
        source: reqwest::Error,
    },
}

/// A `reqwest` client builder whose HTTPS trusts the CA certificates in `tls_ca` (PEM), or
/// the system's when `None`, over rustls with the `ring` provider. Every HTTP client of the
/// node starts here; a client built any other way would need a process-wide provider.
///
/// # Errors
/// [`HttpClientError::TlsCa`] when `tls_ca` cannot be read or holds no usable certificate;
/// [`HttpClientError::SystemCas`] when the system's trust store cannot be loaded.
pub fn client_builder(tls_ca: Option<&Path>) -> Result<reqwest::ClientBuilder, HttpClientError> {
    let tls = match tls_ca {
        Some(path) => edge::client::tls_client_config(path, None)
            .map(Arc::unwrap_or_clone)
            .map_err(|error| HttpClientError::TlsCa {
                source: Box::new(error),
            })?,
        None => {
            edge::client::platform_client_config().map_err(|error| HttpClientError::SystemCas {
                source: Box::new(error),
            })?
        }
    };
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls))
}

/// A `reqwest` client builder for an `http://` engine: TLS with no trusted root at all (it is
/// never used), so a machine without CA certificates runs a node in front of a plain-HTTP
/// engine (the system's trust store is read only for an `https://` one).
///
/// # Errors
/// [`HttpClientError::Tls`] when rustls refuses even that configuration.
fn plain_http_builder() -> Result<reqwest::ClientBuilder, HttpClientError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|source| HttpClientError::Tls { source })?
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    Ok(reqwest::Client::builder().tls_backend_preconfigured(tls))
}

impl Upstream {
    /// A client for the engine at `base_url` (up to and including `/v1`); an `https://`
    /// engine's certificate is checked against `tls_ca`, or the system's CAs without it
    /// (which are read only then).
    ///
    /// # Errors
    /// As [`client_builder`], and [`HttpClientError::Build`] when `reqwest` refuses the
    /// client.
    pub fn new(
        base_url: &str,
        tls_ca: Option<&Path>,
        api_key: Option<String>,
        timeouts: Timeouts,
    ) -> Result<Self, HttpClientError> {
        let plain_http = tls_ca.is_none() && !base_url.starts_with("https://");
        let build = |pooled: bool| -> Result<reqwest::Client, HttpClientError> {
            let builder = if plain_http {
                plain_http_builder()?
            } else {
                client_builder(tls_ca)?
            };
            let builder = builder.connect_timeout(timeouts.connect).tcp_nodelay(true);
            let builder = if pooled {
                builder.pool_idle_timeout(POOL_IDLE)
            } else {
                builder.pool_max_idle_per_host(0)
            };
            builder
                .build()
                .map_err(|source| HttpClientError::Build { source })
        };
        Ok(Self {
            client: build(true)?,
            fresh: build(false)?,
            base_url: base_url.to_owned(),
            api_key,
            idle_timeout: timeouts.idle,
            probe_timeout: timeouts.probe,
            spare: Arc::new(AtomicBool::new(false)),
        })
    }

    /// POSTs `body` to `path` and returns the response once its status is a success.
    ///
    /// # Errors
    /// [`UpstreamFault::Status`] with the (bounded) body for any other status; the fault of
    /// the connection otherwise.
    pub async fn post(&self, path: &str, body: &Value) -> Result<reqwest::Response, UpstreamFault> {
        self.post_to(format!("{}{path}", self.base_url), body).await
    }

    /// POSTs `body` to `path` below the engine's root (the base URL without its `/v1`),
    /// where llama.cpp and vLLM serve `/tokenize`, `/detokenize` and `/apply-template`.
    ///
    /// # Errors
    /// As [`Upstream::post`].
    pub async fn post_root(
        &self,
        path: &str,
        body: &Value,
    ) -> Result<reqwest::Response, UpstreamFault> {
        self.post_to(format!("{}{path}", self.root()), body).await
    }

    /// The engine's root: the base URL without its `/v1`.
    fn root(&self) -> &str {
        self.base_url.strip_suffix("/v1").unwrap_or(&self.base_url)
    }

    /// POSTs `body` to `path` below the engine's root and waits up to `within` for the
    /// answer's headers (not `idle_timeout_ms`): a call the engine answers only once its work
    /// is done (Ollama's load, vLLM's sleep), bounded by `load_timeout_ms`.
    ///
    /// # Errors
    /// As [`Upstream::post`]; [`UpstreamFault::Timeout`] after `within`.
    pub async fn post_root_within(
        &self,
        path: &str,
        body: &Value,
        within: Duration,
    ) -> Result<reqwest::Response, UpstreamFault> {
        let url = format!("{}{path}", self.root());
        let late = UpstreamFault::Timeout("load_timeout_ms");
        self.post_url(url, body, within, late).await
    }

    async fn post_to(&self, url: String, body: &Value) -> Result<reqwest::Response, UpstreamFault> {
        let late = UpstreamFault::Timeout("no answer before idle_timeout_ms");
        self.post_url(url, body, self.idle_timeout, late).await
    }

    async fn post_url(
        &self,
        url: String,
        body: &Value,
        within: Duration,
        late: UpstreamFault,
    ) -> Result<reqwest::Response, UpstreamFault> {
        // This request takes the connection opened ahead, if one waits.
        self.spare.store(false, Ordering::Release);
        let response = self
            .send(|client| client.post(&url).json(body), within, late)
            .await?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let mut response = response;
        let body = self
            .read_to_end(&mut response, MAX_ERROR_BODY)
            .await
            .unwrap_or_default();
        Err(UpstreamFault::Status {
            status: status.as_u16(),
            body,
        })
    }

    /// Sends the request `request` builds (on `client`, with the engine's API key added),
    /// waiting at most `within` for the answer's headers (`late` when they do not come).
    ///
    /// The one rule for every request to the engine: a request that fails on a kept-alive
    /// connection the engine had closed meanwhile, before any byte of an answer came back
    /// (llama-server closes the connection after every streamed answer and after 5 s idle,
    /// and its close can cross the next request), never reached the engine, so it goes
    /// again at once on a fresh connection — not counted against `max_retries`. A refused
    /// connection, a timeout or a failure of that second send is the fault returned.
    ///
    /// # Errors
    /// `late` after `within`; the connection's fault otherwise.
    async fn send(
        &self,
        request: impl Fn(&reqwest::Client) -> reqwest::RequestBuilder,
        within: Duration,
        late: UpstreamFault,
    ) -> Result<reqwest::Response, UpstreamFault> {
        let send = |client: &reqwest::Client| {
            let mut request = request(client);
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            tokio::time::timeout(within, request.send())
        };
        let answer = match send(&self.client).await {
            Ok(Err(error)) if closed_before_answer(&error) => {
                tracing::debug!(%error, "the engine closed a kept-alive connection; sending again on a fresh one");
                send(&self.fresh).await
            }
            answer => answer,
        };
        answer.map_err(|_| late)?.map_err(fault_of)
    }

    /// The next piece of a response body; `None` at its end.
    ///
    /// # Errors
    /// [`UpstreamFault::Timeout`] after `idle_timeout_ms` of silence; the read's fault.
    pub async fn next_chunk(
        &self,
        response: &mut reqwest::Response,
    ) -> Result<Option<Bytes>, UpstreamFault> {
        tokio::time::timeout(self.idle_timeout, response.chunk())
            .await
            .map_err(|_| UpstreamFault::Timeout("silent for idle_timeout_ms"))?
            .map_err(fault_of)
    }

    /// The whole body, up to `limit` bytes (the rest is cut off).
    ///
    /// # Errors
    /// As [`Upstream::next_chunk`]; [`UpstreamFault::Malformed`] past `limit`.
    pub async fn read_to_end(
        &self,
        response: &mut reqwest::Response,
        limit: usize,
    ) -> Result<Vec<u8>, UpstreamFault> {
        let mut body = Vec::new();
        while let Some(chunk) = self.next_chunk(response).await? {
            if body.len() + chunk.len() > limit {
                return Err(UpstreamFault::Malformed(format!(
                    "the body is larger than {limit} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }

    /// Opens a connection for the next request ahead of it, in the background: a
    /// `GET {base_url}/models` whose answer is read to its end, so the connection goes back
    /// to the client's pool kept alive. Called after a streamed answer, whose connection
    /// `llama-server` closes: the next streamed request then finds a connection the engine
    /// has already accepted and handed to one of its HTTP threads, instead of waiting for
    /// that. Only one at a time: nothing is opened while an earlier one is on its way or
    /// unused (the next `POST` takes it). A failure is only logged at DEBUG (the next
    /// request connects as it would have). Returns whether it started one.
    pub fn preconnect(&self) -> bool {
        if self.spare.swap(true, Ordering::AcqRel) {
            return false;
        }
        let upstream = self.clone();
        tokio::spawn(async move {
            if let Err(fault) = upstream.open_connection().await {
                upstream.spare.store(false, Ordering::Release);
                tracing::debug!(%fault, "could not open a connection to the engine ahead");
            }
        });
        true
    }

    /// What [`Upstream::preconnect`] does, awaited: the connection is in the pool when it
    /// returns `Ok`.
    async fn open_connection(&self) -> Result<(), UpstreamFault> {
        let url = format!("{}/models", self.base_url);
        let open = async {
            let mut response = self
                .send(|client| client.get(&url), self.probe_timeout, PROBE_LATE)
                .await?;
            // Whatever the status: an answer read to its end leaves the connection pooled.
            self.read_to_end(&mut response, MAX_MODEL_LIST).await
        };
        tokio::time::timeout(self.probe_timeout, open)
            .await
            .map_err(|_| PROBE_LATE)?
            .map(drop)
    }

    /// The models `GET {base_url}/models` lists, with the context windows it gives.
    ///
    /// # Errors
    /// The fault when the engine cannot be reached, answers an error status, or lists
    /// nothing readable.
    pub async fn models(&self) -> Result<ModelList, UpstreamFault> {
        let body = self.probe_get(format!("{}/models", self.base_url)).await?;
        Ok(ModelList {
            ids: model_ids(&body)?,
            windows: model_windows(&body),
        })
    }

    /// The context window llama.cpp's `llama-server` serves its model with: `GET /props`
    /// below the engine's root, `default_generation_settings.n_ctx` (a slot's window).
    /// `Ok(None)` from an engine that answered without it (another engine: no `/props`).
    ///
    /// # Errors
    /// The fault when the engine could not be asked (down, timed out): nothing is known.
    pub async fn served_window(&self) -> Result<Option<u32>, UpstreamFault> {
        let body = match self.get_root("/props").await {
            Ok(body) => body,
            Err(UpstreamFault::Status { .. }) => return Ok(None),
            Err(fault) => return Err(fault),
        };
        Ok(props_window(&body))
    }

    /// The body of `GET {root}{path}` (below the engine's root, as [`Upstream::post_root`]),
    /// within `probe_timeout_ms`: llama-server's `/props` and its router's `/models`.
    ///
    /// # Errors
    /// [`UpstreamFault::Status`] with the body for a status that is not a success; the
    /// fault of the connection, or the timeout, otherwise.
    pub async fn get_root(&self, path: &str) -> Result<Vec<u8>, UpstreamFault> {
        self.probe_get(format!("{}{path}", self.root())).await
    }

    /// `GET url` with the engine's API key within `probe_timeout_ms`: the body of a success.
    async fn probe_get(&self, url: String) -> Result<Vec<u8>, UpstreamFault> {
        let probe = async {
            let mut response = self
                .send(|client| client.get(&url), self.probe_timeout, PROBE_LATE)
                .await?;
            let status = response.status().as_u16();
            let body = self.read_to_end(&mut response, MAX_MODEL_LIST).await?;
            if !(200..300).contains(&status) {
                return Err(UpstreamFault::Status { status, body });
            }
            Ok(body)
        };
        tokio::time::timeout(self.probe_timeout, probe)
            .await
            .map_err(|_| PROBE_LATE)?
    }
}

/// The context window in a llama-server `/props` answer: `default_generation_settings.n_ctx`
/// (a slot's window), when it is there and not 0.
pub fn props_window(props: &[u8]) -> Option<u32> {
    let props: Value = serde_json::from_slice(props).unwrap_or(Value::Null);
    props
        .pointer("/default_generation_settings/n_ctx")
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .filter(|n| *n > 0)
}

/// What an engine's model list says: its ids, and the context window of those it gives one
/// for (vLLM's `max_model_len`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelList {
    /// Each id once, in the order first listed.
    pub ids: Vec<String>,
    /// The windows the list gives, by id.
    pub windows: BTreeMap<String, u32>,
}

/// Whether the engine's `listed` name is the `wanted` model: equal, or equal but for
/// Ollama's default `:latest` tag. Both probers read an engine's model names with it.
pub fn same_model(listed: &str, wanted: &str) -> bool {
    let untagged = |name: &'_ str| {
        name.strip_suffix(":latest")
            .map_or(name.to_owned(), str::to_owned)
    };
    listed == wanted || untagged(listed) == untagged(wanted)
}

/// The context windows an OpenAI model list gives (`max_model_len`, as vLLM lists it), by id.
pub fn model_windows(body: &[u8]) -> BTreeMap<String, u32> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    parsed["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|model| {
            let id = model["id"].as_str()?;
            let window = model["max_model_len"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())?;
            (window > 0).then(|| (id.to_owned(), window))
        })
        .collect()
}

/// The ids of an OpenAI model list (`{"data":[{"id":…}]}`); llama.cpp adds a `models` list
/// with `name`/`model` fields, read too. Each id once, in the order first listed.
///
/// # Errors
/// [`UpstreamFault::Malformed`] when the body is not such a list.
pub fn model_ids(body: &[u8]) -> Result<Vec<String>, UpstreamFault> {
    let parsed: Value = serde_json::from_slice(body).map_err(|error| {
        UpstreamFault::Malformed(format!("the model list is not JSON: {error}"))
    })?;
    let Some(data) = parsed["data"].as_array() else {
        return Err(UpstreamFault::Malformed(
            "the model list has no `data` array".into(),
        ));
    };
    let mut ids: Vec<String> = data
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect();
    for extra in parsed["models"].as_array().into_iter().flatten() {
        for key in ["name", "model"] {
            if let Some(name) = extra[key].as_str()
                && !ids.iter().any(|id| id == name)
            {
                ids.push(name.to_owned());
            }
        }
    }
    Ok(ids)
}

/// Whether sending failed on a connection that was open (not a connect, a timeout or a
/// body error): the engine closed it before answering.
fn closed_before_answer(error: &reqwest::Error) -> bool {
    error.is_request() && !error.is_connect() && !error.is_timeout() && !error.is_body()
}

/// A `reqwest` error as a fault, with its causes (never the request's headers).
fn fault_of(error: reqwest::Error) -> UpstreamFault {
    let mut detail = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        detail.push_str(": ");
        detail.push_str(&cause.to_string());
        source = cause.source();
    }
    if error.is_timeout() {
        UpstreamFault::Timeout("connect_timeout_ms")
    } else if error.is_connect() || error.is_builder() || error.is_request() && !error.is_body() {
        UpstreamFault::Unreachable(detail)
    } else {
        UpstreamFault::Broken(detail)
    }
}

#[cfg(test)]
mod tests {
    use std::io::{BufRead, BufReader, Read, Write};

    use super::*;

    /// Reads one request (head and `Content-Length` body) from `reader`; returns its method,
    /// `None` at the connection's end.
    fn read_request(reader: &mut BufReader<std::net::TcpStream>) -> Option<String> {
        let mut method = None;
        let mut length = 0;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return None;
            }
            if method.is_none() {
                method = line.split(' ').next().map(str::to_owned);
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" {
                break;
            }
        }
        reader.read_exact(&mut vec![0; length]).ok()?;
        method
    }

    /// An engine that answers the first request on a connection with `keep-alive`, then
    /// closes the connection when the next request arrives on it, without answering.
    fn engine_closing_kept_connections() -> std::net::SocketAddr {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream);
                if read_request(&mut reader).is_none() {
                    continue;
                }
                let answer = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                              Keep-Alive: timeout=5\r\nContent-Length: 11\r\n\r\n{\"data\":[]}";
                let _ = reader.get_mut().write_all(answer.as_bytes());
                let _ = read_request(&mut reader);
                // Dropped: closed with the second request unanswered.
            }
        });
        addr
    }

    /// An upstream for the engine at `addr`, with 5 s timeouts.
    fn upstream_of(addr: std::net::SocketAddr) -> Upstream {
        let timeouts = Timeouts {
            connect: Duration::from_secs(5),
            idle: Duration::from_secs(5),
            probe: Duration::from_secs(5),
        };
        Upstream::new(&format!("http://{addr}/v1"), None, None, timeouts).expect("client")
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_engine_closed_goes_again() {
        let upstream = upstream_of(engine_closing_kept_connections());
        for _ in 0..3 {
            let mut response = upstream
                .post("/chat/completions", &serde_json::json!({}))
                .await
                .expect("answered, on a fresh connection when the kept one was closed");
            let body = upstream.read_to_end(&mut response, 64).await.expect("body");
            assert_eq!(body, br#"{"data":[]}"#);
        }
    }

    #[tokio::test]
    async fn a_probe_on_a_connection_the_engine_closed_goes_again() {
        let upstream = upstream_of(engine_closing_kept_connections());
        for probe in 0..3 {
            let list = upstream.models().await;
            assert_eq!(
                list.map(|list| list.ids),
                Ok(Vec::new()),
                "probe {probe}: answered, on a fresh connection when the kept one was closed"
            );
        }
        upstream.open_connection().await.expect("opened ahead");
        assert!(
            upstream.get_root("/props").await.is_ok(),
            "after the connection opened ahead"
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_the_engine_down_at_once() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let fault = upstream_of(addr)
            .models()
            .await
            .expect_err("nothing listens");
        assert!(matches!(fault, UpstreamFault::Unreachable(_)), "{fault:?}");
    }

    /// An engine that closes the connection after answering a `POST`, as `llama-server`
    /// does after a streamed answer, and keeps it open after a `GET`. Each request is sent
    /// to the returned channel as the number of its connection and its method.
    fn engine_closing_after_posts() -> (
        std::net::SocketAddr,
        std::sync::mpsc::Receiver<(usize, String)>,
    ) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let (seen, requests) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for (number, stream) in listener.incoming().flatten().enumerate() {
                let mut reader = BufReader::new(stream);
                while let Some(method) = read_request(&mut reader) {
                    let close = method == "POST";
                    let _ = seen.send((number, method));
                    let connection = if close { "close" } else { "keep-alive" };
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                         Connection: {connection}\r\nContent-Length: 2\r\n\r\n{{}}"
                    );
                    if reader.get_mut().write_all(answer.as_bytes()).is_err() || close {
                        break;
                    }
                }
            }
        });
        (addr, requests)
    }

    #[tokio::test]
    async fn a_connection_opened_ahead_carries_the_next_request() {
        let (addr, requests) = engine_closing_after_posts();
        let upstream = upstream_of(addr);
        let ask = || async {
            let mut response = upstream
                .post("/chat/completions", &serde_json::json!({}))
                .await
                .expect("answered");
            upstream.read_to_end(&mut response, 64).await.expect("body");
        };
        ask().await;
        upstream.open_connection().await.expect("opened ahead");
        ask().await;
        let seen: Vec<(usize, String)> = requests.try_iter().collect();
        let seen: Vec<(usize, &str)> = seen.iter().map(|(n, m)| (*n, m.as_str())).collect();
        // The second POST went on the connection the GET had opened, not on a third.
        assert_eq!(seen, [(0, "POST"), (1, "GET"), (1, "POST")]);
    }

    #[tokio::test]
    async fn one_connection_is_opened_ahead_at_a_time_until_a_request_takes_it() {
        let (addr, _requests) = engine_closing_after_posts();
        let upstream = upstream_of(addr);
        assert!(upstream.preconnect(), "the first is opened");
        assert!(!upstream.preconnect(), "not a second while the first waits");
        let mut response = upstream
            .post("/chat/completions", &serde_json::json!({}))
            .await
            .expect("answered");
        upstream.read_to_end(&mut response, 64).await.expect("body");
        assert!(
            upstream.preconnect(),
            "the request took it: the next is opened"
        );
    }

    #[test]
    fn model_lists_of_several_engines() {
        let openai = br#"{"object":"list","data":[{"id":"qwen2.5:0.5b","object":"model"},{"id":"llama3.1:8b"}]}"#;
        assert_eq!(
            model_ids(openai).expect("list"),
            ["qwen2.5:0.5b", "llama3.1:8b"]
        );
        let llama = br#"{"models":[{"name":"model.gguf","model":"model.gguf"}],"object":"list","data":[{"id":"model.gguf"}]}"#;
        assert_eq!(model_ids(llama).expect("list"), ["model.gguf"]);
        assert!(model_ids(b"<html>").is_err());
        assert!(model_ids(br#"{"error":"x"}"#).is_err());
    }

    #[test]
    fn a_model_list_gives_the_windows_vllm_lists() {
        let vllm = br#"{"object":"list","data":[
            {"id":"Qwen/Qwen2.5","max_model_len":32768},
            {"id":"plain"},
            {"id":"zero","max_model_len":0}]}"#;
        assert_eq!(
            model_windows(vllm),
            BTreeMap::from([("Qwen/Qwen2.5".to_owned(), 32_768)])
        );
        assert!(model_windows(b"not json").is_empty());
    }
}
