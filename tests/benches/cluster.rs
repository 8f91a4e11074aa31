//! The full cluster under load: four service processes, a stub worker whose
//! agent answers at once with a small output, a linear chain and a fan-out of
//! steps of several sizes, on SQLite and (when it answers) PostgreSQL.
//! Prints steps per second, microseconds per step, and the CPU each process
//! used (in % of one core) while the execution ran.
//!
//! `cargo bench -p muster-tests --bench cluster [-- SIZE ...]` (default 100 1000 10000).

use std::time::Instant;

use muster::worker::{AgentCredential, Behaviour, StepOutcome};
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{Assignment, PublishProcessRequest, StartExecutionRequest, WatchExecutionRequest},
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, chain_process};

/// Answers every assignment at once with a small output.
struct Stub;

impl Behaviour for Stub {
    async fn run(&self, assignment: Assignment) -> StepOutcome {
        StepOutcome::Completed {
            output_json: format!(r#"{{"done":"{}"}}"#, assignment.step_id),
            tokens_used: 1,
            cost: 0.0,
            iterations: 1,
            remember: Vec::new(),
        }
    }
}

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
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = url.trim_start_matches("http://");
    let Ok(mut stream) = tokio::net::TcpStream::connect(address).await else { return 0.0 };
    let request = format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return 0.0;
    }
    let mut text = String::new();
    let _ = stream.read_to_string(&mut text).await;
    text.lines()
        .filter(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
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

async fn run_once(client: &mut ExecutionClient, source: &str) -> f64 {
    let process = client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() })
        .await
        .expect("publish")
        .into_inner()
        .process
        .expect("process");
    let started = Instant::now();
    let execution = client
        .start_execution(StartExecutionRequest { process_name: process.name, ..Default::default() })
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
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let mut sizes: Vec<usize> = std::env::args().skip(1).filter_map(|argument| argument.parse().ok()).collect();
    if sizes.is_empty() {
        sizes = vec![100, 1000, 10_000];
    }
    println!(
        "{:<9} {:<8} {:>6}  {:>7} {:>11} {:>8}  {:>8} {:>9}   CPU % of a core: execution notifier roster worker+client",
        "backend", "shape", "steps", "seconds", "steps/s", "µs/step", "commits", "µs/commit"
    );
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(test) = TestCluster::start(backend).await else { continue };
        // Room for the widest fan-out: every step holds one of its roster slots.
        let bench_agent =
            muster_proto::roster::v1::Agent { workload_capacity: 100_000, ..agent("bench-agent", "worker", "bench") };
        let tokens = test.register_agents(&[bench_agent]).await;
        let credentials = vec![AgentCredential { agent_id: "bench-agent".to_owned(), token: tokens[0].clone() }];
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let worker = tokio::spawn(muster::worker::serve(
            test.operator("execution"),
            "bench-worker".to_owned(),
            credentials,
            std::sync::Arc::new(Stub),
            async move {
                let _ = stopped.await;
            },
        ));
        let mut client = test.execution();
        let processes: Vec<u32> = ["execution", "notifier", "roster"]
            .iter()
            .map(|service| test.cluster().service(service).pid().unwrap_or_default())
            .chain([std::process::id()])
            .collect();
        for &steps in &sizes {
            for (shape, source) in [
                ("chain", chain_process(&format!("chain-{steps}"), steps, "bench-agent", "bench-agent", "{}")),
                ("fan-out", fan_out_process(&format!("fan-out-{steps}"), steps)),
            ] {
                let url = test.cluster().execution_url();
                let commits_before = metric(&url, "muster_execution_commit_seconds_count").await;
                let commit_time_before = metric(&url, "muster_execution_commit_seconds_sum").await;
                let before: Vec<f64> = processes.iter().map(|pid| cpu_seconds(*pid)).collect();
                let seconds = run_once(&mut client, &source).await;
                let transactions = metric(&url, "muster_execution_commit_seconds_count").await - commits_before;
                let commit_time = metric(&url, "muster_execution_commit_seconds_sum").await - commit_time_before;
                let used: Vec<String> = processes
                    .iter()
                    .zip(&before)
                    .map(|(pid, before)| format!("{:>4.0}", (cpu_seconds(*pid) - before) * 100.0 / seconds))
                    .collect();
                println!(
                    "{:<9} {shape:<8} {steps:>6}  {seconds:>7.3} {:>11.0} {:>8.0}  {transactions:>8} {:>9.0}   {}",
                    format!("{backend:?}"),
                    steps as f64 / seconds,
                    seconds * 1e6 / steps as f64,
                    commit_time * 1e6 / transactions.max(1.0),
                    used.join(" ")
                );
            }
        }
        let _ = stop.send(());
        let _ = worker.await;
        test.shutdown().await;
    }
}
