//! Issue 28 end to end: the real agent harnesses, unchanged, through the edge. Claude Code
//! (`claude -p`, Anthropic Messages) and the Codex CLI (`codex exec`, OpenAI Responses), at
//! the versions `.ci/clients/agents.sh` pins, each finish a turn against a real edge (in
//! process, port 0) whose three reference nodes forward to one real `llama-server` serving
//! the tiny test model; the same session's later turns (`--continue`, `exec resume --last`)
//! land on the node of its first (three turns on three nodes: 1 in 9 to pass by chance), routed by the session the harness sends (prefix affinity
//! is off here, so the harness's own session key is the only affinity key there is).
//!
//! Both clients run with a `HOME` of their own in a temporary directory, so nothing of the
//! machine's own configuration reaches them, and with their network chatter off.

use crate::common;
use crate::node_support;

use std::process::Output;
use std::time::Duration;

use common::engines::{LlamaOptions, LlamaServer, TINY_REPLY, agent_clients};
use common::{TestApp, spawn_app};
use node_support::{RunningNode, spawn_node};
use serde_json::Value;
use tokio::process::Command;

const API_KEY: &str = "sk-edge-agents";
const MODEL: &str = "llama/tiny";
/// How long one turn of a harness may take (they answer in about two seconds).
const TURN_PATIENCE: Duration = Duration::from_secs(120);
/// The harnesses' prompts are long (Claude Code's system prompt is ~12k tokens): one slot
/// with room for them.
const CONTEXT: u32 = 65_536;
/// The nodes, each serving the one engine.
const NODES: [&str; 3] = ["box-1", "box-2", "box-3"];

/// Three nodes, `box-1` to `box-3`, serving the engine at `v1_url` as `llama/tiny`.
fn edge_config(v1_url: &str) -> String {
    let node = |id: &str| {
        format!(
            r#"
[[nodes]]
id = "{id}"
alias = "{id}"
token = "token-{id}"
[[nodes.adapters]]
name = "llama"
targets = ["tiny"]
[nodes.adapters.settings]
base_url = "{v1_url}"
availability = "reachable"
"#
        )
    };
    format!(
        "[api]\nkeys = [\"{API_KEY}\"]\n[routing]\nprefix_affinity = false\n{}",
        NODES.map(node).concat()
    )
}

/// llama-server, the edge and its three nodes.
struct Stack {
    _llama: LlamaServer,
    app: TestApp,
    nodes: Vec<RunningNode>,
    home: tempfile::TempDir,
}

impl Stack {
    async fn start() -> Self {
        Self::start_with_context(CONTEXT).await
    }

    /// The stack with an engine of `context` tokens.
    async fn start_with_context(context: u32) -> Self {
        let llama =
            LlamaServer::start_with(LlamaOptions::default().parallel(1).context(context)).await;
        let app = spawn_app(&edge_config(&llama.v1_url())).await;
        let nodes = NODES
            .map(|id| spawn_node(app.node_addr, &format!("token-{id}"), |_| {}))
            .into();
        app.wait_for_nodes(NODES.len()).await;
        Self {
            _llama: llama,
            app,
            nodes,
            home: tempfile::tempdir().expect("a HOME for the harnesses"),
        }
    }

    /// `program` (in the pinned clients' directory) with `args`, in its own HOME and
    /// working directory, the edge's address and key in `env`; it must exit 0 and print
    /// the tiny model's answer.
    async fn turn(&self, program: &str, args: &[&str], env: &[(&str, String)]) -> String {
        let work = self.home.path().join("work");
        std::fs::create_dir_all(&work).expect("a working directory");
        let mut command = Command::new(agent_clients().join(program));
        command
            .args(args)
            .current_dir(&work)
            .env("HOME", self.home.path())
            .env("DISABLE_AUTOUPDATER", "1")
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("NO_COLOR", "1")
            .kill_on_drop(true);
        for (name, value) in env {
            command.env(name, value);
        }
        let output = tokio::time::timeout(TURN_PATIENCE, command.output())
            .await
            .unwrap_or_else(|_| panic!("`{program} {args:?}` finished in time"))
            .unwrap_or_else(|e| panic!("`{program}` ran: {e}"));
        assert_answered(program, args, &output);
        // What it printed besides the answer: its notices and warnings.
        String::from_utf8_lossy(&output.stderr).into_owned()
            + &String::from_utf8_lossy(&output.stdout)
    }

    /// Claude Code, pointed at the edge as its docs say for a gateway.
    async fn claude(&self, args: &[&str]) -> String {
        let env = [
            (
                "ANTHROPIC_BASE_URL",
                format!("http://{}", self.app.http_addr),
            ),
            ("ANTHROPIC_API_KEY", API_KEY.to_owned()),
        ];
        self.turn("claude", args, &env).await
    }

