//! Load shedding: a service handles at most a bounded number of calls at
//! once, and answers the rest with RESOURCE_EXHAUSTED and a `RetryInfo`
//! detail, instead of queueing them without bound. A client's call past the
//! limit waits a moment ([`WORK_GRACE`]) for a slot first: the slot of an
//! answer whose last bytes are still going out, while its client already
//! sent the next call, is given back within it, so one client's burst on a
//! connection never trips the limit that its own streams stay within.
//!
//! Nor does it handle any call before it is ready ([`Shedding::ready`]):
//! until its start is done (the database answers, migrations ran, a replica
//! joined the others), every call of muster's API is answered at once with
//! UNAVAILABLE, a `RetryInfo` and an `ErrorInfo` (`STARTING`). The listener
//! opens first, so that health can say NOT_SERVING, and a call handled in
//! that window would act on a service half set up: an execution replica
//! that has not joined the others would create a run no replica owns, its
//! events appended outside the replicas' turns on the log.
//!
//! Reads (`Get*`, `List*`, `Watch*`, `Subscribe`, `Check*`, `Render*`) and
//! the rest (the calls that do the work: publish, start, report, decide...)
//! have a budget each, so a flood of reads never sheds the work, nor the
//! other way round. Calls between muster's services are never shed like a
//! client's: they have an admission of their own, where a call past its
//! limit waits for a slot (up to ten seconds) instead of being refused, so
//! that a burst of a thousand starts never makes the roster refuse the
//! engine's delegations.
//!
//! Unary calls take a slot for their whole life; a streaming call takes one
//! while it opens (its handler's setup), not for as long as it stays open, so
//! a thousand connected workers or subscribers do not hold a thousand slots.
//! Shedding never changes the service's health: readiness says whether the
//! service can serve, and a replica taken out of its Service for being busy
//! would only pass its load to the others, the start of a cascade.
//!
//! Reads are shared fairly: no caller (an operator, an agent) holds more
//! than a quarter of the read slots (at least one), and agents together
//! leave one free, so that an agent's flood never sheds an operator's
//! `GetExecution`. A read of a caller at its share waits up to a quarter of
//! a second for one of its own to end (a client reading page after page asks
//! for the next page while the last one is still being sent). Watches (`Watch*`, `Subscribe`) open with slots of a
//! budget of their own, shared the same way, so that watches being opened
//! never take the short reads' slots.

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    pin::Pin,
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::auth::Caller;
use tonic::body::Body;
use tonic_types::{ErrorDetails, StatusExt as _};

/// How long a shed caller is told to wait before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a client's call that is not a read waits for a slot when the
/// service handles its limit of them, before it is refused.
const WORK_GRACE: Duration = Duration::from_millis(25);

/// How long a call of another service waits for a slot of their admission.
const SERVICE_ADMISSION_WAIT: Duration = Duration::from_secs(10);

/// How long a read waits for one of its caller's own reads to end when
/// the caller holds its share.
const OWN_SLOT_GRACE: Duration = Duration::from_millis(250);

/// The paths of muster's streaming methods.
static STREAMING: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    muster_proto::limits::METHODS.iter().filter(|method| method.streaming).map(|method| method.path).collect()
});

/// The shared state of one server's shedding.
#[derive(Debug)]
pub struct Shedding {
    reads: Arc<Shares>,
    watches: Arc<Shares>,
    work: Arc<Semaphore>,
    /// The admission of calls from the cluster's own services.
    services: Arc<Semaphore>,
    capacity: (usize, usize, usize),
    /// Whether the service's start is done: no call is handled before.
    ready: AtomicBool,
}

impl Shedding {
    /// At most `reads` reads, `watches` watches opening and `work` other
    /// calls of clients handled at once, and `services` calls of the
    /// cluster's services.
    pub fn new(reads: usize, watches: usize, work: usize, services: usize) -> Arc<Self> {
        let (reads, work, services) = (reads.max(1), work.max(1), services.max(1));
        Arc::new(Self {
            reads: Arc::new(Shares::new(reads)),
            watches: Arc::new(Shares::new(watches.max(1))),
            work: Arc::new(Semaphore::new(work)),
            services: Arc::new(Semaphore::new(services)),
            capacity: (reads, work, services),
            ready: AtomicBool::new(false),
        })
    }

