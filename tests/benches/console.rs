//! The console's first paint with a lot to show: 1,000 executions in the
//! list (its first page), and one execution of a 1,000-step chain drawn as
//! its graph. A release cluster with its console, a stub worker, and
//! `console/tests/browser/paint.mjs` timing Chromium's first contentful
//! paint and the moment the page is complete (the list's rows, the graph's
//! nodes), each page loaded five times.
//!
//! `cargo bench -p muster-tests --bench console` (needs Chromium and
//! `npm ci` in `console/tests/browser`, as `.ci/run` installs them).

use std::time::Instant;

use muster::worker::AgentCredential;
use muster_proto::execution::v1::{PublishProcessRequest, StartExecutionRequest};
use muster_tests::{Backend, StubBehaviour, TestCluster, agent, chain_process, events_until_finished, spawn_worker};

/// Executions in the list.
const EXECUTIONS: usize = 1000;
/// Steps of the chain drawn as a graph.
const STEPS: usize = 1000;

#[tokio::main]
async fn main() {
    let Some(test) = TestCluster::start_with_console(Backend::Sqlite).await else { return };
    let bench_agent =
        muster_proto::roster::v1::Agent { workload_capacity: 100_000, ..agent("bench-agent", "worker", "bench") };
    let tokens = test.register_agents(&[bench_agent]).await;
    let credentials = vec![AgentCredential { agent_id: "bench-agent".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_worker(test.operator("execution"), credentials, StubBehaviour);
    let mut client = test.execution();

    let started = Instant::now();
    let one_step = chain_process("one-step", 1, "bench-agent", "bench-agent", "{}");
    client.publish_process(PublishProcessRequest { source: one_step, file_name: String::new() }).await.unwrap();
    for _ in 0..EXECUTIONS {
        let request = StartExecutionRequest { process_name: "one-step".to_owned(), ..Default::default() };
        client.start_execution(request).await.expect("starting an execution");
    }
    let chain = chain_process("chain", STEPS, "bench-agent", "bench-agent", "{}");
    let process = client.publish_process(PublishProcessRequest { source: chain, file_name: String::new() }).await;
    let name = process.unwrap().into_inner().process.unwrap().name;
    let request = StartExecutionRequest { process_name: name, ..Default::default() };
    let execution = client.start_execution(request).await.unwrap().into_inner().execution.unwrap();
    events_until_finished(&test.operator("execution"), &execution.id).await;
    println!("{} executions and a {STEPS}-step chain in {:.1} s", EXECUTIONS + 1, started.elapsed().as_secs_f64());

    let tests = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../console/tests/browser");
    let status = tokio::process::Command::new("node")
        .arg(tests.join("paint.mjs"))
        .current_dir(&tests)
        .env("MUSTER_CONSOLE_URL", test.cluster().console_url().expect("the console runs"))
        .env("OPERATOR_TOKEN", &test.cluster().credentials.operator_token)
        .env("EXECUTION_ID", &execution.id)
        .env("STEPS", STEPS.to_string())
        .status()
        .await
        .expect("running node");
    let _ = stop.send(());
    let _ = worker.await;
    assert!(status.success(), "paint.mjs failed");
}
