//! `[tracing]`: optional export of the edge's spans to an OpenTelemetry collector over
//! OTLP. Off unless `otlp_endpoint` is set.

use serde::Deserialize;

/// The OTLP transport. Only HTTP with protobuf bodies is built in (decision 19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
pub enum OtlpProtocol {
    /// `POST <endpoint>` with an `ExportTraceServiceRequest` protobuf body.
    #[default]
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// `[tracing]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP address (`http://127.0.0.1:4318`, to which `/v1/traces`
    /// is added, or the full URL of its traces endpoint); none: no export.
    pub otlp_endpoint: Option<String>,
    /// How spans travel.
    pub protocol: OtlpProtocol,
    /// The share of new traces recorded, 0 to 1. A request whose `traceparent` says
    /// whether its trace is sampled is followed as it says.
    pub sample_ratio: f64,
    /// `service.name` of the exported spans; the edge's id when absent.
    pub service_name: Option<String>,
    /// How long one export may take before it is abandoned (ms).
    pub export_timeout_ms: u64,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            protocol: OtlpProtocol::default(),
            sample_ratio: 1.0,
            service_name: None,
            export_timeout_ms: 10_000,
        }
    }
}

impl TracingConfig {
    /// Whether spans are exported.
    pub fn enabled(&self) -> bool {
        self.otlp_endpoint.is_some()
    }

    /// The URL spans are posted to: the endpoint, with `/v1/traces` added when it names no
    /// path. `None` when export is off.
    pub fn traces_url(&self) -> Option<String> {
        let endpoint = self.otlp_endpoint.as_deref()?.trim_end_matches('/');
        let after_scheme = endpoint
            .split_once("://")
            .map_or(endpoint, |(_, rest)| rest);
        Some(if after_scheme.contains('/') {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/v1/traces")
        })
    }

    /// What is wrong with these settings, each naming its `tracing.*` key.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            problems.push(format!(
                "`tracing.sample_ratio` {} must be between 0 and 1",
                self.sample_ratio
            ));
        }
        if let Some(endpoint) = &self.otlp_endpoint {
            let host = endpoint.strip_prefix("http://").unwrap_or_default();
            if host.is_empty() || host.starts_with('/') {
                problems.push(format!(
                    "`tracing.otlp_endpoint` {endpoint:?} must be an http:// URL (a collector \
                     or agent on the host or network; TLS is the collector's job)"
                ));
            }
        }
        if self.service_name.as_deref().is_some_and(str::is_empty) {
            problems.push("`tracing.service_name` must not be empty".to_owned());
        }
        if self.export_timeout_ms == 0 {
            problems.push("`tracing.export_timeout_ms` must be at least 1".to_owned());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_endpoint(endpoint: &str) -> TracingConfig {
        TracingConfig {
            otlp_endpoint: Some(endpoint.to_owned()),
            ..TracingConfig::default()
        }
    }

    #[test]
    fn off_by_default() {
        let config = TracingConfig::default();
        assert!(!config.enabled());
        assert_eq!(config.traces_url(), None);
        assert!(config.problems().is_empty());
    }

    #[test]
    fn the_traces_path_is_added_to_a_bare_endpoint() {
        let bare = with_endpoint("http://127.0.0.1:4318");
        assert_eq!(
            bare.traces_url().unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        let slash = with_endpoint("http://collector:4318/");
        assert_eq!(
            slash.traces_url().unwrap(),
            "http://collector:4318/v1/traces"
        );
        let full = with_endpoint("http://collector:4318/otlp/v1/traces");
        assert_eq!(
            full.traces_url().unwrap(),
            "http://collector:4318/otlp/v1/traces"
        );
    }

    #[test]
    fn bad_values_are_named() {
        let config = TracingConfig {
            sample_ratio: 1.5,
            service_name: Some(String::new()),
            export_timeout_ms: 0,
            ..with_endpoint("https://collector:4318")
        };
        let problems = config.problems().join("\n");
        for key in [
            "tracing.sample_ratio",
            "tracing.otlp_endpoint",
            "tracing.service_name",
            "tracing.export_timeout_ms",
        ] {
            assert!(problems.contains(key), "{key} in {problems}");
        }
    }
}
