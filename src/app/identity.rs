//! `[edge]`: the id that names this edge wherever it is seen from outside — the subjects
//! of its run events on NATS, the resource of its traces, and (later) the control plane
//! that manages it through its management API. Defaults to the host name.
//!
//! Resolving reads the host name from the system; it does no other I/O and never logs.

use serde::Deserialize;

use crate::domain::EdgeId;

/// `[edge]` as written in the config file.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EdgeConfig {
    /// The edge's id; the host name when absent.
    pub id: Option<String>,
}

impl EdgeConfig {
    /// The configured id, or the host name when none is configured.
    ///
    /// # Errors
    /// A message naming `edge.id` when the configured id (or the host name it defaults to)
    /// is not a valid id, or when there is no id and the host name cannot be read.
    pub fn resolve(&self) -> Result<EdgeId, String> {
        match &self.id {
            Some(id) => EdgeId::parse(id).map_err(|error| format!("`edge.id`: {error}")),
            None => {
                let host = host_name().ok_or_else(|| {
                    "`edge.id` is not set and the host name cannot be read; set it".to_owned()
                })?;
                EdgeId::parse(&host).map_err(|error| {
                    format!(
                        "`edge.id` is not set and the host name is no valid id ({error}); set it"
                    )
                })
            }
        }
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
        };
        assert_eq!(config.resolve().unwrap().as_str(), "site-a");
        let bad = EdgeConfig {
            id: Some("site a".into()),
        };
        let message = bad.resolve().unwrap_err();
        assert!(message.contains("`edge.id`"), "{message}");
        assert!(message.contains("site a"), "{message}");
    }

    #[test]
    fn the_default_is_the_host_name() {
        if let Some(host) = host_name().filter(|h| EdgeId::parse(h).is_ok()) {
            assert_eq!(EdgeConfig::default().resolve().unwrap().as_str(), host);
        }
    }
}
