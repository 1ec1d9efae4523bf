//! [`SiteRole`]: whether this edge is the one that acts for its site — alone (no
//! `[cluster]`), the active member of a site (holding the lease, under an epoch), or a
//! standby — shared by whoever decides it (the cluster lease) and whoever acts on it (the
//! node transport stamps and refuses, the HTTP APIs and `/readyz` answer by it).
//!
//! A concrete handle rather than a trait, like [`super::Readiness`]: one value with one
//! meaning, watched rather than polled by those that must react to a change at once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

/// The member of a site that holds its lease, as a standby tells callers where to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveMember {
    /// The active member's `[edge] id`.
    pub edge_id: String,
    /// The address nodes dial there (`HOST:PORT`).
    pub node_address: String,
    /// The address its HTTP API answers on (`HOST:PORT`).
    pub api_address: String,
}

/// What this edge is to its site.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Role {
    /// No `[cluster]`: the edge is the whole site and always acts.
    #[default]
    Single,
    /// The member holding the site's lease; `epoch` is the lease's revision when it was
    /// acquired (renewals keep it), and every command to a node carries it.
    Active {
        /// The epoch this member acts under.
        epoch: u64,
    },
    /// A member that does not act: it refuses work and tells callers of the active member,
    /// when it knows one.
    Standby {
        /// The member holding the lease, when there is one.
        active: Option<ActiveMember>,
        /// Why this member stands by (no lease yet, another member holds it, different node
        /// definitions, the lease lost).
        reason: String,
    },
}

impl Role {
    /// Whether this member takes work: alone or active.
    pub fn acts(&self) -> bool {
        matches!(self, Role::Single | Role::Active { .. })
    }

    /// The epoch commands to nodes carry: the lease's while active, 0 otherwise (a single
    /// edge, or a standby that sends nothing).
    pub fn epoch(&self) -> u64 {
        match self {
            Role::Active { epoch } => *epoch,
            Role::Single | Role::Standby { .. } => 0,
        }
    }
}

/// Why an active member whose lease lapsed before it could notice stands by.
const LAPSED: &str = "this member's lease lapsed before it could renew it (was it paused?)";

/// The instant the lease bounds are counted from (the first one this process asked for).
fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

/// A cheap-to-clone, watchable [`Role`]: [`Role::Single`] unless a cluster lease sets it.
///
/// An active member also carries the instant its lease bounds its acting by
/// ([`SiteRole::act_until`]): past it the member does not act even before its lease task
/// notices — a member paused (SIGSTOP, a stalled VM) past its lease wakes up refusing
/// work, not admitting it for one more tick. The bound is read with every check but
/// changes nobody's watch (renewals would otherwise wake every connection).
#[derive(Debug, Clone)]
pub struct SiteRole {
    sender: Arc<watch::Sender<Role>>,
    /// Nanoseconds after [`base`] until which an active member acts; 0: no bound.
    acts_until: Arc<AtomicU64>,
    /// Whether this edge is a member of a site (made with a role other than
    /// [`Role::Single`]): only a member can ever stand by.
    member: bool,
}

impl Default for SiteRole {
    fn default() -> Self {
        Self::new(Role::Single)
    }
}

impl SiteRole {
    /// A handle starting as `role`: a member of a site unless `role` is [`Role::Single`].
    pub fn new(role: Role) -> Self {
        Self {
            member: role != Role::Single,
            sender: Arc::new(watch::Sender::new(role)),
            acts_until: Arc::default(),
        }
    }

    /// Whether this edge is a member of a site, and so may stand by: a single edge (no
    /// `[cluster]`) always acts, and what checks for a standby can leave itself out.
    pub fn is_member(&self) -> bool {
        self.member
    }

    /// The role as it was last set.
    pub fn current(&self) -> Role {
        self.sender.borrow().clone()
    }

    /// The role as it stands now: an active member past the bound of its lease counts as
    /// a standby until its lease task says so.
    pub fn effective(&self) -> Role {
        let role = self.current();
        match role {
            Role::Active { .. } if !self.within_lease() => Role::Standby {
                active: None,
                reason: LAPSED.to_owned(),
            },
            role => role,
        }
    }

    /// Whether this member takes work now.
    pub fn acts(&self) -> bool {
        self.sender.borrow().acts() && self.within_lease()
    }

    /// Bounds an active member's acting by `until` (its lease's expiry, less a margin);
    /// each renewal moves it on.
    pub fn act_until(&self, until: Instant) {
        let nanos = until.saturating_duration_since(base()).as_nanos();
        let nanos = u64::try_from(nanos).unwrap_or(u64::MAX).max(1);
        self.acts_until.store(nanos, Ordering::Release);
    }

    /// Whether now is within the bound of this member's lease (always, without one).
    pub fn within_lease(&self) -> bool {
        let until = self.acts_until.load(Ordering::Acquire);
        until == 0 || base().elapsed().as_nanos() < u128::from(until)
    }

    /// The epoch commands to nodes carry now.
    pub fn epoch(&self) -> u64 {
        self.sender.borrow().epoch()
    }

    /// Sets the role, waking every watcher when it changed; a role other than active
    /// drops the lease's bound.
    pub fn set(&self, role: Role) {
        if !matches!(role, Role::Active { .. }) {
            self.acts_until.store(0, Ordering::Release);
        }
        self.sender.send_if_modified(|current| {
            let changed = *current != role;
            *current = role;
            changed
        });
    }

    /// A receiver that wakes on every change of role.
    pub fn watch(&self) -> watch::Receiver<Role> {
        self.sender.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_single_edge_acts_under_no_epoch() {
        let role = SiteRole::default();
        assert!(role.acts());
        assert_eq!(role.epoch(), 0);
        assert!(!role.is_member());
        assert!(SiteRole::new(Role::Active { epoch: 1 }).is_member());
    }

    #[tokio::test]
    async fn watchers_see_a_change_and_only_a_change() {
        let role = SiteRole::new(Role::Active { epoch: 7 });
        let mut watcher = role.watch();
        watcher.borrow_and_update();
        role.set(Role::Active { epoch: 7 });
        assert!(!watcher.has_changed().unwrap_or(true));
        role.set(Role::Standby {
            active: None,
            reason: "lease lost".into(),
        });
        watcher.changed().await.ok();
        assert!(!watcher.borrow().acts());
        assert_eq!(role.epoch(), 0);
    }

    #[test]
    fn an_active_member_past_its_leases_bound_acts_no_more() {
        let role = SiteRole::new(Role::Active { epoch: 3 });
        role.act_until(Instant::now() + std::time::Duration::from_secs(60));
        assert!(role.acts());
        assert_eq!(role.effective(), Role::Active { epoch: 3 });
        role.act_until(Instant::now() - std::time::Duration::from_millis(1));
        assert!(
            !role.acts(),
            "the bound passed: a paused member wakes up standing by"
        );
        assert!(matches!(
            role.effective(),
            Role::Standby { active: None, .. }
        ));
        role.set(Role::Single);
        assert!(role.acts(), "a single edge has no lease to bound it");
    }
}
