//! Team sessions and the permission matrix through real gRPC to the real
//! processes: every (role, action) cell of the default matrix through
//! CheckRole and through the action it guards; a session from start to close;
//! the per-agent limits; impersonation attempts; a revoked agent leaving its
//! worker; a lead starting its own session; a subtask waiting for the
//! lead's approval; a roster role's actions binding
//! outside sessions; a dashboard suggesting only what would be accepted.

use std::{collections::HashMap, time::Duration};

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::{EventType, ExecutionStatus},
    execution::v1::{
        self as execution, AssignRoleRequest, CheckRoleRequest, ConnectWorkerRequest, DecideSubtaskRequest,
        GetExecutionRequest, GetMyRoleRequest, GetSessionStatusRequest, InterveneRequest, InterventionAction,
        InvokeToolRequest, PublishProcessRequest, RequestSubtaskRequest, RoleAssignment, RoleCheck, ServedAgent,
        SessionTask, SetLeadRequest, StartExecutionRequest, StartSessionRequest, StepStatus, SubmitApprovalRequest,
        SubtaskStatus, ToolSpec, WorkerHello, connect_worker_request,
    },
    notifier::v1::ListNotificationsRequest,
    roster::v1::{Agent, AgentStatus, RevokeTokenRequest, SetAgentStatusRequest, UpdateAgentRequest},
};
use muster_tests::{Backend, ExecutionClient, TestCluster, agent, events_until_finished, spawn_sample_worker};
use tonic::Code;
use tonic_types::StatusExt as _;

/// The team protocol's table: what each session role may do.
const ACTIONS: [&str; 18] = [
    "create_task",
    "assign_role",
    "reassign",
    "unblock",
    "close_task",
    "design",
    "create_subtask",
    "code",
    "test",
    "commit",
    "report_done",
    "request_review",
    "review",
    "approve",
    "request_changes",
    "analyze",
    "summarize",
    "report",
];

fn allowed(role: &str, action: &str) -> bool {
    let can: &[&str] = match role {
        "lead" => return true,
        "architect" => &["design", "create_subtask", "code"],
        "developer" => &["code", "test", "commit", "report_done", "request_review"],
        "reviewer" => &["review", "approve", "request_changes", "report_done"],
        "analyst" => &["analyze", "summarize", "report"],
        other => panic!("no role {other}"),
    };
    can.contains(&action)
}

/// The agent playing each role, the lead first.
const PLAYERS: [(&str, &str); 5] =
    [("boss", "lead"), ("arch", "architect"), ("dev", "developer"), ("rev", "reviewer"), ("ana", "analyst")];

/// The interventions each player tries on a long step it monitors, and the
/// action of the matrix each needs.
const INTERVENTIONS: [&str; 6] = ["pause", "resume", "retry", "override", "cancel", "reassign"];

/// Steps: one per (player, action) performing it; per player, a step it
/// hands onward, two approval gates it may decide and a long step per
/// intervention it monitors, to intervene in.
fn matrix_process() -> String {
    let mut yaml = String::from("name: matrix-cells\nmax_parallel: 1000\nsteps:\n");
    for (player, _) in PLAYERS {
        for action in ACTIONS {
            yaml.push_str(&format!(
                "  - {{id: a-{player}-{action}, type: agent_task, agent: {player}, message: '{action}', action: {action}}}\n"
            ));
        }
        for gate in ["approve", "reject"] {
            yaml.push_str(&format!(
                "  - {{id: {gate}-{player}, type: human_approval, roles: {{executor: sleeper, monitors: [{player}]}}}}\n"
            ));
        }
        yaml.push_str(&format!(
            "  - {{id: h-{player}, type: agent_task, agent: {player}, message: hand it on, inputs: {{delegate: {{{player}: helper}}}}}}\n"
        ));
        for target in INTERVENTIONS {
            yaml.push_str(&format!(
                "  - {{id: {target}-{player}, type: agent_task, agent: sleeper, message: wait, inputs: {{sleep_ms: 600000}}, roles: {{executor: sleeper, monitors: [{player}]}}}}\n"
            ));
        }
    }
    yaml
}

fn participant(agent_id: &str, role: &str, subtask: &str) -> RoleAssignment {
    RoleAssignment { agent_id: agent_id.into(), role: role.into(), subtask: subtask.into(), ..Default::default() }
}

async fn publish(client: &mut ExecutionClient, source: &str) {
    client
        .publish_process(PublishProcessRequest { source: source.to_owned(), file_name: String::new() })
        .await
        .unwrap();
}

async fn step_status(client: &mut ExecutionClient, execution_id: &str) -> HashMap<String, execution::StepState> {
    let execution =
        client.get_execution(GetExecutionRequest { id: execution_id.to_owned() }).await.unwrap().into_inner().execution;
    execution.unwrap().steps.into_iter().map(|step| (step.step_id.clone(), step)).collect()
}

