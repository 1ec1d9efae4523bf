//! The management API's JSON shapes, shared with the `edge` operator commands that read
//! them. The OpenAPI document's schemas are generated from these types.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::fit_views::{BudgetView, FitView, FootprintView, InventoryView};
use crate::domain::models::ModelPolicy;
use crate::domain::stats::{BUCKET_MS, BUCKETS};
use crate::domain::{
    AdapterName, Attempt, RunRecord, StatsPoint, StatsWindow, Target, Usage, UsageCounts, UsageRow,
};
use crate::ports::{ModelEvent, ModelOnNode, ModelView, NodeStatus};

/// `GET /admin/v1/nodes`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeList {
    /// Every configured node, ordered by id.
    pub nodes: Vec<NodeView>,
    /// The edge's clock when it answered, ms since the Unix epoch (to show heartbeat ages
    /// without trusting the reader's clock).
    #[serde(default)]
    pub now_ms: u64,
}

/// A configured node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeView {
    /// The node's id.
    pub id: String,
    /// Its alias.
    pub alias: String,
    /// `disconnected`, `serving`, `draining` (drained, runs left), `drained` (no run left)
    /// or `breaker_open`.
    pub state: String,
    /// The address it connected from; absent while disconnected.
    pub peer: Option<String>,
    /// The node software's version, as it reported it.
    pub node_version: Option<String>,
    /// When it registered, ms since the Unix epoch.
    pub connected_since_ms: Option<u64>,
    /// When it last sent a heartbeat or an event, ms since the Unix epoch.
    pub last_heartbeat_ms: Option<u64>,
    /// Runs it holds now.
    pub active_runs: u32,
    /// Its limits from the config.
    pub limits: NodeLimits,
    /// Its adapters and their targets.
    pub adapters: Vec<AdapterView>,
    /// Its drain, when drained.
    pub drain: Option<DrainView>,
    /// Whether its circuit breaker keeps new runs away from it now (`state` says
    /// `breaker_open` unless a drain or a disconnect says more).
    #[serde(default)]
    pub breaker_open: bool,
    /// Its devices and their memory, as it last reported them; absent while disconnected
    /// and from a node older than protocol v1.7.
    #[serde(default)]
    pub inventory: Option<InventoryView>,
}

/// A node's limits.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeLimits {
    /// Runs sent to it at once, at most.
    pub max_concurrent_runs: u32,
    /// How often it must send a heartbeat.
    pub heartbeat_interval_ms: u32,
}

/// One adapter of a node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AdapterView {
    /// The adapter's name.
    pub name: String,
    /// What it serves.
    pub targets: Vec<TargetView>,
    /// For a managed adapter with a budget: the budget, its devices and its room now.
    #[serde(default)]
    pub budget: Option<BudgetView>,
}

/// One target of an adapter.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TargetView {
    /// The target's name.
    pub name: String,
    /// Whether the node reports it can serve it now; absent when the node does not report.
    pub available: Option<bool>,
    /// Its footprint on that node, for a managed adapter's target whose node knows it.
    #[serde(default)]
    pub footprint: Option<FootprintView>,
}

/// A node's drain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DrainView {
    /// When it began, ms since the Unix epoch.
    pub since_ms: u64,
    /// When the node's remaining runs move to other nodes (or are cancelled), ms since the
    /// Unix epoch.
    pub deadline_ms: Option<u64>,
}

/// `POST /admin/v1/nodes/{node}/drain` (the body is optional).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Cancel the node's runs still open this many seconds from now; absent to let them
    /// finish however long they take.
    pub deadline_seconds: Option<u64>,
}

