//! Logging and traces, set up the same way by both binaries (`pgfleet` and
//! `pgfleet-agent` call `init`; nothing of this is copied between them).
//!
//! Logs go to stderr, filtered by `PGFLEET_LOG` (an `EnvFilter`). Traces
//! are exported over OTLP/gRPC only when the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set; otherwise nothing is exported and spans cost what `tracing`'s
//! cost. A cell's span crosses from the controller to its agent as a W3C
//! `traceparent` (in `Assign`): `traceparent` writes it, `set_parent`
//! reads it, so the agent's spans are children of the controller's.

//!
//! Without the `otel` feature (the client-only `pgfleet`) there are logs
//! only: `init` says so when traces are asked for, and the trace context
//! functions do nothing.

#[cfg(feature = "otel")]
use std::collections::HashMap;

#[cfg(feature = "otel")]
use opentelemetry::propagation::TextMapPropagator;
#[cfg(feature = "otel")]
use opentelemetry::trace::TracerProvider as _;
#[cfg(feature = "otel")]
use opentelemetry_sdk::propagation::TraceContextPropagator;
#[cfg(feature = "otel")]
use opentelemetry_sdk::trace::SdkTracerProvider;
#[cfg(feature = "otel")]
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps the trace exporter; dropping it flushes the spans not yet sent.
/// Must be created and dropped where a Tokio runtime is running (the
/// gRPC exporter's connection lives on it).
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<SdkTracerProvider>,
}

#[cfg(feature = "otel")]
impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            let _ = p.shutdown();
        }
    }
}

/// Whether the environment asks for traces.
pub fn traces_wanted() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|k| std::env::var(k).is_ok_and(|v| !v.trim().is_empty()))
}

/// Installs the global subscriber: stderr logs at `default_level` unless
/// `PGFLEET_LOG` says otherwise, and the OTLP trace layer when asked for.
/// An exporter that cannot be built is reported on stderr and skipped: a
/// run never fails for its traces.
pub fn init(service: &'static str, default_level: &str) -> Telemetry {
    let filter = tracing_subscriber::EnvFilter::try_from_env("PGFLEET_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter);
    #[cfg(feature = "otel")]
    {
        let provider = if traces_wanted() {
            match opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .build()
            {
                Ok(exporter) => Some(
                    SdkTracerProvider::builder()
                        .with_batch_exporter(exporter)
                        .with_resource(
                            opentelemetry_sdk::Resource::builder()
                                .with_service_name(service)
                                .build(),
                        )
                        .build(),
                ),
                Err(e) => {
                    eprintln!("warning: traces not exported: {e}");
                    None
                }
            }
        } else {
            None
        };
        // Only pgfleet's own spans become traces (not every dependency's).
        let otel = provider.as_ref().map(|p| {
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("pgfleet"))
                .with_filter(
                    tracing_subscriber::filter::Targets::new()
                        .with_target("pgfleet", tracing::Level::INFO),
                )
        });
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(otel)
            .try_init();
        Telemetry { provider }
    }
    #[cfg(not(feature = "otel"))]
    {
        if traces_wanted() {
            eprintln!(
                "warning: traces not exported: {service} was built without the `otel` feature"
            );
        }
        let _ = tracing_subscriber::registry().with(fmt).try_init();
        Telemetry {}
    }
}

use tracing_subscriber::Layer as _;

/// `span`'s W3C `traceparent` ("" when traces are off).
#[cfg(feature = "otel")]
pub fn traceparent(span: &tracing::Span) -> String {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut carrier);
    carrier.remove("traceparent").unwrap_or_default()
}

/// Makes `span` a child of the span `traceparent` names (nothing for "").
#[cfg(feature = "otel")]
pub fn set_parent(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    let _ = span.set_parent(cx);
}

#[cfg(not(feature = "otel"))]
pub fn traceparent(_span: &tracing::Span) -> String {
    String::new()
}

#[cfg(not(feature = "otel"))]
pub fn set_parent(_span: &tracing::Span, _traceparent: &str) {}
