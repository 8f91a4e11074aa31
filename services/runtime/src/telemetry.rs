//! Logs and traces.
//!
//! Logs: `tracing` with a human format on a terminal and JSON lines
//! otherwise, filtered by `MUSTER_LOG`; a field logged as a list is a JSON
//! array in them. While traces are exported, each JSON line written inside a
//! traced span starts with its `trace_id` and `span_id`, so a log line leads
//! to its trace and back.
//!
//! Traces: when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, the same `tracing` spans are
//! exported over OTLP/gRPC, configured by the standard `OTEL_*` variables
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//! `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_HEADERS`, ...); `OTEL_SDK_DISABLED=true` or
//! `OTEL_TRACES_EXPORTER=none` turn it off. W3C trace context travels in gRPC
//! metadata: [`extract`] continues a caller's trace on the server side, the
//! [`TraceContextInterceptor`] (part of every client's
//! [`crate::auth::client::Credentials`]) sends the current one on. Where
//! one call carries many units of work (a worker's stream, the event stream to
//! the notifier), each message carries its own `traceparent` ([`traceparent`],
//! [`continue_from`]). Those live in [`muster_client::trace`], which every
//! client links, and are re-exported here.

use std::{fmt::Write as _, io::IsTerminal};

pub use muster_client::trace::{TraceContextInterceptor, continue_from, extract, traceparent};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_sdk::{Resource, trace::SdkTracerProvider};
use tracing_subscriber::{EnvFilter, Layer, filter::LevelFilter, fmt, prelude::*};

use crate::config::LogFormat;

/// The installed telemetry; [`Telemetry::shutdown`] sends the last spans.
#[derive(Debug)]
#[must_use = "shut telemetry down on exit, or the last spans are lost"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Exports the spans still buffered and stops the exporter.
    pub async fn shutdown(self) {
        if let Some(provider) = self.provider {
            // The SDK's shutdown blocks until its export thread is done.
            let outcome = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            if let Ok(Err(error)) = outcome {
                eprintln!("exporting the last spans failed: {error}");
            }
        }
    }
}

/// Whether the `OTEL_*` environment asks for trace export.
pub fn otlp_requested() -> bool {
    let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
    let disabled = std::env::var("OTEL_SDK_DISABLED").is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"))
        || std::env::var("OTEL_TRACES_EXPORTER").is_ok_and(|value| value.trim().eq_ignore_ascii_case("none"));
    !disabled && (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
}

/// Installs the global subscriber, and the OTLP exporter when the
/// environment asks for it. `service` names the process in traces unless
/// `OTEL_SERVICE_NAME` does. Call once, first thing in `main`, inside the
/// Tokio runtime (the exporter's gRPC client lives on it).
pub fn init(service: &str, format: LogFormat, filter: &str) -> crate::Result<Telemetry> {
    let filter = EnvFilter::try_new(filter).map_err(|error| crate::Error::Telemetry(error.to_string()))?;
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Pretty => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let dispatch = DispatchSlot::default();
    let logs = if json {
        json_logs(std::io::stderr, dispatch.clone()).boxed()
    } else {
        fmt::layer().with_writer(std::io::stderr).boxed()
    };
    let provider = if otlp_requested() { Some(tracer_provider(service)?) } else { None };
    // Spans at INFO and above are traced, whatever the log level.
    let traces = provider.as_ref().map(|provider| {
        tracing_opentelemetry::layer().with_tracer(provider.tracer("muster")).with_filter(LevelFilter::INFO)
    });
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(traces)
        .with(dispatch.layer())
        .try_init()
        .map_err(|error| crate::Error::Telemetry(error.to_string()))?;
    Ok(Telemetry { provider })
}

fn tracer_provider(service: &str) -> crate::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|error| crate::Error::Telemetry(format!("OTLP exporter: {error}")))?;
    // The builder reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES; the
    // service's own name applies only when neither names the service.
    let detected = Resource::builder().build();
    let named = detected
        .get(&opentelemetry::Key::from_static_str("service.name"))
        .is_some_and(|name| !name.as_str().starts_with("unknown_service"));
    let resource = if named { detected } else { Resource::builder().with_service_name(service.to_owned()).build() };
    Ok(SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build())
}