/// Waits until `done` holds of the steps.
async fn wait_for_steps(
    client: &mut ExecutionClient,
    execution_id: &str,
    what: &str,
    done: impl Fn(&HashMap<String, execution::StepState>) -> bool,
) -> HashMap<String, execution::StepState> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let steps = step_status(client, execution_id).await;
        if done(&steps) {
            return steps;
        }
        assert!(tokio::time::Instant::now() < deadline, "{what}: {steps:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The names of the tools connected workers provide.
async fn client_tools(test: &TestCluster) -> Vec<String> {
    let listed = test.execution().list_tools(execution::ListToolsRequest::default()).await.unwrap().into_inner();
    listed.tools.into_iter().map(|tool| tool.name).collect()
}

fn is_final(step: &execution::StepState) -> bool {
    [StepStatus::Completed, StepStatus::Failed, StepStatus::Cancelled].contains(&step.status())
}

async fn every_cell_of_the_default_matrix_through_check_role_and_the_action_it_guards(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let names = ["boss", "arch", "dev", "rev", "ana", "sleeper", "spare", "helper"];
    // Every step the roster places takes a slot of its agent: the sleeper
    // holds one step per player and target at once.
    let agents: Vec<Agent> = names
        .iter()
        .map(|name| Agent { allow_delegation: true, workload_capacity: 100, ..agent(name, "member", "core") })
        .collect();
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    let credentials = tokens
        .iter()
        .map(|(agent_id, token)| AgentCredential { agent_id: (*agent_id).to_owned(), token: token.clone() });
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials.collect());
    let mut client = test.execution();
    publish(&mut client, &matrix_process()).await;
    let session = muster_tests::start_session(
        &mut client,
        StartSessionRequest {
            process_name: "matrix-cells".into(),
            lead_agent_id: "boss".into(),
            participants: vec![
                participant("arch", "architect", "design it"),
                participant("dev", "developer", "build it"),
                participant("rev", "reviewer", "review it"),
                participant("ana", "analyst", "measure it"),
                participant("sleeper", "developer", "wait"),
                participant("helper", "developer", "take what is handed on"),
            ],
            task: Some(SessionTask { title: "Every cell".into(), description: String::new() }),
            ..Default::default()
        },
    )
    .await;

    // Through CheckRole.
    for (player, role) in PLAYERS {
        for action in ACTIONS {
            let verdict = client
                .check_role(CheckRoleRequest {
                    execution_id: session.clone(),
                    action: action.into(),
                    agent_id: player.into(),
                })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(verdict.allowed, allowed(role, action), "{role} {action}: {}", verdict.reason);
            assert_eq!((verdict.role.as_str(), verdict.decided_by()), (role, RoleCheck::Action), "{verdict:?}");
            assert_eq!(verdict.matrix_version, 1);
        }
    }

    // Through the steps that perform each action: completed, or refused.
    let steps = wait_for_steps(&mut client, &session, "every action and hand-off step ends", |steps| {
        steps.iter().filter(|(id, _)| id.starts_with("a-") || id.starts_with("h-")).all(|(_, step)| is_final(step))
    })
    .await;
    // Through a worker handing its step onward (`reassign`): the step goes
    // to the helper, or stays with the player, who is told why.
    for (player, role) in PLAYERS {
        let step = &steps[&format!("h-{player}")];
        assert_eq!(step.status(), StepStatus::Completed, "{role} hand-off: {step:?}");
        let output: serde_json::Value = muster_tests::json_of(&step.output);
        if allowed(role, "reassign") {
            assert_eq!(output["agent"], "helper", "{role} hands it on: {output}");
        } else {
            assert_eq!(output["agent"], player, "{role} keeps it: {output}");
            let refused = output["delegation_refused"].as_str().unwrap_or_default();
            assert!(refused.contains(&format!("role '{role}'")), "{role}: {output}");
        }
    }
    for (player, role) in PLAYERS {
        for action in ACTIONS {
            let step = &steps[&format!("a-{player}-{action}")];
            if allowed(role, action) {
                assert_eq!(step.status(), StepStatus::Completed, "{role} {action}: {step:?}");
                let output: serde_json::Value = muster_tests::json_of(&step.output);
                assert_eq!(output["session_role"], role, "the assignment carries the session role");
            } else {
                assert_eq!(step.status(), StepStatus::Failed, "{role} {action}: {step:?}");
                let error = step.error.clone().unwrap();
                assert_eq!(error.code, "PERMISSION_DENIED", "{error:?}");
                assert!(error.message.contains(&format!("may not '{action}'")), "{}", error.message);
            }
        }
    }

    // Through the calls each action guards, made by each player itself.
    let expect = |outcome: Result<(), tonic::Status>, role: &str, action: &str| match outcome {
        Ok(()) => assert!(allowed(role, action), "{role} was let {action}"),
        Err(status) => {
            assert!(!allowed(role, action), "{role} was refused {action}: {status:?}");
            assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
            let info = status.get_details_error_info().expect("an ErrorInfo");
            assert_eq!((info.reason.as_str(), info.metadata["session_role"].as_str()), ("ROLE_FORBIDS_ACTION", role));
            assert!(status.message().contains(&format!("role '{role}'")), "{}", status.message());
        }
    };
    for (player, role) in PLAYERS {
        let mut as_player = test.execution_as(&tokens[player]);
        let assigned = as_player
            .assign_role(AssignRoleRequest {
                execution_id: session.clone(),
                agent_id: "spare".into(),
                role: "analyst".into(),
                subtask: format!("assigned by {player}"),
            })
            .await;
        expect(assigned.map(drop), role, "assign_role");
        for (gate, approved, action) in [("approve", true, "approve"), ("reject", false, "request_changes")] {
            let decided = as_player
                .submit_approval(SubmitApprovalRequest {
                    execution_id: session.clone(),
                    step_id: format!("{gate}-{player}"),
                    approved,
                    comment: String::new(),
                })
                .await;
            expect(decided.map(drop), role, action);
        }
        // The step to resume is paused by an operator first.
        client
            .intervene(InterveneRequest {
                execution_id: session.clone(),
                step_id: format!("resume-{player}"),
                action: InterventionAction::Pause as i32,
                ..Default::default()
            })
            .await
            .unwrap();
        for (target, action, guard) in [
            ("pause", InterventionAction::Pause, "unblock"),
            ("resume", InterventionAction::Resume, "unblock"),
            ("retry", InterventionAction::Retry, "unblock"),
            ("override", InterventionAction::OverrideOutput, "unblock"),
            ("cancel", InterventionAction::Cancel, "close_task"),
            ("reassign", InterventionAction::Reassign, "reassign"),
        ] {
            assert!(INTERVENTIONS.contains(&target));
            let intervened = as_player
                .intervene(InterveneRequest {
                    execution_id: session.clone(),
                    step_id: format!("{target}-{player}"),
                    action: action as i32,
                    target_agent_id: "spare".into(),
                    output: muster_tests::value(r#"{"overridden": true}"#),
                    ..Default::default()
                })
                .await;
            expect(intervened.map(drop), role, guard);
        }
    }

    // Handing the lead on (`assign_role`) and closing the session
    // (`close_task`) are the lead's: others are refused as not the lead.
    for (player, _) in &PLAYERS[1..] {
        let mut as_player = test.execution_as(&tokens[player]);
        let relead = as_player
            .set_lead(SetLeadRequest { execution_id: session.clone(), agent_id: (*player).into() })
            .await
            .unwrap_err();
        assert_eq!(relead.get_details_error_info().unwrap().reason, "NOT_THE_LEAD", "{relead:?}");
        let closed = as_player
            .cancel_execution(execution::CancelExecutionRequest { id: session.clone(), reason: String::new() })
            .await
            .unwrap_err();
        assert_eq!(closed.get_details_error_info().unwrap().reason, "NOT_THE_LEAD", "{closed:?}");
    }
    let releaded = test
        .execution_as(&tokens["boss"])
        .set_lead(SetLeadRequest { execution_id: session.clone(), agent_id: "arch".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(releaded.execution.unwrap().lead_agent_id, "arch");
    let closed = test
        .execution_as(&tokens["arch"])
        .cancel_execution(execution::CancelExecutionRequest { id: session.clone(), reason: "done".into() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    assert_eq!(closed.status(), ExecutionStatus::Cancelled, "{closed:?}");
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_default_matrix_on_sqlite() {
    every_cell_of_the_default_matrix_through_check_role_and_the_action_it_guards(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_cell_of_the_default_matrix_on_postgres() {
    every_cell_of_the_default_matrix_through_check_role_and_the_action_it_guards(Backend::Postgres).await;
}

const SESSION_PROCESS: &str = "\
name: feature-x
steps:
  - {id: endpoint, type: agent_task, agent: dev1, message: Write the endpoint, action: code}
  - {id: review, type: human_approval, roles: {executor: rev1}, depends_on: [endpoint]}
  - {id: docs, type: agent_task, agent: ghost, message: Document it}
";

/// The notifications of an agent, read with its own token.
async fn notifications_of(test: &TestCluster, agent_id: &str, token: &str) -> Vec<muster_proto::common::v1::StepEvent> {
    let mut notifier = test.notifier_as(token);
    let listed = notifier
        .list_notifications(ListNotificationsRequest { agent_id: agent_id.to_owned(), after_cursor: 0, limit: 1000 })
        .await
        .unwrap()
        .into_inner();
    listed.notifications.into_iter().map(|notification| notification.event.unwrap()).collect()
}

/// Waits until the agent has heard of an event of `kind` about `execution_id`.
async fn wait_to_hear(
    test: &TestCluster,
    agent_id: &str,
    token: &str,
    execution_id: &str,
    kind: EventType,
) -> muster_proto::common::v1::StepEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let heard = notifications_of(test, agent_id, token).await;
        if let Some(event) =
            heard.into_iter().find(|event| event.execution_id == execution_id && event.event_type == kind as i32)
        {
            return event;
        }
        assert!(tokio::time::Instant::now() < deadline, "{agent_id} never heard of {kind:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn a_session_from_start_to_close(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let names = ["tpm", "dev1", "rev1", "ghost", "helper"];
    let agents: Vec<Agent> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    test.roster()
        .set_agent_status(SetAgentStatusRequest {
            id: "ghost".into(),
            status: AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    // Everyone but the ghost is served.
    let served = ["tpm", "dev1", "rev1", "helper"]
        .iter()
        .map(|agent_id| AgentCredential { agent_id: (*agent_id).to_owned(), token: tokens[agent_id].clone() })
        .collect();
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), served);
    let mut client = test.execution();
    publish(&mut client, SESSION_PROCESS).await;
    let session = client
        .start_session(StartSessionRequest {
            process_name: "feature-x".into(),
            lead_agent_id: "tpm".into(),
            participants: vec![
                participant("dev1", "developer", "Write endpoint"),
                participant("rev1", "reviewer", "Review PR"),
                participant("ghost", "developer", "Document it"),
            ],
            task: Some(SessionTask {
                title: "Implement feature X".into(),
                description: "An endpoint and its docs".into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let session_id = session.id.clone();
    let shown = session.session.clone().unwrap();
    assert_eq!(shown.task.unwrap().title, "Implement feature X");
    assert_eq!(shown.assignments.len(), 3);

    // The task context reaches every participant and the lead.
    for agent_id in ["tpm", "dev1", "rev1", "ghost"] {
        let started = wait_to_hear(&test, agent_id, &tokens[agent_id], &session_id, EventType::SessionStarted).await;
        assert!(started.detail.contains("Implement feature X"), "{}", started.detail);
        assert!(started.detail.contains("👑 LEAD: tpm"), "{}", started.detail);
        assert!(started.detail.contains("📍 dev1 [DEVELOPER] — Write endpoint"), "{}", started.detail);
        assert_eq!(started.matrix_version, 1);
    }
    assert!(notifications_of(&test, "helper", &tokens["helper"]).await.is_empty(), "not a participant");

    // The developer codes; the review waits for the reviewer.
    let steps = wait_for_steps(&mut client, &session_id, "the endpoint is written", |steps| {
        steps["review"].status() == StepStatus::WaitingApproval
    })
    .await;
    assert_eq!(steps["endpoint"].status(), StepStatus::Completed);

    // The developer sees its role and the session as text.
    let mine = test
        .execution_as(&tokens["dev1"])
        .get_my_role(GetMyRoleRequest { execution_id: session_id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.assignment.as_ref().unwrap().role, "developer");
    assert!(!mine.is_lead);
    assert!(
        mine.permitted_actions.contains(&"code".to_owned()) && !mine.permitted_actions.contains(&"approve".to_owned())
    );
    assert!(mine.context_window.contains("📍 rev1 [REVIEWER] — Review PR"), "{}", mine.context_window);

    // The lead's dashboard: the ghost blocks the docs, the review waits.
    let mut as_lead = test.execution_as(&tokens["tpm"]);
    let dashboard = as_lead
        .get_session_status(GetSessionStatusRequest { execution_id: session_id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert!(
        dashboard
            .blockers
            .iter()
            .any(|blocker| blocker.step_id == "docs" && blocker.reason.contains("ghost, who is offline")),
        "{:#?}",
        dashboard.blockers
    );
    let offline = dashboard
        .suggested_interventions
        .iter()
        .find(|suggestion| suggestion.rule == "assignee_offline")
        .unwrap_or_else(|| panic!("{:#?}", dashboard.suggested_interventions));
    assert_eq!((offline.step_id.as_str(), offline.action()), ("docs", InterventionAction::Reassign));
    assert!(dashboard.suggested_interventions.iter().any(|suggestion| suggestion.rule == "approval_waiting"));
    assert!(!dashboard.recent_activity.is_empty());
    assert!(dashboard.context_window.contains("👑 LEAD: tpm"));
    // Only the lead (and operators) see it.
    let refused = test
        .execution_as(&tokens["dev1"])
        .get_session_status(GetSessionStatusRequest { execution_id: session_id.clone() })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);

    // The lead follows the suggestion: a helper gets a role, and the docs.
    as_lead
        .assign_role(AssignRoleRequest {
            execution_id: session_id.clone(),
            agent_id: "helper".into(),
            role: "developer".into(),
            subtask: "Take over the docs".into(),
        })
        .await
        .unwrap();
    let assigned = wait_to_hear(&test, "helper", &tokens["helper"], &session_id, EventType::RoleAssigned).await;
    assert!(
        assigned.detail.contains("tpm assigned helper the role developer: Take over the docs"),
        "{}",
        assigned.detail
    );
    as_lead
        .intervene(InterveneRequest {
            execution_id: session_id.clone(),
            step_id: "docs".into(),
            action: InterventionAction::Reassign as i32,
            target_agent_id: "helper".into(),
            reason: "ghost is offline".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let reassigned = wait_to_hear(&test, "helper", &tokens["helper"], &session_id, EventType::StepIntervened).await;
    assert!(reassigned.detail.contains("reassigned step 'docs' to helper"), "{}", reassigned.detail);

    // The lead hands over while the review still holds the session open;
    // the new lead closes nothing early, and the reviewer approves.
    as_lead.set_lead(SetLeadRequest { execution_id: session_id.clone(), agent_id: "rev1".into() }).await.unwrap();
    let changed = wait_to_hear(&test, "rev1", &tokens["rev1"], &session_id, EventType::LeadChanged).await;
    assert!(changed.detail.contains("tpm made rev1 the lead in place of tpm"), "{}", changed.detail);
    wait_to_hear(&test, "tpm", &tokens["tpm"], &session_id, EventType::LeadChanged).await;
    test.execution_as(&tokens["rev1"])
        .submit_approval(SubmitApprovalRequest {
            execution_id: session_id.clone(),
            step_id: "review".into(),
            approved: true,
            comment: "ship it".into(),
        })
        .await
        .unwrap();

    let events = events_until_finished(&test.operator("execution"), &session_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32, "{events:#?}");
    // A session that has ended changes lead no more.
    let ended = test
        .execution()
        .set_lead(SetLeadRequest { execution_id: session_id.clone(), agent_id: "tpm".into() })
        .await
        .unwrap_err();
    assert_eq!(ended.code(), Code::FailedPrecondition, "{ended:?}");
    assert!(ended.message().contains("has ended (completed)"), "{}", ended.message());
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_from_start_to_close_on_sqlite() {
    a_session_from_start_to_close(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_from_start_to_close_on_postgres() {
    a_session_from_start_to_close(Backend::Postgres).await;
}

async fn per_agent_limits_travel_with_assignments_and_hold(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let solo = Agent {
        max_iterations: 3,
        allow_delegation: false,
        llm_config: muster_tests::object(r#"{"model":"small"}"#),
        ..agent("solo", "member", "core")
    };
    let tokens = test.register_agents(&[solo, agent("helper", "member", "core")]).await;
    let served = vec![
        AgentCredential { agent_id: "solo".into(), token: tokens[0].clone() },
        AgentCredential { agent_id: "helper".into(), token: tokens[1].clone() },
    ];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), served);
    let mut client = test.execution();
    publish(
        &mut client,
        "name: limits\nsteps:\n\
         \x20 - {id: within, type: agent_task, agent: solo, message: m, inputs: {iterations: 3}}\n\
         \x20 - {id: beyond, type: agent_task, agent: solo, message: m, inputs: {iterations: 4}}\n\
         \x20 - {id: onward, type: agent_task, agent: solo, message: m, inputs: {delegate: {solo: helper}}}\n",
    )
    .await;
    let started = client
        .start_execution(StartExecutionRequest { process_name: "limits".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    events_until_finished(&test.operator("execution"), &started.id).await;
    let steps = step_status(&mut client, &started.id).await;
    let within: serde_json::Value = muster_tests::json_of(&steps["within"].output);
    assert_eq!((within["max_iterations"].as_u64(), within["llm_config"]["model"].as_str()), (Some(3), Some("small")));
    let beyond = steps["beyond"].error.clone().unwrap();
    assert_eq!(beyond.code, "ITERATION_LIMIT", "{beyond:?}");
    assert!(beyond.message.contains("at most 3"), "{}", beyond.message);
    // Without allow_delegation the step stays with solo, who does it.
    let onward: serde_json::Value = muster_tests::json_of(&steps["onward"].output);
    assert_eq!(onward["agent"], "solo");
    assert!(onward["delegation_refused"].as_str().unwrap().contains("does not allow delegation"), "{onward}");
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

/// A worker stream with one hello; the status it was refused with, if any.
async fn hello(client: &mut ExecutionClient, hello: WorkerHello) -> Result<(), tonic::Status> {
    let message = ConnectWorkerRequest { message: Some(connect_worker_request::Message::Hello(hello)) };
    let requests = tokio_stream::StreamExt::chain(tokio_stream::iter([message]), tokio_stream::pending());
    client.connect_worker(requests).await.map(drop)
}

async fn impersonation_attempts_fail(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let tokens = test.register_agents(&[agent("alice", "member", "core"), agent("bob", "member", "core")]).await;
    let tool = ToolSpec { name: "steal".into(), description: String::new(), input_schema: None };

    // A tool-only worker: without a credential, refused; with an agent's
    // whose role lists no such tool, refused; and a call finds no provider.
    let anonymous = hello(
        &mut test.execution_with(muster_runtime::auth::client::Credentials::none()),
        WorkerHello { worker_name: "thief".into(), tools: vec![tool.clone()], ..Default::default() },
    )
    .await
    .unwrap_err();
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    let unentitled = hello(
        &mut test.execution_as(&tokens[1]),
        WorkerHello { worker_name: "thief".into(), tools: vec![tool.clone()], ..Default::default() },
    )
    .await
    .unwrap_err();
    assert_eq!(unentitled.code(), Code::PermissionDenied, "{unentitled:?}");
    assert_eq!(unentitled.get_details_error_info().unwrap().reason, "NOT_ENTITLED_TO_TOOL");
    let call = test
        .execution_as(&tokens[0])
        .invoke_tool(InvokeToolRequest {
            tool: "steal".into(),
            input: muster_tests::object("{}"),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .output
        .unwrap();
    assert_eq!(call.status_code, 403, "alice's role does not list the tool either: {call:?}");
    let tools = test.execution().list_tools(execution::ListToolsRequest::default()).await.unwrap().into_inner().tools;
    assert!(tools.iter().all(|tool| tool.name != "steal"), "nobody provides it: {tools:?}");

    // Serving another agent's assignments: bob's token does not make him alice.
    let stolen = hello(
        &mut test.execution_as(&tokens[1]),
        WorkerHello {
            worker_name: "impostor".into(),
            agents: vec![ServedAgent { agent_id: "alice".into(), token: tokens[1].clone() }],
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    assert_eq!(stolen.code(), Code::PermissionDenied, "{stolen:?}");
    assert!(stolen.message().contains("does not belong to it"), "{}", stolen.message());

    // Approving as an informed agent.
    let mut client = test.execution();
    publish(
        &mut client,
        "name: gate\nsteps:\n  - {id: gate, type: human_approval, roles: {executor: alice, informed: [bob]}}\n",
    )
    .await;
    let started = client
        .start_execution(StartExecutionRequest { process_name: "gate".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    wait_for_steps(&mut client, &started.id, "the gate waits", |steps| {
        steps["gate"].status() == StepStatus::WaitingApproval
    })
    .await;
    let informed = test
        .execution_as(&tokens[1])
        .submit_approval(SubmitApprovalRequest {
            execution_id: started.id.clone(),
            step_id: "gate".into(),
            approved: true,
            comment: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(informed.code(), Code::PermissionDenied);
    assert_eq!(informed.get_details_error_info().unwrap().reason, "NOT_AN_APPROVER");
    assert_eq!(step_status(&mut client, &started.id).await["gate"].status(), StepStatus::WaitingApproval);

    // Handing on a step one does not hold: bob, serving himself, names
    // alice's running assignment; the step stays with alice.
    let (stop, worker) = spawn_sample_worker(
        test.operator("execution"),
        vec![AgentCredential { agent_id: "alice".into(), token: tokens[0].clone() }],
    );
    publish(
        &mut client,
        "name: held\nsteps:\n  - {id: long, type: agent_task, agent: alice, message: m, inputs: {sleep_ms: 600000}}\n",
    )
    .await;
    let held = client
        .start_execution(StartExecutionRequest { process_name: "held".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    wait_for_steps(&mut client, &held.id, "alice's step runs", |steps| steps["long"].status() == StepStatus::Running)
        .await;
    let (requests, outbound) = tokio::sync::mpsc::channel(4);
    let say = |message| ConnectWorkerRequest { message: Some(message) };
    requests
        .send(say(connect_worker_request::Message::Hello(WorkerHello {
            worker_name: "hijacker".into(),
            agents: vec![ServedAgent { agent_id: "bob".into(), token: tokens[1].clone() }],
            ..Default::default()
        })))
        .await
        .unwrap();
    requests
        .send(say(connect_worker_request::Message::Delegate(execution::DelegateStep {
            assignment_id: format!("{}/long/1", held.id),
            to_agent_id: "bob".into(),
            ..Default::default()
        })))
        .await
        .unwrap();
    let mut answers = test
        .execution_as(&tokens[1])
        .connect_worker(tokio_stream::wrappers::ReceiverStream::new(outbound))
        .await
        .unwrap()
        .into_inner();
    let refusal = loop {
        match answers.message().await.unwrap().and_then(|answer| answer.message) {
            Some(execution::connect_worker_response::Message::Delegation(outcome)) => break outcome,
            Some(_) => {}
            None => panic!("the stream ended without an answer"),
        }
    };
    assert!(!refusal.accepted, "{refusal:?}");
    assert!(refusal.reason.contains("does not hold"), "{}", refusal.reason);
    let steps = step_status(&mut client, &held.id).await;
    assert_eq!((steps["long"].status(), steps["long"].executor.as_str()), (StepStatus::Running, "alice"));
    drop(requests);
    client
        .cancel_execution(execution::CancelExecutionRequest { id: held.id.clone(), reason: "done".into() })
        .await
        .unwrap();
    let _ = stop.send(());
    worker.await.unwrap().unwrap();

    // Changing an agent's role without operator rights.
    let promoted = test
        .roster_as(&tokens[1])
        .update_agent(UpdateAgentRequest {
            agent: Some(Agent { role: "lead".into(), ..agent("bob", "member", "core") }),
            update_mask: None,
        })
        .await
        .unwrap_err();
    assert_eq!(promoted.code(), Code::PermissionDenied);
    let bob = test.roster().get_agent(muster_proto::roster::v1::GetAgentRequest { id: "bob".into() }).await.unwrap();
    assert_eq!(bob.into_inner().agent.unwrap().role, "member");
    test.shutdown().await;
}

async fn a_revoked_agent_leaves_its_worker_within_five_seconds(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let toolsmith = muster_proto::roster::v1::RoleDefinition {
        name: "toolsmith".into(),
        tools: vec!["grep".into()],
        ..Default::default()
    };
    test.roster()
        .put_role_definition(muster_proto::roster::v1::PutRoleDefinitionRequest { role: Some(toolsmith) })
        .await
        .unwrap();
    let tokens = test
        .register_agents(&[
            agent("carol", "member", "core"),
            agent("dave", "member", "core"),
            agent("smith", "toolsmith", "core"),
        ])
        .await;
    // A tool-only worker connected with smith's token, offering a tool its role lists.
    let grep = ToolSpec { name: "grep".into(), description: String::new(), input_schema: None };
    let hello = ConnectWorkerRequest {
        message: Some(connect_worker_request::Message::Hello(WorkerHello {
            worker_name: "tools".into(),
            tools: vec![grep],
            ..Default::default()
        })),
    };
    let mut tool_stream = test
        .execution_as(&tokens[2])
        .connect_worker(tokio_stream::StreamExt::chain(tokio_stream::iter([hello]), tokio_stream::pending()))
        .await
        .unwrap()
        .into_inner();
    tool_stream.message().await.unwrap().expect("a welcome");
    let listed = client_tools(&test).await;
    assert!(listed.contains(&"grep".to_owned()), "{listed:?}");
    let served = vec![
        AgentCredential { agent_id: "carol".into(), token: tokens[0].clone() },
        AgentCredential { agent_id: "dave".into(), token: tokens[1].clone() },
    ];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), served);
    let mut client = test.execution();
    publish(
        &mut client,
        "name: revoked\nsteps:\n\
         \x20 - {id: long, type: agent_task, agent: carol, message: m, inputs: {sleep_ms: 600000}}\n\
         \x20 - {id: other, type: agent_task, agent: dave, message: m, inputs: {sleep_ms: 1500}}\n",
    )
    .await;
    let started = client
        .start_execution(StartExecutionRequest { process_name: "revoked".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    wait_for_steps(&mut client, &started.id, "carol's step runs", |steps| {
        steps["long"].status() == StepStatus::Running && steps["long"].attempt == 1
    })
    .await;
    let revoked_at = tokio::time::Instant::now();
    test.roster().revoke_token(RevokeTokenRequest { agent_id: "carol".into() }).await.unwrap();
    test.roster().revoke_token(RevokeTokenRequest { agent_id: "smith".into() }).await.unwrap();
    // The connection opened with smith's token ends, and its tool with it.
    let ended = loop {
        match tool_stream.message().await {
            Ok(Some(_)) => {}
            Ok(None) => panic!("the stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert_eq!(ended.get_details_error_info().unwrap().reason, "CREDENTIAL_REVOKED");
    assert!(revoked_at.elapsed() < Duration::from_secs(5), "disconnected after {:?}", revoked_at.elapsed());
    let listed = client_tools(&test).await;
    assert!(!listed.contains(&"grep".to_owned()), "{listed:?}");
    // Carol's assignment is withdrawn from the worker: the step waits for
    // another attempt, which no worker may take now.
    wait_for_steps(&mut client, &started.id, "carol's attempt is withdrawn", |steps| steps["long"].attempt >= 2).await;
    assert!(revoked_at.elapsed() < Duration::from_secs(5), "withdrawn after {:?}", revoked_at.elapsed());
    // The worker serves dave all along.
    let steps = wait_for_steps(&mut client, &started.id, "dave's step completes", |steps| {
        steps["other"].status() == StepStatus::Completed
    })
    .await;
    assert_ne!(steps["long"].status(), StepStatus::Completed);
    client
        .cancel_execution(execution::CancelExecutionRequest { id: started.id.clone(), reason: "done".into() })
        .await
        .unwrap();
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_agent_limits_travel_with_assignments_and_hold_on_sqlite() {
    per_agent_limits_travel_with_assignments_and_hold(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_agent_limits_travel_with_assignments_and_hold_on_postgres() {
    per_agent_limits_travel_with_assignments_and_hold(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_attempts_fail_on_sqlite() {
    impersonation_attempts_fail(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impersonation_attempts_fail_on_postgres() {
    impersonation_attempts_fail(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_agent_leaves_its_worker_within_five_seconds_on_sqlite() {
    a_revoked_agent_leaves_its_worker_within_five_seconds(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_agent_leaves_its_worker_within_five_seconds_on_postgres() {
    a_revoked_agent_leaves_its_worker_within_five_seconds(Backend::Postgres).await;
}

/// Outside sessions the matrix governs the roles it names: an agent whose
/// roster role is one of them is held to it, in CheckRole and in the real
/// action alike; an agent whose role it does not name is held to the
/// step's roles only.
async fn outside_sessions_the_matrix_governs_its_own_roles(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let agents = [agent("rev", "reviewer", "core"), agent("dev", "developer", "core"), agent("wri", "writer", "core")];
    let tokens: HashMap<&str, String> =
        ["rev", "dev", "wri"].into_iter().zip(test.register_agents(&agents).await).collect();
    let served = tokens
        .iter()
        .map(|(agent_id, token)| AgentCredential { agent_id: (*agent_id).to_owned(), token: token.clone() });
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), served.collect());
    let mut client = test.execution();
    publish(
        &mut client,
        "name: governed\nsteps:\n\
         \x20 - {id: code-by-reviewer, type: agent_task, agent: rev, message: m, action: code}\n\
         \x20 - {id: code-by-developer, type: agent_task, agent: dev, message: m, action: code}\n\
         \x20 - {id: code-by-writer, type: agent_task, agent: wri, message: m, action: code}\n\
         \x20 - {id: long, type: agent_task, agent: wri, message: m, inputs: {sleep_ms: 600000}, roles: {executor: wri, monitors: [rev, wri]}}\n\
         \x20 - {id: gate, type: human_approval, roles: {executor: rev}}\n",
    )
    .await;
    let started = client
        .start_execution(StartExecutionRequest { process_name: "governed".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let steps = wait_for_steps(&mut client, &started.id, "the code steps end and the gate waits", |steps| {
        ["code-by-reviewer", "code-by-developer", "code-by-writer"].iter().all(|id| is_final(&steps[*id]))
            && steps["long"].status() == StepStatus::Running
            && steps["gate"].status() == StepStatus::WaitingApproval
    })
    .await;
    let refused = steps["code-by-reviewer"].error.clone().unwrap();
    assert_eq!(refused.code, "PERMISSION_DENIED", "{refused:?}");
    assert!(refused.message.contains("rev may not 'code'"), "{}", refused.message);
    assert_eq!(steps["code-by-developer"].status(), StepStatus::Completed);
    assert_eq!(steps["code-by-writer"].status(), StepStatus::Completed, "the writer's role is not governed");

    for (agent_id, allowed, decided_by) in [("rev", false, RoleCheck::Action), ("wri", true, RoleCheck::NotGoverned)] {
        let verdict = client
            .check_role(CheckRoleRequest {
                execution_id: started.id.clone(),
                action: "unblock".into(),
                agent_id: agent_id.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((verdict.allowed, verdict.decided_by()), (allowed, decided_by), "{verdict:?}");
        let paused = test
            .execution_as(&tokens[agent_id])
            .intervene(InterveneRequest {
                execution_id: started.id.clone(),
                step_id: "long".into(),
                action: InterventionAction::Pause as i32,
                ..Default::default()
            })
            .await;
        match paused {
            Ok(_) => assert!(allowed, "{agent_id} paused the step"),
            Err(status) => {
                assert!(!allowed, "{agent_id} was refused: {status:?}");
                let info = status.get_details_error_info().unwrap();
                assert_eq!(
                    (info.reason.as_str(), info.metadata["matrix_version"].as_str()),
                    ("ROLE_FORBIDS_ACTION", "1")
                );
            }
        }
    }
    // The reviewer may approve.
    test.execution_as(&tokens["rev"])
        .submit_approval(SubmitApprovalRequest {
            execution_id: started.id.clone(),
            step_id: "gate".into(),
            approved: true,
            comment: String::new(),
        })
        .await
        .unwrap();
    client
        .cancel_execution(execution::CancelExecutionRequest { id: started.id.clone(), reason: "done".into() })
        .await
        .unwrap();
    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_sessions_the_matrix_governs_its_own_roles_on_sqlite() {
    outside_sessions_the_matrix_governs_its_own_roles(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_sessions_the_matrix_governs_its_own_roles_on_postgres() {
    outside_sessions_the_matrix_governs_its_own_roles(Backend::Postgres).await;
}

/// The team protocol's `start_session` is "called by Lead": an agent starts
/// a session that names it as lead, when the matrix lets `lead` `create_task`;
/// not one that names another lead.
async fn a_lead_starts_its_own_session(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let names = ["boss", "dev"];
    let agents: Vec<Agent> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    publish(&mut client, "name: led\nsteps:\n  - {id: gate, type: human_approval, roles: {executor: boss}}\n").await;
    let request = |lead: &str| StartSessionRequest {
        process_name: "led".into(),
        lead_agent_id: lead.into(),
        participants: vec![participant("dev", "developer", "Write it")],
        task: Some(SessionTask { title: "Led by its lead".into(), description: String::new() }),
        ..Default::default()
    };
    let mut as_boss = test.execution_as(&tokens["boss"]);
    let started = as_boss.start_session(request("boss")).await.unwrap().into_inner().execution.unwrap();
    assert_eq!(started.lead_agent_id, "boss");
    wait_to_hear(&test, "dev", &tokens["dev"], &started.id, EventType::SessionStarted).await;

    // Not a session another agent leads, and not the developer's own.
    for (token, lead) in [(&tokens["dev"], "boss"), (&tokens["boss"], "dev")] {
        let refused = test.execution_as(token).start_session(request(lead)).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert_eq!(refused.get_details_error_info().unwrap().reason, "NOT_THE_LEAD");
    }
    // The matrix decides `create_task` for the lead.
    client
        .put_permission_matrix(execution::PutPermissionMatrixRequest {
            source: "roles:\n  lead:\n    can: [assign_role]\n  developer:\n    can: [code]\n".into(),
        })
        .await
        .unwrap();
    let refused = as_boss.start_session(request("boss")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let info = refused.get_details_error_info().unwrap();
    assert_eq!((info.reason.as_str(), info.metadata["matrix_version"].as_str()), ("ROLE_FORBIDS_ACTION", "2"));
    // Operators still start sessions for anyone.
    let mut as_operator = test.execution();
    let mut by_operator = request("boss");
    by_operator.participants.clear();
    as_operator.start_session(by_operator).await.unwrap();
    // A session whose step goes to an agent without a role in it would fail
    // that step: it does not start.
    publish(
        &mut client,
        "name: unled\nsteps:\n  - {id: build, type: agent_task, agent: dev, message: Build, roles: {executor: dev}}\n",
    )
    .await;
    let unassigned = StartSessionRequest { process_name: "unled".into(), participants: Vec::new(), ..request("boss") };
    let refused = as_operator.start_session(unassigned.clone()).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert_eq!(
        refused.get_details_precondition_failure().unwrap().violations[0].r#type,
        "SESSION_EXECUTORS_NOT_ALLOWED"
    );
    assert!(refused.message().contains("step 'build': dev is not assigned in this session"), "{}", refused.message());
    let assigned =
        StartSessionRequest { participants: vec![participant("dev", "developer", "Build it")], ..unassigned };
    as_operator.start_session(assigned).await.unwrap();
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_starts_its_own_session_on_sqlite() {
    a_lead_starts_its_own_session(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_starts_its_own_session_on_postgres() {
    a_lead_starts_its_own_session(Backend::Postgres).await;
}

/// An architect asks the lead for a subtask; nothing is assigned until the
/// lead decides. Approved, it is the named agent's assignment (and it hears
/// of it); rejected, nothing changes; both are recorded, listed on the
/// dashboard and told to those concerned.
async fn a_subtask_waits_for_the_leads_approval(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let names = ["boss", "arch", "dev", "newbie"];
    let agents: Vec<Agent> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    publish(&mut client, "name: split\nsteps:\n  - {id: gate, type: human_approval, roles: {executor: boss}}\n").await;
    let session = muster_tests::start_session(
        &mut client,
        StartSessionRequest {
            process_name: "split".into(),
            lead_agent_id: "boss".into(),
            participants: vec![
                participant("arch", "architect", "Design it"),
                participant("dev", "developer", "Build it"),
            ],
            task: Some(SessionTask { title: "Split the work".into(), description: String::new() }),
            ..Default::default()
        },
    )
    .await;
    let ask = |agent_id: &str, role: &str, subtask: &str| RequestSubtaskRequest {
        execution_id: session.clone(),
        agent_id: agent_id.into(),
        role: role.into(),
        subtask: subtask.into(),
        reason: "the schema changes".into(),
    };
    let (mut as_arch, mut as_dev, mut as_boss) =
        (test.execution_as(&tokens["arch"]), test.execution_as(&tokens["dev"]), test.execution_as(&tokens["boss"]));

    // A developer's role may not create subtasks; a stranger takes no part.
    let refused = as_dev.request_subtask(ask("newbie", "developer", "Write the migration")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert_eq!(refused.get_details_error_info().unwrap().reason, "ROLE_FORBIDS_ACTION");
    let refused =
        test.execution_as(&tokens["newbie"]).request_subtask(ask("newbie", "developer", "Me")).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // What cannot be asked: the lead's role, no role for an agent without one, nothing to do.
    for (request, field) in [
        (ask("newbie", "lead", "Lead it"), "role"),
        (ask("newbie", "", "Anything"), "role"),
        (ask("boss", "developer", "Lead's work"), "agent_id"),
        (ask("newbie", "developer", "  "), "subtask"),
    ] {
        let refused = as_arch.request_subtask(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert_eq!(refused.get_details_bad_request().unwrap().field_violations[0].field, field);
    }

    // The architect asks; the lead and the agent named hear of it; nothing is assigned yet.
    let asked = as_arch
        .request_subtask(ask("newbie", "developer", "Write the migration"))
        .await
        .unwrap()
        .into_inner()
        .request
        .unwrap();
    assert_eq!(
        (asked.requested_by.as_str(), asked.agent_id.as_str(), asked.status),
        ("arch", "newbie", SubtaskStatus::Pending as i32)
    );
    let heard = wait_to_hear(&test, "boss", &tokens["boss"], &session, EventType::SubtaskRequested).await;
    assert!(heard.detail.contains("Write the migration"), "{}", heard.detail);
    wait_to_hear(&test, "newbie", &tokens["newbie"], &session, EventType::SubtaskRequested).await;
    let role = |token: &str| {
        let mut client = test.execution_as(token);
        let execution_id = session.clone();
        async move {
            client.get_my_role(GetMyRoleRequest { execution_id }).await.map(|answer| answer.into_inner().assignment)
        }
    };
    assert!(role(&tokens["newbie"]).await.is_err(), "not a participant before the approval");

    // Only the lead (or an operator) decides.
    let decide = |request_id: &str, approve: bool, note: &str| DecideSubtaskRequest {
        execution_id: session.clone(),
        request_id: request_id.into(),
        approve,
        note: note.into(),
    };
    for as_other in [&mut as_arch, &mut as_dev] {
        let refused = as_other.decide_subtask(decide(&asked.id, true, "")).await.unwrap_err();
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert_eq!(refused.get_details_error_info().unwrap().reason, "NOT_THE_LEAD");
    }
    let decided = as_boss.decide_subtask(decide(&asked.id, true, "go ahead")).await.unwrap().into_inner();
    assert_eq!(decided.request.as_ref().unwrap().status, SubtaskStatus::Approved as i32);
    assert_eq!(decided.request.as_ref().unwrap().decided_by, "boss");
    let assignment = role(&tokens["newbie"]).await.unwrap().unwrap();
    assert_eq!(
        (assignment.role.as_str(), assignment.subtask.as_str(), assignment.assigned_by.as_str()),
        ("developer", "Write the migration", "boss")
    );
    let heard = wait_to_hear(&test, "arch", &tokens["arch"], &session, EventType::SubtaskDecided).await;
    assert!(heard.detail.contains("approved") && heard.detail.contains("go ahead"), "{}", heard.detail);
    wait_to_hear(&test, "newbie", &tokens["newbie"], &session, EventType::RoleAssigned).await;
    // A decision is made once.
    let again = as_boss.decide_subtask(decide(&asked.id, false, "")).await.unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition, "{again:?}");
    assert_eq!(again.get_details_precondition_failure().unwrap().violations[0].r#type, "SUBTASK_DECIDED");
    let missing = as_boss.decide_subtask(decide("no-such-request", true, "")).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound, "{missing:?}");

    // Rejected: the architect keeps its role and subtask (its own role, as none was named).
    let own = as_arch.request_subtask(ask("", "", "Also design the API")).await.unwrap().into_inner().request.unwrap();
    assert_eq!((own.agent_id.as_str(), own.role.as_str()), ("arch", "architect"));
    let rejected = client.decide_subtask(decide(&own.id, false, "not now")).await.unwrap().into_inner();
    assert_eq!(rejected.request.unwrap().status, SubtaskStatus::Rejected as i32);
    assert!(rejected.assignment.is_none());
    assert_eq!(role(&tokens["arch"]).await.unwrap().unwrap().subtask, "Design it");

    // The dashboard lists both, as stored.
    let dashboard = as_boss
        .get_session_status(GetSessionStatusRequest { execution_id: session.clone() })
        .await
        .unwrap()
        .into_inner();
    let listed: Vec<(&str, i32, &str)> = dashboard
        .subtask_requests
        .iter()
        .map(|request| (request.subtask.as_str(), request.status, request.decided_by.split(':').next().unwrap()))
        .collect();
    assert_eq!(
        listed,
        [
            ("Write the migration", SubtaskStatus::Approved as i32, "boss"),
            ("Also design the API", SubtaskStatus::Rejected as i32, "operator")
        ]
    );

    // A session keeps at most 100 requests.
    for index in 2..100 {
        as_arch.request_subtask(ask("dev", "", &format!("Part {index}"))).await.unwrap();
    }
    let full = as_arch.request_subtask(ask("dev", "", "One too many")).await.unwrap_err();
    assert_eq!(full.code(), Code::FailedPrecondition, "{full:?}");
    assert_eq!(full.get_details_precondition_failure().unwrap().violations[0].r#type, "TOO_MANY_SUBTASK_REQUESTS");
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subtask_waits_for_the_leads_approval_on_sqlite() {
    a_subtask_waits_for_the_leads_approval(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subtask_waits_for_the_leads_approval_on_postgres() {
    a_subtask_waits_for_the_leads_approval(Backend::Postgres).await;
}

/// Outside sessions the actions a roster role lists bind its agents at run
/// time, as at publish: the sample writer role does not list `approve`, so
/// a writer neither approves nor hears from CheckRole that it may.
async fn a_roster_roles_actions_bind_outside_sessions(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let mut roster = test.roster();
    for (name, actions) in
        [("writer", ["code", "report_done", "request_review"]), ("editor", ["review", "approve", "request_changes"])]
    {
        let role = muster_proto::roster::v1::RoleDefinition {
            name: name.into(),
            permitted_actions: actions.iter().map(|action| (*action).to_owned()).collect(),
            ..Default::default()
        };
        roster
            .put_role_definition(muster_proto::roster::v1::PutRoleDefinitionRequest { role: Some(role) })
            .await
            .unwrap();
    }
    let names = ["wri", "edi"];
    let agents = [agent("wri", "writer", "core"), agent("edi", "editor", "core")];
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    publish(
        &mut client,
        "name: drafts\nsteps:\n\
         \x20 - {id: by-writer, type: human_approval, roles: {executor: wri}}\n\
         \x20 - {id: by-editor, type: human_approval, roles: {executor: edi}}\n",
    )
    .await;
    let started = client
        .start_execution(StartExecutionRequest { process_name: "drafts".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    wait_for_steps(&mut client, &started.id, "both gates wait", |steps| {
        steps["by-writer"].status() == StepStatus::WaitingApproval
            && steps["by-editor"].status() == StepStatus::WaitingApproval
    })
    .await;
    for (agent_id, step_id, allowed) in [("wri", "by-writer", false), ("edi", "by-editor", true)] {
        let mut as_agent = test.execution_as(&tokens[agent_id]);
        for execution_id in [String::new(), started.id.clone()] {
            let verdict = as_agent
                .check_role(CheckRoleRequest { execution_id, action: "approve".into(), agent_id: String::new() })
                .await
                .unwrap()
                .into_inner();
            assert_eq!(verdict.allowed, allowed, "{verdict:?}");
            if !allowed {
                assert_eq!(verdict.decided_by(), RoleCheck::RosterRole, "{verdict:?}");
                assert!(verdict.reason.contains("code, report_done, request_review"), "{}", verdict.reason);
            }
        }
        let decided = as_agent
            .submit_approval(SubmitApprovalRequest {
                execution_id: started.id.clone(),
                step_id: step_id.into(),
                approved: true,
                comment: String::new(),
            })
            .await;
        match decided {
            Ok(_) => assert!(allowed, "{agent_id} approved"),
            Err(status) => {
                assert!(!allowed, "{agent_id} was refused: {status:?}");
                assert_eq!(status.code(), Code::PermissionDenied);
                assert_eq!(status.get_details_error_info().unwrap().reason, "ROSTER_ROLE_FORBIDS_ACTION");
            }
        }
    }
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_roles_actions_bind_outside_sessions_on_sqlite() {
    a_roster_roles_actions_bind_outside_sessions(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_roster_roles_actions_bind_outside_sessions_on_postgres() {
    a_roster_roles_actions_bind_outside_sessions(Backend::Postgres).await;
}

/// The lead's dashboard suggests only what the service would do: it names
/// as approvers those SubmitApproval accepts (in a session, assigned with a
/// role that may approve), suggests no RETRY of a refused step, and
/// nothing once the execution has ended.
async fn the_dashboard_suggests_only_what_would_be_accepted(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let names = ["boss", "rev", "outsider"];
    let agents: Vec<Agent> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: HashMap<&str, String> = names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    publish(
        &mut client,
        "name: honest\nsteps:\n\
         \x20 - {id: gate, type: human_approval, roles: {executor: outsider, monitors: [rev]}}\n\
         \x20 - {id: code-by-reviewer, type: agent_task, agent: rev, message: m, action: code}\n",
    )
    .await;
    let session = client
        .start_session(StartSessionRequest {
            process_name: "honest".into(),
            lead_agent_id: "boss".into(),
            participants: vec![participant("rev", "reviewer", "Review it")],
            task: Some(SessionTask { title: "Honest dashboard".into(), description: String::new() }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap();
    let steps = wait_for_steps(&mut client, &session.id, "the gate waits and the refused step fails", |steps| {
        steps["gate"].status() == StepStatus::WaitingApproval && is_final(&steps["code-by-reviewer"])
    })
    .await;
    assert_eq!(steps["code-by-reviewer"].error.as_ref().unwrap().code, "PERMISSION_DENIED");
    // The outsider is not assigned in the session: SubmitApproval refuses it.
    let refused = test
        .execution_as(&tokens["outsider"])
        .submit_approval(SubmitApprovalRequest {
            execution_id: session.id.clone(),
            step_id: "gate".into(),
            approved: true,
            comment: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");

    let mut as_lead = test.execution_as(&tokens["boss"]);
    let dashboard = as_lead
        .get_session_status(GetSessionStatusRequest { execution_id: session.id.clone() })
        .await
        .unwrap()
        .into_inner();
    let reminder = dashboard.suggested_interventions.iter().find(|suggestion| suggestion.step_id == "gate").unwrap();
    assert_eq!(reminder.text, "remind rev to decide step 'gate'", "{reminder:?}");
    let refused_step =
        dashboard.suggested_interventions.iter().find(|suggestion| suggestion.step_id == "code-by-reviewer").unwrap();
    assert_ne!(refused_step.action(), InterventionAction::Retry, "{refused_step:?}");

    client
        .cancel_execution(execution::CancelExecutionRequest { id: session.id.clone(), reason: "done".into() })
        .await
        .unwrap();
    let ended = as_lead
        .get_session_status(GetSessionStatusRequest { execution_id: session.id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ended.status(), ExecutionStatus::Cancelled);
    assert!(ended.suggested_interventions.is_empty(), "{:?}", ended.suggested_interventions);
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_suggests_only_what_would_be_accepted_on_sqlite() {
    the_dashboard_suggests_only_what_would_be_accepted(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_suggests_only_what_would_be_accepted_on_postgres() {
    the_dashboard_suggests_only_what_would_be_accepted(Backend::Postgres).await;
}
