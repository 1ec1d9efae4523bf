//! Which member of the edge's site the node dials next: the addresses it was given
//! (`--edge A,B[,C]`), the one it dials now, and what a refusal or a failure makes of it.
//! Pure bookkeeping: the caller dials, waits and counts.
//!
//! The rules (docs/node.md, "A site of several edges"): start from the first address; a
//! standby's refusal that names the active member is followed at once, at most
//! [`REDIRECTS_AT_ONCE`] times in a row before the backoff's delay (never a tight loop
//! between two standbys naming each other); a failed dial or any other refusal moves on to
//! the next address in the list after the backoff; after a registered session ends the node
//! starts again from the member it was registered with.

/// The `SHUTTING_DOWN` refusals naming the active member that are followed at once, in a row;
/// the next one waits for the backoff's delay.
pub const REDIRECTS_AT_ONCE: u32 = 2;

/// When to dial the next address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dial {
    /// At once.
    Now,
    /// After the backoff's delay.
    AfterBackoff,
}

/// The addresses of a site's members and the one the node dials now.
#[derive(Debug, Clone)]
pub struct EdgeAddresses {
    list: Vec<String>,
    index: usize,
    current: String,
    redirects: u32,
}

impl EdgeAddresses {
    /// The addresses in `list` (in order), dialling the first; an empty list dials `""`,
    /// which fails (as an empty `--edge` always did).
    pub fn new(list: Vec<String>) -> Self {
        let list = if list.is_empty() {
            vec![String::new()]
        } else {
            list
        };
        Self {
            current: list[0].clone(),
            list,
            index: 0,
            redirects: 0,
        }
    }

    /// The address to dial now.
    pub fn current(&self) -> &str {
        &self.current
    }

    /// The node registered at the current address: after the session ends it starts again
    /// from there.
    pub fn registered(&mut self) {
        self.redirects = 0;
    }

    /// The dial failed, or the member refused without naming another: the next address in
    /// the list, after the backoff.
    pub fn failed(&mut self) {
        self.index = (self.index + 1) % self.list.len();
        self.current = self.list[self.index].clone();
    }

    /// A standby refused, naming the active member's node address `active`: dial it next —
    /// at once, unless that was already done [`REDIRECTS_AT_ONCE`] times in a row.
    pub fn redirected(&mut self, active: &str) -> Dial {
        active.clone_into(&mut self.current);
        if let Some(index) = self.list.iter().position(|a| a == active) {
            self.index = index;
        }
        self.redirects += 1;
        if self.redirects > REDIRECTS_AT_ONCE {
            self.redirects = 0;
            Dial::AfterBackoff
        } else {
            Dial::Now
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(list: &[&str]) -> EdgeAddresses {
        EdgeAddresses::new(list.iter().map(|a| (*a).to_owned()).collect())
    }

    #[test]
    fn one_address_is_dialled_again_and_again() {
        let mut site = site(&["a:1"]);
        assert_eq!(site.current(), "a:1");
        site.failed();
        assert_eq!(site.current(), "a:1");
        site.registered();
        assert_eq!(site.current(), "a:1");
    }

    #[test]
    fn failures_go_round_the_list_and_a_drop_starts_from_the_last_active() {
        let mut site = site(&["a:1", "b:2", "c:3"]);
        site.failed();
        assert_eq!(site.current(), "b:2");
        site.registered();
        // The session ended: the node dials b again first.
        assert_eq!(site.current(), "b:2");
        site.failed();
        site.failed();
        assert_eq!(site.current(), "a:1");
    }

    #[test]
    fn a_named_member_is_dialled_next_and_the_list_goes_on_from_it() {
        let mut site = site(&["a:1", "b:2", "c:3"]);
        assert_eq!(site.redirected("c:3"), Dial::Now);
        assert_eq!(site.current(), "c:3");
        site.failed();
        assert_eq!(site.current(), "a:1");
        // An address not in the list is dialled too; a failure there goes on in the list.
        assert_eq!(site.redirected("d:4"), Dial::Now);
        assert_eq!(site.current(), "d:4");
        site.failed();
        assert_eq!(site.current(), "b:2");
    }

    #[test]
    fn standbys_naming_each_other_wait_for_the_backoff_every_few_redirects() {
        let mut site = site(&["a:1", "b:2"]);
        let mut waits = 0;
        for round in 0..30 {
            let named = if round % 2 == 0 { "b:2" } else { "a:1" };
            if site.redirected(named) == Dial::AfterBackoff {
                waits += 1;
            }
        }
        assert_eq!(waits, 30 / (REDIRECTS_AT_ONCE as usize + 1));
        // Registering clears the count.
        site.registered();
        assert_eq!(site.redirected("a:1"), Dial::Now);
    }

    #[test]
    fn an_empty_list_dials_nothing_reachable() {
        let mut site = EdgeAddresses::new(Vec::new());
        assert_eq!(site.current(), "");
        site.failed();
        assert_eq!(site.current(), "");
    }
}
