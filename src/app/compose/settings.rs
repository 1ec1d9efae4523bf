//! The edge's settings: one TOML file, overridden key by key from `EDGE__SECTION__KEY`
//! environment variables.
//!
//! [`Settings::load`] builds a single `config::Config` from both, checks every section
//! (unknown keys are errors, every section is optional) and keeps the built config in
//! [`Settings::source`] so the node store reads `[[nodes]]` from the very same source. It
//! neither logs (logging is configured from these settings, afterwards) nor touches the
//! network. No error message it produces contains a node's token. The reference for every
//! key is `docs/configuration.md`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use config::{ConfigError, Environment, File, FileFormat};
use serde::Deserialize;
use serde::de::IgnoredAny;
use tracing_subscriber::EnvFilter;

// Every section's type, each defined beside the part it configures, named here for the
// programs that build or change settings (tests, the load generator).
pub use crate::adapters::admin::AdminConfig;
pub use crate::adapters::api::{ApiConfig, ApiKey};
pub use crate::adapters::cluster::ClusterConfig;
pub use crate::adapters::file_store::ConfigSource;
pub use crate::adapters::http::HttpConfig;
pub use crate::adapters::journal::JournalConfig;
pub use crate::adapters::sinks::config::{EventsConfig, SinkKind};
pub use crate::adapters::tcp::config::ServerConfig;
pub use crate::app::compose::identity::{EdgeConfig, EdgeConfigError};
pub use crate::app::compose::logging::{LogConfig, LogFormat};
pub use crate::app::compose::telemetry::TracingConfig;
pub use crate::app::models::{LifecycleConfig, ModelEntry};
pub use crate::app::runs::{BreakerConfig, LimitsConfig, RoutingConfig, RunsConfig};
use crate::domain::EdgeId;

/// The config file read when no path is given, relative to the working directory.
pub const DEFAULT_CONFIG_PATH: &str = "config/edge.toml";

/// Environment variables starting with `EDGE__` override config keys.
const ENV_PREFIX: &str = "EDGE";
/// Separates the prefix, the section and the key: `EDGE__SERVER__LISTEN`.
const ENV_SEPARATOR: &str = "__";
/// Separates the items of a list-valued override: `EDGE__EVENTS__SINKS=stdout,file`.
const ENV_LIST_SEPARATOR: &str = ",";
/// The keys whose environment override is a list.
const ENV_LIST_KEYS: &[&str] = &["events.sinks", "api.keys", "admin.keys", "admin.key_sha256"];

/// Everything the edge is configured with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `[edge] id`, resolved: the configured id or the host name.
    pub edge_id: EdgeId,
    /// `[edge] data_dir`, resolved: where the edge keeps its state (the run journal).
    pub data_dir: PathBuf,
    /// `[edge] thread_slice_us`, resolved: the scheduling slice the runtime's threads ask
    /// for (`None`: the kernel's default).
    pub thread_slice: Option<Duration>,
    /// `[server]`: the node transport.
    pub server: ServerConfig,
    /// `[events]`: the event sinks.
    pub events: EventsConfig,
    /// `[runs]`: queueing, failover, cancelling and deadlines of runs.
    pub runs: RunsConfig,
    /// `[routing]`: affinity and circuit breakers.
    pub routing: RoutingConfig,
    /// `[limits]`: what one API key may start.
    pub limits: LimitsConfig,
    /// `[http]`: the HTTP server (metrics, health, the API) and its limits.
    pub http: HttpConfig,
    /// `[api]`: the OpenAI-compatible API (keys, model aliases, limits, deadlines).
    pub api: ApiConfig,
    /// `[log]`: the edge's own logs.
    pub log: LogConfig,
    /// `[admin]`: the management API.
    pub admin: AdminConfig,
    /// `[journal]`: the durable run journal.
    pub journal: JournalConfig,
    /// `[tracing]`: span export over OTLP (off by default).
    pub tracing: TracingConfig,
    /// `[[models]]`: the desired state of models, as written (checked against the node
    /// definitions when the edge is built).
    pub models: Vec<ModelEntry>,
    /// `[lifecycle]`: how the edge drives the nodes' engines.
    pub lifecycle: LifecycleConfig,
    /// `[cluster]`: the site this edge is a member of; `None`: the edge is the whole site.
    pub cluster: Option<ClusterConfig>,
    /// The file the settings came from and the merged config, from which the node store
    /// reads `[[nodes]]`.
    pub source: ConfigSource,
}

