//! The wait queue: bounded, by priority class, and fair across tenants within a class.
//!
//! Classes are served in strict priority (every interactive waiter is offered a slot before
//! any batch waiter). Within a class each tenant (API key) has its own FIFO and tenants take
//! turns round robin — deficit round robin with a unit cost per run — so a tenant's waiter
//! sees at most one run of each other tenant placed ahead of it per waiter of its own
//! ahead of it: a flood from one key delays another key by about one slot turnover.
//!
//! The queue holds at most `capacity` waiters. When full, a newcomer takes the place of the
//! newest waiter of the longest lower-priority tenant, or of the longest tenant in its own
//! class if that tenant has at least two more waiters than the newcomer's; otherwise the
//! newcomer is refused. A flood thus fills the queue only while nobody else needs it.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use crate::domain::event::RunId;
use crate::domain::names::{NameError, validate};

/// A run's priority class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub enum Priority {
    /// Someone is waiting for the answer (the default).
    #[default]
    Interactive,
    /// Throughput work that may wait for interactive runs.
    Batch,
}

impl Priority {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Interactive => "interactive",
            Self::Batch => "batch",
        }
    }

    /// `interactive` or `batch`.
    ///
    /// # Errors
    /// [`PriorityError::Unknown`] with the offending text otherwise.
    pub fn parse(value: &str) -> Result<Self, PriorityError> {
        match value {
            "interactive" => Ok(Self::Interactive),
            "batch" => Ok(Self::Batch),
            other => Err(PriorityError::Unknown {
                value: other.to_owned(),
            }),
        }
    }

    fn lane(self) -> usize {
        match self {
            Self::Interactive => 0,
            Self::Batch => 1,
        }
    }
}

/// A priority class [`Priority::parse`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PriorityError {
    /// The text names no class.
    #[error("`priority` {value:?} is not `interactive` or `batch`")]
    Unknown {
        /// The offending text.
        value: String,
    },
}

/// Whom a run counts against for fairness and limits: an API key's name, never its secret.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(Arc<str>);

impl TenantKey {
    /// The longest a tenant key may be, in bytes.
    pub const MAX_LEN: usize = 128;

    /// Validates and wraps a tenant name: 1 to [`TenantKey::MAX_LEN`] bytes, no control
    /// characters.
    ///
    /// # Errors
    /// [`NameError`] (of kind `tenant key`) when `value` is empty, too long, or holds a
    /// control character.
    pub fn parse(value: &str) -> Result<Self, NameError> {
        validate(
            "tenant key",
            value,
            Self::MAX_LEN,
            "any character but a control character",
            |c| !c.is_control(),
        )?;
        Ok(Self(Arc::from(value)))
    }

    /// The tenant of runs that carry no API key.
    pub fn anonymous() -> Self {
        Self(Arc::from("anonymous"))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", &*self.0)
    }
}

/// A queued run and what fairness needs to know about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter<T> {
    /// The run.
    pub id: RunId,
    /// Whom it counts against.
    pub tenant: TenantKey,
    /// Its class.
    pub priority: Priority,
    /// When it was queued.
    pub queued_at: Instant,
    /// The caller's payload (the run itself).
    pub item: T,
}

/// The queue was full and the newcomer had no claim to anyone's place; here it is back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueFull<T>(pub Waiter<T>);

#[derive(Debug)]
struct Slot<T> {
    seq: u64,
    waiter: Waiter<T>,
}

#[derive(Debug)]
struct Lane<T> {
    /// Each tenant's waiters, oldest first (so by increasing `seq`); never empty.
    tenants: HashMap<TenantKey, VecDeque<Slot<T>>>,
    /// Tenants with waiters, in the order they get their next turn.
    ring: VecDeque<TenantKey>,
}

impl<T> Default for Lane<T> {
    fn default() -> Self {
        Self {
            tenants: HashMap::new(),
            ring: VecDeque::new(),
        }
    }
}

impl<T> Lane<T> {
    /// The tenant with the most waiters, and how many.
    fn longest(&self) -> Option<(&TenantKey, usize)> {
        self.tenants
            .iter()
            .map(|(tenant, slots)| (tenant, slots.len()))
            .max_by_key(|(_, len)| *len)
    }

    fn waiting(&self, tenant: &TenantKey) -> usize {
        self.tenants.get(tenant).map_or(0, VecDeque::len)
    }

    fn forget_if_empty(&mut self, tenant: &TenantKey) {
        if self.tenants.get(tenant).is_some_and(VecDeque::is_empty) {
            self.tenants.remove(tenant);
            self.ring.retain(|t| t != tenant);
        }
    }
}

/// The bounded, prioritised, per-tenant fair queue of runs waiting for a node.
#[derive(Debug)]
pub struct FairQueue<T> {
    capacity: usize,
    len: usize,
    next_seq: u64,
    lanes: [Lane<T>; 2],
    index: HashMap<RunId, (Priority, TenantKey, u64)>,
}

