//! The LoRAs of an `openai` adapter's engine (protocol v1.6, docs/node.md "LoRAs"): found,
//! reported to the edge, and applied to the runs that name one.
//!
//! - **llama.cpp's `llama-server`** ([`llama`]): with no setting, an engine that answers
//!   `GET /lora-adapters` has the LoRAs it lists, each named by its file's stem, a LoRA of
//!   the adapter's (first) target and always loaded. Every run names every LoRA's scale —
//!   its own at 1, the others at 0, all at 0 for the base — since the engine applies every
//!   LoRA to a request that names none.
//! - **vLLM** ([`vllm`], `lora_dir` or `lora_dir.<target>`): each folder of the directory is
//!   a LoRA of that target, loadable; one the server lists is registered (loaded). A run of
//!   an unregistered LoRA registers it first (one registration at a time), then names it as
//!   its `model`. With `max_registered`, the least recently used LoRAs with no run in flight
//!   are unregistered to stay within it (before a registration, and at every probe).
//!
//! The table is refreshed by the adapter's prober ([`Loras::refresh`]); each LoRA's weights
//! are hashed ([`digest`]) once per change. What it holds is put on the availability board
//! whenever it changes, so the edge hears of a registration at once.

pub mod digest;
pub mod llama;
pub mod vllm;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use edge::client::RunAssignment;
use edge::domain::{FailureClass, LoraFile, LoraName, LoraState, NodeLora, RunEventKind, Target};
use serde_json::Value;

use super::engine_models::BeginError;
use super::request::{Endpoint, UpstreamCall};
use crate::board::Board;
use crate::fault::UpstreamFault;
use crate::upstream::Upstream;

/// Where an adapter's LoRAs come from.
#[derive(Debug)]
pub enum Source {
    /// llama-server's `GET /lora-adapters`, LoRAs of `base`.
    LlamaServer {
        /// The engine.
        upstream: Upstream,
        /// The target its LoRAs are fine-tunes of.
        base: String,
    },
    /// vLLM: per target, the folder of its LoRAs and its server.
    Vllm {
        /// `(target, folder, server)`.
        dirs: Vec<(String, PathBuf, Upstream)>,
        /// How many may stay registered on one server (`max_registered`).
        max_registered: Option<u32>,
    },
}

/// One LoRA of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    /// The target it is a fine-tune of.
    base: String,
    /// Its weights.
    path: String,
    sha256: Option<String>,
    /// llama-server's id for it.
    id: u64,
    /// Registered (vLLM) or loaded (llama-server).
    loaded: bool,
    /// Its runs in flight.
    in_flight: u32,
    /// When it was last used, in uses of the table.
    last_used: u64,
}

#[derive(Debug, Default)]
struct Table {
    entries: BTreeMap<String, Entry>,
    /// Advanced at each use: the order of last uses.
    uses: u64,
    /// Each path's stamp and digest, as last hashed.
    digests: BTreeMap<String, (Option<digest::Stamp>, Option<String>)>,
}

/// The LoRAs of one adapter's engine.
#[derive(Debug)]
pub struct Loras {
    adapter: String,
    source: Option<Source>,
    table: Arc<Mutex<Table>>,
    /// One registration or unregistration at a time.
    registering: tokio::sync::Mutex<()>,
    /// llama-server answered `GET /lora-adapters` with 404: not asked again.
    absent: AtomicBool,
    /// Where the table is reported, once the adapter is on the node's board.
    board: OnceLock<Board>,
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A run of a LoRA in flight: it is not unregistered meanwhile.
#[derive(Debug)]
pub struct InFlight {
    table: Arc<Mutex<Table>>,
    name: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut table = lock(&self.table);
        table.uses += 1;
        let uses = table.uses;
        if let Some(entry) = table.entries.get_mut(&self.name) {
            entry.in_flight = entry.in_flight.saturating_sub(1);
            entry.last_used = uses;
        }
    }
}

impl Loras {
    /// The LoRAs of `adapter`'s engine, found from `source` (`None`: it has none).
    pub fn new(adapter: &str, source: Option<Source>) -> Self {
        Self {
            adapter: adapter.to_owned(),
            source,
            table: Arc::default(),
            registering: tokio::sync::Mutex::new(()),
            absent: AtomicBool::new(false),
            board: OnceLock::new(),
        }
    }

