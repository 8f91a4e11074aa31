//! What a gRPC call costs the metrics: the counter and the latency histogram
//! the RPC layer records for every call (method and status code labels), and
//! a scrape of the whole registry.
//!
//!     cargo bench -p muster-runtime --bench metrics [-- CALLS]
//!
//! Prints nanoseconds per recorded call, one thread and two threads at once,
//! and the time of one scrape.

use std::time::Instant;

use muster_runtime::metrics::{count, observe, render};

/// Records the metrics of one call, as the RPC layer does.
fn record(method: &str, code: &str, seconds: f64) {
    let labels = [("method", method), ("code", code)];
    count("muster_rpc_requests_total", "gRPC calls answered, by method and status code", &labels, 1);
    observe("muster_rpc_duration_seconds", "Time to the response headers of gRPC calls", &labels, seconds);
}

const METHODS: [&str; 8] = [
    "/muster.roster.v1.RosterService/Delegate",
    "/muster.roster.v1.RosterService/GetAgent",
    "/muster.roster.v1.RosterService/ListAgents",
    "/muster.execution.v1.ExecutionService/StartExecution",
    "/muster.execution.v1.ExecutionService/GetExecution",
    "/muster.notifier.v1.NotifierService/ListNotifications",
    "/muster.validator.v1.ValidatorService/ValidateProcess",
    "/muster.roster.v1.RosterService/ReleaseTask",
];

fn calls(count: usize) {
    for index in 0..count {
        let code = if index % 10 == 0 { "NOT_FOUND" } else { "OK" };
        record(METHODS[index % METHODS.len()], code, (index % 100) as f64 * 0.0001);
    }
}

fn main() {
    let total: usize = std::env::args()
        .skip(1)
        .find(|arg| !arg.starts_with('-'))
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(1_000_000);
    calls(10_000); // every series made once
    let started = Instant::now();
    calls(total);
    let one = started.elapsed();
    println!(
        "record one call, 1 thread: {:.0} ns ({total} calls in {:.2} s)",
        one.as_nanos() as f64 / total as f64,
        one.as_secs_f64()
    );

    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| calls(total / 2));
        }
    });
    let two = started.elapsed();
    println!(
        "record one call, 2 threads at once: {:.0} ns per call, {:.0} calls/s in all",
        two.as_nanos() as f64 / total as f64,
        total as f64 / two.as_secs_f64()
    );

    let started = Instant::now();
    let scraped = render();
    println!("scrape: {:.0} µs, {} bytes", started.elapsed().as_secs_f64() * 1e6, scraped.len());
}