impl<T> FairQueue<T> {
    /// An empty queue holding at most `capacity` waiters (at least 1).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            len: 0,
            next_seq: 0,
            lanes: [Lane::default(), Lane::default()],
            index: HashMap::new(),
        }
    }

    /// Waiters queued.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most waiters it holds.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `id` waits here.
    pub fn contains(&self, id: &RunId) -> bool {
        self.index.contains_key(id)
    }

    /// How many of `tenant`'s runs wait in `priority`'s class.
    pub fn waiting(&self, tenant: &TenantKey, priority: Priority) -> usize {
        self.lanes[priority.lane()].waiting(tenant)
    }

    /// Queues `waiter`. Returns the waiter that left to make room for it (displaced from a
    /// full queue, or an earlier entry with the same id), which the caller must end.
    ///
    /// # Errors
    /// [`QueueFull`] with the newcomer when the queue is full and nobody yields to it.
    pub fn push(&mut self, waiter: Waiter<T>) -> Result<Option<Waiter<T>>, QueueFull<T>> {
        let mut left = self.remove(&waiter.id);
        if self.len >= self.capacity {
            match self.victim(waiter.priority, &waiter.tenant) {
                Some(id) => left = self.remove(&id),
                None => return Err(QueueFull(waiter)),
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let lane = &mut self.lanes[waiter.priority.lane()];
        let slots = lane.tenants.entry(waiter.tenant.clone()).or_default();
        if slots.is_empty() {
            lane.ring.push_back(waiter.tenant.clone());
        }
        self.index.insert(
            waiter.id.clone(),
            (waiter.priority, waiter.tenant.clone(), seq),
        );
        slots.push_back(Slot { seq, waiter });
        self.len += 1;
        Ok(left)
    }

    /// Takes `id` out of the queue (cancel, timeout): a hash look-up, a binary search in its
    /// tenant's FIFO, and a pass over the class's tenants if it was the tenant's last.
    pub fn remove(&mut self, id: &RunId) -> Option<Waiter<T>> {
        let (priority, tenant, seq) = self.index.remove(id)?;
        let lane = &mut self.lanes[priority.lane()];
        let slots = lane.tenants.get_mut(&tenant)?;
        let position = slots.binary_search_by_key(&seq, |s| s.seq).ok()?;
        let slot = slots.remove(position)?;
        lane.forget_if_empty(&tenant);
        self.len -= 1;
        Some(slot.waiter)
    }

    /// Whose place a newcomer of `priority` from `tenant` takes in a full queue.
    fn victim(&self, priority: Priority, tenant: &TenantKey) -> Option<RunId> {
        let newest = |lane: &Lane<T>, t: &TenantKey| {
            lane.tenants.get(t)?.back().map(|s| s.waiter.id.clone())
        };
        let lower = &self.lanes[Priority::Batch.lane()];
        if priority == Priority::Interactive
            && let Some((longest, _)) = lower.longest()
        {
            return newest(lower, longest);
        }
        let own = &self.lanes[priority.lane()];
        let (longest, len) = own.longest()?;
        (len > own.waiting(tenant) + 1).then(|| newest(own, longest))?
    }

    /// Offers waiters to `place` in fair order — interactive before batch; within a class,
    /// tenants in turn, each tenant's waiters oldest first — and takes out every waiter
    /// `place` placed, with what it returned. A tenant served goes to the back of the turn
    /// order. `place` sees each waiter at most once per call.
    pub fn pump<P>(
        &mut self,
        mut place: impl FnMut(&Waiter<T>) -> Option<P>,
    ) -> Vec<(Waiter<T>, P)> {
        let mut placed = Vec::new();
        for lane in &mut self.lanes {
            let order: Vec<TenantKey> = lane.ring.iter().cloned().collect();
            let mut cursors = vec![0usize; order.len()];
            let mut served: Vec<TenantKey> = Vec::new();
            let mut offered = true;
            while offered {
                offered = false;
                for (tenant, cursor) in order.iter().zip(cursors.iter_mut()) {
                    let Some(slots) = lane.tenants.get_mut(tenant) else {
                        continue;
                    };
                    let Some(slot) = slots.get(*cursor) else {
                        continue;
                    };
                    offered = true;
                    let Some(result) = place(&slot.waiter) else {
                        *cursor += 1;
                        continue;
                    };
                    if let Some(slot) = slots.remove(*cursor) {
                        self.index.remove(&slot.waiter.id);
                        self.len -= 1;
                        placed.push((slot.waiter, result));
                    }
                    served.retain(|t| t != tenant);
                    served.push(tenant.clone());
                }
            }
            lane.ring.retain(|t| !served.contains(t));
            lane.ring.extend(served);
            let emptied: Vec<TenantKey> = order
                .into_iter()
                .filter(|t| lane.tenants.get(t).is_some_and(VecDeque::is_empty))
                .collect();
            for tenant in &emptied {
                lane.forget_if_empty(tenant);
            }
        }
        placed
    }

    /// Takes every waiter out (shutdown), interactive first, each class in arrival order.
    pub fn drain(&mut self) -> Vec<Waiter<T>> {
        let mut all: Vec<Slot<T>> = Vec::with_capacity(self.len);
        for lane in &mut self.lanes {
            let mut slots: Vec<Slot<T>> = lane.tenants.drain().flat_map(|(_, s)| s).collect();
            slots.sort_by_key(|s| s.seq);
            all.extend(slots);
            lane.ring.clear();
        }
        self.index.clear();
        self.len = 0;
        all.into_iter().map(|s| s.waiter).collect()
    }
}

#[cfg(test)]
#[path = "fair_queue_tests.rs"]
mod tests;
