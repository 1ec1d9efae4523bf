//! The site's decisions, case by case and as properties: when a standby creates, takes
//! over, follows or refuses a lease, when a holder renews, acts or steps down, how long a
//! lease was seen unchanged; which batches of the stream are folded in which order and
//! from where; what a node's fence obeys; and the digest's canonical form.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use proptest::prelude::*;

use super::*;
use crate::domain::{AdapterConfig, AdapterName, Alias, NodeId, RuntimeConfig, Target, Token};

const TIMING: LeaseTiming = LeaseTiming {
    lease_ms: 3_000,
    renew_ms: 1_000,
};
const DIGEST: &str = "sha256:ours";

fn lease(expires_at_ms: u64, digest: &str) -> Lease {
    Lease {
        edge_id: "edge-a".into(),
        node_address: "10.0.0.1:7000".into(),
        api_address: "10.0.0.1:8080".into(),
        expires_at_ms,
        node_definitions_digest: digest.into(),
    }
}

fn held(revision: u64, expires_at_ms: u64, digest: &str) -> Seen {
    Seen::Held {
        revision,
        lease: lease(expires_at_ms, digest),
    }
}

#[test]
fn an_absent_lease_is_created() {
    assert_eq!(
        decide_standby(&Seen::Absent, DIGEST, 10_000, 0, TIMING),
        StandbyStep::Create
    );
}

#[test]
fn a_live_lease_is_followed() {
    let seen = held(7, 10_001, DIGEST);
    assert_eq!(
        decide_standby(&seen, DIGEST, 10_000, 60_000, TIMING),
        StandbyStep::Follow(lease(10_001, DIGEST))
    );
}

#[test]
fn a_lapsed_lease_is_taken_over_at_its_revision_once_seen_unchanged_for_a_lease() {
    let seen = held(7, 10_000, DIGEST);
    assert_eq!(
        decide_standby(&seen, DIGEST, 10_000, 2_999, TIMING),
        StandbyStep::AwaitLapse(Some(lease(10_000, DIGEST))),
        "a clock ahead of the holder's does not take over early"
    );
    assert_eq!(
        decide_standby(&seen, DIGEST, 10_000, 3_000, TIMING),
        StandbyStep::TakeOver { revision: 7 }
    );
}

#[test]
fn a_lease_of_other_node_definitions_is_never_taken_over() {
    let seen = held(7, 10_000, "sha256:theirs");
    for (now, unchanged) in [(0, 0), (20_000, 0), (u64::MAX, u64::MAX)] {
        assert_eq!(
            decide_standby(&seen, DIGEST, now, unchanged, TIMING),
            StandbyStep::Mismatch(lease(10_000, "sha256:theirs"))
        );
    }
}

#[test]
fn an_unreadable_value_is_taken_over_only_once_unchanged_for_a_lease() {
    let seen = Seen::Unreadable { revision: 3 };
    assert_eq!(
        decide_standby(&seen, DIGEST, 0, 2_999, TIMING),
        StandbyStep::AwaitLapse(None)
    );
    assert_eq!(
        decide_standby(&seen, DIGEST, 0, 3_000, TIMING),
        StandbyStep::TakeOver { revision: 3 }
    );
}

#[test]
fn a_holder_waits_renews_and_steps_down_by_the_clock() {
    let lease = Held::acquired(5, 13_000);
    assert_eq!(
        decide_active(&lease, 10_000, TIMING),
        ActiveStep::Wait { until_ms: 11_000 }
    );
    assert_eq!(decide_active(&lease, 11_000, TIMING), ActiveStep::Renew);
    assert_eq!(decide_active(&lease, 12_249, TIMING), ActiveStep::Renew);
    assert_eq!(
        decide_active(&lease, 12_250, TIMING),
        ActiveStep::StepDown(StepDown::Unreachable),
        "a quarter of the lease before the expiry it wrote"
    );
}

#[test]
fn renewals_keep_the_epoch() {
    let lease = Held::acquired(5, 13_000)
        .renewed(9, 14_000)
        .renewed(12, 15_000);
    assert_eq!(lease.epoch, 5);
    assert_eq!(lease.revision, 12);
    assert_eq!(lease.renew_at_ms(TIMING), 13_000);
}

#[test]
fn a_conflicting_renewal_steps_down_at_once() {
    let lease = Held::acquired(5, 13_000);
    assert_eq!(
        after_renew_failure(RenewFailure::Conflict, &lease, 11_000, TIMING),
        ActiveStep::StepDown(StepDown::Lost)
    );
}

