//! The site's journal snapshots in a JetStream object store (`edge-<site>-snapshots`,
//! decision 53): one object, `journal`, a copy of the active member's journal file that
//! holds exactly the stream's batches up to the sequence its metadata names. A newer copy
//! replaces it; an older one never does. What a copy is and when one is taken is
//! `journal_stream.rs`'s; this module only stores and fetches them.

use std::collections::HashMap;
use std::path::Path;

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
    /// NATS's answer, as text, when the store cannot be read.
    pub(super) async fn newest(&self) -> Result<Option<Covered>, String> {
        let store = self.open().await?;
        match store.info(OBJECT).await {
            Ok(info) => covered(&info.metadata).map(Some),
            Err(error) if error.kind() == object_store::InfoErrorKind::NotFound => Ok(None),
            Err(error) => Err(format!("cannot read {}: {error}", self.bucket)),
        }
    }

    /// Stores the copy at `file` as covering `covered`, written by `edge`, unless the store
    /// holds one at least as new; returns whether it was stored.
    ///
    /// # Errors
    /// NATS's answer, or the file's error, as text.
    pub(super) async fn put(
        &self,
        file: &Path,
        covered: Covered,
        edge: &str,
    ) -> Result<bool, String> {
        if self
            .newest()
            .await?
            .is_some_and(|newest| newest.sequence >= covered.sequence)
        {
            return Ok(false);
        }
        let store = self.open().await?;
        let mut reader = tokio::fs::File::open(file)
            .await
            .map_err(|error| format!("cannot read {}: {error}", file.display()))?;
        let metadata = HashMap::from([
            (SEQUENCE_KEY.to_owned(), covered.sequence.to_string()),
            (EPOCH_KEY.to_owned(), covered.epoch.to_string()),
            (EDGE_KEY.to_owned(), edge.to_owned()),
        ]);
        let meta = object_store::ObjectMetadata {
            name: OBJECT.to_owned(),
            description: Some("the edge site's journal, as of a stream sequence".to_owned()),
            metadata,
            ..object_store::ObjectMetadata::default()
        };
        store
            .put(meta, &mut reader)
            .await
            .map_err(|error| format!("cannot store the journal snapshot: {error}"))?;
        Ok(true)
    }

    /// Writes the newest copy to `to`; what it covers, or `None` when there is none.
    ///
    /// # Errors
    /// NATS's answer, or the file's error, as text.
    pub(super) async fn fetch(&self, to: &Path) -> Result<Option<Covered>, String> {
        let store = self.open().await?;
        let mut object = match store.get(OBJECT).await {
            Ok(object) => object,
            Err(error) if error.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(format!("cannot read the journal snapshot: {error}")),
        };
        let covered = covered(&object.info().metadata)?;
        let mut file = tokio::fs::File::create(to)
            .await
            .map_err(|error| format!("cannot write {}: {error}", to.display()))?;
        tokio::io::copy(&mut object, &mut file)
            .await
            .map_err(|error| format!("cannot fetch the journal snapshot: {error}"))?;
        file.sync_all()
            .await
            .map_err(|error| format!("cannot write {}: {error}", to.display()))?;
        Ok(Some(covered))
    }

    /// The store, created when absent.
    ///
    /// Its stream is created here with the object store's conventions (`OBJ_<bucket>`
    /// capturing `$O.<bucket>.C.>` and `$O.<bucket>.M.>`, rollups and direct gets allowed),
    /// as the lease's bucket is (`kv.rs`), rather than by the client's
    /// `create_object_store`, written for newer servers than Debian's 2.9.
    async fn open(&self) -> Result<object_store::ObjectStore, String> {
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
            .map_err(|error| format!("cannot create the object store {bucket}: {error}"))?;
        self.js
            .get_object_store(bucket)
            .await
            .map_err(|error| format!("cannot open the object store {bucket}: {error}"))
    }
}

/// What a copy's metadata says it covers.
fn covered(metadata: &HashMap<String, String>) -> Result<Covered, String> {
    let number = |key: &str| {
        metadata
            .get(key)
            .and_then(|value| value.parse::<u64>().ok())
            .ok_or_else(|| format!("the journal snapshot has no readable `{key}`"))
    };
    Ok(Covered {
        sequence: number(SEQUENCE_KEY)?,
        epoch: number(EPOCH_KEY)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_without_its_sequence_is_not_taken_for_one() {
        let full = HashMap::from([
            (SEQUENCE_KEY.to_owned(), "41".to_owned()),
            (EPOCH_KEY.to_owned(), "7".to_owned()),
        ]);
        assert_eq!(
            covered(&full),
            Ok(Covered {
                sequence: 41,
                epoch: 7
            })
        );
        let mut damaged = full.clone();
        damaged.insert(SEQUENCE_KEY.to_owned(), "x".to_owned());
        assert!(covered(&damaged).unwrap_err().contains(SEQUENCE_KEY));
        assert!(covered(&HashMap::new()).is_err());
    }
}
