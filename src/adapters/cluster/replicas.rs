//! The warning a member gives once per stream when one of its site's streams — the lease's
//! bucket, the journal stream — was created with fewer replicas than `[cluster] replicas`
//! asks now: the site is less durable than its config says (docs/operations.md,
//! "Durability"), and only an operator can raise it (`nats stream edit … --replicas 3`).
//! A stream is created with the config's replicas, so this is a site whose config was raised
//! after its streams were made, or a stream someone made by hand.

use tracing::warn;

/// Warns when `stream` holds `found` replicas and the config asks for `asked`; whether it
/// did.
pub(super) fn warn_if_fewer(stream: &str, found: usize, asked: usize) -> bool {
    if found >= asked {
        return false;
    }
    warn!(
        stream,
        replicas = found,
        asked,
        "the site's stream {stream} holds {found} replica(s), fewer than `cluster.replicas` \
         ({asked}) asks: a NATS server's loss can lose what it acknowledged; raise it with \
         `nats stream edit {stream} --replicas {asked}`"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fewer_replicas_than_asked_warn() {
        assert!(warn_if_fewer("KV_edge-s1", 1, 3));
        assert!(!warn_if_fewer("KV_edge-s1", 3, 3));
        assert!(!warn_if_fewer("edge-s1-journal", 3, 1), "more is fine");
    }
}
