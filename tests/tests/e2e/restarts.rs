//! A restart costs a run nothing: the only execution replica, killed
//! (kill -9) and started again with its stable identity (`muster up` gives
//! it `execution-0`), takes its runs back at once. Its old lease is made to
//! outlast the test (two minutes), so only the identity can bring them back
//! in time: an approval submitted as soon as the replica reports SERVING is
//! accepted, not refused as UNAVAILABLE, and both runs complete.

use std::time::Duration;

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{GetExecutionRequest, StepStatus, SubmitApprovalRequest},
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent, as_agent, chain_process, publish_and_start, spawn_sample_worker,
};

const APPROVAL: &str = "\
name: approved-after-restart
steps:
  - id: gate
    type: human_approval
    approvers: [boss]
  - id: after
    type: agent_task
    agent: doer
    message: go on
    depends_on: [gate]
";

const STEPS: usize = 30;

/// The run's execution, once `accept` likes it (polled for at most `limit`).
async fn until(
    client: &mut ExecutionClient,
    id: &str,
    limit: Duration,
    accept: impl Fn(&muster_proto::execution::v1::Execution) -> bool,
) -> muster_proto::execution::v1::Execution {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let execution = client
            .get_execution(GetExecutionRequest { id: id.to_owned() })
            .await
            .unwrap()
            .into_inner()
            .execution
            .unwrap();
        if accept(&execution) {
            return execution;
        }
        assert!(tokio::time::Instant::now() < deadline, "execution {id} never got there: {execution:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_restarted_replica_takes_its_runs_back_at_once(backend: Backend) {
    let environment = vec![("MUSTER_REPLICA_LEASE_MS".to_owned(), "120000".to_owned())];
    let Some(mut test) = TestCluster::start_with_environment(backend, environment).await else { return };
    let tokens = test
        .register_agents(&[
            agent("doer", "worker", "team"),
            agent("boss", "worker", "team"),
            agent("watcher", "worker", "team"),
        ])
        .await;
    let credentials = vec![AgentCredential { agent_id: "doer".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let approval = publish_and_start(&mut client, APPROVAL).await;
    let waiting = StepStatus::WaitingApproval as i32;
    until(&mut client, &approval, Duration::from_secs(30), |execution| execution.steps[0].status == waiting).await;
    let chain =
        publish_and_start(&mut client, &chain_process("resumed-after-restart", STEPS, "doer", "watcher", "{}")).await;
    let completed = StepStatus::Completed as i32;
    until(&mut client, &chain, Duration::from_secs(30), |execution| execution.steps[2].status == completed).await;

    test.cluster_mut().kill("execution").await.unwrap();
    // Back on its address, with its identity; it reports SERVING before this returns.
    test.cluster_mut().restart("execution").await.unwrap();
    let mut boss = test.execution();
    let request = SubmitApprovalRequest {
        execution_id: approval.clone(),
        step_id: "gate".to_owned(),
        approved: true,
        comment: "after the restart".to_owned(),
    };
    let decided = boss.submit_approval(as_agent(request, &tokens[1])).await;
    assert!(decided.is_ok(), "the approval right after the restart: {decided:?}");

    // Both runs complete while the killed replica's lease would still hold them.
    let mut client = test.execution();
    let done = ExecutionStatus::Completed as i32;
    let limit = Duration::from_secs(60);
    until(&mut client, &approval, limit, |execution| execution.status == done).await;
    until(&mut client, &chain, limit, |execution| execution.status == done).await;

    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_takes_its_runs_back_at_once_on_sqlite() {
    a_restarted_replica_takes_its_runs_back_at_once(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_replica_takes_its_runs_back_at_once_on_postgres() {
    a_restarted_replica_takes_its_runs_back_at_once(Backend::Postgres).await;
}
