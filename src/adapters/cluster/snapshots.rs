//! The site's journal snapshots in a JetStream object store (`edge-<site>-snapshots`,
//! decision 53): one object, `journal`, a copy of the active member's journal file that
//! holds exactly the stream's batches up to the sequence its metadata names. A newer copy
//! replaces it; an older one never does. What a copy is and when one is taken is
//! `journal_stream.rs`'s; this module only stores and fetches them.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

use async_nats::jetstream::context::{CreateStreamError, ObjectStoreError};
use async_nats::jetstream::{self, object_store};

/// The object holding the newest copy.
const OBJECT: &str = "journal";
/// Metadata keys of the copy.
const SEQUENCE_KEY: &str = "stream-sequence";
const EPOCH_KEY: &str = "epoch";
const EDGE_KEY: &str = "edge";

/// What a stored copy holds: the site's stream up to `sequence`, the newest batch of it
/// written under `epoch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Covered {
    pub(super) sequence: u64,
    pub(super) epoch: u64,
}

impl Covered {
    /// What an empty journal covers: nothing of the stream.
    pub(super) const NOTHING: Covered = Covered {
        sequence: 0,
        epoch: 0,
    };

    /// Whether a stream starting at `first` folds on from a copy covering this: it holds
    /// every batch after the copy's (it starts at most right after it).
    pub(super) fn reaches(self, first: u64) -> bool {
        first <= self.sequence + 1
    }

    /// Whether a copy covering this replaces the store's `newest`: only a copy of a later
    /// sequence does (an older or equal one never replaces a copy).
    pub(super) fn replaces(self, newest: Option<Covered>) -> bool {
        newest.is_none_or(|newest| newest.sequence < self.sequence)
    }
}

