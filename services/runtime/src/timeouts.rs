//! Slow and silent clients: nobody holds a connection, a stream or a slot
//! of the service ([`crate::shed`]) by saying nothing.
//!
//! - A connection has [`crate::ServerArgs::handshake_timeout`] to send the
//!   HTTP/2 preface and its SETTINGS (after TLS, if any); one that has not
//!   is closed ([`Guarded`], which wraps every accepted connection).
//! - The request of a unary or server-streaming call has
//!   [`crate::ServerArgs::request_body_timeout`] to arrive whole; past it the
//!   call ends with DEADLINE_EXCEEDED, which frees its slot. Client- and
//!   bidirectional-streaming calls (a worker's stream, a relay's) are not
//!   held to it: they have leases.
//! - An answer whose next message has waited
//!   [`crate::ServerArgs::response_idle_timeout`] for the client to read it
//!   (its flow-control window closed) is dropped, which frees its slot and
//!   ends its handler, and its connection is closed: hyper does not poll
//!   an answer it cannot send, nor lets a layer reset one stream, so the
//!   connection is the smallest thing that can be ended.
//!
//! Idle connections that do speak are the keepalive's (a ping every 30 s,
//! [`crate::ServerArgs::keepalive_timeout`] to answer it).

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    io,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, LazyLock, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    task::{Context, Poll, Waker},
    time::Duration,
};

use http_body::Frame;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, Sleep},
};
use tonic::{
    Status,
    body::Body,
    transport::server::{Connected, TcpConnectInfo, TlsConnectInfo},
};

/// Bytes a client sends first: the 24-byte preface, then the 9-byte header
/// of its SETTINGS frame. (An HTTP/1.1 request line for `/metrics` is longer.)
const HANDSHAKE_BYTES: usize = 24 + 9;

/// The paths of the methods whose client streams: their requests have no deadline.
static CLIENT_STREAMING: LazyLock<HashSet<String>> = LazyLock::new(|| {
    use prost::Message as _;
    let Ok(set) = prost_types::FileDescriptorSet::decode(muster_proto::FILE_DESCRIPTOR_SET) else {
        return HashSet::new();
    };
    set.file
        .iter()
        .flat_map(|file| {
            file.service.iter().flat_map(move |service| {
                service
                    .method
                    .iter()
                    .filter(|method| method.client_streaming())
                    .map(move |method| format!("/{}.{}/{}", file.package(), service.name(), method.name()))
            })
        })
        .collect()
});

/// The bounds, the connections open and the answers being sent, of one server.
#[derive(Debug)]
pub struct Timeouts {
    handshake: Duration,
    request_body: Duration,
    response_idle: Duration,
    started: Instant,
    connections: Mutex<HashMap<SocketAddr, Weak<ConnectionGuard>>>,
    answers: Mutex<HashMap<u64, Weak<Answer>>>,
    next_answer: AtomicU64,
}

impl Timeouts {
    /// The timeouts of `args`.
    pub fn new(args: &crate::ServerArgs) -> Arc<Self> {
        Arc::new(Self {
            handshake: args.handshake_timeout(),
            request_body: args.request_body_timeout(),
            response_idle: args.response_idle_timeout(),
            started: Instant::now(),
            connections: Mutex::new(HashMap::new()),
            answers: Mutex::new(HashMap::new()),
            next_answer: AtomicU64::new(0),
        })
    }

    /// Wraps an accepted connection from `peer`.
    pub fn guard<IO>(self: &Arc<Self>, io: IO, peer: Option<SocketAddr>) -> Guarded<IO> {
        let guard = Arc::new(ConnectionGuard::default());
        if let Some(peer) = peer
            && let Ok(mut connections) = self.connections.lock()
        {
            connections.insert(peer, Arc::downgrade(&guard));
        }
        Guarded {
            inner: io,
            handshake: Some(Handshake { deadline: Box::pin(tokio::time::sleep(self.handshake)), read: 0 }),
            guard,
            peer,
            timeouts: self.clone(),
        }
    }

