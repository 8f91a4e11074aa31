//! The full cluster under load: four service processes, a stub worker whose
//! agent answers at once with a small output, a linear chain and a fan-out of
//! steps of several sizes, on SQLite and (when it answers) PostgreSQL.
//! Prints steps per second, microseconds per step, and the CPU each process
//! used (in % of one core) while the execution ran, the PostgreSQL server's
//! processes too on that backend.
//!
//! Then the shapes users run, on SQLite ([`users`]): the sample behaviour
//! of `muster agent` as the worker, a chain whose steps go to ten agents in
//! turn with the lead informed, and many executions at once (100 and 1,000
//! of ten steps over 100 agents), with the starts refused, the services'
//! health throughout, and how long a step made ready waits for a worker.
//!
//! Then, on PostgreSQL, a 10,000-step fan-out (three executions of a third
//! each) driven by one execution replica and by three, a worker on each.
//!
//! `cargo bench -p muster-tests --bench cluster [-- SIZE ...] [-- users [SHAPE ...]]`
//! (default 100 1000 10000; `users` runs the users' shapes alone, beside the
//! bench's chain and fan-out of 1,000 steps, or of the first SIZE, for
//! comparison; SHAPEs such as `chain/10` or `many/1000` run only those,
//! the users' chains as long as the bench's).

use std::time::Instant;

#[path = "cluster/users.rs"]
mod users;

/// The worker here allocates as `muster agent` and the services do.
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest},
};
use muster_tests::{Backend, ExecutionClient, StubBehaviour, TestCluster, agent, chain_process, spawn_worker};

fn fan_out_process(name: &str, width: usize) -> String {
    let mut yaml = format!("name: {name}\nmax_parallel: {width}\nsteps:\n");
    for index in 0..width {
        yaml.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: bench-agent\n    message: step {index}\n"
        ));
    }
    yaml
}

/// A metric's value (the sum of its series) as the execution service serves it.
async fn metric(url: &str, name: &str) -> f64 {
    metric_where(url, name, "").await
}

/// The sum of a metric's series whose line holds `label` (e.g. `status="completed"`).
async fn metric_where(url: &str, name: &str, label: &str) -> f64 {
    series(&scrape(url).await, name).filter(|(line, _)| line.contains(label)).map(|(_, value)| value).sum()
}

/// The metrics a service serves (empty when it cannot be read).
async fn scrape(url: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = url.trim_start_matches("http://");
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else { return String::new() };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return String::new();
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text).await;
    text
}

/// The series of metric `name` in `text`: each line with its value.
fn series<'a>(text: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> {
    text.lines()
        .filter(move |line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| Some((line, line.rsplit(' ').next()?.parse::<f64>().ok()?)))
}

/// CPU time the PostgreSQL server's processes have used, in seconds (those
/// alive at both readings count; its connections here live through a run).
fn postgres_cpu_seconds() -> f64 {
    let Ok(entries) = std::fs::read_dir("/proc") else { return 0.0 };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|name| name.trim() == "postgres"))
        .map(cpu_seconds)
        .sum()
}

/// CPU time a process has used, in seconds (user and system), from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // The fields after the command name, which ends with the last ')'.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |index: usize| fields.get(index).and_then(|field| field.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// Publishes `source`; its process name.
async fn publish(client: &mut ExecutionClient, source: &str) -> String {
    let process = client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() })
        .await
        .expect("publish")
        .into_inner()
        .process
        .expect("process");
    process.name
}

/// Starts a run of `process_name` and waits until it completes.
async fn run_to_the_end(mut client: ExecutionClient, process_name: String) {
    let execution = client
        .start_execution(StartExecutionRequest { process_name, ..Default::default() })
        .await
        .expect("start")
        .into_inner()
        .execution
        .expect("execution");
    let mut stream = client
        .watch_execution(WatchExecutionRequest { execution_id: execution.id, after_sequence: 0 })
        .await
        .expect("watch")
        .into_inner();
    while let Some(message) = stream.message().await.expect("events") {
        let event = message.event.expect("event");
        if event.event_type == EventType::ExecutionFinished as i32 {
            assert_eq!(event.execution_status, ExecutionStatus::Completed as i32, "{}", event.detail);
            break;
        }
    }
}