/// `GET /admin/v1/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunList {
    /// The runs, newest first.
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// A run's record. Never holds its input or a secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunView {
    /// The run's id.
    pub id: String,
    /// Its adapter.
    pub adapter: String,
    /// Its target.
    pub target: String,
    /// `unspecified`, `chat`, `completion`, `embeddings`, `tokenize` or `detokenize`.
    pub operation: String,
    /// The node id or alias it was pinned to.
    pub pin: Option<String>,
    /// The name of the API key the caller used, when the API set one.
    pub api_key_name: Option<String>,
    /// The source of its affinity key (`prompt_cache_key`, `session`, `user`, `prefix`), as
    /// the usage rollups and the token metrics split by it; absent when it had none (and for
    /// runs a journal of schema 5 or older recorded).
    pub affinity: Option<String>,
    /// `open`, `completed`, `failed`, `cancelled`, or `unknown` (the edge stopped while
    /// the run was open).
    pub outcome: String,
    /// The failure code (`failed`; `edge_crashed` for `unknown`).
    pub code: Option<String>,
    /// The failure's message, or why it was cancelled.
    pub message: Option<String>,
    /// Why generation stopped (`completed`).
    pub finish_reason: Option<String>,
    /// The node of its latest attempt.
    pub node: Option<String>,
    /// Why that node was chosen.
    pub route_reason: Option<String>,
    /// Its placements, in order.
    pub attempts: Vec<AttemptView>,
    /// When it was accepted, ms since the Unix epoch.
    pub queued_at_ms: u64,
    /// When it was first sent to a node.
    pub started_at_ms: Option<u64>,
    /// When its first output was relayed.
    pub first_output_at_ms: Option<u64>,
    /// When it ended.
    pub finished_at_ms: Option<u64>,
    /// Token counts, when the node reported them.
    pub usage: Option<UsageView>,
    /// Events relayed.
    pub events: u64,
    /// Of those, how many the journal holds.
    pub events_stored: u64,
}

/// One placement of a run.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AttemptView {
    /// 1 for the first.
    pub number: u32,
    /// The node.
    pub node: String,
    /// Why it was chosen (`pinned`, `least_busy`, ...).
    pub route_reason: String,
    /// When it was sent to the node, ms since the Unix epoch.
    pub started_at_ms: u64,
}

/// Token counts.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageView {
    /// Prompt tokens.
    pub input_tokens: u32,
    /// Generated tokens.
    pub output_tokens: u32,
    /// Prompt tokens served from the engine's cache.
    pub cached_input_tokens: u32,
    /// Generated tokens spent on reasoning.
    pub reasoning_tokens: u32,
}

/// `DELETE /admin/v1/runs/{run}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct CancelView {
    /// The run.
    pub id: String,
    /// Always `true`: the cancel was sent; the run ends with its terminal event.
    pub cancelling: bool,
}

/// Every error: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// An error's code and message.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable snake_case code (`unauthorized`, `not_found`, `bad_request`, ...).
    pub code: String,
    /// What happened, for people.
    pub message: String,
}

impl NodeView {
    /// The view of `status`.
    pub fn of(status: &NodeStatus) -> Self {
        let record = &status.record;
        let connection = status.connection.as_ref();
        Self {
            id: record.id().to_string(),
            alias: record.alias().to_string(),
            state: status.state.as_str().to_owned(),
            peer: connection.map(|c| c.peer.to_string()),
            node_version: connection.map(|c| c.node_version.clone()),
            connected_since_ms: connection.map(|c| c.connected_since_ms),
            last_heartbeat_ms: connection.map(|c| c.last_seen_ms),
            active_runs: connection.map_or(0, |c| c.active_runs),
            limits: NodeLimits {
                max_concurrent_runs: record.runtime().max_concurrent_runs(),
                heartbeat_interval_ms: record.runtime().heartbeat_interval_ms(),
            },
            adapters: record
                .adapters()
                .iter()
                .map(|a| AdapterView::of(status, a.name(), a.targets()))
                .collect(),
            drain: status.drain.map(|d| DrainView {
                since_ms: d.since_ms,
                deadline_ms: d.deadline_ms,
            }),
            breaker_open: status.breaker_open(),
            inventory: connection
                .and_then(|c| c.inventory.as_deref())
                .map(InventoryView::of),
        }
    }
}

impl AdapterView {
    fn of(status: &NodeStatus, name: &AdapterName, targets: &[Target]) -> Self {
        let managed = status
            .connection
            .as_ref()
            .and_then(|c| c.availability.as_ref())
            .and_then(|a| a.managed(name));
        Self {
            name: name.to_string(),
            targets: targets
                .iter()
                .map(|t| TargetView {
                    name: t.to_string(),
                    available: status.available(name, t),
                    footprint: managed
                        .and_then(|m| m.targets.get(t))
                        .and_then(|load| load.footprint.as_ref())
                        .map(FootprintView::of),
                })
                .collect(),
            budget: managed.and_then(BudgetView::of),
        }
    }
}

