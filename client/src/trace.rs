//! W3C trace context across calls and messages, so one unit of work is one
//! trace whatever process it passes through.
//!
//! The context travels in gRPC metadata: [`extract`] continues a caller's
//! trace on the server side, the [`TraceContextInterceptor`] (part of every
//! client's [`crate::auth::Credentials`]) sends the current one on. Where
//! one call carries many units of work (a worker's stream, the event stream
//! to the notifier), each message carries its own `traceparent`
//! ([`traceparent`], [`continue_from`]). Spans have a context to hand on only
//! while a subscriber exports them: setting that up (logs, the OTLP
//! exporter) is `muster-runtime`'s `telemetry`.

use opentelemetry::{
    Context,
    propagation::{Extractor, Injector, TextMapPropagator},
    trace::TraceContextExt,
};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The trace context a request's metadata carries (W3C `traceparent` and
/// `tracestate`); empty when it carries none.
pub fn extract(headers: &http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&HeaderExtractor(headers))
}

/// Makes `span` a child of the W3C `traceparent` a message carries; does
/// nothing when it is empty or malformed, or when traces are not exported.
pub fn continue_from(span: &Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let headers = [("traceparent", traceparent)];
    let context = TraceContextPropagator::new().extract(&PairExtractor(&headers));
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The W3C `traceparent` of `span`, to hand to work done elsewhere; empty
/// when traces are not exported.
pub fn traceparent(span: &Span) -> String {
    let mut fields = Vec::new();
    TraceContextPropagator::new().inject_context(&span.context(), &mut PairInjector(&mut fields));
    fields.into_iter().find_map(|(key, value)| (key == "traceparent").then_some(value)).unwrap_or_default()
}

/// A client interceptor that sends the current span's trace context with
/// every call, so the callee's spans join the caller's trace.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContextInterceptor;

impl tonic::service::Interceptor for TraceContextInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let context = Span::current().context();
        if context.span().span_context().is_valid() {
            TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(request.metadata_mut()));
        }
        Ok(request)
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct PairExtractor<'a>(&'a [(&'a str, &'a str)]);

impl Extractor for PairExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find_map(|(name, value)| (*name == key).then_some(*value))
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| *name).collect()
    }
}

struct PairInjector<'a>(&'a mut Vec<(String, String)>);

impl Injector for PairInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_round_trips_through_metadata_and_messages() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().unwrap());
        let context = extract(&headers);
        assert_eq!(context.span().span_context().trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");

        let mut metadata = tonic::metadata::MetadataMap::new();
        TraceContextPropagator::new().inject_context(&context, &mut MetadataInjector(&mut metadata));
        assert_eq!(metadata.get("traceparent").unwrap().to_str().unwrap(), traceparent);
    }

    #[test]
    fn malformed_or_missing_context_is_ignored() {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", "00-not-a-trace-01".parse().unwrap());
        assert!(!extract(&headers).span().span_context().is_valid());
        assert!(!extract(&http::HeaderMap::new()).span().span_context().is_valid());
        // Without an exporting subscriber, spans have no context to hand on.
        let span = tracing::info_span!("untraced");
        continue_from(&span, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert_eq!(traceparent(&span), "");
    }
}
