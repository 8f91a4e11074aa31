//! The execution service end to end: retries, failure propagation,
//! timeouts, cancellation, worker authentication, and recovery from crashes of
//! the execution service and outages of the notifier.

use std::{collections::HashMap, time::Duration};

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus, StepEvent},
    execution::v1::{
        CancelExecutionRequest, GetExecutionRequest, PublishProcessRequest, StartExecutionRequest, StepStatus,
        WatchExecutionRequest,
    },
    roster::v1::Agent,
};
use muster_tests::{
    Backend, ExecutionClient, TestCluster, agent, as_agent, chain_process, events_until_finished, publish_and_start,
    spawn_sample_worker,
};

/// A cluster with these agents, each allowed to hand its steps onward.
async fn cluster_with_agents(backend: Backend, ids: &[&str]) -> Option<(TestCluster, Vec<AgentCredential>)> {
    let test = TestCluster::start(backend).await?;
    let agents: Vec<_> = ids.iter().map(|id| Agent { allow_delegation: true, ..agent(id, "worker", "team") }).collect();
    let tokens = test.register_agents(&agents).await;
    let credentials =
        ids.iter().zip(tokens).map(|(id, token)| AgentCredential { agent_id: (*id).to_owned(), token }).collect();
    Some((test, credentials))
}

