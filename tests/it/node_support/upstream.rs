//! A scripted OpenAI-compatible engine for the node's tests: answers per upstream model
//! name with SSE chunks (optionally paced by a gate, optionally hanging at the end), an
//! error status with a body, or a whole JSON body; lists its models; records what it was
//! asked (and on which connection); counts the streams a client dropped before they ended;
//! and can be stopped and started again on the same port (an engine going down and coming
//! back). It speaks plain HTTP, or HTTPS with a certificate the test issued
//! ([`ScriptedEngine::start_https`]).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::connect_info::Connected;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::IncomingStream;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

/// How the engine answers one model.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `200 text/event-stream`: each chunk as `data: CHUNK\n\n` (one permit of `gate` per
    /// chunk when set); then the body ends, or with `hang` stays open until dropped.
    Sse {
        /// The `data` payloads, `[DONE]` included when wanted.
        chunks: Vec<String>,
        /// Releases one chunk per permit.
        gate: Option<Arc<Semaphore>>,
        /// Keep the body open after the last chunk.
        hang: bool,
    },
    /// This status and JSON body.
    Status(u16, Value),
    /// `200` with this JSON body.
    Json(Value),
}

/// A chat stream's chunks: one delta per text, the finish chunk (`stop`) and `[DONE]`.
pub fn chat_chunks(texts: impl Iterator<Item = String>) -> Vec<String> {
    let mut chunks: Vec<String> = texts
        .map(|text| json!({"choices": [{"index": 0, "delta": {"content": text}}]}).to_string())
        .collect();
    chunks
        .push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).to_string());
    chunks.push("[DONE]".to_owned());
    chunks
}

impl Reply {
    /// Streams `chunks` at once and ends.
    pub fn sse(chunks: &[Value], done: bool) -> Self {
        let mut chunks: Vec<String> = chunks.iter().map(Value::to_string).collect();
        if done {
            chunks.push("[DONE]".into());
        }
        Self::Sse {
            chunks,
            gate: None,
            hang: false,
        }
    }
}

/// A request the engine received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// The path (`/v1/chat/completions`, ...).
    pub path: String,
    /// The JSON body.
    pub body: Value,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
    /// The client's end of the connection it came on.
    pub peer: SocketAddr,
}

#[derive(Debug, Default)]
struct Engine {
    replies: Mutex<HashMap<String, Reply>>,
    models: Mutex<Vec<String>>,
    seen: Mutex<Vec<Seen>>,
    /// The client's end of each connection `GET /v1/models` came on.
    listed_to: Mutex<Vec<SocketAddr>>,
    dropped: AtomicUsize,
    finished: AtomicUsize,
}

/// The running (or stopped) scripted engine.
pub struct ScriptedEngine {
    /// Where it listens (kept across restarts).
    pub addr: SocketAddr,
    engine: Arc<Engine>,
    tls: Option<TlsAcceptor>,
    server: Option<(CancellationToken, JoinHandle<()>)>,
}

impl ScriptedEngine {
    /// Starts an engine on a free port listing `models`.
    pub async fn start(models: &[&str]) -> Self {
        Self::start_with(models, None).await
    }

    /// Starts an HTTPS engine on a free port listing `models`, presenting `cert_pem` (with
    /// its `key_pem`).
    pub async fn start_https(models: &[&str], cert_pem: &str, key_pem: &str) -> Self {
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .expect("certificate PEM");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).expect("key PEM");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("the engine's certificate");
        Self::start_with(models, Some(TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(models: &[&str], tls: Option<TlsAcceptor>) -> Self {
        let engine = Arc::new(Engine::default());
        *engine.models.lock().expect("models") = models.iter().map(|m| (*m).to_owned()).collect();
        let mut scripted = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            engine,
            tls,
            server: None,
        };
        scripted.up().await;
        scripted
    }

    /// `http://ADDR/v1` (`https://localhost:PORT/v1` for an HTTPS engine), the adapter's
    /// `base_url`.
    pub fn base_url(&self) -> String {
        match self.tls {
            None => format!("http://{}/v1", self.addr),
            Some(_) => format!("https://localhost:{}/v1", self.addr.port()),
        }
    }

    /// Answers requests for `model` with `reply`.
    pub fn script(&self, model: &str, reply: Reply) {
        self.engine
            .replies
            .lock()
            .expect("replies")
            .insert(model.to_owned(), reply);
    }

    /// Every request so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.engine.seen.lock().expect("seen").clone()
    }

