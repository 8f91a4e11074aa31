//! Client-side balancing and retries: how a muster client reaches a service
//! that runs as several replicas.
//!
//! A service URL may list several URLs, comma-separated, and a URL's host
//! may be a DNS name with several addresses (a Kubernetes headless Service
//! gives one per ready pod). Calls go round-robin over every address that
//! answers: names are resolved again every [`RESOLVE_EVERY`], each address
//! found is probed with a TCP connection first, and an address whose call
//! fails to connect, or answers UNAVAILABLE, is passed over for
//! [`PASS_OVER`]. A name with one address keeps one connection to the name,
//! as before.
//!
//! A call that only reads ([`is_idempotent`]: `Get*`, `List*`, `Check*`,
//! `Validate*`, `Read*`, `Render*`, `Authenticate`) is tried again on
//! UNAVAILABLE, on another address when there is one, up to
//! [`MAX_ATTEMPTS`] times with a doubling pause, so reads keep working while
//! a replica restarts. Other calls fail with UNAVAILABLE for their caller
//! to decide.

use std::{
    collections::HashMap,
    net::SocketAddr,
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError, RwLock, Weak,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http_body_util::BodyExt as _;
use tonic::{body::Body, transport::Channel};
use tower::{Service, ServiceExt as _};

use crate::{
    Result,
    tls::{ClientTls, lazy_channel, lazy_channel_to},
};

/// How often names are resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(5);
/// How long an address that failed a call is passed over.
pub const PASS_OVER: Duration = Duration::from_secs(2);
/// Most tries of a call that only reads.
pub const MAX_ATTEMPTS: u32 = 5;
/// The first pause between tries; it doubles, up to a second.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
/// How long a probe of a new address may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One address calls may go to.
struct Target {
    channel: Channel,
    /// The URL it was reached by, which connection failures name (empty
    /// for a channel made elsewhere).
    url: String,
    /// Milliseconds since the process started before which it is passed over.
    passed_over_until: AtomicU64,
}

impl Target {
    fn new(channel: Channel, url: &str) -> Arc<Self> {
        Arc::new(Self { channel, url: url.to_owned(), passed_over_until: AtomicU64::new(0) })
    }

    /// A failure to reach the target as the caller reads it: UNAVAILABLE
    /// naming the URL tried, when the connection failed (an I/O error);
    /// others as they are.
    fn failure(&self, error: BoxError) -> BoxError {
        let mut causes = Vec::new();
        let mut io = false;
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error.as_ref());
        while let Some(cause) = source {
            io |= cause.is::<std::io::Error>();
            let text = cause.to_string();
            if !causes.iter().any(|known: &String| known.contains(&text)) {
                causes.push(text);
            }
            source = cause.source();
        }
        if !io || self.url.is_empty() {
            return error;
        }
        Box::new(tonic::Status::unavailable(format!("cannot reach {}: {}", self.url, causes.join(": "))))
    }

    fn usable(&self) -> bool {
        self.passed_over_until.load(Ordering::Relaxed) <= elapsed_ms()
    }

    fn pass_over(&self) {
        self.passed_over_until.store(elapsed_ms() + PASS_OVER.as_millis() as u64, Ordering::Relaxed);
    }
}

/// Milliseconds since the first call of this function.
fn elapsed_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
}

struct Shared {
    /// The addresses of each URL of the list.
    groups: Mutex<Vec<Vec<Arc<Target>>>>,
    /// All of them, as calls pick from.
    all: RwLock<Arc<[Arc<Target>]>>,
    next: AtomicUsize,
}

impl Shared {
    fn new(groups: Vec<Vec<Arc<Target>>>) -> Self {
        let all = groups.concat().into();
        Self { groups: Mutex::new(groups), all: RwLock::new(all), next: AtomicUsize::new(0) }
    }

    /// Replaces the addresses of one URL.
    fn set_group(&self, group: usize, targets: Vec<Arc<Target>>) {
        let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
        groups[group] = targets;
        *self.all.write().unwrap_or_else(PoisonError::into_inner) = groups.concat().into();
    }

    /// The next usable target, round-robin; any target when none is usable.
    fn pick(&self) -> Option<Arc<Target>> {
        let all = self.all.read().unwrap_or_else(PoisonError::into_inner).clone();
        if all.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..all.len())
            .map(|offset| &all[(start + offset) % all.len()])
            .find(|target| target.usable())
            .or_else(|| all.get(start % all.len()))
            .cloned()
    }
}

/// A channel over every address of one or several URLs (see the module
/// documentation). Cheap to clone; clones share the connections.
#[derive(Clone)]
pub struct Balanced {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Balanced {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Balanced").finish_non_exhaustive()
    }
}

impl From<Channel> for Balanced {
    /// One connection, as it is.
    fn from(channel: Channel) -> Self {
        Self { shared: Arc::new(Shared::new(vec![vec![Target::new(channel, "")]])) }
    }
}

