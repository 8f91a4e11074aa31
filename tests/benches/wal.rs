//! The execution service's SQLite write-ahead log under a burst: many
//! executions of a 10-step chain started at once, each watched to its end
//! (the reads that used to starve the checkpoints), a stub worker answering
//! every step at once. Prints the largest the log was seen (sampled every
//! 100 ms), its size when the burst ended, and its size once the service
//! had been idle for a few seconds, beside the database's.
//!
//! `cargo bench -p muster-tests --bench wal [-- EXECUTIONS]` (default 3000).

use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// The worker here allocates as `muster agent` and the services do.
#[global_allocator]
static ALLOCATOR: muster_runtime::Allocator = muster_runtime::Allocator;

use muster::worker::AgentCredential;
use muster_proto::execution::v1::{PublishProcessRequest, StartExecutionRequest};
use muster_tests::{Backend, StubBehaviour, TestCluster, agent, chain_process, events_until_finished, spawn_worker};

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |metadata| metadata.len())
}

fn megabytes(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

#[tokio::main]
async fn main() {
    let executions: usize = std::env::args().skip(1).find_map(|argument| argument.parse().ok()).unwrap_or(3000);
    let test = TestCluster::start(Backend::Sqlite).await.expect("a SQLite cluster");
    let bench_agent =
        muster_proto::roster::v1::Agent { workload_capacity: 100_000, ..agent("bench-agent", "worker", "bench") };
    let tokens = test.register_agents(&[bench_agent]).await;
    let credentials = vec![AgentCredential { agent_id: "bench-agent".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_worker(test.operator("execution"), credentials, StubBehaviour);
    let mut client = test.execution();
    let source = chain_process("burst", 10, "bench-agent", "bench-agent", "{}");
    client.publish_process(PublishProcessRequest { source, file_name: String::new() }).await.unwrap();

    let wal = test.data_dir.join("execution.db-wal");
    let database = test.data_dir.join("execution.db");
    let largest = Arc::new(AtomicU64::new(0));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = tokio::spawn({
        let (wal, largest, sampling) = (wal.clone(), largest.clone(), sampling.clone());
        async move {
            while sampling.load(Ordering::Relaxed) {
                largest.fetch_max(size(&wal), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    });

    let started = Instant::now();
    let mut runs = tokio::task::JoinSet::new();
    for _ in 0..executions {
        let (mut client, execution) = (client.clone(), test.operator("execution"));
        runs.spawn(async move {
            let request = StartExecutionRequest { process_name: "burst".to_owned(), ..Default::default() };
            let id = loop {
                // Shed under the burst: tried again.
                match client.start_execution(request.clone()).await {
                    Ok(response) => break response.into_inner().execution.unwrap().id,
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            };
            events_until_finished(&execution, &id).await;
        });
    }
    while let Some(run) = runs.join_next().await {
        run.unwrap();
    }
    let seconds = started.elapsed().as_secs_f64();
    let at_the_end = size(&wal);
    tokio::time::sleep(Duration::from_secs(5)).await;
    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();
    println!(
        "{executions} executions of 10 steps in {seconds:.1} s: write-ahead log largest {:.1} MB, at the end {:.1} MB, \
         idle 5 s later {:.1} MB; database {:.1} MB",
        megabytes(largest.load(Ordering::Relaxed).max(at_the_end)),
        megabytes(at_the_end),
        megabytes(size(&wal)),
        megabytes(size(&database)),
    );
    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}
