//! Who may call what, over every RPC of the four services, through real
//! gRPC to the four real processes: a table with one row per RPC and one
//! expected code per kind of caller — no credential, a garbage one, a
//! revoked agent token, another agent, the right agent, an operator and a
//! service. A new RPC without a row fails the test.

use std::time::{Duration, Instant};

use muster_proto::{
    common::v1::{EventType, StepEvent},
    execution::v1::{self as execution, GetExecutionRequest, StepStatus},
    notifier::v1 as notifier,
    roster::v1 as roster,
    validator::v1 as validator,
};
use muster_runtime::auth::client::Credentials;
use muster_tests::{
    Backend, TestCluster, agent,
    raw::{self, Method},
};
use prost::Message as _;
use tonic::Code::{self, FailedPrecondition, InvalidArgument, NotFound, Ok as OK, PermissionDenied as PD};
use tonic_types::StatusExt as _;

const PROCESS: &str = "\
name: auth-process
steps:
  - id: gate
    type: human_approval
    roles: {executor: alice, informed: [dave]}
";

/// What the requests refer to.
struct Fixture {
    tokens: std::collections::HashMap<&'static str, String>,
    /// An execution alice leads and executes a step of; its other copies
    /// take the calls that change them.
    execution: String,
    to_approve: String,
    to_cancel: String,
    to_pause: String,
    to_relead: String,
    session: String,
}

/// One RPC: its request, whose token is "the right agent", and the expected
/// code for another agent, the right agent, an operator and a service
/// (anonymous, garbage and revoked credentials are always UNAUTHENTICATED).
struct Row {
    method: &'static str,
    subject: &'static str,
    request: fn(&Fixture) -> Vec<u8>,
    expected: [Code; 4],
}

const fn row(method: &'static str, request: fn(&Fixture) -> Vec<u8>, expected: [Code; 4]) -> Row {
    Row { method, subject: "alice", request, expected }
}

fn alice_agent() -> roster::Agent {
    roster::Agent {
        id: "alice".into(),
        name: "alice".into(),
        role: "member".into(),
        team: "core".into(),
        ..Default::default()
    }
}

fn event() -> StepEvent {
    StepEvent {
        event_id: "table-event".into(),
        sequence: 1,
        event_type: EventType::StepCompleted as i32,
        occurred_at: Some(muster_runtime::time::to_timestamp(muster_runtime::time::now_millis())),
        execution_id: "table".into(),
        step_id: "s".into(),
        ..Default::default()
    }
}

const ALL: [Code; 4] = [OK, OK, OK, OK];
const OPERATORS: [Code; 4] = [PD, PD, OK, PD];

