//! The `openai` adapter: runs forwarded to any engine that speaks OpenAI's
//! `/v1/chat/completions`, `/v1/completions` and `/v1/embeddings` (llama.cpp's
//! `llama-server`, vLLM, Ollama's `/v1`, LM Studio, SGLang, TGI).
//!
//! One adapter per `[[nodes.adapters]]` entry the edge sent: its settings say where the
//! engine is and how to treat it (`settings.rs`). A run becomes one upstream request
//! (`request.rs`), streamed back chunk by chunk as run events (`chunks.rs`), and any failure
//! becomes one terminal event of the right class (`errors.rs`). Tokenize and detokenize runs
//! ask the engine's own tokenizer (`tokenize.rs`). An adapter whose settings name a
//! `lifecycle` holds its engine's model lifecycle too ([`engine_models`]). The adapter never
//! decides whether a run may start (the run table and the availability board do) and never
//! writes to the edge (it emits into the run's [`Emitter`]).

pub mod chunks;
pub mod echo;
pub mod engine_models;
pub mod errors;
pub mod request;
pub mod settings;
pub mod tokenize;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use edge::client::ReceivedAdapter;
use edge::client::RunAssignment;
use edge::domain::{FailureClass, Operation, RunEventKind};
use edge::hops;

use crate::budget::AdapterBudget;
use crate::fault::UpstreamFault;
use crate::runs::{Emitter, Gone};
use crate::sse::SseDecoder;
use crate::upstream::{HttpClientError, MAX_WHOLE_BODY, ModelList, Timeouts, Upstream};
use chunks::AnswerStream;
use engine_models::{ManagedEngine, vllm};
use errors::classify;
use request::{InvalidInput, UpstreamCall};
use settings::{Lifecycle, OpenAiSettings, SettingsError};
use tokenize::Ask;

/// The name of this adapter kind in the `kind` setting (and its default).
pub const KIND: &str = "openai";

/// The engine has not answered `/props` yet.
const ENGINE_UNKNOWN: u8 = 0;
/// It answered as llama.cpp's `llama-server`.
const ENGINE_LLAMA_SERVER: u8 = 1;
/// It answered without llama-server's props: another engine.
const ENGINE_OTHER: u8 = 2;