/// Why the settings could not be loaded. Every message names the config file.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The file was named explicitly and does not exist.
    #[error("config file {} not found", .path.display())]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file exists but cannot be read.
    #[error("cannot read config file {}: {reason}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        reason: io::Error,
    },
    /// The file is not valid TOML.
    #[error("config file {} is not valid TOML: {detail}", .path.display())]
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where and what, without quoting the offending line (it may hold a token).
        detail: String,
    },
    /// A key is unknown, or a value has the wrong type or is out of range.
    #[error(
        "invalid settings in config file {} (or its EDGE__* environment overrides): {detail}",
        .path.display()
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        detail: String,
    },
}

/// The sections of the file. `nodes` belongs to the node store and is only allowed here.
#[derive(Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
struct Sections {
    edge: EdgeConfig,
    server: ServerConfig,
    events: EventsConfig,
    runs: RunsConfig,
    routing: RoutingConfig,
    limits: LimitsConfig,
    http: HttpConfig,
    api: ApiConfig,
    log: LogConfig,
    admin: AdminConfig,
    journal: JournalConfig,
    tracing: TracingConfig,
    models: Vec<ModelEntry>,
    lifecycle: LifecycleConfig,
    cluster: Option<ClusterConfig>,
    nodes: IgnoredAny,
}

impl Settings {
    /// The run journal's database file: `[journal] path`, or `journal.sqlite3` in the
    /// data directory.
    pub fn journal_file(&self) -> PathBuf {
        self.journal.file(&self.data_dir)
    }

    /// Reads the config file at `path` (or [`DEFAULT_CONFIG_PATH`] when `None`) and applies
    /// the `EDGE__SECTION__KEY` environment overrides.
    ///
    /// Every section is optional. A missing default file is not an error: defaults and
    /// overrides apply, and [`ConfigSource::found`] says so.
    ///
    /// # Errors
    /// [`SettingsError::NotFound`] when `path` was given and does not exist,
    /// [`SettingsError::Unreadable`] when the file cannot be read,
    /// [`SettingsError::Syntax`] when it is not TOML, and [`SettingsError::Invalid`] for an
    /// unknown key, a value of the wrong type or out of range, or a bad `log.level`.
    pub fn load(path: Option<&Path>) -> Result<Self, SettingsError> {
        Self::load_with_env(path, None)
    }

    /// [`Settings::load`] with the environment taken from `env` instead of the process's,
    /// when given, so tests do not race on process-wide variables.
    fn load_with_env(
        path: Option<&Path>,
        env: Option<config::Map<String, String>>,
    ) -> Result<Self, SettingsError> {
        let (path, required) = match path {
            Some(path) => (path.to_owned(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        let text = read_config_file(&path, required)?;
        let config = build_config(text.as_deref(), env, &path)?;

        let sections = config
            .clone()
            .try_deserialize::<Sections>()
            .map_err(|error| SettingsError::Invalid {
                detail: error.to_string(),
                path: path.clone(),
            })?;
        let edge_id = sections.edge_id(&path)?;
        let data_dir = sections.edge.data_dir();
        // Checked with the other problems above.
        let thread_slice = sections.edge.thread_slice().unwrap_or_default();
        let Sections {
            edge: _,
            server,
            events,
            runs,
            routing,
            limits,
            http,
            api,
            log,
            admin,
            journal,
            tracing,
            models,
            lifecycle,
            cluster,
            nodes: _,
        } = sections;
        Ok(Self {
            edge_id,
            data_dir,
            thread_slice,
            tracing,
            server,
            events,
            runs,
            routing,
            limits,
            http,
            api,
            log,
            admin,
            journal,
            models,
            lifecycle,
            cluster,
            source: ConfigSource::new(path, text.is_some(), config),
        })
    }
}

/// The config file's text; `None` when it is missing and not `required`.
fn read_config_file(path: &Path, required: bool) -> Result<Option<String>, SettingsError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            if required {
                Err(SettingsError::NotFound {
                    path: path.to_owned(),
                })
            } else {
                Ok(None)
            }
        }
        Err(reason) => Err(SettingsError::Unreadable {
            path: path.to_owned(),
            reason,
        }),
    }
}