#[test]
fn an_unreachable_nats_is_retried_until_the_margin_then_stepped_down_from() {
    let lease = Held::acquired(5, 13_000);
    assert_eq!(
        after_renew_failure(RenewFailure::Unreachable, &lease, 11_000, TIMING),
        ActiveStep::Wait { until_ms: 11_250 }
    );
    assert_eq!(
        after_renew_failure(RenewFailure::Unreachable, &lease, 12_100, TIMING),
        ActiveStep::Wait { until_ms: 12_250 },
        "the retry never waits past the step-down"
    );
    assert_eq!(
        after_renew_failure(RenewFailure::Unreachable, &lease, 12_250, TIMING),
        ActiveStep::StepDown(StepDown::Unreachable)
    );
}

#[test]
fn timing_problems_name_their_keys() {
    assert!(TIMING.problems("cluster").is_empty());
    let bad = LeaseTiming {
        lease_ms: 1_000,
        renew_ms: 600,
    };
    let problems = bad.problems("cluster").join("\n");
    assert!(problems.contains("`cluster.renew_ms` (600)"), "{problems}");
    let zero = LeaseTiming {
        lease_ms: 0,
        renew_ms: 0,
    };
    assert_eq!(zero.problems("cluster").len(), 2);
}

proptest! {
    /// Whatever the clock, a holder never acts past the margin before the expiry it wrote,
    /// and a renewal is attempted before it must step down.
    #[test]
    fn a_holder_never_acts_past_its_margin(
        expires in 0u64..1_000_000,
        now in 0u64..1_000_000,
        lease_ms in 4u64..100_000,
        renew_div in 2u64..10,
    ) {
        let timing = LeaseTiming { lease_ms, renew_ms: (lease_ms / renew_div).max(1) };
        let lease = Held::acquired(1, expires);
        let step = decide_active(&lease, now, timing);
        if now + timing.margin_ms() >= expires {
            prop_assert_eq!(step, ActiveStep::StepDown(StepDown::Unreachable));
        } else {
            prop_assert_ne!(step, ActiveStep::StepDown(StepDown::Unreachable));
        }
        prop_assert!(lease.renew_at_ms(timing) < lease.step_down_at_ms(timing) || expires < lease_ms);
        let retry = after_renew_failure(RenewFailure::Unreachable, &lease, now, timing);
        if let ActiveStep::Wait { until_ms } = retry {
            prop_assert!(until_ms <= lease.step_down_at_ms(timing));
            prop_assert!(until_ms > now);
        }
    }
}

fn record(id: &str, target: &str, slots: u32) -> Arc<NodeRecord> {
    let adapter = AdapterConfig::new(
        AdapterName::parse("echo").unwrap(),
        vec![Target::parse(target).unwrap()],
        BTreeMap::from([("k".to_owned(), "v".to_owned())]),
    )
    .unwrap();
    Arc::new(NodeRecord::new(
        NodeId::parse(id).unwrap(),
        Alias::parse(&format!("alias-{id}")).unwrap(),
        Token::new(id).digest(),
        vec![adapter],
        RuntimeConfig::new(slots, 1000, BTreeMap::new()).unwrap(),
    ))
}

#[test]
fn the_digest_ignores_order_and_sees_every_change() {
    let a = record("node-a", "m1", 2);
    let b = record("node-b", "m2", 2);
    let digest = definitions_digest(&[Arc::clone(&a), Arc::clone(&b)]);
    assert!(
        digest.starts_with("sha256:") && digest.len() == 7 + 64,
        "{digest}"
    );
    assert_eq!(
        digest,
        definitions_digest(&[Arc::clone(&b), Arc::clone(&a)])
    );
    for changed in [
        vec![Arc::clone(&a)],
        vec![Arc::clone(&a), record("node-b", "m3", 2)],
        vec![Arc::clone(&a), record("node-b", "m2", 3)],
        vec![Arc::clone(&a), record("node-c", "m2", 2)],
    ] {
        assert_ne!(digest, definitions_digest(&changed));
    }
    assert_ne!(definitions_digest(&[]), digest);
}

/// A node `id` with one adapter whose settings are `settings`.
fn record_with(id: &str, settings: &[(String, String)]) -> Arc<NodeRecord> {
    let adapter = AdapterConfig::new(
        AdapterName::parse("echo").unwrap(),
        vec![Target::parse("m1").unwrap()],
        settings.iter().cloned().collect(),
    )
    .unwrap();
    Arc::new(NodeRecord::new(
        NodeId::parse(id).unwrap(),
        Alias::parse(&format!("alias-{id}")).unwrap(),
        Token::new(id).digest(),
        vec![adapter],
        RuntimeConfig::new(1, 1000, BTreeMap::new()).unwrap(),
    ))
}