    /// The client's end of the connection of each `GET /v1/models` so far.
    pub fn listed_to(&self) -> Vec<SocketAddr> {
        self.engine.listed_to.lock().expect("listed_to").clone()
    }

    /// Streams a client dropped before they ended (a cancelled run closing its connection).
    pub fn dropped_streams(&self) -> usize {
        self.engine.dropped.load(Ordering::SeqCst)
    }

    /// Stops listening and closes every connection (the engine is down).
    pub async fn down(&mut self) {
        if let Some((stop, serving)) = self.server.take() {
            stop.cancel();
            let aborter = serving.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), serving)
                .await
                .is_err()
            {
                aborter.abort();
            }
        }
    }

    /// Listens again on the same address.
    pub async fn up(&mut self) {
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .expect("bind the engine");
        self.addr = listener.local_addr().expect("engine addr");
        let app = Router::new()
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", post(answer))
            .route("/v1/completions", post(answer))
            .route("/v1/embeddings", post(answer))
            .with_state(Arc::clone(&self.engine))
            .into_make_service_with_connect_info::<Peer>();
        let stop = CancellationToken::new();
        let signal = stop.clone().cancelled_owned();
        let serving = match self.tls.clone() {
            None => tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await;
            }),
            Some(acceptor) => tokio::spawn(async move {
                let listener = TlsListener { listener, acceptor };
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(signal)
                    .await;
            }),
        };
        self.server = Some((stop, serving));
    }
}

/// The client's end of a connection, for the handlers (plain or TLS).
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// A TCP listener whose connections speak TLS; a failed handshake is skipped.
struct TlsListener {
    listener: tokio::net::TcpListener,
    acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, peer)) = self.listener.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, peer);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

async fn models(
    State(engine): State<Arc<Engine>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
) -> Response {
    engine.listed_to.lock().expect("listed_to").push(peer);
    let models = engine.models.lock().expect("models").clone();
    let data: Vec<Value> = models
        .iter()
        .map(|id| json!({"id": id, "object": "model"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn answer(
    State(engine): State<Arc<Engine>>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let model = body["model"].as_str().unwrap_or_default().to_owned();
    engine.seen.lock().expect("seen").push(Seen {
        path: uri.path().to_owned(),
        body,
        authorization: headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        peer,
    });
    let reply = engine.replies.lock().expect("replies").get(&model).cloned();
    match reply {
        None => error(
            404,
            json!({"error": {"message": format!("model {model} not found"), "code": "model_not_found"}}),
        ),
        Some(Reply::Status(status, body)) => error(status, body),
        Some(Reply::Json(body)) => axum::Json(body).into_response(),
        Some(Reply::Sse { chunks, gate, hang }) => sse(engine, chunks.into(), gate, hang),
    }
}

fn error(status: u16, body: Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

/// Counts the stream as dropped unless it reached its end.
struct Guard {
    engine: Arc<Engine>,
    finished: bool,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let counter = if self.finished {
            &self.engine.finished
        } else {
            &self.engine.dropped
        };
        counter.fetch_add(1, Ordering::SeqCst);
    }
}

fn sse(
    engine: Arc<Engine>,
    chunks: VecDeque<String>,
    gate: Option<Arc<Semaphore>>,
    hang: bool,
) -> Response {
    let guard = Guard {
        engine,
        finished: false,
    };
    let stream = futures::stream::unfold((chunks, guard), move |(mut chunks, mut guard)| {
        let gate = gate.clone();
        async move {
            let Some(chunk) = chunks.pop_front() else {
                if hang {
                    std::future::pending::<()>().await;
                }
                guard.finished = true;
                drop(guard);
                return None;
            };
            if let Some(gate) = gate {
                gate.acquire().await.expect("gate open").forget();
            }
            let frame = Bytes::from(format!("data: {chunk}\n\n"));
            Some((Ok::<_, std::io::Error>(frame), (chunks, guard)))
        }
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