    /// Reports the table to `board` from now on.
    pub fn report_to(&self, board: Board) {
        let _ = self.board.set(board);
        self.publish();
    }

    /// The LoRAs as the edge is told of them.
    pub fn report(&self) -> Vec<NodeLora> {
        lock(&self.table)
            .entries
            .iter()
            .filter_map(|(name, entry)| {
                Some(NodeLora {
                    name: LoraName::parse(name).ok()?,
                    base: Target::parse(&entry.base).ok()?,
                    file: LoraFile {
                        path: entry.path.clone(),
                        sha256: entry.sha256.clone(),
                    },
                    state: if entry.loaded {
                        LoraState::Loaded
                    } else {
                        LoraState::Loadable
                    },
                })
            })
            .collect()
    }

    fn publish(&self) {
        if let Some(board) = self.board.get() {
            board.set_loras(&self.adapter, self.report());
        }
    }

    /// Looks at the engine's LoRAs again (the prober, every probe): the table becomes what
    /// it found, runs in flight and last uses kept; vLLM's registered LoRAs past
    /// `max_registered` are unregistered. An engine that cannot be asked keeps the table.
    pub async fn refresh(&self) {
        let _one = self.registering.lock().await;
        let found = match &self.source {
            None => return,
            Some(Source::LlamaServer { upstream, base }) => self.llama_loras(upstream, base).await,
            Some(Source::Vllm { dirs, .. }) => Some(self.vllm_loras(dirs).await),
        };
        let Some(found) = found else {
            return;
        };
        let found = self.with_digests(found).await;
        if self.take(found) {
            self.publish();
        }
        if let Some(Source::Vllm {
            dirs,
            max_registered: Some(max),
        }) = &self.source
        {
            for (target, _, server) in dirs {
                self.make_room(server, target, *max + 1).await;
            }
        }
    }

    /// What llama-server lists; `None` when it cannot be asked (an engine without the
    /// route has none, and is not asked again).
    async fn llama_loras(
        &self,
        upstream: &Upstream,
        base: &str,
    ) -> Option<BTreeMap<String, Entry>> {
        if self.absent.load(Ordering::Relaxed) {
            return Some(BTreeMap::new());
        }
        let body = match upstream.get_root("/lora-adapters").await {
            Ok(body) => body,
            Err(UpstreamFault::Status { status: 404, .. }) => {
                self.absent.store(true, Ordering::Relaxed);
                return Some(BTreeMap::new());
            }
            Err(_) => return None,
        };
        let (listed, left_out) = llama::listed(&body);
        for problem in left_out {
            tracing::debug!(adapter = %self.adapter, %problem, "a LoRA of llama-server is left out");
        }
        let entries = listed.into_iter().map(|lora| {
            let entry = Entry::new(base, lora.path, true);
            (
                lora.name,
                Entry {
                    id: lora.id,
                    ..entry
                },
            )
        });
        Some(entries.collect())
    }

    /// The folders of each target's `lora_dir`, registered where the target's server lists
    /// them; a server that cannot be asked keeps what the table says of its LoRAs.
    async fn vllm_loras(&self, dirs: &[(String, PathBuf, Upstream)]) -> BTreeMap<String, Entry> {
        let mut found = BTreeMap::new();
        for (target, dir, server) in dirs {
            let registered = match server.get_root("/v1/models").await {
                Ok(body) => vllm::registered(&body),
                Err(_) => lock(&self.table)
                    .entries
                    .iter()
                    .filter(|(_, e)| &e.base == target && e.loaded)
                    .map(|(name, e)| (name.clone(), e.path.clone()))
                    .collect(),
            };
            for (name, folder) in vllm::folders(dir) {
                let loaded = registered.contains_key(&name);
                let path = folder.to_string_lossy().into_owned();
                found
                    .entry(name)
                    .or_insert_with(|| Entry::new(target, path, loaded));
            }
            for (name, root) in registered {
                found
                    .entry(name)
                    .or_insert_with(|| Entry::new(target, root, true));
            }
        }
        found
    }

