//! [`LockRegistry`]: the connected nodes, indexed by id and by alias.
//!
//! Writes (a node joins or leaves, a drain) take the lock. Per-node state that changes
//! while connected (last seen, active runs, availability, drain) is atomic, updated under
//! the read lock. Routing reads a snapshot ordered by id, indexed by the routes each node's
//! config serves, that is rebuilt only after the membership changed: a burst of
//! registrations costs no rebuilds, and a run's placement copies the status of the nodes
//! serving its route only (not of all 10,000).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::{ArcSwap, ArcSwapOption};

use crate::domain::routing::{NodeHash, NodeStatus};
use crate::domain::{AdapterName, Alias, Availability, Inventory, NodeId, NodeRecord, Target};
use crate::ports::{
    AlreadyConnected, ConnectedNode, ConnectionId, NewConnection, NodeLink, Registry,
};

/// One connected node.
struct Entry {
    connection: NewConnection,
    connected_since: SystemTime,
    /// Milliseconds since the Unix epoch.
    last_seen_ms: AtomicI64,
    active_runs: AtomicU32,
    /// The node's last availability report; empty until it sends one (nothing available,
    /// for a node that manages models).
    availability: ArcSwapOption<Availability>,
    /// The node's devices as it last reported them.
    inventory: ArcSwapOption<Inventory>,
    /// A copy of whether the node id is in [`Maps::drained`], for lock-free reads.
    drained: AtomicBool,
    /// Its id's routing hash, computed once.
    hash: NodeHash,
}

/// What a node that manages models serves before its first availability report: the
/// targets of its adapters without a `lifecycle` setting.
fn before_first_report(record: &NodeRecord) -> Availability {
    Availability::new(
        record
            .adapters()
            .iter()
            .filter(|adapter| !adapter.settings().contains_key(LIFECYCLE_SETTING))
            .flat_map(|adapter| {
                let name = adapter.name();
                adapter
                    .targets()
                    .iter()
                    .map(move |t| (name.clone(), t.clone()))
            }),
    )
}

/// The adapter setting that gives an adapter a lifecycle on its node (docs/models.md).
const LIFECYCLE_SETTING: &str = "lifecycle";

impl Entry {
    fn new(connection: NewConnection, now: SystemTime, drained: bool) -> Self {
        let hash = NodeHash::of(connection.record.id());
        let reserved = connection.reserved_runs;
        // A node that loads models on command reports what its engines hold; until it
        // does, an adapter whose settings name a lifecycle serves nothing (its engine may
        // hold none of its targets) and every other serves its whole config, as an older
        // node's does.
        let availability = ArcSwapOption::from(
            connection
                .can_manage_models
                .then(|| Arc::new(before_first_report(&connection.record))),
        );
        let inventory = ArcSwapOption::from(connection.inventory.clone().map(Arc::new));
        Self {
            connection,
            connected_since: now,
            last_seen_ms: AtomicI64::new(to_millis(now)),
            active_runs: AtomicU32::new(reserved),
            availability,
            inventory,
            drained: AtomicBool::new(drained),
            hash,
        }
    }

    fn report(&self) -> ConnectedNode {
        let NewConnection {
            record,
            connection,
            peer,
            node_version,
            link: _,
            instance_id,
            last_frame,
            reserved_runs: _,
            can_continue: _,
            operations: _,
            can_manage_models,
            inventory: _,
        } = &self.connection;
        ConnectedNode {
            record: Arc::clone(record),
            connection: *connection,
            peer: *peer,
            node_version: node_version.clone(),
            connected_since: self.connected_since,
            last_seen: from_millis(self.last_seen_ms.load(Ordering::Relaxed)),
            last_frame_at: last_frame.at(),
            instance_id: instance_id.clone(),
            active_runs: self.active_runs.load(Ordering::Relaxed),
            availability: self.availability.load_full(),
            drained: self.drained.load(Ordering::Relaxed),
            can_manage_models: *can_manage_models,
            inventory: self.inventory.load_full(),
        }
    }

