//! The file sink's writer: events as JSON lines appended to one file.
//!
//! The file is opened (created if missing, always appending) when the sink is built, so a
//! bad path is a startup error naming it. After a write error (disk full, directory
//! removed) the handle is dropped and the file reopened for the next write, so the sink
//! recovers by itself; queueing, batching, flushing and error reporting belong to the queue.
//! Because a removed or replaced file (a deleted directory, log rotation) silently keeps
//! accepting writes through an open handle on Unix, every write first checks that the path
//! still names the open file, and reopens the path when it does not.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::SinkError;
use super::lines::LineWriter;
use crate::adapters::event_format::LineFormat;

/// Opens `path` for appending, creating it if missing.
fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

/// The event file and the path it was opened at. Each write first makes sure the path
/// still names this file and otherwise reopens the path; when that fails, so does the
/// write, and the line writer's error handling takes over.
pub(crate) struct EventFile {
    path: PathBuf,
    file: File,
}

impl EventFile {
    /// Opens `path` for appending, creating it if missing.
    fn open(path: &Path) -> io::Result<Self> {
        Ok(Self {
            path: path.to_owned(),
            file: open(path)?,
        })
    }

    /// Reopens the path when it no longer names the open file (removed or replaced).
    fn follow_path(&mut self) -> io::Result<()> {
        if !names_file(&self.path, &self.file) {
            self.file = open(&self.path)?;
        }
        Ok(())
    }
}

impl io::Write for EventFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.follow_path()?;
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Whether `path` names the open `file` (same device and inode).
#[cfg(unix)]
fn names_file(path: &Path, file: &File) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(path), file.metadata()) {
        (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
        _ => false,
    }
}

/// Elsewhere an open file cannot be removed, so the path always names it.
#[cfg(not(unix))]
fn names_file(_path: &Path, _file: &File) -> bool {
    true
}

/// Opens `path` and returns the writer appending JSON lines to it.
///
/// # Errors
/// [`SinkError::FileIsDirectory`] when `path` is a directory; [`SinkError::FileOpen`] when it
/// cannot be opened for appending (its directory does not exist, permission denied, ...).
pub(crate) fn file_writer(path: &Path) -> Result<LineWriter<EventFile>, SinkError> {
    if fs::metadata(path).is_ok_and(|meta| meta.is_dir()) {
        return Err(SinkError::FileIsDirectory {
            path: path.to_owned(),
        });
    }
    let file = EventFile::open(path).map_err(|source| SinkError::FileOpen {
        path: path.to_owned(),
        source,
    })?;
    let path: PathBuf = path.to_owned();
    Ok(LineWriter::new(
        LineFormat::Json,
        file,
        Arc::new(move || EventFile::open(&path)),
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::adapters::event_format::tests::{completed, output};
    use crate::adapters::sinks::queue::{QueueSettings, QueuedSink};
    use crate::ports::EventSink;

    fn spawn(path: &Path) -> QueuedSink {
        let settings = QueueSettings {
            capacity: 1_000,
            flush_interval: Duration::from_millis(200),
        };
        QueuedSink::on_thread("file", file_writer(path).unwrap(), settings).unwrap()
    }

    fn lines(path: &Path) -> Vec<serde_json::Value> {
        fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn writes_one_json_object_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        let sink = spawn(&path);
        sink.publish(output("one\ntwo"));
        sink.publish(completed());
        sink.flush().await;
        let lines = lines(&path);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["kind"], "output");
        assert_eq!(lines[0]["text"], "one\ntwo");
        assert_eq!(lines[1]["kind"], "completed");
        assert_eq!(lines[1]["run_id"], "r1");
        assert_eq!(sink.stats().written(), 2);
    }

    #[tokio::test]
    async fn appends_to_an_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.jsonl");
        fs::write(&path, "{\"earlier\":true}\n").unwrap();
        let sink = spawn(&path);
        sink.publish(completed());
        sink.flush().await;
        let lines = lines(&path);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["earlier"], true);
        assert_eq!(lines[1]["kind"], "completed");
    }

    #[test]
    fn a_bad_path_is_a_startup_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no-such-dir").join("events.jsonl");
        let error = file_writer(&missing).err().unwrap();
        assert!(matches!(error, SinkError::FileOpen { .. }));
        assert!(
            error.to_string().contains(&missing.display().to_string()),
            "{error}"
        );

        let error = file_writer(dir.path()).err().unwrap();
        assert!(matches!(error, SinkError::FileIsDirectory { .. }));
        assert!(
            error
                .to_string()
                .contains(&dir.path().display().to_string()),
            "{error}"
        );
    }

    #[tokio::test]
    async fn write_errors_on_dev_full_are_counted_and_events_still_accepted() {
        let sink = spawn(Path::new("/dev/full"));
        sink.publish(output("a"));
        sink.flush().await;
        sink.publish(output("b"));
        sink.publish(completed());
        sink.flush().await;
        let stats = sink.stats();
        assert_eq!(stats.write_errors(), 2);
        assert_eq!(stats.queue_depth(), 0);
        assert_eq!(stats.dropped_queue_full(), 0);
    }

    #[tokio::test]
    async fn recovers_once_the_file_is_writable_again() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        fs::create_dir(&sub).unwrap();
        let path = sub.join("events.jsonl");
        // Start on a full device: every write fails.
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let sink = spawn(&path);
        let stats = sink.stats();
        sink.publish(output("lost to a full disk"));
        sink.flush().await;
        assert_eq!(stats.write_errors(), 1);

        // The directory disappears: reopening fails.
        fs::remove_dir_all(&sub).unwrap();
        sink.publish(output("lost to a missing directory"));
        sink.flush().await;
        assert_eq!(stats.write_errors(), 2);

        // The directory is back: the sink creates the file and carries on.
        fs::create_dir(&sub).unwrap();
        sink.publish(output("kept"));
        sink.publish(completed());
        sink.flush().await;
        assert_eq!(stats.write_errors(), 2);
        let lines = lines(&path);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0]["text"], "kept");
        assert_eq!(lines[1]["kind"], "completed");
    }
}
