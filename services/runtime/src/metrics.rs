//! Prometheus metrics, through the `prometheus-client` crate: a process-wide
//! registry of counters, gauges and histograms with labels, collectors that
//! set gauges when scraped, the RPC layer that records every call, the
//! `process_*` metrics (CPU, memory, file descriptors, threads, start time)
//! and `muster_build_info`, all served as OpenMetrics text at `/metrics`
//! (HTTP/1.1, so Prometheus scrapes it as is).
//!
//! Calls are recorded under the standard gRPC server metrics that stock
//! dashboards and alerts know (the `go-grpc-prometheus` names and labels):
//! `grpc_server_started_total`, `grpc_server_handled_total` with the code a
//! call ended with (from its trailers when it streamed) and
//! `grpc_server_handling_seconds`, each by `grpc_type`, `grpc_service` and
//! `grpc_method`. `muster_rpc_requests_total` and
//! `muster_rpc_duration_seconds` (by method and the code of the response
//! headers) stay for one release, deprecated.

use std::{
    collections::HashMap,
    future::Future,
    pin::Pin,
    sync::{Mutex, MutexGuard, OnceLock, PoisonError, RwLock, atomic::AtomicU64},
    task::{Context, Poll},
    time::Instant,
};

use muster_client::observe::status_of;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
        info::Info,
    },
    registry::Registry,
};

/// The content type of what [`render`] writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(String, String)>;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS: [f64; 14] = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Upper bounds of the buckets of long durations (runs of processes), in seconds.
const LONG_BUCKETS: [f64; 14] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];

fn long_histogram() -> Histogram {
    Histogram::new(LONG_BUCKETS)
}

/// The series registered under one name: a family by labels, or one series
/// for a metric without labels (written without `{}`).
#[derive(Clone)]
enum Metric {
    Counters(Family<Labels, Counter>),
    Gauges(Family<Labels, Gauge<f64, AtomicU64>>),
    Histograms(Family<Labels, Histogram, fn() -> Histogram>),
    Counter(Counter),
    Gauge(Gauge<f64, AtomicU64>),
    Histogram(Histogram),
}

struct Metrics {
    registry: Mutex<Registry>,
    /// Read at every record, written once per name.
    by_name: RwLock<HashMap<&'static str, Metric>>,
}

fn metrics() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let mut registry = Registry::default();
        let version = vec![("version".to_owned(), env!("CARGO_PKG_VERSION").to_owned())];
        registry.register("muster_build", "The muster version this process runs", Info::new(version));
        registry.register_collector(Box::new(ProcessCollector));
        Metrics { registry: Mutex::new(registry), by_name: RwLock::default() }
    })
}

/// Runs `record` on the series named `name`, registered with `help` (made
/// by `make`) on first use. A name keeps the kind, and the labels or their
/// absence, it was first used with. Recording takes a shared lock only.
fn with_metric(name: &'static str, help: &'static str, make: impl FnOnce() -> Metric, record: impl FnOnce(&Metric)) {
    let metrics = metrics();
    if let Some(found) = metrics.by_name.read().unwrap_or_else(PoisonError::into_inner).get(name) {
        return record(found);
    }
    let mut by_name = metrics.by_name.write().unwrap_or_else(PoisonError::into_inner);
    let found = by_name.entry(name).or_insert_with(|| {
        let made = make();
        // The encoder appends `_total` to a counter's name.
        let counter_name = name.strip_suffix("_total").unwrap_or(name);
        let mut registry = metrics.registry.lock().unwrap_or_else(PoisonError::into_inner);
        match made.clone() {
            Metric::Counters(family) => registry.register(counter_name, help, family),
            Metric::Counter(counter) => registry.register(counter_name, help, counter),
            Metric::Gauges(family) => registry.register(name, help, family),
            Metric::Gauge(gauge) => registry.register(name, help, gauge),
            Metric::Histograms(family) => registry.register(name, help, family),
            Metric::Histogram(histogram) => registry.register(name, help, histogram),
        }
        made
    });
    record(found);
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
}

/// Adds `amount` to a counter (its name ends in `_total`).
pub fn count(name: &'static str, help: &'static str, pairs: &[(&str, &str)], amount: u64) {
    counter(name, help, pairs).add(amount);
}