/// The JSON line of an event: `{"timestamp":…,"level":…,"fields":{…},
/// "target":…,"spans":[…]}`, with the OpenTelemetry trace and span ids of
/// the event's span first (`{"trace_id":"…","span_id":"…",…`) when the span
/// is traced. A field whose text is a JSON array (a list logged with `?`,
/// such as `?agents`) is written as that array, not as a string.
struct JsonLine {
    dispatch: DispatchSlot,
}

/// The subscriber a [`JsonLine`] formats for: while an event is being
/// dispatched, the current dispatcher is out of reach, and the span's trace
/// context is read through this one.
#[derive(Clone, Default)]
struct DispatchSlot(std::sync::Arc<std::sync::OnceLock<tracing::dispatcher::WeakDispatch>>);

impl DispatchSlot {
    /// The slot as a layer that sees no span or event: unfiltered, a layer
    /// would enable every span and event at every level (the HTTP/2 stack's
    /// per-frame TRACE spans among them), whatever the log level says.
    fn layer<S>(self) -> impl Layer<S>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        self.with_filter(LevelFilter::OFF)
    }
}

impl<S: tracing::Subscriber> Layer<S> for DispatchSlot {
    fn on_register_dispatch(&self, dispatch: &tracing::Dispatch) {
        let _ = self.0.set(dispatch.downgrade());
    }
}

impl<S, N> fmt::FormatEvent<S, N> for JsonLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        context: &fmt::FmtContext<'_, S, N>,
        mut writer: fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        use fmt::time::FormatTime as _;
        let traced = context.lookup_current().and_then(|span| {
            let dispatch = self.dispatch.0.get()?.upgrade()?;
            tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)
        });
        let ids = traced.map(|traced| traced.span().span_context().clone()).filter(|ids| ids.is_valid());
        let mut line = String::with_capacity(256);
        line.push('{');
        if let Some(ids) = ids {
            write!(line, "\"trace_id\":\"{}\",\"span_id\":\"{}\",", ids.trace_id(), ids.span_id())?;
        }
        line.push_str("\"timestamp\":\"");
        fmt::time::SystemTime.format_time(&mut fmt::format::Writer::new(&mut line))?;
        write!(line, "\",\"level\":\"{}\",\"fields\":{{", event.metadata().level())?;
        let mut fields = EventFields { line: &mut line, first: true };
        event.record(&mut fields);
        write!(line, "}},\"target\":{}", Json::from(event.metadata().target()))?;
        if let Some(scope) = context.event_scope() {
            line.push_str(",\"spans\":[");
            for (index, span) in scope.from_root().enumerate() {
                if index > 0 {
                    line.push(',');
                }
                let extensions = span.extensions();
                let recorded = extensions.get::<fmt::FormattedFields<N>>().map_or("", |fields| fields.fields.as_str());
                let inner = recorded.trim().strip_prefix('{').and_then(|rest| rest.strip_suffix('}')).unwrap_or("");
                let comma = if inner.trim().is_empty() { "" } else { "," };
                write!(line, "{{{inner}{comma}\"name\":{}}}", Json::from(span.name()))?;
            }
            line.push(']');
        }
        line.push('}');
        writeln!(writer, "{line}")
    }
}

type Json = serde_json::Value;

/// Writes an event's fields into a JSON object being written.
struct EventFields<'a> {
    line: &'a mut String,
    first: bool,
}

impl EventFields<'_> {
    fn field(&mut self, name: &str, value: &Json) {
        if !std::mem::take(&mut self.first) {
            self.line.push(',');
        }
        let _ = write!(self.line, "{}:{value}", Json::from(name));
    }
}

impl tracing::field::Visit for EventFields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        let text = format!("{value:?}");
        let list = (field.name() != "message" && text.starts_with('['))
            .then(|| serde_json::from_str::<Json>(&text).ok().filter(Json::is_array))
            .flatten();
        self.field(field.name(), &list.unwrap_or(Json::String(text)));
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.field(field.name(), &Json::from(value));
    }

    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.field(field.name(), &Json::from(value));
    }

    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.field(field.name(), &Json::from(value));
    }

    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.field(field.name(), &Json::from(value));
    }

    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.field(field.name(), &Json::from(value));
    }

    fn record_error(&mut self, field: &tracing::field::Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field.name(), &Json::from(value.to_string()));
    }
}

