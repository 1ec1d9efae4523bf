//! Tests of the fair queue: order, bounds, removal, and the bounded-delay property.

use std::collections::HashMap;

use proptest::prelude::*;

use super::*;

fn waiter(id: &str, tenant: &str, priority: Priority) -> Waiter<()> {
    Waiter {
        id: RunId::new(id),
        tenant: TenantKey::parse(tenant).unwrap(),
        priority,
        queued_at: Instant::now(),
        item: (),
    }
}

/// Places up to `slots` waiters, returning their ids in order.
fn serve(queue: &mut FairQueue<()>, slots: usize) -> Vec<String> {
    let mut left = slots;
    queue
        .pump(|_| {
            (left > 0).then(|| {
                left -= 1;
            })
        })
        .into_iter()
        .map(|(w, ())| w.id.to_string())
        .collect()
}

#[test]
fn tenants_take_turns_within_a_class() {
    let mut queue = FairQueue::new(100);
    for i in 0..5 {
        queue
            .push(waiter(&format!("a{i}"), "a", Priority::Interactive))
            .unwrap();
    }
    queue
        .push(waiter("b0", "b", Priority::Interactive))
        .unwrap();
    queue
        .push(waiter("b1", "b", Priority::Interactive))
        .unwrap();
    assert_eq!(serve(&mut queue, 1), ["a0"]);
    // a was served, so b goes first now.
    assert_eq!(serve(&mut queue, 3), ["b0", "a1", "b1"]);
    assert_eq!(serve(&mut queue, 10), ["a2", "a3", "a4"]);
    assert!(queue.is_empty());
}

#[test]
fn interactive_goes_before_batch() {
    let mut queue = FairQueue::new(100);
    queue.push(waiter("batch", "a", Priority::Batch)).unwrap();
    queue
        .push(waiter("chat", "a", Priority::Interactive))
        .unwrap();
    assert_eq!(serve(&mut queue, 1), ["chat"]);
    assert_eq!(serve(&mut queue, 1), ["batch"]);
}

#[test]
fn a_waiter_that_does_not_fit_does_not_block_others() {
    let mut queue = FairQueue::new(100);
    queue
        .push(waiter("x1", "a", Priority::Interactive))
        .unwrap();
    queue
        .push(waiter("y1", "a", Priority::Interactive))
        .unwrap();
    queue
        .push(waiter("x2", "b", Priority::Interactive))
        .unwrap();
    let placed: Vec<String> = queue
        .pump(|w| w.id.as_str().starts_with('y').then_some(()))
        .into_iter()
        .map(|(w, ())| w.id.to_string())
        .collect();
    assert_eq!(placed, ["y1"]);
    assert_eq!(queue.len(), 2);
}

#[test]
fn removal_by_id() {
    let mut queue = FairQueue::new(10);
    for i in 0..4 {
        queue
            .push(waiter(&format!("a{i}"), "a", Priority::Batch))
            .unwrap();
    }
    assert_eq!(queue.remove(&RunId::new("a2")).unwrap().id.as_str(), "a2");
    assert!(queue.remove(&RunId::new("a2")).is_none());
    assert!(!queue.contains(&RunId::new("a2")));
    assert_eq!(
        queue.waiting(&TenantKey::parse("a").unwrap(), Priority::Batch),
        3
    );
    assert_eq!(serve(&mut queue, 10), ["a0", "a1", "a3"]);
    // A tenant whose last waiter left leaves the turn order.
    queue.push(waiter("b0", "b", Priority::Batch)).unwrap();
    queue.remove(&RunId::new("b0"));
    assert!(queue.lanes[1].ring.is_empty() && queue.lanes[1].tenants.is_empty());
}