fn table() -> Vec<Row> {
    vec![
        // The roster.
        row(
            "RosterService/RegisterAgent",
            |_| {
                roster::RegisterAgentRequest {
                    agent: Some(roster::Agent { id: "by-operator".into(), ..Default::default() }),
                }
                .encode_to_vec()
            },
            OPERATORS,
        ),
        row("RosterService/GetAgent", |_| roster::GetAgentRequest { id: "alice".into() }.encode_to_vec(), ALL),
        row("RosterService/ListAgents", |_| roster::ListAgentsRequest::default().encode_to_vec(), ALL),
        row(
            "RosterService/UpdateAgent",
            |_| roster::UpdateAgentRequest { agent: Some(alice_agent()), update_mask: None }.encode_to_vec(),
            OPERATORS,
        ),
        row(
            "RosterService/RemoveAgent",
            |_| roster::RemoveAgentRequest { id: "victim".into() }.encode_to_vec(),
            OPERATORS,
        ),
        row(
            "RosterService/SetAgentStatus",
            |_| roster::SetAgentStatusRequest { id: "alice".into(), ..Default::default() }.encode_to_vec(),
            [PD, OK, OK, PD],
        ),
        row(
            "RosterService/PutTeam",
            |_| {
                roster::PutTeamRequest { team: Some(roster::Team { name: "by-operator".into(), ..Default::default() }) }
                    .encode_to_vec()
            },
            OPERATORS,
        ),
        row("RosterService/ListTeams", |_| roster::ListTeamsRequest::default().encode_to_vec(), ALL),
        row(
            "RosterService/RemoveTeam",
            |_| roster::RemoveTeamRequest { name: "empty".into() }.encode_to_vec(),
            OPERATORS,
        ),
        row(
            "RosterService/PutRoleDefinition",
            |_| {
                roster::PutRoleDefinitionRequest {
                    role: Some(roster::RoleDefinition { name: "by-operator".into(), ..Default::default() }),
                }
                .encode_to_vec()
            },
            OPERATORS,
        ),
        row(
            "RosterService/GetRoleDefinition",
            |_| roster::GetRoleDefinitionRequest { name: "member".into() }.encode_to_vec(),
            ALL,
        ),
        row(
            "RosterService/ListRoleDefinitions",
            |_| roster::ListRoleDefinitionsRequest::default().encode_to_vec(),
            ALL,
        ),
        row(
            "RosterService/RemoveRoleDefinition",
            |_| roster::RemoveRoleDefinitionRequest { name: "doomed".into() }.encode_to_vec(),
            OPERATORS,
        ),
        row(
            "RosterService/ImportRoster",
            |_| {
                roster::ImportRosterRequest {
                    files: vec![roster::ImportFile {
                        name: "teams.yaml".into(),
                        content: "teams:\n  - name: imported\n".into(),
                    }],
                    dry_run: true,
                }
                .encode_to_vec()
            },
            OPERATORS,
        ),
        row(
            "RosterService/GetOrganizationRoster",
            |_| roster::GetOrganizationRosterRequest { agent_id: "alice".into(), ..Default::default() }.encode_to_vec(),
            [PD, OK, OK, OK],
        ),
        row(
            "RosterService/Delegate",
            |_| {
                roster::DelegateRequest {
                    task_id: "t".into(),
                    requester_id: "alice".into(),
                    dry_run: true,
                    ..Default::default()
                }
                .encode_to_vec()
            },
            [PD, OK, OK, OK],
        ),
        row(
            "RosterService/DelegateBatch",
            |_| roster::DelegateBatchRequest { requests: Vec::new() }.encode_to_vec(),
            [PD, PD, OK, OK],
        ),
        row(
            "RosterService/ReleaseTask",
            |_| roster::ReleaseTaskRequest { task_id: "nothing".into() }.encode_to_vec(),
            [PD, PD, OK, OK],
        ),
        row(
            "RosterService/ReleaseTasks",
            |_| roster::ReleaseTasksRequest { task_ids: vec!["nothing".into()] }.encode_to_vec(),
            [PD, PD, OK, OK],
        ),
        row(
            "RosterService/PlaceTasks",
            |_| {
                roster::PlaceTasksRequest { id: 1, release_task_ids: vec!["nothing".into()], ..Default::default() }
                    .encode_to_vec()
            },
            [PD, PD, OK, OK],
        ),
        row(
            "RosterService/WatchQueuedTask",
            |_| roster::WatchQueuedTaskRequest { task_id: "nothing".into() }.encode_to_vec(),
            [PD, PD, NotFound, NotFound],
        ),
        row(
            "RosterService/ListDelegations",
            |_| roster::ListDelegationsRequest { agent_id: "alice".into(), ..Default::default() }.encode_to_vec(),
            [PD, OK, OK, OK],
        ),
        row("RosterService/WatchRoster", |_| roster::WatchRosterRequest::default().encode_to_vec(), ALL),
        row(
            "RosterService/RenderSystemPrompt",
            |_| roster::RenderSystemPromptRequest { agent_id: "alice".into() }.encode_to_vec(),
            [PD, OK, OK, OK],
        ),
        row(
            "RosterService/Authenticate",
            |fixture| roster::AuthenticateRequest { token: fixture.tokens["alice"].clone() }.encode_to_vec(),
            [PD, OK, OK, OK],
        ),
        Row {
            method: "RosterService/RotateToken",
            subject: "frank",
            request: |_| roster::RotateTokenRequest { agent_id: "frank".into() }.encode_to_vec(),
            expected: [PD, OK, OK, PD],
        },
        Row {
            method: "RosterService/RevokeToken",
            subject: "grace",
            request: |_| roster::RevokeTokenRequest { agent_id: "grace".into() }.encode_to_vec(),
            expected: [PD, OK, OK, PD],
        },
        row(
            "CredentialService/WatchCredentials",
            |_| roster::WatchCredentialsRequest::default().encode_to_vec(),
            [PD, PD, PD, OK],
        ),
        // The validator.
        row(
            "ValidatorService/ValidateProcess",
            |_| validator::ValidateProcessRequest { source: PROCESS.into(), ..Default::default() }.encode_to_vec(),
            ALL,
        ),
        row(
            "ValidatorService/ValidateRoleDefinition",
            |_| {
                validator::ValidateRoleDefinitionRequest { source: "name: x\n".into(), ..Default::default() }
                    .encode_to_vec()
            },
            ALL,
        ),
        row(
            "ValidatorService/ValidatePermissionMatrix",
            |_| {
                validator::ValidatePermissionMatrixRequest { source: "roles: {}\n".into(), ..Default::default() }
                    .encode_to_vec()
            },
            ALL,
        ),
        // The notifier.
        row(
            "NotifierService/IngestEvents",
            |_| notifier::IngestEventsRequest { event: Some(event()) }.encode_to_vec(),
            [PD, PD, PD, OK],
        ),
        row(
            "NotifierService/Subscribe",
            |_| notifier::SubscribeRequest { agent_id: "alice".into(), after_cursor: 0 }.encode_to_vec(),
            [PD, OK, OK, PD],
        ),
        row(
            "NotifierService/ListNotifications",
            |_| notifier::ListNotificationsRequest { agent_id: "alice".into(), ..Default::default() }.encode_to_vec(),
            [PD, OK, OK, PD],
        ),
        row(
            "NotifierService/AcknowledgeNotifications",
            |_| notifier::AcknowledgeNotificationsRequest { agent_id: "alice".into(), cursor: 0 }.encode_to_vec(),
            [PD, OK, PD, PD],
        ),
        // The execution service.
        row(
            "ExecutionService/PublishProcess",
            |_| execution::PublishProcessRequest { source: PROCESS.into(), ..Default::default() }.encode_to_vec(),
            OPERATORS,
        ),
        row(
            "ExecutionService/GetProcess",
            |_| execution::GetProcessRequest { name: "auth-process".into(), version: 0 }.encode_to_vec(),
            ALL,
        ),
        row("ExecutionService/ListProcesses", |_| execution::ListProcessesRequest::default().encode_to_vec(), ALL),
        row(
            "ExecutionService/StartExecution",
            |_| {
                execution::StartExecutionRequest { process_name: "auth-process".into(), ..Default::default() }
                    .encode_to_vec()
            },
            OPERATORS,
        ),
        row(
            "ExecutionService/GetExecution",
            |fixture| execution::GetExecutionRequest { id: fixture.execution.clone() }.encode_to_vec(),
            [PD, OK, OK, OK],
        ),
        row(
            "ExecutionService/ListExecutions",
            |_| execution::ListExecutionsRequest::default().encode_to_vec(),
            [OK, OK, OK, OK],
        ),
        row(
            "ExecutionService/WatchExecution",
            |fixture| {
                execution::WatchExecutionRequest { execution_id: fixture.execution.clone(), after_sequence: 0 }
                    .encode_to_vec()
            },
            [PD, OK, OK, OK],
        ),
        row(
            "ExecutionService/ReadPayload",
            |fixture| {
                execution::ReadPayloadRequest {
                    execution_id: fixture.execution.clone(),
                    step_id: "gate".into(),
                    kind: execution::PayloadKind::Inputs as i32,
                    offset: 0,
                }
                .encode_to_vec()
            },
            [PD, OK, OK, OK],
        ),
        row(
            "ExecutionService/CancelExecution",
            |fixture| {
                execution::CancelExecutionRequest { id: fixture.to_cancel.clone(), reason: String::new() }
                    .encode_to_vec()
            },
            [PD, OK, FailedPrecondition, PD],
        ),
        row(
            "ExecutionService/ConnectWorker",
            |fixture| {
                execution::ConnectWorkerRequest {
                    message: Some(execution::connect_worker_request::Message::Hello(execution::WorkerHello {
                        worker_name: "table".into(),
                        agents: vec![execution::ServedAgent {
                            agent_id: "alice".into(),
                            token: fixture.tokens["alice"].clone(),
                        }],
                        ..Default::default()
                    })),
                }
                .encode_to_vec()
            },
            [OK, OK, OK, PD],
        ),
        row(
            "ExecutionService/RelaySteps",
            |_| {
                execution::RelayStepsRequest {
                    message: Some(execution::relay_steps_request::Message::Hello(execution::RelayHello {
                        replica: "table".into(),
                        ..Default::default()
                    })),
                }
                .encode_to_vec()
            },
            [PD, PD, PD, OK],
        ),
        row(
            "ExecutionService/InvokeTool",
            |_| execution::InvokeToolRequest { tool: "word_count".into(), ..Default::default() }.encode_to_vec(),
            [OK, OK, PD, PD],
        ),
        row("ExecutionService/ListTools", |_| execution::ListToolsRequest::default().encode_to_vec(), ALL),
        row(
            "ExecutionService/ListWorkers",
            |_| execution::ListWorkersRequest::default().encode_to_vec(),
            [PD, PD, OK, OK],
        ),
        row(
            "ExecutionService/SubmitApproval",
            |fixture| {
                execution::SubmitApprovalRequest {
                    execution_id: fixture.to_approve.clone(),
                    step_id: "gate".into(),
                    approved: true,
                    comment: String::new(),
                }
                .encode_to_vec()
            },
            [PD, OK, PD, PD],
        ),
        row(
            "ExecutionService/Intervene",
            |fixture| {
                execution::InterveneRequest {
                    execution_id: fixture.to_pause.clone(),
                    action: execution::InterventionAction::Pause as i32,
                    ..Default::default()
                }
                .encode_to_vec()
            },
            [PD, OK, FailedPrecondition, PD],
        ),
        row(
            "ExecutionService/StartSession",
            |_| {
                execution::StartSessionRequest {
                    process_name: "auth-process".into(),
                    lead_agent_id: "alice".into(),
                    task: Some(execution::SessionTask { title: "led by alice".into(), description: String::new() }),
                    ..Default::default()
                }
                .encode_to_vec()
            },
            [PD, OK, OK, PD],
        ),
        row(
            "ExecutionService/AssignRole",
            |fixture| {
                execution::AssignRoleRequest {
                    execution_id: fixture.session.clone(),
                    agent_id: "dave".into(),
                    role: "developer".into(),
                    subtask: String::new(),
                }
                .encode_to_vec()
            },
            [PD, OK, PD, PD],
        ),
        row(
            "ExecutionService/RequestSubtask",
            |fixture| {
                execution::RequestSubtaskRequest {
                    execution_id: fixture.session.clone(),
                    agent_id: "dave".into(),
                    role: "developer".into(),
                    subtask: "Write the migration".into(),
                    reason: String::new(),
                }
                .encode_to_vec()
            },
            [PD, OK, PD, PD],
        ),
        row(
            "ExecutionService/DecideSubtask",
            |fixture| {
                execution::DecideSubtaskRequest {
                    execution_id: fixture.session.clone(),
                    request_id: "no-such-request".into(),
                    approve: true,
                    note: String::new(),
                }
                .encode_to_vec()
            },
            [PD, NotFound, NotFound, PD],
        ),
        row(
            "ExecutionService/GetMyRole",
            |fixture| execution::GetMyRoleRequest { execution_id: fixture.execution.clone() }.encode_to_vec(),
            [PD, OK, PD, PD],
        ),
        row(
            "ExecutionService/CheckRole",
            |fixture| {
                execution::CheckRoleRequest {
                    execution_id: fixture.execution.clone(),
                    action: "code".into(),
                    agent_id: "alice".into(),
                }
                .encode_to_vec()
            },
            [PD, OK, OK, PD],
        ),
        row(
            "ExecutionService/SetLead",
            |fixture| {
                execution::SetLeadRequest { execution_id: fixture.to_relead.clone(), agent_id: "alice".into() }
                    .encode_to_vec()
            },
            [PD, OK, OK, PD],
        ),
        row(
            "ExecutionService/GetSessionStatus",
            |fixture| execution::GetSessionStatusRequest { execution_id: fixture.session.clone() }.encode_to_vec(),
            [PD, OK, OK, PD],
        ),
        row(
            "ExecutionService/PutPermissionMatrix",
            |_| {
                execution::PutPermissionMatrixRequest {
                    source: "roles:\n  lead:\n    can: [assign_role]\n  developer:\n    can: [code]\n".into(),
                }
                .encode_to_vec()
            },
            OPERATORS,
        ),
        row(
            "ExecutionService/GetPermissionMatrix",
            |_| execution::GetPermissionMatrixRequest { version: 0 }.encode_to_vec(),
            ALL,
        ),
        row(
            "ExecutionService/ListPermissionMatrixVersions",
            |_| execution::ListPermissionMatrixVersionsRequest::default().encode_to_vec(),
            ALL,
        ),
        row(
            "ExecutionService/PostToInbox",
            |_| {
                execution::PostToInboxRequest { inbox: "auth-inbox".into(), body: "x".into(), ..Default::default() }
                    .encode_to_vec()
            },
            ALL,
        ),
        row(
            "ExecutionService/ListInboxMessages",
            |_| {
                execution::ListInboxMessagesRequest { inbox: "auth-inbox".into(), ..Default::default() }.encode_to_vec()
            },
            [PD, PD, OK, OK],
        ),
        row(
            "ExecutionService/ArchiveInboxMessage",
            |_| execution::ArchiveInboxMessageRequest { id: "nothing".into() }.encode_to_vec(),
            [PD, PD, NotFound, PD],
        ),
        row(
            "ExecutionService/SetBudget",
            |_| execution::SetBudgetRequest::default().encode_to_vec(),
            [PD, PD, InvalidArgument, PD],
        ),
        row("ExecutionService/ListBudgets", |_| execution::ListBudgetsRequest::default().encode_to_vec(), ALL),
        row("ExecutionService/ListSchedules", |_| execution::ListSchedulesRequest::default().encode_to_vec(), ALL),
        row(
            "ExecutionService/ListMemory",
            |_| {
                let role = execution::MemoryScope::Role as i32;
                // A role no agent of the table holds.
                execution::ListMemoryRequest { scope: role, role: "doomed".into(), ..Default::default() }
                    .encode_to_vec()
            },
            [PD, PD, OK, OK],
        ),
        row(
            "ExecutionService/AppendMemory",
            |_| {
                let global = execution::MemoryScope::Global as i32;
                execution::AppendMemoryRequest { scope: global, text: "table".into(), ..Default::default() }
                    .encode_to_vec()
            },
            OPERATORS,
        ),
        row(
            "ExecutionService/ForgetMemory",
            |_| execution::ForgetMemoryRequest { id: "nothing".into() }.encode_to_vec(),
            [PD, PD, NotFound, PD],
        ),
    ]
}