/// JSON log lines written to `writer`, with the trace and span ids read
/// through `dispatch` (install it too: an `Option` of it would not learn
/// its subscriber).
fn json_logs<S, W>(writer: W, dispatch: DispatchSlot) -> impl Layer<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    fmt::layer().fmt_fields(fmt::format::JsonFields::new()).event_format(JsonLine { dispatch }).with_writer(writer)
}

#[cfg(test)]
mod tests {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::*;

    /// The lines a test's logger wrote.
    #[derive(Clone, Default)]
    struct Lines(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn json_lines_in_a_traced_span_start_with_its_trace_and_span_ids() {
        let lines = Lines::default();
        let writer = lines.clone();
        let provider = SdkTracerProvider::builder().build();
        let dispatch = DispatchSlot::default();
        let subscriber = tracing_subscriber::registry()
            .with(json_logs(move || writer.clone(), dispatch.clone()))
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")))
            .with(dispatch.layer());
        let expected = tracing::subscriber::with_default(subscriber, || {
            tracing::info!("outside any span");
            let span = tracing::info_span!("work");
            let _entered = span.enter();
            tracing::info!(step = "s1", "inside the span");
            let context = span.context();
            let ids = context.span().span_context().clone();
            (ids.trace_id().to_string(), ids.span_id().to_string())
        });
        let written = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = written.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{written}");
        assert!(lines[0].get("trace_id").is_none(), "{written}");
        assert_eq!(
            (lines[1]["trace_id"].as_str().unwrap(), lines[1]["span_id"].as_str().unwrap()),
            (expected.0.as_str(), expected.1.as_str())
        );
        assert_eq!(lines[1]["fields"]["step"], "s1", "the rest of the line is as before: {written}");
        assert_eq!(lines[1]["spans"][0]["name"], "work", "{written}");
    }

    #[test]
    fn json_lines_write_lists_as_arrays_and_keep_every_field() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber =
            tracing_subscriber::registry().with(json_logs(move || writer.clone(), DispatchSlot::default()));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", method = "Get", ids = ?["a", "b"]);
            let _entered = span.enter();
            let agents = vec!["writer-agent", "say \"hi\""];
            let none: Vec<String> = Vec::new();
            let address: std::net::SocketAddr = "[::1]:50051".parse().unwrap();
            tracing::warn!(?agents, tools = ?none, count = 2_u64, ok = true, ratio = 0.5, peer = ?address, name = "x", "[not a list]");
        });
        let written = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value =
            serde_json::from_str(written.trim()).unwrap_or_else(|error| panic!("{error}: {written}"));
        let fields = &line["fields"];
        assert_eq!(fields["agents"], serde_json::json!(["writer-agent", "say \"hi\""]), "{written}");
        assert_eq!(fields["tools"], serde_json::json!([]), "{written}");
        assert_eq!(
            (fields["count"].clone(), fields["ok"].clone(), fields["ratio"].clone()),
            (2.into(), true.into(), 0.5.into())
        );
        assert_eq!(fields["peer"], "[::1]:50051", "not JSON: kept as text");
        assert_eq!(fields["message"], "[not a list]", "the message stays text");
        assert_eq!(fields["name"], "x");
        assert_eq!(line["level"], "WARN");
        assert!(line["timestamp"].as_str().is_some_and(|time| time.ends_with('Z')), "{written}");
        assert_eq!(line["spans"][0]["name"], "request", "{written}");
        assert_eq!(line["spans"][0]["method"], "Get", "{written}");
        assert!(line.get("trace_id").is_none());
    }

    #[test]
    fn spans_and_events_below_the_log_level_are_not_made() {
        use tracing::Subscriber as _;
        let dispatch = DispatchSlot::default();
        let subscriber = tracing_subscriber::registry()
            .with(fmt::layer().with_writer(std::io::sink).with_filter(EnvFilter::new("info")))
            .with(dispatch.layer());
        // The hint is what every callsite below INFO is turned off by, in
        // every thread, before any filter is asked (callsite interest is
        // shared between the tests' subscribers, so it is not asked here).
        assert_eq!(subscriber.max_level_hint(), Some(LevelFilter::INFO));
    }
}
