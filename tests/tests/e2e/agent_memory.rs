//! An agent's memory as it grows during a run, end to end: each of an
//! agent's steps is assigned with the memory as it is then, so an entry an
//! operator adds (or forgets) between two of its steps of one execution is
//! in (or out of) the later step's assignment.

use std::time::Duration;

use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{
        AppendMemoryRequest, ForgetMemoryRequest, GetExecutionRequest, MemoryScope, StepStatus, SubmitApprovalRequest,
    },
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent, as_agent, events_until_finished, publish_and_start,
    spawn_sample_worker,
};
use serde_json::Value;

/// The doer's three steps, each after a sign-off by the boss.
const PROCESS: &str = "\
name: growing
steps:
  - {id: prepare, type: agent_task, agent: doer, message: prepare}
  - {id: first-gate, type: human_approval, depends_on: [prepare], roles: {executor: boss}}
  - {id: ship, type: agent_task, agent: doer, message: ship, depends_on: [first-gate]}
  - {id: second-gate, type: human_approval, depends_on: [ship], roles: {executor: boss}}
  - {id: wrap-up, type: agent_task, agent: doer, message: wrap up, depends_on: [second-gate]}
";

/// The step's state once it has `status`.
async fn step_with_status(
    client: &mut ExecutionClient,
    execution_id: &str,
    step_id: &str,
    status: StepStatus,
) -> Value {
    for _ in 0..600 {
        let execution = client
            .get_execution(GetExecutionRequest { id: execution_id.to_owned() })
            .await
            .expect("GetExecution")
            .into_inner()
            .execution
            .expect("the execution");
        if let Some(step) = execution.steps.into_iter().find(|step| step.step_id == step_id)
            && step.status == status as i32
        {
            return muster_tests::json_of(&step.output);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("step '{step_id}' never reached {status:?}");
}

async fn later_steps_see_memory_as_it_grows(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("doer", "member", "core"), agent("boss", "member", "core")]).await;
    let credentials = vec![muster::worker::AgentCredential { agent_id: "doer".into(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let execution_id = publish_and_start(&mut client, PROCESS).await;
    let approve = |step_id: &str| {
        let decision = SubmitApprovalRequest {
            execution_id: execution_id.clone(),
            step_id: step_id.to_owned(),
            approved: true,
            comment: String::new(),
        };
        as_agent(decision, &tokens[1])
    };

    // The first step: nothing remembered yet.
    let prepared = step_with_status(&mut client, &execution_id, "prepare", StepStatus::Completed).await;
    assert_eq!(prepared["memory_entries"], 0, "{prepared}");

    // An entry added while the run waits is in the doer's next assignment.
    step_with_status(&mut client, &execution_id, "first-gate", StepStatus::WaitingApproval).await;
    let append = AppendMemoryRequest {
        scope: MemoryScope::Global as i32,
        text: "the client moved the launch to Monday".into(),
        ..Default::default()
    };
    let entry = client.append_memory(append).await.expect("AppendMemory").into_inner().entry.expect("the entry");
    client.submit_approval(approve("first-gate")).await.expect("the first sign-off");
    let shipped = step_with_status(&mut client, &execution_id, "ship", StepStatus::Completed).await;
    assert_eq!(shipped["memory_entries"], 1, "the entry added meanwhile: {shipped}");

    // Forgotten meanwhile: out of the next one.
    step_with_status(&mut client, &execution_id, "second-gate", StepStatus::WaitingApproval).await;
    client.forget_memory(ForgetMemoryRequest { id: entry.id.clone() }).await.expect("ForgetMemory");
    client.submit_approval(approve("second-gate")).await.expect("the second sign-off");
    let wrapped = step_with_status(&mut client, &execution_id, "wrap-up", StepStatus::Completed).await;
    assert_eq!(wrapped["memory_entries"], 0, "the entry forgotten meanwhile: {wrapped}");

    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_steps_see_memory_as_it_grows_on_sqlite() {
    later_steps_see_memory_as_it_grows(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_steps_see_memory_as_it_grows_on_postgres() {
    later_steps_see_memory_as_it_grows(Backend::Postgres).await;
}
