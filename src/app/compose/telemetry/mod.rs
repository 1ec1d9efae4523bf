//! Span export over OTLP (`[tracing]`): the `connection`, `run`, `api_request` and
//! `dispatch` spans go to an OpenTelemetry collector as traces, through
//! `tracing-opentelemetry` and the OTLP/HTTP exporter, batched on the SDK's own thread.
//!
//! Off by default, and then nothing of it is installed: no layer, no provider, and the
//! spans that exist only for export ([`EXPORT_TARGET`]) are disabled at their call sites,
//! so they cost a cached interest check. This module builds the layer and the provider;
//! it does not decide which spans exist (the adapters and the run service do).

pub mod config;

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Level;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;

pub use config::{OtlpProtocol, TracingConfig};

use crate::domain::EdgeId;

/// The log filter directive that keeps export-only spans out of the logs.
pub const NOT_IN_LOGS: &str = "edge::otel=off";

/// The tracer provider behind an installed export layer. Dropping it (or
/// [`Exporter::shutdown`]) exports what is still batched, within the export timeout.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Exports every finished span still batched, then stops the exporter.
    pub fn shutdown(self) {
        let _ = self.provider.force_flush();
        let _ = self.provider.shutdown();
    }

    /// Exports every finished span still batched (for tests and a graceful stop).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

/// The export layer for `config` and the provider behind it, or `None` when export is off.
/// Spans of the edge's own targets at INFO and above are exported, with the events inside
/// them as span events; the sampler follows a sampled parent (a client's `traceparent`) and
/// samples new traces at `sample_ratio`.
///
/// # Errors
/// The exporter cannot be built (its HTTP client cannot start).
pub fn export_layer<S>(
    config: &TracingConfig,
    edge: &EdgeId,
) -> anyhow::Result<Option<(impl Layer<S> + use<S>, Exporter)>>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    let Some(url) = config.traces_url() else {
        return Ok(None);
    };
    let OtlpProtocol::HttpProtobuf = config.protocol;
    let timeout = Duration::from_millis(config.export_timeout_ms);
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(http_client(timeout)?)
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(timeout)
        .build()
        .context("cannot build the OTLP span exporter")?;
    let service = config
        .service_name
        .clone()
        .unwrap_or_else(|| edge.to_string());
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attributes([
            KeyValue::new("service.instance.id", edge.to_string()),
            KeyValue::new("edge.id", edge.to_string()),
        ])
        .build();
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio)));
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_sampler(sampler)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("edge");
    let filter = Targets::new()
        .with_target("edge", Level::INFO)
        .with_default(LevelFilter::OFF);
    // No busy/idle timing on every enter and exit (the connection span is entered on every
    // poll of its task), and no thread or source-location attributes: the span names and
    // fields say where a span comes from.
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_filter(filter);
    Ok(Some((layer, Exporter { provider })))
}

/// The exporter's HTTP client: blocking (the batch exporter runs on the SDK's own thread),
/// with TLS from the platform's trust store and the `ring` provider passed in, so no
/// process-wide crypto provider is needed (decision 15). Built on a thread of its own, as
/// the exporter's default is: a blocking client must not be built inside the runtime.
fn http_client(timeout: Duration) -> anyhow::Result<reqwest::blocking::Client> {
    let tls = crate::wire::tls::platform_client_config()?;
    std::thread::Builder::new()
        .name("otlp-client".to_owned())
        .spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(timeout)
                .tls_backend_preconfigured(tls)
                .build()
        })
        .context("cannot start the thread that builds the OTLP HTTP client")?
        .join()
        .map_err(|_| anyhow::anyhow!("building the OTLP HTTP client panicked"))?
        .context("cannot build the OTLP HTTP client")
}
