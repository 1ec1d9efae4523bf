//! `affinity`: what the edge's affinity routing earns on real engines. Four `llama-server`
//! children (prompt caching on, as shipped) behind four reference nodes in process, an edge
//! in process, and forty multi-turn conversations sharing one long system prompt (each
//! opening with a document of its own), streamed a few at a time. For each routing variant
//! (`on`: the shipped prefix affinity; `off`: `[routing] prefix_affinity = false`, least
//! busy with ties rotating; `round-robin`: each request to the next node in turn, by a
//! `prompt_cache_key` homed there) it reports the prompt tokens the engines evaluated and
//! reused (their own counters), the usage API's input and cached tokens over the same runs,
//! and the time to the first streamed byte. Token counts depend only on where each turn
//! went; the times are this machine's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Args;
use edge::settings::SinkKind;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, edge_config, wait_serving};
use crate::harness::{InProcessEdge, http_get, runtime, token};
use crate::http::{Connection, post_json};
use crate::stats::{Histogram, Record};

/// The engines (and nodes) behind the edge.
const ENGINES: usize = 4;

#[derive(Debug, Clone, Args)]
pub struct AffinityArgs {
    /// The `llama-server` binary (`bash .ci/engines/llama-server.sh` prints it).
    #[arg(long)]
    llama_server: PathBuf,
    /// The GGUF model every engine serves (the tests' tiny model will do: the figures are
    /// prompt tokens, not answers).
    #[arg(long)]
    model: PathBuf,
    /// Conversations, each its own multi-turn chat.
    #[arg(long, default_value_t = 40)]
    conversations: usize,
    /// Turns of each conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Conversations in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Words of the shared system prompt.
    #[arg(long, default_value_t = 600)]
    system_words: usize,
    /// Words of the document each conversation's first message brings (its own context,
    /// which only the engine that saw it has cached).
    #[arg(long, default_value_t = 400)]
    document_words: usize,
    /// Slots of each engine (`--parallel`), each with its own prompt cache.
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// The routing variants to measure, comma-separated: `on` (prefix affinity), `off`
    /// (least busy), `round-robin` (each request to the next node, by `prompt_cache_key`s
    /// found to home on each node).
    #[arg(long, default_value = "on,off,round-robin")]
    routing: String,
}

pub fn run(args: &AffinityArgs, common: &crate::Common) -> anyhow::Result<Vec<Record>> {
    let mut records = Vec::new();
    for variant in args.routing.split(',').map(str::trim) {
        let prefix_affinity = match variant {
            "on" => true,
            "off" | "round-robin" => false,
            other => bail!("--routing takes on, off and round-robin, not {other:?}"),
        };
        let engines: Vec<Engine> = (0..ENGINES)
            .map(|_| Engine::start(&args.llama_server, &args.model, args.slots, &[]))
            .collect::<anyhow::Result<_>>()?;
        let edge = InProcessEdge::start(
            &edge_config(
                &engines.iter().map(|e| e.addr).collect::<Vec<_>>(),
                &format!(
                    "[routing]\nprefix_affinity = {prefix_affinity}\n[runs]\nno_node_timeout_ms = 30000\n"
                ),
            ),
            &[SinkKind::Null],
            common.edge_threads,
        )?;
        let load = runtime("load", common.load_threads)?;
        let round_robin = variant == "round-robin";
        let record = load.block_on(measure(args, &edge, &engines, round_robin))?;
        records.push(
            record
                .into_iter()
                .fold(Record::new(format!("routing={variant}")), |r, (n, v)| {
                    r.with(n, v)
                }),
        );
        drop(load);
        edge.stop();
    }
    Ok(records)
}

/// Runs the conversations against `edge` and returns the figures.
async fn measure(
    args: &AffinityArgs,
    edge: &InProcessEdge,
    engines: &[Engine],
    round_robin: bool,
) -> anyhow::Result<Vec<(&'static str, f64)>> {
    let stop = CancellationToken::new();
    for i in 0..ENGINES {
        let options = edge_node::NodeOptions::new(edge.node_addr.to_string(), token(i));
        tokio::spawn(edge_node::run(options, stop.clone()));
    }
    wait_serving(edge.http_addr).await?;
    let keys = if round_robin {
        homed_keys(edge.http_addr).await?
    } else {
        Vec::new()
    };
    let plan = Arc::new(Plan {
        keys,
        next: AtomicUsize::new(0),
    });
    let before = engine_totals(engines)?;
    let since_ms = now_ms();
    let system: String = (0..args.system_words)
        .map(|i| format!("rule{i}"))
        .collect::<Vec<_>>()
        .join(" ");
    let system = Arc::new(system);
    let gate = Arc::new(Semaphore::new(args.concurrency.max(1)));
    let mut conversations = tokio::task::JoinSet::new();
    for c in 0..args.conversations {
        let (gate, system, http) = (Arc::clone(&gate), Arc::clone(&system), edge.http_addr);
        let (turns, document, plan) = (args.turns, args.document_words, Arc::clone(&plan));
        conversations.spawn(async move {
            let _permit = gate.acquire_owned().await?;
            conversation(http, &system, c, (turns, document), &plan).await
        });
    }
    let mut ttft = Histogram::default();
    let (mut input, mut cached) = (0.0, 0.0);
    while let Some(done) = conversations.join_next().await {
        let turns = done??;
        for turn in turns {
            ttft.record_duration(turn.first_byte);
            input += turn.input;
            cached += turn.cached;
        }
    }
    let after = engine_totals(engines)?;
    let usage = usage_totals(edge.admin_addr, since_ms)?;
    stop.cancel();
    Ok(vec![
        ("engine_evaluated", after.0 - before.0),
        ("engine_cached", after.1 - before.1),
        (
            "engine_hit_rate",
            (after.1 - before.1) / (after.0 - before.0 + after.1 - before.1),
        ),
        ("client_input", input),
        ("client_cached", cached),
        ("usage_input", usage.0),
        ("usage_cached", usage.1),
        ("usage_hit_rate", usage.1 / usage.0),
        ("ttft_p50_ms", ttft.quantile_us(0.5) / 1_000.0),
        ("ttft_p90_ms", ttft.quantile_us(0.9) / 1_000.0),
    ])
}

