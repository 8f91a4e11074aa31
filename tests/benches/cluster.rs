//! The full cluster under load: four service processes, a stub worker whose
//! agent answers at once with a small output, a linear chain and a fan-out of
//! steps, on SQLite and (when it answers) PostgreSQL. Prints steps per second
//! and microseconds per step.
//!
//! `cargo bench -p muster-tests --bench cluster [-- STEPS]` (default 1000 steps).

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
        if event.r#type == EventType::ExecutionFinished as i32 {
            assert_eq!(event.execution_status, ExecutionStatus::Completed as i32, "{}", event.detail);
            break;
        }
    }
    started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let steps: usize = std::env::args().skip(1).find_map(|argument| argument.parse().ok()).unwrap_or(1000);
    for backend in [Backend::Sqlite, Backend::Postgres] {
        let Some(test) = TestCluster::start(backend).await else { continue };
        let tokens = test.register_agents(&[agent("bench-agent", "worker", "bench")]).await;
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
        for (shape, source) in [
            ("linear chain", chain_process("bench-chain", steps, "bench-agent", "bench-agent", "{}")),
            ("fan-out", fan_out_process("bench-fan-out", steps)),
        ] {
            let seconds = run_once(&mut client, &source).await;
            println!(
                "{backend:?} {shape:<12} {steps} steps: {seconds:.3} s, {:.0} steps/s, {:.0} µs/step",
                steps as f64 / seconds,
                seconds * 1e6 / steps as f64
            );
        }
        let _ = stop.send(());
        let _ = worker.await;
        test.shutdown().await;
    }
}
