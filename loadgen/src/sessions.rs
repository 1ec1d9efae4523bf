//! `sessions`: how well a router places agent sessions on real engines (issue 67). Four
//! `llama-server` children (two slots each; prompt caching, its host-memory cache and
//! `--cache-reuse` on), fresh for each router, behind either the shipped binaries — `edge
//! serve` on the shipped default (journal on) and one `edge-node` per engine — or SMG 1.13
//! with `cache_aware` or `round_robin`. The workload is agents': every session opens with
//! one of a few long system prompts it shares with others (as agents share their harness's)
//! and each turn adds a user message and the answer to its history; all sessions run at
//! once, each turn streamed with the session header Claude Code sends, the requests
//! byte-identical for every router. A turn that fails is asked again, as the SDKs do.
//!
//! Reported per router (and, with `--kill yes`, with one engine killed once half the turns
//! are answered): the prompt tokens the engines served from their caches (their own
//! counters) and that share against the workload's ceiling — what a router that always
//! found the engine holding a turn's longest known prefix could serve, computed by
//! tokenizing every turn —, time to the first content per turn (p50, p99), the total time,
//! and the turns a client saw fail.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::Common;
use crate::engine::{Engine, edge_config};
use crate::harness::{EdgeProcess, http_get, metric, runtime, token};
use crate::http::{Connection, post_json, post_json_with};
use crate::latency::{has_content, wait_answering};
use crate::smg::Smg;
use crate::stats::{Histogram, Record};

/// The engines behind each router.
const ENGINES: usize = 4;
/// The model every engine serves and every request names (the edge maps it by an alias).
const MODEL: &str = "tiny";
/// The tiny model's end-of-sequence token, banned so every answer is `--answer-tokens` long.
const EOS_TOKEN: &str = "2";
/// Attempts a client makes at a turn before it gives the turn up (the SDKs retry twice).
const ATTEMPTS: u32 = 3;
/// Words a system prompt or a user message is made of: each one token of the tiny model's
/// vocabulary (SentencePiece, with its leading space), so the lengths are easy to hit.
const WORDS: [&str; 48] = [
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on", "be",
    "by", "this", "are", "or", "from", "at", "which", "but", "have", "an", "they", "you", "not",
    "were", "their", "has", "more", "one", "all", "can", "we", "there", "been", "its", "other",
    "new", "would", "some", "these", "also", "when", "two", "may", "first",
];

#[derive(Debug, Clone, Args)]
pub struct SessionsArgs {
    /// The `llama-server` binary (`bash .ci/engines/llama-server.sh` prints it).
    #[arg(long)]
    llama_server: PathBuf,
    /// The GGUF model every engine serves: one large enough that prefill takes real time
    /// (docs/benchmarks.md names the one measured).
    #[arg(long)]
    model: PathBuf,
    /// A directory holding release builds of `edge` and `edge-node` (`target/release`).
    #[arg(long)]
    binaries: PathBuf,
    /// The `smg` program (`pip install smg==1.13.*`), for the routers `cache-aware` and
    /// `round-robin`.
    #[arg(long)]
    smg: Option<PathBuf>,
    /// The routers to measure, comma-separated: `edge`, `cache-aware` (SMG's `cache_aware`),
    /// `round-robin` (SMG's `round_robin`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "edge,cache-aware,round-robin"
    )]
    routers: Vec<String>,
    /// Whether one engine is killed halfway: `no`, `yes`, or both in turn.
    #[arg(long, value_delimiter = ',', default_value = "no,yes")]
    kill: Vec<String>,
    /// Sessions, all in flight at once.
    #[arg(long, default_value_t = 32)]
    sessions: usize,
    /// Distinct system prompts the sessions share (session `s` has prompt `s % N`).
    #[arg(long, default_value_t = 8)]
    system_prompts: usize,
    /// Tokens of each system prompt.
    #[arg(long, default_value_t = 3_000)]
    system_tokens: usize,
    /// Turns of each session.
    #[arg(long, default_value_t = 8)]
    turns: usize,
    /// Tokens of each turn's user message.
    #[arg(long, default_value_t = 300)]
    user_tokens: usize,
    /// Tokens of each answer.
    #[arg(long, default_value_t = 32)]
    answer_tokens: u32,
    /// Slots of each engine (`--parallel`).
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// `llama-server`'s `--cache-reuse`: the smallest chunk reused by shifting the cache.
    #[arg(long, default_value_t = 256)]
    cache_reuse: u32,
}

