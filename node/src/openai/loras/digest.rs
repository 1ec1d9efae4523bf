//! The SHA-256 of a LoRA's weights, which tells two nodes' LoRAs of one name apart: of a
//! file's bytes (llama-server's GGUF), or of a folder's files (vLLM's LoRA folder), each
//! file's path below the folder and bytes in turn, in path order.
//!
//! Blocking file I/O: callers run it off the runtime's threads, once per path and change of
//! its length or modification time ([`stamp`]; the table keeps what it found).

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// What identifies one version of a path without reading it: its length and modification
/// time (of a folder: its files' summed length and latest time).
pub type Stamp = (u64, Option<SystemTime>);

/// The stamp of `path`, or `None` when it cannot be read.
pub fn stamp(path: &Path) -> Option<Stamp> {
    let meta = fs::metadata(path).ok()?;
    if meta.is_file() {
        return Some((meta.len(), meta.modified().ok()));
    }
    let files = files_of(path).ok()?;
    let mut stamp: Stamp = (0, None);
    for file in files {
        let meta = fs::metadata(path.join(&file)).ok()?;
        stamp.0 = stamp.0.saturating_add(meta.len());
        stamp.1 = stamp.1.max(meta.modified().ok());
    }
    Some(stamp)
}

/// The lowercase hex SHA-256 of `path`'s weights (see the module's note); `None` when it
/// cannot be read.
pub fn sha256(path: &Path) -> Option<String> {
    let mut hasher = Sha256::new();
    if fs::metadata(path).ok()?.is_file() {
        feed(&mut hasher, path).ok()?;
    } else {
        for file in files_of(path).ok()? {
            hasher.update(file.to_string_lossy().as_bytes());
            hasher.update([0]);
            feed(&mut hasher, &path.join(&file)).ok()?;
        }
    }
    Some(
        hasher
            .finalize()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect(),
    )
}

fn feed(hasher: &mut Sha256, file: &Path) -> io::Result<()> {
    let mut file = File::open(file)?;
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(());
        }
        hasher.update(&buffer[..read]);
    }
}

/// Every regular file below `folder`, as paths relative to it, in order.
fn files_of(folder: &Path) -> io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for entry in fs::read_dir(folder.join(&relative))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = relative.join(entry.file_name());
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                found.push(path);
            }
        }
    }
    found.sort();
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_and_a_folder_are_told_apart_by_their_bytes() {
        let dir = std::env::temp_dir().join(format!("edge-digest-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        fs::create_dir_all(a.join("nested")).expect("folders");
        fs::create_dir_all(&b).expect("folders");
        fs::write(a.join("adapter_config.json"), "{}").expect("write");
        fs::write(a.join("nested").join("w.bin"), [1, 2, 3]).expect("write");
        fs::write(b.join("adapter_config.json"), "{}").expect("write");
        let empty = Sha256::digest(b"");
        let empty: String = empty.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(sha256(&b.join("adapter_config.json")).unwrap().len(), 64);
        assert_ne!(sha256(&a), sha256(&b));
        assert_ne!(sha256(&a).unwrap(), empty);
        fs::write(b.join("nested"), [1, 2, 3]).expect("write");
        // Same bytes under another path are other weights.
        assert_ne!(sha256(&a), sha256(&b));
        assert_eq!(stamp(&a).map(|s| s.0), Some(5));
        assert!(sha256(&dir.join("absent")).is_none());
        fs::remove_dir_all(&dir).expect("clean up");
    }
}