    fn status(&self) -> NodeStatus {
        NodeStatus {
            record: Arc::clone(&self.connection.record),
            active_runs: self.active_runs.load(Ordering::Relaxed),
            availability: self.availability.load_full(),
            drained: self.drained.load(Ordering::Relaxed),
            hash: self.hash,
            can_continue: self.connection.can_continue,
            operations: self.connection.operations,
        }
    }
}

fn to_millis(at: SystemTime) -> i64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn from_millis(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

#[derive(Default)]
struct Maps {
    by_id: HashMap<NodeId, Arc<Entry>>,
    id_by_alias: HashMap<Alias, NodeId>,
    /// Drained node ids, connected or not (bounded by what operators drain).
    drained: HashSet<NodeId>,
}

/// The connected nodes in id order, whole and by the routes their configs serve.
#[derive(Default)]
struct Snapshot {
    sorted: Vec<Arc<Entry>>,
    by_route: HashMap<AdapterName, HashMap<Target, Vec<Arc<Entry>>>>,
}

impl Snapshot {
    fn of(mut sorted: Vec<Arc<Entry>>) -> Self {
        sorted.sort_by(|a, b| a.connection.record.id().cmp(b.connection.record.id()));
        let mut by_route: HashMap<AdapterName, HashMap<Target, Vec<Arc<Entry>>>> = HashMap::new();
        for entry in &sorted {
            for adapter in entry.connection.record.adapters() {
                let targets = by_route.entry(adapter.name().clone()).or_default();
                for target in adapter.targets() {
                    targets
                        .entry(target.clone())
                        .or_default()
                        .push(Arc::clone(entry));
                }
            }
        }
        Self { sorted, by_route }
    }
}

/// The connected nodes, safe to share between tasks. Cheap to clone.
#[derive(Clone, Default)]
pub struct LockRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    maps: RwLock<Maps>,
    /// The entries in id order and by route, valid while `stale` is false.
    snapshot: ArcSwap<Snapshot>,
    stale: AtomicBool,
}

impl LockRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    fn read(&self) -> RwLockReadGuard<'_, Maps> {
        // A panic while holding the lock cannot leave the maps half-updated (every write is
        // a single insert or remove), so a poisoned lock is still sound to use.
        self.inner
            .maps
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Maps> {
        self.inner
            .maps
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn live_entry(&self, id: &NodeId, connection: ConnectionId) -> Option<Arc<Entry>> {
        self.read()
            .by_id
            .get(id)
            .filter(|e| e.connection.connection == connection)
            .cloned()
    }

    /// The entries in id order and by route, rebuilt first if membership changed.
    fn snapshot_now(&self) -> Arc<Snapshot> {
        if self.inner.stale.load(Ordering::Acquire) {
            // Rebuild and publish under the read lock: writers, which set `stale` while they
            // hold the write lock, wait, so no older snapshot can overwrite a newer one.
            let maps = self.read();
            self.inner.stale.store(false, Ordering::Release);
            let entries: Vec<Arc<Entry>> = maps.by_id.values().cloned().collect();
            self.inner.snapshot.store(Arc::new(Snapshot::of(entries)));
        }
        self.inner.snapshot.load_full()
    }
}

impl Registry for LockRegistry {
    fn insert(&self, connection: NewConnection) -> Result<(), AlreadyConnected> {
        let now = SystemTime::now();
        let mut maps = self.write();
        let id = connection.record.id().clone();
        if maps.by_id.contains_key(&id) {
            return Err(AlreadyConnected);
        }
        maps.id_by_alias
            .insert(connection.record.alias().clone(), id.clone());
        let drained = maps.drained.contains(&id);
        maps.by_id
            .insert(id, Arc::new(Entry::new(connection, now, drained)));
        self.inner.stale.store(true, Ordering::Release);
        Ok(())
    }