/// The file's TOML (if any) under the environment overrides (`env`, or the process's).
fn build_config(
    text: Option<&str>,
    env: Option<config::Map<String, String>>,
    path: &Path,
) -> Result<config::Config, SettingsError> {
    let mut builder = config::Config::builder();
    if let Some(text) = text {
        builder = builder.add_source(File::from_str(text, FileFormat::Toml));
    }
    match builder.add_source(environment(env)).build() {
        Ok(config) => Ok(config),
        Err(ConfigError::FileParse { cause, .. }) => Err(SettingsError::Syntax {
            detail: without_quoted_source(&cause.to_string()),
            path: path.to_owned(),
        }),
        Err(error) => Err(SettingsError::Invalid {
            detail: error.to_string(),
            path: path.to_owned(),
        }),
    }
}

impl Sections {
    /// The edge's id, when nothing is wrong.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] with every problem of the file at `path`, joined.
    fn edge_id(&self, path: &Path) -> Result<EdgeId, SettingsError> {
        let mut problems = self.problems();
        match self.edge.resolve() {
            Ok(id) if problems.is_empty() => Ok(id),
            resolved => {
                problems.extend(resolved.err().map(|error| error.to_string()));
                Err(SettingsError::Invalid {
                    detail: problems.join("; "),
                    path: path.to_owned(),
                })
            }
        }
    }

    /// Values that deserialize but cannot work: zero capacities (a zero-sized queue or
    /// connection limit would stall everything) and a `log.level` that is not a filter.
    fn problems(&self) -> Vec<String> {
        let at_least_one = [
            ("server.max_frame_bytes", self.server.max_frame_bytes),
            (
                "server.max_register_frame_bytes",
                self.server.max_register_frame_bytes,
            ),
            ("server.max_connections", self.server.max_connections),
            ("server.outbound_queue", self.server.outbound_queue),
            ("server.listen_backlog", self.server.listen_backlog as usize),
            ("http.listen_backlog", self.http.listen_backlog as usize),
            ("events.queue_capacity", self.events.queue_capacity),
            ("runs.queue_capacity", self.runs.queue_capacity),
        ];
        let mut problems: Vec<String> = at_least_one
            .iter()
            .filter(|(_, value)| *value == 0)
            .map(|(key, _)| format!("`{key}` must be at least 1"))
            .collect();
        problems.extend(self.server.keepalive_problems());
        problems.extend(
            self.edge
                .thread_slice()
                .err()
                .map(|error| error.to_string()),
        );
        for (key, tls) in [
            ("server.tls", &self.server.tls),
            ("http.tls", &self.http.tls),
        ] {
            if tls
                .as_ref()
                .is_some_and(|tls| tls.handshake_timeout_ms == 0)
            {
                problems.push(format!("`{key}.handshake_timeout_ms` must be at least 1"));
            }
        }
        if let Err(error) = EnvFilter::try_new(&self.log.level) {
            problems.push(format!(
                "`log.level` {:?} is not a valid filter directive: {error}",
                self.log.level
            ));
        }
        problems.extend(self.api.problems());
        if let Err(routing) = crate::app::runs::policy(&self.runs, &self.routing, &self.limits) {
            problems.extend(routing);
        }
        let api_keys = &self.api.keys;
        problems.extend(self.admin.problems(self.http.listen, |admin| {
            api_keys.iter().any(|api| api.matches(admin))
        }));
        problems.extend(self.journal.problems());
        problems.extend(self.events.nats.problems());
        problems.extend(self.tracing.problems());
        problems.extend(self.lifecycle.problems());
        if let Some(cluster) = &self.cluster {
            problems.extend(cluster.problems((self.server.listen, self.http.listen)));
        }
        problems
    }
}