impl RunView {
    /// The view of `record`.
    pub fn of(record: &RunRecord) -> Self {
        let accepted = &record.accepted;
        Self {
            id: accepted.run_id.to_string(),
            adapter: accepted.adapter.to_string(),
            target: accepted.target.to_string(),
            operation: accepted.operation.as_str().to_owned(),
            pin: accepted.pin.clone(),
            api_key_name: accepted.api_key_name.clone(),
            affinity: accepted.affinity.map(|source| source.as_str().to_owned()),
            outcome: record.outcome.as_str().to_owned(),
            code: record.code.clone(),
            message: record.message.clone(),
            finish_reason: record.finish_reason.clone(),
            node: record.node().map(ToString::to_string),
            route_reason: record.attempts.last().map(|a| a.route_reason.clone()),
            attempts: record.attempts.iter().map(AttemptView::of).collect(),
            queued_at_ms: accepted.queued_ms,
            started_at_ms: record.started_ms(),
            first_output_at_ms: record.first_output_ms,
            finished_at_ms: record.finished_ms,
            usage: record.usage.map(UsageView::of),
            events: record.events,
            events_stored: record.events_stored,
        }
    }
}

impl AttemptView {
    fn of(attempt: &Attempt) -> Self {
        Self {
            number: attempt.number,
            node: attempt.node.to_string(),
            route_reason: attempt.route_reason.clone(),
            started_at_ms: attempt.started_ms,
        }
    }
}

impl UsageView {
    fn of(usage: Usage) -> Self {
        Self {
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            cached_input_tokens: usage.cached_input_tokens,
            reasoning_tokens: usage.reasoning_tokens,
        }
    }
}

/// `GET /admin/v1/usage`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageReport {
    /// The bucket size read: `minute`, `hour` or `day`.
    pub bucket: String,
    /// Whether the rows are split by bucket (`bucket` was asked for).
    pub per_bucket: bool,
    /// The dimensions the rows are split by (`key`, `model`, `node`, `affinity`).
    pub group_by: Vec<String>,
    /// Runs that ended in buckets starting at or after this, ms since the Unix epoch.
    pub since_ms: u64,
    /// ... and before this.
    pub until_ms: u64,
    /// One row per bucket (when split) and group, ordered by bucket, key, model, node,
    /// affinity.
    pub rows: Vec<UsageRowView>,
    /// The sums of every row.
    pub totals: UsageCountsView,
}

/// One row of a usage report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageRowView {
    /// The bucket's start, ms since the Unix epoch; present when split by bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<u64>,
    /// The API key's name (absent for runs without one); present when grouped by key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The model, `ADAPTER/TARGET`; present when grouped by model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The node that held the run at its end (absent for runs never placed); present when
    /// grouped by node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Where the runs' affinity keys came from, as the `affinity` label of the token
    /// metrics names it: `prompt_cache_key`, `session`, `user`, `prefix`, or `none` for
    /// runs without one; present when grouped by affinity (absent for runs rolled up by an
    /// edge that did not record it, before journal schema 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<String>,
    /// The row's sums.
    #[serde(flatten)]
    pub counts: UsageCountsView,
}

/// Sums of what runs consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageCountsView {
    /// Runs that ended (completed, failed or cancelled).
    pub runs: u64,
    /// Of those, runs that failed.
    pub errors: u64,
    /// Prompt tokens, as the nodes reported them.
    pub input_tokens: u64,
    /// Prompt tokens the engines served from their prompt caches (part of `input_tokens`).
    pub cached_input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Generated tokens spent on reasoning (part of `output_tokens`).
    pub reasoning_tokens: u64,
    /// `cached_input_tokens / input_tokens`; absent when there was no input.
    pub cache_hit_rate: Option<f64>,
}

impl UsageCountsView {
    /// The view of `counts`.
    pub fn of(counts: &UsageCounts) -> Self {
        Self {
            runs: counts.runs,
            errors: counts.errors,
            input_tokens: counts.input_tokens,
            cached_input_tokens: counts.cached_input_tokens,
            output_tokens: counts.output_tokens,
            reasoning_tokens: counts.reasoning_tokens,
            cache_hit_rate: counts.cache_hit_rate(),
        }
    }
}

/// `GET /admin/v1/stats`: the last hour in buckets. Buckets in which nothing happened are
/// left out: read a missing bucket as all zeros.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatsView {
    /// Each bucket's width, in ms.
    pub bucket_ms: u64,
    /// The window covered: buckets starting at or after this, ms since the Unix epoch.
    pub since_ms: u64,
    /// Now, ms since the Unix epoch (the last bucket may still be filling).
    pub now_ms: u64,
    /// The whole edge, oldest bucket first.
    pub edge: Vec<StatsPointView>,
    /// Each node that ran something in the window, by id.
    pub nodes: Vec<NodeStatsView>,
}

