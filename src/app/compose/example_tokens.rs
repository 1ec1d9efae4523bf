//! Example tokens refused where they matter: `edge serve` (and `edge check-config`) will not
//! take a node `token` containing `CHANGE-ME` (in any case) while the node listener is
//! reachable from other machines. The shipped configs mark their example tokens so, and
//! anyone who has read them knows them. On a loopback listener they are fine: the README's
//! first command serves the demo config as it is.
//!
//! Reads the raw `[[nodes]]` entries of the config, since the node store keeps only the
//! tokens' digests; it never prints a token.

use std::net::SocketAddr;

use crate::adapters::file_store::ConfigSource;

/// What marks a token as an example: no generated token (`edge token generate`) contains it.
const MARK: &str = "change-me";

/// Refuses `source`'s example tokens unless `listen` (the node listener) is on loopback.
///
/// # Errors
/// Every node whose `token` is an example, naming the config file, the node and the key.
pub(crate) fn refuse_off_loopback(source: &ConfigSource, listen: SocketAddr) -> anyhow::Result<()> {
    if listen.ip().is_loopback() {
        return Ok(());
    }
    let offenders = example_token_nodes(source);
    if offenders.is_empty() {
        return Ok(());
    }
    anyhow::bail!(
        "config file {}: {} example token (a `token` containing CHANGE-ME), and the node \
         listener {listen} is not on loopback: anyone who has read the example knows it. \
         Give each such node a token of its own (`edge token generate`; better, keep only its \
         `token_sha256` here), or listen on 127.0.0.1",
        source.path().display(),
        offenders.join(", ")
    )
}

/// `nodes[i] (id "x") has an` for each entry whose `token` is an example.
fn example_token_nodes(source: &ConfigSource) -> Vec<String> {
    let Ok(nodes) = source.config().get_array("nodes") else {
        return Vec::new();
    };
    nodes
        .into_iter()
        .enumerate()
        .filter_map(|(index, node)| {
            let table = node.into_table().ok()?;
            let token = table.get("token")?.clone().into_string().ok()?;
            if !token.to_ascii_lowercase().contains(MARK) {
                return None;
            }
            let id = table
                .get("id")
                .and_then(|id| id.clone().into_string().ok())
                .unwrap_or_default();
            Some(format!("nodes[{index}] (id {id:?}) has an"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn source(toml: &str) -> ConfigSource {
        let config = config::Config::builder()
            .add_source(config::File::from_str(toml, config::FileFormat::Toml))
            .build()
            .unwrap();
        ConfigSource::new(PathBuf::from("/etc/edge/edge.toml"), true, config)
    }

    const NODES: &str = r#"
[[nodes]]
id = "node-a"
alias = "gpu-a"
token = "example-token-node-a-CHANGE-ME"
[[nodes]]
id = "node-b"
alias = "gpu-b"
token = "3f1c0e"
[[nodes]]
id = "node-c"
alias = "gpu-c"
token = "change-me-node-c"
"#;

    #[test]
    fn example_tokens_are_refused_off_loopback_naming_the_file_the_nodes_and_the_key() {
        let error = refuse_off_loopback(&source(NODES), "0.0.0.0:7100".parse().unwrap())
            .unwrap_err()
            .to_string();
        assert!(error.contains("config file /etc/edge/edge.toml"), "{error}");
        assert!(error.contains(r#"nodes[0] (id "node-a")"#), "{error}");
        assert!(error.contains(r#"nodes[2] (id "node-c")"#), "{error}");
        assert!(!error.contains("node-b"), "{error}");
        assert!(error.contains("`token`"), "{error}");
        assert!(error.contains("0.0.0.0:7100"), "{error}");
        assert!(
            !error.contains("example-token-node-a"),
            "no token shown: {error}"
        );
    }

    #[test]
    fn example_tokens_are_fine_on_loopback_and_real_ones_anywhere() {
        for listen in ["127.0.0.1:7100", "[::1]:7100"] {
            refuse_off_loopback(&source(NODES), listen.parse().unwrap()).unwrap();
        }
        let real = "[[nodes]]\nid = \"n\"\nalias = \"n\"\ntoken = \"3f1c0e\"\n";
        refuse_off_loopback(&source(real), "10.0.0.5:7100".parse().unwrap()).unwrap();
        refuse_off_loopback(&source(""), "0.0.0.0:7100".parse().unwrap()).unwrap();
    }
}
