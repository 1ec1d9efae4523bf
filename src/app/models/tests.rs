//! The model lifecycle on its own: `[[models]]` checked against the node definitions, and
//! the service with a real registry and a recording transport (no run service): a cold
//! model loaded on the node that can hold it, a load failing everywhere handed to the
//! waiting runs with the engine's reason.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::ModelService;
use super::config::{LifecycleConfig, ModelEntry, policies};
use crate::adapters::lock_registry::LockRegistry;
use crate::domain::models::{
    LoadState, ManagedAdapter, ModelAction, ModelName, TargetLoad, TooLarge,
};
use crate::domain::{
    AdapterConfig, AdapterName, Alias, Availability, DeclaredOperations, NodeId, NodeRecord,
    RuntimeConfig, Target, Token,
};
use crate::ports::{
    LastFrame, ModelDemand, ModelOutcome, NewConnection, NodeCommand, NodeLink, Registry,
    TransportError, WaitingRuns, transport::MockNodeTransport,
};

fn record(id: &str, targets: &[&str]) -> Arc<NodeRecord> {
    let adapter = AdapterConfig::new(
        AdapterName::parse("llama").unwrap(),
        targets.iter().map(|t| Target::parse(t).unwrap()).collect(),
        BTreeMap::new(),
    )
    .unwrap();
    Arc::new(NodeRecord::new(
        NodeId::parse(id).unwrap(),
        Alias::parse(&format!("{id}-alias")).unwrap(),
        Token::new(id).digest(),
        vec![adapter],
        RuntimeConfig::new(2, 1_000, BTreeMap::new()).unwrap(),
    ))
}

fn entry(model: &str, min_loaded: u32, pin: &[&str], idle: Option<u64>) -> ModelEntry {
    ModelEntry {
        model: model.into(),
        min_loaded,
        pin: pin.iter().map(|p| (*p).to_owned()).collect(),
        idle_unload_ms: idle,
    }
}

#[test]
fn models_entries_are_checked_against_the_nodes_and_every_problem_names_its_entry() {
    let records = [record("a", &["alpha", "beta"]), record("b", &["alpha"])];
    let good = [entry("llama/alpha", 2, &["a-alias"], Some(60_000))];
    let checked = policies(&good, &records).unwrap();
    let alpha = &checked[&ModelName::parse("llama/alpha").unwrap()];
    assert_eq!(alpha.pin, vec![NodeId::parse("a").unwrap()]);

    let bad = [
        entry("alpha", 0, &[], None),
        entry("llama/zeta", 0, &[], None),
        entry("llama/beta", 2, &["b"], Some(0)),
        entry("llama/alpha", 0, &["nobody"], None),
        entry("llama/alpha", 0, &[], None),
        entry("llama/alpha", 1, &[], None),
    ];
    let problems = policies(&bad, &records).unwrap_err().join("\n");
    for expected in [
        r#"models[0] (model "alpha"): `model` is not `adapter/target`"#,
        r#"models[1] (model "llama/zeta"): no `[[nodes]]` entry serves adapter `llama` with target `zeta`"#,
        r#"models[2] (model "llama/beta"): `min_loaded` = 2 is above the 1 node(s) that serve it"#,
        r#"models[2] (model "llama/beta"): `pin` names node "b", whose config does not serve the model"#,
        r#"models[2] (model "llama/beta"): `idle_unload_ms` must be at least 1"#,
        r#"models[3] (model "llama/alpha"): `pin` names "nobody", which no `[[nodes]]` entry is"#,
        r#"models[5] (model "llama/alpha"): the model is listed twice"#,
    ] {
        assert!(
            problems.contains(expected),
            "missing {expected:?} in:\n{problems}"
        );
    }
}

struct NullLink;

impl NodeLink for NullLink {
    fn send(&self, _: NodeCommand) -> Result<(), crate::ports::LinkError> {
        Ok(())
    }

    fn supersede(&self) {}
}

/// A node `id` that manages `llama` with `capacity` places, its targets in `states`.
fn connect(registry: &LockRegistry, id: &str, capacity: u32, states: &[(&str, LoadState)]) {
    let targets: Vec<&str> = states.iter().map(|(t, _)| *t).collect();
    let record = record(id, &targets);
    let connection = NewConnection {
        record: Arc::clone(&record),
        connection: 1,
        peer: SocketAddr::from(([127, 0, 0, 1], 9)),
        node_version: "test".into(),
        link: Arc::new(NullLink),
        instance_id: String::new(),
        last_frame: Arc::new(LastFrame::new(Instant::now())),
        reserved_runs: 0,
        can_continue: false,
        operations: DeclaredOperations::default(),
        can_manage_models: true,
        inventory: None,
    };
    registry.insert(connection).unwrap();
    let llama = AdapterName::parse("llama").unwrap();
    let managed = ManagedAdapter {
        capacity,
        parallel: 0,
        budget: None,
        targets: states
            .iter()
            .map(|(t, s)| (Target::parse(t).unwrap(), TargetLoad::new(*s)))
            .collect(),
    };
    let loaded = states
        .iter()
        .filter(|(_, s)| *s == LoadState::Loaded)
        .map(|(t, _)| (llama.clone(), Target::parse(t).unwrap()));
    let availability = Availability::new(loaded).with_managed(llama, managed);
    assert!(registry.set_availability(record.id(), 1, availability));
}