    /// Claude Code with the environment `edge agent-setup` prints for `MODEL`.
    async fn claude_as_set_up(&self, args: &[&str]) -> String {
        let setup = Command::new(env!("CARGO_BIN_EXE_edge"))
            .args(["agent-setup", MODEL, "--for", "claude"])
            .env("EDGE_API_URL", format!("http://{}", self.app.http_addr))
            .env("EDGE_API_KEY", API_KEY)
            .output();
        let setup = tokio::time::timeout(common::PATIENCE, setup)
            .await
            .expect("agent-setup ends in time")
            .expect("agent-setup runs");
        let printed = String::from_utf8_lossy(&setup.stdout).into_owned();
        assert!(
            setup.status.success(),
            "{printed}{}",
            String::from_utf8_lossy(&setup.stderr)
        );
        let mut env: Vec<(&str, String)> = printed
            .lines()
            .filter_map(|line| line.strip_prefix("export ")?.split_once('='))
            .map(|(name, value)| (name, value.to_owned()))
            .collect();
        // The one value that names the shell's own variable: the key.
        for (name, value) in &mut env {
            if *name == "ANTHROPIC_API_KEY" {
                *value = API_KEY.to_owned();
            }
        }
        assert!(
            env.iter()
                .any(|(name, _)| *name == "CLAUDE_CODE_MAX_CONTEXT_TOKENS"),
            "{printed}"
        );
        self.turn("claude", args, &env).await
    }

    /// The newest run's share of its prompt that the engine read from its cache.
    async fn newest_cache_share(&self) -> f64 {
        let runs = self.runs_json().await;
        let usage = &runs.first().expect("a run")["usage"];
        let count = |field: &str| usage[field].as_f64().unwrap_or(0.0);
        count("cached_input_tokens") / count("input_tokens").max(1.0)
    }

    /// The Codex CLI with a `responses` provider whose base URL is the edge's `/v1`.
    async fn codex(&self, args: &[&str]) {
        let codex_home = self.home.path().join(".codex");
        std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
        let config = format!(
            "model = \"{MODEL}\"\nmodel_provider = \"edge\"\n\
             [model_providers.edge]\nname = \"edge\"\nbase_url = \"http://{}/v1\"\n\
             env_key = \"EDGE_API_KEY\"\nwire_api = \"responses\"\n",
            self.app.http_addr
        );
        std::fs::write(codex_home.join("config.toml"), config).expect("codex config");
        let env = [
            ("CODEX_HOME", codex_home.display().to_string()),
            ("EDGE_API_KEY", API_KEY.to_owned()),
        ];
        self.turn("codex", args, &env).await;
    }

    /// The Codex CLI on its built-in OpenAI provider pointed at the edge (`openai_base_url`,
    /// as most gateway users set it): WebSockets first, and remote compaction, here at
    /// `compact_at` tokens of a 64k window. Returns its stderr.
    async fn codex_builtin(&self, args: &[&str], compact_at: u32) -> String {
        let codex_home = self.home.path().join(".codex-builtin");
        std::fs::create_dir_all(&codex_home).expect("CODEX_HOME");
        let config = format!(
            "model = \"{MODEL}\"\nopenai_base_url = \"http://{}/v1\"\n\
             model_context_window = {CONTEXT}\nmodel_auto_compact_token_limit = {compact_at}\n",
            self.app.http_addr
        );
        std::fs::write(codex_home.join("config.toml"), config).expect("codex config");
        let env = [
            ("CODEX_HOME", codex_home.display().to_string()),
            // `codex exec` takes an API key for its built-in provider from here.
            ("CODEX_API_KEY", API_KEY.to_owned()),
        ];
        self.turn("codex", args, &env).await
    }

    /// Every run the edge has recorded (newest first), as the management API lists them.
    async fn runs_json(&self) -> Vec<Value> {
        let url = format!("http://{}/admin/v1/runs", self.app.admin_addr);
        let listed: Value = common::http()
            .build()
            .expect("http client")
            .get(url)
            .send()
            .await
            .expect("the runs listing answers")
            .json()
            .await
            .expect("the runs listing is JSON");
        listed["runs"].as_array().expect("runs").clone()
    }

    /// Every run the edge has recorded (newest first): its node and route reason.
    async fn runs(&self) -> Vec<(String, String)> {
        self.runs_json()
            .await
            .iter()
            .map(|run| {
                let text = |field: &str| run[field].as_str().unwrap_or_default().to_owned();
                (text("node"), text("route_reason"))
            })
            .collect()
    }

    async fn stop(self) {
        for node in self.nodes {
            node.stop().await.expect("the node stops cleanly");
        }
        self.app.stop().await;
    }
}

fn assert_answered(program: &str, args: &[&str], output: &Output) {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains(TINY_REPLY.trim()),
        "`{program} {args:?}` did not answer ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
}

