//! Real engines for the scenarios that need them (`affinity`, `latency`, `sessions`): `llama-server`
//! children serving one GGUF model as `tiny`, the edge config that puts a reference node in
//! front of each, and the wait until the edge serves the model through them.

use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use crate::harness::{http_get, metric, token};

/// A `llama-server` child, killed on drop.
pub struct Engine {
    child: Child,
    pub addr: SocketAddr,
}

impl Engine {
    /// Starts `llama_server` serving `model` as `tiny` with `slots` slots of 8,192 tokens,
    /// one thread, on a free loopback port, and waits until it is healthy. With `loras`, it
    /// loads each (`--lora`, ids in this order) without applying any
    /// (`--lora-init-without-apply`).
    pub fn start(
        llama_server: &Path,
        model: &Path,
        slots: u32,
        loras: &[PathBuf],
    ) -> anyhow::Result<Self> {
        let mut extra: Vec<OsString> = Vec::new();
        for lora in loras {
            extra.extend(["--lora".into(), lora.into()]);
        }
        if !loras.is_empty() {
            extra.push("--lora-init-without-apply".into());
        }
        Self::start_with(llama_server, model, slots, &extra)
    }

    /// [`Self::start`] without LoRAs, with `extra` arguments for `llama-server` after the
    /// usual ones (a later one overrides an earlier, as `--ctx-size` may).
    pub fn start_with(
        llama_server: &Path,
        model: &Path,
        slots: u32,
        extra: &[impl AsRef<OsStr>],
    ) -> anyhow::Result<Self> {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let context = (8_192 * slots).to_string();
        let child = Command::new(llama_server)
            .arg("--model")
            .arg(model)
            .args(["--alias", "tiny", "--host", "127.0.0.1", "--port"])
            .arg(addr.port().to_string())
            .args(["--ctx-size", &context, "--parallel", &slots.to_string()])
            .args(["--threads", "1", "--threads-batch", "1", "--metrics"])
            .args(["--no-warmup", "--no-webui"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start llama-server")?;
        let mut engine = Self { child, addr };
        wait_healthy(addr, "/health", &mut engine.child)?;
        Ok(engine)
    }

    /// (prompt tokens evaluated, prompt tokens reused from the cache) so far.
    pub fn counters(&self) -> anyhow::Result<(f64, f64)> {
        let text = http_get(self.addr, "/metrics")?;
        let read = |name| metric(&text, name, "").with_context(|| format!("no {name}"));
        Ok((
            read("llamacpp:prompt_tokens_total")?,
            read("llamacpp:prompt_tokens_cached_total")?,
        ))
    }
}

impl Engine {
    /// Kills the engine (`SIGKILL`) and waits for it: an engine that dies.
    pub fn kill(&mut self) {
        // Only the child this struct started.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits up to 60 s for `GET path` on `addr` to answer 200, while `child` runs.
pub fn wait_healthy(addr: SocketAddr, path: &str, child: &mut Child) -> anyhow::Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        if let Some(status) = child.try_wait()? {
            bail!("the child serving {addr} exited with {status}");
        }
        if http_get(addr, path).is_ok_and(|r| r.starts_with("HTTP/1.1 200")) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{addr} did not answer {path} within 60 s")
}

/// An edge config with `extra` sections first and one node definition (`box-{i}`, token
/// [`token`]`(i)`) per engine address, each with a `llama` adapter serving `tiny` there.
pub fn edge_config(engines: &[SocketAddr], extra: &str) -> String {
    let mut toml = extra.to_owned();
    for (i, addr) in engines.iter().enumerate() {
        toml.push_str(&format!(
            "[[nodes]]\nid = \"box-{i}\"\nalias = \"box-{i}\"\ntoken = \"{}\"\n\
             [nodes.runtime]\nmax_concurrent_runs = 8\nheartbeat_interval_ms = 1000\n\
             [[nodes.adapters]]\nname = \"llama\"\ntargets = [\"tiny\"]\n\
             [nodes.adapters.settings]\nbase_url = \"http://{addr}/v1\"\navailability = \"reachable\"\n\n",
            token(i),
        ));
    }
    toml
}

/// Waits until the edge lists `llama/tiny` (a node serving it has registered).
pub async fn wait_serving(http: SocketAddr) -> anyhow::Result<()> {
    wait_listed(http, "llama/tiny").await
}

/// Waits until the edge lists `model` (a node serving it has registered, or reported it).
pub async fn wait_listed(http: SocketAddr, model: &str) -> anyhow::Result<()> {
    let quoted = format!("\"{model}\"");
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        let models = tokio::task::spawn_blocking(move || http_get(http, "/v1/models")).await??;
        if models.contains(&quoted) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the edge did not list {model} within 30 s")
}