#[test]
fn a_full_queue_makes_a_flood_yield() {
    let mut queue = FairQueue::new(4);
    for i in 0..4 {
        queue
            .push(waiter(&format!("a{i}"), "a", Priority::Interactive))
            .unwrap();
    }
    // The flooding tenant cannot grow further.
    assert!(
        queue
            .push(waiter("a4", "a", Priority::Interactive))
            .is_err()
    );
    // Another tenant takes the flood's newest place, until they are even.
    let out = queue
        .push(waiter("b0", "b", Priority::Interactive))
        .unwrap();
    assert_eq!(out.unwrap().id.as_str(), "a3");
    let out = queue
        .push(waiter("b1", "b", Priority::Interactive))
        .unwrap();
    assert_eq!(out.unwrap().id.as_str(), "a2");
    assert!(
        queue
            .push(waiter("b2", "b", Priority::Interactive))
            .is_err()
    );
    assert_eq!(queue.len(), 4);
}

#[test]
fn interactive_displaces_batch_but_not_the_reverse() {
    let mut queue = FairQueue::new(2);
    queue
        .push(waiter("c0", "a", Priority::Interactive))
        .unwrap();
    queue.push(waiter("b0", "a", Priority::Batch)).unwrap();
    let out = queue
        .push(waiter("c1", "a", Priority::Interactive))
        .unwrap();
    assert_eq!(out.unwrap().id.as_str(), "b0");
    assert!(queue.push(waiter("b1", "z", Priority::Batch)).is_err());
}

#[test]
fn drain_returns_everyone_and_tenant_keys_validate() {
    let mut queue = FairQueue::new(10);
    queue.push(waiter("b", "t", Priority::Batch)).unwrap();
    queue.push(waiter("i", "t", Priority::Interactive)).unwrap();
    let ids: Vec<String> = queue
        .drain()
        .into_iter()
        .map(|w| w.id.to_string())
        .collect();
    assert_eq!(ids, ["i", "b"]);
    assert!(queue.is_empty());
    assert!(TenantKey::parse("").is_err());
    assert!(TenantKey::parse("a\nb").is_err());
    assert!(TenantKey::parse(&"k".repeat(129)).is_err());
    assert_eq!(Priority::parse("batch"), Ok(Priority::Batch));
    assert!(Priority::parse("urgent").is_err());
}

#[derive(Debug, Clone)]
enum Op {
    Push(u8),
    Serve,
    Cancel(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        // Tenant 0 floods: most pushes are its.
        4 => Just(Op::Push(0)),
        1 => (1u8..4).prop_map(Op::Push),
        3 => Just(Op::Serve),
        1 => any::<usize>().prop_map(Op::Cancel),
    ];
    proptest::collection::vec(op, 0..300)
}

proptest! {
    /// Under any interleaving of pushes, one-slot turnovers and cancels, a waiter sees at
    /// most (tenants - 1) runs of other tenants placed before it for each waiter of its own
    /// tenant ahead of it, itself included: a flood never starves anyone.
    #[test]
    fn a_flood_never_starves_another_tenant(ops in ops()) {
        const TENANTS: usize = 4;
        let mut queue = FairQueue::new(10_000);
        // Per waiting id: (tenant, bound, other tenants' runs placed since it was queued).
        let mut waiting: HashMap<String, (u8, usize, usize)> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        for (n, op) in ops.into_iter().enumerate() {
            match op {
                Op::Push(t) => {
                    let id = format!("{t}-{n}");
                    let ahead = waiting.values().filter(|(w, ..)| *w == t).count();
                    queue.push(waiter(&id, &format!("t{t}"), Priority::Interactive)).unwrap();
                    waiting.insert(id.clone(), (t, (TENANTS - 1) * (ahead + 1), 0));
                    order.push(id);
                }
                Op::Serve => {
                    for id in serve(&mut queue, 1) {
                        let (tenant, bound, others) = waiting.remove(&id).unwrap();
                        prop_assert!(others <= bound, "{} waited {} > {}", id, others, bound);
                        for (t, _, o) in waiting.values_mut() {
                            if *t != tenant {
                                *o += 1;
                            }
                        }
                    }
                }
                Op::Cancel(i) if !order.is_empty() => {
                    let id = order.swap_remove(i % order.len());
                    let removed = queue.remove(&RunId::new(id.as_str())).is_some();
                    prop_assert_eq!(removed, waiting.remove(&id).is_some());
                }
                Op::Cancel(_) => {}
            }
            prop_assert_eq!(queue.len(), waiting.len());
        }
    }
}
