//! The management API's JSON shapes of hardware and fit: a node's devices, a managed
//! adapter's budget and room, a model's footprint, and what a load found (its footprint and
//! the room). Used by `views.rs` in the node and model views, and by the `edge` commands.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::domain::models::{FitNote, Footprint, ManagedAdapter};
use crate::domain::{Device, Inventory};

/// A node's devices, as it last reported them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct InventoryView {
    /// Its devices, by index: each GPU NVML lists, or the machine's memory as one device.
    pub devices: Vec<DeviceView>,
}

/// One device of a node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct DeviceView {
    /// Its index (what an adapter's `devices` setting names).
    pub index: u32,
    /// `gpu` or `memory` (the machine's memory, on a node without a GPU).
    pub kind: String,
    /// Its name.
    pub name: String,
    /// Its memory, in bytes.
    pub total_bytes: u64,
    /// How much of it anything on the machine used when the node last measured, in bytes.
    pub used_bytes: u64,
}

/// A managed adapter's budget on its node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct BudgetView {
    /// What it may use for models, in bytes.
    pub bytes: u64,
    /// The node's devices it uses, by index.
    pub devices: Vec<u32>,
    /// The budget less the footprints of what it holds now, in bytes.
    pub room_bytes: u64,
}

/// A model's memory once loaded, as its node derived it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FootprintView {
    /// All of it, in bytes: what placement counts.
    pub bytes: u64,
    /// Of which its weights (0: not known apart).
    pub weights_bytes: u64,
    /// Of which its KV cache at `context` (0: not known apart).
    pub kv_cache_bytes: u64,
    /// Of which the engine's overhead (0: not known apart).
    pub overhead_bytes: u64,
    /// The context, in tokens, the KV cache was sized for (0: not known).
    pub context: u32,
    /// How it was derived: `gguf`, `ollama_file`, `ollama_loaded`, `vllm_share`, `setting`.
    pub source: String,
}

/// What a load found on its node: the model's footprint, and the room before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct FitView {
    /// The model's footprint there, in bytes.
    pub footprint_bytes: u64,
    /// The adapter's budget there, in bytes.
    pub budget_bytes: u64,
    /// The budget less the footprints it held, before the load and its unloads, in bytes.
    pub room_bytes: u64,
}

impl InventoryView {
    /// The view of `inventory`.
    pub fn of(inventory: &Inventory) -> Self {
        Self {
            devices: inventory.devices.iter().map(DeviceView::of).collect(),
        }
    }
}

impl DeviceView {
    fn of(device: &Device) -> Self {
        Self {
            index: device.index,
            kind: device.kind.as_str().to_owned(),
            name: device.name.clone(),
            total_bytes: device.total_bytes,
            used_bytes: device.used_bytes,
        }
    }
}

impl BudgetView {
    /// The budget of `adapter`, when it has one, with its room now.
    pub fn of(adapter: &ManagedAdapter) -> Option<Self> {
        let budget = adapter.budget.as_ref()?;
        Some(Self {
            bytes: budget.bytes,
            devices: budget.devices.clone(),
            room_bytes: adapter.room()?,
        })
    }
}

impl FootprintView {
    /// The view of `footprint`.
    pub fn of(footprint: &Footprint) -> Self {
        Self {
            bytes: footprint.bytes,
            weights_bytes: footprint.weights,
            kv_cache_bytes: footprint.kv_cache,
            overhead_bytes: footprint.overhead,
            context: footprint.context,
            source: footprint.source.as_str().to_owned(),
        }
    }
}

impl FitView {
    /// The view of `note`.
    pub fn of(note: &FitNote) -> Self {
        Self {
            footprint_bytes: note.footprint,
            budget_bytes: note.budget,
            room_bytes: note.room,
        }
    }
}
