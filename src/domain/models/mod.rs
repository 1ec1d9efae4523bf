//! The model lifecycle's pure core: what a managed engine holds ([`LoadState`],
//! [`ManagedAdapter`]), the operator's desired state ([`ModelPolicy`]), and the decisions —
//! where a model is loaded, which idle models make room, what reconciling the desired state
//! takes ([`plan`]) — by count and, where footprints and budgets are known, by fit
//! (`fit.rs`), and which `[[models]]` entries cannot be met (`unmet.rs`).

mod fit;
pub mod plan;
mod state;
#[cfg(test)]
mod tests;
mod unmet;

pub use fit::{
    Budget, Candidate, FitNote, Footprint, FootprintSource, MODEL_TOO_LARGE, TooLarge,
    fewest_evictions,
};
pub use plan::{
    Engine, LoadReason, NoPlace, Placement, Slot, Step, UnloadReason, place_load, plan_cold,
    reconcile, too_large,
};
pub use state::{
    LoadState, ManagedAdapter, ModelAction, ModelName, ModelNameError, ModelPolicy, TargetLoad,
};
pub use unmet::{Unmet, unmet};
