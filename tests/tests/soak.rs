//! A soak: executions run back to back for a while under mixed read and
//! write load, on SQLite and on PostgreSQL (two tests, which `cargo test`
//! runs side by side; `--test-threads=1` gives each the machine alone).
//! Every execution started completes with every step, no call fails (a read
//! the service sheds at its limit of reads in flight is made again, as its
//! RetryInfo asks), and the services' memory stays flat (the second half of
//! the run adds next to nothing to the first's).
//!
//! Bounded: `MUSTER_SOAK_SECONDS` per database (60 by default), loopback
//! only. The figures are printed (`-- --nocapture`) and recorded in
//! docs/benchmarks.md.

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{GetExecutionRequest, ListExecutionsRequest, StartExecutionRequest, StepStatus},
    notifier::v1::ListNotificationsRequest,
};
use muster_tests::{
    Backend, TestCluster, admitted, agent, chain_process, events_until_finished, rss_kib, spawn_sample_worker,
};

/// Executions in flight at once.
const WRITERS: usize = 4;
/// Callers reading all along.
const READERS: usize = 8;
const STEPS: usize = 5;

fn memory(test: &TestCluster) -> BTreeMap<&'static str, u64> {
    muster::cluster::SERVICES
        .iter()
        .map(|service| (*service, test.cluster().service(service).pid().map_or(0, rss_kib)))
        .collect()
}

async fn soak(backend: Backend, length: Duration) {
    let Some(test) = TestCluster::start(backend).await else { return };
    // Room for two steps at once: with four writers, steps queue at the
    // roster and start as slots free.
    let worker = muster_proto::roster::v1::Agent { workload_capacity: 2, ..agent("worker", "member", "core") };
    let agents = [agent("lead", "lead", "core"), worker];
    let tokens = test.register_agents(&agents).await;
    let credentials = vec![AgentCredential { agent_id: "worker".to_owned(), token: tokens[1].clone() }];
    let (stop_worker, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut execution = test.execution();
    muster_tests::publish_and_start(&mut execution, &chain_process("soak", STEPS, "worker", "lead", "{}")).await;

    let running = Arc::new(AtomicBool::new(true));
    let (completed, reads) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started_at = Instant::now();
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (mut client, endpoint) = (test.execution(), test.operator("execution"));
            let (running, completed) = (running.clone(), completed.clone());
            tokio::spawn(async move {
                let mut run = 0;
                while running.load(Ordering::Relaxed) {
                    let started = client
                        .start_execution(StartExecutionRequest {
                            process_name: "soak".to_owned(),
                            idempotency_key: format!("w{writer}-{run}"),
                            ..Default::default()
                        })
                        .await
                        .unwrap_or_else(|status| panic!("start: {status}"))
                        .into_inner()
                        .execution
                        .expect("an execution");
                    let events = events_until_finished(&endpoint, &started.id).await;
                    let last = events.last().expect("events");
                    assert_eq!(last.execution_status, ExecutionStatus::Completed as i32, "{}", last.detail);
                    let request = GetExecutionRequest { id: started.id };
                    let stored = admitted(|| {
                        let (mut client, request) = (client.clone(), request.clone());
                        async move { client.get_execution(request).await }
                    })
                    .await
                    .unwrap_or_else(|status| panic!("get: {status}"))
                    .into_inner()
                    .execution
                    .expect("an execution");
                    assert_eq!(stored.steps.len(), STEPS);
                    assert!(stored.steps.iter().all(|step| step.status == StepStatus::Completed as i32));
                    completed.fetch_add(1, Ordering::Relaxed);
                    run += 1;
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..READERS)
        .map(|reader| {
            let (execution, notifier) = (test.execution(), test.notifier());
            let (running, reads) = (running.clone(), reads.clone());
            tokio::spawn(async move {
                while running.load(Ordering::Relaxed) {
                    if reader % 2 == 0 {
                        let listed = admitted(|| {
                            let mut execution = execution.clone();
                            async move {
                                execution
                                    .list_executions(ListExecutionsRequest { limit: 20, ..Default::default() })
                                    .await
                            }
                        })
                        .await
                        .unwrap_or_else(|status| panic!("list executions: {status}"))
                        .into_inner();
                        if let Some(newest) = listed.executions.first() {
                            let request = GetExecutionRequest { id: newest.id.clone() };
                            admitted(|| {
                                let (mut execution, request) = (execution.clone(), request.clone());
                                async move { execution.get_execution(request).await }
                            })
                            .await
                            .unwrap_or_else(|status| panic!("get: {status}"));
                        }
                    } else {
                        let request =
                            ListNotificationsRequest { agent_id: "lead".to_owned(), limit: 50, ..Default::default() };
                        admitted(|| {
                            let (mut notifier, request) = (notifier.clone(), request.clone());
                            async move { notifier.list_notifications(request).await }
                        })
                        .await
                        .unwrap_or_else(|status| panic!("list notifications: {status}"));
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
        })
        .collect();

    // Memory once warm (a tenth of the way), at half time and at the end.
    tokio::time::sleep(length / 10).await;
    let warm = memory(&test);
    tokio::time::sleep(length * 4 / 10).await;
    let half = memory(&test);
    tokio::time::sleep(length / 2).await;
    running.store(false, Ordering::Relaxed);
    for task in writers.into_iter().chain(readers) {
        task.await.expect("a caller ends without an error");
    }
    let end = memory(&test);
    let elapsed = started_at.elapsed().as_secs_f64();
    let completed = completed.load(Ordering::Relaxed);
    eprintln!(
        "{backend:?}: {completed} executions ({} steps, {:.0} steps/s) and {} reads ({:.0}/s) in {elapsed:.0} s; \
         RSS KiB warm {warm:?}, half {half:?}, end {end:?}",
        completed * STEPS as u64,
        (completed * STEPS as u64) as f64 / elapsed,
        reads.load(Ordering::Relaxed),
        reads.load(Ordering::Relaxed) as f64 / elapsed,
    );
    assert!(completed >= WRITERS as u64, "only {completed} executions completed");
    for service in muster::cluster::SERVICES {
        // The second half may add a little (caches fill), not what a leak adds.
        let (half, end) = (half[service], end[service]);
        assert!(end <= half + half / 4 + 8 * 1024, "{service} grew from {half} KiB to {end} KiB in the second half");
    }

    let _ = stop_worker.send(());
    let _ = worker.await;
    test.shutdown().await;
}

fn length() -> Duration {
    let seconds = std::env::var("MUSTER_SOAK_SECONDS").ok().and_then(|value| value.parse().ok()).unwrap_or(60);
    Duration::from_secs(seconds)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_under_mixed_load_lose_nothing_and_hold_their_memory_on_sqlite() {
    soak(Backend::Sqlite, length()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executions_under_mixed_load_lose_nothing_and_hold_their_memory_on_postgres() {
    soak(Backend::Postgres, length()).await;
}
