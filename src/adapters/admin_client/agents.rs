//! `edge agent-setup MODEL`: what to paste to point Claude Code or the Codex CLI at a model
//! the edge serves, with the context window its nodes reported (`GET /v1/models`), so the
//! agent knows the window, compacts before the engine refuses the prompt, and says nothing
//! of an unknown model. Keys are never printed: the settings name `$EDGE_API_KEY`.

use std::path::PathBuf;

use clap::Args;
use serde::Deserialize;

use super::http::{AdminClient, Listener};
use super::{AdminCommandError, emit};

/// Codex compacts at this share of the window (its own cap is 90 %).
const CODEX_COMPACT_PERCENT: u64 = 90;

/// `edge agent-setup`.
#[derive(Debug, Args)]
pub struct AgentSetupArgs {
    /// The model as clients name it (`ADAPTER/TARGET`, or an `[api.models]` alias).
    model: String,
    /// Which agent's settings: `claude`, `codex` or `both`.
    #[arg(long = "for", default_value = "both", value_parser = ["claude", "codex", "both"])]
    agent: String,
    /// The edge's API URL, as the agent will call it.
    #[arg(
        long = "api",
        env = "EDGE_API_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    url: String,
    /// An `[api]` key, when the API has keys (prefer the environment: a flag shows in the
    /// process list).
    #[arg(long = "api-key", env = "EDGE_API_KEY", hide_env_values = true)]
    key: Option<String>,
    /// The CA certificate (PEM) that signed an HTTPS API listener's certificate.
    #[arg(long = "api-cacert", env = "EDGE_API_CACERT")]
    cacert: Option<PathBuf>,
    /// The window to write when no node reported one (tokens).
    #[arg(long)]
    context_window: Option<u32>,
}

/// The part of `GET /v1/models` read here.
#[derive(Deserialize)]
struct Models {
    data: Vec<Model>,
}

#[derive(Deserialize)]
struct Model {
    id: String,
    #[serde(default)]
    context_window: Option<u32>,
}

/// Prints the settings for `args.model`.
///
/// # Errors
/// [`AdminCommandError::Client`] when the API cannot be reached or refused,
/// [`AdminCommandError::NotServed`] when no connected node serves the model,
/// [`AdminCommandError::NoWindow`] when no window is known and none was given,
/// [`AdminCommandError::Output`] when standard output is closed.
pub async fn agent_setup(args: AgentSetupArgs) -> Result<(), AdminCommandError> {
    let client = AdminClient::to(Listener::Api, &args.url, args.key, args.cacert.as_deref())?;
    let models: Models = client.get("/v1/models").await?;
    let Some(model) = models.data.into_iter().find(|m| m.id == args.model) else {
        return Err(AdminCommandError::NotServed { model: args.model });
    };
    let Some(window) = model.context_window.or(args.context_window) else {
        return Err(AdminCommandError::NoWindow { model: model.id });
    };
    let base = args.url.trim_end_matches('/');
    let mut text = String::new();
    if args.agent != "codex" {
        text.push_str(&claude_code(base, &model.id, window));
    }
    if args.agent == "both" {
        text.push('\n');
    }
    if args.agent != "claude" {
        text.push_str(&codex(base, &model.id, window));
    }
    emit(text.trim_end())
}

/// Claude Code's environment: the edge as its Anthropic API, `model` for every request
/// (its background tasks' too), and `window` as the model's context window (which also
/// silences its unknown-model notice).
fn claude_code(base: &str, model: &str, window: u32) -> String {
    format!(
        "# Claude Code: paste into the shell that starts `claude`.\n\
         export ANTHROPIC_BASE_URL={base}\n\
         export ANTHROPIC_API_KEY=\"$EDGE_API_KEY\"\n\
         export ANTHROPIC_MODEL={model}\n\
         export ANTHROPIC_DEFAULT_HAIKU_MODEL={model}\n\
         export CLAUDE_CODE_MAX_CONTEXT_TOKENS={window}\n"
    )
}

/// Codex's `config.toml`: a Responses provider at the edge's `/v1`, `model` and its window,
/// compacting at [`CODEX_COMPACT_PERCENT`] of it.
fn codex(base: &str, model: &str, window: u32) -> String {
    let limit = u64::from(window) * CODEX_COMPACT_PERCENT / 100;
    format!(
        "# Codex: add to ~/.codex/config.toml (the key is read from $EDGE_API_KEY).\n\
         model = \"{model}\"\n\
         model_provider = \"edge\"\n\
         model_context_window = {window}\n\
         model_auto_compact_token_limit = {limit}\n\
         \n\
         [model_providers.edge]\n\
         name = \"edge\"\n\
         base_url = \"{base}/v1\"\n\
         env_key = \"EDGE_API_KEY\"\n\
         wire_api = \"responses\"\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_code_gets_the_window_and_the_model_for_everything() {
        let text = claude_code("http://gpu-box:8080", "llama/qwen", 32_768);
        for line in [
            "export ANTHROPIC_BASE_URL=http://gpu-box:8080",
            "export ANTHROPIC_MODEL=llama/qwen",
            "export ANTHROPIC_DEFAULT_HAIKU_MODEL=llama/qwen",
            "export CLAUDE_CODE_MAX_CONTEXT_TOKENS=32768",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
        }
    }

    #[test]
    fn codex_gets_a_responses_provider_with_the_window() {
        let text = codex("http://gpu-box:8080", "llama/qwen", 32_768);
        let config = config::Config::builder()
            .add_source(config::File::from_str(&text, config::FileFormat::Toml))
            .build()
            .expect("valid TOML");
        let string = |key: &str| config.get_string(key).expect(key);
        let number = |key: &str| config.get_int(key).expect(key);
        assert_eq!(string("model"), "llama/qwen");
        assert_eq!(number("model_context_window"), 32_768);
        assert_eq!(number("model_auto_compact_token_limit"), 29_491);
        assert_eq!(
            string("model_providers.edge.base_url"),
            "http://gpu-box:8080/v1"
        );
        assert_eq!(string("model_providers.edge.wire_api"), "responses");
    }
}