/// A router in front of the engines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Router {
    Edge,
    CacheAware,
    RoundRobin,
}

impl Router {
    fn parse(name: &str) -> anyhow::Result<Self> {
        Ok(match name {
            "edge" => Self::Edge,
            "cache-aware" => Self::CacheAware,
            "round-robin" => Self::RoundRobin,
            other => bail!("--routers takes edge, cache-aware and round-robin, not {other:?}"),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Edge => "edge",
            Self::CacheAware => "smg-cache-aware",
            Self::RoundRobin => "smg-round-robin",
        }
    }
}

pub fn run(args: &SessionsArgs, common: &Common) -> anyhow::Result<Vec<Record>> {
    let routers: Vec<Router> = args
        .routers
        .iter()
        .map(|name| Router::parse(name.trim()))
        .collect::<anyhow::Result<_>>()?;
    let kills: Vec<bool> = args
        .kill
        .iter()
        .map(|kill| match kill.trim() {
            "no" => Ok(false),
            "yes" => Ok(true),
            other => bail!("--kill takes no and yes, not {other:?}"),
        })
        .collect::<anyhow::Result<_>>()?;
    if routers.iter().any(|r| *r != Router::Edge) && args.smg.is_none() {
        bail!("the routers cache-aware and round-robin need --smg");
    }
    // One more engine, never routed to: it tokenizes the workload and the transcripts.
    let tokenizer = Engine::start(&args.llama_server, &args.model, 1, &[])?;
    let load = runtime("load", common.load_threads)?;
    let workload = Arc::new(load.block_on(Workload::make(args, tokenizer.addr))?);
    eprintln!(
        "sessions: {} sessions, system prompts of {:.0} tokens, user messages of {:.0}",
        args.sessions, workload.system_tokens, workload.user_tokens
    );
    let mut records = Vec::new();
    for &kill in &kills {
        for &router in &routers {
            let outcome = measure(args, common, &load, router, kill, &workload)?;
            let ceiling = load.block_on(ceiling(tokenizer.addr, &workload, &outcome))?;
            records.push(outcome.record(router, kill, ceiling));
        }
    }
    Ok(records)
}

/// Starts the engines and `router`, runs every session through it, and stops them.
fn measure(
    args: &SessionsArgs,
    common: &Common,
    load: &tokio::runtime::Runtime,
    router: Router,
    kill: bool,
    workload: &Arc<Workload>,
) -> anyhow::Result<Outcome> {
    let extra = [
        "--cache-reuse".to_owned(),
        args.cache_reuse.to_string(),
        "--ctx-size".to_owned(),
        (workload.context_per_slot() * args.slots as usize).to_string(),
    ];
    let mut engines: Vec<Engine> = (0..ENGINES)
        .map(|_| Engine::start_with(&args.llama_server, &args.model, args.slots, &extra))
        .collect::<anyhow::Result<_>>()?;
    let addrs: Vec<SocketAddr> = engines.iter().map(|e| e.addr).collect();
    let front = Front::start(router, args, common, &addrs)?;
    load.block_on(front.wait_serving())?;
    let before = engine_totals(&engines, None)?;
    let started = Instant::now();
    let (sessions, killed) = load.block_on(drive(front.addr(), workload, &mut engines, kill))?;
    let elapsed = started.elapsed();
    let after = engine_totals(&engines, killed)?;
    drop(front);
    Ok(Outcome {
        sessions,
        evaluated: after.0 - before.0,
        cached: after.1 - before.1,
        elapsed,
    })
}

/// What runs the sessions' requests.
enum Front {
    Edge {
        edge: EdgeProcess,
        _nodes: Vec<NodeProcess>,
    },
    Smg(Smg),
}

impl Front {
    fn start(
        router: Router,
        args: &SessionsArgs,
        common: &Common,
        engines: &[SocketAddr],
    ) -> anyhow::Result<Self> {
        let smg = |policy: &str| {
            let program = args.smg.as_deref().context("no --smg")?;
            let urls: Vec<String> = engines.iter().map(|a| format!("http://{a}")).collect();
            let mut smg_args = vec!["--policy", policy, "--worker-urls"];
            smg_args.extend(urls.iter().map(String::as_str));
            Smg::start(program, &smg_args)
        };
        Ok(match router {
            Router::Edge => {
                let config = edge_config(
                    engines,
                    &format!("[api.models]\n{MODEL} = \"llama/tiny\"\n\n"),
                );
                let edge = EdgeProcess::start(
                    &args.binaries.join("edge"),
                    &config,
                    common.edge_threads,
                    "info",
                )?;
                let nodes = (0..engines.len())
                    .map(|i| NodeProcess::start(&args.binaries, edge.node_addr, i))
                    .collect::<anyhow::Result<_>>()?;
                Self::Edge {
                    edge,
                    _nodes: nodes,
                }
            }
            Router::CacheAware => Self::Smg(smg("cache_aware")?),
            Router::RoundRobin => Self::Smg(smg("round_robin")?),
        })
    }

