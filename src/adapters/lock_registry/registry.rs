//! [`LockRegistry`]: the connected nodes, indexed by id and by alias.
//!
//! Writes (a node joins or leaves) take the lock. Per-node counters (last seen, active runs)
//! are atomics updated under the read lock. Selection reads a snapshot ordered by id that is
//! rebuilt only after the membership changed, so a burst of registrations costs no rebuilds
//! and a run dispatch costs no allocation of the map.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use crate::domain::{Alias, NodeId, NodeLoad};
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
}

impl Entry {
    fn report(&self) -> ConnectedNode {
        let NewConnection {
            record,
            connection,
            peer,
            node_version,
            link: _,
        } = &self.connection;
        ConnectedNode {
            record: Arc::clone(record),
            connection: *connection,
            peer: *peer,
            node_version: node_version.clone(),
            connected_since: self.connected_since,
            last_seen: from_millis(self.last_seen_ms.load(Ordering::Relaxed)),
            active_runs: self.active_runs.load(Ordering::Relaxed),
        }
    }

    fn load(&self) -> NodeLoad {
        NodeLoad {
            record: Arc::clone(&self.connection.record),
            active_runs: self.active_runs.load(Ordering::Relaxed),
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
}

/// The connected nodes, safe to share between tasks. Cheap to clone.
#[derive(Clone, Default)]
pub struct LockRegistry {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    maps: RwLock<Maps>,
    /// Entries ordered by id, valid while `stale` is false.
    sorted: ArcSwap<Vec<Arc<Entry>>>,
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

    /// The entries ordered by id, rebuilding the snapshot if membership changed.
    fn sorted(&self) -> Arc<Vec<Arc<Entry>>> {
        if self.inner.stale.load(Ordering::Acquire) {
            // Rebuild and publish under the read lock: writers, which set `stale` while they
            // hold the write lock, wait, so no older snapshot can overwrite a newer one.
            let maps = self.read();
            self.inner.stale.store(false, Ordering::Release);
            let mut entries: Vec<Arc<Entry>> = maps.by_id.values().cloned().collect();
            entries.sort_by(|a, b| a.connection.record.id().cmp(b.connection.record.id()));
            self.inner.sorted.store(Arc::new(entries));
        }
        self.inner.sorted.load_full()
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
        maps.by_id.insert(
            id,
            Arc::new(Entry {
                connection,
                connected_since: now,
                last_seen_ms: AtomicI64::new(to_millis(now)),
                active_runs: AtomicU32::new(0),
            }),
        );
        self.inner.stale.store(true, Ordering::Release);
        Ok(())
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
        self.sorted().iter().map(|entry| entry.report()).collect()
    }

    fn loads(&self) -> Vec<NodeLoad> {
        self.sorted().iter().map(|entry| entry.load()).collect()
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
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::net::SocketAddr;

    use super::*;
    use crate::domain::{AdapterConfig, AdapterName, NodeRecord, RuntimeConfig, Target, Token};
    use crate::ports::{LinkError, NodeCommand};

    struct NullLink;

    impl NodeLink for NullLink {
        fn send(&self, _command: NodeCommand) -> Result<(), LinkError> {
            Ok(())
        }
    }

    fn connection(id: &str, alias: &str, connection: ConnectionId) -> NewConnection {
        NewConnection {
            record: Arc::new(NodeRecord::new(
                NodeId::parse(id).unwrap(),
                Alias::parse(alias).unwrap(),
                Token::new(id).digest(),
                vec![
                    AdapterConfig::new(
                        AdapterName::parse("echo").unwrap(),
                        vec![Target::parse("t").unwrap()],
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
        }
    }

    fn id(s: &str) -> NodeId {
        NodeId::parse(s).unwrap()
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
        assert_eq!(registry.loads()[0].active_runs, 1);
        assert!(registry.remove(&id("a"), 2));
        assert!(registry.get("x").is_none());
        assert!(registry.is_empty());
        assert!(registry.loads().is_empty());
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
                        let _ = registry.loads();
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
}
