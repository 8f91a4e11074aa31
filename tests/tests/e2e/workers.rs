//! A thousand workers connected at once, each its own connection, all
//! served: a fan-out of a thousand steps puts one step on each (the service
//! gives a step to the least busy worker), `ListWorkers` shows them all with
//! their load, page by page, and every step completes on its first attempt;
//! workers that stop leave at once.

use std::{
    collections::HashSet,
    sync::Arc,
    time::{Duration, Instant},
};

use muster::worker::{AgentCredential, Behaviour, StepOutcome};
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{Assignment, GetExecutionRequest, ListWorkersRequest, StepStatus, WorkerInfo},
    roster::v1::Agent,
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, events_until_finished, publish_and_start};
use tokio::sync::watch;

const WORKERS: usize = 1000;

/// Holds every assignment until the test opens the gate, then completes it
/// saying which worker ran it.
struct Gated {
    name: String,
    gate: watch::Receiver<bool>,
}

impl Behaviour for Gated {
    async fn run(&self, _assignment: Assignment, _step: muster::worker::Step) -> StepOutcome {
        let mut gate = self.gate.clone();
        let _ = gate.wait_for(|open| *open).await;
        StepOutcome::Completed {
            output_json: serde_json::json!({ "worker": self.name }).to_string(),
            tokens_used: 0,
            cost: 0.0,
            iterations: 1,
            remember: Vec::new(),
            skip_triggers: false,
        }
    }
}

async fn all_workers(client: &mut ExecutionClient) -> Vec<WorkerInfo> {
    let mut workers = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client.list_workers(ListWorkersRequest { page_size: 300, page_token }).await.unwrap().into_inner();
        assert!(page.workers.len() <= 300);
        workers.extend(page.workers);
        if page.next_page_token.is_empty() {
            return workers;
        }
        page_token = page.next_page_token;
    }
}

/// Polls until `done` holds for the workers, or panics after a minute.
async fn until(client: &mut ExecutionClient, what: &str, done: impl Fn(&[WorkerInfo]) -> bool) -> Vec<WorkerInfo> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let workers = all_workers(client).await;
        if done(&workers) {
            return workers;
        }
        assert!(Instant::now() < deadline, "{what}: {} workers, {} in flight", workers.len(), in_flight(&workers));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn in_flight(workers: &[WorkerInfo]) -> u32 {
    workers.iter().map(|worker| worker.in_flight).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_workers_are_served_at_once() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let crowd = Agent { workload_capacity: 2 * WORKERS as u32, ..agent("crowd", "worker", "team") };
    let token = test.register_agents(&[crowd]).await.remove(0);
    let (open, gate) = watch::channel(false);
    let (stop, stopped) = watch::channel(false);
    let workers: Vec<_> = (0..WORKERS)
        .map(|index| {
            let name = format!("worker-{index}");
            let behaviour = Arc::new(Gated { name: name.clone(), gate: gate.clone() });
            let credentials = vec![AgentCredential { agent_id: "crowd".to_owned(), token: token.clone() }];
            let mut stopped = stopped.clone();
            tokio::spawn(muster::worker::serve(test.operator("execution"), name, credentials, behaviour, async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            }))
        })
        .collect();
    let mut client = test.execution();
    let connected = until(&mut client, "connecting", |workers| workers.len() == WORKERS).await;
    assert!(connected.iter().all(|worker| worker.agents == ["crowd"] && worker.in_flight == 0));

    let mut source = format!("name: crowd\nmax_parallel: {WORKERS}\nsteps:\n");
    for index in 0..WORKERS {
        source.push_str(&format!("  - {{id: s{index}, type: agent_task, agent: crowd, message: m}}\n"));
    }
    let execution_id = publish_and_start(&mut client, &source).await;

    // Every step is out, one on each worker.
    let loaded = until(&mut client, "taking the steps", |workers| in_flight(workers) == WORKERS as u32).await;
    assert_eq!(loaded.len(), WORKERS);
    assert!(loaded.iter().all(|worker| worker.in_flight == 1), "one step per worker");
    open.send(true).unwrap();

    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let stored =
        client.get_execution(GetExecutionRequest { id: execution_id }).await.unwrap().into_inner().execution.unwrap();
    assert_eq!(stored.steps.len(), WORKERS);
    let mut ran_on = HashSet::new();
    for step in &stored.steps {
        assert_eq!((step.status, step.attempt), (StepStatus::Completed as i32, 1), "{}", step.step_id);
        let output: serde_json::Value = muster_tests::json_of(&step.output);
        ran_on.insert(output["worker"].as_str().unwrap().to_owned());
    }
    assert_eq!(ran_on.len(), WORKERS, "each step ran on a worker of its own");
    until(&mut client, "finishing", |workers| workers.len() == WORKERS && in_flight(workers) == 0).await;

    stop.send(true).unwrap();
    for worker in workers {
        worker.await.unwrap().unwrap();
    }
    // A worker that stops closes its stream: none lingers, heartbeating.
    until(&mut client, "stopping", |workers| workers.is_empty()).await;
    test.shutdown().await;
}
