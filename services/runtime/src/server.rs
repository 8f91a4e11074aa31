//! The one gRPC server builder. A service registers its own gRPC services,
//! each with the access rule of every method, and a readiness check; the
//! builder adds authentication ([`crate::auth::layer`]), TLS when configured,
//! health (NOT_SERVING until the check passes and from shutdown; never for load),
//! reflection v1 and v1alpha, request tracing, metrics, deadlines on slow
//! and silent clients ([`crate::timeouts`]), load shedding
//! ([`crate::shed`]), request limits ([`crate::limits`]) and graceful shutdown.

use std::{convert::Infallible, future::Future, time::Duration};

use tokio::net::TcpListener;
use tokio_stream::StreamExt as _;
use tonic::{
    body::Body,
    server::NamedService,
    service::{Routes, RoutesBuilder},
    transport::server::TcpIncoming,
};
use tonic_health::{ServingStatus, server::HealthReporter};
use tower_http::{
    classify::GrpcFailureClass,
    trace::{DefaultOnResponse, TraceLayer},
};
use tracing::{Level, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::{
    Error, Result,
    auth::{AuthLayer, Rule, layer::Rules},
    config::ServerArgs,
    limits::LimitsLayer,
    security::Security,
    shed::{ShedLayer, Shedding},
    timeouts::{Timeouts, TimeoutsLayer},
};

/// Any error a readiness check may end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Builds and runs one service's gRPC server.
pub struct Server {
    args: ServerArgs,
    routes: RoutesBuilder,
    service_names: Vec<&'static str>,
    rules: Rules,
}

impl Server {
    /// A server with the shared settings.
    pub fn new(args: &ServerArgs) -> Self {
        Self { args: args.clone(), routes: Routes::builder(), service_names: Vec::new(), rules: Rules::default() }
    }

    /// Registers a gRPC service with the access rule of each of its methods;
    /// its health status follows the server's readiness.
    pub fn add_service<S>(mut self, service: S, rules: &[Rule]) -> Self
    where
        S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
            + NamedService
            + Clone
            + Send
            + Sync
            + 'static,
        S::Future: Send + 'static,
    {
        self.routes.add_service(service);
        self.service_names.push(S::NAME);
        self.rules.add(S::NAME, rules);
        self
    }

    /// Serves on `listener` until `shutdown` resolves, authenticating
    /// callers with `security` (and speaking TLS when it says so).
    ///
    /// Health answers NOT_SERVING, and muster's calls UNAVAILABLE, until
    /// `ready` succeeds (the database answers, migrations ran); if `ready`
    /// fails the server stops with its error. On
    /// shutdown, health turns NOT_SERVING and in-flight calls get the grace
    /// period to finish; long-lived streams are cut after it.
    pub async fn serve(
        self,
        listener: TcpListener,
        security: &Security,
        ready: impl Future<Output = std::result::Result<(), BoxError>> + Send,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        let local_addr = listener
            .local_addr()
            .map_err(|source| Error::Io { context: "reading the bound address".to_owned(), source })?;
        if let Some(port_file) = &self.args.port_file {
            write_port_file(port_file, &local_addr.to_string())?;
        }

        let (health, health_service) = tonic_health::server::health_reporter();
        set_all(&health, &self.service_names, ServingStatus::NotServing).await;

        // Reflection advertises exactly what this server serves, not every
        // package of the shared descriptor set, and can describe all of it
        // (both reflection versions included: `buf curl --list-methods`
        // describes every listed service), and the `google.rpc` error details
        // muster's statuses carry, so that grpcurl and buf curl decode them.
        let reflection = || {
            let mut builder = tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(muster_proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
                .with_service_name("grpc.health.v1.Health")
                .with_service_name("grpc.reflection.v1.ServerReflection")
                .with_service_name("grpc.reflection.v1alpha.ServerReflection");
            for name in &self.service_names {
                builder = builder.with_service_name(*name);
            }
            builder
        };
        let reflection_error =
            |error: tonic_reflection::server::Error| Error::Telemetry(format!("reflection: {error}"));
        let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
        let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;

        let mut routes = self.routes;
        routes.add_service(health_service.clone()).add_service(reflection_v1).add_service(reflection_v1alpha);
        let health_port = match self.args.health_listen {
            Some(address) => Some(serve_health(address, health_service).await?),
            None => None,
        };

        let shedding = Shedding::new(
            self.args.max_reads_in_flight,
            self.args.max_watches_opening,
            self.args.max_in_flight,
            self.args.max_service_calls_in_flight,
        );
        let timeouts = Timeouts::new(&self.args);
        let sweeper = tokio::spawn(timeouts.clone().sweep());
        let (stop_sender, stop_receiver) = tokio::sync::oneshot::channel::<()>();
        let grace = self.args.shutdown_grace();
        // `/metrics` answers plain HTTP/1.1 on the same port, for Prometheus.
        let routes =
            Routes::from(routes.routes().into_axum_router().route("/metrics", axum::routing::get(metrics_page)));
        let router = tonic::transport::Server::builder()
            .accept_http1(true)
            .concurrency_limit_per_connection(self.args.max_concurrent_requests.max(1))
            .max_concurrent_streams(self.args.max_concurrent_streams.max(1))
            // Large windows: assignments carry the shared memory of an execution,
            // and 64 KiB windows would stall them on flow control.
            .initial_stream_window_size(Some(4 * 1024 * 1024))
            .initial_connection_window_size(Some(8 * 1024 * 1024))
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(self.args.keepalive_timeout()))
            .layer(
                TraceLayer::new_for_grpc()
                    .make_span_with(request_span)
                    .on_response(DefaultOnResponse::new().level(Level::DEBUG))
                    .on_failure(|failure: GrpcFailureClass, _latency: Duration, span: &Span| {
                        span.record("otel.status_code", "ERROR");
                        if let GrpcFailureClass::Status(status) = failure {
                            span.record("rpc.grpc.status_code", status.code_raw());
                        }
                    }),
            )
            .layer(crate::metrics::RpcMetricsLayer)
            .layer(TimeoutsLayer::new(timeouts.clone()))
            .layer(AuthLayer::new(security.authenticator.clone(), self.rules))
            .layer(ShedLayer::new(shedding.clone()))
            .layer(LimitsLayer::new(self.args.max_message_bytes))
            .add_routes(routes);
        let stopped = async move {
            let _ = stop_receiver.await;
        };
        let server: std::pin::Pin<Box<dyn Future<Output = std::result::Result<(), tonic::transport::Error>> + Send>> =
            match &security.server_tls {
                Some(tls) => {
                    let timeouts = timeouts.clone();
                    let incoming = tls.incoming(listener).map(move |accepted| {
                        accepted.map(|stream| {
                            let peer = stream.get_ref().0.peer_addr().ok();
                            timeouts.guard(stream, peer)
                        })
                    });
                    Box::pin(router.serve_with_incoming_shutdown(incoming, stopped))
                }
                // Nagle's algorithm on accepted sockets would add ~40 ms to small
                // replies (delayed ACKs): set TCP_NODELAY on every connection.
                None => {
                    let timeouts = timeouts.clone();
                    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true)).map(move |accepted| {
                        accepted.map(|stream| {
                            let peer = stream.peer_addr().ok();
                            timeouts.guard(stream, peer)
                        })
                    });
                    Box::pin(router.serve_with_incoming_shutdown(incoming, stopped))
                }
            };
        tracing::info!(address = %local_addr, services = ?self.service_names, tls = security.server_tls.is_some(), "listening");

        let mut server = server;
        let mut ready = std::pin::pin!(ready);
        let mut shutdown = std::pin::pin!(shutdown);
        let mut is_ready = false;
        loop {
            tokio::select! {
                result = &mut server => return result.map_err(Error::from),
                outcome = &mut ready, if !is_ready => {
                    if let Err(error) = outcome {
                        tracing::error!(%error, "service failed to become ready");
                        return Err(Error::NotReady(error.to_string()));
                    }
                    is_ready = true;
                    shedding.ready();
                    set_all(&health, &self.service_names, ServingStatus::Serving).await;
                    tracing::info!("serving");
                }
                () = &mut shutdown => break,
            }
        }

        set_all(&health, &self.service_names, ServingStatus::NotServing).await;
        tracing::info!(grace_seconds = grace.as_secs(), "shutting down");
        let _ = stop_sender.send(());
        match tokio::time::timeout(grace, &mut server).await {
            Ok(result) => result.map_err(Error::from)?,
            Err(_) => tracing::warn!("grace period over; closing the remaining connections"),
        }
        if let Some(health_port) = health_port {
            health_port.abort();
        }
        sweeper.abort();
        tracing::info!("stopped");
        Ok(())
    }
}

