//! The stream's bookkeeping case by case: what an append's answer means, who a batch's
//! headers name, which sequences are remembered; a member's message ids never repeat.

use std::collections::HashSet;

use async_nats::HeaderMap;
use async_nats::jetstream::context::{PublishError, PublishErrorKind};
use async_nats::jetstream::publish::PublishAck;
use proptest::prelude::*;

use super::*;
use crate::domain::site::{Verdict, verdict};

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

proptest! {
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
