//! Why the configured event sinks could not be built: [`SinkError`], returned by
//! `build_sinks` and by the adapters' constructors it calls.

use std::io;
use std::path::PathBuf;

use super::kind::SinkKind;

/// Why the configured sinks could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// `[events] queue_capacity` is 0.
    #[error("[events] queue_capacity must be at least 1")]
    ZeroCapacity,
    /// A sink kind appears twice in `[events] sinks`.
    #[error("[events] sinks lists `{}` more than once", .kind.as_str())]
    Duplicate {
        /// The repeated kind.
        kind: SinkKind,
    },
    /// `[events.file] path` names a directory.
    #[error("[events.file] path {} is a directory, not a file", .path.display())]
    FileIsDirectory {
        /// The configured path.
        path: PathBuf,
    },
    /// `[events.file] path` cannot be opened for appending.
    #[error(
        "cannot open [events.file] path {} for appending (does its directory exist, \
         and may the edge write there?)",
        .path.display()
    )]
    FileOpen {
        /// The configured path.
        path: PathBuf,
        /// Why the open failed.
        #[source]
        source: io::Error,
    },
    /// The thread of a sink that writes to a file or standard output could not be started.
    #[error("cannot start the thread of the `{}` event sink", .kind.as_str())]
    Thread {
        /// Which sink.
        kind: SinkKind,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The NATS sink cannot start: settings that cannot work, or a file named in
    /// `[events.nats]` that cannot be read (each named with its key).
    #[error("cannot start the NATS event sink: {detail}")]
    Nats {
        /// What is wrong.
        detail: String,
    },
    /// [`build_sinks`](super::build_sinks) was called outside a tokio runtime.
    #[error("event sinks must be built inside a tokio runtime (they spawn their drain tasks)")]
    NoRuntime,
}
