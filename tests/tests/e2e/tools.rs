//! Tools through the execution service, with the `ToolOutput` status codes:
//! 200, 400 (saying where the input is wrong), 403 (the role does not permit
//! the tool), 404 (no provider) and 500 (the provider failed).

use muster::worker::AgentCredential;
use muster_proto::{
    common::v1::ExecutionStatus,
    execution::v1::{GetExecutionRequest, InvokeToolRequest, ListToolsRequest, StepStatus, ToolOutput},
    roster::v1::{PutRoleDefinitionRequest, RoleDefinition},
};
use muster_runtime::auth::client::Credentials;
use muster_tests::{Backend, TestCluster, agent, events_until_finished, publish_and_start, spawn_sample_worker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_answer_with_http_like_status_codes() {
    let Some(test) = TestCluster::start(Backend::Sqlite).await else { return };
    let mut roster = test.roster();
    for (role, tools) in [("writer", vec!["word_count", "flaky_tool", "ghost_tool"]), ("reader", vec![])] {
        let role = RoleDefinition {
            name: role.to_owned(),
            tools: tools.into_iter().map(str::to_owned).collect(),
            ..Default::default()
        };
        roster.put_role_definition(PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    }
    let tokens = test.register_agents(&[agent("wren", "writer", "content"), agent("rory", "reader", "content")]).await;
    let credentials = vec![AgentCredential { agent_id: "wren".to_owned(), token: tokens[0].clone() }];
    let (stop, worker) = spawn_sample_worker(test.operator("execution"), credentials);
    let mut client = test.execution();
    // The worker's tools are registered once it is connected.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let tools = loop {
        let tools = client.list_tools(ListToolsRequest::default()).await.unwrap().into_inner().tools;
        if !tools.is_empty() || tokio::time::Instant::now() > deadline {
            break tools;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, vec!["flaky_tool", "word_count"]);

    let mut invoke = async |token: &str, tool: &str, input: &str| -> ToolOutput {
        let mut request = tonic::Request::new(InvokeToolRequest {
            tool: tool.to_owned(),
            input: muster_tests::object(input),
            execution_id: String::new(),
        });
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        client.invoke_tool(request).await.unwrap().into_inner().output.unwrap()
    };
    let (writer, reader) = (tokens[0].as_str(), tokens[1].as_str());

    let counted = invoke(writer, "word_count", r#"{"text": "three little words"}"#).await;
    assert_eq!((counted.status_code, counted.error.as_str()), (200, ""));
    assert_eq!(muster_tests::json_of(&counted.output), serde_json::json!({"words": 3}));

    let bad_input = invoke(writer, "word_count", r#"{"text": 5}"#).await;
    assert_eq!(bad_input.status_code, 400);
    assert!(bad_input.error.contains("at /text"), "{}", bad_input.error);
    let missing = invoke(writer, "word_count", "{}").await;
    assert_eq!(missing.status_code, 400);
    assert!(missing.error.contains("\"text\" is a required property"), "{}", missing.error);

    let forbidden = invoke(reader, "word_count", r#"{"text": "hi"}"#).await;
    assert_eq!(forbidden.status_code, 403);
    assert!(forbidden.error.contains("role 'reader'"), "{}", forbidden.error);

    let no_provider = invoke(writer, "ghost_tool", "{}").await;
    assert_eq!(no_provider.status_code, 404, "{}", no_provider.error);

    let fault = invoke(writer, "flaky_tool", "{}").await;
    assert_eq!(fault.status_code, 500);
    assert_eq!(fault.error, "the sample tool failed on purpose");

    let status = test
        .execution_with(Credentials::none())
        .invoke_tool(InvokeToolRequest {
            tool: "word_count".to_owned(),
            input: muster_tests::object("{}"),
            execution_id: String::new(),
        })
        .await
        .expect_err("an anonymous call is refused");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    // An operator is no agent: tools are called by agents alone.
    let status = client
        .invoke_tool(InvokeToolRequest {
            tool: "word_count".to_owned(),
            input: muster_tests::object(r#"{"text": "hi"}"#),
            execution_id: String::new(),
        })
        .await
        .expect_err("an operator may not call a tool");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");

    // A tool_call step: the execution service invokes the tool as the
    // step's executor; its output is the step's output, which the next step
    // builds on. Inputs that do not match the tool's schema fail it, saying where.
    let source = r#"
name: counted
steps:
  - {id: count, type: tool_call, agent: wren, tool: word_count, inputs: {text: "four words right here"}}
  - {id: use-it, type: agent_task, agent: wren, message: use the count, depends_on: [count]}
  - {id: wrong-input, type: tool_call, agent: wren, tool: word_count, inputs: {text: 5}}
"#;
    let execution_id = publish_and_start(&mut client, source).await;
    let events = events_until_finished(&test.operator("execution"), &execution_id).await;
    assert_eq!(events.last().unwrap().execution_status, ExecutionStatus::Failed as i32);
    let execution =
        client.get_execution(GetExecutionRequest { id: execution_id }).await.unwrap().into_inner().execution.unwrap();
    let step = |id: &str| execution.steps.iter().find(|step| step.step_id == id).unwrap().clone();
    let count = step("count");
    assert_eq!((count.status, count.executor.as_str()), (StepStatus::Completed as i32, "wren"));
    assert_eq!(muster_tests::json_of(&count.output), serde_json::json!({"words": 4}));
    let used: serde_json::Value = muster_tests::json_of(&step("use-it").output);
    assert_eq!(used["built_on"], serde_json::json!(["count"]), "the next step saw the tool's output");
    let wrong = step("wrong-input").error.unwrap();
    assert_eq!(wrong.code, "INVALID_INPUT");
    assert!(wrong.message.contains("at /text"), "{}", wrong.message);

    let _ = stop.send(());
    worker.await.unwrap().unwrap();
    test.shutdown().await;
}
