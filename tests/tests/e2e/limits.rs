//! Careless and hostile requests against a real cluster: every field has a
//! limit that the server names when it refuses a request, oversized messages
//! are RESOURCE_EXHAUSTED, undecodable ones INVALID_ARGUMENT, and no request
//! within the limits can make an answer too big for its message or its
//! trailers.

use muster_proto::{
    execution::v1::{PublishProcessRequest, StartExecutionRequest},
    roster::v1::{Agent, ListAgentsRequest, RegisterAgentRequest},
};
use muster_runtime::auth::client::Credentials;
use muster_tests::{Backend, TestCluster, agent, chain_process, raw};
use prost::Message as _;
use tonic::Code;
use tonic_types::StatusExt as _;

fn method(service: &str, name: &str) -> raw::Method {
    raw::contract_methods()
        .into_iter()
        .find(|method| method.service == service && method.name == name)
        .unwrap_or_else(|| panic!("{service}/{name} is in the contract"))
}

async fn oversized_fields_are_refused_by_name_and_long_prompts_never_break_the_cluster(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    test.register_agents(&[agent("lead", "lead", "core")]).await;
    let mut roster = test.roster();

    // A 3 MB prompt is refused, naming the field and its limit.
    for id in ["huge-1", "huge-2"] {
        let agent = Agent { custom_prompt: "p".repeat(3_000_000), ..agent(id, "member", "core") };
        let status = roster.register_agent(RegisterAgentRequest { agent: Some(agent) }).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(status.message(), "field agent.custom_prompt is 3000000 bytes; the limit is 65536 bytes");
    }

    // Forty agents with the longest prompts and backstories allowed are 5 MB
    // of roster: more than one message holds. Listing pages through them, and
    // the execution service (which reads the whole roster to check a
    // process) still publishes.
    let long = |id: String| Agent {
        custom_prompt: "p".repeat(65_536),
        backstory: "b".repeat(65_536),
        ..agent(&id, "member", "core")
    };
    test.register_agents(&(0..40).map(|index| long(format!("long-{index:02}"))).collect::<Vec<_>>()).await;
    let mut listed = 0;
    let mut pages = 0;
    let mut page_token = String::new();
    loop {
        let page = roster
            .list_agents(ListAgentsRequest { page_token, ..Default::default() })
            .await
            .expect("a page of agents")
            .into_inner();
        listed += page.agents.len();
        pages += 1;
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(listed, 41);
    assert!(pages >= 5, "{pages} pages for 5 MB of agents");
    let mut execution = test.execution();
    execution
        .publish_process(PublishProcessRequest {
            source: chain_process("after-long-prompts", 2, "long-07", "lead", "{}"),
            file_name: "p.yaml".to_owned(),
        })
        .await
        .expect("publishing against a roster of long prompts");

    // A 100 KB idempotency key is refused, naming the field.
    let status = execution
        .start_execution(StartExecutionRequest {
            process_name: "after-long-prompts".to_owned(),
            idempotency_key: "k".repeat(100_000),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "field idempotency_key is 100000 bytes; the limit is 128 bytes");
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_fields_are_refused_by_name_and_long_prompts_never_break_the_cluster_on_sqlite() {
    oversized_fields_are_refused_by_name_and_long_prompts_never_break_the_cluster(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_fields_are_refused_by_name_and_long_prompts_never_break_the_cluster_on_postgres() {
    oversized_fields_are_refused_by_name_and_long_prompts_never_break_the_cluster(Backend::Postgres).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_document_fits_its_diagnostics_in_the_trailers() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    test.register_agents(&[agent("lead", "lead", "core")]).await;
    // A 100 KB step id, and a hundred more bad ids: the diagnostics quote them.
    let mut source =
        format!("name: long-ids\nlead: lead\nsteps:\n  - id: {}\n    type: agent_task\n", "x".repeat(100_000));
    for index in 0..100 {
        source.push_str(&format!("  - id: Bad_{index}_{}\n    type: agent_task\n", "y".repeat(1000)));
    }
    let status = test
        .execution()
        .publish_process(PublishProcessRequest { source, file_name: "long.yaml".to_owned() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("the process has "), "{}", status.message());
    assert!(status.message().len() <= 1024, "{} bytes of message", status.message().len());
    let diagnostics = muster_runtime::status::diagnostics(&status);
    assert!(!diagnostics.is_empty());
    assert!(diagnostics.iter().all(|diagnostic| diagnostic.line > 0 && diagnostic.message.len() <= 512));
    // The standard details hold the same findings, for clients that know only those.
    let violations = status.get_details_bad_request().expect("a BadRequest").field_violations;
    assert_eq!(violations.len(), diagnostics.len());
    assert!(
        violations.iter().all(|violation| violation.field == "source" && violation.description.starts_with("line "))
    );
    let info = status.get_details_error_info().expect("an ErrorInfo");
    assert_eq!(info.reason, "INVALID_PROCESS");
    let counted = format!("the process has {} error(s)", info.metadata["errors"]);
    assert!(status.message().starts_with(&counted), "{counted:?}: {}", status.message());
    assert!(info.metadata["errors"].parse::<usize>().unwrap() > diagnostics.len(), "{info:?}");
    assert!(status.details().len() <= 8 * 1024, "{} bytes of details", status.details().len());
    test.shutdown().await;
}

async fn undecodable_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted(backend: Backend) {
    let Some(test) = TestCluster::start(backend).await else { return };
    let register = method("muster.roster.v1.RosterService", "RegisterAgent");
    let url = test.cluster().roster_url();
    let operator = || Credentials::bearer(&test.cluster().credentials.operator_token).expect("a bearer token");

    // `agent { id: "a\xff" }`: a string that is not UTF-8.
    let invalid_utf8 = vec![0x0a, 0x04, 0x0a, 0x02, b'a', 0xff];
    let status = raw::call(&url, &register, invalid_utf8, operator()).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "field agent.id is not valid UTF-8"));

    // A length that runs past the end of the message.
    let status = raw::call(&url, &register, vec![0x0a, 0x10, 0x0a], operator()).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("not a valid protobuf encoding"), "{}", status.message());

    // A message over the server's 4 MiB.
    let huge = RegisterAgentRequest { agent: Some(Agent { backstory: "b".repeat(5 << 20), ..Default::default() }) };
    let huge = huge.encode_to_vec();
    let length = huge.len();
    let status = raw::call(&url, &register, huge, operator()).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(status.message(), format!("the request message is {length} bytes; the limit is 4194304 bytes"));

    // The same on a stream: a worker's hello with an oversized token.
    let connect = method("muster.execution.v1.ExecutionService", "ConnectWorker");
    let hello = muster_proto::execution::v1::ConnectWorkerRequest {
        message: Some(muster_proto::execution::v1::connect_worker_request::Message::Hello(
            muster_proto::execution::v1::WorkerHello {
                worker_name: "w".to_owned(),
                agents: vec![muster_proto::execution::v1::ServedAgent {
                    agent_id: "a".to_owned(),
                    token: "t".repeat(2000),
                }],
                ..Default::default()
            },
        )),
    };
    let status = raw::call(&test.cluster().execution_url(), &connect, hello.encode_to_vec(), operator()).await;
    let status = match status {
        Err(status) => status,
        Ok(()) => panic!("an oversized hello was accepted"),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("hello.agents[0].token is 2000 bytes; the limit is 1024 bytes"),
        "{}",
        status.message()
    );
    test.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted_on_sqlite() {
    undecodable_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted_on_postgres() {
    undecodable_requests_are_invalid_arguments_and_oversized_ones_resource_exhausted(Backend::Postgres).await;
}

/// Answers each `big*` step with an output of about 60 KB (small enough to
/// travel inline), the others with a few bytes.
struct BigOutputs;

impl muster::worker::Behaviour for BigOutputs {
    fn run(
        &self,
        assignment: muster_proto::execution::v1::Assignment,
        _step: muster::worker::Step,
    ) -> impl Future<Output = muster::worker::StepOutcome> + Send {
        let size = if assignment.step_id.starts_with("big") { 60_000 } else { 10 };
        std::future::ready(muster::worker::StepOutcome::Completed {
            output_json: serde_json::json!({ "text": "x".repeat(size) }).to_string(),
            tokens_used: 0,
            cost: 0.0,
            iterations: 1,
            remember: Vec::new(),
            skip_triggers: false,
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_assignment_too_big_to_send_fails_its_step_and_the_worker_stream_goes_on() {
    use muster_proto::{
        common::v1::ExecutionStatus,
        execution::v1::{GetExecutionRequest, ListWorkersRequest, StepStatus},
    };
    // With a 1 MiB message limit, 1 MiB of small upstream outputs (they
    // travel inline) and the shared memory make an assignment too large.
    let limit = vec![("MUSTER_MAX_MESSAGE_BYTES".to_owned(), "1048576".to_owned())];
    let Some(test) = TestCluster::start_with_environment(Backend::Sqlite, limit).await else { return };
    let tokens = test.register_agents(&[agent("lead", "lead", "core"), agent("worker", "member", "core")]).await;
    let credentials = vec![muster::worker::AgentCredential { agent_id: "worker".to_owned(), token: tokens[1].clone() }];
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(muster::worker::serve(
        test.operator("execution"),
        "big-outputs".to_owned(),
        credentials,
        std::sync::Arc::new(BigOutputs),
        async move {
            let _ = stopped.await;
        },
    ));
    let step = |id: &str, depends_on: &str| {
        format!(
            "  - id: {id}\n    type: agent_task\n    agent: worker\n    message: go\n    depends_on: [{depends_on}]\n    roles:\n      executor: worker\n      informed: [lead]\n"
        )
    };
    let mut source = "name: fan-in\nlead: lead\nsteps:\n".to_owned();
    let parts: Vec<String> = (0..18).map(|index| format!("big{index}")).collect();
    for part in &parts {
        source.push_str(&step(part, ""));
    }
    source.push_str(&step("join", &parts.join(", ")));
    let mut execution = test.execution();
    let id = muster_tests::publish_and_start(&mut execution, &source).await;
    let events = muster_tests::events_until_finished(&test.operator("execution"), &id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);

    // The execution reads fine within the lower limit: outputs beyond what
    // one answer holds are omitted, and say so.
    let got = execution.get_execution(GetExecutionRequest { id: id.clone() }).await.expect("GetExecution").into_inner();
    let steps = got.execution.expect("the execution").steps;
    let join = steps.iter().find(|step| step.step_id == "join").unwrap();
    assert_eq!(join.status, StepStatus::Failed as i32);
    let error = join.error.as_ref().expect("join's error");
    assert_eq!(error.code, "ASSIGNMENT_TOO_LARGE", "{}", error.message);
    assert!(error.message.contains("MUSTER_MAX_MESSAGE_BYTES"), "{}", error.message);
    assert_eq!(join.attempt, 1, "a step too big to send is not retried");
    let omitted = steps.iter().filter(|step| step.output_omitted).count();
    assert!(omitted >= 1 && steps.iter().filter(|step| step.output.is_some()).count() >= 2, "{omitted} omitted");
    assert!(steps.iter().filter(|step| step.output_omitted).all(|step| step.output.is_none()));
    // Every output is in its completed event.
    let completed_outputs =
        events.iter().filter(|event| muster_tests::json_of(&event.output).to_string().len() > 60_000).count();
    assert_eq!(completed_outputs, 18);

    // The same worker stream, never broken, runs the next execution.
    let workers = || async {
        let mut execution = test.execution();
        execution.list_workers(ListWorkersRequest::default()).await.expect("ListWorkers").into_inner().workers
    };
    let before = workers().await;
    assert_eq!(before.len(), 1);
    let next = muster_tests::publish_and_start(
        &mut execution,
        &format!("name: after\nlead: lead\nsteps:\n{}", step("small", "")),
    )
    .await;
    let events = muster_tests::events_until_finished(&test.operator("execution"), &next).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Completed as i32);
    let after = workers().await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].worker_id, before[0].worker_id, "the worker had to reconnect");
    let _ = stop.send(());
    let _ = worker.await;
    test.shutdown().await;
}
