//! An OTLP trace sink for the tracing tests: the OpenTelemetry collector's
//! `TraceService` on a free port, keeping every span the services export.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value::Value,
};
use tokio_stream::wrappers::TcpListenerStream;

/// One exported span, with the ids in lowercase hex as W3C trace context writes them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedSpan {
    /// The exporting process's `service.name`.
    pub service: String,
    /// The span's name.
    pub name: String,
    /// Its trace.
    pub trace_id: String,
    /// Its own id.
    pub span_id: String,
    /// Its parent's id; empty for a root span.
    pub parent_span_id: String,
}

#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| match attribute.value.as_ref()?.value.as_ref()? {
                    Value::StringValue(name) => Some(name.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for span in resource_spans.scope_spans.into_iter().flat_map(|scope| scope.spans) {
                received.push(ReceivedSpan {
                    service: service.clone(),
                    name: span.name,
                    trace_id: hex::encode(span.trace_id),
                    span_id: hex::encode(span.span_id),
                    parent_span_id: hex::encode(span.parent_span_id),
                });
            }
        }
        self.spans.lock().unwrap_or_else(std::sync::PoisonError::into_inner).extend(received);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// A running sink; it stops when dropped.
pub struct TraceSink {
    /// `http://127.0.0.1:port`, for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    collector: Collector,
    server: tokio::task::JoinHandle<()>,
}

impl TraceSink {
    /// Starts a sink on a free port.
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding the trace sink");
        let endpoint = format!("http://{}", listener.local_addr().expect("the sink's address"));
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        let server = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Self { endpoint, collector, server }
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.collector.spans.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Waits until the spans received satisfy `done`, up to `limit`, and returns them either way.
    pub async fn wait_for(&self, limit: Duration, done: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let spans = self.spans();
            if done(&spans) || tokio::time::Instant::now() >= deadline {
                return spans;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TraceSink {
    fn drop(&mut self) {
        self.server.abort();
    }
}
