//! Refusals tell strangers nothing: an agent that takes no part in an
//! execution gets the same PERMISSION_DENIED, byte for byte, for a real id
//! and a made-up one, on every RPC about one execution, and the refusal
//! names none of the execution's agents; an operator learns that an id is
//! missing (NOT_FOUND with a `ResourceInfo`); GetProcess shows an agent
//! a step's literal inputs only where ReadPayload would; and ListExecutions
//! shows an agent the executions it takes part in, and a stranger none.

use std::time::Duration;

use muster_proto::execution::v1::{
    self as execution, GetExecutionRequest, GetProcessRequest, ListExecutionsRequest, StepStatus,
};
use muster_runtime::auth::client::Credentials;
use muster_tests::{Backend, TestCluster, agent, raw};
use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt as _;

const PROCESS: &str = "\
name: private-process
steps:
  - id: gate
    type: human_approval
    roles: {executor: alice, monitors: [mona], informed: [dave]}
    approvers: [alice, mona]
    inputs: {secret: hunter2}
";

/// The RPCs that name one execution, each as a request for `id`.
fn requests(id: &str) -> Vec<(&'static str, Vec<u8>)> {
    let id = id.to_owned();
    vec![
        ("GetExecution", execution::GetExecutionRequest { id: id.clone() }.encode_to_vec()),
        (
            "WatchExecution",
            execution::WatchExecutionRequest { execution_id: id.clone(), after_sequence: 0 }.encode_to_vec(),
        ),
        (
            "ReadPayload",
            execution::ReadPayloadRequest {
                execution_id: id.clone(),
                step_id: "gate".into(),
                kind: execution::PayloadKind::Inputs as i32,
                offset: 0,
            }
            .encode_to_vec(),
        ),
        (
            "CancelExecution",
            execution::CancelExecutionRequest { id: id.clone(), reason: String::new() }.encode_to_vec(),
        ),
        (
            "SubmitApproval",
            execution::SubmitApprovalRequest {
                execution_id: id.clone(),
                step_id: "gate".into(),
                approved: true,
                comment: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "Intervene",
            execution::InterveneRequest {
                execution_id: id.clone(),
                step_id: "gate".into(),
                action: execution::InterventionAction::Pause as i32,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "AssignRole",
            execution::AssignRoleRequest {
                execution_id: id.clone(),
                agent_id: "dave".into(),
                role: "developer".into(),
                subtask: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "RequestSubtask",
            execution::RequestSubtaskRequest {
                execution_id: id.clone(),
                agent_id: "bob".into(),
                role: "developer".into(),
                subtask: "Write it".into(),
                reason: String::new(),
            }
            .encode_to_vec(),
        ),
        (
            "DecideSubtask",
            execution::DecideSubtaskRequest {
                execution_id: id.clone(),
                request_id: "0195f0c2-0000-7000-8000-000000000001".into(),
                approve: true,
                note: String::new(),
            }
            .encode_to_vec(),
        ),
        ("GetMyRole", execution::GetMyRoleRequest { execution_id: id.clone() }.encode_to_vec()),
        (
            "CheckRole",
            execution::CheckRoleRequest { execution_id: id.clone(), action: "code".into(), agent_id: "bob".into() }
                .encode_to_vec(),
        ),
        ("SetLead", execution::SetLeadRequest { execution_id: id.clone(), agent_id: "bob".into() }.encode_to_vec()),
        ("GetSessionStatus", execution::GetSessionStatusRequest { execution_id: id.clone() }.encode_to_vec()),
        (
            "InvokeTool",
            execution::InvokeToolRequest { execution_id: id, tool: "word_count".into(), ..Default::default() }
                .encode_to_vec(),
        ),
    ]
}

async fn call(test: &TestCluster, method: &str, request: Vec<u8>, credentials: Credentials) -> tonic::Status {
    let methods = raw::contract_methods();
    let method = methods.iter().find(|known| known.short() == format!("ExecutionService/{method}")).unwrap();
    let url = test.cluster().service("execution").url();
    match raw::call(&url, method, request, credentials).await {
        Ok(_) => panic!("{} was answered", method.short()),
        Err(status) => status,
    }
}

async fn refusals_tell_strangers_nothing(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let role = muster_proto::roster::v1::RoleDefinition { name: "member".into(), ..Default::default() };
    let request = muster_proto::roster::v1::PutRoleDefinitionRequest { role: Some(role) };
    test.roster().put_role_definition(request).await.unwrap();
    let names = ["alice", "mona", "dave", "bob"];
    let agents: Vec<_> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: std::collections::HashMap<&str, String> =
        names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    client
        .publish_process(execution::PublishProcessRequest { source: PROCESS.into(), ..Default::default() })
        .await
        .unwrap();
    let run = client
        .start_execution(execution::StartExecutionRequest {
            process_name: "private-process".into(),
            lead_agent_id: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .execution
        .unwrap()
        .id;
    let session = muster_tests::start_session(
        &mut client,
        execution::StartSessionRequest {
            process_name: "private-process".into(),
            lead_agent_id: "alice".into(),
            task: Some(execution::SessionTask { title: "private".into(), description: String::new() }),
            ..Default::default()
        },
    )
    .await;
    for id in [&run, &session] {
        for _ in 0..500 {
            let found = client.get_execution(GetExecutionRequest { id: id.clone() }).await.unwrap().into_inner();
            if found.execution.unwrap().steps[0].status == StepStatus::WaitingApproval as i32 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let made_up = "0195f0c2-0000-7000-8000-000000000000";
    let stranger = || Credentials::bearer(&tokens["bob"]).unwrap();
    let operator = || Credentials::bearer(&test.cluster().credentials.operator_token).unwrap();

    let mut failures = Vec::new();
    for real in [&run, &session] {
        for ((method, real_request), (_, made_up_request)) in requests(real).into_iter().zip(requests(made_up)) {
            let for_real = call(&test, method, real_request, stranger()).await;
            let for_none = call(&test, method, made_up_request, stranger()).await;
            if for_real.code() != Code::PermissionDenied || for_none.code() != Code::PermissionDenied {
                failures.push(format!("{method}: {:?} for a real id, {:?} for none", for_real, for_none));
                continue;
            }
            if for_real.message() != for_none.message() {
                failures.push(format!(
                    "{method}: the messages differ:\n  real: {}\n  none: {}",
                    for_real.message(),
                    for_none.message()
                ));
            }
            for named in ["alice", "mona", "dave"] {
                let metadata = for_real.get_details_error_info().map(|info| format!("{:?}", info.metadata));
                if for_real.message().contains(named) || metadata.is_some_and(|text| text.contains(named)) {
                    failures.push(format!("{method}: the refusal names '{named}': {}", for_real.message()));
                }
            }
        }
    }
    // Operators learn what is missing.
    for (method, request) in requests(made_up) {
        if matches!(method, "InvokeTool" | "GetMyRole" | "AssignRole" | "RequestSubtask" | "SubmitApproval") {
            continue; // for agents only
        }
        let status = call(&test, method, request, operator()).await;
        let resource = status.get_details_resource_info();
        if status.code() != Code::NotFound || resource.is_none_or(|info| info.resource_name != made_up) {
            failures.push(format!("{method} as an operator: {status:?}"));
        }
    }
    assert!(failures.is_empty(), "{} refusals tell too much:\n{}", failures.len(), failures.join("\n"));

    // A step's literal inputs: to the agents ReadPayload lets read them, and
    // to operators; not to another agent.
    let source_as = |token: &str| {
        let mut client = test.execution_as(token);
        async move {
            let request = GetProcessRequest { name: "private-process".into(), version: 0 };
            client.get_process(request).await.unwrap().into_inner().process.unwrap().source
        }
    };
    assert!(source_as(&tokens["bob"]).await.is_empty(), "a stranger reads the process's literal inputs");
    assert!(source_as(&tokens["dave"]).await.contains("hunter2"), "an informed agent reads them");
    let by_operator = client.get_process(GetProcessRequest { name: "private-process".into(), version: 0 }).await;
    assert!(by_operator.unwrap().into_inner().process.unwrap().source.contains("hunter2"));
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_tell_strangers_nothing_on_sqlite() {
    refusals_tell_strangers_nothing(Backend::Sqlite).await;
}

/// The ids ListExecutions shows the caller of `token`, page by page (pages
/// of `limit`), with the other filters of `request`; every page but the
/// last is full and has a next page token.
async fn listed_as(test: &TestCluster, token: &str, request: ListExecutionsRequest) -> Vec<String> {
    let mut client = test.execution_as(token);
    let mut ids = Vec::new();
    let mut page_token = String::new();
    loop {
        let request = ListExecutionsRequest { page_token: page_token.clone(), ..request.clone() };
        let page = client.list_executions(request.clone()).await.unwrap().into_inner();
        ids.extend(page.executions.iter().map(|listed| listed.id.clone()));
        if page.next_page_token.is_empty() {
            return ids;
        }
        assert_eq!(page.executions.len(), request.limit as usize, "a page before the last is full");
        page_token = page.next_page_token;
    }
}

async fn an_agent_lists_only_its_executions(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let role = muster_proto::roster::v1::RoleDefinition { name: "member".into(), ..Default::default() };
    let request = muster_proto::roster::v1::PutRoleDefinitionRequest { role: Some(role) };
    test.roster().put_role_definition(request).await.unwrap();
    let names = ["alice", "mona", "dave", "bob", "erin"];
    let agents: Vec<_> = names.iter().map(|name| agent(name, "member", "core")).collect();
    let tokens: std::collections::HashMap<&str, String> =
        names.into_iter().zip(test.register_agents(&agents).await).collect();
    let mut client = test.execution();
    let bobs = PROCESS.replace("private-process", "bobs-process").replace(
        "roles: {executor: alice, monitors: [mona], informed: [dave]}\n    approvers: [alice, mona]",
        "approvers: [bob]",
    );
    let mut started = std::collections::HashMap::<&str, Vec<String>>::new();
    for (process, source, lead, runs) in [("private-process", PROCESS, "alice", 3), ("bobs-process", &*bobs, "bob", 2)]
    {
        client
            .publish_process(execution::PublishProcessRequest { source: source.into(), ..Default::default() })
            .await
            .unwrap();
        for _ in 0..runs {
            let run = client
                .start_execution(execution::StartExecutionRequest {
                    process_name: process.into(),
                    lead_agent_id: lead.into(),
                    ..Default::default()
                })
                .await
                .unwrap()
                .into_inner()
                .execution
                .unwrap();
            started.entry(process).or_default().push(run.id);
        }
    }
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let all = ListExecutionsRequest { limit: 2, ..Default::default() };
    let alices = sorted(started["private-process"].clone());
    let listed = listed_as(&test, &tokens["alice"], all.clone()).await;
    assert_eq!(sorted(listed.clone()), alices, "the lead's, each once: {listed:?}");
    assert_eq!(sorted(listed_as(&test, &tokens["mona"], all.clone()).await), alices, "named in a step");
    assert_eq!(sorted(listed_as(&test, &tokens["bob"], all.clone()).await), sorted(started["bobs-process"].clone()));
    assert!(listed_as(&test, &tokens["erin"], all.clone()).await.is_empty(), "a stranger sees none");
    let of_bobs = ListExecutionsRequest { process_name: "bobs-process".into(), ..all.clone() };
    assert!(listed_as(&test, &tokens["alice"], of_bobs.clone()).await.is_empty(), "none of another's process");
    assert_eq!(listed_as(&test, &tokens["bob"], of_bobs).await.len(), 2);
    let operator = test.cluster().credentials.operator_token.clone();
    assert_eq!(listed_as(&test, &operator, all).await.len(), 5, "an operator sees every one");
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_only_its_executions_on_sqlite() {
    an_agent_lists_only_its_executions(Backend::Sqlite).await;
}