impl Balanced {
    /// A lazily connecting channel to `urls`: one URL or several,
    /// comma-separated (`http://` or `https://`, with `tls`).
    pub fn connect(urls: &str, tls: Option<&ClientTls>) -> Result<Self> {
        let mut groups = Vec::new();
        let mut names = Vec::new();
        for url in urls.split(',').map(str::trim).filter(|url| !url.is_empty()) {
            let channel = lazy_channel(url, tls)?;
            if let Some((host, port)) = dns_name(url) {
                names.push((groups.len(), url.to_owned(), host, port));
            }
            groups.push(vec![Target::new(channel, url)]);
        }
        if groups.is_empty() {
            return Err(crate::Error::Config(format!("no service URL in {urls:?}")));
        }
        let shared = Arc::new(Shared::new(groups));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            for (group, url, host, port) in names {
                runtime.spawn(follow_name(Arc::downgrade(&shared), group, url, host, port, tls.cloned()));
            }
        }
        Ok(Self { shared })
    }
}

/// The host and port of a URL whose host is a DNS name (not an address).
fn dns_name(url: &str) -> Option<(String, u16)> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?.trim_matches(['[', ']']);
    if host.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
    Some((host.to_owned(), port))
}

/// Keeps a name's group to its addresses that answer, while the channel lives.
async fn follow_name(shared: Weak<Shared>, group: usize, url: String, host: String, port: u16, tls: Option<ClientTls>) {
    let mut channels: HashMap<SocketAddr, Arc<Target>> = HashMap::new();
    loop {
        if shared.strong_count() == 0 {
            return;
        }
        let mut addresses: Vec<SocketAddr> = match tokio::net::lookup_host((host.as_str(), port)).await {
            Ok(addresses) => addresses.collect(),
            Err(error) => {
                tracing::debug!(%host, %error, "resolving a service's name failed");
                Vec::new()
            }
        };
        addresses.sort();
        addresses.dedup();
        // One address: the connection to the name stays as it is.
        if addresses.len() > 1 {
            let mut answering = Vec::new();
            for address in &addresses {
                let probe = tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await;
                if matches!(probe, Ok(Ok(_))) {
                    answering.push(*address);
                }
            }
            channels.retain(|address, _| addresses.contains(address));
            let mut targets = Vec::new();
            for address in &answering {
                if let Some(target) = channels.get(address) {
                    targets.push(target.clone());
                } else {
                    match lazy_channel_to(&url, *address, tls.as_ref()) {
                        Ok(channel) => {
                            let target = Target::new(channel, &format!("{url} ({address})"));
                            channels.insert(*address, target.clone());
                            targets.push(target);
                        }
                        Err(error) => tracing::warn!(%url, %address, %error, "cannot reach a service address"),
                    }
                }
            }
            if !targets.is_empty() {
                let Some(shared) = shared.upgrade() else { return };
                shared.set_group(group, targets);
            }
        }
        tokio::time::sleep(RESOLVE_EVERY).await;
    }
}

/// Whether a method (a request path, `/package.Service/Method`) only reads,
/// and may be tried again.
pub fn is_idempotent(path: &str) -> bool {
    let method = path.rsplit('/').next().unwrap_or_default();
    ["Get", "List", "Check", "Validate", "Read", "Render"].iter().any(|prefix| method.starts_with(prefix))
        || method == "Authenticate"
}

/// Whether a response is a gRPC UNAVAILABLE without a body (trailers only).
fn unavailable(response: &http::Response<Body>) -> bool {
    response.headers().get("grpc-status").is_some_and(|status| status == "14")
}

async fn send(target: &Target, request: http::Request<Body>) -> std::result::Result<http::Response<Body>, BoxError> {
    let mut channel = target.channel.clone();
    let response = match channel.ready().await {
        Ok(ready) => ready.call(request).await,
        Err(error) => Err(error),
    };
    if response.as_ref().is_err() || response.as_ref().is_ok_and(unavailable) {
        target.pass_over();
    }
    response.map_err(|error| target.failure(error.into()))
}

impl Service<http::Request<Body>> for Balanced {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = std::result::Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<std::result::Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        let call = crate::observe::started(request.uri().path());
        let response = dispatch(shared, request);
        Box::pin(async move {
            let response = response.await;
            let Some(call) = call else { return response };
            match response {
                Ok(response) => Ok(crate::observe::reported(response, call)),
                Err(error) => {
                    call.ended(tonic::Code::Unavailable);
                    Err(error)
                }
            }
        })
    }
}

