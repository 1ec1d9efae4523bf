//! The model lifecycle on the wire: a managed adapter's target states in an availability
//! report, `ModelCommand` and `ModelOutcome`.

use crate::domain::models::{LoadState, ManagedAdapter, ModelAction, ModelName, TargetLoad};
use crate::domain::{AdapterName, Availability, Target};
use crate::ports::{ModelCommand, ModelOutcome};

use super::fit::{budget_from_wire, footprint_from_wire, footprint_to_wire};
use super::proto;

/// One `AdapterTargets` entry as the edge reads it.
pub(super) struct AdapterReport {
    /// The targets it serves now.
    pub targets: Vec<Target>,
    /// The context windows its states gave, by target.
    pub windows: Vec<(Target, u32)>,
    /// When the adapter is managed: its capacity and every target's state.
    pub managed: Option<ManagedAdapter>,
}

/// Reads one entry; invalid target names are left out. A managed adapter's listed target
/// whose state says nothing of its load is loaded; an unloaded one marked `asleep` (v1.5) is
/// [`LoadState::Asleep`].
pub(super) fn adapter_from_wire(entry: proto::AdapterTargets) -> AdapterReport {
    let proto::AdapterTargets {
        adapter: _,
        targets,
        states,
        managed,
        capacity,
        parallel,
        budget_bytes,
        devices,
    } = entry;
    let targets: Vec<Target> = targets
        .iter()
        .filter_map(|t| Target::parse(t).ok())
        .collect();
    let mut windows = Vec::new();
    let mut lifecycle = ManagedAdapter {
        capacity,
        parallel,
        budget: budget_from_wire(budget_bytes, devices),
        targets: targets
            .iter()
            .map(|t| (t.clone(), TargetLoad::new(LoadState::Loaded)))
            .collect(),
    };
    for state in states {
        let Some((target, load, load_is_said)) = target_from_wire(state) else {
            continue;
        };
        if load.context_window > 0 {
            windows.push((target.clone(), load.context_window));
        }
        if load_is_said {
            lifecycle.targets.insert(target, load);
        }
    }
    AdapterReport {
        targets,
        windows,
        managed: managed.then_some(lifecycle),
    }
}

/// One `TargetState`: its target (`None` for an invalid name) and what it says; a state that
/// says nothing of the load is taken as loaded.
fn target_from_wire(state: proto::TargetState) -> Option<(Target, TargetLoad, bool)> {
    let proto::TargetState {
        target,
        context_window,
        load,
        load_progress,
        failure,
        asleep,
        stays_loaded,
        footprint,
    } = state;
    let target = Target::parse(&target).ok()?;
    let said = load_from_wire(load);
    let state = match said.unwrap_or(LoadState::Loaded) {
        LoadState::Unloaded if asleep => LoadState::Asleep,
        state => state,
    };
    let load = TargetLoad {
        state,
        progress_percent: (load_progress.clamp(0.0, 1.0) * 100.0).round() as u8,
        failure,
        context_window,
        stays_loaded,
        footprint: footprint.and_then(footprint_from_wire),
    };
    Some((target, load, said.is_some()))
}

/// Fills `entry`'s states (windows of its listed targets; a managed adapter's flag,
/// capacity and every target's load state) from `availability`.
pub(super) fn states_to_wire(entry: &mut proto::AdapterTargets, availability: &Availability) {
    let Ok(adapter) = AdapterName::parse(&entry.adapter) else {
        return;
    };
    for name in &entry.targets {
        let window = Target::parse(name)
            .ok()
            .and_then(|t| availability.context_window(&adapter, &t));
        if let Some(context_window) = window {
            entry.states.push(proto::TargetState {
                target: name.clone(),
                context_window,
                ..proto::TargetState::default()
            });
        }
    }
    let Some(managed) = availability.managed(&adapter) else {
        return;
    };
    entry.managed = true;
    entry.capacity = managed.capacity;
    entry.parallel = managed.parallel;
    if let Some(budget) = &managed.budget {
        entry.budget_bytes = budget.bytes;
        entry.devices.clone_from(&budget.devices);
    }
    for (target, load) in &managed.targets {
        let index = match entry
            .states
            .iter()
            .position(|s| s.target == target.as_str())
        {
            Some(index) => index,
            None => {
                entry.states.push(proto::TargetState {
                    target: target.to_string(),
                    ..proto::TargetState::default()
                });
                entry.states.len() - 1
            }
        };
        let state = &mut entry.states[index];
        state.load = load_to_wire(load.state).into();
        state.load_progress = f32::from(load.progress_percent) / 100.0;
        state.failure.clone_from(&load.failure);
        state.asleep = load.state == LoadState::Asleep;
        state.stays_loaded = load.stays_loaded;
        state.footprint = load.footprint.map(footprint_to_wire);
        if state.context_window == 0 {
            state.context_window = load.context_window;
        }
    }
}

