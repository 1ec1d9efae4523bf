//! [`SiteRole`]: whether this edge is the one that acts for its site — alone (no
//! `[cluster]`), the active member of a site (holding the lease, under an epoch), or a
//! standby — shared by whoever decides it (the cluster lease) and whoever acts on it (the
//! node transport stamps and refuses, the HTTP APIs and `/readyz` answer by it).
//!
//! A concrete handle rather than a trait, like [`super::Readiness`]: one value with one
//! meaning, watched rather than polled by those that must react to a change at once.

use async_trait::async_trait;
use tokio::sync::watch;

/// What a member does after it acquired its site's lease and before it acts (its role set
/// to [`Role::Active`]): catch up on the site's journal and take the open runs over; and
/// what it does when it stops acting.
#[async_trait]
pub trait TakeOver: Send + Sync {
    /// Makes this member ready to act under `epoch`.
    ///
    /// # Errors
    /// Why it cannot act (the site's journal cannot be read to its end): the member then
    /// does not turn active, and lets the lease lapse.
    async fn prepare(&self, epoch: u64) -> Result<(), String>;

    /// This member stopped acting (its role is a standby's already): let go of what it
    /// held as the active member, ending nothing. The lease takes no step before it returns.
    async fn stand_down(&self);
}

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

/// A cheap-to-clone, watchable [`Role`]: [`Role::Single`] unless a cluster lease sets it.
#[derive(Debug, Clone)]
pub struct SiteRole {
    sender: std::sync::Arc<watch::Sender<Role>>,
}

impl Default for SiteRole {
    fn default() -> Self {
        Self::new(Role::Single)
    }
}

impl SiteRole {
    /// A handle starting as `role`.
    pub fn new(role: Role) -> Self {
        Self {
            sender: std::sync::Arc::new(watch::Sender::new(role)),
        }
    }

    /// The role now.
    pub fn current(&self) -> Role {
        self.sender.borrow().clone()
    }

    /// Whether this member takes work now.
    pub fn acts(&self) -> bool {
        self.sender.borrow().acts()
    }

    /// The epoch commands to nodes carry now.
    pub fn epoch(&self) -> u64 {
        self.sender.borrow().epoch()
    }

    /// Sets the role, waking every watcher when it changed.
    pub fn set(&self, role: Role) {
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
}
