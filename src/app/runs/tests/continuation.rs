//! Tests of continuation inside the run service: a run whose node is lost after output is
//! carried on by another node from the output relayed, with one stream, one terminal event
//! and both attempts' usage — or fails as before, naming why.

use super::*;
use crate::domain::routing::{BreakerState, RouteRule};
use crate::domain::{Continuation, FailureClass, Usage};

fn continuing() -> RunsConfig {
    RunsConfig {
        max_continuations: 1,
        ..config()
    }
}

fn completed_with(output_tokens: u32) -> RunEventKind {
    RunEventKind::Completed {
        finish_reason: "stop".into(),
        usage: Some(Usage {
            input_tokens: 5,
            output_tokens,
            ..Usage::default()
        }),
    }
}

fn chat(body: serde_json::Value) -> RunSpec {
    RunSpec {
        input: Bytes::from(body.to_string()),
        content_type: "application/json".into(),
        operation: crate::domain::Operation::Chat,
        ..spec()
    }
}

#[tokio::test(start_paused = true)]
async fn a_node_failure_after_output_is_continued_on_another_node() {
    let mut h = Harness::new(continuing(), Expect::terminals(1).runs_sent(2));
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    let first = h.holder(&run).0;
    let node_failure = classed(FailureClass::Node);
    h.holder_reports(
        &run,
        [
            RunEventKind::Started,
            output("Hel"),
            output("lo"),
            node_failure,
        ],
    )
    .await;
    let (second, assignment) = h.assignments(&run).pop().unwrap();
    assert_ne!(second.as_str(), first);
    assert_eq!(
        assignment.continuation,
        Some(Continuation {
            text: "Hello".into(),
            output_tokens: 2,
            number: 1,
        })
    );
    h.holder_reports(
        &run,
        [RunEventKind::Started, output(", world"), completed_with(3)],
    )
    .await;
    let terminal = h.assert_ended_once(&mut handle);
    let RunEventKind::Completed { usage, .. } = &terminal.kind else {
        panic!("not completed: {terminal:?}");
    };
    assert_eq!(usage.map(|u| u.output_tokens), Some(5));
    let published = h.published(&run);
    let kinds: Vec<&str> = published.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "started",
            "output",
            "output",
            "started",
            "output",
            "completed"
        ]
    );
    let seqs: Vec<u64> = published.iter().map(|e| e.seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6]);
    let rules: Vec<_> = published
        .iter()
        .filter_map(|e| e.route.as_ref().map(|r| (r.rule, r.attempt)))
        .collect();
    assert_eq!(rules[1], (RouteRule::Continuation, 2));
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_lost_connection_after_output_is_continued_once_then_fails() {
    let no_resume = RunsConfig {
        resume_grace_ms: 0,
        ..continuing()
    };
    let mut h = Harness::new(no_resume, Expect::terminals(1).runs_sent(2));
    for node in ["a", "b", "c"] {
        h.connect(node, 1).await;
    }
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    h.holder_reports(&run, [RunEventKind::Started, output("one")])
        .await;
    let first = h.holder(&run).0;
    h.disconnect(&first).await;
    let second = h.holder(&run).0;
    assert_ne!(second, first);
    h.holder_reports(&run, [RunEventKind::Started, output(" two")])
        .await;
    h.disconnect(&second).await;
    let terminal = h.assert_ended_once(&mut handle);
    let RunEventKind::Failed { code, message, .. } = &terminal.kind else {
        panic!("not failed: {terminal:?}");
    };
    assert_eq!(code, "node_disconnected");
    assert!(message.contains("not continued"), "{message}");
    assert_eq!(h.sent_to(&run).len(), 2);
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn states_that_cannot_move_fail_as_before_with_the_reason() {
    let mut h = Harness::new(continuing(), Expect::terminals(4).runs_sent(4));
    h.connect("a", 4).await;
    h.connect("b", 4).await;
    let two_choices = chat(serde_json::json!({"messages": [], "n": 2}));
    let schema = chat(serde_json::json!({
        "messages": [],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}
    }));
    let tool = RunEventKind::Output {
        text: String::new(),
        data: Bytes::new(),
        structured: Some(Box::new(crate::domain::StructuredOutput {
            tool_calls: vec![crate::domain::ToolCallDelta {
                name: "f".into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
    };
    let reasoning = RunEventKind::Output {
        text: String::new(),
        data: Bytes::new(),
        structured: Some(Box::new(crate::domain::StructuredOutput {
            reasoning: "Let me think".into(),
            ..Default::default()
        })),
    };
    let cases = [
        (two_choices, output("x"), "more than one choice"),
        (schema, output("{"), "constrained output"),
        (spec(), tool, "tool call"),
        (spec(), reasoning, "reasoning was streamed"),
    ];
    for (spec, first_output, reason) in cases {
        let mut handle = h.start(spec);
        let run = handle.run_id.clone();
        h.holder_reports(&run, [first_output, classed(FailureClass::Node)])
            .await;
        let terminal = h.assert_ended_once(&mut handle);
        let RunEventKind::Failed { message, .. } = &terminal.kind else {
            panic!("not failed: {terminal:?}");
        };
        assert!(message.contains(reason), "{message} names {reason}");
        assert_eq!(h.sent_to(&run).len(), 1);
    }
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_not_resumed_within_the_grace_is_continued_when_it_expires() {
    let mut h = Harness::new(continuing(), Expect::terminals(1).runs_sent(2));
    let (a, _) = h.resume("a", 1, &[]).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    h.connect("b", 1).await;
    h.report_each("a", a, &run, [RunEventKind::Started, output("kept")])
        .await;
    h.disconnect("a").await;
    assert_eq!(h.sent_to(&run).len(), 1, "held for the grace first");
    sleep(Duration::from_millis(2_010)).await;
    let (second, assignment) = h.assignments(&run).pop().unwrap();
    assert_eq!(second.as_str(), "b");
    assert_eq!(
        assignment.continuation.map(|c| c.text),
        Some("kept".to_owned())
    );
    h.holder_reports(&run, [output(" on"), completed()]).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind, completed());
    let texts: Vec<_> = h
        .published(&run)
        .iter()
        .filter_map(|e| match &e.kind {
            RunEventKind::Output { text, .. } => Some(text.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(texts, ["kept", " on"]);
    h.finish().await;
}

/// Node `node`'s drain deadline passes: it is drained, and the runs on it are moved off.
async fn drain_deadline(h: &Harness, node: &str, run: &RunId) -> bool {
    let node = node_id(node);
    h.service.set_drained(&node, true);
    let reason = "node drain deadline passed";
    h.service.move_off_drained(&node, run, reason).await
}

/// A run of [`spec()`] placed on one of nodes `a` and `b`: the harness, the run's handle
/// and its node.
async fn on_one_of_two() -> (Harness, RunHandle, String) {
    let mut h = Harness::new(continuing(), Expect::terminals(1).runs_sent(2));
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let handle = h.start(spec());
    let first = h.holder(&handle.run_id).0;
    (h, handle, first)
}

#[tokio::test(start_paused = true)]
async fn a_drain_deadline_continues_a_run_with_output_on_another_node() {
    let (h, mut handle, first) = on_one_of_two().await;
    let run = handle.run_id.clone();
    let first_connection = h.holder(&run).1;
    h.holder_reports(&run, [RunEventKind::Started, output("Hel")])
        .await;
    assert!(drain_deadline(&h, &first, &run).await);

    let (second, assignment) = h.assignments(&run).pop().unwrap();
    assert_ne!(second.as_str(), first);
    assert_eq!(assignment.continuation.map(|c| c.text), Some("Hel".into()));
    assert_eq!(
        h.cancels(&run),
        [(node_id(&first), "node drain deadline passed".to_owned())]
    );
    assert_eq!(h.active_runs(&first), 0);
    // The drained node's answer to the cancel belongs to an attempt that has ended.
    h.report(&first, first_connection, &run, 3, cancelled("drained"))
        .await;
    h.holder_reports(&run, [RunEventKind::Started, output("lo"), completed()])
        .await;
    assert_eq!(h.assert_ended_once(&mut handle).kind, completed());
    let kinds: Vec<&str> = h.published(&run).iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        ["started", "output", "started", "output", "completed"]
    );
    // A drain is the operator's doing: nothing is held against the node's breaker.
    assert_eq!(
        h.service.breaker_state(&node_id(&first)),
        BreakerState::Closed { failures: 0 }
    );
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_drain_deadline_places_a_run_without_output_again() {
    let (h, mut handle, first) = on_one_of_two().await;
    let run = handle.run_id.clone();
    h.holder_reports(&run, [RunEventKind::Started]).await;
    assert!(drain_deadline(&h, &first, &run).await);
    let (second, assignment) = h.assignments(&run).pop().unwrap();
    assert_ne!(second.as_str(), first);
    assert_eq!(assignment.continuation, None);
    h.holder_reports(&run, [RunEventKind::Started, output("x"), completed()])
        .await;
    assert_eq!(h.assert_ended_once(&mut handle).kind, completed());
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_run_that_cannot_move_at_a_drain_deadline_is_cancelled_on_its_node() {
    let mut h = Harness::new(continuing(), Expect::terminals(1).runs_sent(1));
    let a = h.connect("a", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    h.report_each("a", a, &run, [RunEventKind::Started, output("Hel")])
        .await;
    assert!(drain_deadline(&h, "a", &run).await);
    let cancels = h.cancels(&run);
    assert_eq!(cancels.len(), 1);
    assert_eq!(
        cancels[0].1,
        "node drain deadline passed (not continued: no other node serving the route can continue runs)"
    );
    h.report("a", a, &run, 3, cancelled(&cancels[0].1)).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert!(matches!(terminal.kind, RunEventKind::Cancelled { .. }));
    h.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_continued_run_then_cancelled_counts_both_attempts_output() {
    let mut h = Harness::new(
        continuing(),
        Expect::terminals(1).runs_sent(2).cancels_sent(1),
    );
    h.connect("a", 1).await;
    h.connect("b", 1).await;
    let mut handle = h.start(spec());
    let run = handle.run_id.clone();
    let lost = [
        RunEventKind::Started,
        output("Hel"),
        output("lo"),
        classed(FailureClass::Node),
    ];
    h.holder_reports(&run, lost).await;
    h.holder_reports(&run, [RunEventKind::Started, output(", "), output("wor")])
        .await;
    assert!(h.service.cancel(&run, "caller").await);
    // The node says what its engine produced: the prompt, and less output than it relayed
    // (the edge's count of relayed pieces is the floor).
    let reported = RunEventKind::Cancelled {
        reason: "caller".into(),
        usage: Some(Usage::new(5, 1)),
    };
    h.holder_reports(&run, [reported]).await;
    let terminal = h.assert_ended_once(&mut handle);
    assert_eq!(terminal.kind.name(), "cancelled");
    // Two tokens carried from the first attempt, two relayed by the second.
    assert_eq!(terminal.kind.usage(), Some(Usage::new(5, 4)));
    h.finish().await;
}