/// One node's buckets.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeStatsView {
    /// The node's id.
    pub node: String,
    /// Its buckets, oldest first (`queue_peak` is always 0: the queue is the edge's).
    pub points: Vec<StatsPointView>,
}

/// One bucket.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatsPointView {
    /// Its start, ms since the Unix epoch.
    pub start_ms: u64,
    /// Runs sent to a node for the first time (requests).
    pub started: u64,
    /// Runs that completed.
    pub completed: u64,
    /// Runs that failed (errors).
    pub failed: u64,
    /// Runs that were cancelled.
    pub cancelled: u64,
    /// Output tokens of the runs that ended, as their nodes reported them.
    pub output_tokens: u64,
    /// Median time from acceptance to first output of the runs that ended, in ms, rounded
    /// up to a histogram bound (5, 10, 25, 50, 100, 250 ms, ...); absent without output.
    pub ttft_p50_ms: Option<u64>,
    /// The 99th percentile of the same.
    pub ttft_p99_ms: Option<u64>,
    /// The most runs waiting in the edge's queue at once, sampled as runs entered it.
    pub queue_peak: u64,
}

impl StatsView {
    /// The view of `window`, read at `now_ms`.
    pub fn of(window: &StatsWindow, now_ms: u64) -> Self {
        let points = |points: &[StatsPoint]| points.iter().map(StatsPointView::of).collect();
        let span = BUCKET_MS * BUCKETS as u64;
        Self {
            bucket_ms: BUCKET_MS,
            since_ms: (now_ms / BUCKET_MS * BUCKET_MS + BUCKET_MS).saturating_sub(span),
            now_ms,
            edge: points(&window.edge),
            nodes: window
                .nodes
                .iter()
                .map(|(node, series)| NodeStatsView {
                    node: node.to_string(),
                    points: points(series),
                })
                .collect(),
        }
    }
}

impl UsageRowView {
    /// The view of `row`.
    pub fn of(row: &UsageRow) -> Self {
        Self {
            start_ms: row.start_ms,
            key: row.group.key.clone(),
            model: row.group.model.clone(),
            node: row.group.node.clone(),
            affinity: row.group.affinity.as_deref().map(str::to_owned),
            counts: UsageCountsView::of(&row.counts),
        }
    }
}

impl StatsPointView {
    fn of(point: &StatsPoint) -> Self {
        Self {
            start_ms: point.start_ms,
            started: point.started,
            completed: point.completed,
            failed: point.failed,
            cancelled: point.cancelled,
            output_tokens: point.output_tokens,
            ttft_p50_ms: point.ttft_p50_ms,
            ttft_p99_ms: point.ttft_p99_ms,
            queue_peak: point.queue_peak,
        }
    }
}

/// `GET /admin/v1/models`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelList {
    /// Every model some connected node serves or can load, by name (one with a
    /// `[[models]]` entry while a connected node is configured with it, even on no node).
    pub models: Vec<ModelStateView>,
}

/// A model: its desired state and where it is, node by node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelStateView {
    /// The model, `adapter/target`.
    pub model: String,
    /// Its `[[models]]` entry; absent (`null`) without one.
    pub policy: Option<ModelPolicyView>,
    /// Each connected node that serves it or can load it, by id.
    pub nodes: Vec<ModelOnNodeView>,
    /// Why its `[[models]]` entry cannot be met with the footprints and budgets the nodes
    /// reported (a pin where it does not fit, `min_loaded` above the nodes it fits on).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// A `[[models]]` entry.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelPolicyView {
    /// Kept loaded on at least this many nodes.
    pub min_loaded: u32,
    /// Nodes where it is kept loaded and never unloaded, by id.
    pub pin: Vec<String>,
    /// Unloaded where unused this long (beyond `min_loaded` and the pins); absent: never.
    pub idle_unload_ms: Option<u64>,
}