proptest! {
    #[test]
    fn members_with_the_same_definitions_in_any_order_agree_on_the_digest(
        ids in proptest::collection::btree_set("[a-z][a-z0-9-]{0,10}", 1..6),
        turn in 0_usize..6,
    ) {
        let records: Vec<Arc<NodeRecord>> = ids.iter().map(|id| record(id, "m1", 1)).collect();
        let mut other = records.clone();
        other.reverse();
        other.rotate_left(turn % records.len());
        prop_assert_eq!(definitions_digest(&records), definitions_digest(&other));
    }

    #[test]
    fn a_setting_split_differently_between_key_and_value_is_other_definitions(
        text in "[a-z]{2,12}",
        at in 1_usize..12,
    ) {
        // Length-prefixed fields: `ab = c` is not `a = bc`, nor one setting two.
        let at = at.min(text.len() - 1);
        let (key, value) = text.split_at(at);
        let one = definitions_digest(&[record_with("node-a", &[(key.to_owned(), value.to_owned())])]);
        let moved = definitions_digest(&[record_with("node-a", &[(text.clone(), String::new())])]);
        let two = definitions_digest(&[record_with(
            "node-a",
            &[(key.to_owned(), String::new()), (value.to_owned(), String::new())],
        )]);
        prop_assert_ne!(&one, &moved);
        prop_assert_ne!(&one, &two);
    }
}

/// A batch in the stream, as the folder reads it: who wrote it, under which epoch.
fn batch() -> impl Strategy<Value = (Option<String>, Option<u64>)> {
    let edge = prop_oneof![
        Just(None),
        Just(Some("a".to_owned())),
        Just(Some("b".to_owned())),
        Just(Some("me".to_owned())),
    ];
    (edge, proptest::option::weighted(0.9, 0_u64..8))
}

#[test]
fn a_member_folds_every_batch_in_order_but_its_own_of_this_life_and_stale_ones() {
    let own: HashSet<u64> = [9].into();
    let fold =
        |edge: &str, epoch: Option<u64>, newest| verdict(Some(edge), epoch, "b", &own, newest);
    assert_eq!(fold("a", Some(5), 5), Verdict::Apply, "another member's");
    assert_eq!(fold("a", Some(9), 5), Verdict::Apply, "a newer claim");
    assert_eq!(fold("b", Some(5), 5), Verdict::Apply, "an earlier life's");
    assert_eq!(fold("b", Some(9), 9), Verdict::Own);
    assert_eq!(fold("a", Some(4), 5), Verdict::Stale);
    assert_eq!(fold("a", None, 0), Verdict::Stale);
    assert_eq!(verdict(None, Some(9), "b", &own, 9), Verdict::Apply);
}

#[test]
fn a_member_behind_the_purge_rebuilds_from_the_snapshot_and_the_writer_reads_on() {
    assert_eq!(start(1, 0, false), Start::Next, "a new stream");
    assert_eq!(
        start(41, 40, false),
        Start::Next,
        "right after what it folded"
    );
    assert_eq!(
        start(30, 40, false),
        Start::Next,
        "it folded past the start"
    );
    assert_eq!(
        start(42, 40, false),
        Start::Snapshot,
        "purged past what it folded"
    );
    assert_eq!(start(42, 0, false), Start::Snapshot, "an empty disk");
    assert_eq!(start(42, 40, true), Start::First, "its own purge");
}