fn load_from_wire(load: i32) -> Option<LoadState> {
    match proto::ModelLoad::try_from(load).ok()? {
        proto::ModelLoad::Unspecified => None,
        proto::ModelLoad::Loaded => Some(LoadState::Loaded),
        proto::ModelLoad::Loading => Some(LoadState::Loading),
        proto::ModelLoad::Unloaded => Some(LoadState::Unloaded),
        proto::ModelLoad::Sleeping => Some(LoadState::Sleeping),
        proto::ModelLoad::Failed => Some(LoadState::Failed),
    }
}

fn load_to_wire(state: LoadState) -> proto::ModelLoad {
    match state {
        LoadState::Loaded => proto::ModelLoad::Loaded,
        LoadState::Loading => proto::ModelLoad::Loading,
        LoadState::Unloaded => proto::ModelLoad::Unloaded,
        LoadState::Sleeping => proto::ModelLoad::Sleeping,
        LoadState::Failed => proto::ModelLoad::Failed,
        // With `TargetState.asleep`: what a v1.4 edge reads is "loadable", which it is.
        LoadState::Asleep => proto::ModelLoad::Unloaded,
    }
}

pub(super) fn model_command_to_wire(command: ModelCommand) -> proto::ModelCommand {
    let ModelCommand {
        command_id,
        model,
        action,
        reason,
    } = command;
    let action = match action {
        ModelAction::Load => proto::ModelAction::Load,
        ModelAction::Unload => proto::ModelAction::Unload,
    };
    proto::ModelCommand {
        command_id,
        adapter: model.adapter.to_string(),
        target: model.target.to_string(),
        action: action.into(),
        reason,
    }
}

/// `None` for a command naming no valid model or no known action.
pub(super) fn model_command_from_wire(command: proto::ModelCommand) -> Option<ModelCommand> {
    let proto::ModelCommand {
        command_id,
        adapter,
        target,
        action,
        reason,
    } = command;
    let action = match proto::ModelAction::try_from(action).ok()? {
        proto::ModelAction::Unspecified => return None,
        proto::ModelAction::Load => ModelAction::Load,
        proto::ModelAction::Unload => ModelAction::Unload,
    };
    let model = ModelName::new(
        AdapterName::parse(&adapter).ok()?,
        Target::parse(&target).ok()?,
    );
    Some(ModelCommand {
        command_id,
        model,
        action,
        reason,
    })
}

pub(super) fn outcome_of_model_to_wire(outcome: ModelOutcome) -> proto::ModelOutcome {
    let ModelOutcome {
        command_id,
        ok,
        message,
        state,
    } = outcome;
    proto::ModelOutcome {
        command_id,
        ok,
        message,
        state: state
            .map_or(proto::ModelLoad::Unspecified, load_to_wire)
            .into(),
    }
}

