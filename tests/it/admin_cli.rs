//! The `edge` operator commands against a running edge's management API: `nodes`, `drain`,
//! `resume`, `runs`, `run show`, `run events` and `cancel`, with the address and key from
//! the environment, and a refusal without the key.

use crate::admin_support::{ADMIN_KEY, HandNode, echo_run, edge_command as edge, nodes_config};
use crate::common::runs::{rest, start};
use crate::common::spawn_app;

use edge::domain::RunEventKind;
use edge::ports::NodeCommand;

#[crate::common::test]
async fn operator_commands_list_drain_resume_show_and_cancel() {
    let app = spawn_app(&nodes_config("")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;

    let (ok, out, err) = edge(&app, Some(ADMIN_KEY), &["nodes"]).await;
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap_or_default();
    assert!(
        header.starts_with("ID") && header.contains("STATE"),
        "{out}"
    );
    let row = out
        .lines()
        .find(|l| l.starts_with("node-a "))
        .expect("node-a's row");
    assert!(
        row.contains("serving") && row.contains("echo[default]"),
        "{out}"
    );
    assert!(
        out.lines()
            .any(|l| l.starts_with("node-b ") && l.contains("disconnected")),
        "{out}"
    );

    let (ok, out, err) = edge(
        &app,
        Some(ADMIN_KEY),
        &["drain", "gpu-a", "--deadline", "10m"],
    )
    .await;
    assert!(ok && out.contains("node node-a is drained"), "{out}{err}");
    let (ok, out, _) = edge(&app, Some(ADMIN_KEY), &["resume", "node-a"]).await;
    assert!(ok && out.contains("node node-a is serving"), "{out}");

    let mut handle = start(&app, echo_run("via the cli"));
    let run = node.next_run().await;
    node.send(&run.run_id, RunEventKind::Started).await;
    let id = run.run_id.to_string();
    let (ok, out, err) = edge(&app, Some(ADMIN_KEY), &["runs", "--state", "open"]).await;
    assert!(
        ok && out
            .lines()
            .any(|l| l.starts_with(&id) && l.contains("open")),
        "{out}{err}"
    );
    let (ok, out, _) = edge(&app, Some(ADMIN_KEY), &["run", "show", &id]).await;
    assert!(
        ok && out.contains("outcome         open") && out.contains("node-a"),
        "{out}"
    );
    let (ok, out, _) = edge(&app, Some(ADMIN_KEY), &["run", "events", &id]).await;
    assert!(ok && out.contains("\"kind\":\"started\""), "{out}");

    let (ok, out, err) = edge(&app, Some(ADMIN_KEY), &["cancel", &id]).await;
    assert!(ok && out.contains("is being cancelled"), "{out}{err}");
    match node.next_command().await {
        NodeCommand::Cancel { run_id, .. } => assert_eq!(run_id, run.run_id),
        other => panic!("expected a cancel, got {other:?}"),
    }
    node.send(&run.run_id, RunEventKind::cancelled("cli")).await;
    rest(&mut handle).await;

    let (ok, _, err) = edge(&app, None, &["nodes"]).await;
    assert!(
        !ok && err.contains("401") && err.contains("unauthorized"),
        "{err}"
    );
    let (ok, _, err) = edge(&app, Some(ADMIN_KEY), &["cancel", "run-missing"]).await;
    assert!(!ok && err.contains("404"), "{err}");
    app.stop().await;
}

#[crate::common::test]
async fn agent_setup_prints_the_settings_with_the_window_the_nodes_reported() {
    use crate::admin_support::API_KEY;
    let app = spawn_app(&nodes_config("")).await;
    let mut node = HandNode::register(&app, "token-a").await;
    app.wait_for_nodes(1).await;
    let setup = |args: &'static [&'static str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_edge"));
        command
            .arg("agent-setup")
            .args(args)
            .env("EDGE_API_URL", format!("http://{}", app.http_addr))
            .env("EDGE_API_KEY", API_KEY)
            .env_remove("EDGE_API_CACERT");
        async move {
            let output = tokio::time::timeout(crate::common::PATIENCE, command.output())
                .await
                .expect("the command ends in time")
                .expect("run the edge binary");
            let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
            (
                output.status.success(),
                text(&output.stdout),
                text(&output.stderr),
            )
        }
    };
    // No window reported yet: told how to give one.
    let (ok, _, err) = setup(&["echo/default"]).await;
    assert!(!ok && err.contains("--context-window"), "{err}");
    let (ok, _, err) = setup(&["echo/nothing"]).await;
    assert!(!ok && err.contains("no connected node serves"), "{err}");
    node.report_windows(&[("echo", "default", 16_384)]).await;
    let printed = crate::common::eventually_ok("the window is reported", || async {
        match setup(&["echo/default"]).await {
            (true, out, _) => Ok(out),
            (false, _, err) => Err(err),
        }
    })
    .await;
    let base = format!("http://{}", app.http_addr);
    for line in [
        format!("export ANTHROPIC_BASE_URL={base}"),
        "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=16384".to_owned(),
        "export ANTHROPIC_MODEL=echo/default".to_owned(),
        "model_context_window = 16384".to_owned(),
        format!("base_url = \"{base}/v1\""),
    ] {
        assert!(printed.lines().any(|l| l == line), "{line} in:\n{printed}");
    }
    assert!(!printed.contains(API_KEY), "the key is never printed");
    let (ok, only_codex, _) = setup(&["echo/default", "--for", "codex"]).await;
    assert!(ok && !only_codex.contains("ANTHROPIC"), "{only_codex}");
    app.stop().await;
}