/// The service of a table row's method.
fn service_of(method: &str) -> &'static str {
    match method.split('/').next().unwrap_or_default() {
        "RosterService" | "CredentialService" => "roster",
        "ValidatorService" => "validator",
        "NotifierService" => "notifier",
        _ => "execution",
    }
}

async fn start(test: &TestCluster, lead: &str, session: bool) -> String {
    let mut client = test.execution();
    if session {
        let request = execution::StartSessionRequest {
            process_name: "auth-process".into(),
            lead_agent_id: lead.into(),
            task: Some(execution::SessionTask { title: "the table's session".into(), description: String::new() }),
            ..Default::default()
        };
        muster_tests::start_session(&mut client, request).await
    } else {
        let request = execution::StartExecutionRequest {
            process_name: "auth-process".into(),
            lead_agent_id: lead.into(),
            ..Default::default()
        };
        client.start_execution(request).await.unwrap().into_inner().execution.unwrap().id
    }
}

/// Waits until a call with `token` is refused as revoked; returns how long it took.
async fn until_revoked(test: &TestCluster, service: &str, token: &str) -> Duration {
    let started = Instant::now();
    let probe = raw::contract_methods()
        .into_iter()
        .find(|method| match service {
            "roster" => method.name == "ListTeams",
            "validator" => method.name == "ValidateProcess",
            "notifier" => method.name == "ListNotifications",
            _ => method.name == "ListProcesses",
        })
        .unwrap();
    let request = notifier::ListNotificationsRequest { agent_id: "carol".into(), ..Default::default() }.encode_to_vec();
    let request = if service == "notifier" { request } else { Vec::new() };
    loop {
        let outcome = raw::call(
            &test.cluster().service(service).url(),
            &probe,
            request.clone(),
            Credentials::bearer(token).unwrap(),
        )
        .await;
        if let Err(status) = &outcome
            && status.code() == Code::Unauthenticated
            && status.get_details_error_info().is_some_and(|info| info.reason == "CREDENTIAL_REVOKED")
        {
            return started.elapsed();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{service} still accepts a revoked token: {outcome:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn every_rpc_refuses_the_callers_it_is_not_for(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let mut roster = test.roster();
    roster
        .put_team(roster::PutTeamRequest { team: Some(roster::Team { name: "core".into(), ..Default::default() }) })
        .await
        .unwrap();
    roster
        .put_team(roster::PutTeamRequest { team: Some(roster::Team { name: "empty".into(), ..Default::default() }) })
        .await
        .unwrap();
    for name in ["member", "doomed"] {
        let role = roster::RoleDefinition { name: name.into(), ..Default::default() };
        roster.put_role_definition(roster::PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    }
    let names = ["alice", "bob", "carol", "dave", "frank", "grace", "victim"];
    let agents: Vec<_> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: std::collections::HashMap<&'static str, String> =
        names.into_iter().zip(test.register_agents(&agents).await).collect();

    // A revoked token is refused by every service within five seconds.
    roster.revoke_token(roster::RevokeTokenRequest { agent_id: "carol".into() }).await.unwrap();
    for service in ["roster", "execution", "notifier", "validator"] {
        let took = until_revoked(&test, service, &tokens["carol"]).await;
        assert!(took < Duration::from_secs(5), "{service} saw the revocation after {took:?}");
    }

    let mut client = test.execution();
    client
        .publish_process(execution::PublishProcessRequest { source: PROCESS.into(), ..Default::default() })
        .await
        .unwrap();
    let fixture = Fixture {
        execution: start(&test, "alice", false).await,
        to_approve: start(&test, "alice", false).await,
        to_cancel: start(&test, "alice", false).await,
        to_pause: start(&test, "alice", false).await,
        to_relead: start(&test, "alice", false).await,
        session: start(&test, "alice", true).await,
        tokens,
    };
    // The approval step waits for its decision before the table decides it.
    loop {
        let execution = client.get_execution(GetExecutionRequest { id: fixture.to_approve.clone() }).await.unwrap();
        if execution.into_inner().execution.unwrap().steps[0].status == StepStatus::WaitingApproval as i32 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let methods = raw::contract_methods();
    let table = table();
    // Every RPC has a row, and every row an RPC.
    let rows: Vec<&str> = table.iter().map(|row| row.method).collect();
    for method in &methods {
        assert!(rows.contains(&method.short().as_str()), "{} has no row in the table", method.short());
    }
    assert_eq!(rows.len(), methods.len(), "rows that name no RPC, or twice the same: {rows:?}");

    let operator = test.cluster().credentials.operator_token.clone();
    let service = test.service_token("execution");
    let mut failures = Vec::new();
    for row in &table {
        let method: &Method = methods.iter().find(|method| method.short() == row.method).unwrap();
        let url = test.cluster().service(service_of(row.method)).url();
        let callers = [
            ("no credential", Credentials::none(), Code::Unauthenticated),
            ("garbage", Credentials::bearer("garbage").unwrap(), Code::Unauthenticated),
            ("revoked", Credentials::bearer(&fixture.tokens["carol"]).unwrap(), Code::Unauthenticated),
            ("another agent", Credentials::bearer(&fixture.tokens["bob"]).unwrap(), row.expected[0]),
            ("the right agent", Credentials::bearer(&fixture.tokens[row.subject]).unwrap(), row.expected[1]),
            ("an operator", Credentials::bearer(&operator).unwrap(), row.expected[2]),
            ("a service", Credentials::bearer(&service).unwrap(), row.expected[3]),
        ];
        for (caller, credentials, expected) in callers {
            let outcome = raw::call(&url, method, (row.request)(&fixture), credentials).await;
            let code = outcome.as_ref().err().map_or(Code::Ok, tonic::Status::code);
            if code != expected {
                failures.push(format!("{} as {caller}: expected {expected:?}, got {outcome:?}", row.method));
                continue;
            }
            // Refusals say why, in a standard detail clients can branch on.
            if let Err(status) = outcome
                && matches!(code, Code::PermissionDenied | Code::Unauthenticated)
            {
                match status.get_details_error_info() {
                    Some(info) if info.domain == "muster.dev" => {}
                    other => failures.push(format!("{} as {caller}: no muster.dev ErrorInfo: {other:?}", row.method)),
                }
                if code == Code::PermissionDenied && !status.message().contains(" may not ") {
                    failures.push(format!(
                        "{} as {caller}: the refusal does not name the action: {}",
                        row.method,
                        status.message()
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} cells differ:\n{}", failures.len(), failures.join("\n"));
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_the_callers_it_is_not_for_on_sqlite() {
    every_rpc_refuses_the_callers_it_is_not_for(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_the_callers_it_is_not_for_on_postgres() {
    every_rpc_refuses_the_callers_it_is_not_for(Backend::Postgres).await;
}