/// One counter series, found once: for a caller that adds to it at a high
/// rate, each addition one atomic add instead of [`count`]'s lookup of the
/// name and labels.
#[derive(Clone, Debug, Default)]
pub struct CounterSeries(Counter);

impl CounterSeries {
    /// Adds `amount`.
    pub fn add(&self, amount: u64) {
        self.0.inc_by(amount);
    }
}

/// The series of a counter that [`count`] with the same arguments adds to.
pub fn counter(name: &'static str, help: &'static str, pairs: &[(&str, &str)]) -> CounterSeries {
    let make =
        || if pairs.is_empty() { Metric::Counter(Counter::default()) } else { Metric::Counters(Family::default()) };
    let mut series = CounterSeries::default();
    with_metric(name, help, make, |metric| match metric {
        Metric::Counters(family) => series = CounterSeries(family.get_or_create(&labels(pairs)).clone()),
        Metric::Counter(counter) => series = CounterSeries(counter.clone()),
        _ => {}
    });
    series
}

/// Sets a gauge.
pub fn set(name: &'static str, help: &'static str, pairs: &[(&str, &str)], value: f64) {
    let make = || if pairs.is_empty() { Metric::Gauge(Gauge::default()) } else { Metric::Gauges(Family::default()) };
    with_metric(name, help, make, |metric| match metric {
        Metric::Gauges(family) => _ = family.get_or_create(&labels(pairs)).set(value),
        Metric::Gauge(gauge) => _ = gauge.set(value),
        _ => {}
    });
}

/// Records one observation, in seconds, in a histogram.
pub fn observe(name: &'static str, help: &'static str, pairs: &[(&str, &str)], seconds: f64) {
    observe_in(latency_histogram, name, help, pairs, seconds);
}

/// [`observe`] for durations of seconds to hours (a process's runs): buckets
/// from 50 ms to 4 h.
pub fn observe_long(name: &'static str, help: &'static str, pairs: &[(&str, &str)], seconds: f64) {
    observe_in(long_histogram, name, help, pairs, seconds);
}

fn observe_in(
    buckets: fn() -> Histogram,
    name: &'static str,
    help: &'static str,
    pairs: &[(&str, &str)],
    seconds: f64,
) {
    let make = || {
        if pairs.is_empty() {
            Metric::Histogram(buckets())
        } else {
            Metric::Histograms(Family::new_with_constructor(buckets))
        }
    };
    with_metric(name, help, make, |metric| match metric {
        Metric::Histograms(family) => family.get_or_create(&labels(pairs)).observe(seconds),
        Metric::Histogram(histogram) => histogram.observe(seconds),
        _ => {}
    });
}

type Collect = Box<dyn Fn() -> bool + Send + Sync>;

fn collectors() -> MutexGuard<'static, Vec<Collect>> {
    static COLLECTORS: OnceLock<Mutex<Vec<Collect>>> = OnceLock::new();
    COLLECTORS.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner)
}

/// Registers a collector that [`render`] runs first, to [`set`] gauges read
/// from in-memory state when scraped rather than copied into the registry at
/// every change (state that changes on a hot path, such as a notifier
/// subscriber's lag, which moves with each notification delivered). It
/// returns false once what it measures is gone, and is then dropped. It must
/// not register collectors itself.
pub fn collect_on_render(collector: impl Fn() -> bool + Send + Sync + 'static) {
    collectors().push(Box::new(collector));
}

/// Every metric, as OpenMetrics text ([`CONTENT_TYPE`]).
pub fn render() -> String {
    collectors().retain(|collector| collector());
    let mut text = String::new();
    // Writing to a String cannot fail.
    let registry = metrics().registry.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
    text
}

/// The standard `process_*` metrics, read from `/proc` at each scrape (none
/// where there is no `/proc`).
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(process) = ProcessStats::read() else { return Ok(()) };
        let cpu = ConstCounter::new(process.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size in bytes", process.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size in bytes", process.virtual_bytes),
            ("process_open_fds", "Number of open file descriptors", process.open_fds),
            ("process_max_fds", "Maximum number of open file descriptors", process.max_fds),
            ("process_threads", "Number of OS threads in the process", process.threads),
            (
                "process_start_time_seconds",
                "Start time of the process since the Unix epoch in seconds",
                process.start_time,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        Ok(())
    }
}

