//! The nemesis's schedule: from the seed, one fault after another until the run's time is
//! up — which kind, on which process, held how long — each healed and the site's convergence
//! timed before the next (so "time to converge after each heal" is the site's alone). The
//! sequence is the seed's: every run of a seed draws the same gaps, kinds, targets and holds
//! in the same order ("the active member" being whichever acts then); only the site's time to
//! converge moves the faults in time, and so how many fit in the run. A kind that needs
//! partitions where none can be made is skipped, and the run says so.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use tokio::time::{Instant, sleep};

use super::history::Fault;
use super::{CONVERGE_BOUND, LEASE_MS, MEMBERS, NATS, NODES, Site};

/// The faults the nemesis makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    KillMember,
    KillMemberWipe,
    KillNats,
    KillNode,
    PauseMemberPastLease,
    PauseMemberShortOfLease,
    CutMemberFromNats,
    CutMemberFromNodes,
    CutNatsFromNats,
    CutNodeFromMembers,
    CutClient,
}

impl Kind {
    const ALL: [Kind; 11] = [
        Kind::KillMember,
        Kind::KillMemberWipe,
        Kind::KillNats,
        Kind::KillNode,
        Kind::PauseMemberPastLease,
        Kind::PauseMemberShortOfLease,
        Kind::CutMemberFromNats,
        Kind::CutMemberFromNodes,
        Kind::CutNatsFromNats,
        Kind::CutNodeFromMembers,
        Kind::CutClient,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::KillMember => "kill-member",
            Kind::KillMemberWipe => "kill-member-wipe",
            Kind::KillNats => "kill-nats",
            Kind::KillNode => "kill-node",
            Kind::PauseMemberPastLease => "pause-member-past-lease",
            Kind::PauseMemberShortOfLease => "pause-member-short-of-lease",
            Kind::CutMemberFromNats => "cut-member-from-nats",
            Kind::CutMemberFromNodes => "cut-member-from-nodes",
            Kind::CutNatsFromNats => "cut-nats-from-nats",
            Kind::CutNodeFromMembers => "cut-node-from-members",
            Kind::CutClient => "cut-client",
        }
    }

    fn partition(self) -> bool {
        matches!(
            self,
            Kind::CutMemberFromNats
                | Kind::CutMemberFromNodes
                | Kind::CutNatsFromNats
                | Kind::CutNodeFromMembers
        )
    }
}

pub(crate) struct Nemesis<'a> {
    rng: StdRng,
    faulting: &'a AtomicBool,
}