fn count(events: &[StepEvent], kind: EventType, step: &str) -> usize {
    events.iter().filter(|event| event.event_type == kind as i32 && event.step_id == step).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_failures_and_timeouts() {
    let Some((test, credentials)) = cluster_with_agents(Backend::Sqlite, &["doer", "watcher"]).await else { return };
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let source = r#"
name: failures
lead: watcher
steps:
  - id: flaky
    type: agent_task
    agent: doer
    message: fails once, then works
    retries: 2
    inputs: {fail_attempts: 1}
  - id: broken
    type: agent_task
    agent: doer
    message: always fails
    depends_on: [flaky]
    inputs: {fail: "the tool is down"}
    roles: {executor: doer, informed: [watcher]}
  - id: after-broken
    type: agent_task
    agent: doer
    message: never runs
    depends_on: [broken]
  - id: slow
    type: agent_task
    agent: doer
    message: too slow
    timeout_seconds: 1
    inputs: {sleep_ms: 5000}
  - id: independent
    type: agent_task
    agent: doer
    message: works
"#;
    let execution_id = publish_and_start(&mut client, source).await;
    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    let finished = events.last().unwrap();
    assert_eq!(finished.execution_status, ExecutionStatus::Failed as i32);
    assert!(finished.detail.contains("broken") || finished.detail.contains("slow"), "{}", finished.detail);

    let execution = client.get_execution(GetExecutionRequest { id: execution_id.clone() }).await.unwrap().into_inner();
    let steps: HashMap<String, _> =
        execution.execution.unwrap().steps.into_iter().map(|step| (step.step_id.clone(), step)).collect();
    assert_eq!(steps["flaky"].status, StepStatus::Completed as i32);
    assert_eq!(steps["flaky"].attempt, 2, "a retryable failure is retried");
    assert_eq!(steps["broken"].status, StepStatus::Failed as i32);
    assert_eq!(steps["broken"].error.as_ref().unwrap().code, "SAMPLE_FAILURE");
    assert_eq!(steps["after-broken"].status, StepStatus::Failed as i32);
    assert_eq!(steps["after-broken"].error.as_ref().unwrap().code, "UPSTREAM_FAILED");
    assert_eq!(steps["after-broken"].attempt, 0, "a step whose dependency failed never starts");
    assert_eq!(steps["slow"].status, StepStatus::Failed as i32);
    assert_eq!(steps["slow"].error.as_ref().unwrap().code, "TIMEOUT");
    assert_eq!(steps["independent"].status, StepStatus::Completed as i32);
    assert_eq!(count(&events, EventType::StepFailed, "broken"), 1);
    assert_eq!(count(&events, EventType::StepStarted, "flaky"), 2);

    // The informed agent's memory has the failure with its metadata (error code and retry count).
    muster::inbox::wait_for_event(&test.operator("notifier"), "watcher", &finished.event_id, Duration::from_secs(120))
        .await
        .unwrap();
    let memory = test.data_dir.join("agents/watcher/events");
    let lines = ndjson(&memory);
    let failure = lines
        .iter()
        .find(|line| line["event_type"] == "step_failed" && line["step_id"] == "broken")
        .unwrap_or_else(|| panic!("no failure line in {lines:#?}"));
    assert_eq!(failure["metadata"]["error_code"], "SAMPLE_FAILURE");
    assert_eq!(failure["metadata"]["retry_count"], 0);
    assert_eq!(failure["output_summary"], "the tool is down");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_and_refusals() {
    let Some((test, mut credentials)) = cluster_with_agents(Backend::Sqlite, &["doer"]).await else { return };
    let mut client = test.execution();

    // A worker with a token that is not the agent's is refused, and says so.
    let mut forged = credentials.clone();
    forged[0].token = "not-a-token".to_owned();
    let (_stop_forged, forged_worker) = spawn_sample_worker(test.operator("execution"), forged);
    let refusal = forged_worker.await.unwrap().expect_err("a forged token is refused");
    let status = refusal.downcast_ref::<tonic::Status>().expect("a gRPC refusal");
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status}");

    // An executor missing from the roster stops the start, naming the step and agent.
    let missing = "name: ghost\nsteps:\n  - id: one\n    type: agent_task\n    agent: doer\n    message: hi\n";
    client
        .publish_process(PublishProcessRequest { source: missing.to_owned(), file_name: String::new() })
        .await
        .unwrap();
    let status = client
        .start_execution(StartExecutionRequest { process_name: "nobody".to_owned(), ..Default::default() })
        .await
        .expect_err("an unknown process");
    assert_eq!(status.code(), tonic::Code::NotFound);

    // Cancelling a running execution cancels its unfinished steps.
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), std::mem::take(&mut credentials));
    let slow = "name: slow\nsteps:\n  - id: wait\n    type: agent_task\n    agent: doer\n    message: wait\n    inputs: {sleep_ms: 60000}\n  - id: later\n    type: agent_task\n    agent: doer\n    message: later\n    depends_on: [wait]\n";
    let execution_id = publish_and_start(&mut client, slow).await;
    let cancelled = client
        .cancel_execution(CancelExecutionRequest { id: execution_id.clone(), reason: "changed my mind".to_owned() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(cancelled.status, ExecutionStatus::Cancelled as i32);
    assert_eq!(cancelled.reason, "changed my mind");
    assert!(cancelled.steps.iter().all(|step| step.status == StepStatus::Cancelled as i32), "{:?}", cancelled.steps);
    let again = client
        .cancel_execution(CancelExecutionRequest { id: execution_id, reason: String::new() })
        .await
        .expect_err("an ended execution cannot be cancelled");
    assert_eq!(again.code(), tonic::Code::FailedPrecondition);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Kill -9 of the execution service in the middle of a run, then a restart:
/// the execution completes and every step's result is recorded once.
async fn execution_service_crash(backend: Backend) {
    let Some((mut test, credentials)) = cluster_with_agents(backend, &["doer", "watcher"]).await else { return };
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let steps = 1000;
    let source = chain_process("crash", steps, "doer", "watcher", "{}");
    let execution_id = publish_and_start(&mut client, &source).await;

    // Wait until a third of the chain completed, then crash the service.
    let mut stream = client
        .watch_execution(WatchExecutionRequest { execution_id: execution_id.clone(), after_sequence: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut completed = 0;
    while completed < steps / 3 {
        let event = stream.message().await.unwrap().unwrap().event.unwrap();
        completed += usize::from(event.event_type == EventType::StepCompleted as i32);
    }
    test.cluster_mut().kill("execution").await.unwrap();
    test.cluster_mut().restart("execution").await.unwrap();

    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    let finished = events.last().unwrap();
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
    for (position, event) in events.iter().enumerate() {
        assert_eq!(event.sequence, position as u64 + 1, "event sequences have no gap and no repeat");
    }
    for index in 0..steps {
        assert_eq!(count(&events, EventType::StepCompleted, &format!("s{index}")), 1, "step s{index}");
    }
    // The notifier got every event exactly once, whatever was in flight at the crash.
    muster::inbox::wait_for_event(&test.operator("notifier"), "watcher", &finished.event_id, Duration::from_secs(120))
        .await
        .unwrap();
    let notified: Vec<StepEvent> = muster::inbox::all(&test.operator("notifier"), "watcher")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|notification| notification.event)
        .collect();
    let mut seen = std::collections::HashSet::new();
    for event in &notified {
        assert!(seen.insert(event.event_id.clone()), "event {} notified twice", event.event_id);
    }
    assert_eq!(notified.len(), events.len(), "the lead hears of every event once");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_service_crash_on_sqlite() {
    execution_service_crash(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execution_service_crash_on_postgres() {
    execution_service_crash(Backend::Postgres).await;
}

/// The notifier stops in the middle of a run and comes back: every event arrives, none twice.
async fn notifier_outage(backend: Backend) {
    let Some((mut test, credentials)) = cluster_with_agents(backend, &["doer", "watcher"]).await else { return };
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    test.cluster_mut().stop("notifier").await.unwrap();
    let source = chain_process("outage", 20, "doer", "watcher", "{}");
    let execution_id = publish_and_start(&mut client, &source).await;
    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    test.cluster_mut().restart("notifier").await.unwrap();

    let finished = events.last().unwrap();
    muster::inbox::wait_for_event(&test.operator("notifier"), "watcher", &finished.event_id, Duration::from_secs(120))
        .await
        .unwrap();
    let notified: Vec<StepEvent> = muster::inbox::all(&test.operator("notifier"), "watcher")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|notification| notification.event)
        .collect();
    let ids: Vec<&str> = notified.iter().map(|event| event.event_id.as_str()).collect();
    let expected: Vec<&str> = events.iter().map(|event| event.event_id.as_str()).collect();
    assert_eq!(ids, expected, "every event, in order, once");
    let lines = ndjson(&test.data_dir.join("agents/watcher/events"));
    let completions = lines.iter().filter(|line| line["event_type"] == "step_completed").count();
    assert_eq!(completions, 20, "one NDJSON line per completed step");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_outage_on_sqlite() {
    notifier_outage(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifier_outage_on_postgres() {
    notifier_outage(Backend::Postgres).await;
}

fn ndjson(dir: &std::path::Path) -> Vec<serde_json::Value> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for line in std::fs::read_to_string(entry.path()).unwrap().lines() {
            lines.push(serde_json::from_str(line).unwrap());
        }
    }
    lines
}

async fn wait_for_status(
    client: &mut ExecutionClient,
    execution_id: &str,
    step_id: &str,
    status: StepStatus,
) -> muster_proto::execution::v1::StepState {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let execution =
            client.get_execution(GetExecutionRequest { id: execution_id.to_owned() }).await.unwrap().into_inner();
        if let Some(step) = execution.execution.unwrap().steps.into_iter().find(|step| step.step_id == step_id)
            && step.status == status as i32
        {
            return step;
        }
        assert!(tokio::time::Instant::now() < deadline, "step {step_id} never reached {status:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn human_approval_waits_for_its_executor_or_monitors() {
    use muster_proto::execution::v1::SubmitApprovalRequest;
    let Some((test, credentials)) =
        cluster_with_agents(Backend::Sqlite, &["doer", "boss", "reviewer", "outsider"]).await
    else {
        return;
    };
    let token = |agent: &str| credentials.iter().find(|c| c.agent_id == agent).unwrap().token.clone();
    let (boss_token, reviewer_token, outsider_token) = (token("boss"), token("reviewer"), token("outsider"));
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials.clone());
    let mut client = test.execution();
    let source = |name: &str| {
        format!(
            "name: {name}\nsteps:\n  - id: prepare\n    type: agent_task\n    agent: doer\n    message: prepare\n  - id: sign-off\n    type: human_approval\n    title: Sign off\n    depends_on: [prepare]\n    roles:\n      executor: boss\n      monitors: [reviewer]\n  - id: ship\n    type: agent_task\n    agent: doer\n    message: ship\n    depends_on: [sign-off]\n"
        )
    };

    let approved_id = publish_and_start(&mut client, &source("approved")).await;
    let waiting = wait_for_status(&mut client, &approved_id, "sign-off", StepStatus::WaitingApproval).await;
    assert_eq!(waiting.waiting_for, vec!["boss".to_owned(), "reviewer".to_owned()]);
    let decision = |approved: bool, comment: &str| SubmitApprovalRequest {
        execution_id: approved_id.clone(),
        step_id: "sign-off".to_owned(),
        approved,
        comment: comment.to_owned(),
    };
    let status = test
        .execution_with(muster_runtime::auth::client::Credentials::none())
        .submit_approval(decision(true, ""))
        .await
        .expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let status = client.submit_approval(decision(true, "")).await.expect_err("operators do not decide");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    let status =
        client.submit_approval(as_agent(decision(true, ""), &outsider_token)).await.expect_err("not an approver");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(status.message().contains("outsider"), "{}", status.message());
    let step = client
        .submit_approval(as_agent(decision(true, "looks good"), &reviewer_token))
        .await
        .unwrap()
        .into_inner()
        .step
        .unwrap();
    assert_eq!(step.status, StepStatus::Completed as i32);
    assert_eq!(step.executor, "reviewer");
    let events = events_until_finished(&test.operator("execution"), &approved_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    assert_eq!(count(&events, EventType::ApprovalRequested, "sign-off"), 1);
    let late = client.submit_approval(as_agent(decision(false, ""), &boss_token)).await.expect_err("already decided");
    assert_eq!(late.code(), tonic::Code::FailedPrecondition);

    let rejected_id = publish_and_start(&mut client, &source("rejected")).await;
    wait_for_status(&mut client, &rejected_id, "sign-off", StepStatus::WaitingApproval).await;
    let rejection = SubmitApprovalRequest {
        execution_id: rejected_id.clone(),
        step_id: "sign-off".to_owned(),
        approved: false,
        comment: "not yet".to_owned(),
    };
    client.submit_approval(as_agent(rejection, &boss_token)).await.unwrap();
    let events = events_until_finished(&test.operator("execution"), &rejected_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let failure = events
        .iter()
        .find(|event| event.step_id == "sign-off" && event.event_type == EventType::StepFailed as i32)
        .unwrap();
    assert_eq!(failure.error.as_ref().unwrap().code, "REJECTED");
    assert_eq!(failure.error.as_ref().unwrap().message, "rejected by boss: not yet");
    assert_eq!(count(&events, EventType::StepStarted, "ship"), 0);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitors_and_the_lead_intervene_and_nobody_else() {
    use muster_proto::execution::v1::{InterveneRequest, InterventionAction, SubmitApprovalRequest};
    let agents = ["doer", "ghost", "boss", "monitor", "outsider"];
    let Some((test, credentials)) = cluster_with_agents(Backend::Sqlite, &agents).await else { return };
    let token = |agent: &str| credentials.iter().find(|c| c.agent_id == agent).unwrap().token.clone();
    // Nobody serves "ghost": its step waits for a worker until reassigned.
    let served = credentials.iter().filter(|c| c.agent_id != "ghost").cloned().collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), served);
    let mut client = test.execution();
    let source = r#"
name: interventions
lead: boss
steps:
  - id: gate
    type: human_approval
    title: Final gate
    roles: {executor: boss}
  - id: stuck
    type: agent_task
    agent: ghost
    message: nobody serves me
    roles: {executor: ghost, monitors: [monitor]}
  - id: flaky
    type: agent_task
    agent: doer
    message: fails the first time
    inputs: {fail_attempts: 1}
    roles: {executor: doer, monitors: [monitor]}
  - id: after-flaky
    type: agent_task
    agent: doer
    message: needs flaky
    depends_on: [flaky]
"#;
    let id = publish_and_start(&mut client, source).await;
    let intervene = |step: &str, action: InterventionAction, target: &str| InterveneRequest {
        execution_id: id.clone(),
        step_id: step.to_owned(),
        action: action as i32,
        target_agent_id: target.to_owned(),
        output: None,
        reason: "test".to_owned(),
    };

    wait_for_status(&mut client, &id, "after-flaky", StepStatus::Failed).await;
    let denied = client
        .intervene(as_agent(intervene("flaky", InterventionAction::Retry, ""), &token("outsider")))
        .await
        .expect_err("an outsider may not intervene");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    // An agent that takes no part hears nothing of the execution: not who monitors it.
    assert!(denied.message().contains("takes no part"), "{}", denied.message());
    assert!(!denied.message().contains("monitor") && !denied.message().contains("boss"), "{}", denied.message());
    let denied = client
        .intervene(as_agent(intervene("after-flaky", InterventionAction::Retry, ""), &token("monitor")))
        .await
        .expect_err("a monitor only intervenes in its own steps");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);

    // A monitor retries its failed step; the dependant that failed with it runs too.
    client.intervene(as_agent(intervene("flaky", InterventionAction::Retry, ""), &token("monitor"))).await.unwrap();
    let flaky = wait_for_status(&mut client, &id, "flaky", StepStatus::Completed).await;
    assert_eq!(flaky.attempt, 2);
    wait_for_status(&mut client, &id, "after-flaky", StepStatus::Completed).await;

    // A monitor reassigns the step nobody serves: it waits for a worker, not running.
    let waiting = wait_for_status(&mut client, &id, "stuck", StepStatus::WaitingForWorker).await;
    assert_eq!((waiting.executor.as_str(), waiting.started_at), ("ghost", None), "{waiting:?}");
    client
        .intervene(as_agent(intervene("stuck", InterventionAction::Reassign, "doer"), &token("monitor")))
        .await
        .unwrap();
    let stuck = wait_for_status(&mut client, &id, "stuck", StepStatus::Completed).await;
    assert_eq!(stuck.executor, "doer");

    // Only the lead pauses and resumes the whole execution.
    let denied = client
        .intervene(as_agent(intervene("", InterventionAction::Pause, ""), &token("monitor")))
        .await
        .expect_err("only the lead pauses the execution");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let paused = client
        .intervene(as_agent(intervene("", InterventionAction::Pause, ""), &token("boss")))
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(paused.status, ExecutionStatus::Paused as i32);
    client.intervene(as_agent(intervene("", InterventionAction::Resume, ""), &token("boss"))).await.unwrap();

    let approval = SubmitApprovalRequest {
        execution_id: id.clone(),
        step_id: "gate".to_owned(),
        approved: true,
        comment: String::new(),
    };
    client.submit_approval(as_agent(approval, &token("boss"))).await.unwrap();
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(
        events.last().unwrap().execution_status,
        ExecutionStatus::Completed as i32,
        "{}",
        events.last().unwrap().detail
    );
    let interventions: Vec<&str> = events
        .iter()
        .filter(|event| event.event_type == EventType::StepIntervened as i32)
        .map(|event| event.detail.as_str())
        .collect();
    assert_eq!(
        interventions,
        vec![
            "monitor retried step 'flaky': test",
            "monitor reassigned step 'stuck' to doer: test",
            "boss paused the execution: test",
            "boss resumed the execution: test",
        ]
    );

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// The roster stops in the middle of a run of delegated steps and comes back:
/// delegations wait for it, and no step fails because of the outage.
async fn roster_outage(backend: Backend) {
    use muster_proto::roster::v1::Agent;
    let Some(mut test) = TestCluster::start(backend).await else { return };
    let expert = |id: &str| Agent {
        id: id.to_owned(),
        name: id.to_owned(),
        team: "core".to_owned(),
        senior_id: "boss".to_owned(),
        expertise: vec!["rust".to_owned()],
        ..Default::default()
    };
    let boss = Agent { id: "boss".to_owned(), name: "boss".to_owned(), team: "core".to_owned(), ..Default::default() };
    let agents = vec![boss, expert("expert-a"), expert("expert-b")];
    let tokens = test.register_agents(&agents).await;
    let credentials =
        agents.iter().zip(tokens).map(|(agent, token)| AgentCredential { agent_id: agent.id.clone(), token }).collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let mut source = String::from("name: outage\nlead: boss\nsteps:\n");
    for index in 0..12 {
        source.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    message: step {index}\n    inputs: {{sleep_ms: 50}}\n    delegate: {{expertise: [rust], team: core}}\n"
        ));
        if index > 0 {
            source.push_str(&format!("    depends_on: [s{}]\n", index - 1));
        }
    }
    let execution_id = publish_and_start(&mut client, &source).await;
    wait_for_status(&mut client, &execution_id, "s2", StepStatus::Completed).await;
    test.cluster_mut().stop("roster").await.unwrap();
    // Steps keep asking the roster while it is down.
    tokio::time::sleep(Duration::from_millis(500)).await;
    test.cluster_mut().restart("roster").await.unwrap();

    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    let finished = events.last().unwrap();
    assert_eq!(finished.execution_status, ExecutionStatus::Completed as i32, "{}", finished.detail);
    assert!(events.iter().all(|event| event.event_type != EventType::StepFailed as i32));
    for index in 0..12 {
        let step = format!("s{index}");
        assert_eq!(count(&events, EventType::StepDelegated, &step), 1, "{step} was delegated by the roster once");
        let delegated = events
            .iter()
            .find(|event| event.step_id == step && event.event_type == EventType::StepDelegated as i32)
            .unwrap();
        assert!(delegated.agent_id.starts_with("expert-"), "{delegated:?}");
    }

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_outage_on_sqlite() {
    roster_outage(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_outage_on_postgres() {
    roster_outage(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_delegate_onward_and_loops_are_refused() {
    let Some((test, credentials)) = cluster_with_agents(Backend::Sqlite, &["ann", "bob"]).await else { return };
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    let source = r#"
name: relay
steps:
  - id: relay
    type: agent_task
    agent: ann
    message: pass it on
    inputs: {delegate: {ann: bob, bob: ann}}
  - id: stranger
    type: agent_task
    agent: ann
    message: ask someone unknown
    inputs: {delegate: {ann: nobody}}
"#;
    let id = publish_and_start(&mut client, source).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution.unwrap();
    let step = |step_id: &str| execution.steps.iter().find(|step| step.step_id == step_id).unwrap().clone();

    // ann hands the step to bob; bob's attempt to hand it back is a loop, refused: bob does it.
    let relay = step("relay");
    assert_eq!(relay.executor, "bob");
    assert_eq!(relay.attempt, 2, "ann's attempt was withdrawn, bob's is the second");
    let output: serde_json::Value = muster_tests::json_of(&relay.output);
    assert_eq!(output["agent"], "bob");
    assert_eq!(output["delegation_refused"], "delegation loop: ann -> bob -> ann; the step stays with bob");
    let delegated: Vec<&str> = events
        .iter()
        .filter(|event| event.event_type == EventType::StepDelegated as i32)
        .map(|event| event.detail.as_str())
        .collect();
    assert_eq!(delegated, vec!["ann delegated step 'relay' to bob: ann hands it to bob"]);

    // A colleague missing from the roster is refused too.
    let stranger = step("stranger");
    assert_eq!(stranger.executor, "ann");
    let output: serde_json::Value = muster_tests::json_of(&stranger.output);
    assert_eq!(output["delegation_refused"], "colleague 'nobody' is not in the roster");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_worker_loses_its_assignment_after_the_lease() {
    use muster_proto::execution::v1::{
        ConnectWorkerRequest, ServedAgent, WorkerHello, connect_worker_request, connect_worker_response,
    };
    let lease = vec![("MUSTER_WORKER_LEASE_MS".to_owned(), "1000".to_owned())];
    let Some(test) = TestCluster::start_with_environment(Backend::Sqlite, lease).await else { return };
    let tokens = test.register_agents(&[agent("solo", "worker", "team")]).await;

    // A worker that says hello and then nothing: no heartbeat, no result.
    let (silent_sender, silent_receiver) = tokio::sync::mpsc::channel(4);
    silent_sender
        .send(ConnectWorkerRequest {
            message: Some(connect_worker_request::Message::Hello(WorkerHello {
                worker_name: "silent".to_owned(),
                agents: vec![ServedAgent { agent_id: "solo".to_owned(), token: tokens[0].clone() }],
                tools: Vec::new(),
                max_concurrency: 1,
                keeps_windows: 0,
            })),
        })
        .await
        .unwrap();
    let mut silent_client = test.execution();
    let mut silent = silent_client
        .connect_worker(tokio_stream::wrappers::ReceiverStream::new(silent_receiver))
        .await
        .unwrap()
        .into_inner();
    let welcome = silent.message().await.unwrap().unwrap();
    assert!(
        matches!(welcome.message, Some(connect_worker_response::Message::Welcome(ref w)) if w.lease == Some(muster_runtime::time::to_duration(1000))),
        "{welcome:?}"
    );

    let mut client = test.execution();
    let id = publish_and_start(
        &mut client,
        "name: lease\nsteps:\n  - id: only\n    type: agent_task\n    agent: solo\n    message: m\n",
    )
    .await;
    let first = silent.message().await.unwrap().unwrap();
    let assigned_at = std::time::Instant::now();
    let Some(connect_worker_response::Message::Assignment(assignment)) = first.message else {
        panic!("expected the assignment, got {first:?}")
    };
    assert_eq!(assignment.attempt, 1);

    // A live worker joins; once the silent one's lease expires, the step moves to it.
    let credentials = vec![AgentCredential { agent_id: "solo".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let ended = silent.message().await.expect_err("the silent worker is disconnected");
    assert_eq!(ended.code(), tonic::Code::DeadlineExceeded, "{ended}");
    // The lease holds to its stated time: not before it, and not long after
    // (the sweep runs a few times a lease; the bound is loose for busy machines).
    let held = assigned_at.elapsed();
    assert!(held >= Duration::from_millis(900), "disconnected after {held:?}, before the 1 s lease");
    assert!(held < Duration::from_secs(15), "held {held:?} past a 1 s lease");
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution.unwrap();
    // (Under heavy load the live worker may itself miss a lease and be given a
    // later attempt; what matters is that the silent one's attempt moved on.)
    assert!(execution.steps[0].attempt >= 2, "a later attempt, by the live worker");
    let output: serde_json::Value = muster_tests::json_of(&execution.steps[0].output);
    assert_eq!(output["attempt"], execution.steps[0].attempt);
    drop(silent_sender);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stream_gives_its_steps_back_at_once() {
    use muster_proto::execution::v1::{
        ConnectWorkerRequest, ServedAgent, WorkerHello, connect_worker_request, connect_worker_response,
    };
    // A lease far longer than the test: only the lost stream can free the step.
    let lease = vec![("MUSTER_WORKER_LEASE_MS".to_owned(), "600000".to_owned())];
    let Some(test) = TestCluster::start_with_environment(Backend::Sqlite, lease).await else { return };
    let tokens = test.register_agents(&[agent("solo", "worker", "team")]).await;
    let (sender, receiver) = tokio::sync::mpsc::channel(4);
    sender
        .send(ConnectWorkerRequest {
            message: Some(connect_worker_request::Message::Hello(WorkerHello {
                worker_name: "doomed".to_owned(),
                agents: vec![ServedAgent { agent_id: "solo".to_owned(), token: tokens[0].clone() }],
                tools: Vec::new(),
                max_concurrency: 1,
                keeps_windows: 0,
            })),
        })
        .await
        .unwrap();
    let mut doomed = test
        .execution()
        .connect_worker(tokio_stream::wrappers::ReceiverStream::new(receiver))
        .await
        .unwrap()
        .into_inner();
    doomed.message().await.unwrap().expect("the welcome");
    let mut client = test.execution();
    let id = publish_and_start(
        &mut client,
        "name: lost\nsteps:\n  - id: only\n    type: agent_task\n    agent: solo\n    message: m\n",
    )
    .await;
    let first = doomed.message().await.unwrap().unwrap();
    assert!(matches!(first.message, Some(connect_worker_response::Message::Assignment(_))), "{first:?}");

    // The worker's stream breaks (its process died, say); a live worker is there.
    let credentials = vec![AgentCredential { agent_id: "solo".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    drop((doomed, sender));
    let events =
        tokio::time::timeout(Duration::from_secs(120), events_until_finished(&test.operator("execution"), &id))
            .await
            .expect("the step went to the live worker long before the 10-minute lease");
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let execution = client.get_execution(GetExecutionRequest { id }).await.unwrap().into_inner().execution.unwrap();
    assert_eq!(execution.steps[0].attempt, 2, "the lost attempt, then the live worker's");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_are_pinned_context_is_checked_and_parallelism_is_bounded() {
    use muster_proto::execution::v1::{GetProcessRequest, ListProcessesRequest};
    let Some((test, credentials)) = cluster_with_agents(Backend::Sqlite, &["doer"]).await else { return };
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();

    // Publishing checks references against the roster: an unknown agent is refused.
    let unknown = "name: unknown\nsteps:\n  - id: one\n    type: agent_task\n    agent: nobody\n    message: m\n";
    let status = client
        .publish_process(PublishProcessRequest { source: unknown.to_owned(), file_name: String::new() })
        .await
        .expect_err("an agent missing from the roster is refused at publish");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("nobody"), "{}", status.message());

    // Six steps of 150 ms under `max_parallel: 2`: never more than two at once.
    let mut bounded = String::from("name: versions\nmax_parallel: 2\nsteps:\n");
    for index in 0..6 {
        bounded.push_str(&format!(
            "  - id: s{index}\n    type: agent_task\n    agent: doer\n    message: m\n    inputs: {{sleep_ms: 150}}\n"
        ));
    }
    let first = publish_and_start(&mut client, &bounded).await;
    // A second version, published while the first execution runs, does not change it.
    let second_source =
        "name: versions\nsteps:\n  - id: other\n    type: agent_task\n    agent: doer\n    message: m\n";
    let second = publish_and_start(&mut client, second_source).await;
    // A start naming no version runs the latest, and answers with the run as created.
    let third = client
        .start_execution(StartExecutionRequest { process_name: "versions".to_owned(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(third.process_version, 2);
    let steps: Vec<(&str, i32)> = third.steps.iter().map(|step| (step.step_id.as_str(), step.status)).collect();
    assert_eq!(steps, [("other", StepStatus::Pending as i32)]);
    let events = events_until_finished(&test.operator("execution"), &first).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    assert!(events.iter().all(|event| event.process_version == 1));
    let mut running: i32 = 0;
    let mut most = 0;
    for event in &events {
        if event.event_type == EventType::StepStarted as i32 {
            running += 1;
        } else if event.event_type == EventType::StepCompleted as i32 {
            running -= 1;
        }
        most = most.max(running);
    }
    assert_eq!(most, 2, "max_parallel bounds the steps running at once");
    let later = events_until_finished(&test.operator("execution"), &second).await;
    assert!(later.iter().all(|event| event.process_version == 2));
    assert!(later.iter().any(|event| event.step_id == "other"));
    let original = client
        .get_process(GetProcessRequest { name: "versions".to_owned(), version: 1 })
        .await
        .unwrap()
        .into_inner()
        .process
        .unwrap();
    assert_eq!(original.source, bounded, "a published version never changes");

    // A warning on each of 1,000 steps (the executor is also informed): the
    // version keeps and shows the first 100 with the count of them all, a
    // publish does not echo the source, and a list carries the count only.
    let warned = chain_process("warned", 1_000, "doer", "doer", "{}");
    let published = client
        .publish_process(PublishProcessRequest { source: warned.clone(), file_name: String::new() })
        .await
        .unwrap()
        .into_inner();
    let version = published.process.unwrap();
    assert_eq!((published.diagnostics.len(), version.warnings.len(), version.warning_count), (100, 100, 1_000));
    assert_eq!(
        published.diagnostics[99].line,
        warned.lines().position(|line| line == "  - id: s99").unwrap() as u32 + 8
    );
    assert!(version.source.is_empty(), "the caller has the source");
    let read = client
        .get_process(GetProcessRequest { name: "warned".to_owned(), version: 0 })
        .await
        .unwrap()
        .into_inner()
        .process
        .unwrap();
    assert_eq!((read.source == warned, read.warnings, read.warning_count), (true, published.diagnostics, 1_000));
    let listed = client.list_processes(ListProcessesRequest::default()).await.unwrap().into_inner();
    let listed = listed.processes.iter().find(|process| process.name == "warned").unwrap();
    assert_eq!((listed.warnings.len(), listed.warning_count), (0, 1_000));

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// Delegated steps end to end: a busy expert queues the second step until the
/// first frees the slot, and with the expert offline the roster escalates to
/// the requester's senior.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delegation_queues_for_a_busy_expert_and_escalates_when_offline() {
    use muster_proto::roster::v1::{AgentStatus, SetAgentStatusRequest};
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let person = |id: &str, senior: &str, expertise: &[&str], capacity: u32| Agent {
        id: id.to_owned(),
        name: id.to_owned(),
        team: "core".to_owned(),
        senior_id: senior.to_owned(),
        expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
        workload_capacity: capacity,
        ..Default::default()
    };
    let agents =
        vec![person("chief", "", &[], 5), person("lead", "chief", &[], 5), person("expert", "lead", &["rust"], 1)];
    let tokens = test.register_agents(&agents).await;
    let credentials =
        agents.iter().zip(tokens).map(|(agent, token)| AgentCredential { agent_id: agent.id.clone(), token }).collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();

    // Two parallel steps need the one expert, who takes one task at a time.
    let queued = "name: queue\nlead: lead\nsteps:\n  - id: first\n    type: agent_task\n    message: m\n    inputs: {sleep_ms: 3000}\n    delegate: {expertise: [rust], team: core}\n  - id: second\n    type: agent_task\n    message: m\n    delegate: {expertise: [rust], team: core}\n";
    let id = publish_and_start(&mut client, queued).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(
        events.last().unwrap().execution_status,
        ExecutionStatus::Completed as i32,
        "{}",
        events.last().unwrap().detail
    );
    let queued_step = events
        .iter()
        .find(|event| event.event_type == EventType::StepQueued as i32)
        .expect("one step waited in the expert's queue");
    assert_eq!(queued_step.agent_id, "expert");
    assert!(queued_step.estimated_wait.is_some_and(|wait| wait.seconds > 0), "{queued_step:?}");
    let other = if queued_step.step_id == "first" { "second" } else { "first" };
    let completed = |step: &str| {
        events
            .iter()
            .find(|event| event.step_id == step && event.event_type == EventType::StepCompleted as i32)
            .unwrap()
            .sequence
    };
    let started = |step: &str| {
        events
            .iter()
            .rfind(|event| event.step_id == step && event.event_type == EventType::StepStarted as i32)
            .unwrap()
            .sequence
    };
    assert!(completed(other) < started(&queued_step.step_id), "the queued step started once the expert was free");
    assert!(events.iter().all(|event| event.event_type != EventType::StepStarted as i32 || event.agent_id == "expert"));

    // With the expert offline, nobody has the expertise: the lead's senior takes it.
    let mut roster = test.roster();
    roster
        .set_agent_status(SetAgentStatusRequest {
            id: "expert".to_owned(),
            status: AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    let escalated = "name: escalate\nlead: lead\nsteps:\n  - id: only\n    type: agent_task\n    message: m\n    delegate: {expertise: [rust], team: core}\n";
    let id = publish_and_start(&mut client, escalated).await;
    let events = events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(
        events.last().unwrap().execution_status,
        ExecutionStatus::Completed as i32,
        "{}",
        events.last().unwrap().detail
    );
    let escalation =
        events.iter().find(|event| event.event_type == EventType::StepEscalated as i32).expect("escalated");
    assert_eq!(escalation.agent_id, "chief", "{escalation:?}");
    let done = events.iter().find(|event| event.event_type == EventType::StepCompleted as i32).unwrap();
    assert_eq!(done.agent_id, "chief");

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