async fn run_once(client: &mut ExecutionClient, source: &str) -> f64 {
    let process_name = publish(client, source).await;
    let started = Instant::now();
    run_to_the_end(client.clone(), process_name).await;
    started.elapsed().as_secs_f64()
}

/// Room for the widest fan-out: every step holds one of its roster slots.
fn bench_agent() -> muster_proto::roster::v1::Agent {
    muster_proto::roster::v1::Agent { workload_capacity: 100_000, ..agent("bench-agent", "worker", "bench") }
}

/// A fan-out of `total` steps as three executions of a third each, driven
/// by one execution replica, then by three (one execution each), with a
/// worker on every replica; on PostgreSQL.
async fn replicas(total: usize) {
    let Some(mut test) = TestCluster::start(Backend::Postgres).await else { return };
    let tokens = test.register_agents(&[bench_agent()]).await;
    let credentials = vec![AgentCredential { agent_id: "bench-agent".to_owned(), token: tokens[0].clone() }];
    println!();
    println!(
        "{:<9} {:>6}  {:>7} {:>11} {:>8}   CPU % of a core: execution replicas, notifier, roster, worker+client, PostgreSQL",
        "replicas", "steps", "seconds", "steps/s", "µs/step"
    );
    for count in [1, 3] {
        while test.cluster().replicas("execution").count() < count {
            test.cluster_mut().add_replica("execution").await.expect("a replica");
        }
        let operator = test.cluster().credentials.operator_token.clone();
        let endpoints: Vec<muster::worker::Endpoint> = test
            .cluster()
            .replica_urls("execution")
            .split(',')
            .map(|url| muster::worker::Endpoint::new(url, &operator))
            .collect();
        let workers: Vec<_> = endpoints
            .iter()
            .map(|endpoint| spawn_worker(endpoint.clone(), credentials.clone(), StubBehaviour))
            .collect();
        let clients: Vec<ExecutionClient> = endpoints
            .iter()
            .map(|endpoint| {
                muster_proto::execution::v1::execution_service_client::ExecutionServiceClient::new(
                    endpoint.channel().expect("a channel"),
                )
            })
            .collect();
        let mut first = clients[0].clone();
        let process_name = publish(&mut first, &fan_out_process(&format!("replicas-{count}"), total / 3)).await;
        // The workers' hellos and the replicas' offers to each other settle.
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
        let processes: Vec<u32> = test
            .cluster()
            .replicas("execution")
            .chain(["notifier", "roster"].iter().map(|service| test.cluster().service(service)))
            .map(|service| service.pid().unwrap_or_default())
            .chain([std::process::id()])
            .collect();
        let before: Vec<f64> = processes.iter().map(|pid| cpu_seconds(*pid)).collect();
        let postgres_before = postgres_cpu_seconds();
        let started = Instant::now();
        let runs: Vec<_> = (0..3)
            .map(|index| tokio::spawn(run_to_the_end(clients[index % clients.len()].clone(), process_name.clone())))
            .collect();
        for run in runs {
            run.await.expect("a run");
        }
        let seconds = started.elapsed().as_secs_f64();
        let steps = total / 3 * 3;
        println!(
            "{count:<9} {steps:>6}  {seconds:>7.3} {:>11.0} {:>8.0}   {} {:>4.0}",
            steps as f64 / seconds,
            seconds * 1e6 / steps as f64,
            cpu_used(&processes, &before, seconds),
            (postgres_cpu_seconds() - postgres_before) * 100.0 / seconds
        );
        for (stop, worker) in workers {
            let _ = stop.send(());
            let _ = worker.await;
        }
    }
    test.shutdown().await;
}

