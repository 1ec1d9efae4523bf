//! The site's bucket in JetStream KV: opened (created when absent, history 1), the key
//! `lease` read as a [`Seen`], written only if absent (`create`) or only at the revision
//! read (`update`, compare-and-set), watched, and released (a delete marker at the
//! revision last written). The lease's JSON lives here and nowhere else; a value that does not parse is
//! [`Seen::Unreadable`], never a panic.

use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::domain::site::{Lease, Seen};

/// The key holding the lease.
const LEASE_KEY: &str = "lease";

/// Why a write did not land.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// The key was not at the revision (or not absent) as the write required.
    #[error("another member wrote the lease first")]
    Conflict,
    /// NATS did not take the write.
    #[error("{0}")]
    Failed(String),
}

/// The lease as stored: JSON, unknown fields ignored (a later version may add some).
#[derive(Debug, Serialize, Deserialize)]
struct LeaseJson {
    edge_id: String,
    node_address: String,
    api_address: String,
    expires_at_ms: u64,
    node_definitions_digest: String,
}

/// The site's bucket, once opened.
pub(super) struct SiteBucket {
    store: kv::Store,
}

impl SiteBucket {
    /// Opens `bucket`, creating it (history 1, file storage, `replicas`) when absent.
    ///
    /// The bucket's stream is created here with the KV conventions (`KV_<bucket>` capturing
    /// `$KV.<bucket>.>`, one message per key, rollups and direct gets allowed, deletes of
    /// messages denied) rather than by the client's `create_key_value`, whose account query
    /// does not parse nats-server 2.9's answer.
    ///
    /// # Errors
    /// NATS's answer, as text, when the bucket can neither be found nor created.
    pub(super) async fn open(
        js: &jetstream::Context,
        bucket: &str,
        replicas: usize,
    ) -> Result<Self, String> {
        if let Ok(store) = js.get_key_value(bucket).await {
            return Ok(Self { store });
        }
        let config = jetstream::stream::Config {
            name: format!("KV_{bucket}"),
            description: Some("the edge site's lease".to_owned()),
            subjects: vec![format!("$KV.{bucket}.>")],
            max_messages_per_subject: 1,
            storage: jetstream::stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            deny_purge: false,
            allow_direct: true,
            num_replicas: replicas,
            discard: jetstream::stream::DiscardPolicy::New,
            ..jetstream::stream::Config::default()
        };
        // Another member may create it meanwhile: `get_or_create` binds to theirs.
        js.get_or_create_stream(config)
            .await
            .map_err(|error| format!("cannot create the KV bucket {bucket}: {error}"))?;
        js.get_key_value(bucket)
            .await
            .map(|store| Self { store })
            .map_err(|error| format!("cannot open the KV bucket {bucket}: {error}"))
    }

    /// The lease as it is now.
    ///
    /// # Errors
    /// NATS's answer, as text.
    pub(super) async fn read(&self) -> Result<Seen, String> {
        let entry = self
            .store
            .entry(LEASE_KEY)
            .await
            .map_err(|error| format!("cannot read the lease: {error}"))?;
        Ok(match entry {
            None => Seen::Absent,
            Some(entry) if entry.operation != kv::Operation::Put => Seen::Absent,
            Some(entry) => seen(entry.revision, &entry.value),
        })
    }

    /// Writes `lease` only if the key holds no lease; its revision.
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when a lease is there, else [`WriteError::Failed`].
    pub(super) async fn create(&self, lease: &Lease) -> Result<u64, WriteError> {
        self.store
            .create(LEASE_KEY, encode(lease))
            .await
            .map_err(|error| match error.kind() {
                kv::CreateErrorKind::AlreadyExists => WriteError::Conflict,
                _ => WriteError::Failed(format!("cannot create the lease: {error}")),
            })
    }

    /// Writes `lease` only if the key is still at `revision`; the new revision.
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when it is not, else [`WriteError::Failed`].
    pub(super) async fn update(&self, lease: &Lease, revision: u64) -> Result<u64, WriteError> {
        self.store
            .update(LEASE_KEY, encode(lease), revision)
            .await
            .map_err(|error| match error.kind() {
                kv::UpdateErrorKind::WrongLastRevision => WriteError::Conflict,
                _ => WriteError::Failed(format!("cannot write the lease: {error}")),
            })
    }

    /// A stream of every later write to the lease (a renewal, a release, a takeover), so a
    /// standby looks at once instead of at its next poll.
    ///
    /// # Errors
    /// NATS's answer, as text.
    pub(super) async fn watch(&self) -> Result<kv::Watch, String> {
        self.store
            .watch(LEASE_KEY)
            .await
            .map_err(|error| format!("cannot watch the lease: {error}"))
    }

    /// Deletes the lease if the key is still at `revision` (this member's last write), so a
    /// standby finds it absent and takes it at once.
    ///
    /// # Errors
    /// NATS's answer, as text (also when someone else wrote it since).
    pub(super) async fn release(&self, revision: u64) -> Result<(), String> {
        self.store
            .delete_expect_revision(LEASE_KEY, Some(revision))
            .await
            .map_err(|error| format!("cannot release the lease: {error}"))
    }
}

/// A stored value at `revision`, as a lease when it is one.
fn seen(revision: u64, value: &[u8]) -> Seen {
    match serde_json::from_slice::<LeaseJson>(value) {
        Ok(json) => Seen::Held {
            revision,
            lease: Lease {
                edge_id: json.edge_id,
                node_address: json.node_address,
                api_address: json.api_address,
                expires_at_ms: json.expires_at_ms,
                node_definitions_digest: json.node_definitions_digest,
            },
        },
        Err(_) => Seen::Unreadable { revision },
    }
}

/// `lease` as stored.
fn encode(lease: &Lease) -> Bytes {
    let Lease {
        edge_id,
        node_address,
        api_address,
        expires_at_ms,
        node_definitions_digest,
    } = lease.clone();
    let json = LeaseJson {
        edge_id,
        node_address,
        api_address,
        expires_at_ms,
        node_definitions_digest,
    };
    // A struct of strings and an integer always serializes.
    Bytes::from(serde_json::to_vec(&json).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_round_trips_and_garbage_is_unreadable() {
        let lease = Lease {
            edge_id: "edge-a".into(),
            node_address: "10.0.0.1:7100".into(),
            api_address: "10.0.0.1:8080".into(),
            expires_at_ms: 1_700_000_000_000,
            node_definitions_digest: "sha256:ab".into(),
        };
        let bytes = encode(&lease);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("\"expires_at_ms\":1700000000000"), "{text}");
        assert_eq!(seen(4, &bytes), Seen::Held { revision: 4, lease });
        for garbage in [&b""[..], b"{}", b"\xff\x00", b"{\"edge_id\":1}"] {
            assert_eq!(seen(9, garbage), Seen::Unreadable { revision: 9 });
        }
    }
}