    fn addr(&self) -> SocketAddr {
        match self {
            Self::Edge { edge, .. } => edge.http_addr,
            Self::Smg(smg) => smg.addr,
        }
    }

    /// Waits until every engine is behind the router and it answers.
    async fn wait_serving(&self) -> anyhow::Result<()> {
        if let Self::Edge { edge, .. } = self {
            let http = edge.http_addr;
            let started = Instant::now();
            loop {
                let text =
                    tokio::task::spawn_blocking(move || http_get(http, "/metrics")).await??;
                if metric(&text, "edge_nodes_connected", "") == Some(ENGINES as f64) {
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("the {ENGINES} nodes did not all connect within 30 s");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        wait_answering(self.addr(), MODEL).await
    }
}

/// An `edge-node` process dialling the edge as node `i`, killed on drop.
struct NodeProcess(Child);

impl NodeProcess {
    fn start(binaries: &std::path::Path, edge: SocketAddr, i: usize) -> anyhow::Result<Self> {
        let program = binaries.join("edge-node");
        let child = Command::new(&program)
            .args(["--edge", &edge.to_string()])
            .env("EDGE_NODE_TOKEN", token(i))
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("cannot start {}", program.display()))?;
        Ok(Self(child))
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        // Only the child this struct started.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The texts every router is sent: the system prompts and each session's user messages.
struct Workload {
    systems: Vec<String>,
    /// `users[s][t]`: session `s`'s message at turn `t`.
    users: Vec<Vec<String>>,
    /// The tokens of a system prompt and of a user message, as the engine counts them.
    system_tokens: f64,
    user_tokens: f64,
    answer_tokens: u32,
}

impl Workload {
    /// Texts of the lengths `args` asks, measured by the engine at `tokenizer`.
    async fn make(args: &SessionsArgs, tokenizer: SocketAddr) -> anyhow::Result<Self> {
        let systems: Vec<String> = (0..args.system_prompts)
            .map(|k| text(&format!("You are harness {k}."), args.system_tokens, k))
            .collect();
        let users = (0..args.sessions)
            .map(|s| {
                (0..args.turns)
                    .map(|t| {
                        let seed = 1_000 + s * args.turns + t;
                        text(&format!("Session {s}, turn {t}:"), args.user_tokens, seed)
                    })
                    .collect()
            })
            .collect::<Vec<Vec<String>>>();
        let system_tokens = tokenize(tokenizer, &systems[0], false).await?;
        let user_tokens = tokenize(tokenizer, &users[0][0], false).await?;
        Ok(Self {
            systems,
            users,
            system_tokens: system_tokens.len() as f64,
            user_tokens: user_tokens.len() as f64,
            answer_tokens: args.answer_tokens,
        })
    }

    /// A slot's context: a whole session's history, with room to spare for the template.
    fn context_per_slot(&self) -> usize {
        let turns = self.users.first().map_or(0, Vec::len) as f64;
        let tokens =
            self.system_tokens + turns * (self.user_tokens + f64::from(self.answer_tokens) + 16.0);
        (tokens * 1.25) as usize + 512
    }

    /// Session `s`'s messages at `turn`: its system prompt, the turns answered before with
    /// their answers, and this turn's user message.
    fn messages(&self, s: usize, answered: &[(usize, String)], turn: usize) -> Vec<Value> {
        let system = &self.systems[s % self.systems.len()];
        let mut messages = vec![json!({"role": "system", "content": system})];
        for (t, answer) in answered {
            messages.push(json!({"role": "user", "content": self.users[s][*t]}));
            messages.push(json!({"role": "assistant", "content": answer}));
        }
        messages.push(json!({"role": "user", "content": self.users[s][turn]}));
        messages
    }
}

/// `opening` and then words drawn from [`WORDS`] by `seed`, about `tokens` tokens in all.
fn text(opening: &str, tokens: usize, seed: usize) -> String {
    let mut state = (seed as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = opening.to_owned();
    let words = tokens.saturating_sub(opening.split_whitespace().count() * 2);
    for _ in 0..words {
        // xorshift64: the same words for the same seed on every run.
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.push(' ');
        out.push_str(WORDS[(state % WORDS.len() as u64) as usize]);
    }
    out
}

/// `POST path` with `body` to the engine at `addr`, on a connection of its own
/// (`llama-server` closes a keep-alive connection after its hundredth request).
async fn engine_post(addr: SocketAddr, path: &str, body: &Value) -> anyhow::Result<Value> {
    let mut connection = Connection::connect(addr).await?;
    let request = post_json(addr, path, &body.to_string());
    let exchange = connection.exchange(&request, true).await?;
    serde_json::from_slice(&exchange.body).with_context(|| format!("{path}: not JSON"))
}

/// The tokens of `content` as the engine at `addr` reads them (with the BOS when `special`).
async fn tokenize(addr: SocketAddr, content: &str, special: bool) -> anyhow::Result<Vec<u64>> {
    let body = json!({"content": content, "add_special": special});
    let answer = engine_post(addr, "/tokenize", &body).await?;
    answer["tokens"]
        .as_array()
        .context("/tokenize: no tokens")?
        .iter()
        .map(|t| {
            t.as_u64()
                .context("/tokenize: a token that is not a number")
        })
        .collect()
}

/// The prompt the engine at `addr` makes of `messages` (its chat template), tokenized.
async fn prompt_tokens(addr: SocketAddr, messages: &[Value]) -> anyhow::Result<Vec<u64>> {
    let answer = engine_post(addr, "/apply-template", &json!({"messages": messages})).await?;
    let prompt = answer["prompt"]
        .as_str()
        .context("/apply-template: no prompt")?;
    tokenize(addr, prompt, true).await
}

/// How far the sessions are, and the moment half the turns are answered.
struct Progress {
    answered: AtomicUsize,
    halfway_at: usize,
    halfway: Notify,
}

/// One turn as its client saw it.
struct Turn {
    /// The answer's text, when some attempt was answered whole.
    answer: Option<String>,
    /// Time to the first content of the attempt that was answered.
    first_content: Option<Duration>,
    /// Attempts that failed (an error status, a broken or unfinished stream).
    failed_attempts: u32,
}

/// Runs every session through the router at `addr` at once; with `kill`, kills the last
/// engine once half the turns are answered. Returns each session's turns and, when it
/// killed one, the engine's counters read just before its death.
async fn drive(
    addr: SocketAddr,
    workload: &Arc<Workload>,
    engines: &mut [Engine],
    kill: bool,
) -> anyhow::Result<(Vec<Vec<Turn>>, Option<(f64, f64)>)> {
    let sessions = workload.users.len();
    let turns = workload.users.first().map_or(0, Vec::len);
    let progress = Arc::new(Progress {
        answered: AtomicUsize::new(0),
        halfway_at: sessions * turns / 2,
        halfway: Notify::new(),
    });
    let halfway = progress.halfway.notified();
    let mut tasks = tokio::task::JoinSet::new();
    for s in 0..sessions {
        let (workload, progress) = (Arc::clone(workload), Arc::clone(&progress));
        tasks.spawn(async move { (s, session(addr, &workload, s, &progress).await) });
    }
    let mut killed = None;
    if kill {
        halfway.await;
        let last = engines.last_mut().context("no engines")?;
        killed = Some(last.counters()?);
        last.kill();
    }
    let mut results: Vec<Option<Vec<Turn>>> = (0..sessions).map(|_| None).collect();
    while let Some(done) = tasks.join_next().await {
        let (s, turns) = done?;
        results[s] = Some(turns);
    }
    Ok((results.into_iter().flatten().collect(), killed))
}

/// Session `s`: its turns one after another, each asked again after a failure.
async fn session(
    addr: SocketAddr,
    workload: &Workload,
    s: usize,
    progress: &Progress,
) -> Vec<Turn> {
    let session_id = format!("6f1c2a4e-0000-4000-8000-{s:012}");
    let mut answered: Vec<(usize, String)> = Vec::new();
    let mut turns = Vec::new();
    for t in 0..workload.users[s].len() {
        let body = json!({
            "model": MODEL, "stream": true, "temperature": 0,
            "max_tokens": workload.answer_tokens, "logit_bias": {EOS_TOKEN: -100},
            "stream_options": {"include_usage": true},
            "messages": workload.messages(s, &answered, t),
        })
        .to_string();
        let request = post_json_with(
            addr,
            "/v1/chat/completions",
            &[("x-claude-code-session-id", &session_id)],
            &body,
        );
        let mut turn = Turn {
            answer: None,
            first_content: None,
            failed_attempts: 0,
        };
        while turn.answer.is_none() && turn.failed_attempts < ATTEMPTS {
            match attempt(addr, &request).await {
                Ok((answer, first_content)) => {
                    turn.answer = Some(answer);
                    turn.first_content = Some(first_content);
                }
                Err(_) => turn.failed_attempts += 1,
            }
        }
        if let Some(answer) = &turn.answer {
            answered.push((t, answer.clone()));
        }
        if progress.answered.fetch_add(1, Ordering::Relaxed) + 1 == progress.halfway_at {
            progress.halfway.notify_one();
        }
        turns.push(turn);
    }
    turns
}

/// One attempt at a turn on a connection of its own: the answer's text and the time to
/// its first content, or why it failed.
async fn attempt(addr: SocketAddr, request: &[u8]) -> anyhow::Result<(String, Duration)> {
    let mut connection = Connection::connect(addr).await?;
    let exchange = connection
        .exchange_watching(request, true, Some(has_content))
        .await?;
    if exchange.status != 200 {
        bail!("status {}", exchange.status);
    }
    let body = String::from_utf8_lossy(&exchange.body);
    if !body.contains("data: [DONE]") {
        bail!("the stream ended without [DONE]");
    }
    let mut text = String::new();
    for data in body.lines().filter_map(|line| line.strip_prefix("data: ")) {
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if chunk.get("error").is_some() {
            bail!("the stream carried an error: {chunk}");
        }
        if let Some(piece) = chunk
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            text.push_str(piece);
        }
    }
    let first = exchange.watched.context("an answer without content")?;
    Ok((text, first))
}

/// What one router did with the sessions.
struct Outcome {
    sessions: Vec<Vec<Turn>>,
    /// Prompt tokens the engines evaluated, and served from their caches.
    evaluated: f64,
    cached: f64,
    elapsed: Duration,
}

impl Outcome {
    fn record(&self, router: Router, kill: bool, ceiling: f64) -> Record {
        let mut first_content = Histogram::default();
        let (mut failed, mut lost, mut attempts_failed) = (0.0, 0.0, 0.0);
        for turn in self.sessions.iter().flatten() {
            if let Some(first) = turn.first_content {
                first_content.record_duration(first);
            }
            if turn.failed_attempts > 0 {
                failed += 1.0;
            }
            if turn.answer.is_none() {
                lost += 1.0;
            }
            attempts_failed += f64::from(turn.failed_attempts);
        }
        let share = self.cached / (self.evaluated + self.cached);
        let key = format!(
            "router={} kill={}",
            router.name(),
            if kill { "yes" } else { "no" }
        );
        Record::new(key).with_all([
            ("cached_tokens", self.cached),
            ("prompt_tokens", self.evaluated + self.cached),
            ("cached_share", share),
            ("ceiling", ceiling),
            ("of_ceiling", share / ceiling),
            ("ttft_p50_ms", first_content.quantile_us(0.5) / 1_000.0),
            ("ttft_p99_ms", first_content.quantile_us(0.99) / 1_000.0),
            ("total_s", self.elapsed.as_secs_f64()),
            ("turns_failed", failed),
            ("turns_lost", lost),
            ("attempts_failed", attempts_failed),
        ])
    }
}

/// The workload's ceiling for the turns `outcome` answered: the share of their prompt
/// tokens a router could serve from cache if every turn went to an engine holding the
/// longest prefix any earlier turn left (its prompt and answer), nothing ever evicted.
/// Sessions are taken in order, each turn after its session's previous one.
async fn ceiling(
    tokenizer: SocketAddr,
    workload: &Workload,
    outcome: &Outcome,
) -> anyhow::Result<f64> {
    let mut openings: Vec<Vec<u64>> = Vec::new();
    let (mut cacheable, mut total) = (0usize, 0usize);
    for (s, turns) in outcome.sessions.iter().enumerate() {
        let mut answered: Vec<(usize, String)> = Vec::new();
        let mut previous: Option<Vec<u64>> = None;
        for (t, turn) in turns.iter().enumerate() {
            let Some(answer) = &turn.answer else { continue };
            let messages = workload.messages(s, &answered, t);
            let prompt = prompt_tokens(tokenizer, &messages).await?;
            let known = match &previous {
                Some(before) => common_prefix(&prompt, before),
                None => openings
                    .iter()
                    .map(|opening| common_prefix(&prompt, opening))
                    .max()
                    .unwrap_or(0),
            };
            // The engine holds the prompt and the answer it generated after it.
            let mut held = prompt.clone();
            held.extend(tokenize(tokenizer, answer, false).await?);
            if previous.is_none() {
                openings.push(prompt.clone());
            }
            // An engine evaluates a prompt's last token again even when it holds it all.
            cacheable += known.min(prompt.len().saturating_sub(1));
            total += prompt.len();
            previous = Some(held);
            answered.push((t, answer.clone()));
        }
    }
    Ok(cacheable as f64 / total.max(1) as f64)
}

/// How many tokens `a` and `b` share from their start.
fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// (prompt tokens evaluated, prompt tokens served from the cache) of every engine so far;
/// for the last one, `killed` when it was killed (what it counted before it died).
fn engine_totals(engines: &[Engine], killed: Option<(f64, f64)>) -> anyhow::Result<(f64, f64)> {
    let last = engines.len().saturating_sub(1);
    engines
        .iter()
        .enumerate()
        .try_fold((0.0, 0.0), |(e, c), (i, engine)| {
            let (evaluated, cached) = match killed {
                Some(counted) if i == last => counted,
                _ => engine.counters()?,
            };
            Ok((e + evaluated, c + cached))
        })
}

#[cfg(test)]
mod tests {
    use super::{common_prefix, text};

    #[test]
    fn texts_are_the_same_for_a_seed_and_differ_between_seeds() {
        assert_eq!(text("A:", 50, 7), text("A:", 50, 7));
        assert_ne!(text("A:", 50, 7), text("A:", 50, 8));
        assert_eq!(text("A:", 50, 7).split_whitespace().count(), 1 + 48);
    }

    #[test]
    fn the_common_prefix_stops_at_the_first_difference() {
        assert_eq!(common_prefix(&[1, 2, 3], &[1, 2, 4, 5]), 2);
        assert_eq!(common_prefix(&[1, 2], &[1, 2, 3]), 2);
        assert_eq!(common_prefix(&[], &[1]), 0);
    }
}
