//! Load shedding: a service handles at most a bounded number of calls at
//! once, and answers the rest at once with RESOURCE_EXHAUSTED and a
//! `RetryInfo` detail, instead of queueing them without bound.
//!
//! Reads (`Get*`, `List*`, `Watch*`, `Subscribe`, `Check*`, `Render*`) and
//! the rest (the calls that do the work: publish, start, report, decide...)
//! have a budget each, so a flood of reads never sheds the work, nor the
//! other way round. Calls between muster's services are work, whatever the
//! method: the engine's reads of the roster are how it gets its work done.
//!
//! Unary calls take a slot for their whole life; a streaming call takes one
//! while it opens (its handler's setup), not for as long as it stays open, so
//! a thousand connected workers or subscribers do not hold a thousand slots.
//! While calls are being shed the service's health reads NOT_SERVING, so
//! Kubernetes routes new calls to other replicas; it reads SERVING again once
//! a second has passed without shedding.

use std::{
    collections::HashSet,
    future::Future,
    pin::Pin,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::auth::Caller;
use tonic::body::Body;
use tonic_types::{ErrorDetails, StatusExt as _};

/// How long a shed caller is told to wait before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The paths of muster's streaming methods.
static STREAMING: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    muster_proto::limits::METHODS.iter().filter(|method| method.streaming).map(|method| method.path).collect()
});

/// The shared state of one server's shedding.
#[derive(Debug)]
pub struct Shedding {
    reads: Arc<Semaphore>,
    work: Arc<Semaphore>,
    capacity: (usize, usize),
    /// Set when a call is shed; cleared by [`Shedding::watch`].
    shed: AtomicBool,
}

impl Shedding {
    /// At most `reads` reads, and `work` other calls, handled at once.
    pub fn new(reads: usize, work: usize) -> Arc<Self> {
        let (reads, work) = (reads.max(1), work.max(1));
        Arc::new(Self {
            reads: Arc::new(Semaphore::new(reads)),
            work: Arc::new(Semaphore::new(work)),
            capacity: (reads, work),
            shed: AtomicBool::new(false),
        })
    }

    /// Calls `overloaded(true)` when calls start being shed and
    /// `overloaded(false)` once a second has passed without any; runs until
    /// dropped.
    pub async fn watch<F, Fut>(self: Arc<Self>, overloaded: F)
    where
        F: Fn(bool) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut shedding = false;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        let mut quiet_ticks = 0;
        loop {
            tick.tick().await;
            let shed = self.shed.swap(false, Ordering::Relaxed);
            if shed {
                quiet_ticks = 0;
                if !shedding {
                    shedding = true;
                    tracing::warn!(
                        reads = self.capacity.0,
                        other_calls = self.capacity.1,
                        "overloaded: shedding calls, health NOT_SERVING"
                    );
                    overloaded(true).await;
                }
            } else if shedding {
                quiet_ticks += 1;
                if quiet_ticks >= 10 {
                    shedding = false;
                    tracing::info!("no longer overloaded: health SERVING");
                    overloaded(false).await;
                }
            }
        }
    }
}

/// The tower layer that sheds calls over a server's capacity.
#[derive(Debug, Clone)]
pub struct ShedLayer {
    shedding: Arc<Shedding>,
}

impl ShedLayer {
    /// Sheds with `shedding`'s slots.
    pub fn new(shedding: Arc<Shedding>) -> Self {
        Self { shedding }
    }
}

impl<S> tower::Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Shed { inner, shedding: self.shedding.clone() }
    }
}

/// The service of [`ShedLayer`].
#[derive(Debug, Clone)]
pub struct Shed<S> {
    inner: S,
    shedding: Arc<Shedding>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> tower::Service<http::Request<Body>> for Shed<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // Health, reflection and `/metrics` are never shed: probes must get through.
        let path = request.uri().path();
        if !path.starts_with("/muster.") {
            return Box::pin(self.inner.call(request));
        }
        let method = path.rsplit('/').next().unwrap_or_default();
        let service = matches!(request.extensions().get::<Caller>(), Some(Caller::Service { .. }));
        let read = !service
            // (`ReadPayload` is work: a worker reads what its step needs.)
            && ["Get", "List", "Watch", "Subscribe", "Check", "Render"]
                .iter()
                .any(|verb| method.starts_with(verb));
        let slots = if read { &self.shedding.reads } else { &self.shedding.work };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            self.shedding.shed.store(true, Ordering::Relaxed);
            crate::metrics::count(
                "muster_rpc_shed_total",
                "Calls refused at once because the service was handling its limit of calls",
                &[("method", path)],
                1,
            );
            let status = tonic::Status::with_error_details(
                tonic::Code::ResourceExhausted,
                if read {
                    format!(
                        "the service is handling {} reads, its limit (MUSTER_MAX_READS_IN_FLIGHT); retry after {} ms",
                        self.shedding.capacity.0,
                        RETRY_AFTER.as_millis()
                    )
                } else {
                    format!(
                        "the service is handling {} calls, its limit (MUSTER_MAX_IN_FLIGHT); retry after {} ms",
                        self.shedding.capacity.1,
                        RETRY_AFTER.as_millis()
                    )
                },
                ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let streaming = STREAMING.contains(path);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await;
            if streaming {
                // The stream is open: its slot goes back.
                drop(permit);
                return response;
            }
            // A unary answer's body is written after this future ends: the
            // slot goes back when the body is done.
            response.map(|response| response.map(|body| Body::new(Held { body, _permit: permit })))
        })
    }
}

/// A response body that holds its call's slot until it is sent.
struct Held {
    body: Body,
    _permit: OwnedSemaphorePermit,
}

impl http_body::Body for Held {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(context)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