proptest! {
    #[test]
    fn batches_are_folded_in_stream_order_and_an_older_epoch_after_a_newer_is_refused(
        batches in proptest::collection::vec(batch(), 0..40),
        own in proptest::collection::hash_set(0_u64..8, 0..3),
    ) {
        // As the folder does: the verdict against the newest epoch folded before the batch,
        // the batch's epoch then counted whatever the verdict.
        let mut newest = 0;
        let mut applied = Vec::new();
        for (edge, epoch) in &batches {
            let seen_newest = newest;
            let verdict = verdict(edge.as_deref(), *epoch, "me", &own, seen_newest);
            newest = newest.max(epoch.unwrap_or(0));
            match verdict {
                Verdict::Apply => {
                    let epoch = epoch.expect("an applied batch has an epoch");
                    prop_assert!(epoch >= seen_newest);
                    prop_assert!(edge.as_deref() != Some("me") || !own.contains(&epoch));
                    applied.push(epoch);
                }
                Verdict::Own => {
                    prop_assert_eq!(edge.as_deref(), Some("me"));
                    prop_assert!(epoch.is_some_and(|e| own.contains(&e)));
                }
                Verdict::Stale => {
                    prop_assert!(epoch.is_none_or(|e| e < seen_newest));
                }
            }
        }
        prop_assert!(
            applied.windows(2).all(|pair| pair[0] <= pair[1]),
            "applied out of epoch order: {:?}", applied
        );
    }

    #[test]
    fn each_batch_is_folded_once_in_sequence_and_a_gap_starts_the_read_over(
        deliveries in proptest::collection::vec(1_u64..30, 0..60),
        writes in any::<bool>(),
    ) {
        let mut folded = 0;
        let mut applied = Vec::new();
        for seq in deliveries {
            match next(seq, folded, writes) {
                Next::Handled => prop_assert!(seq <= folded),
                Next::Gap => {
                    prop_assert!(!writes && seq > folded + 1);
                    break;
                }
                Next::Fold => {
                    prop_assert!(seq > folded);
                    prop_assert!(writes || seq == folded + 1);
                    applied.push(seq);
                    folded = seq;
                }
            }
        }
        prop_assert!(applied.windows(2).all(|pair| pair[0] < pair[1]), "{:?}", applied);
        if !writes {
            let contiguous: Vec<u64> = (1..=applied.len() as u64).collect();
            prop_assert_eq!(applied, contiguous);
        }
    }

    #[test]
    fn a_folder_rebuilds_exactly_when_the_stream_starts_past_it_and_it_does_not_write(
        first in 0_u64..1_000,
        folded in 0_u64..1_000,
        writes in any::<bool>(),
    ) {
        let start = start(first, folded, writes);
        prop_assert_eq!(start == Start::Next, first <= folded + 1);
        prop_assert_eq!(start == Start::Snapshot, first > folded + 1 && !writes);
    }
}

#[test]
fn a_holder_acts_only_before_the_margin_before_its_expiry() {
    let held = Held::acquired(7, 10_000);
    assert!(held.acts_at(7_000, TIMING));
    assert!(held.acts_at(9_249, TIMING));
    assert!(
        !held.acts_at(9_250, TIMING),
        "a quarter-lease before the expiry"
    );
    assert_eq!(
        decide_active(&held, 9_250, TIMING),
        ActiveStep::StepDown(StepDown::Unreachable),
        "the step down and the acting bound are one rule"
    );
}

#[test]
fn a_watch_counts_how_long_a_revision_stayed_unchanged_and_starts_over_on_a_write() {
    let mut watch = LeaseWatch::default();
    assert_eq!(watch.unchanged_for(Some(4), 1_000), 0, "the first look");
    assert_eq!(watch.unchanged_for(Some(4), 1_700), 700);
    assert_eq!(watch.unchanged_for(Some(5), 1_800), 0, "renewed");
    assert_eq!(watch.unchanged_for(Some(5), 2_100), 300);
    assert_eq!(watch.unchanged_for(None, 2_200), 0, "released");
    assert_eq!(watch.unchanged_for(None, 2_200 + 3_000), 3_000);
}

#[test]
fn a_node_obeys_the_highest_epoch_seen_and_refuses_an_older_one() {
    assert_eq!(fence(0, 0), Fence::Obey { highest: 0 }, "a single edge");
    assert_eq!(fence(0, 2), Fence::Obey { highest: 2 });
    assert_eq!(fence(2, 2), Fence::Obey { highest: 2 });
    assert_eq!(
        fence(2, 1),
        Fence::Stale { highest: 2 },
        "a paused ex-leader"
    );
    assert_eq!(
        fence(2, 0),
        Fence::Stale { highest: 2 },
        "a single edge after a site"
    );
    assert_eq!(fence(2, 3), Fence::Obey { highest: 3 });
}

#[test]
fn a_member_claims_the_stream_unless_a_newer_epoch_writes_it() {
    assert!(may_claim(0, 5), "a new stream");
    assert!(may_claim(5, 5), "its own batches of an earlier life");
    assert!(may_claim(4, 5));
    assert!(!may_claim(6, 5), "acquired after it");
}

proptest! {
    #[test]
    fn the_epochs_a_fenced_node_obeys_never_go_down(epochs in proptest::collection::vec(0_u64..6, 0..30)) {
        let mut highest = 0;
        let mut obeyed = Vec::new();
        for epoch in epochs {
            match fence(highest, epoch) {
                Fence::Obey { highest: now } => {
                    prop_assert_eq!(now, epoch);
                    highest = now;
                    obeyed.push(epoch);
                }
                Fence::Stale { highest: still } => {
                    prop_assert_eq!(still, highest);
                    prop_assert!(epoch < highest);
                }
            }
        }
        prop_assert!(obeyed.windows(2).all(|pair| pair[0] <= pair[1]), "{:?}", obeyed);
    }
}
