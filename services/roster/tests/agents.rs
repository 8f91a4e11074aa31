//! Agents, teams, role definitions and credentials through the gRPC service.

mod common;

use common::{Backend, TestServer};
use muster_proto::roster::v1 as pb;
use tonic::Code;
use tonic_types::StatusExt as _;

async fn agents_teams_and_roles(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };
    server.team("research").await;
    let token = server.agent("manager-agent", "research", "", &["management"], 0).await;
    assert!(token.starts_with("mst_") && token.len() == 68, "{token}");
    server.agent("research-agent", "research", "manager-agent", &["Research", "writing"], 3).await;

    let agent = server.get("research-agent").await;
    assert_eq!(agent.name, "Research-agent");
    assert_eq!(agent.expertise, vec!["research", "writing"]);
    assert_eq!(agent.workload_capacity, 3);
    assert_eq!(agent.max_iterations, 10);
    assert_eq!(agent.status, pb::AgentStatus::Idle as i32);
    assert_eq!(server.get("manager-agent").await.workload_capacity, 5, "capacity defaults to 5");

    // Validation with precise messages.
    let bad = |agent: pb::Agent| pb::RegisterAgentRequest { agent: Some(agent) };
    let status =
        server.client.register_agent(bad(pb::Agent { id: "Bad Id".into(), ..Default::default() })).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("agent.id"), "{}", status.message());
    let status =
        server.client.register_agent(bad(pb::Agent { id: "x".repeat(65), ..Default::default() })).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = server
        .client
        .register_agent(bad(pb::Agent { id: "a".into(), senior_id: "ghost".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("senior \"ghost\" does not exist"), "{}", status.message());
    let status = server
        .client
        .register_agent(bad(pb::Agent { id: "a".into(), team: "nowhere".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert!(status.message().contains("team \"nowhere\" does not exist"), "{}", status.message());
    let status = server
        .client
        .register_agent(bad(pb::Agent { id: "a".into(), llm_config: Some(not_json()), ..Default::default() }))
        .await
        .unwrap_err();
    assert!(status.message().contains("agent.llm_config $.temperature is NaN"), "{}", status.message());
    let status = server
        .client
        .register_agent(bad(pb::Agent { id: "research-agent".into(), ..Default::default() }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);
    let status = server.client.register_agent(pb::RegisterAgentRequest { agent: None }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = server.client.get_agent(pb::GetAgentRequest { id: "ghost".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Hierarchy cycles are refused.
    let mut update = server.get("manager-agent").await;
    update.senior_id = "research-agent".into();
    let status = server
        .client
        .update_agent(pb::UpdateAgentRequest { agent: Some(update), update_mask: None })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("manager-agent -> research-agent -> manager-agent"), "{}", status.message());

    // Update keeps workload and token.
    let mut update = server.get("research-agent").await;
    update.expertise = vec!["rust".into()];
    update.custom_prompt = "Be brief.".into();
    let updated = server
        .client
        .update_agent(pb::UpdateAgentRequest { agent: Some(update), update_mask: None })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(updated.expertise, vec!["rust"]);
    assert_eq!(updated.custom_prompt, "Be brief.");

    // An update mask changes the fields it names and keeps the others; a
    // field an update may not change is refused, naming the mask's entry.
    let masked = pb::Agent { id: "research-agent".into(), backstory: "Reads a lot.".into(), ..Default::default() };
    let mask =
        |paths: &[&str]| Some(prost_types::FieldMask { paths: paths.iter().map(|path| (*path).to_owned()).collect() });
    let updated = server
        .client
        .update_agent(pb::UpdateAgentRequest { agent: Some(masked.clone()), update_mask: mask(&["backstory"]) })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!((updated.backstory.as_str(), updated.custom_prompt.as_str()), ("Reads a lot.", "Be brief."));
    assert_eq!((updated.expertise.clone(), updated.senior_id.as_str()), (vec!["rust".to_owned()], "manager-agent"));
    let status = server
        .client
        .update_agent(pb::UpdateAgentRequest {
            agent: Some(masked),
            update_mask: mask(&["backstory", "current_workload"]),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("update_mask.paths[1]: 'current_workload' is not a field"),
        "{}",
        status.message()
    );
    let violations = status.get_details_bad_request().expect("a BadRequest").field_violations;
    assert_eq!(violations[0].field, "update_mask.paths[1]");

    // Listing with filters and pagination by id.
    for index in 0..5 {
        server.agent(&format!("worker-{index}"), "", "", &["rust"], 0).await;
    }
    let page = server
        .client
        .list_agents(pb::ListAgentsRequest { page_size: 3, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = page.agents.iter().map(|agent| agent.id.as_str()).collect();
    assert_eq!(ids, vec!["manager-agent", "research-agent", "worker-0"]);
    assert_eq!(page.next_page_token, "worker-0");
    let page = server
        .client
        .list_agents(pb::ListAgentsRequest { page_size: 3, page_token: page.next_page_token, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = page.agents.iter().map(|agent| agent.id.as_str()).collect();
    assert_eq!(ids, vec!["worker-1", "worker-2", "worker-3"]);
    let page = server
        .client
        .list_agents(pb::ListAgentsRequest { page_size: 3, page_token: page.next_page_token, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(page.agents.len(), 1);
    assert!(page.next_page_token.is_empty());
    let rust = server
        .client
        .list_agents(pb::ListAgentsRequest { expertise: "Rust".into(), team: "research".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rust.agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec!["research-agent"]);

    // Manual status sticks; UNSPECIFIED returns to the derived one.
    let offline = server
        .client
        .set_agent_status(pb::SetAgentStatusRequest {
            id: "worker-0".into(),
            status: pb::AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(offline.status, pb::AgentStatus::Offline as i32);
    let listed = server
        .client
        .list_agents(pb::ListAgentsRequest { status: pb::AgentStatus::Offline as i32, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.agents.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec!["worker-0"]);
    let back = server
        .client
        .set_agent_status(pb::SetAgentStatusRequest { id: "worker-0".into(), status: 0, availability_until: None })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(back.status, pb::AgentStatus::Idle as i32);
    let status = server
        .client
        .set_agent_status(pb::SetAgentStatusRequest { id: "worker-0".into(), status: 42, availability_until: None })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    // Teams.
    let status = server
        .client
        .put_team(pb::PutTeamRequest {
            team: Some(pb::Team { name: "ops".into(), description: "".into(), lead_agent_id: "ghost".into() }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    server
        .client
        .put_team(pb::PutTeamRequest {
            team: Some(pb::Team {
                name: "ops".into(),
                description: "Operations".into(),
                lead_agent_id: "worker-1".into(),
            }),
        })
        .await
        .unwrap();
    let teams = server.client.list_teams(pb::ListTeamsRequest::default()).await.unwrap().into_inner().teams;
    assert_eq!(teams.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), vec!["ops", "research"]);
    let status = server.client.remove_team(pb::RemoveTeamRequest { name: "research".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("manager-agent"), "{}", status.message());
    server.client.remove_team(pb::RemoveTeamRequest { name: "ops".into() }).await.unwrap();
    let status = server.client.remove_team(pb::RemoveTeamRequest { name: "ops".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Role definitions.
    let role = pb::RoleDefinition {
        name: "reviewer".into(),
        description: "Reviews".into(),
        goals: vec!["quality".into()],
        tools: vec!["read_file".into(), "read_file".into()],
        permitted_actions: vec!["review".into(), "approve".into()],
        mission: "Keep quality high".into(),
        context_files: vec!["project/scope.md".into()],
        read_paths: vec!["project/".into(), " reviews/notes.md ".into()],
        write_paths: vec!["reviews/".into()],
        schedule: "0 9 * * 1-5".into(),
        inbox: "agent/inbox/reviewer/".into(),
        ..Default::default()
    };
    let stored = server
        .client
        .put_role_definition(pb::PutRoleDefinitionRequest { role: Some(role.clone()) })
        .await
        .unwrap()
        .into_inner()
        .role
        .unwrap();
    assert_eq!(stored.tools, vec!["read_file"]);
    assert_eq!(
        (stored.read_paths.clone(), stored.write_paths.clone()),
        (vec!["project/".to_owned(), "reviews/notes.md".to_owned()], vec!["reviews/".to_owned()])
    );
    let fetched = server
        .client
        .get_role_definition(pb::GetRoleDefinitionRequest { name: "reviewer".into() })
        .await
        .unwrap()
        .into_inner()
        .role
        .unwrap();
    assert_eq!(fetched, stored);
    let status = server
        .client
        .put_role_definition(pb::PutRoleDefinitionRequest {
            role: Some(pb::RoleDefinition { name: "x".into(), input_schema: Some(not_json()), ..Default::default() }),
        })
        .await
        .unwrap_err();
    assert!(status.message().contains("role.input_schema $.temperature is NaN"), "{}", status.message());
    let status = server
        .client
        .put_role_definition(pb::PutRoleDefinitionRequest {
            role: Some(pb::RoleDefinition {
                name: "x".into(),
                write_paths: vec!["../up".into()],
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("role.write_paths[0]"), "{}", status.message());
    let roles = server
        .client
        .list_role_definitions(pb::ListRoleDefinitionsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .roles;
    assert_eq!(roles.len(), 1);
    server.client.remove_role_definition(pb::RemoveRoleDefinitionRequest { name: "reviewer".into() }).await.unwrap();
    let status =
        server.client.get_role_definition(pb::GetRoleDefinitionRequest { name: "reviewer".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Removing a senior is refused while juniors report to it.
    let status = server.client.remove_agent(pb::RemoveAgentRequest { id: "manager-agent".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    server.client.remove_agent(pb::RemoveAgentRequest { id: "worker-4".into() }).await.unwrap();
    let status = server.client.remove_agent(pb::RemoveAgentRequest { id: "worker-4".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    server.stop().await;
}

async fn credentials(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };
    let token = server.agent("alice", "", "", &[], 0).await;
    let authenticated = server
        .client
        .authenticate(pb::AuthenticateRequest { token: token.clone() })
        .await
        .unwrap()
        .into_inner()
        .agent
        .unwrap();
    assert_eq!(authenticated.id, "alice");

    let status = server.client.authenticate(pb::AuthenticateRequest { token: "mst_nope".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    let status = server.client.authenticate(pb::AuthenticateRequest { token: String::new() }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);

    let rotated = server
        .client
        .rotate_token(pb::RotateTokenRequest { agent_id: "alice".into() })
        .await
        .unwrap()
        .into_inner()
        .token;
    assert_ne!(rotated, token);
    assert_eq!(
        server.client.authenticate(pb::AuthenticateRequest { token: token.clone() }).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        server
            .client
            .authenticate(pb::AuthenticateRequest { token: rotated.clone() })
            .await
            .unwrap()
            .into_inner()
            .agent
            .unwrap()
            .id,
        "alice"
    );

    server.client.revoke_token(pb::RevokeTokenRequest { agent_id: "alice".into() }).await.unwrap();
    assert_eq!(
        server.client.authenticate(pb::AuthenticateRequest { token: rotated }).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    assert_eq!(
        server.client.rotate_token(pb::RotateTokenRequest { agent_id: "ghost".into() }).await.unwrap_err().code(),
        Code::NotFound
    );

    // Removing an agent revokes its token.
    let token = server
        .client
        .rotate_token(pb::RotateTokenRequest { agent_id: "alice".into() })
        .await
        .unwrap()
        .into_inner()
        .token;
    server.client.remove_agent(pb::RemoveAgentRequest { id: "alice".into() }).await.unwrap();
    assert_eq!(
        server.client.authenticate(pb::AuthenticateRequest { token }).await.unwrap_err().code(),
        Code::Unauthenticated
    );
    server.stop().await;
}

#[tokio::test]
async fn agents_teams_and_roles_on_sqlite() {
    agents_teams_and_roles(Backend::Sqlite).await;
}

#[tokio::test]
async fn agents_teams_and_roles_on_postgres() {
    agents_teams_and_roles(Backend::Postgres).await;
}

/// Teams and role definitions page by count and by size: a page of long
/// role definitions ends early, and the pages join up with none missing.
async fn teams_and_roles_page(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };
    for index in 0..5 {
        server.team(&format!("team-{index}")).await;
    }
    let mut names = Vec::new();
    let mut page_token = String::new();
    loop {
        let page =
            server.client.list_teams(pb::ListTeamsRequest { page_size: 2, page_token }).await.unwrap().into_inner();
        assert!(page.teams.len() <= 2);
        names.extend(page.teams.into_iter().map(|team| team.name));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(names, (0..5).map(|index| format!("team-{index}")).collect::<Vec<_>>());

    // Twelve roles of ~200 KiB each: more than one message could hold.
    for index in 0..12 {
        let role = pb::RoleDefinition {
            name: format!("role-{index:02}"),
            mission: "m".repeat(64 * 1024),
            user_preferences: "u".repeat(64 * 1024),
            input_schema: muster_runtime::json::struct_from_text(&format!(
                "{{\"description\": \"{}\"}}",
                "d".repeat(60 * 1024)
            ))
            .unwrap(),
            ..Default::default()
        };
        server.client.put_role_definition(pb::PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    }
    let (mut roles, mut pages) = (Vec::new(), 0);
    let mut page_token = String::new();
    loop {
        let page = server
            .client
            .list_role_definitions(pb::ListRoleDefinitionsRequest { page_size: 0, page_token })
            .await
            .unwrap()
            .into_inner();
        pages += 1;
        roles.extend(page.roles.into_iter().map(|role| role.name));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(roles, (0..12).map(|index| format!("role-{index:02}")).collect::<Vec<_>>());
    assert!(pages >= 2, "{pages} page(s) for 2.3 MB of roles");
    server.stop().await;
}

#[tokio::test]
async fn teams_and_roles_page_on_sqlite() {
    teams_and_roles_page(Backend::Sqlite).await;
}

#[tokio::test]
async fn teams_and_roles_page_on_postgres() {
    teams_and_roles_page(Backend::Postgres).await;
}

#[tokio::test]
async fn credentials_on_sqlite() {
    credentials(Backend::Sqlite).await;
}

#[tokio::test]
async fn credentials_on_postgres() {
    credentials(Backend::Postgres).await;
}

#[tokio::test]
async fn the_token_is_stored_only_as_a_hash() {
    let mut server = TestServer::sqlite().await;
    let token = server.agent("alice", "", "", &[], 0).await;
    let url = server.database_url.clone();
    let _file = server.take_file();
    server.stop().await;
    let path = url.trim_start_matches("sqlite://");
    let bytes = std::fs::read(path).unwrap();
    let wal = std::fs::read(format!("{path}-wal")).unwrap_or_default();
    let haystack = [bytes, wal].concat();
    assert!(
        !haystack.windows(token.len()).any(|window| window == token.as_bytes()),
        "the raw token is in the database"
    );
}

#[tokio::test]
async fn model_settings_never_hold_a_key() {
    let mut server = TestServer::sqlite().await;
    let text = |text: &str| prost_types::Value { kind: Some(prost_types::value::Kind::StringValue(text.into())) };
    let settings = |entries: Vec<(&str, prost_types::Value)>| prost_types::Struct {
        fields: entries.into_iter().map(|(key, value)| (key.to_owned(), value)).collect(),
    };
    let register = |llm_config: prost_types::Struct| pb::RegisterAgentRequest {
        agent: Some(pb::Agent { id: "model-agent".into(), llm_config: Some(llm_config), ..Default::default() }),
    };

    let secret = "sk-live-0123456789abcdef";
    let status = server
        .client
        .register_agent(register(settings(vec![
            ("provider", text("openai")),
            ("model", text("m")),
            ("api_key", text(secret)),
        ])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(!status.message().contains(secret), "the key is echoed: {}", status.message());
    assert!(status.message().contains("agent.llm_config.api_key"), "{}", status.message());
    assert!(status.message().contains("api_key_env"), "{}", status.message());
    let violations = status.get_details_bad_request().expect("a BadRequest").field_violations;
    assert_eq!(violations[0].field, "agent.llm_config.api_key");
    assert!(!format!("{violations:?}").contains(secret));

    let headers = prost_types::Value {
        kind: Some(prost_types::value::Kind::StructValue(settings(vec![("Authorization", text("Bearer abc"))]))),
    };
    let status = server.client.register_agent(register(settings(vec![("headers", headers)]))).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("agent.llm_config.headers.Authorization"), "{}", status.message());
    assert!(!status.message().contains("Bearer abc"), "{}", status.message());

    // Named, the key's variable is accepted; a key the agent does not read is kept.
    let named = settings(vec![
        ("provider", text("anthropic")),
        ("model", text("claude")),
        ("api_key_env", text("ANTHROPIC_API_KEY")),
        ("seed", text("7")),
    ]);
    server.client.register_agent(register(named)).await.unwrap();
    let mut update = server.get("model-agent").await;
    assert_eq!(update.llm_config.as_ref().unwrap().fields["seed"], text("7"));
    update.llm_config.as_mut().unwrap().fields.insert("model".into(), text(secret));
    let status = server
        .client
        .update_agent(pb::UpdateAgentRequest { agent: Some(update), update_mask: None })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("agent.llm_config.model"), "{}", status.message());
    assert!(!status.message().contains(secret), "{}", status.message());
}

/// An object JSON cannot hold: a number that is not finite.
fn not_json() -> prost_types::Struct {
    let nan = prost_types::Value { kind: Some(prost_types::value::Kind::NumberValue(f64::NAN)) };
    prost_types::Struct { fields: [("temperature".to_owned(), nan)].into() }
}
