//! What happens to a `RunRequest`: refused at once (unknown or broken adapter, target not
//! available now, node busy or draining) with one `failed { class: REFUSED }`, or admitted
//! and driven to exactly one terminal event by an owned task.
//!
//! The driver races the adapter against the run's stop signal and its deadline; whichever
//! wins, the adapter's future is dropped, and with it the engine request and its connection,
//! so the engine stops generating at once. A run that fails or is cancelled reports what
//! it produced until then (the emitter's tally).

use std::sync::Arc;
use std::time::{Duration, Instant};

use edge::client::RunAssignment;
use edge::domain::{FailureClass, RunEventKind};
use tokio_util::task::TaskTracker;

use crate::adapters::{AdapterSet, Lookup};
use crate::openai::OpenAiAdapter;
use crate::runs::{Emitter, Refusal, RunTable, Stop, StopSignal};

/// Starts `run`, or refuses it, given at most `max_running` runs at once.
pub fn start_run(
    run: RunAssignment,
    adapters: &AdapterSet,
    table: &RunTable,
    tasks: &TaskTracker,
    max_running: usize,
) {
    let Some(adapter) = adapter_for(&run, adapters, table) else {
        return;
    };
    match table.admit(run.run_id.as_str(), max_running) {
        Ok((emitter, signal)) => {
            tasks.spawn(drive(adapter, run, emitter, signal));
        }
        Err(Refusal::Busy) => {
            let message = format!("the node is running its {max_running} runs");
            refuse(table, &run, "node_busy", message);
        }
        Err(Refusal::Draining) => {
            refuse(
                table,
                &run,
                "node_draining",
                "the node is shutting down".into(),
            );
        }
        Err(Refusal::Duplicate) => {
            tracing::warn!(run_id = %run.run_id, "the edge sent a run the node already holds; ignored");
        }
    }
}

/// The adapter that can take `run` now; otherwise the run is answered with its refusal.
fn adapter_for(
    run: &RunAssignment,
    adapters: &AdapterSet,
    table: &RunTable,
) -> Option<Arc<OpenAiAdapter>> {
    match adapters.lookup(run.adapter.as_str(), run.target.as_str()) {
        Lookup::Unknown => {
            refuse(
                table,
                run,
                "unknown_adapter",
                "this node has no such adapter".into(),
            );
            None
        }
        Lookup::Broken(problem) => {
            let failed = RunEventKind::Failed {
                context_window: None,
                code: "adapter_misconfigured".into(),
                message: format!("adapter {} cannot run: {problem}", run.adapter),
                class: FailureClass::Node,
                status: None,
                usage: None,
            };
            table.refuse(run.run_id.as_str(), failed);
            None
        }
        Lookup::Ready {
            available: Some(false),
            ..
        } => {
            let message = format!("the engine does not serve {} now", run.target);
            refuse(table, run, "target_unavailable", message);
            None
        }
        Lookup::Ready { adapter, .. } => Some(adapter),
    }
}

fn refuse(table: &RunTable, run: &RunAssignment, code: &str, message: String) {
    tracing::info!(run_id = %run.run_id, adapter = %run.adapter, target = %run.target, code, "run refused");
    let failed = RunEventKind::Failed {
        context_window: None,
        code: code.into(),
        message,
        class: FailureClass::Refused,
        status: None,
        usage: None,
    };
    table.refuse(run.run_id.as_str(), failed);
}

/// Drives one admitted run to its terminal event.
async fn drive(
    adapter: Arc<OpenAiAdapter>,
    run: RunAssignment,
    out: Emitter,
    mut signal: StopSignal,
) {
    let started = Instant::now();
    let deadline = async {
        match run.deadline_ms {
            0 => std::future::pending().await,
            ms => tokio::time::sleep(Duration::from_millis(u64::from(ms))).await,
        }
    };
    let terminal = tokio::select! {
        result = adapter.execute(&run, &out) => result.ok(),
        stop = signal.stopped() => match stop {
            Stop::Cancel(reason) => Some(RunEventKind::cancelled(reason)),
            Stop::Shutdown => Some(RunEventKind::cancelled("node_shutdown")),
            Stop::Forget => None,
        },
        () = deadline => Some(RunEventKind::failed(
            "deadline_exceeded",
            format!("the run did not finish within its {} ms deadline", run.deadline_ms),
        )),
    };
    // A failure or cancel reports what the engine produced before it (the adapter's future,
    // dropped by a cancel, left its count in the emitter).
    let terminal = terminal.map(|kind| out.with_produced(kind));
    let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match terminal {
        Some(kind) => {
            tracing::info!(run_id = out.run_id(), adapter = %run.adapter, target = %run.target, outcome = kind.name(), elapsed_ms, "run ended");
            // Gone: the node let go of the run meanwhile; nobody waits for this event.
            let _ = out.emit(kind).await;
        }
        None => tracing::info!(run_id = out.run_id(), elapsed_ms, "run dropped"),
    }
}
