//! The validator service in process, over real gRPC: the EMI step-role cases,
//! context checks, role definitions, the permission matrix, the request
//! errors, and who may call it.

use muster_proto::common::v1::{Diagnostic, Severity};
use muster_proto::validator::v1 as pb;
use muster_proto::validator::v1::validator_service_client::ValidatorServiceClient;
use muster_runtime::{
    auth::client::{AuthChannel, Credentials, with_credentials},
    testing::{FakeCredentials, TestCredentials},
};
use muster_validator::{Config, run};
use tonic::transport::Channel;

struct TestServer {
    /// Calls as an operator.
    client: ValidatorServiceClient<AuthChannel>,
    channel: Channel,
    credentials: TestCredentials,
    agents: FakeCredentials,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    handle: Option<tokio::task::JoinHandle<muster_validator::Result<()>>>,
}

impl TestServer {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let mut config = Config { server: muster_runtime::ServerArgs::default() };
        config.server.shutdown_grace_seconds = 1;
        let credentials = TestCredentials::new();
        credentials.apply(&mut config.server);
        let agents = FakeCredentials::start(&credentials).await;
        config.server.auth.roster_url = agents.url.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let handle = tokio::spawn(run(config, listener, async move {
            let _ = stopped.await;
        }));
        let channel = muster_runtime::testing::connect_when_serving(&format!("http://{address}")).await;
        Self {
            client: ValidatorServiceClient::new(with_credentials(channel.clone(), credentials.operator())),
            channel,
            credentials,
            agents,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    fn client_with(&self, credentials: Credentials) -> ValidatorServiceClient<AuthChannel> {
        ValidatorServiceClient::new(with_credentials(self.channel.clone(), credentials))
    }

    async fn process(&mut self, source: &str, context: Option<pb::ValidationContext>) -> pb::ValidateProcessResponse {
        self.client
            .validate_process(pb::ValidateProcessRequest {
                source: source.to_owned(),
                file_name: "process.yaml".to_owned(),
                context,
            })
            .await
            .expect("validate process")
            .into_inner()
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(handle) = self.handle.take() {
            handle.await.expect("join").expect("server stops cleanly");
        }
    }
}

fn summary(diagnostics: &[Diagnostic]) -> Vec<(String, i32, u32, u32)> {
    diagnostics
        .iter()
        .map(|diagnostic| (diagnostic.code.clone(), diagnostic.severity, diagnostic.line, diagnostic.column))
        .collect()
}

#[tokio::test]
async fn roles_without_executor_is_an_error_with_line_and_column() {
    let mut server = TestServer::start().await;
    let source = "\
name: content-pipeline
steps:
  - id: research
    type: agent_task
    agent: research-agent
    message: Research the topic
    roles:
      monitors: [quality-agent]
";
    let response = server.process(source, None).await;
    assert!(!response.valid);
    assert_eq!(summary(&response.diagnostics), vec![("EMI002".to_owned(), Severity::Error as i32, 7, 5)]);
    let diagnostic = &response.diagnostics[0];
    assert_eq!(diagnostic.message, "Roles must include an 'executor' agent");
    assert_eq!(diagnostic.path, "steps[0].roles");
    assert_eq!(response.process_name, "content-pipeline", "the name is read even when the process is invalid");
    assert_eq!(response.step_count, 1);
    server.stop().await;
}

#[tokio::test]
async fn same_agent_as_executor_and_monitor_is_a_warning() {
    let mut server = TestServer::start().await;
    let source = "\
name: content-pipeline
steps:
  - id: critical-analysis
    type: agent_task
    agent: analyst-agent
    message: Perform critical analysis
    roles:
      executor: analyst-agent
      monitors:
        - analyst-agent
        - manager-agent
";
    let response = server.process(source, None).await;
    assert!(response.valid, "a warning does not refuse the process");
    assert_eq!(summary(&response.diagnostics), vec![("EMI101".to_owned(), Severity::Warning as i32, 10, 11)]);
    assert_eq!(response.diagnostics[0].message, "Agent 'analyst-agent' is both executor and monitor (redundant)");
    assert_eq!(response.diagnostics[0].path, "steps[0].roles.monitors[0]");
    assert_eq!(response.process_name, "content-pipeline");
    assert_eq!(response.step_count, 1);
    server.stop().await;
}

#[tokio::test]
async fn a_finding_on_every_step_is_answered_within_bounds_errors_first() {
    let mut server = TestServer::start().await;
    // 1,500 warnings (each executor also informed), then one error at the end.
    let mut source = String::from("name: many\nsteps:\n");
    for index in 0..1_500 {
        source.push_str(&format!(
            "  - {{id: s{index}, type: agent_task, agent: a, message: m, roles: {{executor: a, informed: [a]}}}}\n"
        ));
    }
    source.push_str("  - {id: last, type: agent_task, agent: a, message: m, roles: {monitors: [b]}}\n");
    let response = server.process(&source, None).await;
    assert!(!response.valid);
    assert_eq!((response.diagnostics.len(), response.diagnostic_count), (1_000, 1_501));
    assert_eq!(summary(&response.diagnostics[..1]), vec![("EMI002".to_owned(), Severity::Error as i32, 1_503, 56)]);
    assert!(response.diagnostics[1..].iter().all(|found| found.code == "EMI102"), "then the warnings");
    assert_eq!(response.diagnostics[1].line, 3, "in source order");
    // Below the bound, every finding in source order, as before.
    let few = server.process(&source.replace("informed: [a]", "informed: [b]"), None).await;
    assert_eq!((few.diagnostics.len(), few.diagnostic_count), (1, 1));
    server.stop().await;
}

#[tokio::test]
async fn context_flags_decide_which_reference_rules_run() {
    let mut server = TestServer::start().await;
    let source = "name: p\nsteps:\n  - {id: a, type: tool_call, agent: dev, tool: linter, action: review}\n";
    let agents = vec![pb::KnownAgent { id: "dev".into(), role: "developer".into(), offline: true }];
    let roles = vec![pb::KnownRole {
        name: "developer".into(),
        permitted_tools: vec!["code_linter".into()],
        permitted_actions: vec!["code".into()],
    }];
    let tools = vec!["code_linter".into()];

    // Lists given but not marked complete: nothing is checked.
    let unchecked = pb::ValidationContext {
        agents: agents.clone(),
        roles: roles.clone(),
        tools: tools.clone(),
        ..Default::default()
    };
    let response = server.process(source, Some(unchecked)).await;
    assert_eq!(response.diagnostics, vec![]);

    let checked =
        pb::ValidationContext { agents, roles, tools, check_agents: true, check_roles: true, check_tools: true };
    let response = server.process(source, Some(checked)).await;
    let codes: Vec<String> = response.diagnostics.iter().map(|diagnostic| diagnostic.code.clone()).collect();
    assert_eq!(codes, vec!["CTX002", "CTX006", "CTX005", "CTX004"]);
    assert!(!response.valid);
    server.stop().await;
}

#[tokio::test]
async fn role_definitions_and_matrices_over_grpc() {
    let mut server = TestServer::start().await;
    let response = server
        .client
        .validate_role_definition(pb::ValidateRoleDefinitionRequest {
            source: "# Risk Manager\n## Mission\nFind risks.\n## Schedule\n0 9 * * 1-5\n".into(),
            file_name: "roles/risk.md".into(),
            format: pb::RoleFormat::Unspecified as i32,
            context: None,
        })
        .await
        .expect("validate role")
        .into_inner();
    assert!(response.valid, "{:?}", response.diagnostics);
    assert_eq!(response.role_names, vec!["Risk Manager"]);

    let response = server
        .client
        .validate_permission_matrix(pb::ValidatePermissionMatrixRequest {
            source: "roles:\n  dev: {can: [code], cannot: [code]}\n".into(),
            file_name: String::new(),
        })
        .await
        .expect("validate matrix")
        .into_inner();
    assert!(!response.valid);
    assert_eq!(summary(&response.diagnostics), vec![("MTX004".to_owned(), Severity::Error as i32, 2, 31)]);

    let status = server
        .client
        .validate_role_definition(pb::ValidateRoleDefinitionRequest {
            source: "name: x\n".into(),
            format: 42,
            ..Default::default()
        })
        .await
        .expect_err("an unknown format is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    server.stop().await;
}

#[tokio::test]
async fn hostile_documents_are_answered_with_diagnostics() {
    let mut server = TestServer::start().await;
    let mut source = String::from("a: &a [x,x,x,x,x,x,x,x,x,x]\n");
    for (name, previous) in [("b", "a"), ("c", "b"), ("d", "c"), ("e", "d"), ("f", "e"), ("g", "f"), ("h", "g")] {
        source.push_str(&format!("{name}: &{name} [{}]\n", vec![format!("*{previous}"); 10].join(",")));
    }
    let response = server.process(&source, None).await;
    assert!(!response.valid);
    assert_eq!(response.diagnostics.len(), 1);
    assert_eq!(response.diagnostics[0].code, "YAML004");
    server.stop().await;
}

#[tokio::test]
async fn any_authenticated_caller_may_validate_and_nobody_else() {
    let server = TestServer::start().await;
    let request = || pb::ValidateProcessRequest { source: "name: p\nsteps: []\n".to_owned(), ..Default::default() };
    let anonymous = server.client_with(Credentials::none()).validate_process(request()).await.unwrap_err();
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated);
    let garbage = server.client_with(Credentials::bearer("mst_123").unwrap()).validate_process(request()).await;
    assert_eq!(garbage.unwrap_err().code(), tonic::Code::Unauthenticated);
    let service = server.credentials.service("execution");
    server.client_with(service).validate_process(request()).await.expect("a service validates");
    // An agent, once the validator has its token from the roster's stream.
    let token = server.agents.issue("alice");
    let mut as_agent = server.client_with(Credentials::bearer(&token).unwrap());
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while let Err(status) = as_agent.validate_process(request()).await {
        assert!(tokio::time::Instant::now() < deadline, "the agent was never accepted: {status}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.agents.revoke(&token, "alice");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match as_agent.validate_process(request()).await {
            Err(status) if status.code() == tonic::Code::Unauthenticated => break,
            outcome => {
                assert!(tokio::time::Instant::now() < deadline, "still accepted 5 s after revocation: {outcome:?}")
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    server.stop().await;
}