    /// `found` with each path's digest: the one the table has while the path's stamp is
    /// unchanged, else hashed anew (off the runtime's threads).
    async fn with_digests(&self, mut found: BTreeMap<String, Entry>) -> BTreeMap<String, Entry> {
        let known = lock(&self.table).digests.clone();
        let paths: Vec<String> = found.values().map(|entry| entry.path.clone()).collect();
        let hashed = tokio::task::spawn_blocking(move || {
            paths
                .into_iter()
                .map(|path| {
                    let stamp = digest::stamp(Path::new(&path));
                    let sha256 = match known.get(&path) {
                        Some((seen, sha256)) if stamp.is_some() && *seen == stamp => sha256.clone(),
                        _ => stamp.and_then(|_| digest::sha256(Path::new(&path))),
                    };
                    (path, (stamp, sha256))
                })
                .collect::<BTreeMap<_, _>>()
        })
        .await
        .unwrap_or_default();
        for entry in found.values_mut() {
            entry.sha256 = hashed.get(&entry.path).and_then(|(_, sha)| sha.clone());
        }
        lock(&self.table).digests = hashed;
        found
    }

    /// Makes `found` the table, keeping each LoRA's runs in flight and last use; returns
    /// whether that changed what the edge is told.
    fn take(&self, mut found: BTreeMap<String, Entry>) -> bool {
        let mut table = lock(&self.table);
        for (name, entry) in &mut found {
            if let Some(old) = table.entries.get(name) {
                entry.in_flight = old.in_flight;
                entry.last_used = old.last_used;
            }
        }
        let changed = table.entries != found;
        table.entries = found;
        changed
    }

    /// Prepares `call`, the engine request of `run`, for its LoRA (or for none): returns
    /// what holds the LoRA registered while the run is in flight.
    ///
    /// # Errors
    /// The run's failure: `lora_not_available` (class `REFUSED`: another node may have it)
    /// for a LoRA the node does not have, `lora_load_failed` (class `NODE`) when vLLM did not
    /// register it, `not_supported` for llama-server embeddings of a LoRA.
    pub async fn prepare(
        &self,
        run: &RunAssignment,
        call: &mut UpstreamCall,
    ) -> Result<Option<InFlight>, RunEventKind> {
        match (&self.source, &run.lora) {
            (Some(Source::LlamaServer { .. }), _) => self.llama_scales(run, call).map(|()| None),
            (
                Some(Source::Vllm {
                    dirs,
                    max_registered,
                }),
                Some(lora),
            ) => {
                let server = dirs
                    .iter()
                    .find(|(target, ..)| target == run.target.as_str());
                let Some((_, _, server)) = server else {
                    return Err(not_here(&self.adapter, run, lora));
                };
                let held = self.registered(server, *max_registered, run, lora).await?;
                if let Value::Object(body) = &mut call.body {
                    body.insert("model".into(), Value::String(lora.to_string()));
                }
                Ok(Some(held))
            }
            (_, None) => Ok(None),
            (None, Some(lora)) => Err(not_here(&self.adapter, run, lora)),
        }
    }

    /// Names every LoRA's scale in `call`: the run's at 1, every other at 0.
    fn llama_scales(
        &self,
        run: &RunAssignment,
        call: &mut UpstreamCall,
    ) -> Result<(), RunEventKind> {
        let table = lock(&self.table);
        let chosen = match &run.lora {
            None => None,
            Some(_) if call.endpoint == Endpoint::Embeddings => {
                return Err(failed(
                    "not_supported",
                    "llama-server applies no LoRA to embeddings (its embeddings read no `lora`)"
                        .into(),
                    FailureClass::Request,
                    Some(501),
                ));
            }
            Some(lora) => {
                let entry = table.entries.get(lora.as_str());
                let entry = entry.filter(|e| e.base == run.target.as_str());
                Some(entry.ok_or_else(|| not_here(&self.adapter, run, lora))?.id)
            }
        };
        if !table.entries.is_empty()
            && let Value::Object(body) = &mut call.body
        {
            let ids = table.entries.values().map(|entry| entry.id);
            body.insert("lora".into(), llama::scales(ids, chosen));
        }
        Ok(())
    }

