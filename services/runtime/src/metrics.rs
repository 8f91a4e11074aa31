//! Prometheus metrics: a process-wide registry of counters, gauges and
//! histograms with labels, collectors that set gauges when scraped, the RPC
//! layer that records every call's latency by method and status code, and the
//! text exposition served at `/metrics` on each service's gRPC port
//! (HTTP/1.1, so Prometheus scrapes it as is).

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    future::Future,
    pin::Pin,
    sync::{Mutex, OnceLock},
    task::{Context, Poll},
    time::Instant,
};

type Labels = Vec<(String, String)>;

/// Upper bounds of the latency histogram buckets, in seconds.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

#[derive(Default)]
struct Registry {
    help: BTreeMap<&'static str, (&'static str, &'static str)>,
    values: BTreeMap<(&'static str, Labels), f64>,
    histograms: BTreeMap<(&'static str, Labels), Histogram>,
}

fn registry() -> std::sync::MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    REGISTRY.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs.iter().map(|(key, value)| ((*key).to_owned(), (*value).to_owned())).collect()
}

/// Adds `amount` to a counter.
pub fn count(name: &'static str, help: &'static str, pairs: &[(&str, &str)], amount: u64) {
    let mut registry = registry();
    registry.help.entry(name).or_insert((help, "counter"));
    *registry.values.entry((name, labels(pairs))).or_default() += amount as f64;
}

/// Sets a gauge.
pub fn set(name: &'static str, help: &'static str, pairs: &[(&str, &str)], value: f64) {
    let mut registry = registry();
    registry.help.entry(name).or_insert((help, "gauge"));
    registry.values.insert((name, labels(pairs)), value);
}

type Collector = Box<dyn Fn() -> bool + Send + Sync>;

fn collectors() -> std::sync::MutexGuard<'static, Vec<Collector>> {
    static COLLECTORS: OnceLock<Mutex<Vec<Collector>>> = OnceLock::new();
    COLLECTORS.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner)
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

/// Records one observation, in seconds, in a histogram.
pub fn observe(name: &'static str, help: &'static str, pairs: &[(&str, &str)], seconds: f64) {
    let mut registry = registry();
    registry.help.entry(name).or_insert((help, "histogram"));
    let histogram = registry.histograms.entry((name, labels(pairs))).or_default();
    for (bucket, bound) in histogram.counts.iter_mut().zip(BUCKETS) {
        if seconds <= bound {
            *bucket += 1;
        }
    }
    histogram.sum += seconds;
    histogram.count += 1;
}

fn render_labels(labels: &Labels, extra: Option<(&str, String)>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(key, value)| {
            format!("{key}=\"{}\"", value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n"))
        })
        .collect();
    if let Some((key, value)) = extra {
        pairs.push(format!("{key}=\"{value}\""));
    }
    if pairs.is_empty() { String::new() } else { format!("{{{}}}", pairs.join(",")) }
}

/// Every metric in the Prometheus text format (version 0.0.4).
pub fn render() -> String {
    collectors().retain(|collector| collector());
    let registry = registry();
    let mut text = String::new();
    for (name, (help, kind)) in &registry.help {
        let _ = writeln!(text, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for ((_, labels), value) in registry.values.range((*name, Vec::new())..).take_while(|((key, _), _)| key == name)
        {
            let _ = writeln!(text, "{name}{} {value}", render_labels(labels, None));
        }
        for ((_, labels), histogram) in
            registry.histograms.range((*name, Vec::new())..).take_while(|((key, _), _)| key == name)
        {
            for (count, bound) in histogram.counts.iter().zip(BUCKETS) {
                let _ =
                    writeln!(text, "{name}_bucket{} {count}", render_labels(labels, Some(("le", bound.to_string()))));
            }
            let _ = writeln!(
                text,
                "{name}_bucket{} {}",
                render_labels(labels, Some(("le", "+Inf".to_owned()))),
                histogram.count
            );
            let _ = writeln!(text, "{name}_sum{} {}", render_labels(labels, None), histogram.sum);
            let _ = writeln!(text, "{name}_count{} {}", render_labels(labels, None), histogram.count);
        }
    }
    text
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

impl<S, RequestBody, ResponseBody> tower::Service<http::Request<RequestBody>> for RpcMetrics<S>
where
    S: tower::Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
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
        let started = Instant::now();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if method.starts_with("/grpc.") || method == "/metrics" {
                return Ok(response); // health, reflection and scrapes are not the service's calls
            }
            // Errors answered at once carry their code in the headers; the
            // others end with it in the trailers, which most often say OK.
            let code = response
                .headers()
                .get("grpc-status")
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.parse::<i32>().ok())
                .map_or("Ok".to_owned(), |code| format!("{:?}", tonic::Code::from(code)));
            let labels = [("method", method.as_str()), ("code", code.as_str())];
            count("muster_rpc_requests_total", "gRPC calls answered, by method and status code", &labels, 1);
            observe(
                "muster_rpc_duration_seconds",
                "Time to the response headers of gRPC calls, by method and status code",
                &labels,
                started.elapsed().as_secs_f64(),
            );
            Ok(response)
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
        assert!(render().contains("# TYPE test_collected_depth gauge\ntest_collected_depth 3\n"));
        depth.store(5, Ordering::Relaxed);
        assert!(render().contains("test_collected_depth 5\n"), "read again at the next scrape");
        let registered = collectors().len();
        drop(depth);
        assert!(render().contains("test_collected_depth 5\n"), "the last value stays");
        assert_eq!(collectors().len(), registered - 1, "a collector whose state is gone is dropped");
    }
}