/// What `/proc` says of this process.
#[derive(Debug, PartialEq)]
struct ProcessStats {
    cpu_seconds: f64,
    resident_bytes: f64,
    virtual_bytes: f64,
    open_fds: f64,
    max_fds: f64,
    threads: f64,
    start_time: f64,
}

/// The kernel's clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`),
/// fixed at 100 on Linux's user-facing interface whatever the kernel's own rate.
const TICKS_PER_SECOND: f64 = 100.0;

impl ProcessStats {
    fn read() -> Option<Self> {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        Self::parse(
            &read("/proc/self/stat")?,
            &read("/proc/self/status")?,
            &read("/proc/self/limits")?,
            &read("/proc/stat")?,
            open_fds,
        )
    }

    fn parse(stat: &str, status: &str, limits: &str, system: &str, open_fds: f64) -> Option<Self> {
        // The fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        let field = |number: usize| fields.get(number - 3)?.parse::<f64>().ok();
        let kilobytes = |key: &str| {
            let line = status.lines().find_map(|line| line.strip_prefix(key))?;
            line.trim().trim_end_matches("kB").trim().parse::<f64>().ok().map(|value| value * 1024.0)
        };
        let boot_time = system.lines().find_map(|line| line.strip_prefix("btime "))?.trim().parse::<f64>().ok()?;
        let max_fds = limits
            .lines()
            .find_map(|line| line.strip_prefix("Max open files"))
            .and_then(|line| line.split_whitespace().next()?.parse::<f64>().ok())?;
        Some(Self {
            cpu_seconds: (field(14)? + field(15)?) / TICKS_PER_SECOND,
            threads: field(20)?,
            start_time: boot_time + field(22)? / TICKS_PER_SECOND,
            virtual_bytes: field(23)?,
            resident_bytes: kilobytes("VmRSS:")?,
            open_fds,
            max_fds,
        })
    }
}

/// The standard name of a status code, as `grpc_code` labels it.
fn standard_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// The `grpc_type` of each of muster's methods, by path.
static METHOD_TYPES: std::sync::LazyLock<HashMap<&'static str, &'static str>> = std::sync::LazyLock::new(|| {
    muster_proto::limits::METHODS.iter().map(|method| (method.path, method.kind)).collect()
});

/// Which end of a call the standard metrics count: the names of its series.
#[derive(Clone, Copy)]
struct Side {
    started: (&'static str, &'static str),
    handled: (&'static str, &'static str),
    handling: (&'static str, &'static str),
}

const SERVER: Side = Side {
    started: ("grpc_server_started_total", "gRPC calls started on the server"),
    handled: ("grpc_server_handled_total", "gRPC calls completed on the server, by the code they ended with"),
    handling: ("grpc_server_handling_seconds", "Time from the start of gRPC calls to their end, on the server"),
};

const CLIENT: Side = Side {
    started: ("grpc_client_started_total", "gRPC calls this process started as a client"),
    handled: ("grpc_client_handled_total", "gRPC calls this process made, by the code they ended with"),
    handling: ("grpc_client_handling_seconds", "Time from the start of gRPC calls this process made to their end"),
};