/// The runs recorded since `before` runs were: all on one node, each routed by affinity
/// (the `key` the harness sends: the only one there is).
fn assert_one_node(runs: &[(String, String)], before: usize, key: &str) {
    let new = &runs[..runs.len() - before];
    assert!(
        new.len() >= 3,
        "three turns made three runs at least: {runs:?}"
    );
    let node = &new[0].0;
    for (run_node, reason) in new {
        assert_eq!(run_node, node, "a session's turns share a node: {new:?}");
        assert!(
            reason.starts_with("affinity_hit"),
            "routed by the {key}: {new:?}"
        );
    }
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_and_the_codex_cli_finish_turns_and_keep_their_node() {
    let stack = Stack::start().await;

    stack.claude(&["-p", "Say hello", "--model", MODEL]).await;
    for _ in 0..2 {
        stack
            .claude(&["-p", "Again", "--continue", "--model", MODEL])
            .await;
        let share = stack.newest_cache_share().await;
        assert!(
            share >= 0.8,
            "a later turn read {share:.2} of its prompt from the cache"
        );
    }
    let claude_runs = stack.runs().await;
    assert_one_node(&claude_runs, 0, "session");

    let before = claude_runs.len();
    stack
        .codex(&["exec", "--skip-git-repo-check", "Say hello"])
        .await;
    for _ in 0..2 {
        stack
            .codex(&["exec", "--skip-git-repo-check", "resume", "--last", "Again"])
            .await;
        let share = stack.newest_cache_share().await;
        assert!(
            share >= 0.8,
            "a later turn read {share:.2} of its prompt from the cache"
        );
    }
    assert_one_node(&stack.runs().await, before, "prompt_cache_key");

    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_on_its_built_in_provider_compacts_through_the_edge_without_a_websocket_stall() {
    let stack = Stack::start().await;
    // Codex's own prompt is thousands of tokens: turn 2 compacts before it runs.
    let compact_at = 400;
    let first = stack
        .codex_builtin(&["exec", "--skip-git-repo-check", "Say hello"], compact_at)
        .await;
    let second = stack
        .codex_builtin(
            &["exec", "--skip-git-repo-check", "resume", "--last", "Again"],
            compact_at,
        )
        .await;
    for stderr in [&first, &second] {
        // A WebSocket upgrade answered 426 sends Codex to HTTP at once: no retries.
        assert!(
            !stderr.contains("Reconnecting") && !stderr.contains("Falling back from WebSockets"),
            "{stderr}"
        );
    }
    // Codex kept the edge's compaction item in its session (and turn 2 sent it back).
    let sessions = stack.home.path().join(".codex-builtin").join("sessions");
    let kept = common::files_with(&sessions, "jsonl").iter().any(|file| {
        std::fs::read_to_string(file).is_ok_and(|text| text.contains("edge-compaction-v1."))
    });
    assert!(
        kept,
        "no compaction item in Codex's session files under {}",
        sessions.display()
    );
    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_set_up_by_the_edge_knows_the_models_window() {
    let stack = Stack::start().await;
    const NOTICE: &str = "doesn't recognize the model";
    // As a new user starts it: Claude Code guesses a window of its own, and says so.
    let bare = stack.claude(&["-p", "Say hello", "--model", MODEL]).await;
    assert!(
        bare.contains(NOTICE),
        "the notice is printed where this test looks: {bare}"
    );
    // With what `edge agent-setup` prints, it takes the window the nodes reported.
    let set_up = stack.claude_as_set_up(&["-p", "Say hello"]).await;
    assert!(!set_up.contains(NOTICE), "{set_up}");
    stack.stop().await;
}

#[crate::common::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_compacts_when_the_engine_says_the_prompt_is_too_long() {
    // Claude Code's own prompt is about 4,300 tokens of the tiny model's: an 8k window holds
    // one long turn, not two.
    let stack = Stack::start_with_context(8_192).await;
    let long = |topic: &str| {
        format!("Remember this about {topic}: the quick brown fox jumps over the lazy dog. ")
            .repeat(200)
    };
    stack
        .claude(&["-p", &long("foxes"), "--model", MODEL])
        .await;
    let second = stack
        .claude(&["-p", &long("dogs"), "--continue", "--model", MODEL])
        .await;
    // The engine refused the whole conversation; Claude Code read the sizes, compacted it,
    // and answered the turn (`turn` asserts the answer).
    let runs = stack.runs_json().await;
    let summary: Vec<(&Value, &Value)> = runs
        .iter()
        .map(|run| (&run["outcome"], &run["code"]))
        .collect();
    let refused = runs
        .iter()
        .position(|run| run["outcome"] == "failed" && run["code"] == "context_length_exceeded");
    // Newest first: the refusal, then (above it) the compaction and the answer.
    assert!(
        matches!(refused, Some(at) if at >= 2) && runs[0]["outcome"] == "completed",
        "{summary:?}\n{second}"
    );
    stack.stop().await;
}