    /// Milliseconds since the server started, never 0.
    fn now(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX).max(1)
    }

    /// Drops the answers that have waited too long for their readers, and
    /// closes their connections; runs until dropped.
    pub async fn sweep(self: Arc<Self>) {
        let period = (self.response_idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let limit = u64::try_from(self.response_idle.as_millis()).unwrap_or(u64::MAX);
        loop {
            tick.tick().await;
            let now = self.now();
            let stalled: Vec<Arc<Answer>> = match self.answers.lock() {
                Ok(mut answers) => {
                    answers.retain(|_, answer| answer.strong_count() > 0);
                    answers
                        .values()
                        .filter_map(Weak::upgrade)
                        .filter(|answer| {
                            let waiting_since = answer.waiting_since.load(Ordering::Relaxed);
                            waiting_since != 0 && now.saturating_sub(waiting_since) >= limit
                        })
                        .collect()
                }
                Err(_) => return,
            };
            for answer in stalled {
                tracing::info!(
                    method = %answer.path,
                    peer = ?answer.peer,
                    idle_ms = limit,
                    "an answer waited too long for its reader; ending it and closing its connection"
                );
                crate::metrics::count(
                    "muster_rpc_stalled_answers_total",
                    "Answers dropped because the client read nothing for the response idle timeout",
                    &[("method", &answer.path)],
                    1,
                );
                answer.waiting_since.store(0, Ordering::Relaxed);
                let body = answer.body.lock().ok().and_then(|mut body| body.take());
                drop(body);
                if let Some(guard) = answer.connection.upgrade() {
                    guard.close();
                }
            }
        }
    }
}

/// What can end one connection from outside it.
#[derive(Debug, Default)]
struct ConnectionGuard {
    closed: AtomicBool,
    /// The task reading the connection, woken to notice it is closed.
    reader: Mutex<Option<Waker>>,
}

impl ConnectionGuard {
    fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        if let Some(waker) = self.reader.lock().ok().and_then(|mut reader| reader.take()) {
            waker.wake();
        }
    }
}

struct Handshake {
    deadline: Pin<Box<Sleep>>,
    read: usize,
}

/// An accepted connection, closed when it does not start speaking HTTP/2
/// in time or when one of its answers stalls.
pub struct Guarded<IO> {
    inner: IO,
    handshake: Option<Handshake>,
    guard: Arc<ConnectionGuard>,
    peer: Option<SocketAddr>,
    timeouts: Arc<Timeouts>,
}

impl<IO> Drop for Guarded<IO> {
    fn drop(&mut self) {
        if let Some(peer) = self.peer
            && let Ok(mut connections) = self.timeouts.connections.lock()
            && connections.get(&peer).is_some_and(|guard| std::ptr::eq(guard.as_ptr(), Arc::as_ptr(&self.guard)))
        {
            connections.remove(&peer);
        }
    }
}

impl<IO: Connected> Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

fn closed_error(why: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, why.to_owned())
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.guard.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(closed_error("an answer waited too long for its reader")));
        }
        if let Ok(mut reader) = this.guard.reader.lock()
            && !reader.as_ref().is_some_and(|waker| waker.will_wake(context.waker()))
        {
            *reader = Some(context.waker().clone());
        }
        if let Some(handshake) = &mut this.handshake
            && handshake.deadline.as_mut().poll(context).is_ready()
        {
            tracing::info!(peer = ?this.peer, "a connection did not speak HTTP/2 in time; closing it");
            crate::metrics::count(
                "muster_connections_handshake_timeouts_total",
                "Connections closed because they did not send the HTTP/2 preface in time",
                &[],
                1,
            );
            return Poll::Ready(Err(closed_error("the HTTP/2 handshake timed out")));
        }
        let before = buffer.filled().len();
        let read = Pin::new(&mut this.inner).poll_read(context, buffer);
        if let Poll::Ready(Ok(())) = read
            && let Some(handshake) = &mut this.handshake
        {
            handshake.read += buffer.filled().len() - before;
            if handshake.read >= HANDSHAKE_BYTES {
                this.handshake = None;
            }
        }
        read
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        if self.guard.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(closed_error("an answer waited too long for its reader")));
        }
        Pin::new(&mut self.get_mut().inner).poll_write(context, buffer)
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(context)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.guard.closed.load(Ordering::Relaxed) {
            return Poll::Ready(Err(closed_error("an answer waited too long for its reader")));
        }
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// The peer a request came from, as tonic records it.
fn peer_of(extensions: &http::Extensions) -> Option<SocketAddr> {
    extensions
        .get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| extensions.get::<TlsConnectInfo<TcpConnectInfo>>().and_then(|tls| tls.get_ref().remote_addr()))
}

/// The tower layer of the request and answer deadlines.
#[derive(Debug, Clone)]
pub struct TimeoutsLayer {
    timeouts: Arc<Timeouts>,
}

impl TimeoutsLayer {
    /// Applies `timeouts`.
    pub fn new(timeouts: Arc<Timeouts>) -> Self {
        Self { timeouts }
    }
}