/// The `EDGE__SECTION__KEY` overrides, read from `source` when given, else from the process.
fn environment(source: Option<config::Map<String, String>>) -> Environment {
    let mut environment = Environment::with_prefix(ENV_PREFIX)
        .prefix_separator(ENV_SEPARATOR)
        .separator(ENV_SEPARATOR)
        .ignore_empty(true)
        .try_parsing(true)
        .list_separator(ENV_LIST_SEPARATOR)
        .source(source);
    for key in ENV_LIST_KEYS {
        environment = environment.with_list_parse_key(key);
    }
    environment
}

/// A TOML parse error without the lines that quote the file: the line at fault may hold a
/// token. The position (`line 5, column 9`) and the reason remain.
fn without_quoted_source(message: &str) -> String {
    message
        .lines()
        .filter(|line| {
            let rest = line
                .trim_start()
                .trim_start_matches(|c: char| c.is_ascii_digit());
            !rest.trim_start().starts_with('|')
        })
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io::Write;
    use std::time::Duration;

    use tempfile::NamedTempFile;

    use crate::adapters::file_store::FileNodeStore;
    use crate::adapters::sinks::config::{LineFormat, SinkKind};
    use crate::domain::Token;
    use crate::ports::NodeStore;

    use super::*;

    fn file(toml: &str) -> NamedTempFile {
        let mut file = NamedTempFile::new().unwrap();
        file.write_all(toml.as_bytes()).unwrap();
        file
    }

    fn load(toml: &str, env: &[(&str, &str)]) -> (NamedTempFile, Result<Settings, SettingsError>) {
        let file = file(toml);
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let settings = Settings::load_with_env(Some(file.path()), Some(env));
        (file, settings)
    }

    fn path_of(file: &NamedTempFile) -> String {
        file.path().display().to_string()
    }

    #[test]
    fn shipped_config_loads_with_two_nodes() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_CONFIG_PATH);
        let settings = Settings::load_with_env(Some(&path), Some(HashMap::new())).unwrap();
        assert!(settings.source.found());
        assert_eq!(settings.server, ServerConfig::default());
        assert_eq!(settings.events, EventsConfig::default());
        assert_eq!(settings.runs, RunsConfig::default());
        assert_eq!(settings.http, HttpConfig::default());
        assert_eq!(settings.api, ApiConfig::default());
        assert_eq!(settings.log, LogConfig::default());
        assert_eq!(settings.admin, AdminConfig::default());
        assert_eq!(settings.journal, JournalConfig::default());
        assert_eq!(settings.tracing, TracingConfig::default());

        let store = FileNodeStore::load_from_config(&settings.source).unwrap();
        let records = store.records();
        let names: Vec<_> = records
            .iter()
            .map(|r| (r.id().as_str(), r.alias().as_str()))
            .collect();
        assert_eq!(names, [("node-a", "gpu-a"), ("node-b", "gpu-b")]);
        let found = store
            .find_by_token(&Token::new("example-token-node-a-CHANGE-ME"))
            .unwrap();
        assert_eq!(found.id().as_str(), "node-a");
    }

    #[test]
    fn missing_sections_take_their_defaults() {
        let (_file, settings) = load("[http]\nlisten = \"127.0.0.1:9000\"\n", &[]);
        let settings = settings.unwrap();
        assert_eq!(settings.http.listen, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(settings.server, ServerConfig::default());
        assert_eq!(settings.server.listen, "127.0.0.1:7100".parse().unwrap());
        assert_eq!(settings.events.sinks, [SinkKind::Stdout]);
        assert_eq!(settings.runs.queue_capacity, 1_024);
        assert_eq!(settings.runs.queue_timeout(), Duration::from_secs(30));
        assert_eq!(settings.runs.cancel_grace(), Duration::from_secs(5));
        assert_eq!(settings.runs.default_deadline(), None);
        assert_eq!(settings.log.level, "info");
        assert_eq!(settings.log.format, LogFormat::Pretty);
    }

    #[test]
    fn an_empty_file_gives_all_defaults_and_no_nodes() {
        let (_file, settings) = load("", &[]);
        let settings = settings.unwrap();
        assert_eq!(settings.runs, RunsConfig::default());
        let store = FileNodeStore::load_from_config(&settings.source).unwrap();
        assert!(store.records().is_empty());
    }

    #[test]
    fn partial_sections_keep_defaults_for_the_other_keys() {
        let toml = "[runs]\ndefault_deadline_ms = 1500\n[log]\nformat = \"json\"\n[events.stdout]\nformat = \"json\"\n";
        let (_file, settings) = load(toml, &[]);
        let settings = settings.unwrap();
        assert_eq!(
            settings.runs.default_deadline(),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(settings.runs.queue_timeout_ms, 30_000);
        assert_eq!(settings.log.format, LogFormat::Json);
        assert_eq!(settings.log.level, "info");
        assert_eq!(settings.events.stdout.format, LineFormat::Json);
        assert_eq!(settings.events.queue_capacity, 8_192);
    }

    #[test]
    fn environment_overrides_server_listen() {
        let (_file, settings) = load(
            "[server]\nlisten = \"127.0.0.1:7100\"\nmax_connections = 10\n",
            &[
                ("EDGE__SERVER__LISTEN", "0.0.0.0:7200"),
                ("EDGE__SERVER__REGISTER_TIMEOUT_MS", "250"),
                ("EDGE__LOG__LEVEL", "info,edge=debug"),
                ("OTHER__SERVER__LISTEN", "garbage"),
            ],
        );
        let settings = settings.unwrap();
        assert_eq!(settings.server.listen, "0.0.0.0:7200".parse().unwrap());
        assert_eq!(settings.server.register_timeout_ms, 250);
        assert_eq!(settings.server.max_connections, 10);
        assert_eq!(settings.log.level, "info,edge=debug");
    }

    #[test]
    fn environment_overrides_event_sinks_as_a_list() {
        let (_file, settings) = load(
            "[events]\nsinks = [\"stdout\"]\n",
            &[("EDGE__EVENTS__SINKS", "file,log")],
        );
        assert_eq!(
            settings.unwrap().events.sinks,
            [SinkKind::File, SinkKind::Log]
        );
        let (_file, settings) = load("", &[("EDGE__EVENTS__SINKS", "null")]);
        assert_eq!(settings.unwrap().events.sinks, [SinkKind::Null]);
    }

    #[test]
    fn a_bad_environment_value_is_an_error_naming_the_key() {
        let (_file, settings) = load("", &[("EDGE__HTTP__LISTEN", "not-an-address")]);
        let message = settings.unwrap_err().to_string();
        assert!(message.contains("http.listen"), "{message}");
    }

    /// Loads `toml`, expects it refused, and checks the error names the file and says each
    /// of `fragments`; returns the error.
    fn assert_refused(toml: &str, fragments: &[&str]) -> SettingsError {
        let (file, settings) = load(toml, &[]);
        let error = settings.unwrap_err();
        let message = error.to_string();
        assert!(message.contains(&path_of(&file)), "{message}");
        for fragment in fragments {
            assert!(message.contains(fragment), "{fragment:?} in {message}");
        }
        error
    }

    #[test]
    fn unknown_key_is_an_error_naming_file_and_key() {
        let error = assert_refused(
            "[server]\nlisten_addr = \"127.0.0.1:1\"\n",
            &["listen_addr", "server"],
        );
        assert!(matches!(error, SettingsError::Invalid { .. }), "{error}");
    }

    #[test]
    fn unknown_section_is_an_error() {
        assert_refused("[sever]\nlisten = \"127.0.0.1:1\"\n", &["sever"]);
    }

    #[test]
    fn wrong_type_is_an_error_naming_file_and_key() {
        assert_refused(
            "[runs]\nqueue_timeout_ms = \"soon\"\n",
            &["runs.queue_timeout_ms"],
        );
    }

    #[test]
    fn zero_capacities_and_bad_log_levels_are_rejected() {
        assert_refused(
            "[runs]\nqueue_capacity = 0\n[server]\noutbound_queue = 0\n[log]\nlevel = \"info,=[\"\n",
            &[
                "`runs.queue_capacity` must be at least 1",
                "`server.outbound_queue` must be at least 1",
                "`log.level`",
            ],
        );
    }

    #[test]
    fn listen_backlogs_default_high_and_zero_is_refused_by_key() {
        let (_file, settings) = load("[server]\nlisten_backlog = 512\n", &[]);
        let settings = settings.expect("valid");
        assert_eq!(settings.server.listen_backlog, 512);
        assert_eq!(settings.http.listen_backlog, 4096);
        assert_refused(
            "[server]\nlisten_backlog = 0\n[http]\nlisten_backlog = 0\n",
            &[
                "`server.listen_backlog` must be at least 1",
                "`http.listen_backlog` must be at least 1",
            ],
        );
    }

    #[test]
    fn malformed_toml_names_the_file_but_does_not_quote_it() {
        let toml = "[server]\nlisten = \"127.0.0.1:7100\"\n\n[[nodes]]\nid = \"node-a\"\ntoken = \"tok-SECRET\n";
        let (file, settings) = load(toml, &[]);
        let error = settings.unwrap_err();
        assert!(matches!(error, SettingsError::Syntax { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains(&path_of(&file)), "{message}");
        assert!(message.contains("line 6"), "{message}");
        assert!(!message.contains("SECRET"), "{message}");
    }

    #[test]
    fn an_explicit_missing_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.toml");
        let error = Settings::load_with_env(Some(&path), Some(HashMap::new())).unwrap_err();
        assert!(matches!(error, SettingsError::NotFound { .. }), "{error}");
        assert!(error.to_string().contains(&path.display().to_string()));
    }

    #[test]
    fn tls_tables_load_with_defaults_and_env_overrides() {
        let (_file, settings) = load(
            "[server.tls]\ncert_path = \"/tls/edge.pem\"\nkey_path = \"/tls/edge.key\"\nclient_ca_path = \"/tls/ca.pem\"\n",
            &[
                ("EDGE__HTTP__TLS__CERT_PATH", "/tls/http.pem"),
                ("EDGE__HTTP__TLS__KEY_PATH", "/tls/http.key"),
            ],
        );
        let settings = settings.unwrap();
        let tls = settings.server.tls.unwrap();
        assert_eq!(tls.cert_path, Path::new("/tls/edge.pem"));
        assert_eq!(
            tls.client_ca_path.as_deref(),
            Some(Path::new("/tls/ca.pem"))
        );
        assert_eq!(tls.handshake_timeout(), Duration::from_secs(5));
        let http = settings.http.tls.unwrap();
        assert_eq!(http.key_path, Path::new("/tls/http.key"));
        assert_eq!(http.client_ca_path, None);
    }

    #[test]
    fn a_tls_table_needs_its_files_and_a_positive_timeout() {
        let (file, settings) = load("[server.tls]\ncert_path = \"/tls/edge.pem\"\n", &[]);
        let message = settings.unwrap_err().to_string();
        assert!(message.contains(&path_of(&file)), "{message}");
        assert!(message.contains("key_path"), "{message}");

        let (_file, settings) = load(
            "[http.tls]\ncert_path = \"a\"\nkey_path = \"b\"\nhandshake_timeout_ms = 0\n",
            &[],
        );
        let message = settings.unwrap_err().to_string();
        assert!(
            message.contains("`http.tls.handshake_timeout_ms` must be at least 1"),
            "{message}"
        );
    }

    #[test]
    fn admin_and_journal_load_and_refuse_what_cannot_work() {
        let (_file, settings) = load(
            "[admin]\nkeys = [\"adm-SECRET\"]\nlisten = \"0.0.0.0:9001\"\n[journal]\nretention_max_age = \"12h\"\npath = \"/var/lib/edge/j.db\"\n",
            &[("EDGE__JOURNAL__MAX_EVENTS_PER_RUN", "50")],
        );
        let settings = settings.unwrap();
        assert_eq!(settings.admin.digests().len(), 1);
        assert!(!format!("{settings:?}").contains("SECRET"));
        assert_eq!(
            settings.journal.retention_max_age.0,
            Duration::from_secs(43_200)
        );
        assert_eq!(settings.journal.max_events_per_run, 50);

        assert_refused(
            "[journal]\nretention_max_age = \"7 weeks\"\n",
            &["journal.retention_max_age"],
        );
        assert_refused(
            "[admin]\nkey_sha256 = [\"0123\"]\nlisten = \"0.0.0.0:9001\"\n",
            &["`admin.key_sha256[0]`", "without a key", "admin.listen"],
        );
        assert_refused(
            "[api]\nkeys = [\"same\"]\n[admin]\nkeys = [\"same\"]\n",
            &["also an API key"],
        );
        assert_refused("[journal]\nbatch_max = 0\n", &["`journal.batch_max`"]);
        assert_refused("[admin]\nlisten_on = 1\n", &["listen_on", "admin"]);
    }

    #[test]
    fn edge_nats_and_tracing_sections_load_and_hide_secrets() {
        let (_file, settings) = load(
            "[edge]\nid = \"site-a\"\n[events]\nsinks = [\"nats\"]\n\
             [events.nats]\nurl = \"nats://10.0.0.1:4222\"\ntoken = \"tok-SECRET\"\n\
             [events.nats.jetstream]\nstream = \"EDGE\"\nmax_age_secs = 60\n\
             [tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\nsample_ratio = 0.25\n",
            &[("EDGE__EVENTS__NATS__SUBJECT_PREFIX", "acme.edge")],
        );
        let settings = settings.unwrap();
        assert_eq!(settings.edge_id.as_str(), "site-a");
        assert_eq!(settings.events.sinks, [SinkKind::Nats]);
        assert_eq!(settings.events.nats.subject_prefix, "acme.edge");
        let jetstream = settings.events.nats.jetstream.as_ref().unwrap();
        assert_eq!(
            (jetstream.stream.as_str(), jetstream.max_age_secs),
            ("EDGE", 60)
        );
        assert!(settings.tracing.enabled());
        assert_eq!(settings.tracing.sample_ratio, 0.25);
        assert!(!format!("{settings:?}").contains("SECRET"));
    }

    #[test]
    fn bad_edge_nats_and_tracing_values_name_file_and_key() {
        assert_refused(
            "[edge]\nid = \"site a\"\n[events.nats]\nsubject_prefix = \"edge.*\"\n\
             password = \"pw-SECRET\"\n[tracing]\nsample_ratio = 2.0\n",
            &[
                "`events.nats.subject_prefix`",
                "`events.nats.user` and `events.nats.password`",
                "`tracing.sample_ratio`",
                "`edge.id`",
            ],
        );
        let (_file, settings) = load("[events.nats]\npassword = \"pw-SECRET\"\n", &[]);
        assert!(!settings.unwrap_err().to_string().contains("SECRET"));
    }

    #[test]
    fn a_cluster_section_loads_with_defaults_and_without_it_there_is_none() {
        let (_file, settings) = load(
            "[cluster]\nsite = \"west\"\nnats = \"nats://10.0.0.1:4222\"\ntoken = \"tok-SECRET\"\n",
            &[
                ("EDGE__CLUSTER__LEASE_MS", "600"),
                ("EDGE__CLUSTER__RENEW_MS", "200"),
            ],
        );
        let settings = settings.unwrap();
        let cluster = settings.cluster.as_ref().unwrap();
        assert_eq!(
            (cluster.site.as_str(), cluster.bucket()),
            ("west", "edge-west".into())
        );
        assert_eq!((cluster.lease_ms, cluster.renew_ms), (600, 200));
        assert!(!format!("{settings:?}").contains("SECRET"));
        let (_file, settings) = load("", &[]);
        assert!(settings.unwrap().cluster.is_none());
    }

    #[test]
    fn a_malformed_cluster_section_names_file_and_key() {
        assert_refused(
            "[cluster]\nsite = \"a.b\"\nnats = \"\"\nrenew_ms = 5000\n\
             advertise_api = \"nowhere\"\ntoken = \"tok-SECRET\"\n",
            &[
                "`cluster.site`",
                "`cluster.nats`",
                "`cluster.renew_ms`",
                "`cluster.advertise_api`",
            ],
        );
        assert_refused(
            "[cluster]\nsite = \"a\"\nnats = \"nats://a\"\nleas_ms = 1\n",
            &["leas_ms"],
        );
        let (_file, settings) = load("[cluster]\ntoken = \"tok-SECRET\"\n", &[]);
        assert!(!settings.unwrap_err().to_string().contains("SECRET"));
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let (_file, settings) = load(
            "[[nodes]]\nid = \"a\"\nalias = \"b\"\ntoken = \"tok-SECRET\"\n",
            &[],
        );
        let settings = settings.unwrap();
        assert!(!format!("{settings:?}").contains("SECRET"));
    }

    #[test]
    fn api_section_loads_keys_and_aliases_and_hides_keys() {
        let (_file, settings) = load(
            "[api]\nkeys = [\"sk-SECRET-1\"]\nmax_body_bytes = 10\n[api.models]\n\"gpt-4o-mini\" = \"ollama/llama3.1:8b\"\n",
            &[("EDGE__API__DEFAULT_DEADLINE_MS", "1000")],
        );
        let settings = settings.unwrap();
        assert_eq!(settings.api.keys.len(), 1);
        assert_eq!(settings.api.max_body_bytes, 10);
        assert_eq!(settings.api.default_deadline_ms, 1_000);
        assert_eq!(settings.api.models["gpt-4o-mini"], "ollama/llama3.1:8b");
        assert!(!format!("{settings:?}").contains("SECRET"));

        let (_file, settings) = load("", &[("EDGE__API__KEYS", "sk-a,sk-b")]);
        assert_eq!(settings.unwrap().api.keys.len(), 2);
    }

    #[test]
    fn an_invalid_alias_is_an_error_naming_file_key_and_alias() {
        let (file, settings) = load("[api.models]\n\"gpt-4o\" = \"no-slash-here\"\n", &[]);
        let message = settings.unwrap_err().to_string();
        assert!(message.contains(&path_of(&file)), "{message}");
        assert!(message.contains("api.models"), "{message}");
        assert!(message.contains("\"gpt-4o\""), "{message}");
        assert!(message.contains("no `/`"), "{message}");
        // The value is never repeated: a misplaced `token = "..."` could land in this table.
        assert!(!message.contains("no-slash-here"), "{message}");
    }
}