    fn replace(
        &self,
        connection: NewConnection,
        old: ConnectionId,
    ) -> Result<Option<Arc<dyn NodeLink>>, AlreadyConnected> {
        let now = SystemTime::now();
        let mut maps = self.write();
        let id = connection.record.id().clone();
        let replaced = match maps.by_id.get(&id) {
            Some(entry) if entry.connection.connection != old => return Err(AlreadyConnected),
            Some(entry) => Some(Arc::clone(&entry.connection.link)),
            None => None,
        };
        // The alias comes from the same record, so the alias index needs no change when an
        // entry is replaced; it is set for the insert case.
        maps.id_by_alias
            .insert(connection.record.alias().clone(), id.clone());
        let drained = maps.drained.contains(&id);
        maps.by_id
            .insert(id, Arc::new(Entry::new(connection, now, drained)));
        self.inner.stale.store(true, Ordering::Release);
        Ok(replaced)
    }

    fn remove(&self, id: &NodeId, connection: ConnectionId) -> bool {
        let mut maps = self.write();
        let live = maps
            .by_id
            .get(id)
            .is_some_and(|e| e.connection.connection == connection);
        if live {
            if let Some(entry) = maps.by_id.remove(id) {
                maps.id_by_alias.remove(entry.connection.record.alias());
            }
            self.inner.stale.store(true, Ordering::Release);
        }
        live
    }

    fn is_connected(&self, id: &NodeId) -> bool {
        self.read().by_id.contains_key(id)
    }

    fn get(&self, id_or_alias: &str) -> Option<ConnectedNode> {
        let maps = self.read();
        let by_id = NodeId::parse(id_or_alias)
            .ok()
            .and_then(|id| maps.by_id.get(&id));
        let by_alias = || {
            let alias = Alias::parse(id_or_alias).ok()?;
            maps.by_id.get(maps.id_by_alias.get(&alias)?)
        };
        by_id.or_else(by_alias).map(|entry| entry.report())
    }

    fn snapshot(&self) -> Vec<ConnectedNode> {
        let snapshot = self.snapshot_now();
        snapshot.sorted.iter().map(|entry| entry.report()).collect()
    }

    fn statuses(&self) -> Vec<NodeStatus> {
        let snapshot = self.snapshot_now();
        snapshot.sorted.iter().map(|entry| entry.status()).collect()
    }

    fn statuses_serving(&self, adapter: &AdapterName, target: &Target) -> Vec<NodeStatus> {
        let snapshot = self.snapshot_now();
        let serving = snapshot.by_route.get(adapter).and_then(|t| t.get(target));
        serving.map_or_else(Vec::new, |entries| {
            entries.iter().map(|entry| entry.status()).collect()
        })
    }

    fn connection(&self, id: &NodeId) -> Option<ConnectionId> {
        self.read().by_id.get(id).map(|e| e.connection.connection)
    }

    fn len(&self) -> usize {
        self.read().by_id.len()
    }

    fn link(&self, id: &NodeId) -> Option<Arc<dyn NodeLink>> {
        self.read()
            .by_id
            .get(id)
            .map(|e| Arc::clone(&e.connection.link))
    }

    fn touch(&self, id: &NodeId, connection: ConnectionId, at: SystemTime) {
        if let Some(entry) = self.live_entry(id, connection) {
            entry.last_seen_ms.store(to_millis(at), Ordering::Relaxed);
        }
    }