/// Sends a call to one of the replicas; a read that finds its replica
/// unavailable is tried again on another.
async fn dispatch(
    shared: Arc<Shared>,
    request: http::Request<Body>,
) -> std::result::Result<http::Response<Body>, BoxError> {
    let no_target = || -> BoxError { "no address to call".into() };
    if !is_idempotent(request.uri().path()) {
        let target = shared.pick().ok_or_else(no_target)?;
        return send(&target, request).await;
    }
    // A read's request is one small message: kept to send again.
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut pause = FIRST_PAUSE;
    let mut attempt = 1;
    loop {
        let target = shared.pick().ok_or_else(no_target)?;
        let request = http::Request::from_parts(parts.clone(), Body::new(http_body_util::Full::new(body.clone())));
        let response = send(&target, request).await;
        let retry = match &response {
            Ok(response) => unavailable(response),
            Err(_) => true,
        };
        if !retry || attempt == MAX_ATTEMPTS {
            return response;
        }
        tracing::debug!(path = %parts.uri.path(), attempt, "call unavailable; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(1));
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_tried_again_and_writes_are_not() {
        for path in [
            "/muster.execution.v1.ExecutionService/GetExecution",
            "/muster.roster.v1.RosterService/ListAgents",
            "/muster.roster.v1.RosterService/Authenticate",
            "/muster.validator.v1.ValidatorService/ValidateProcess",
        ] {
            assert!(is_idempotent(path), "{path}");
        }
        for path in [
            "/muster.execution.v1.ExecutionService/StartExecution",
            "/muster.roster.v1.RosterService/Delegate",
            "/muster.notifier.v1.NotifierService/IngestEvents",
            "/muster.execution.v1.ExecutionService/WatchExecution",
        ] {
            assert!(!is_idempotent(path), "{path}");
        }
    }

    #[test]
    fn only_names_are_resolved() {
        assert_eq!(dns_name("http://muster-roster:50052"), Some(("muster-roster".to_owned(), 50052)));
        assert_eq!(dns_name("https://muster-roster.muster.svc"), Some(("muster-roster.muster.svc".to_owned(), 443)));
        assert_eq!(dns_name("http://127.0.0.1:50052"), None);
        assert_eq!(dns_name("http://[::1]:50052"), None);
    }
}

#[cfg(test)]
mod calls {
    use std::sync::atomic::AtomicU32;

    use tonic_health::pb::{
        HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
        health_server::HealthServer,
    };

    use super::*;

    /// A health service that counts the checks it answers.
    #[derive(Clone, Default)]
    struct Counting(Arc<AtomicU32>);

    #[tonic::async_trait]
    impl tonic_health::pb::health_server::Health for Counting {
        async fn check(
            &self,
            _: tonic::Request<HealthCheckRequest>,
        ) -> std::result::Result<tonic::Response<tonic_health::pb::HealthCheckResponse>, tonic::Status> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Ok(tonic::Response::new(tonic_health::pb::HealthCheckResponse { status: ServingStatus::Serving as i32 }))
        }

        type WatchStream =
            tokio_stream::Empty<std::result::Result<tonic_health::pb::HealthCheckResponse, tonic::Status>>;

        async fn watch(
            &self,
            _: tonic::Request<HealthCheckRequest>,
        ) -> std::result::Result<tonic::Response<Self::WatchStream>, tonic::Status> {
            Err(tonic::Status::unimplemented("not here"))
        }
    }

    /// Serves `counting` on a port of its own until the handle is aborted.
    async fn serve(counting: Counting) -> (SocketAddr, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let server = tonic::transport::Server::builder()
            .add_service(HealthServer::new(counting))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener));
        (address, tokio::spawn(async move { server.await.unwrap() }))
    }

    #[tokio::test]
    async fn calls_go_round_the_replicas_and_reads_pass_over_one_that_is_down() {
        // A third of the picks land on the vacant address at first: the
        // read is tried again on another, and the vacant one passed over.
        let (first, second) = (Counting::default(), Counting::default());
        let (first_address, _first_server) = serve(first.clone()).await;
        let (second_address, _second_server) = serve(second.clone()).await;
        // Nothing listens at the third address.
        let vacant = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let urls = format!("http://{first_address}, http://{second_address},http://{vacant}");
        let mut client = HealthClient::new(Balanced::connect(&urls, None).unwrap());
        for _ in 0..30 {
            let answer = client.check(HealthCheckRequest::default()).await.expect("a read is tried again elsewhere");
            assert_eq!(answer.into_inner().status, ServingStatus::Serving as i32);
        }
        let (on_first, on_second) = (first.0.load(Ordering::Relaxed), second.0.load(Ordering::Relaxed));
        assert_eq!(on_first + on_second, 30);
        assert!(on_first >= 10 && on_second >= 10, "round-robin: {on_first} and {on_second}");
    }

    #[tokio::test]
    async fn a_service_that_cannot_be_reached_is_named() {
        let vacant = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let url = format!("http://{vacant}");
        let mut client = HealthClient::new(Balanced::connect(&url, None).unwrap());
        let failed = client.check(HealthCheckRequest::default()).await.unwrap_err();
        assert_eq!(failed.code(), tonic::Code::Unavailable, "{failed:?}");
        assert!(failed.message().starts_with(&format!("cannot reach {url}: ")), "{}", failed.message());
        assert!(failed.message().contains("refused"), "{}", failed.message());
    }
}
