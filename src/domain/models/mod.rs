//! The model lifecycle's pure core: what a managed engine holds ([`LoadState`],
//! [`ManagedAdapter`]), the operator's desired state ([`ModelPolicy`]), and the decisions —
//! where a model is loaded, which idle model makes room, what reconciling the desired state
//! takes ([`plan`]).

pub mod plan;
mod state;
#[cfg(test)]
mod tests;

pub use plan::{
    Engine, LoadReason, NoPlace, Placement, Slot, Step, UnloadReason, place_load, plan_cold,
    reconcile,
};
pub use state::{
    LoadState, ManagedAdapter, ModelAction, ModelName, ModelNameError, ModelPolicy, TargetLoad,
};