/// One model on one node.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelOnNodeView {
    /// The node's id.
    pub node: String,
    /// `loaded`, `loading`, `unloaded`, `sleeping`, `asleep` (a vLLM server asleep: not
    /// served, loadable by waking it) or `failed` (a node whose engine the edge does not
    /// manage: `loaded` while it serves the model).
    pub state: String,
    /// Whether the node's engine loads and unloads it on the edge's command.
    pub managed: bool,
    /// While loading, how far in percent, when the engine says (0 otherwise).
    pub progress_percent: u8,
    /// With `failed`, the engine's reason (empty otherwise).
    pub failure: String,
    /// Since when it is in this state (as the edge saw it), ms since the Unix epoch.
    pub since_ms: u64,
    /// Runs of it in flight on the node.
    pub in_flight: u32,
    /// When a run of it last ended on the node, ms since the Unix epoch; absent: none since
    /// the edge started.
    pub last_used_ms: Option<u64>,
    /// Why it was last loaded or unloaded there: `demand`, `min_loaded`, `pin`, `idle`,
    /// `make_room` or `operator` (empty: the edge did neither).
    pub reason: String,
    /// A command in progress there, `load` or `unload`; absent: none.
    pub command: Option<String>,
    /// Its footprint there, as the node derived it; absent when the node does not know.
    #[serde(default)]
    pub footprint: Option<FootprintView>,
    /// The budget of its adapter on that node, in bytes; absent when none is known.
    #[serde(default)]
    pub budget_bytes: Option<u64>,
    /// The room there now (the budget less the footprints of what the adapter holds).
    #[serde(default)]
    pub room_bytes: Option<u64>,
    /// What the edge's last decision to load it there found (its footprint and the room).
    #[serde(default)]
    pub decided: Option<FitView>,
}

/// `POST /admin/v1/models/load`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelLoadRequest {
    /// The model, `adapter/target`.
    pub model: String,
    /// The node's id or alias.
    pub node: String,
}

/// `POST /admin/v1/models/unload`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelUnloadRequest {
    /// The model, `adapter/target`.
    pub model: String,
    /// The node's id or alias.
    pub node: String,
    /// With runs of the model in flight on the node, wait up to this many seconds for them
    /// to end before unloading; absent: refuse (`409 conflict`) while any is in flight.
    #[serde(default)]
    pub drain_deadline_seconds: Option<u64>,
}

/// A load or unload: one line of `GET /admin/v1/models/events`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ModelEventView {
    /// When, ms since the Unix epoch.
    pub at_ms: u64,
    /// The model, `adapter/target`.
    pub model: String,
    /// The node's id; absent for a warning about no one node (`min_loaded`).
    pub node: Option<String>,
    /// `load`, `unload`, or `warning` (a `[[models]]` entry the pool cannot meet).
    pub action: String,
    /// Why: `demand`, `min_loaded`, `pin`, `idle`, `make_room` or `operator`.
    pub reason: String,
    /// `started`, `done` or `failed`; `unmet` with a warning.
    pub outcome: String,
    /// With `failed`, the engine's reason; with a warning, what cannot be met (empty
    /// otherwise).
    pub message: String,
    /// With `done` or `failed`, how long the command took, in ms; absent with `started`.
    pub took_ms: Option<u64>,
    /// With a load, where known: the model's footprint there and the room before it.
    #[serde(default)]
    pub fit: Option<FitView>,
}

impl ModelStateView {
    /// The view of `model`.
    pub fn of(model: &ModelView) -> Self {
        Self {
            model: model.model.to_string(),
            policy: model.policy.as_ref().map(ModelPolicyView::of),
            nodes: model.nodes.iter().map(ModelOnNodeView::of).collect(),
            warnings: model.warnings.clone(),
        }
    }
}