/// Why the snapshot store could not be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum SnapshotError {
    /// The store's stream could be neither found nor created.
    #[error("cannot create the object store {bucket}: {source}")]
    Create {
        /// The store.
        bucket: String,
        /// NATS's answer.
        #[source]
        source: CreateStreamError,
    },
    /// The store's stream is there, but not as an object store.
    #[error("cannot open the object store {bucket}: {source}")]
    Open {
        /// The store.
        bucket: String,
        /// NATS's answer.
        #[source]
        source: ObjectStoreError,
    },
    /// What the store holds could not be read.
    #[error("cannot read {bucket}: {source}")]
    Info {
        /// The store.
        bucket: String,
        /// NATS's answer.
        #[source]
        source: object_store::InfoError,
    },
    /// A copy's metadata lacks the stream sequence or epoch it covers.
    #[error("the journal snapshot has no readable `{key}`")]
    Metadata {
        /// The metadata key.
        key: &'static str,
    },
    /// The copy to store cannot be read.
    #[error("cannot read {}: {source}", .path.display())]
    ReadFile {
        /// The copy.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The copy fetched cannot be written.
    #[error("cannot write {}: {source}", .path.display())]
    WriteFile {
        /// Where it goes.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// NATS did not store the copy.
    #[error("cannot store the journal snapshot: {0}")]
    Store(#[source] object_store::PutError),
    /// NATS did not hand the copy out.
    #[error("cannot read the journal snapshot: {0}")]
    Get(#[source] object_store::GetError),
    /// The copy broke off while it was fetched.
    #[error("cannot fetch the journal snapshot: {0}")]
    Fetch(#[source] io::Error),
}

/// The site's snapshot store.
pub(super) struct Snapshots {
    js: jetstream::Context,
    bucket: String,
    replicas: usize,
}

impl Snapshots {
    pub(super) fn new(js: jetstream::Context, site: &str, replicas: usize) -> Self {
        Self {
            js,
            bucket: format!("edge-{site}-snapshots"),
            replicas,
        }
    }

    /// What the newest copy covers; `None` when there is none.
    ///
    /// # Errors
    /// [`SnapshotError`] when the store cannot be read.
    pub(super) async fn newest(&self) -> Result<Option<Covered>, SnapshotError> {
        let store = self.open().await?;
        match store.info(OBJECT).await {
            Ok(info) => covered(&info.metadata).map(Some),
            Err(error) if error.kind() == object_store::InfoErrorKind::NotFound => Ok(None),
            Err(source) => Err(SnapshotError::Info {
                bucket: self.bucket.clone(),
                source,
            }),
        }
    }

    /// Stores the copy at `file` as covering `covered`, written by `edge`, unless the store
    /// holds one at least as new; returns whether it was stored.
    ///
    /// # Errors
    /// [`SnapshotError`]: NATS's answer, or the file's error.
    pub(super) async fn put(
        &self,
        file: &Path,
        covered: Covered,
        edge: &str,
    ) -> Result<bool, SnapshotError> {
        if !covered.replaces(self.newest().await?) {
            return Ok(false);
        }
        let store = self.open().await?;
        let mut reader =
            tokio::fs::File::open(file)
                .await
                .map_err(|source| SnapshotError::ReadFile {
                    path: file.to_owned(),
                    source,
                })?;
        let meta = object_store::ObjectMetadata {
            name: OBJECT.to_owned(),
            description: Some("the edge site's journal, as of a stream sequence".to_owned()),
            metadata: metadata(covered, edge),
            ..object_store::ObjectMetadata::default()
        };
        store
            .put(meta, &mut reader)
            .await
            .map_err(SnapshotError::Store)?;
        Ok(true)
    }

    /// Writes the newest copy to `to`; what it covers, or `None` when there is none.
    ///
    /// # Errors
    /// [`SnapshotError`]: NATS's answer, or the file's error.
    pub(super) async fn fetch(&self, to: &Path) -> Result<Option<Covered>, SnapshotError> {
        let store = self.open().await?;
        let mut object = match store.get(OBJECT).await {
            Ok(object) => object,
            Err(error) if error.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(SnapshotError::Get(error)),
        };
        let covered = covered(&object.info().metadata)?;
        let unwritable = |source| SnapshotError::WriteFile {
            path: to.to_owned(),
            source,
        };
        let mut file = tokio::fs::File::create(to).await.map_err(unwritable)?;
        tokio::io::copy(&mut object, &mut file)
            .await
            .map_err(SnapshotError::Fetch)?;
        file.sync_all().await.map_err(unwritable)?;
        Ok(Some(covered))
    }

    /// The store, created when absent.
    ///
    /// Its stream is created here with the object store's conventions (`OBJ_<bucket>`
    /// capturing `$O.<bucket>.C.>` and `$O.<bucket>.M.>`, rollups and direct gets allowed),
    /// as the lease's bucket is (`kv.rs`), rather than by the client's
    /// `create_object_store`, written for newer servers than Debian's 2.9.
    async fn open(&self) -> Result<object_store::ObjectStore, SnapshotError> {
        let bucket = &self.bucket;
        if let Ok(store) = self.js.get_object_store(bucket).await {
            return Ok(store);
        }
        let config = jetstream::stream::Config {
            name: format!("OBJ_{bucket}"),
            description: Some("the edge site's journal snapshots".to_owned()),
            subjects: vec![format!("$O.{bucket}.C.>"), format!("$O.{bucket}.M.>")],
            storage: jetstream::stream::StorageType::File,
            num_replicas: self.replicas,
            discard: jetstream::stream::DiscardPolicy::New,
            allow_rollup: true,
            allow_direct: true,
            ..jetstream::stream::Config::default()
        };
        // Another member may create it meanwhile: `get_or_create` binds to theirs.
        self.js
            .get_or_create_stream(config)
            .await
            .map_err(|source| SnapshotError::Create {
                bucket: bucket.clone(),
                source,
            })?;
        self.js
            .get_object_store(bucket)
            .await
            .map_err(|source| SnapshotError::Open {
                bucket: bucket.clone(),
                source,
            })
    }
}

/// The metadata of a copy covering `covered`, stored by `edge`.
fn metadata(covered: Covered, edge: &str) -> HashMap<String, String> {
    HashMap::from([
        (SEQUENCE_KEY.to_owned(), covered.sequence.to_string()),
        (EPOCH_KEY.to_owned(), covered.epoch.to_string()),
        (EDGE_KEY.to_owned(), edge.to_owned()),
    ])
}

/// What a copy's metadata says it covers.
fn covered(metadata: &HashMap<String, String>) -> Result<Covered, SnapshotError> {
    let number = |key: &'static str| {
        metadata
            .get(key)
            .and_then(|value| value.parse::<u64>().ok())
            .ok_or(SnapshotError::Metadata { key })
    };
    Ok(Covered {
        sequence: number(SEQUENCE_KEY)?,
        epoch: number(EPOCH_KEY)?,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn at(sequence: u64, epoch: u64) -> Covered {
        Covered { sequence, epoch }
    }

    #[test]
    fn a_copy_without_its_sequence_is_not_taken_for_one() {
        let full = HashMap::from([
            (SEQUENCE_KEY.to_owned(), "41".to_owned()),
            (EPOCH_KEY.to_owned(), "7".to_owned()),
        ]);
        assert_eq!(covered(&full).ok(), Some(at(41, 7)));
        let mut damaged = full.clone();
        damaged.insert(SEQUENCE_KEY.to_owned(), "x".to_owned());
        let error = covered(&damaged).unwrap_err();
        assert!(
            matches!(error, SnapshotError::Metadata { key: SEQUENCE_KEY }),
            "{error:?}"
        );
        assert_eq!(
            error.to_string(),
            "the journal snapshot has no readable `stream-sequence`"
        );
        let mut no_epoch = full.clone();
        no_epoch.remove(EPOCH_KEY);
        assert!(matches!(
            covered(&no_epoch),
            Err(SnapshotError::Metadata { key: EPOCH_KEY })
        ));
        assert!(covered(&HashMap::new()).is_err());
    }

    #[test]
    fn only_a_later_copy_replaces_the_newest_and_a_stream_past_a_copy_is_not_reached_from_it() {
        assert!(at(1, 1).replaces(None), "the first copy");
        assert!(at(41, 7).replaces(Some(at(40, 9))));
        assert!(!at(40, 9).replaces(Some(at(40, 7))), "the same sequence");
        assert!(!at(39, 9).replaces(Some(at(40, 7))), "an older copy");
        assert!(at(40, 7).reaches(41) && at(40, 7).reaches(3));
        assert!(!at(40, 7).reaches(42), "the batch at 41 is in neither");
        assert!(Covered::NOTHING.reaches(1) && !Covered::NOTHING.reaches(2));
    }

    proptest! {
        #[test]
        fn a_copys_metadata_says_what_it_covers_and_who_stored_it(
            sequence in any::<u64>(),
            epoch in any::<u64>(),
            edge in "[a-zA-Z0-9_-]{1,64}",
        ) {
            let metadata = metadata(at(sequence, epoch), &edge);
            prop_assert_eq!(covered(&metadata).ok(), Some(at(sequence, epoch)));
            prop_assert_eq!(metadata.get(EDGE_KEY), Some(&edge));
        }

        #[test]
        fn of_two_copies_at_most_one_replaces_the_other(
            a in (any::<u64>(), any::<u64>()),
            b in (any::<u64>(), any::<u64>()),
        ) {
            let (a, b) = (at(a.0, a.1), at(b.0, b.1));
            prop_assert!(!(a.replaces(Some(b)) && b.replaces(Some(a))));
            prop_assert_eq!(a.replaces(Some(b)), a.sequence > b.sequence);
        }

        #[test]
        fn a_member_folds_on_from_a_copy_only_when_the_stream_holds_every_later_batch(
            sequence in 0_u64..1_000,
            first in 0_u64..1_000,
        ) {
            // The batches neither the copy (up to `sequence`) nor the stream (from `first`)
            // holds.
            let lost = (sequence + 1..first).count();
            prop_assert_eq!(at(sequence, 1).reaches(first), lost == 0);
        }
    }
}