/// One call as the standard metrics see it, recorded once when it ends.
struct Call {
    side: Side,
    /// `grpc_type`, `grpc_service`, `grpc_method`.
    labels: [(&'static str, String); 3],
    started: Instant,
    recorded: bool,
}

impl Call {
    fn start(side: Side, path: &str) -> Self {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or(("", path));
        let kind = METHOD_TYPES.get(path).copied().unwrap_or("unary");
        let labels =
            [("grpc_type", kind.to_owned()), ("grpc_service", service.to_owned()), ("grpc_method", method.to_owned())];
        let pairs: Vec<(&str, &str)> = labels.iter().map(|(name, value)| (*name, value.as_str())).collect();
        count(side.started.0, side.started.1, &pairs, 1);
        Self { side, labels, started: Instant::now(), recorded: false }
    }

    /// Records the call's end, once.
    fn end(&mut self, code: tonic::Code) {
        if std::mem::replace(&mut self.recorded, true) {
            return;
        }
        let mut pairs: Vec<(&str, &str)> = self.labels.iter().map(|(name, value)| (*name, value.as_str())).collect();
        observe(self.side.handling.0, self.side.handling.1, &pairs, self.started.elapsed().as_secs_f64());
        pairs.push(("grpc_code", standard_code_name(code)));
        count(self.side.handled.0, self.side.handled.1, &pairs, 1);
    }
}

impl muster_client::observe::Ended for Call {
    fn ended(mut self: Box<Self>, code: tonic::Code) {
        self.end(code);
    }
}

impl Drop for Call {
    /// A call dropped before its answer came: it was cancelled.
    fn drop(&mut self) {
        self.end(tonic::Code::Cancelled);
    }
}

/// Records the calls this process's clients make (the services' calls of
/// one another) as the standard gRPC client metrics.
struct ClientCalls;

impl muster_client::observe::Observer for ClientCalls {
    fn started(&self, path: &str) -> Box<dyn muster_client::observe::Ended> {
        Box::new(Call::start(CLIENT, path))
    }
}

/// Counts the calls this process makes as a client, from now on:
/// `grpc_client_started_total`, `grpc_client_handled_total` and
/// `grpc_client_handling_seconds`, labelled as the server's.
pub fn record_client_calls() {
    muster_client::observe::install(ClientCalls);
}

/// The tower layer that times every gRPC call by method and status code.
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RpcMetrics { inner }
    }
}

/// See [`RpcMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RpcMetrics<S> {
    inner: S,
}