/// Why an `openai` adapter cannot be built from its config. Its messages name the setting,
/// never a secret.
#[derive(Debug, thiserror::Error)]
pub enum AdapterError {
    /// A setting is missing or invalid.
    #[error(transparent)]
    Settings(#[from] SettingsError),
    /// `api_key_env` names an environment variable the node's environment does not set.
    #[error("`api_key_env` names the environment variable {variable}, which is not set")]
    ApiKeyUnset {
        /// The variable.
        variable: String,
        /// Why it could not be read.
        #[source]
        source: std::env::VarError,
    },
    /// The engine's HTTP client cannot be built (`tls_ca`, the system's CAs).
    #[error(transparent)]
    Client(#[from] HttpClientError),
}

/// One configured `openai` adapter.
#[derive(Debug)]
pub struct OpenAiAdapter {
    name: String,
    targets: Vec<String>,
    settings: OpenAiSettings,
    upstream: Upstream,
    /// With `lifecycle = "vllm"`: each target's own server, by target (`base_url.<target>`).
    servers: BTreeMap<String, Upstream>,
    /// What the engine's `/props` said it is (`ENGINE_*`): llama-server's streams are asked
    /// for running counts when `timings_per_token` is left to the node, and another engine is
    /// not asked `/props` again.
    engine: AtomicU8,
    /// The engine that loads and unloads its targets, when `lifecycle` is set.
    managed: Option<ManagedEngine>,
    /// What it may use for models, on which devices, when it has a budget (`budget.rs`).
    budget: Option<AdapterBudget>,
}

impl OpenAiAdapter {
    /// The adapter the edge configured as `config`; reads the API key from the environment
    /// variable its `api_key_env` names.
    ///
    /// # Errors
    /// [`AdapterError::Settings`] when the settings are invalid,
    /// [`AdapterError::ApiKeyUnset`] when the API key variable is unset, and
    /// [`AdapterError::Client`] when the engine's HTTP client cannot be built.
    pub fn new(config: &ReceivedAdapter) -> Result<Self, AdapterError> {
        let (settings, unknown) = OpenAiSettings::parse(&config.settings)?;
        if !unknown.is_empty() {
            tracing::warn!(adapter = %config.name, ?unknown, "ignoring unknown adapter settings");
        }
        let api_key = match &settings.api_key_env {
            None => None,
            Some(variable) => {
                Some(
                    std::env::var(variable).map_err(|source| AdapterError::ApiKeyUnset {
                        variable: variable.clone(),
                        source,
                    })?,
                )
            }
        };
        let timeouts = Timeouts {
            connect: settings.connect_timeout,
            idle: settings.idle_timeout,
            probe: settings.probe_timeout,
        };
        let tls_ca = settings.tls_ca.as_deref();
        let upstream = Upstream::new(&settings.base_url, tls_ca, api_key.clone(), timeouts)?;
        let servers = servers_of(&config.targets, &settings, api_key, timeouts)?;
        // A router's `/props` does not say it is llama-server; Ollama and vLLM have none.
        let engine = match settings.lifecycle {
            Some(Lifecycle::LlamaRouter) => ENGINE_LLAMA_SERVER,
            Some(Lifecycle::Ollama | Lifecycle::Vllm) => ENGINE_OTHER,
            None => ENGINE_UNKNOWN,
        };
        let managed = settings.lifecycle.map(|lifecycle| {
            let by_model = by_model(&servers, &settings);
            ManagedEngine::new(lifecycle, &settings, upstream.clone(), by_model)
        });
        Ok(Self {
            name: config.name.clone(),
            targets: config.targets.clone(),
            settings,
            upstream,
            servers,
            engine: AtomicU8::new(engine),
            managed,
            budget: None,
        })
    }

    /// The same adapter with `budget`, which a managed adapter reports with its catalogue.
    #[must_use]
    pub fn with_budget(mut self, budget: Option<AdapterBudget>) -> Self {
        self.budget = budget;
        self
    }

    /// What it may use for models, when it has a budget.
    pub fn budget(&self) -> Option<&AdapterBudget> {
        self.budget.as_ref()
    }

    /// The adapter's name (what runs address).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The targets the edge configured.
    pub fn targets(&self) -> &[String] {
        &self.targets
    }

    /// Its settings.
    pub fn settings(&self) -> &OpenAiSettings {
        &self.settings
    }

    /// The engine that loads and unloads its targets on the edge's commands, when its
    /// settings name a `lifecycle`.
    pub fn managed(&self) -> Option<&ManagedEngine> {
        self.managed.as_ref()
    }

    /// Where `target`'s requests go: its own server (`base_url.<target>`, vLLM), else the
    /// adapter's engine.
    fn upstream_of(&self, target: &str) -> &Upstream {
        self.servers.get(target).unwrap_or(&self.upstream)
    }

    /// The engine's model list, for the prober.
    ///
    /// # Errors
    /// The fault when the engine cannot be asked.
    pub async fn list_models(&self) -> Result<ModelList, UpstreamFault> {
        self.upstream.models().await
    }

    /// The context window llama-server serves its model with (`/props`), for the prober;
    /// `None` from another engine, which is not asked again, or while the engine cannot be
    /// reached. Its answer tells which engine it is.
    pub async fn served_window(&self) -> Option<u32> {
        if self.engine.load(Ordering::Relaxed) == ENGINE_OTHER {
            return None;
        }
        let answer = self.upstream.served_window().await.ok()?;
        let engine = if answer.is_some() {
            ENGINE_LLAMA_SERVER
        } else {
            ENGINE_OTHER
        };
        self.engine.store(engine, Ordering::Relaxed);
        answer
    }

    /// Whether the prober should ask `/props` even when no window is wanted from it: the
    /// engine's kind decides `timings_per_token` (`"auto"`) and is not known yet.
    pub fn wants_engine_kind(&self) -> bool {
        self.settings.timings_per_token.is_none()
            && self.engine.load(Ordering::Relaxed) == ENGINE_UNKNOWN
    }

    /// Runs `run` against the engine, emitting `started` and its output into `out`, and
    /// returns its terminal event (to be emitted by the caller).
    ///
    /// # Errors
    /// [`Gone`] when the node let go of the run meanwhile; the engine request is dropped.
    pub async fn execute(&self, run: &RunAssignment, out: &Emitter) -> Result<RunEventKind, Gone> {
        let model = self.settings.upstream_model(run.target.as_str());
        let upstream = self.upstream_of(run.target.as_str());
        let whole = self.settings.request_timeout;
        if matches!(run.operation, Operation::Tokenize | Operation::Detokenize) {
            let detokenize = run.operation == Operation::Detokenize;
            let ask = match tokenize::ask(&run.input, detokenize) {
                Ok(ask) => ask,
                Err(invalid) => return Ok(invalid_input(invalid)),
            };
            let events = tokio::time::timeout(whole, self.ask_tokenizer(upstream, ask, model))
                .await
                .unwrap_or_else(|_| Err(classify(&UpstreamFault::Timeout("request_timeout_ms"))));
            let [output, end] = match events {
                Ok(events) => events,
                Err(failed) => return Ok(failed),
            };
            out.emit(RunEventKind::Started).await?;
            out.emit(output).await?;
            return Ok(end);
        }
        let mut call = match request::build(run, model, &self.settings) {
            Ok(call) => call,
            Err(invalid) => return Ok(invalid_input(invalid)),
        };
        // `timings_per_token` left to the node: asked of llama-server (set, `build` did).
        if self.settings.timings_per_token.is_none()
            && self.engine.load(Ordering::Relaxed) == ENGINE_LLAMA_SERVER
        {
            call.ask_running_counts();
        }
        match tokio::time::timeout(whole, self.answer(upstream, run, &call, out)).await {
            Ok(result) => result,
            Err(_) => Ok(classify(&UpstreamFault::Timeout("request_timeout_ms"))),
        }
    }

    /// The events of a tokenize or detokenize run from the engine's tokenizer, or the run's
    /// failure (`not_supported` when the engine has no such endpoint).
    async fn ask_tokenizer(
        &self,
        upstream: &Upstream,
        ask: Ask,
        model: &str,
    ) -> Result<[RunEventKind; 2], RunEventKind> {
        match ask {
            Ask::Tokens(tokens) => {
                let body = tokenize::tokens_body(model, &tokens);
                let answer = self.whole(upstream, "/detokenize", &body).await?;
                let text = tokenize::text_of(&answer).map_err(|fault| classify(&fault))?;
                Ok(tokenize::detokenized(text))
            }
            Ask::Text {
                content,
                add_special,
            } => Ok(tokenize::tokenized(
                self.tokens(upstream, model, &content, add_special).await?,
            )),
            Ask::Chat(chat) => {
                let body = tokenize::chat_body(model, chat);
                let tokens = match upstream.post_root("/apply-template", &body).await {
                    Ok(mut response) => {
                        let answer = self.read_whole(upstream, &mut response).await?;
                        let prompt = tokenize::prompt_of(&answer).map_err(|f| classify(&f))?;
                        // As llama-server's completion path tokenizes a rendered prompt.
                        self.tokens(upstream, model, &prompt, true).await?
                    }
                    // No chat template endpoint (vLLM): its /tokenize takes the messages.
                    Err(fault) if tokenize::is_missing(&fault) => {
                        let answer = self.whole(upstream, "/tokenize", &body).await?;
                        tokenize::tokens_of(&answer).map_err(|fault| classify(&fault))?
                    }
                    Err(fault) => return Err(classify(&fault)),
                };
                Ok(tokenize::tokenized(tokens))
            }
        }
    }

    /// The engine's tokens of `content`.
    async fn tokens(
        &self,
        upstream: &Upstream,
        model: &str,
        content: &str,
        add_special: bool,
    ) -> Result<Vec<u32>, RunEventKind> {
        let body = tokenize::text_body(model, content, add_special);
        let answer = self.whole(upstream, "/tokenize", &body).await?;
        tokenize::tokens_of(&answer).map_err(|fault| classify(&fault))
    }

    /// The whole answer of `POST {root}{path}`; an engine without `path` is `not_supported`.
    async fn whole(
        &self,
        upstream: &Upstream,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<Vec<u8>, RunEventKind> {
        match upstream.post_root(path, body).await {
            Ok(mut response) => self.read_whole(upstream, &mut response).await,
            Err(fault) if tokenize::is_missing(&fault) => {
                Err(tokenize::not_supported(&self.name, path))
            }
            Err(fault) => Err(classify(&fault)),
        }
    }

    async fn read_whole(
        &self,
        upstream: &Upstream,
        response: &mut reqwest::Response,
    ) -> Result<Vec<u8>, RunEventKind> {
        upstream
            .read_to_end(response, MAX_WHOLE_BODY)
            .await
            .map_err(|fault| classify(&fault))
    }

    async fn answer(
        &self,
        upstream: &Upstream,
        run: &RunAssignment,
        call: &UpstreamCall,
        out: &Emitter,
    ) -> Result<RunEventKind, Gone> {
        let started = Instant::now();
        let path = call.endpoint.path();
        tracing::trace!(target: hops::TARGET, hop = hops::ENGINE_REQUEST, run_id = %run.run_id);
        let mut response = match self.send(upstream, call).await {
            Ok(response) => response,
            Err(fault) => {
                let kind = classify(&fault);
                log_failure(run, &kind, started);
                return Ok(kind);
            }
        };
        tracing::trace!(target: hops::TARGET, hop = hops::ENGINE_HEADERS, run_id = %run.run_id);
        tracing::debug!(
            run_id = %run.run_id, adapter = %self.name, path, status = response.status().as_u16(),
            first_byte_ms = started.elapsed().as_millis() as u64, "engine answered"
        );
        out.emit(RunEventKind::Started).await?;
        let result = if call.endpoint.streams() {
            let echo = run
                .continuation
                .as_ref()
                .filter(|_| call.endpoint == request::Endpoint::Chat)
                .map(|c| echo::EchoFilter::new(&c.text));
            let relayed = self
                .relay_stream(upstream, &mut response, out, echo)
                .await?;
            drop(response);
            if self.settings.preconnect && relayed.is_ok() {
                upstream.preconnect();
            }
            relayed
        } else {
            self.relay_embeddings(upstream, &mut response, out).await?
        };
        let kind = result.unwrap_or_else(|fault| classify(&fault));
        log_failure(run, &kind, started);
        Ok(kind)
    }

    /// Sends the request, retrying (up to `max_retries`) when the engine could not be reached
    /// or answered 502/503: nothing was produced yet, so nothing is repeated.
    async fn send(
        &self,
        upstream: &Upstream,
        call: &UpstreamCall,
    ) -> Result<reqwest::Response, UpstreamFault> {
        let mut attempt = 0;
        loop {
            let result = upstream.post(call.endpoint.path(), &call.body).await;
            let retriable = matches!(
                &result,
                Err(UpstreamFault::Unreachable(_)
                    | UpstreamFault::Status {
                        status: 502 | 503,
                        ..
                    })
            );
            if !retriable || attempt >= self.settings.max_retries {
                return result;
            }
            attempt += 1;
            tokio::time::sleep(self.settings.retry_backoff).await;
        }
    }

    async fn relay_stream(
        &self,
        upstream: &Upstream,
        response: &mut reqwest::Response,
        out: &Emitter,
        mut echo: Option<echo::EchoFilter>,
    ) -> Result<Result<RunEventKind, UpstreamFault>, Gone> {
        let mut decoder = SseDecoder::new();
        let mut answer = AnswerStream::new();
        let mut events = Vec::new();
        let mut first_output = true;
        while !answer.is_done() {
            let chunk = match upstream.next_chunk(response).await {
                Ok(Some(chunk)) => chunk,
                Ok(None) => break,
                Err(fault) => return Ok(Err(fault)),
            };
            if let Err(error) = decoder.feed(&chunk, &mut events) {
                return Ok(Err(UpstreamFault::Malformed(error.to_string())));
            }
            for data in events.drain(..) {
                match answer.apply(&data) {
                    Ok(Some(kind)) => {
                        if first_output {
                            first_output = false;
                            tracing::trace!(target: hops::TARGET, hop = hops::ENGINE_FIRST_OUTPUT, run_id = out.run_id());
                        }
                        emit_unechoed(out, echo.as_mut(), kind).await?;
                    }
                    Ok(None) => {}
                    Err(fault) => return Ok(Err(fault)),
                }
            }
            if let Some(counted) = answer.counted() {
                out.engine_counted(counted);
            }
        }
        if !answer.is_done() {
            let _ = decoder.finish(&mut events);
            for data in events.drain(..) {
                if let Ok(Some(kind)) = answer.apply(&data) {
                    emit_unechoed(out, echo.as_mut(), kind).await?;
                }
            }
        }
        if let Some(held) = echo.as_mut().map(echo::EchoFilter::finish)
            && !held.is_empty()
        {
            out.emit(RunEventKind::text(held)).await?;
        }
        Ok(answer.finish())
    }

    async fn relay_embeddings(
        &self,
        upstream: &Upstream,
        response: &mut reqwest::Response,
        out: &Emitter,
    ) -> Result<Result<RunEventKind, UpstreamFault>, Gone> {
        let body = match upstream.read_to_end(response, MAX_WHOLE_BODY).await {
            Ok(body) => body,
            Err(fault) => return Ok(Err(fault)),
        };
        let mut events = match embeddings_events(body).await {
            Ok(events) => events,
            Err(fault) => return Ok(Err(fault)),
        };
        let terminal = events.pop();
        for kind in events {
            out.emit(kind).await?;
        }
        Ok(terminal.ok_or_else(|| UpstreamFault::Malformed("no embeddings".into())))
    }
}

/// With `lifecycle = "vllm"`: each of `targets`' own server (`base_url.<target>`), by target;
/// empty for the other lifecycles.
///
/// # Errors
/// [`SettingsError::NoTargetBaseUrl`] for a target without one; the client's error.
fn servers_of(
    targets: &[String],
    settings: &OpenAiSettings,
    api_key: Option<String>,
    timeouts: Timeouts,
) -> Result<BTreeMap<String, Upstream>, AdapterError> {
    let mut servers = BTreeMap::new();
    if settings.lifecycle != Some(Lifecycle::Vllm) {
        return Ok(servers);
    }
    for target in targets {
        let url = settings
            .base_urls
            .get(target)
            .ok_or_else(|| SettingsError::NoTargetBaseUrl {
                target: target.clone(),
            })?;
        let server = Upstream::new(url, settings.tls_ca.as_deref(), api_key.clone(), timeouts)?;
        servers.insert(target.clone(), server);
    }
    Ok(servers)
}

/// The vLLM servers by the model id each serves (`model.<target>`, else the target).
fn by_model(
    servers: &BTreeMap<String, Upstream>,
    settings: &OpenAiSettings,
) -> BTreeMap<String, vllm::Server> {
    servers
        .iter()
        .map(|(target, server)| {
            let id = settings.upstream_model(target).to_owned();
            let server = vllm::Server {
                target: target.clone(),
                upstream: server.clone(),
                never_sleep: settings.never_sleeps(target),
            };
            (id, server)
        })
        .collect()
}

/// The most of an embeddings answer parsed on the node's own thread; a larger one (a big
/// batch: tens of MiB take a good part of a second) is parsed on the blocking pool, so a
/// node on one thread keeps streaming its other runs meanwhile.
const PARSED_IN_PLACE: usize = 256 * 1024;

/// [`chunks::embeddings_events`] of `body`, off the runtime's threads when it is large.
async fn embeddings_events(body: Vec<u8>) -> Result<Vec<RunEventKind>, UpstreamFault> {
    if body.len() <= PARSED_IN_PLACE {
        return chunks::embeddings_events(&body);
    }
    tokio::task::spawn_blocking(move || chunks::embeddings_events(&body))
        .await
        .unwrap_or_else(|gone| {
            Err(UpstreamFault::Malformed(format!(
                "the embeddings answer could not be parsed: {gone}"
            )))
        })
}

fn invalid_input(invalid: InvalidInput) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: "invalid_input".into(),
        message: invalid.0,
        class: FailureClass::Request,
        status: None,
        usage: None,
    }
}

fn log_failure(run: &RunAssignment, kind: &RunEventKind, started: Instant) {
    if let RunEventKind::Failed {
        code,
        class,
        status,
        ..
    } = kind
    {
        tracing::info!(
            run_id = %run.run_id, adapter = %run.adapter, target = %run.target, code, class = class.as_str(),
            upstream_status = status.unwrap_or(0), elapsed_ms = started.elapsed().as_millis() as u64,
            "run failed upstream"
        );
    }
}

/// Emits `kind`, an output's text passed through `echo` first (a continued chat's echoed
/// prefix dropped); an output left with nothing is not emitted.
async fn emit_unechoed(
    out: &Emitter,
    echo: Option<&mut echo::EchoFilter>,
    mut kind: RunEventKind,
) -> Result<(), Gone> {
    if let (
        Some(echo),
        RunEventKind::Output {
            text,
            data,
            structured,
        },
    ) = (echo, &mut kind)
    {
        *text = echo.filter(text);
        if text.is_empty() && data.is_empty() && structured.is_none() {
            return Ok(());
        }
    }
    out.emit(kind).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_large_embeddings_answer_is_parsed_off_the_thread_into_the_same_events() {
        let item = |index| serde_json::json!({"index": index, "embedding": vec![0.5_f32; 512]});
        let items: Vec<_> = (0..200).map(item).collect();
        let body = serde_json::json!({"data": items, "usage": {"prompt_tokens": 7}});
        let body = serde_json::to_vec(&body).expect("json");
        assert!(body.len() > PARSED_IN_PLACE);
        let expected = chunks::embeddings_events(&body).expect("parsed in place");
        assert_eq!(embeddings_events(body).await.expect("parsed"), expected);

        let mut malformed = vec![b' '; PARSED_IN_PLACE + 1];
        malformed.extend_from_slice(br#"{"data": "not a list"}"#);
        assert!(matches!(
            embeddings_events(malformed).await,
            Err(UpstreamFault::Malformed(_))
        ));
    }
}
