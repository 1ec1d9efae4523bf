//! Helpers for following runs through the run service in tests.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use edge::domain::{
    AdapterName, NodeSelector, Operation, RunEvent, RunEventKind, RunId, RunSpec, Target,
};
use edge::ports::RunHandle;

use super::{PATIENCE, TestApp};

/// `count` words, for runs that should stream for a while.
pub fn words(count: usize) -> String {
    (0..count)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A run of `echo/<target>` with `input` as text: no pin, no parameters, no deadline.
pub fn echo_to(target: &str, input: &str) -> RunSpec {
    RunSpec {
        selector: NodeSelector {
            adapter: AdapterName::parse("echo").expect("adapter"),
            target: Target::parse(target).expect("target"),
            pin: None,
        },
        input: Bytes::from(input.to_owned()),
        content_type: "text/plain; charset=utf-8".into(),
        params: BTreeMap::new(),
        deadline: None,
        operation: Operation::Unspecified,
        routing: Default::default(),
    }
}

/// A run of `echo/default` with `input`.
pub fn echo_run(input: &str) -> RunSpec {
    echo_to("default", input)
}

/// `spec`, told to behave as `mock` by the mock node.
pub fn mocked(mut spec: RunSpec, mock: &str) -> RunSpec {
    spec.params.insert("mock".to_owned(), mock.to_owned());
    spec
}

/// Starts a run that must be accepted.
pub fn start(app: &TestApp, spec: RunSpec) -> RunHandle {
    app.parts.runs.start(spec).expect("run accepted")
}

/// The next event of a run.
pub async fn next_event(handle: &mut RunHandle) -> Arc<RunEvent> {
    tokio::time::timeout(PATIENCE, handle.events.recv())
        .await
        .unwrap_or_else(|_| panic!("run {} sent no event in time", handle.run_id))
        .unwrap_or_else(|| panic!("run {} ended its stream early", handle.run_id))
}

/// Every remaining event of a run, until its stream ends.
pub async fn rest(handle: &mut RunHandle) -> Vec<Arc<RunEvent>> {
    let mut events = Vec::new();
    loop {
        match tokio::time::timeout(PATIENCE, handle.events.recv()).await {
            Ok(Some(event)) => events.push(event),
            Ok(None) => return events,
            Err(_) => panic!(
                "run {} did not end in time; so far {events:#?}",
                handle.run_id
            ),
        }
    }
}

/// Checks that `events` end in exactly one terminal event, all for `run_id`, with growing
/// `seq`, and returns that terminal event.
pub fn only_terminal<'a>(run_id: &RunId, events: &'a [Arc<RunEvent>]) -> &'a RunEvent {
    assert!(events.iter().all(|e| &e.run_id == run_id), "{events:#?}");
    let terminals = events.iter().filter(|e| e.kind.is_terminal()).count();
    assert_eq!(terminals, 1, "expected one terminal event: {events:#?}");
    let last = events.last().expect("at least the terminal event");
    assert!(
        last.kind.is_terminal(),
        "terminal must be last: {events:#?}"
    );
    assert!(
        events.windows(2).all(|w| w[0].seq < w[1].seq),
        "seq must grow: {events:#?}"
    );
    last
}

/// The `failed` code of a terminal event.
pub fn failure_code(event: &RunEvent) -> &str {
    match &event.kind {
        RunEventKind::Failed { code, .. } => code,
        other => panic!("expected failed, got {other:?}"),
    }
}