    /// The service's start is done: calls are handled from now on.
    pub fn ready(&self) {
        self.ready.store(true, Ordering::Release);
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
        // Health, reflection and `/metrics` are never shed nor held back
        // while the service starts: probes must get through.
        let path = request.uri().path();
        if !path.starts_with("/muster.") {
            return Box::pin(self.inner.call(request));
        }
        if !self.shedding.ready.load(Ordering::Acquire) {
            let status = crate::status::retry_later(
                "the service is starting (its database, migrations, replicas) and serves no call yet; try again",
                "STARTING",
                &[],
            );
            return Box::pin(std::future::ready(Ok(status.into_http())));
        }
        let method = path.rsplit('/').next().unwrap_or_default();
        let caller = request.extensions().get::<Caller>();
        let verb = |verbs: &[&str]| verbs.iter().any(|verb| method.starts_with(verb));
        let kind = if matches!(caller, Some(Caller::Service { .. })) {
            Kind::Service
        } else if verb(&["Watch", "Subscribe"]) {
            Kind::Watch
        // (`ReadPayload` is work: a worker reads what its step needs.)
        } else if verb(&["Get", "List", "Check", "Render"]) {
            Kind::Read
        } else {
            Kind::Work
        };
        let pending = match kind {
            Kind::Service => match self.shedding.services.clone().try_acquire_owned() {
                Ok(permit) => Pending::Taken(Slot::Work(permit)),
                // The cluster's own calls wait for a slot.
                Err(_) => Pending::Admission(self.shedding.services.clone(), SERVICE_ADMISSION_WAIT),
            },
            Kind::Read | Kind::Watch => {
                let shares = if kind == Kind::Watch { &self.shedding.watches } else { &self.shedding.reads };
                match shares.try_take(caller) {
                    Ok(slot) => Pending::Taken(slot),
                    // A caller at its share of the reads waits a moment for
                    // one of its own to end: a client reading page after
                    // page asks for the next while the last one's answer is
                    // still being sent.
                    Err(Refusal::Share(_)) => Pending::OwnShare(shares.clone()),
                    Err(refusal) => {
                        return Box::pin(std::future::ready(Ok(refuse(&self.shedding, path, kind, refusal))));
                    }
                }
            }
            Kind::Work => match self.shedding.work.clone().try_acquire_owned() {
                Ok(permit) => Pending::Taken(Slot::Work(permit)),
                Err(_) => Pending::Admission(self.shedding.work.clone(), WORK_GRACE),
            },
        };
        let (shedding, path) = (self.shedding.clone(), path.to_owned());
        let caller = caller.cloned();
        let streaming = STREAMING.contains(path.as_str());
        let response = self.inner.call(request);
        Box::pin(async move {
            let permit = match pending {
                Pending::Taken(slot) => slot,
                Pending::OwnShare(shares) => match shares.take_within(caller.as_ref(), OWN_SLOT_GRACE).await {
                    Ok(slot) => slot,
                    Err(refusal) => return Ok(refuse(&shedding, &path, kind, refusal)),
                },
                Pending::Admission(admission, wait) => {
                    match tokio::time::timeout(wait, admission.acquire_owned()).await {
                        Ok(Ok(permit)) => Slot::Work(permit),
                        _ => return Ok(refuse(&shedding, &path, kind, Refusal::Full)),
                    }
                }
            };
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

/// What kind of call, for its budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A call of one of the cluster's services.
    Service,
    Read,
    Watch,
    /// A client's call that is not a read.
    Work,
}

/// A call's slot, or where it waits for one.
enum Pending {
    Taken(Slot),
    /// Its caller holds its share of the reads.
    OwnShare(Arc<Shares>),
    /// Every slot of this admission is taken: the call waits for one, so long at most.
    Admission(Arc<Semaphore>, Duration),
}

/// The answer to a call refused for `refusal`: RESOURCE_EXHAUSTED with a
/// retry delay (health is not touched).
fn refuse(shedding: &Shedding, path: &str, kind: Kind, refusal: Refusal) -> http::Response<Body> {
    crate::metrics::count(
        "muster_rpc_shed_total",
        "Calls refused because the service was handling its limit of calls",
        &[("method", path)],
        1,
    );
    let retry = RETRY_AFTER.as_millis();
    let (reads, work, services) = shedding.capacity;
    let message = match (kind, refusal) {
        (Kind::Service, _) => format!(
            "the service has been handling {services} calls of the cluster's services, their limit \
             (MUSTER_MAX_SERVICE_CALLS_IN_FLIGHT), for {} s; retry after {retry} ms",
            SERVICE_ADMISSION_WAIT.as_secs()
        ),
        (Kind::Work, _) => {
            format!("the service is handling {work} calls, its limit (MUSTER_MAX_IN_FLIGHT); retry after {retry} ms")
        }
        (Kind::Read, Refusal::Full) => format!(
            "the service is handling {reads} reads, its limit (MUSTER_MAX_READS_IN_FLIGHT); retry after {retry} ms"
        ),
        (Kind::Watch, Refusal::Full) => format!(
            "the service is opening {} watches, its limit (MUSTER_MAX_WATCHES_OPENING); retry after {retry} ms",
            shedding.watches.capacity
        ),
        (_, Refusal::Share(share)) => format!(
            "this caller has {share} reads in flight, its share of the service's (MUSTER_MAX_READS_IN_FLIGHT); retry after {retry} ms"
        ),
    };
    let status = tonic::Status::with_error_details(
        tonic::Code::ResourceExhausted,
        message,
        ErrorDetails::with_retry_info(Some(RETRY_AFTER)),
    );
    status.into_http()
}

/// A response body that holds its call's slot until it is sent.
struct Held {
    body: Body,
    _permit: Slot,
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

/// A slot taken: it goes back when dropped.
#[derive(Debug)]
enum Slot {
    Work(#[expect(dead_code, reason = "held for its drop")] OwnedSemaphorePermit),
    Shared(#[expect(dead_code, reason = "held for its drop")] SharedSlot),
}

/// Why a call got no slot.
#[derive(Debug, Clone, Copy)]
enum Refusal {
    /// The budget is spent.
    Full,
    /// The caller holds its share of it.
    Share(usize),
}

/// Who holds slots of a shared budget.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Holder {
    Operator(Arc<str>),
    Agent(Arc<str>),
    Service(Arc<str>),
    /// A call without a caller (not one of muster's): shared by all such.
    Unknown,
}

/// A budget of slots shared fairly between callers: each holds at most
/// `share` of them, and agents together leave `reserved` for operators
/// (and calls of the cluster's services, were they counted here).
#[derive(Debug)]
struct Shares {
    capacity: usize,
    share: usize,
    reserved: usize,
    held: Mutex<Holdings>,
    /// Woken when a slot goes back.
    released: Notify,
}

#[derive(Debug, Default)]
struct Holdings {
    total: usize,
    by_agents: usize,
    by_holder: HashMap<Holder, usize>,
}

impl Shares {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            share: (capacity / 4).max(1),
            reserved: usize::from(capacity >= 2),
            held: Mutex::new(Holdings::default()),
            released: Notify::new(),
        }
    }

    /// [`Shares::try_take`], waiting up to `grace` while the caller holds
    /// its share (not while the budget is spent).
    async fn take_within(self: &Arc<Self>, caller: Option<&Caller>, grace: Duration) -> Result<Slot, Refusal> {
        let deadline = tokio::time::Instant::now() + grace;
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            match self.try_take(caller) {
                Err(Refusal::Share(_)) if tokio::time::Instant::now() < deadline => {}
                taken => return taken,
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return self.try_take(caller);
            }
        }
    }

    fn try_take(self: &Arc<Self>, caller: Option<&Caller>) -> Result<Slot, Refusal> {
        let holder = match caller {
            Some(Caller::Operator { name }) => Holder::Operator(name.clone()),
            Some(Caller::Agent { id, .. }) => Holder::Agent(id.clone()),
            // (Services' calls are work: they never reach a shared budget.)
            Some(Caller::Service { name }) => Holder::Service(name.clone()),
            None => Holder::Unknown,
        };
        let agent = matches!(holder, Holder::Agent(_));
        let Ok(mut held) = self.held.lock() else {
            return Err(Refusal::Full);
        };
        if held.total >= self.capacity || (agent && held.by_agents + self.reserved >= self.capacity) {
            return Err(Refusal::Full);
        }
        let mine = held.by_holder.get(&holder).copied().unwrap_or(0);
        if mine >= self.share {
            return Err(Refusal::Share(mine));
        }
        held.total += 1;
        held.by_agents += usize::from(agent);
        held.by_holder.insert(holder.clone(), mine + 1);
        Ok(Slot::Shared(SharedSlot { shares: self.clone(), holder }))
    }
}

/// A slot of [`Shares`].
#[derive(Debug)]
struct SharedSlot {
    shares: Arc<Shares>,
    holder: Holder,
}

impl Drop for SharedSlot {
    fn drop(&mut self) {
        let Ok(mut held) = self.shares.held.lock() else {
            return;
        };
        held.total = held.total.saturating_sub(1);
        if matches!(self.holder, Holder::Agent(_)) {
            held.by_agents = held.by_agents.saturating_sub(1);
        }
        if let Some(count) = held.by_holder.get_mut(&self.holder) {
            *count -= 1;
            if *count == 0 {
                held.by_holder.remove(&self.holder);
            }
        }
        drop(held);
        self.shares.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str) -> Caller {
        Caller::Agent { id: id.into(), role: "".into(), token: crate::auth::TokenHash::of("token") }
    }

    fn operator(name: &str) -> Caller {
        Caller::Operator { name: name.into() }
    }

    #[test]
    fn no_caller_holds_more_than_its_share_and_agents_leave_one_slot_for_operators() {
        let shares = Arc::new(Shares::new(8));
        let (first, second, third) = (agent("a"), agent("b"), agent("c"));
        let held_by_first: Vec<Slot> = (0..2).map(|_| shares.try_take(Some(&first)).unwrap()).collect();
        assert!(matches!(shares.try_take(Some(&first)), Err(Refusal::Share(2))));
        let mut held: Vec<Slot> = (0..2).map(|_| shares.try_take(Some(&second)).unwrap()).collect();
        held.extend((0..2).map(|_| shares.try_take(Some(&third)).unwrap()));
        held.push(shares.try_take(Some(&agent("d"))).unwrap());
        // Seven taken by agents: the eighth is the operators'.
        assert!(matches!(shares.try_take(Some(&agent("e"))), Err(Refusal::Full)));
        let operator_slot = shares.try_take(Some(&operator("local"))).unwrap();
        assert!(matches!(shares.try_take(Some(&operator("other"))), Err(Refusal::Full)));
        drop(held_by_first);
        assert!(shares.try_take(Some(&first)).is_ok());
        drop(operator_slot);
        let held = shares.held.lock().unwrap();
        assert_eq!((held.total, held.by_agents), (5, 5));
    }

    #[test]
    fn a_small_budget_still_gives_every_caller_one_slot() {
        let shares = Arc::new(Shares::new(1));
        let slot = shares.try_take(Some(&agent("a"))).unwrap();
        assert!(shares.try_take(Some(&operator("local"))).is_err());
        drop(slot);
        assert!(shares.try_take(Some(&operator("local"))).is_ok());
    }

    #[tokio::test]
    async fn a_caller_at_its_share_waits_for_its_own_read_to_end() {
        let shares = Arc::new(Shares::new(4));
        let reader = agent("pager");
        let previous = shares.try_take(Some(&reader)).unwrap();
        let long = Duration::from_secs(60);
        let waiting = tokio::spawn({
            let (shares, reader) = (shares.clone(), reader.clone());
            async move { shares.take_within(Some(&reader), long).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(previous);
        assert!(waiting.await.unwrap(), "the next page gets the slot the last one gave back");

        // A slot held for longer than the grace: refused as before.
        let _held = shares.try_take(Some(&reader)).unwrap();
        let refused = shares.take_within(Some(&reader), Duration::from_millis(20)).await;
        assert!(matches!(refused, Err(Refusal::Share(1))));
        // A spent budget is not waited for.
        let _others: Vec<Slot> = ["b", "c"].iter().map(|id| shares.try_take(Some(&agent(id))).unwrap()).collect();
        let full = tokio::time::timeout(long / 2, shares.take_within(Some(&agent("d")), long)).await;
        assert!(matches!(full, Ok(Err(Refusal::Full))), "{full:?}");
    }

    /// Two calls at once where one slot is free and the first holds it for
    /// twice the grace: a client's second is refused, a service's second
    /// waits for the first to end. Held for a millisecond (a 25th of the
    /// grace), a client's second waits too.
    #[tokio::test]
    async fn the_services_calls_wait_where_a_clients_are_refused() {
        use http_body::Body as _;
        use tower::{Layer as _, Service as _, ServiceExt as _};

        let shedding = Shedding::new(4, 4, 1, 1);
        shedding.ready();
        let inner = tower::service_fn(|request: http::Request<Body>| async move {
            let brief = request.uri().path().ends_with("/Release");
            tokio::time::sleep(if brief { Duration::from_millis(1) } else { WORK_GRACE * 2 }).await;
            Ok::<_, std::convert::Infallible>(http::Response::new(Body::empty()))
        });
        let shed = ShedLayer::new(shedding).layer(inner);
        let call_method = |caller: Caller, method: &'static str| {
            let mut shed = shed.clone();
            async move {
                let mut request = http::Request::new(Body::empty());
                *request.uri_mut() = format!("/muster.roster.v1.RosterService/{method}").parse().unwrap();
                request.extensions_mut().insert(caller);
                let response = shed.ready().await.unwrap().call(request).await.unwrap();
                // The slot goes back once the answer's body is read.
                let status = response.headers().get("grpc-status").map(|status| status.to_str().unwrap().to_owned());
                let mut body = response.into_body();
                while std::future::poll_fn(|context| Pin::new(&mut body).poll_frame(context)).await.is_some() {}
                status
            }
        };
        let call = |caller: Caller| call_method(caller, "Delegate");
        let service = || Caller::Service { name: "execution".into() };
        let (first, second) = tokio::join!(call(service()), call(service()));
        assert_eq!((first, second), (None, None), "both served");
        let (first, second) = tokio::join!(call(agent("a")), call(agent("b")));
        assert_eq!((first, second.as_deref()), (None, Some("8")), "the second is RESOURCE_EXHAUSTED");
        let (first, second) = tokio::join!(call_method(agent("a"), "Release"), call_method(agent("b"), "Release"));
        assert_eq!((first, second), (None, None), "the second has the first's slot within the grace");
    }
}