    fn adjust_active_runs(&self, id: &NodeId, connection: ConnectionId, delta: i32) {
        if let Some(entry) = self.live_entry(id, connection) {
            let update = |runs: u32| Some(runs.saturating_add_signed(delta));
            // `fetch_update` with a closure that always returns `Some` cannot fail.
            let _ = entry
                .active_runs
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, update);
        }
    }

    fn set_availability(
        &self,
        id: &NodeId,
        connection: ConnectionId,
        availability: Availability,
    ) -> bool {
        let Some(entry) = self.live_entry(id, connection) else {
            return false;
        };
        // One connection's frames are handled in order, so nothing races this swap.
        let changed = entry
            .availability
            .load()
            .as_deref()
            .is_none_or(|old| *old != availability);
        if changed {
            entry.availability.store(Some(Arc::new(availability)));
        }
        changed
    }

    fn set_inventory(&self, id: &NodeId, connection: ConnectionId, inventory: Inventory) {
        if let Some(entry) = self.live_entry(id, connection) {
            entry.inventory.store(Some(Arc::new(inventory)));
        }
    }

    fn set_withheld(
        &self,
        id: &NodeId,
        adapter: &AdapterName,
        target: &Target,
        withheld: bool,
    ) -> bool {
        let Some(entry) = self.read().by_id.get(id).cloned() else {
            return false;
        };
        // Against the connection's own report arriving meanwhile: a compare-and-swap loop.
        let before = entry.availability.rcu(|current| {
            current.as_ref().map(|served| {
                let changed = (**served).clone().with_served(adapter, target, !withheld);
                Arc::new(changed)
            })
        });
        let after = entry.availability.load();
        before.as_deref() != after.as_deref()
    }

    fn set_drained(&self, id: &NodeId, drained: bool) -> bool {
        let mut maps = self.write();
        let changed = if drained {
            maps.drained.insert(id.clone())
        } else {
            maps.drained.remove(id)
        };
        if let Some(entry) = maps.by_id.get(id) {
            entry.drained.store(drained, Ordering::Relaxed);
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    use super::*;
    use crate::domain::{AdapterConfig, AdapterName, NodeRecord, RuntimeConfig, Target, Token};
    use crate::ports::{LastFrame, LinkError, NodeCommand};
    use proptest::prelude::*;

    struct NullLink;

    impl NodeLink for NullLink {
        fn send(&self, _command: NodeCommand) -> Result<(), LinkError> {
            Ok(())
        }

        fn supersede(&self) {}
    }

    fn connection(id: &str, alias: &str, connection: ConnectionId) -> NewConnection {
        serving(id, alias, connection, &["t"])
    }

    /// A connection of a node whose config serves `echo` with `targets`.
    fn serving(id: &str, alias: &str, connection: ConnectionId, targets: &[&str]) -> NewConnection {
        NewConnection {
            record: Arc::new(NodeRecord::new(
                NodeId::parse(id).unwrap(),
                Alias::parse(alias).unwrap(),
                Token::new(id).digest(),
                vec![
                    AdapterConfig::new(
                        AdapterName::parse("echo").unwrap(),
                        targets.iter().map(|t| Target::parse(t).unwrap()).collect(),
                        BTreeMap::new(),
                    )
                    .unwrap(),
                ],
                RuntimeConfig::new(2, 1000, BTreeMap::new()).unwrap(),
            )),
            connection,
            peer: SocketAddr::from(([127, 0, 0, 1], 9)),
            node_version: "test".into(),
            link: Arc::new(NullLink),
            instance_id: String::new(),
            last_frame: Arc::new(LastFrame::new(std::time::Instant::now())),
            reserved_runs: 0,
            can_continue: false,
            operations: crate::domain::DeclaredOperations::default(),
            can_manage_models: false,
            inventory: None,
        }
    }

    fn id(s: &str) -> NodeId {
        NodeId::parse(s).unwrap()
    }

    #[test]
    fn a_withheld_target_serves_nothing_until_it_is_put_back_or_the_node_reports() {
        let registry = LockRegistry::new();
        registry
            .insert(serving("a", "a-alias", 1, &["x", "y"]))
            .unwrap();
        let (echo, x, y) = (
            AdapterName::parse("echo").unwrap(),
            Target::parse("x").unwrap(),
            Target::parse("y").unwrap(),
        );
        let both = Availability::new([(echo.clone(), x.clone()), (echo.clone(), y.clone())]);
        registry.set_availability(&id("a"), 1, both.clone());
        assert!(registry.set_withheld(&id("a"), &echo, &x, true));
        assert!(
            !registry.set_withheld(&id("a"), &echo, &x, true),
            "already withheld"
        );
        let node = registry.get("a").unwrap();
        assert!(!node.serves_now(&echo, &x) && node.serves_now(&echo, &y));
        assert!(registry.set_withheld(&id("a"), &echo, &x, false));
        assert!(registry.get("a").unwrap().serves_now(&echo, &x));
        registry.set_withheld(&id("a"), &echo, &x, true);
        // The node's next report is the truth again.
        assert!(registry.set_availability(&id("a"), 1, both));
        assert!(registry.get("a").unwrap().serves_now(&echo, &x));
        assert!(
            !registry.set_withheld(&id("b"), &echo, &x, true),
            "no such node"
        );
    }

    #[test]
    fn a_node_that_manages_models_serves_only_its_plain_adapters_until_it_reports() {
        let registry = LockRegistry::new();
        let mut connection = serving("a", "a-alias", 1, &["x"]);
        let lifecycle = BTreeMap::from([("lifecycle".to_owned(), "llama-router".to_owned())]);
        let llama = AdapterConfig::new(
            AdapterName::parse("llama").unwrap(),
            vec![Target::parse("alpha").unwrap()],
            lifecycle,
        )
        .unwrap();
        let record = &connection.record;
        let adapters = [record.adapters().to_vec(), vec![llama]].concat();
        connection.record = Arc::new(NodeRecord::new(
            record.id().clone(),
            record.alias().clone(),
            Token::new("a").digest(),
            adapters,
            RuntimeConfig::new(2, 1000, BTreeMap::new()).unwrap(),
        ));
        connection.can_manage_models = true;
        registry.insert(connection).unwrap();
        let node = registry.get("a").unwrap();
        let echo = AdapterName::parse("echo").unwrap();
        assert!(node.serves_now(&echo, &Target::parse("x").unwrap()));
        let llama = AdapterName::parse("llama").unwrap();
        assert!(!node.serves_now(&llama, &Target::parse("alpha").unwrap()));
    }

    #[test]
    fn a_route_lists_the_connected_nodes_serving_it_in_id_order() {
        let registry = LockRegistry::new();
        registry.insert(serving("n3", "c", 3, &["a", "b"])).unwrap();
        registry.insert(serving("n1", "a", 1, &["b"])).unwrap();
        registry.insert(serving("n2", "b", 2, &["a"])).unwrap();
        let echo = AdapterName::parse("echo").unwrap();
        let ids = |target: &str| -> Vec<String> {
            let target = Target::parse(target).unwrap();
            let statuses = registry.statuses_serving(&echo, &target);
            statuses.iter().map(|s| s.record.id().to_string()).collect()
        };
        assert_eq!(ids("a"), ["n2", "n3"]);
        assert_eq!(ids("b"), ["n1", "n3"]);
        assert!(ids("c").is_empty());
        let other = AdapterName::parse("other").unwrap();
        assert!(
            registry
                .statuses_serving(&other, &Target::parse("a").unwrap())
                .is_empty()
        );

        // Membership changes are seen at the next read; so is a load change, at once.
        assert!(registry.remove(&id("n3"), 3));
        registry.adjust_active_runs(&id("n2"), 2, 1);
        assert_eq!(ids("a"), ["n2"]);
        assert_eq!(ids("b"), ["n1"]);
        let target = Target::parse("a").unwrap();
        assert_eq!(registry.statuses_serving(&echo, &target)[0].active_runs, 1);
        assert_eq!(registry.connection(&id("n2")), Some(2));
        assert_eq!(registry.connection(&id("n3")), None);
    }

    #[test]
    fn finds_nodes_by_id_and_alias_and_refuses_a_second_connection() {
        let registry = LockRegistry::new();
        registry.insert(connection("b", "gpu-b", 1)).unwrap();
        registry.insert(connection("a", "gpu-a", 2)).unwrap();
        assert_eq!(
            registry.insert(connection("a", "other", 3)),
            Err(AlreadyConnected)
        );
        assert_eq!(registry.get("gpu-a").unwrap().record.id(), &id("a"));
        assert_eq!(registry.get("b").unwrap().connection, 1);
        assert!(registry.get("nope").is_none());
        let order: Vec<String> = registry
            .snapshot()
            .iter()
            .map(|n| n.record.id().to_string())
            .collect();
        assert_eq!(order, ["a", "b"]);
        assert_eq!(registry.len(), 2);
    }

    #[test]
    fn an_old_connection_cannot_remove_or_touch_a_new_one() {
        let registry = LockRegistry::new();
        registry.insert(connection("a", "x", 1)).unwrap();
        assert!(registry.remove(&id("a"), 1));
        registry.insert(connection("a", "x", 2)).unwrap();
        assert!(!registry.remove(&id("a"), 1));
        registry.adjust_active_runs(&id("a"), 1, 1);
        assert_eq!(registry.get("a").unwrap().active_runs, 0);
        registry.adjust_active_runs(&id("a"), 2, 1);
        assert_eq!(registry.statuses()[0].active_runs, 1);
        assert!(registry.remove(&id("a"), 2));
        assert!(registry.get("x").is_none());
        assert!(registry.is_empty());
        assert!(registry.statuses().is_empty());
    }

    #[test]
    fn active_runs_never_go_below_zero() {
        let registry = LockRegistry::new();
        registry.insert(connection("a", "x", 1)).unwrap();
        registry.adjust_active_runs(&id("a"), 1, -1);
        assert_eq!(registry.get("a").unwrap().active_runs, 0);
    }

    #[test]
    fn concurrent_inserts_and_removes_stay_consistent() {
        let registry = LockRegistry::new();
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let registry = registry.clone();
                scope.spawn(move || {
                    for i in 0..200u64 {
                        let name = format!("n{t}-{i}");
                        registry
                            .insert(connection(&name, &format!("a{t}-{i}"), i))
                            .unwrap();
                        let _ = registry.statuses();
                        if i % 2 == 0 {
                            assert!(registry.remove(&id(&name), i));
                        }
                    }
                });
            }
        });
        assert_eq!(registry.len(), 400);
        assert_eq!(registry.snapshot().len(), 400);
    }

    #[test]
    fn a_takeover_replaces_exactly_the_connection_it_names() {
        let registry = LockRegistry::new();
        registry.insert(connection("a", "x", 1)).unwrap();
        registry.adjust_active_runs(&id("a"), 1, 1);
        assert!(
            registry
                .replace(connection("a", "x", 2), 1)
                .unwrap()
                .is_some()
        );
        // The new connection starts with its own counters; the old one can no longer
        // touch, count or remove anything.
        assert_eq!(registry.get("x").unwrap().connection, 2);
        assert_eq!(registry.get("a").unwrap().active_runs, 0);
        registry.adjust_active_runs(&id("a"), 1, 1);
        assert_eq!(registry.get("a").unwrap().active_runs, 0);
        assert!(!registry.remove(&id("a"), 1));
        // A takeover that names a connection no longer live loses to the one that is.
        assert_eq!(
            registry.replace(connection("a", "x", 3), 1).err(),
            Some(AlreadyConnected)
        );
        assert_eq!(registry.get("a").unwrap().connection, 2);
        // The old connection left meanwhile: the takeover is a plain insert.
        assert!(registry.remove(&id("a"), 2));
        assert!(
            registry
                .replace(connection("a", "x", 4), 2)
                .unwrap()
                .is_none()
        );
        assert_eq!(registry.snapshot().len(), 1);
        assert_eq!(registry.get("x").unwrap().connection, 4);
    }

    #[test]
    fn a_connection_starts_with_its_reserved_runs_until_they_are_given_back() {
        let registry = LockRegistry::new();
        let reserved = NewConnection {
            reserved_runs: 2,
            ..connection("a", "x", 1)
        };
        registry.insert(reserved).unwrap();
        // Full while its resume claims are answered: routing sees no free slot.
        let status = &registry.statuses()[0];
        assert_eq!(status.active_runs, 2);
        registry.adjust_active_runs(&id("a"), 1, 1);
        registry.adjust_active_runs(&id("a"), 1, -2);
        assert_eq!(registry.get("a").unwrap().active_runs, 1);
    }

    #[test]
    fn racing_takeovers_leave_one_live_connection_that_no_loser_can_remove() {
        let registry = LockRegistry::new();
        registry.insert(connection("a", "x", 0)).unwrap();
        let winners = std::sync::Mutex::new(vec![0]);
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let (registry, winners) = (&registry, &winners);
                scope.spawn(move || {
                    for i in 0..200u64 {
                        let new = 1 + t * 1_000 + i;
                        let live = registry.get("a").map(|n| n.connection);
                        let won = match live {
                            Some(old) => registry.replace(connection("a", "x", new), old).is_ok(),
                            None => registry.insert(connection("a", "x", new)).is_ok(),
                        };
                        if won {
                            winners.lock().unwrap().push(new);
                        }
                    }
                });
            }
        });
        assert_eq!(registry.len(), 1);
        let live = registry.get("a").unwrap().connection;
        let winners = winners.into_inner().unwrap();
        assert!(winners.contains(&live));
        for old in winners.into_iter().filter(|c| *c != live) {
            assert!(!registry.remove(&id("a"), old));
        }
        assert_eq!(registry.get("x").unwrap().connection, live);
    }

    /// One step of a registry's life, for the model test.
    #[derive(Debug, Clone)]
    enum Op {
        Insert(usize),
        /// Take over node `.0` from the connection `.1` steps back in the history.
        Replace(usize, usize),
        /// The departure of the connection `.1` steps back in node `.0`'s history.
        Remove(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0..2usize).prop_map(Op::Insert),
            (0..2usize, 0..4usize).prop_map(|(n, back)| Op::Replace(n, back)),
            (0..2usize, 0..4usize).prop_map(|(n, back)| Op::Remove(n, back)),
        ]
    }

    proptest! {
        /// Against a model (one live connection per node, or none): whatever order of
        /// registrations, takeovers and departures, a node never has two live
        /// connections, and a departure only ever removes the connection it names.
        #[test]
        fn a_node_never_has_two_live_connections_and_departures_remove_only_their_own(
            ops in proptest::collection::vec(op(), 1..60)
        ) {
            let registry = LockRegistry::new();
            let nodes = ["a", "b"];
            let mut live: [Option<ConnectionId>; 2] = [None, None];
            let mut history: [Vec<ConnectionId>; 2] = [vec![0], vec![0]];
            let mut next: ConnectionId = 1;
            for op in ops {
                match op {
                    Op::Insert(n) => {
                        let inserted = registry.insert(connection(nodes[n], nodes[n], next)).is_ok();
                        prop_assert_eq!(inserted, live[n].is_none());
                        if inserted {
                            live[n] = Some(next);
                        }
                        history[n].push(next);
                        next += 1;
                    }
                    Op::Replace(n, back) => {
                        let old = history[n][history[n].len().saturating_sub(1 + back)];
                        let replaced = registry.replace(connection(nodes[n], nodes[n], next), old);
                        let allowed = live[n].is_none_or(|c| c == old);
                        prop_assert_eq!(replaced.is_ok(), allowed);
                        if allowed {
                            live[n] = Some(next);
                        }
                        history[n].push(next);
                        next += 1;
                    }
                    Op::Remove(n, back) => {
                        let gone = history[n][history[n].len().saturating_sub(1 + back)];
                        let removed = registry.remove(&id(nodes[n]), gone);
                        prop_assert_eq!(removed, live[n] == Some(gone));
                        if removed {
                            live[n] = None;
                        }
                    }
                }
                for (n, node) in nodes.iter().enumerate() {
                    prop_assert_eq!(registry.get(node).map(|c| c.connection), live[n]);
                }
                let snapshot = registry.snapshot();
                prop_assert_eq!(snapshot.len(), live.iter().flatten().count());
                prop_assert_eq!(registry.len(), snapshot.len());
            }
        }
    }
}