/// How requests are keyed: round robin over keys homed on each node, or not at all.
struct Plan {
    keys: Vec<String>,
    next: AtomicUsize,
}

impl Plan {
    /// The key of the next request, when round robin.
    fn next_key(&self) -> Option<&str> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.keys
            .get(n % self.keys.len().max(1))
            .map(String::as_str)
    }
}

/// One `prompt_cache_key` per node whose runs that node takes (found by asking: the edge
/// names the node that answered in `x-edge-node`).
async fn homed_keys(http: SocketAddr) -> anyhow::Result<Vec<String>> {
    let mut connection = Connection::connect(http).await?;
    let mut homes: std::collections::BTreeMap<String, String> = Default::default();
    for k in 0..200 {
        let key = format!("rr-{k}");
        let body = json!({"model": "llama/tiny", "max_tokens": 1, "prompt_cache_key": key,
            "messages": [{"role": "user", "content": "x"}]});
        let request = post_json(http, "/v1/chat/completions", &body.to_string());
        let exchange = connection.exchange(&request, false).await?;
        if let Some(node) = exchange.node {
            homes.entry(node).or_insert(key);
        }
        if homes.len() == ENGINES {
            return Ok(homes.into_values().collect());
        }
    }
    bail!("no key homes on each of the {ENGINES} nodes")
}

/// One turn as the client saw it.
struct Turn {
    first_byte: Duration,
    input: f64,
    cached: f64,
}

/// Conversation `c`: `turns` streamed chat requests, each carrying the whole history; the
/// first brings a document of `document` words of its own.
async fn conversation(
    http: SocketAddr,
    system: &str,
    c: usize,
    (turns, document): (usize, usize),
    plan: &Plan,
) -> anyhow::Result<Vec<Turn>> {
    let mut connection = Connection::connect(http).await?;
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut seen = Vec::new();
    for t in 0..turns {
        let mut question = format!("conversation {c} question {t}: go on");
        if t == 0 {
            let words: Vec<String> = (0..document).map(|w| format!("c{c}w{w}")).collect();
            question = format!("{} {question}", words.join(" "));
        }
        messages.push(json!({"role": "user", "content": question}));
        let mut body = json!({
            "model": "llama/tiny", "stream": true, "max_tokens": 8, "temperature": 0,
            "stream_options": {"include_usage": true}, "messages": messages,
        });
        if let Some(key) = plan.next_key() {
            body["prompt_cache_key"] = json!(key);
        }
        let request = post_json(http, "/v1/chat/completions", &body.to_string());
        let exchange = connection.exchange(&request, true).await?;
        if exchange.status != 200 {
            bail!(
                "status {}: {}",
                exchange.status,
                String::from_utf8_lossy(&exchange.body)
            );
        }
        let (text, usage) = read_stream(&exchange.body);
        let usage = usage.context("the stream carried no usage")?;
        seen.push(Turn {
            first_byte: exchange.first_byte,
            input: usage["prompt_tokens"].as_f64().unwrap_or(0.0),
            cached: usage["prompt_tokens_details"]["cached_tokens"]
                .as_f64()
                .unwrap_or(0.0),
        });
        messages.push(json!({"role": "assistant", "content": text}));
    }
    Ok(seen)
}

/// The text and the usage of a streamed chat answer.
fn read_stream(body: &[u8]) -> (String, Option<Value>) {
    let mut text = String::new();
    let mut usage = None;
    for line in String::from_utf8_lossy(body).lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(chunk) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(piece) = chunk
            .pointer("/choices/0/delta/content")
            .and_then(Value::as_str)
        {
            text.push_str(piece);
        }
        if chunk["usage"].is_object() {
            usage = Some(chunk["usage"].clone());
        }
    }
    (text, usage)
}

fn engine_totals(engines: &[Engine]) -> anyhow::Result<(f64, f64)> {
    engines.iter().try_fold((0.0, 0.0), |(e, c), engine| {
        let (evaluated, cached) = engine.counters()?;
        Ok((e + evaluated, c + cached))
    })
}

/// The usage API's input and cached input tokens of the runs that ended since `since_ms`.
fn usage_totals(admin: SocketAddr, since_ms: u64) -> anyhow::Result<(f64, f64)> {
    let response = http_get(
        admin,
        &format!("/admin/v1/usage?bucket=minute&since={since_ms}"),
    )?;
    let body = response.split("\r\n\r\n").nth(1).context("no body")?;
    let report: Value = serde_json::from_str(body).context("the usage answer is not JSON")?;
    let totals = &report["totals"];
    Ok((
        totals["input_tokens"].as_f64().unwrap_or(0.0),
        totals["cached_input_tokens"].as_f64().unwrap_or(0.0),
    ))
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