impl<'a> Nemesis<'a> {
    pub(crate) fn new(seed: u64, faulting: &'a AtomicBool) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
            faulting,
        }
    }

    fn millis(&mut self, from: u64, to: u64) -> Duration {
        Duration::from_millis(self.rng.random_range(from..to))
    }

    /// A member to hurt: the active one two times in three (where it hurts most). Both
    /// draws are made whichever member acts, so the seed's stream of draws — every later
    /// fault's kind, target and hold — is the same in every run.
    async fn member(&mut self, site: &Site) -> usize {
        let (roll, any) = (
            self.rng.random_range(0..3),
            self.rng.random_range(0..MEMBERS.len()),
        );
        match site.active().await.ok() {
            Some(active) if roll < 2 => active,
            _ => any,
        }
    }

    /// Faults until `duration` has passed; every one of them.
    pub(crate) async fn run(
        mut self,
        site: &mut Site,
        duration: Duration,
        ms: impl Fn() -> u64,
    ) -> Vec<Fault> {
        let end = Instant::now() + duration;
        let mut faults = Vec::new();
        while Instant::now() < end {
            let gap = self.millis(1_000, 4_000);
            sleep(gap).await;
            let kind = Kind::ALL[self.rng.random_range(0..Kind::ALL.len())];
            if kind.partition() && site.net.partitions().is_some() {
                continue;
            }
            self.faulting.store(true, Ordering::Release);
            let at_ms = ms();
            let target = self.fault(site, kind).await;
            let healed_ms = ms();
            let converged = site.converge(CONVERGE_BOUND).await;
            let converged_ms = converged.as_ref().ok().map(|_| ms() - healed_ms);
            self.faulting.store(false, Ordering::Release);
            eprintln!(
                "nemesis: {at_ms} ms {} {target}, healed {healed_ms} ms, converged {converged_ms:?} ms {}",
                kind.name(),
                converged.as_ref().err().map_or("", String::as_str)
            );
            faults.push(Fault {
                at_ms,
                kind: kind.name().to_owned(),
                target,
                healed_ms,
                converged_ms,
                unconverged: converged.err(),
            });
            if site.died().is_some() {
                // A process the nemesis did not kill is gone: the run ends, the checker says
                // why (the final convergence names it).
                break;
            }
        }
        faults
    }

    /// Makes fault `kind`, holds it, heals it; its target.
    async fn fault(&mut self, site: &mut Site, kind: Kind) -> String {
        match kind {
            Kind::KillMember | Kind::KillMemberWipe => {
                let m = self.member(site).await;
                site.members[m].kill().await;
                sleep(self.millis(500, 4_000)).await;
                if kind == Kind::KillMemberWipe {
                    super::site::wipe(&site.dir.join(MEMBERS[m]));
                }
                site.members[m].spawn(&site.net);
                MEMBERS[m].to_owned()
            }
            Kind::KillNats => {
                let n = self.rng.random_range(0..NATS.len());
                site.nats[n].kill().await;
                sleep(self.millis(500, 5_000)).await;
                site.nats[n].spawn(&site.net);
                super::site::nats_ready(&site.net, NATS[n]).await;
                NATS[n].to_owned()
            }
            Kind::KillNode => {
                let d = self.rng.random_range(0..NODES.len());
                site.nodes[d].kill().await;
                sleep(self.millis(500, 3_000)).await;
                site.nodes[d].spawn(&site.net);
                NODES[d].to_owned()
            }
            Kind::PauseMemberPastLease | Kind::PauseMemberShortOfLease => {
                let m = self.member(site).await;
                let hold = if kind == Kind::PauseMemberPastLease {
                    self.millis(LEASE_MS + 500, LEASE_MS + 4_000)
                } else {
                    self.millis(100, LEASE_MS / 4)
                };
                site.members[m].signal("-STOP");
                sleep(hold).await;
                site.members[m].signal("-CONT");
                MEMBERS[m].to_owned()
            }
            Kind::CutClient => {
                let pick = self.rng.random_range(0..1_000);
                let cut = site.balancer.cut(pick);
                format!(
                    "client connection {pick} ({})",
                    if cut { "cut" } else { "none open" }
                )
            }
            partition => self.partition(site, partition).await,
        }
    }

    /// Cuts a process off as `kind` says, holds the cut, heals it; the target.
    async fn partition(&mut self, site: &Site, kind: Kind) -> String {
        let (name, from): (&str, Vec<&str>) = match kind {
            Kind::CutMemberFromNats => (MEMBERS[self.member(site).await], NATS.to_vec()),
            Kind::CutMemberFromNodes => (MEMBERS[self.member(site).await], NODES.to_vec()),
            Kind::CutNatsFromNats => {
                let n = NATS[self.rng.random_range(0..NATS.len())];
                (n, NATS.iter().copied().filter(|o| *o != n).collect())
            }
            _ => (
                NODES[self.rng.random_range(0..NODES.len())],
                MEMBERS.to_vec(),
            ),
        };
        if let Err(why) = site.net.cut(name, &from) {
            return format!("{name}: cut failed: {why}");
        }
        sleep(self.millis(2_000, 9_000)).await;
        if let Err(why) = site.net.heal(name) {
            eprintln!("nemesis: healing {name} failed: {why}");
        }
        format!("{name} from {}", from.join(","))
    }
}