impl<S, RequestBody> tower::Service<http::Request<RequestBody>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<RequestBody>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, request: http::Request<RequestBody>) -> Self::Future {
        let method = request.uri().path().to_owned();
        // Health, reflection and scrapes are not the service's calls.
        let recorded = !(method.starts_with("/grpc.") || method == "/metrics");
        let call = recorded.then(|| Call::start(SERVER, &method));
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            let Some(call) = call else { return Ok(response) };
            // Errors answered at once carry their code in the headers (a
            // trailers-only answer: the call has ended); the others end with
            // it in the body's trailers.
            let refused = status_of(response.headers());
            let labels = [("method", method.as_str()), ("code", refused.map_or("OK", crate::status::code_name))];
            count("muster_rpc_requests_total", "gRPC calls answered, by method and status code", &labels, 1);
            observe(
                "muster_rpc_duration_seconds",
                "Time to the response headers of gRPC calls, by method and status code",
                &labels,
                call.started.elapsed().as_secs_f64(),
            );
            Ok(muster_client::observe::reported(response, Box::new(call)))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, atomic::AtomicU64, atomic::Ordering};

    use super::*;

    #[test]
    fn collectors_set_gauges_at_each_render_until_what_they_measure_is_gone() {
        let depth = Arc::new(AtomicU64::new(3));
        let measured = Arc::downgrade(&depth);
        collect_on_render(move || {
            let Some(depth) = measured.upgrade() else { return false };
            set("test_collected_depth", "A gauge read when scraped", &[], depth.load(Ordering::Relaxed) as f64);
            true
        });
        assert!(render().contains("# TYPE test_collected_depth gauge\ntest_collected_depth 3.0\n"), "{}", render());
        depth.store(5, Ordering::Relaxed);
        assert!(render().contains("test_collected_depth 5.0\n"), "read again at the next scrape");
        let registered = collectors().len();
        drop(depth);
        assert!(render().contains("test_collected_depth 5.0\n"), "the last value stays");
        assert_eq!(collectors().len(), registered - 1, "a collector whose state is gone is dropped");
    }

    #[test]
    fn counters_and_histograms_render_as_openmetrics_with_labels() {
        count("test_calls_total", "Calls", &[("code", "OK")], 2);
        count("test_calls_total", "Calls", &[("code", "OK")], 1);
        observe("test_call_seconds", "Call time", &[("method", "/a")], 0.002);
        let text = render();
        assert!(text.contains("# TYPE test_calls counter\ntest_calls_total{code=\"OK\"} 3\n"), "{text}");
        assert!(text.contains("test_call_seconds_bucket{le=\"0.0025\",method=\"/a\"} 1\n"), "{text}");
        assert!(text.contains("test_call_seconds_count{method=\"/a\"} 1\n"), "{text}");
        assert!(
            text.contains(&format!("muster_build_info{{version=\"{}\"}} 1\n", env!("CARGO_PKG_VERSION"))),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// A response body of the frames given.
    struct Frames(std::collections::VecDeque<http_body::Frame<bytes::Bytes>>);

    impl http_body::Body for Frames {
        type Data = bytes::Bytes;
        type Error = tonic::Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }

    #[tokio::test]
    async fn calls_are_counted_under_the_standard_names_with_the_code_they_end_with() {
        use http_body::Body as _;
        use tower::{Layer as _, Service as _, ServiceExt as _};

        let answer = tower::service_fn(|_: http::Request<()>| async {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("grpc-status", http::HeaderValue::from_static("5"));
            let frames =
                [http_body::Frame::data(bytes::Bytes::from_static(b"x")), http_body::Frame::trailers(trailers)];
            Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::new(Frames(frames.into()))))
        });
        let mut service = RpcMetricsLayer.layer(answer);
        let call = |path: &'static str| {
            let mut request = http::Request::new(());
            *request.uri_mut() = path.parse().unwrap();
            request
        };
        // Read to its end: the code of its trailers.
        let response = service.ready().await.unwrap().call(call("/muster.test.v1.TestService/WatchAll")).await.unwrap();
        let mut body = response.into_body();
        while std::future::poll_fn(|context| Pin::new(&mut body).poll_frame(context)).await.is_some() {}
        // Dropped before its end: cancelled.
        let response = service.ready().await.unwrap().call(call("/muster.test.v1.TestService/Dropped")).await.unwrap();
        drop(response);
        let text = render();
        for expected in [
            "grpc_server_started_total{grpc_type=\"unary\",grpc_service=\"muster.test.v1.TestService\",grpc_method=\"WatchAll\"} 1",
            "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"muster.test.v1.TestService\",grpc_method=\"WatchAll\",grpc_code=\"NotFound\"} 1",
            "grpc_server_handled_total{grpc_type=\"unary\",grpc_service=\"muster.test.v1.TestService\",grpc_method=\"Dropped\",grpc_code=\"Canceled\"} 1",
            "grpc_server_handling_seconds_count{grpc_type=\"unary\",grpc_service=\"muster.test.v1.TestService\",grpc_method=\"WatchAll\"} 1",
        ] {
            assert!(text.contains(expected), "{expected} missing from:\n{text}");
        }
    }

    #[test]
    fn a_counter_series_adds_to_the_series_count_adds_to() {
        let labelled = counter("test_series_total", "Series", &[("via", "live")]);
        labelled.add(2);
        count("test_series_total", "Series", &[("via", "live")], 1);
        counter("test_series_total", "Series", &[("via", "list")]).add(5);
        let bare = counter("test_bare_total", "Bare", &[]);
        bare.add(4);
        let text = render();
        assert!(text.contains("test_series_total{via=\"live\"} 3\n"), "{text}");
        assert!(text.contains("test_series_total{via=\"list\"} 5\n"), "{text}");
        assert!(text.contains("test_bare_total 4\n"), "{text}");
    }

    #[test]
    fn process_metrics_come_from_proc() {
        let stat = "4242 (muster (x) y) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615";
        let status = "Name:\tmuster\nVmSize:\t  102400 kB\nVmRSS:\t   10240 kB\nThreads:\t7\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let system = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let parsed = ProcessStats::parse(stat, status, limits, system, 12.0).expect("parsed");
        assert_eq!(
            parsed,
            ProcessStats {
                cpu_seconds: 3.0,
                resident_bytes: 10_485_760.0,
                virtual_bytes: 104_857_600.0,
                open_fds: 12.0,
                max_fds: 1024.0,
                threads: 7.0,
                start_time: 1_700_000_123.45,
            }
        );
        let text = render();
        for name in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing from {text}");
        }
    }
}