#[tokio::main]
async fn main() {
    let arguments: Vec<String> = std::env::args().skip(1).collect();
    let users_only = arguments.iter().any(|argument| argument == "users");
    let mut sizes: Vec<usize> = arguments.iter().filter_map(|argument| argument.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = if users_only { vec![1000] } else { vec![100, 1000, 10_000] };
    }
    println!(
        "{:<9} {:<8} {:>6}  {:>7} {:>11} {:>8}  {:>8} {:>9}   CPU % of a core: execution notifier roster worker+client [PostgreSQL]",
        "backend", "shape", "steps", "seconds", "steps/s", "µs/step", "commits", "µs/commit"
    );
    let backends: &[Backend] = if users_only { &[Backend::Sqlite] } else { &[Backend::Sqlite, Backend::Postgres] };
    for &backend in backends {
        bench_shapes(backend, &sizes).await;
    }
    let shapes: Vec<String> = arguments.iter().filter(|argument| argument.contains('/')).cloned().collect();
    users::run(&shapes, if users_only { sizes[0] } else { 1000 }).await;
    if !users_only {
        replicas(10_000).await;
    }
}

/// The bench's own shapes: one agent takes every step, a stub worker.
async fn bench_shapes(backend: Backend, sizes: &[usize]) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[bench_agent()]).await;
    let credentials = vec![AgentCredential { agent_id: "bench-agent".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_worker(test.operator("execution"), credentials, StubBehaviour);
    let mut client = test.execution();
    let processes = service_pids(&test);
    for &steps in sizes {
        for (shape, source) in [
            ("chain", chain_process(&format!("chain-{steps}"), steps, "bench-agent", "bench-agent", "{}")),
            ("fan-out", fan_out_process(&format!("fan-out-{steps}"), steps)),
        ] {
            let url = test.cluster().execution_url();
            let commits_before = metric(&url, "muster_execution_commit_seconds_count").await;
            let commit_time_before = metric(&url, "muster_execution_commit_seconds_sum").await;
            let before: Vec<f64> = processes.iter().map(|pid| cpu_seconds(*pid)).collect();
            let postgres_before = postgres_cpu_seconds();
            let seconds = run_once(&mut client, &source).await;
            let postgres = match backend {
                Backend::Postgres => {
                    format!(" {:>4.0}", (postgres_cpu_seconds() - postgres_before) * 100.0 / seconds)
                }
                Backend::Sqlite => String::new(),
            };
            let transactions = metric(&url, "muster_execution_commit_seconds_count").await - commits_before;
            let commit_time = metric(&url, "muster_execution_commit_seconds_sum").await - commit_time_before;
            println!(
                "{:<9} {shape:<8} {steps:>6}  {seconds:>7.3} {:>11.0} {:>8.0}  {transactions:>8} {:>9.0}   {}{postgres}",
                format!("{backend:?}"),
                steps as f64 / seconds,
                seconds * 1e6 / steps as f64,
                commit_time * 1e6 / transactions.max(1.0),
                cpu_used(&processes, &before, seconds)
            );
        }
    }
    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}

/// The pids of the execution service, the notifier, the roster and this process.
fn service_pids(test: &TestCluster) -> Vec<u32> {
    ["execution", "notifier", "roster"]
        .iter()
        .map(|service| test.cluster().service(service).pid().unwrap_or_default())
        .chain([std::process::id()])
        .collect()
}

/// The CPU each of `processes` used since `before`, in % of one core over `seconds`.
fn cpu_used(processes: &[u32], before: &[f64], seconds: f64) -> String {
    let used: Vec<String> = processes
        .iter()
        .zip(before)
        .map(|(pid, before)| format!("{:>4.0}", (cpu_seconds(*pid) - before) * 100.0 / seconds))
        .collect();
    used.join(" ")
}