    /// Holds `lora` for `run` and registers it on `server` first if it is not, making room
    /// within `max_registered`.
    async fn registered(
        &self,
        server: &Upstream,
        max_registered: Option<u32>,
        run: &RunAssignment,
        lora: &LoraName,
    ) -> Result<InFlight, RunEventKind> {
        let name = lora.as_str();
        let path = {
            let mut table = lock(&self.table);
            let entry = table.entries.get_mut(name);
            let entry = entry.filter(|e| e.base == run.target.as_str());
            let entry = entry.ok_or_else(|| not_here(&self.adapter, run, lora))?;
            entry.in_flight += 1;
            entry.path.clone()
        };
        let held = InFlight {
            table: Arc::clone(&self.table),
            name: name.to_owned(),
        };
        if self.is_loaded(name) {
            return Ok(held);
        }
        let _one = self.registering.lock().await;
        if self.is_loaded(name) {
            return Ok(held);
        }
        if let Some(max) = max_registered {
            self.make_room(server, run.target.as_str(), max).await;
        }
        vllm::register(server, name, &path).await.map_err(|error| {
            let status = match &error {
                BeginError::Refused { status, .. } => Some(*status),
                _ => None,
            };
            let message = format!("vLLM did not register the LoRA {name} from {path}: {error}");
            failed("lora_load_failed", message, FailureClass::Node, status)
        })?;
        self.set_loaded(name, true);
        tracing::info!(adapter = %self.adapter, lora = name, %path, "LoRA registered with vLLM");
        Ok(held)
    }

    fn is_loaded(&self, name: &str) -> bool {
        lock(&self.table)
            .entries
            .get(name)
            .is_some_and(|e| e.loaded)
    }

    fn set_loaded(&self, name: &str, loaded: bool) {
        if let Some(entry) = lock(&self.table).entries.get_mut(name) {
            entry.loaded = loaded;
        }
        self.publish();
    }

    /// Unregisters the least recently used LoRAs of `target` with no run in flight from
    /// `server` while `below` or more are registered there (fewer when every one left is in
    /// flight). Called with the registration lock held.
    async fn make_room(&self, server: &Upstream, target: &str, below: u32) {
        loop {
            let victim = {
                let mut table = lock(&self.table);
                let ours = |e: &Entry| e.base == target && e.loaded;
                let registered = table.entries.values().filter(|e| ours(e)).count();
                if u32::try_from(registered).unwrap_or(u32::MAX) < below {
                    return;
                }
                let idle = table
                    .entries
                    .iter_mut()
                    .filter(|(_, e)| ours(e) && e.in_flight == 0);
                let Some((name, entry)) = idle.min_by_key(|(_, e)| e.last_used) else {
                    return;
                };
                // Taken out before it goes: a run from now on registers it again.
                entry.loaded = false;
                name.clone()
            };
            self.publish();
            match vllm::unregister(server, &victim).await {
                Ok(()) => {
                    tracing::info!(adapter = %self.adapter, lora = %victim, "LoRA unregistered from vLLM (max_registered)")
                }
                Err(error) => {
                    tracing::warn!(adapter = %self.adapter, lora = %victim, %error, "vLLM did not unregister a LoRA");
                    return;
                }
            }
        }
    }
}

impl Entry {
    fn new(base: &str, path: String, loaded: bool) -> Self {
        Self {
            base: base.to_owned(),
            path,
            sha256: None,
            id: 0,
            loaded,
            in_flight: 0,
            last_used: 0,
        }
    }
}

/// The failure of a run of a LoRA this node does not have (its report was older than the
/// run): refused, so the edge tries another node.
fn not_here(adapter: &str, run: &RunAssignment, lora: &LoraName) -> RunEventKind {
    let message = format!(
        "adapter {adapter} has no LoRA {lora} of {} (its LoRAs changed)",
        run.target
    );
    failed("lora_not_available", message, FailureClass::Refused, None)
}

fn failed(code: &str, message: String, class: FailureClass, status: Option<u16>) -> RunEventKind {
    RunEventKind::Failed {
        context_window: None,
        code: code.into(),
        message,
        class,
        status,
        usage: None,
    }
}
