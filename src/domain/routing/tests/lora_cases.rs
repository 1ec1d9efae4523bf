//! LoRA affinity: a run of a LoRA goes only to nodes that reported it with the first
//! report's weights, to one where it is loaded first, then to one that can load it, with
//! prefix affinity among equals.

use super::*;
use crate::domain::{LoraChoice, LoraFile, LoraName, LoraState, NodeLora};

fn file(sha: &str) -> LoraFile {
    LoraFile {
        path: format!("/loras/{sha}"),
        sha256: Some(sha.to_owned()),
    }
}

fn sql(sha: &str) -> LoraChoice {
    LoraChoice {
        name: LoraName::parse("sql").unwrap(),
        file: file(sha),
    }
}

/// `node` serving `m`, reporting the LoRA `sql` of `m` in `state` with weights `sha` (no
/// LoRA with `None`).
fn with_sql(node: NodeStatus, lora: Option<(LoraState, &str)>) -> NodeStatus {
    let (echo, m) = pair("m");
    let loras = lora
        .into_iter()
        .map(|(state, sha)| NodeLora {
            name: LoraName::parse("sql").unwrap(),
            base: m.clone(),
            file: file(sha),
            state,
        })
        .collect();
    let availability = Availability::new([(echo.clone(), m)]).with_loras(echo, loras);
    NodeStatus {
        availability: Some(Arc::new(availability)),
        ..node
    }
}

#[test]
fn a_lora_run_goes_only_to_a_node_that_reported_the_lora_with_its_weights() {
    let nodes = [
        with_sql(status("a", &["m"], 4, 0), None),
        with_sql(status("b", &["m"], 4, 3), Some((LoraState::Loaded, "aa"))),
        with_sql(
            status("c", &["m"], 4, 0),
            Some((LoraState::Loaded, "other")),
        ),
        // Never reported: serves its config, but no LoRA.
        status("d", &["m"], 4, 0),
    ];
    let mut setup = Setup::new(catalog_of(&nodes));
    setup.lora = Some(sql("aa"));
    for turn in 0..8 {
        let decision = setup.decide(&nodes, &want("m", None), None, turn);
        assert_eq!(placed(&decision), Some(1), "{decision:?}");
    }
    // Busy there: the run waits rather than going to a node without the LoRA.
    let busy = [
        with_sql(status("a", &["m"], 4, 0), None),
        with_sql(status("b", &["m"], 4, 4), Some((LoraState::Loaded, "aa"))),
    ];
    let decision = setup.decide(&busy, &want("m", None), None, 0);
    assert!(
        matches!(decision, Decision::Wait { cause: WaitCause::AllBusy, filtered } if filtered.unavailable == 1),
        "{decision:?}"
    );
    // Nobody has it: it waits for a node, as a configured model whose nodes are away.
    let none = [with_sql(status("a", &["m"], 4, 0), None)];
    let decision = setup.decide(&none, &want("m", None), None, 0);
    assert!(
        matches!(
            decision,
            Decision::Wait {
                cause: WaitCause::NoNodeAvailable,
                ..
            }
        ),
        "{decision:?}"
    );
    // The base itself goes anywhere.
    setup.lora = None;
    let decision = setup.decide(&nodes, &want("m", None), None, 0);
    assert!(placed(&decision).is_some_and(|i| i != 1), "{decision:?}");
}

#[test]
fn a_node_where_the_lora_is_loaded_goes_first_then_one_that_can_load_it() {
    let loadable = |id| with_sql(status(id, &["m"], 4, 0), Some((LoraState::Loadable, "aa")));
    let loaded = |id, active| {
        with_sql(
            status(id, &["m"], 4, active),
            Some((LoraState::Loaded, "aa")),
        )
    };
    let mut setup = Setup::new(catalog_of(&[loadable("a"), loaded("b", 3), loaded("c", 3)]));
    setup.lora = Some(sql("aa"));
    let nodes = [loadable("a"), loaded("b", 3), loaded("c", 3)];
    // Whatever the key, a loaded node; prefix affinity among the two.
    let mut homes = std::collections::BTreeSet::new();
    for n in 0..40 {
        let decision = setup.decide(&nodes, &want("m", None), Some(key(n)), n);
        let index = placed(&decision).expect("placed");
        assert_ne!(index, 0, "{decision:?}");
        homes.insert(index);
        // The same key, the same node.
        let again = setup.decide(&nodes, &want("m", None), Some(key(n)), n + 1);
        assert_eq!(placed(&again), Some(index));
    }
    assert_eq!(homes.len(), 2, "the key spreads over both loaded nodes");
    // Both loaded nodes full: the one that can load it takes the run.
    let full = [loadable("a"), loaded("b", 4), loaded("c", 4)];
    let decision = setup.decide(&full, &want("m", None), Some(key(1)), 0);
    assert_eq!(placed(&decision), Some(0), "{decision:?}");
}
