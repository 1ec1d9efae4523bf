//! The site's bucket in JetStream KV: opened (created when absent, history 1), the key
//! `lease` read as a [`Seen`], written only if absent (`create`) or only at the revision
//! read (`update`, compare-and-set), watched, and released (a delete marker at the
//! revision last written). The lease's JSON lives here and nowhere else; a value that does not parse is
//! [`Seen::Unreadable`], never a panic.

use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamError, KeyValueError};
use async_nats::jetstream::{self, kv};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::domain::site::{Lease, Seen};

/// The key holding the lease.
const LEASE_KEY: &str = "lease";

/// A request to NATS that got no answer in time.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {} ms", .0.as_millis())]
pub(super) struct NoAnswer(pub(super) Duration);

/// Why the site's bucket, or the lease in it, could not be read or released.
#[derive(Debug, thiserror::Error)]
pub(super) enum BucketError {
    /// The bucket's stream could be neither found nor created.
    #[error("cannot create the KV bucket {bucket}: {source}")]
    Create {
        /// The bucket.
        bucket: String,
        /// NATS's answer.
        #[source]
        source: CreateStreamError,
    },
    /// The bucket's stream is there, but not as a bucket.
    #[error("cannot open the KV bucket {bucket}: {source}")]
    Open {
        /// The bucket.
        bucket: String,
        /// NATS's answer.
        #[source]
        source: KeyValueError,
    },
    /// The lease could not be read.
    #[error("cannot read the lease: {0}")]
    Read(#[source] kv::EntryError),
    /// The lease could not be watched.
    #[error("cannot watch the lease: {0}")]
    Watch(#[source] kv::WatchError),
    /// The lease could not be deleted (also when someone else wrote it since).
    #[error("cannot release the lease: {0}")]
    Release(#[source] kv::DeleteError),
    /// NATS did not answer in time.
    #[error(transparent)]
    NoAnswer(#[from] NoAnswer),
}

/// Why a write did not land.
#[derive(Debug, thiserror::Error)]
pub(super) enum WriteError {
    /// The key was not at the revision (or not absent) as the write required.
    #[error("another member wrote the lease first")]
    Conflict,
    /// NATS did not create the lease.
    #[error("cannot create the lease: {0}")]
    Create(#[source] kv::CreateError),
    /// NATS did not write the lease.
    #[error("cannot write the lease: {0}")]
    Update(#[source] kv::UpdateError),
    /// NATS did not answer in time.
    #[error(transparent)]
    NoAnswer(#[from] NoAnswer),
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
    /// [`BucketError::Create`] or [`BucketError::Open`] when the bucket can neither be found
    /// nor created.
    pub(super) async fn open(
        js: &jetstream::Context,
        bucket: &str,
        replicas: usize,
    ) -> Result<Self, BucketError> {
        if let Ok(store) = js.get_key_value(bucket).await {
            let name = format!("KV_{bucket}");
            if let Ok(stream) = js.get_stream(&name).await {
                super::replicas::warn_if_fewer(
                    &name,
                    stream.cached_info().config.num_replicas,
                    replicas,
                );
            }
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
            .map_err(|source| BucketError::Create {
                bucket: bucket.to_owned(),
                source,
            })?;
        js.get_key_value(bucket)
            .await
            .map(|store| Self { store })
            .map_err(|source| BucketError::Open {
                bucket: bucket.to_owned(),
                source,
            })
    }

    /// The lease as it is now.
    ///
    /// # Errors
    /// [`BucketError::Read`].
    pub(super) async fn read(&self) -> Result<Seen, BucketError> {
        let entry = self
            .store
            .entry(LEASE_KEY)
            .await
            .map_err(BucketError::Read)?;
        Ok(match entry {
            None => Seen::Absent,
            Some(entry) if entry.operation != kv::Operation::Put => Seen::Absent,
            Some(entry) => seen(entry.revision, &entry.value),
        })
    }

    /// Writes `lease` only if the key holds no lease; its revision.
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when a lease is there, else [`WriteError::Create`].
    pub(super) async fn create(&self, lease: &Lease) -> Result<u64, WriteError> {
        self.store
            .create(LEASE_KEY, encode(lease))
            .await
            .map_err(|error| match error.kind() {
                kv::CreateErrorKind::AlreadyExists => WriteError::Conflict,
                _ => WriteError::Create(error),
            })
    }

    /// Writes `lease` only if the key is still at `revision`; the new revision.
    ///
    /// # Errors
    /// [`WriteError::Conflict`] when it is not, else [`WriteError::Update`].
    pub(super) async fn update(&self, lease: &Lease, revision: u64) -> Result<u64, WriteError> {
        self.store
            .update(LEASE_KEY, encode(lease), revision)
            .await
            .map_err(|error| match error.kind() {
                kv::UpdateErrorKind::WrongLastRevision => WriteError::Conflict,
                _ => WriteError::Update(error),
            })
    }

    /// A stream of every later write to the lease (a renewal, a release, a takeover), so a
    /// standby looks at once instead of at its next poll.
    ///
    /// # Errors
    /// [`BucketError::Watch`].
    pub(super) async fn watch(&self) -> Result<kv::Watch, BucketError> {
        self.store
            .watch(LEASE_KEY)
            .await
            .map_err(BucketError::Watch)
    }

    /// Deletes the lease if the key is still at `revision` (this member's last write), so a
    /// standby finds it absent and takes it at once.
    ///
    /// # Errors
    /// [`BucketError::Release`] (also when someone else wrote it since).
    pub(super) async fn release(&self, revision: u64) -> Result<(), BucketError> {
        self.store
            .delete_expect_revision(LEASE_KEY, Some(revision))
            .await
            .map_err(BucketError::Release)
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
    use proptest::prelude::*;

    use super::*;

    fn lease() -> Lease {
        Lease {
            edge_id: "edge-a".into(),
            node_address: "10.0.0.1:7100".into(),
            api_address: "10.0.0.1:8080".into(),
            expires_at_ms: 1_700_000_000_000,
            node_definitions_digest: "sha256:ab".into(),
        }
    }

    #[test]
    fn a_lease_round_trips_and_garbage_is_unreadable() {
        let lease = lease();
        let bytes = encode(&lease);
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(text.contains("\"expires_at_ms\":1700000000000"), "{text}");
        assert_eq!(seen(4, &bytes), Seen::Held { revision: 4, lease });
        for garbage in [&b""[..], b"{}", b"\xff\x00", b"{\"edge_id\":1}"] {
            assert_eq!(seen(9, garbage), Seen::Unreadable { revision: 9 });
        }
    }

    #[test]
    fn a_lease_keeps_its_field_names_and_reads_past_fields_a_later_version_adds() {
        let text = String::from_utf8(encode(&lease()).to_vec()).unwrap();
        for field in [
            "\"edge_id\":\"edge-a\"",
            "\"node_address\":\"10.0.0.1:7100\"",
            "\"api_address\":\"10.0.0.1:8080\"",
            "\"node_definitions_digest\":\"sha256:ab\"",
        ] {
            assert!(text.contains(field), "{field} in {text}");
        }
        let later = text.replacen('{', "{\"zone\":\"eu-1\",", 1);
        assert_eq!(
            seen(5, later.as_bytes()),
            Seen::Held {
                revision: 5,
                lease: lease()
            }
        );
        let missing = text.replace("\"api_address\":\"10.0.0.1:8080\",", "");
        assert_eq!(
            seen(5, missing.as_bytes()),
            Seen::Unreadable { revision: 5 }
        );
    }

    #[test]
    fn a_write_that_lands_nowhere_says_why_as_the_standby_shows_it() {
        assert_eq!(
            WriteError::Conflict.to_string(),
            "another member wrote the lease first"
        );
        let late = WriteError::from(NoAnswer(Duration::from_millis(250)));
        assert_eq!(late.to_string(), "no answer within 250 ms");
        assert_eq!(
            BucketError::from(NoAnswer(Duration::from_secs(1))).to_string(),
            "no answer within 1000 ms"
        );
    }

    fn any_lease() -> impl Strategy<Value = Lease> {
        (".*", ".*", ".*", any::<u64>(), ".*").prop_map(
            |(edge_id, node_address, api_address, expires_at_ms, digest)| Lease {
                edge_id,
                node_address,
                api_address,
                expires_at_ms,
                node_definitions_digest: digest,
            },
        )
    }

    proptest! {
        #[test]
        fn every_lease_reads_back_as_written(lease in any_lease(), revision in any::<u64>()) {
            prop_assert_eq!(seen(revision, &encode(&lease)), Seen::Held { revision, lease });
        }

        #[test]
        fn any_value_is_a_lease_that_reads_back_the_same_or_unreadable_never_a_panic(
            value in proptest::collection::vec(any::<u8>(), 0..200),
            revision in any::<u64>(),
        ) {
            match seen(revision, &value) {
                Seen::Held { revision: at, lease } => {
                    prop_assert_eq!(at, revision);
                    let again = seen(revision, &encode(&lease));
                    prop_assert_eq!(again, Seen::Held { revision, lease });
                }
                Seen::Unreadable { revision: at } => prop_assert_eq!(at, revision),
                Seen::Absent => prop_assert!(false, "a value is never absent"),
            }
        }

        #[test]
        fn a_lease_cut_short_is_unreadable(lease in any_lease(), cut in 1_usize..40) {
            let bytes = encode(&lease);
            let short = &bytes[..bytes.len().saturating_sub(cut)];
            prop_assert_eq!(seen(3, short), Seen::Unreadable { revision: 3 });
        }
    }
}
