//! A service handles no call before it is ready: until its start is done
//! (the database answers, migrations ran, a replica joined the others),
//! every call of muster's API is answered at once with UNAVAILABLE, a
//! `RetryInfo` and an `ErrorInfo` (`STARTING`). Health, reflection and
//! `/metrics` answer throughout, so that probes see NOT_SERVING.
//!
//! The listener opens before the start is done (so that health can say
//! NOT_SERVING), and a call handled in that window would act on a service
//! half set up: an execution replica that has not joined the others yet
//! would create a run no replica owns, its events appended outside the
//! replicas' turns on the log.

use std::{
    future::Future,
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
};

use tonic::body::Body;

/// Whether the service's start is done; shared by the server and its gate.
#[derive(Debug, Clone, Default)]
pub struct Started(Arc<AtomicBool>);

impl Started {
    /// Marks the start done: calls are handled from now on.
    pub fn done(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_done(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// The tower layer that refuses muster's calls until [`Started::done`].
#[derive(Debug, Clone)]
pub struct StartingLayer {
    started: Started,
}

impl StartingLayer {
    /// Refuses calls until `started` is done.
    pub fn new(started: Started) -> Self {
        Self { started }
    }
}

impl<S> tower::Layer<S> for StartingLayer {
    type Service = Starting<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Starting { inner, started: self.started.clone() }
    }
}

/// The service of [`StartingLayer`].
#[derive(Debug, Clone)]
pub struct Starting<S> {
    inner: S,
    started: Started,
}

impl<S> tower::Service<http::Request<Body>> for Starting<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if self.started.is_done() || !request.uri().path().starts_with("/muster.") {
            return Box::pin(self.inner.call(request));
        }
        let status = crate::status::retry_later(
            "the service is starting (its database, migrations, replicas) and serves no call yet; try again",
            "STARTING",
            &[],
        );
        Box::pin(std::future::ready(Ok(status.into_http())))
    }
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