/// Serves gRPC health and `/metrics` alone on `address`, plain, for probes
/// and scrapers that cannot present credentials or client certificates.
async fn serve_health<S>(address: std::net::SocketAddr, health: S) -> Result<tokio::task::JoinHandle<()>>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind(address)
        .await
        .map_err(|source| Error::Io { context: format!("listening on {address} for health"), source })?;
    let mut routes = Routes::builder();
    routes.add_service(health);
    let routes = Routes::from(routes.routes().into_axum_router().route("/metrics", axum::routing::get(metrics_page)));
    tracing::info!(%address, "health and metrics listening");
    Ok(tokio::spawn(async move {
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        if let Err(error) = tonic::transport::Server::builder()
            .accept_http1(true)
            .add_routes(routes)
            .serve_with_incoming(incoming)
            .await
        {
            tracing::error!(%error, "the health port stopped");
        }
    }))
}

async fn metrics_page() -> impl axum::response::IntoResponse {
    ([(http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], crate::metrics::render())
}

/// The span of one call, named after its method as OpenTelemetry's RPC
/// conventions say, and continuing the caller's trace when the metadata
/// carries one.
fn request_span<B>(request: &http::Request<B>) -> Span {
    let path = request.uri().path();
    let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
    let span = tracing::info_span!(
        "grpc request",
        otel.name = path.trim_start_matches('/'),
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        rpc.system = "grpc",
        rpc.service = service,
        rpc.method = method,
        rpc.grpc.status_code = tracing::field::Empty,
    );
    let parent = crate::telemetry::extract(request.headers());
    if opentelemetry::trace::TraceContextExt::has_active_span(&parent) {
        let _ = span.set_parent(parent);
    }
    span
}

async fn set_all(health: &HealthReporter, names: &[&'static str], status: ServingStatus) {
    health.set_service_status("", status).await;
    for name in names {
        health.set_service_status(*name, status).await;
    }
}

/// Writes `address` to `path` atomically (a temporary file renamed), for
/// whoever waits for the service to listen.
pub fn write_port_file(path: &std::path::Path, address: &str) -> Result<()> {
    let temporary = path.with_extension("tmp");
    let io_error = |source| Error::Io { context: format!("writing {}", path.display()), source };
    std::fs::write(&temporary, address).map_err(io_error)?;
    std::fs::rename(&temporary, path).map_err(io_error)
}

#[cfg(test)]
mod tests {
    use muster_proto::roster::v1::{
        WatchCredentialsRequest, credential_service_client::CredentialServiceClient,
        credential_service_server::CredentialServiceServer,
    };
    use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient};
    use tonic_types::StatusExt as _;

    use crate::testing::{MemoryCredentialLog, TestCredentials, connect_when_serving};

    #[tokio::test]
    async fn calls_made_before_the_service_is_ready_are_refused_with_unavailable_and_a_retry() {
        let credentials = TestCredentials::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut args = crate::ServerArgs::default();
        credentials.apply(&mut args);
        let directory = crate::auth::AgentDirectory::new(std::time::Duration::from_secs(5));
        directory.caught_up();
        let security = crate::security::Security::with_directory("roster", &args, directory).unwrap();
        let service = CredentialServiceServer::new(crate::auth::watch::CredentialStream::new(std::sync::Arc::new(
            MemoryCredentialLog::default(),
        )));
        let (ready_sender, ready) = tokio::sync::oneshot::channel::<()>();
        let ready = async move {
            ready.await.map_err(|_| "the test ended")?;
            Ok(())
        };
        tokio::spawn(async move {
            let server = crate::Server::new(&args)
                .add_service(service, &[crate::auth::rule("WatchCredentials", crate::auth::Access::SERVICE)]);
            let _ = server.serve(listener, &security, ready, std::future::pending()).await;
        });

        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        let channel = loop {
            if let Ok(channel) = tonic::transport::Endpoint::from_shared(url.clone()).unwrap().connect().await {
                break channel;
            }
            assert!(tokio::time::Instant::now() < deadline, "the server never listened");
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        };
        let health = HealthClient::new(channel.clone()).check(HealthCheckRequest { service: String::new() }).await;
        assert_eq!(health.unwrap().into_inner().status, ServingStatus::NotServing as i32, "health answers throughout");
        let mut client = CredentialServiceClient::new(crate::auth::client::with_credentials(
            channel,
            credentials.service("execution"),
        ));
        let refused = client.watch_credentials(WatchCredentialsRequest::default()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        assert!(refused.message().contains("starting"), "{}", refused.message());
        assert!(refused.get_details_retry_info().is_some(), "the refusal says when to retry");
        assert_eq!(refused.get_details_error_info().unwrap().reason, "STARTING");

        ready_sender.send(()).unwrap();
        connect_when_serving(&url).await;
        client.watch_credentials(WatchCredentialsRequest::default()).await.expect("served once ready");
    }
}