impl<S> tower::Layer<S> for TimeoutsLayer {
    type Service = TimeoutsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        TimeoutsService { inner, timeouts: self.timeouts.clone() }
    }
}

/// The service of [`TimeoutsLayer`].
#[derive(Debug, Clone)]
pub struct TimeoutsService<S> {
    inner: S,
    timeouts: Arc<Timeouts>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, RequestBody> tower::Service<http::Request<RequestBody>> for TimeoutsService<S>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>> + Send,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RequestBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    RequestBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = http::Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let path = request.uri().path().to_owned();
        // Health, reflection and `/metrics` are not muster's to bound.
        if !path.starts_with("/muster.") {
            return Box::pin(self.inner.call(request.map(Body::new)));
        }
        let peer = peer_of(request.extensions());
        let request = if CLIENT_STREAMING.contains(&path) {
            request.map(Body::new)
        } else {
            let deadline = Box::pin(tokio::time::sleep(self.timeouts.request_body));
            let timeout = self.timeouts.request_body;
            request.map(|body| Body::new(DeadlinedRequest { inner: Body::new(body), deadline, timeout, done: false }))
        };
        let response = self.inner.call(request);
        let timeouts = self.timeouts.clone();
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| timeouts.watch(body, path, peer)))
        })
    }
}

/// A request body that must end before its deadline.
struct DeadlinedRequest {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    timeout: Duration,
    done: bool,
}

impl http_body::Body for DeadlinedRequest {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if !self.done && self.deadline.as_mut().poll(context).is_ready() {
            self.done = true;
            return Poll::Ready(Some(Err(Status::deadline_exceeded(format!(
                "the request did not arrive whole within {} ms (MUSTER_REQUEST_BODY_TIMEOUT_MS)",
                self.timeout.as_millis()
            )))));
        }
        let frame = std::task::ready!(Pin::new(&mut self.inner).poll_frame(context));
        if frame.is_none() || self.inner.is_end_stream() {
            self.done = true;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// One answer being sent: the sweeper drops its body when it has waited
/// too long for its reader.
struct Answer {
    body: Mutex<Option<Body>>,
    /// When it last handed a frame to the connection that the connection
    /// has not come back for since (milliseconds of [`Timeouts::now`]); 0
    /// while it is being polled or done.
    waiting_since: AtomicU64,
    path: String,
    peer: Option<SocketAddr>,
    connection: Weak<ConnectionGuard>,
}

impl Timeouts {
    fn watch(self: &Arc<Self>, body: Body, path: String, peer: Option<SocketAddr>) -> Body {
        let connection = peer
            .and_then(|peer| self.connections.lock().ok().and_then(|connections| connections.get(&peer).cloned()))
            .unwrap_or_default();
        let answer =
            Arc::new(Answer { body: Mutex::new(Some(body)), waiting_since: AtomicU64::new(0), path, peer, connection });
        let id = self.next_answer.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut answers) = self.answers.lock() {
            answers.insert(id, Arc::downgrade(&answer));
        }
        Body::new(WatchedAnswer { answer, id, timeouts: self.clone() })
    }
}

/// The body of an [`Answer`].
struct WatchedAnswer {
    answer: Arc<Answer>,
    id: u64,
    timeouts: Arc<Timeouts>,
}

impl Drop for WatchedAnswer {
    fn drop(&mut self) {
        if let Ok(mut answers) = self.timeouts.answers.lock() {
            answers.remove(&self.id);
        }
    }
}

impl http_body::Body for WatchedAnswer {
    type Data = bytes::Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.answer.waiting_since.store(0, Ordering::Relaxed);
        let Ok(mut body) = self.answer.body.lock() else {
            return Poll::Ready(Some(Err(Status::internal("the answer's lock is poisoned"))));
        };
        let Some(inner) = body.as_mut() else {
            return Poll::Ready(Some(Err(Status::deadline_exceeded(
                "the answer waited too long for its reader (MUSTER_RESPONSE_IDLE_TIMEOUT_MS)",
            ))));
        };
        let frame = std::task::ready!(Pin::new(inner).poll_frame(context));
        if let Some(Ok(frame)) = &frame
            && frame.is_data()
        {
            self.answer.waiting_since.store(self.timeouts.now(), Ordering::Relaxed);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.answer.body.lock().map(|body| body.as_ref().is_none_or(http_body::Body::is_end_stream)).unwrap_or(true)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.answer.body.lock().ok().and_then(|body| body.as_ref().map(http_body::Body::size_hint)).unwrap_or_default()
    }
}