pub(super) fn outcome_of_model_from_wire(outcome: proto::ModelOutcome) -> ModelOutcome {
    let proto::ModelOutcome {
        command_id,
        ok,
        message,
        state,
    } = outcome;
    ModelOutcome {
        command_id,
        ok,
        message,
        state: load_from_wire(state),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::domain::models::TargetLoad;

    fn target(name: &str) -> Target {
        Target::parse(name).unwrap()
    }

    #[test]
    fn a_managed_adapter_round_trips_with_every_target_state() {
        let llama = AdapterName::parse("llama").unwrap();
        let managed = ManagedAdapter {
            capacity: 2,
            parallel: 0,
            budget: None,
            targets: BTreeMap::from([
                (
                    target("alpha"),
                    TargetLoad {
                        context_window: 4_096,
                        ..TargetLoad::new(LoadState::Loaded)
                    },
                ),
                (
                    target("beta"),
                    TargetLoad {
                        progress_percent: 40,
                        ..TargetLoad::new(LoadState::Loading)
                    },
                ),
                (
                    target("gamma"),
                    TargetLoad {
                        failure: "out of memory".into(),
                        ..TargetLoad::new(LoadState::Failed)
                    },
                ),
            ]),
        };
        let availability = Availability::new([(llama.clone(), target("alpha"))])
            .with_context_window(&llama, &target("alpha"), 4_096)
            .with_managed(llama.clone(), managed.clone());
        let mut entry = proto::AdapterTargets {
            adapter: "llama".into(),
            targets: vec!["alpha".into()],
            ..proto::AdapterTargets::default()
        };
        states_to_wire(&mut entry, &availability);
        assert!(entry.managed);
        assert_eq!(entry.states.len(), 3);
        let report = adapter_from_wire(entry);
        assert_eq!(report.targets, vec![target("alpha")]);
        assert_eq!(report.windows, vec![(target("alpha"), 4_096)]);
        assert_eq!(report.managed, Some(managed));
    }

    #[test]
    fn an_asleep_server_a_target_kept_loaded_a_per_model_cap_and_a_budget_round_trip() {
        let vllm = AdapterName::parse("vllm").unwrap();
        let managed = ManagedAdapter {
            capacity: 1,
            parallel: 2,
            budget: Some(crate::domain::models::Budget {
                bytes: 20 << 30,
                devices: vec![0, 1],
            }),
            targets: BTreeMap::from([
                (
                    target("alpha"),
                    TargetLoad {
                        context_window: 16_384,
                        ..TargetLoad::new(LoadState::Asleep)
                    },
                ),
                (
                    target("embed"),
                    TargetLoad {
                        context_window: 512,
                        stays_loaded: true,
                        footprint: Some(crate::domain::models::Footprint::whole(
                            9 << 30,
                            crate::domain::models::FootprintSource::VllmShare,
                        )),
                        ..TargetLoad::new(LoadState::Loaded)
                    },
                ),
            ]),
        };
        let availability = Availability::new([(vllm.clone(), target("embed"))])
            .with_managed(vllm.clone(), managed.clone());
        let mut entry = proto::AdapterTargets {
            adapter: "vllm".into(),
            targets: vec!["embed".into()],
            ..proto::AdapterTargets::default()
        };
        states_to_wire(&mut entry, &availability);
        assert_eq!(entry.parallel, 2);
        // What a v1.4 edge reads of the asleep one: an unloaded target it may load.
        let alpha = entry.states.iter().find(|s| s.target == "alpha").unwrap();
        assert_eq!(alpha.load, i32::from(proto::ModelLoad::Unloaded));
        assert!(alpha.asleep && !alpha.stays_loaded);
        assert_eq!(alpha.context_window, 16_384);
        let report = adapter_from_wire(entry);
        assert_eq!(report.targets, vec![target("embed")]);
        assert_eq!(report.managed, Some(managed));
        // The mark means nothing on another state.
        let odd = proto::AdapterTargets {
            adapter: "vllm".into(),
            managed: true,
            states: vec![proto::TargetState {
                target: "alpha".into(),
                load: proto::ModelLoad::Loaded.into(),
                asleep: true,
                ..proto::TargetState::default()
            }],
            ..proto::AdapterTargets::default()
        };
        let read = adapter_from_wire(odd).managed.unwrap();
        assert_eq!(read.targets[&target("alpha")].state, LoadState::Loaded);
    }

    #[test]
    fn an_unmanaged_entry_reports_no_lifecycle_and_a_v1_4_command_round_trips() {
        let entry = proto::AdapterTargets {
            adapter: "llama".into(),
            targets: vec!["alpha".into()],
            ..proto::AdapterTargets::default()
        };
        assert_eq!(adapter_from_wire(entry).managed, None);
        let command = ModelCommand {
            command_id: "c1".into(),
            model: ModelName::parse("llama/alpha").unwrap(),
            action: ModelAction::Unload,
            reason: "idle".into(),
        };
        let wire = model_command_to_wire(command.clone());
        assert_eq!(model_command_from_wire(wire.clone()), Some(command));
        let unknown = proto::ModelCommand { action: 0, ..wire };
        assert_eq!(model_command_from_wire(unknown), None);
        let outcome = ModelOutcome {
            command_id: "c1".into(),
            ok: false,
            message: "model is not loaded".into(),
            state: Some(LoadState::Failed),
        };
        assert_eq!(
            outcome_of_model_from_wire(outcome_of_model_to_wire(outcome.clone())),
            outcome
        );
    }
}