type Sent = Arc<Mutex<Vec<(NodeId, NodeCommand)>>>;

/// A lifecycle over `registry` whose transport records every command.
fn service(registry: Arc<LockRegistry>) -> (ModelService, Sent) {
    let sent: Sent = Arc::default();
    let mut transport = MockNodeTransport::new();
    let log = Arc::clone(&sent);
    transport.expect_send().returning(move |node, command| {
        log.lock().unwrap().push((node.clone(), command));
        Ok::<(), TransportError>(())
    });
    let meter = opentelemetry::global::meter("edge-test");
    let config = LifecycleConfig::default();
    let service = ModelService::new(
        registry,
        Arc::new(transport),
        BTreeMap::new(),
        config,
        &meter,
    );
    (service, sent)
}

#[derive(Default)]
struct GivenUp(Mutex<Vec<(String, String)>>);

impl WaitingRuns for GivenUp {
    fn load_failed(&self, model: &ModelName, reason: &str) {
        self.0
            .lock()
            .unwrap()
            .push((model.to_string(), reason.to_owned()));
    }

    fn too_large(&self, model: &ModelName, refusal: TooLarge) {
        self.0
            .lock()
            .unwrap()
            .push((model.to_string(), refusal.to_string()));
    }

    fn placements_settled(&self) {}
}

/// Waits until the service has sent `count` commands and answers the last with `ok`.
async fn answer(service: &ModelService, sent: &Sent, count: usize, ok: bool) -> NodeCommand {
    // The service sends within a few turns of being asked; a bound, not a timing.
    for _ in 0..1_000 {
        let command = sent.lock().unwrap().get(count - 1).map(|(_, c)| c.clone());
        if let Some(NodeCommand::Model(model)) = &command {
            let outcome = ModelOutcome {
                command_id: model.command_id.clone(),
                ok,
                message: if ok {
                    String::new()
                } else {
                    "out of memory".into()
                },
                state: None,
            };
            service.outcome(outcome);
            return command.unwrap();
        }
        service.reconcile_now();
        tokio::task::yield_now().await;
    }
    panic!("no command {count} was sent: {:?}", sent.lock().unwrap());
}

/// Command `index`'s node, action and model.
fn summary(sent: &Sent, index: usize) -> (String, ModelAction, String) {
    match &sent.lock().unwrap()[index] {
        (node, NodeCommand::Model(command)) => {
            (node.to_string(), command.action, command.model.to_string())
        }
        other => panic!("not a model command: {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_cold_model_is_loaded_where_there_is_room_and_a_load_failing_everywhere_gives_up() {
    let registry = Arc::new(LockRegistry::new());
    connect(
        &registry,
        "full",
        1,
        &[("alpha", LoadState::Unloaded), ("busy", LoadState::Loaded)],
    );
    connect(&registry, "roomy", 2, &[("alpha", LoadState::Unloaded)]);
    let (service, sent) = service(Arc::clone(&registry));
    let given_up = Arc::new(GivenUp::default());
    service.attach_runs(Arc::clone(&given_up) as Arc<dyn WaitingRuns>);
    for node in ["full", "roomy"] {
        service.node_changed(&NodeId::parse(node).unwrap());
    }
    let (llama, alpha) = (
        AdapterName::parse("llama").unwrap(),
        Target::parse("alpha").unwrap(),
    );
    assert!(service.wanted(&llama, &alpha).is_some());

    // The node with room first; it fails.
    let first = answer(&service, &sent, 1, false).await;
    assert_eq!(
        summary(&sent, 0),
        (
            "roomy".to_owned(),
            ModelAction::Load,
            "llama/alpha".to_owned()
        )
    );
    // Then the full one, its idle model unloaded first; it fails too.
    answer(&service, &sent, 2, true).await;
    assert_eq!(
        summary(&sent, 1),
        (
            "full".to_owned(),
            ModelAction::Unload,
            "llama/busy".to_owned()
        )
    );
    answer(&service, &sent, 3, false).await;
    assert_eq!(
        summary(&sent, 2),
        (
            "full".to_owned(),
            ModelAction::Load,
            "llama/alpha".to_owned()
        )
    );
    // Nowhere left: the waiting runs are told why.
    for _ in 0..10 {
        service.reconcile_now();
        tokio::task::yield_now().await;
    }
    assert!(matches!(first, NodeCommand::Model(_)));
    assert_eq!(sent.lock().unwrap().len(), 3);
    assert_eq!(
        given_up.0.lock().unwrap().clone(),
        vec![("llama/alpha".to_owned(), "out of memory".to_owned())]
    );
}