impl ModelPolicyView {
    fn of(policy: &ModelPolicy) -> Self {
        Self {
            min_loaded: policy.min_loaded,
            pin: policy.pin.iter().map(ToString::to_string).collect(),
            idle_unload_ms: policy
                .idle_unload
                .map(|idle| u64::try_from(idle.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

impl ModelOnNodeView {
    fn of(on: &ModelOnNode) -> Self {
        Self {
            node: on.node.to_string(),
            state: on.state.as_str().to_owned(),
            managed: on.managed,
            progress_percent: on.progress_percent,
            failure: on.failure.clone(),
            since_ms: on.since_ms,
            in_flight: on.in_flight,
            last_used_ms: on.last_used_ms,
            reason: on.reason.clone(),
            command: on.command.map(|action| action.as_str().to_owned()),
            footprint: on.footprint.as_ref().map(FootprintView::of),
            budget_bytes: on.budget,
            room_bytes: on.room,
            decided: on.decided.as_ref().map(FitView::of),
        }
    }
}

impl ModelEventView {
    /// The view of `event`.
    pub fn of(event: &ModelEvent) -> Self {
        Self {
            at_ms: event.at_ms,
            model: event.model.to_string(),
            node: event.node.as_ref().map(ToString::to_string),
            action: event.action.as_str().to_owned(),
            reason: event.reason.clone(),
            outcome: event.outcome.to_owned(),
            message: event.message.clone(),
            took_ms: event.took_ms,
            fit: event.fit.as_ref().map(FitView::of),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::*;
    use crate::domain::NodeId;
    use crate::domain::models::{
        FitNote, Footprint, FootprintSource, LoadState, ModelAction, ModelName,
    };

    fn node(id: &str) -> NodeId {
        NodeId::parse(id).expect("a node id")
    }

    /// `llama/alpha` loading on `node-a`, with its footprint and the room it found.
    fn loading_on_node_a() -> ModelOnNode {
        ModelOnNode {
            node: node("node-a"),
            state: LoadState::Loading,
            managed: true,
            progress_percent: 40,
            failure: String::new(),
            since_ms: 1_000,
            in_flight: 0,
            last_used_ms: None,
            reason: "demand".into(),
            command: Some(ModelAction::Load),
            footprint: Some(Footprint {
                bytes: 300,
                weights: 200,
                kv_cache: 64,
                overhead: 36,
                context: 4_096,
                source: FootprintSource::Gguf,
            }),
            budget: Some(1_000),
            room: Some(700),
            decided: Some(FitNote {
                footprint: 300,
                budget: 1_000,
                room: 1_000,
            }),
        }
    }

    #[test]
    fn a_model_view_is_the_contract_s_json() {
        let model = ModelView {
            model: ModelName::parse("llama/alpha").expect("a model"),
            policy: Some(ModelPolicy {
                min_loaded: 2,
                pin: vec![node("node-a")],
                idle_unload: Some(Duration::from_secs(600)),
            }),
            nodes: vec![loading_on_node_a()],
            warnings: vec!["llama/alpha has min_loaded = 2 but fits on 1 connected node(s)".into()],
        };
        let json = serde_json::to_value(ModelStateView::of(&model)).expect("JSON");
        assert_eq!(
            json,
            json!({
                "model": "llama/alpha",
                "policy": {"min_loaded": 2, "pin": ["node-a"], "idle_unload_ms": 600_000},
                "nodes": [{
                    "node": "node-a", "state": "loading", "managed": true,
                    "progress_percent": 40, "failure": "", "since_ms": 1_000, "in_flight": 0,
                    "last_used_ms": null, "reason": "demand", "command": "load",
                    "footprint": {
                        "bytes": 300, "weights_bytes": 200, "kv_cache_bytes": 64,
                        "overhead_bytes": 36, "context": 4_096, "source": "gguf",
                    },
                    "budget_bytes": 1_000, "room_bytes": 700,
                    "decided": {"footprint_bytes": 300, "budget_bytes": 1_000, "room_bytes": 1_000},
                }],
                "warnings": ["llama/alpha has min_loaded = 2 but fits on 1 connected node(s)"],
            })
        );
        let bare = ModelView {
            policy: None,
            nodes: Vec::new(),
            ..model
        };
        let json = serde_json::to_value(ModelStateView::of(&bare)).expect("JSON");
        assert_eq!(json["policy"], serde_json::Value::Null);
    }

    #[test]
    fn a_model_event_names_its_action_and_outcome() {
        let event = ModelEvent {
            at_ms: 5,
            model: ModelName::parse("llama/alpha").expect("a model"),
            node: Some(node("node-b")),
            action: ModelAction::Unload.into(),
            reason: "idle".into(),
            outcome: "failed",
            message: "busy".into(),
            took_ms: Some(12),
            fit: None,
        };
        let json = serde_json::to_value(ModelEventView::of(&event)).expect("JSON");
        assert_eq!(
            json,
            json!({
                "at_ms": 5, "model": "llama/alpha", "node": "node-b", "action": "unload",
                "reason": "idle", "outcome": "failed", "message": "busy", "took_ms": 12,
                "fit": null,
            })
        );
    }

    #[test]
    fn an_unload_request_reads_its_optional_deadline_and_refuses_strangers() {
        let request: ModelUnloadRequest =
            serde_json::from_value(json!({"model": "a/b", "node": "n"})).expect("a request");
        assert_eq!(request.drain_deadline_seconds, None);
        let unknown = serde_json::from_value::<ModelLoadRequest>(
            json!({"model": "a/b", "node": "n", "drain": 1}),
        );
        assert!(unknown.is_err());
    }
}
