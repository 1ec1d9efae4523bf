//! The stream's rules case by case, and as properties over any sequence of batches: the
//! folder applies them in stream order, once each, never one of an older epoch after a
//! newer one; a member behind the purge rebuilds; a member's message ids never repeat.

use std::collections::HashSet;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use proptest::prelude::*;

use super::*;

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
fn only_a_wrong_last_sequence_fences_a_writer() {
    let ack = PublishAck {
        sequence: 12,
        duplicate: true,
        ..PublishAck::default()
    };
    assert!(
        matches!(Appended::of(Ok(ack)), Appended::At(12)),
        "a retried append's duplicate"
    );
    let refused = PublishError::new(PublishErrorKind::WrongLastSequence);
    assert!(matches!(Appended::of(Err(refused)), Appended::Refused));
    let timed_out = PublishError::new(PublishErrorKind::TimedOut);
    assert!(matches!(
        Appended::of(Err(timed_out)),
        Appended::Failed(error) if error.kind() == PublishErrorKind::TimedOut
    ));
}

#[test]
fn a_batch_without_readable_headers_comes_from_nobody_and_is_stale() {
    let none = Origin::of(None);
    assert_eq!(
        none,
        Origin {
            edge: None,
            epoch: None
        }
    );
    let mut garbled = HeaderMap::new();
    garbled.insert("Edge-Id", "edge-a");
    garbled.insert("Edge-Epoch", "seven");
    let origin = Origin::of(Some(&garbled));
    assert_eq!(origin.edge.as_deref(), Some("edge-a"));
    assert_eq!(origin.epoch, None);
    let verdict = verdict(
        origin.edge.as_deref(),
        origin.epoch,
        "b",
        &HashSet::new(),
        0,
    );
    assert_eq!(
        verdict,
        Verdict::Stale,
        "an edge of another version, or damage"
    );
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

#[test]
fn the_oldest_remembered_sequence_is_forgotten_past_the_limit() {
    let mut acked = Acked::default();
    let kept = ACKED_KEPT as u64;
    for n in 1..=kept + 1 {
        acked.push(n, 100 + n);
    }
    assert_eq!(acked.sequence_of(1), None, "forgotten");
    assert_eq!(acked.sequence_of(2), Some(102));
    assert_eq!(acked.sequence_of(kept + 1), Some(101 + kept));
    assert_eq!(acked.sequence_of(kept + 2), None, "not published yet");
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

    #[test]
    fn a_batchs_headers_say_who_wrote_it_under_which_epoch(
        edge in "[a-zA-Z0-9_-]{1,32}",
        epoch in any::<u64>(),
    ) {
        let headers = signed(&edge, epoch);
        prop_assert_eq!(
            Origin::of(Some(&headers)),
            Origin { edge: Some(edge), epoch: Some(epoch) }
        );
    }

    #[test]
    fn a_members_message_ids_never_repeat_across_epochs_batches_and_claims(
        edge in "[a-z0-9-]{1,16}",
        a in (0_u64..50, 1_u64..50),
        b in (0_u64..50, 1_u64..50),
    ) {
        prop_assert_eq!(batch_id(&edge, a.0, a.1) == batch_id(&edge, b.0, b.1), a == b);
        prop_assert_eq!(claim_id(&edge, a.0) == claim_id(&edge, b.0), a.0 == b.0);
        prop_assert_ne!(batch_id(&edge, a.0, a.1), claim_id(&edge, b.0));
    }
}
