//! `[edge]`: the id that names this edge wherever it is seen from outside — the subjects
//! of its run events on NATS, the resource of its traces, and (later) the control plane
//! that manages it through its management API (defaults to the host name) — and the
//! directory it keeps its state in (the run journal), which defaults to where a service's
//! state belongs rather than to the working directory — and the scheduling slice its
//! threads ask for.
//!
//! Resolving reads the host name and the environment; it does no other I/O and never logs.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::{EdgeId, NameError};

/// `[edge]` as written in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// The edge's id; the host name when absent.
    pub id: Option<String>,
    /// Where the edge keeps its state; see [`EdgeConfig::data_dir`] for the default.
    pub data_dir: Option<PathBuf>,
    /// The scheduling slice the edge's threads ask Linux for, in µs; 0 leaves the
    /// kernel's default (decision 38).
    pub thread_slice_us: u64,
}

impl Default for EdgeConfig {
    fn default() -> Self {
        Self {
            id: None,
            data_dir: None,
            thread_slice_us: DEFAULT_THREAD_SLICE_US,
        }
    }
}

/// What is wrong with `[edge]`, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EdgeConfigError {
    /// `thread_slice_us` is neither 0 nor a slice the kernel grants.
    #[error("`edge.thread_slice_us` is {us}: {must}")]
    ThreadSlice {
        /// The configured slice, in µs.
        us: u64,
        /// What it must be.
        must: String,
    },
    /// The configured id is not a valid id.
    #[error("`edge.id`: {0}")]
    Id(#[source] NameError),
    /// No id is configured and the host name cannot be read.
    #[error("`edge.id` is not set and the host name cannot be read; set it")]
    NoHostName,
    /// No id is configured and the host name it defaults to is not a valid id.
    #[error("`edge.id` is not set and the host name is no valid id ({0}); set it")]
    HostNameNoId(#[source] NameError),
}

/// The slice asked for when `thread_slice_us` is left out: the kernel's shortest.
const DEFAULT_THREAD_SLICE_US: u64 = 100;

impl EdgeConfig {
    /// The slice to ask for, `None` for the kernel's default.
    ///
    /// # Errors
    /// [`EdgeConfigError::ThreadSlice`] when it is neither 0 nor a slice the kernel grants.
    pub fn thread_slice(&self) -> Result<Option<Duration>, EdgeConfigError> {
        let us = self.thread_slice_us;
        edge_thread_slice::configured_slice(us)
            .map_err(|must| EdgeConfigError::ThreadSlice { us, must })
    }
}

impl EdgeConfig {
    /// The configured id, or the host name when none is configured.
    ///
    /// # Errors
    /// [`EdgeConfigError::Id`] when the configured id is not a valid id;
    /// [`EdgeConfigError::NoHostName`] when there is none and the host name cannot be read,
    /// [`EdgeConfigError::HostNameNoId`] when the host name is not a valid id.
    pub fn resolve(&self) -> Result<EdgeId, EdgeConfigError> {
        match &self.id {
            Some(id) => EdgeId::parse(id).map_err(EdgeConfigError::Id),
            None => {
                let host = host_name().ok_or(EdgeConfigError::NoHostName)?;
                EdgeId::parse(&host).map_err(EdgeConfigError::HostNameNoId)
            }
        }
    }
}

impl EdgeConfig {
    /// The directory the edge keeps its state in: `data_dir` when set, else systemd's
    /// `$STATE_DIRECTORY` (from `StateDirectory=`), else `$XDG_STATE_HOME/edge`, else
    /// `$HOME/.local/state/edge`, else `/var/lib/edge`.
    pub fn data_dir(&self) -> PathBuf {
        match &self.data_dir {
            Some(dir) => dir.clone(),
            None => default_data_dir(|name| std::env::var_os(name)),
        }
    }
}

/// The default data directory, reading the environment through `var`.
fn default_data_dir(var: impl Fn(&str) -> Option<OsString>) -> PathBuf {
    let var = |name: &str| var(name).filter(|v| !v.is_empty());
    if let Some(dirs) = var("STATE_DIRECTORY") {
        // systemd lists one directory per `StateDirectory=` entry, ':'-separated.
        let dirs = dirs.to_string_lossy().into_owned();
        if let Some(first) = dirs.split(':').find(|d| !d.is_empty()) {
            return PathBuf::from(first);
        }
    }
    if let Some(state) = var("XDG_STATE_HOME") {
        return PathBuf::from(state).join("edge");
    }
    match var("HOME") {
        Some(home) => PathBuf::from(home).join(".local/state/edge"),
        None => PathBuf::from("/var/lib/edge"),
    }
}

/// The host name: the kernel's, else `$HOSTNAME`, else `/etc/hostname`.
fn host_name() -> Option<String> {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    [
        read("/proc/sys/kernel/hostname"),
        std::env::var("HOSTNAME").ok(),
        read("/etc/hostname"),
    ]
    .into_iter()
    .flatten()
    .map(|name| name.trim().to_owned())
    .find(|name| !name.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configured_id_is_used_and_checked() {
        let config = EdgeConfig {
            id: Some("site-a".into()),
            ..EdgeConfig::default()
        };
        assert_eq!(config.resolve().unwrap().as_str(), "site-a");
        let bad = EdgeConfig {
            id: Some("site a".into()),
            ..EdgeConfig::default()
        };
        let message = bad.resolve().unwrap_err().to_string();
        assert!(message.contains("`edge.id`"), "{message}");
        assert!(message.contains("site a"), "{message}");
    }

    #[test]
    fn the_thread_slice_is_the_kernels_shortest_unless_configured() {
        let slice = |us| EdgeConfig {
            thread_slice_us: us,
            ..EdgeConfig::default()
        };
        assert_eq!(
            EdgeConfig::default().thread_slice(),
            Ok(Some(Duration::from_micros(100)))
        );
        assert_eq!(slice(0).thread_slice(), Ok(None));
        assert_eq!(
            slice(100_000).thread_slice(),
            Ok(Some(Duration::from_millis(100)))
        );
        for bad in [1, 99, 100_001] {
            let message = slice(bad).thread_slice().unwrap_err().to_string();
            assert!(message.contains("`edge.thread_slice_us`"), "{message}");
            assert!(message.contains(&bad.to_string()), "{message}");
        }
    }

    #[test]
    fn state_goes_where_a_service_keeps_it_not_in_the_working_directory() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        const ALL: [(&str, &str); 3] = [
            ("STATE_DIRECTORY", "/var/lib/edge-a:/var/lib/other"),
            ("XDG_STATE_HOME", "/home/u/.state"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            default_data_dir(env(&ALL)),
            PathBuf::from("/var/lib/edge-a")
        );
        assert_eq!(
            default_data_dir(env(&ALL[1..])),
            PathBuf::from("/home/u/.state/edge")
        );
        assert_eq!(
            default_data_dir(env(&ALL[2..])),
            PathBuf::from("/home/u/.local/state/edge")
        );
        assert_eq!(default_data_dir(env(&[])), PathBuf::from("/var/lib/edge"));
        let configured = EdgeConfig {
            data_dir: Some("/srv/edge".into()),
            ..EdgeConfig::default()
        };
        assert_eq!(configured.data_dir(), PathBuf::from("/srv/edge"));
    }

    #[test]
    fn the_default_is_the_host_name() {
        if let Some(host) = host_name().filter(|h| EdgeId::parse(h).is_ok()) {
            assert_eq!(EdgeConfig::default().resolve().unwrap().as_str(), host);
        }
    }
}
