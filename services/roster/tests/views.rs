//! The organisation roster (its filters: all, my_team, available,
//! by_expertise), system prompts, roster import and the roster change stream.

mod common;

use common::{Backend, TestServer, delegate_request};
use muster_proto::roster::v1 as pb;
use tonic::Code;

const ROSTER_YAML: &str = r#"
teams:
  - {name: research, description: Finds things out, lead: manager-agent}
  - {name: writing, description: Writes}
agents:
  - id: research-agent
    name: Research Agent
    role: researcher
    team: research
    senior: manager-agent
    expertise: [research, writing]
    capacity: 3
    prompt: "You research carefully."
    llm_config: {model: x, temperature: 0.2}
    allow_delegation: true
  - {id: manager-agent, name: Manager, role: manager, team: research, expertise: [management]}
  - {id: writer, name: Writer, role: writer, team: writing, senior: manager-agent, expertise: [writing]}
roles:
  - name: researcher
    description: Researches
    goals: [Find sources]
    responsibilities: [Summaries]
    tools: [web_search]
    actions: [analyze, summarize, report]
  - {name: manager, actions: [create_task, assign_role]}
"#;

const WRITER_MD: &str = "# Writer\n\n## Mission\nWrite clearly.\n\n## Goals\n- Drafts\n\n## Tools\n- write_file\n\n## Actions\n- report\n\n## Schedule\n0 9 * * 1-5\n\n## Inbox\nagent/inbox/writer/\n";

fn file(name: &str, content: &str) -> pb::ImportFile {
    pb::ImportFile { name: name.into(), content: content.into() }
}

async fn import_and_views(backend: Backend) {
    let Some(mut server) = TestServer::on(backend).await else { return };

    // A broken file refuses the whole import, with positions.
    let broken = "agents:\n  - {id: ok-agent}\n  - {id: bad, senior: ghost, capacity: -1}\n";
    let response = server
        .client
        .import_roster(pb::ImportRosterRequest {
            files: vec![file("roster.yaml", ROSTER_YAML), file("bad.yaml", broken)],
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    let errors: Vec<(&str, &str, u32)> = response
        .diagnostics
        .iter()
        .map(|d| {
            (d.file_name.as_str(), d.diagnostic.as_ref().unwrap().code.as_str(), d.diagnostic.as_ref().unwrap().line)
        })
        .collect();
    assert_eq!(
        errors,
        vec![("bad.yaml", "ROS003", 3), ("roster.yaml", "ROS009", 17)],
        "an error and a warning (role writer has no definition in these files)"
    );
    assert_eq!(response.agents_imported, 0);
    assert!(
        server.client.list_agents(pb::ListAgentsRequest::default()).await.unwrap().into_inner().agents.is_empty(),
        "nothing stored"
    );
    let response = server
        .client
        .import_roster(pb::ImportRosterRequest {
            files: vec![file("bad.yaml", "agents:\n  - {id: x, senior: ghost}\n")],
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    let diagnostic = response.diagnostics[0].diagnostic.as_ref().unwrap();
    assert_eq!(
        (diagnostic.code.as_str(), diagnostic.path.as_str(), diagnostic.line, diagnostic.column),
        ("ROS007", "agents[0].senior", 2, 21)
    );

    // Dry run checks only.
    let response = server
        .client
        .import_roster(pb::ImportRosterRequest { files: vec![file("roster.yaml", ROSTER_YAML)], dry_run: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.agents_imported, 3);
    assert!(response.issued_tokens.is_empty());
    assert!(server.client.list_agents(pb::ListAgentsRequest::default()).await.unwrap().into_inner().agents.is_empty());

    let response = server
        .client
        .import_roster(pb::ImportRosterRequest {
            files: vec![file("roster.yaml", ROSTER_YAML), file("roles/writer.md", WRITER_MD)],
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(response.diagnostics.is_empty(), "{:?}", response.diagnostics);
    assert_eq!((response.agents_imported, response.teams_imported, response.roles_imported), (3, 2, 3));
    assert_eq!(response.issued_tokens.len(), 3);
    let research = server.get("research-agent").await;
    assert_eq!(
        (research.senior_id.as_str(), research.workload_capacity, research.expertise.clone()),
        ("manager-agent", 3, vec!["research".to_owned(), "writing".to_owned()])
    );
    let llm_config = muster_runtime::json::struct_to_text(research.llm_config.as_ref()).unwrap();
    assert_eq!(llm_config, r#"{"model":"x","temperature":0.2}"#);
    let teams = server.client.list_teams(pb::ListTeamsRequest::default()).await.unwrap().into_inner().teams;
    assert_eq!(teams[0].lead_agent_id, "manager-agent");
    let writer_role = server
        .client
        .get_role_definition(pb::GetRoleDefinitionRequest { name: "writer".into() })
        .await
        .unwrap()
        .into_inner()
        .role
        .unwrap();
    assert_eq!((writer_role.mission.as_str(), writer_role.schedule.as_str()), ("Write clearly.", "0 9 * * 1-5"));

    // Re-importing keeps existing agents' tokens and workload.
    let token = response.issued_tokens.iter().find(|issued| issued.agent_id == "writer").unwrap().token.clone();
    server.delegate(delegate_request("w1", "manager-agent", &["writing"])).await;
    let again = server
        .client
        .import_roster(pb::ImportRosterRequest { files: vec![file("roster.yaml", ROSTER_YAML)], dry_run: false })
        .await
        .unwrap()
        .into_inner();
    assert!(again.issued_tokens.is_empty());
    assert_eq!(
        server.client.authenticate(pb::AuthenticateRequest { token }).await.unwrap().into_inner().agent.unwrap().id,
        "writer"
    );
    let busy: u32 = server
        .client
        .list_agents(pb::ListAgentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .agents
        .iter()
        .map(|a| a.current_workload)
        .sum();
    assert_eq!(busy, 1);

    // GetOrganizationRoster: the caller apart, colleagues by filter.
    let roster = |filter: pb::RosterFilter, expertise: &str| pb::GetOrganizationRosterRequest {
        agent_id: "research-agent".into(),
        filter: filter as i32,
        expertise: expertise.into(),
    };
    let ids =
        |response: pb::GetOrganizationRosterResponse| response.colleagues.into_iter().map(|a| a.id).collect::<Vec<_>>();
    let all = server.client.get_organization_roster(roster(pb::RosterFilter::All, "")).await.unwrap().into_inner();
    assert_eq!(all.agent_context.as_ref().unwrap().id, "research-agent");
    assert_eq!(all.agent_context.as_ref().unwrap().workload_capacity, 3);
    assert_eq!(ids(all), vec!["manager-agent", "writer"]);
    assert_eq!(
        ids(server.client.get_organization_roster(roster(pb::RosterFilter::MyTeam, "")).await.unwrap().into_inner()),
        vec!["manager-agent"]
    );
    assert_eq!(
        ids(server
            .client
            .get_organization_roster(roster(pb::RosterFilter::ByExpertise, "Writing"))
            .await
            .unwrap()
            .into_inner()),
        vec!["writer"]
    );
    server
        .client
        .set_agent_status(pb::SetAgentStatusRequest {
            id: "writer".into(),
            status: pb::AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    assert_eq!(
        ids(server.client.get_organization_roster(roster(pb::RosterFilter::Available, "")).await.unwrap().into_inner()),
        vec!["manager-agent"]
    );
    let status = server.client.get_organization_roster(roster(pb::RosterFilter::ByExpertise, "")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = server
        .client
        .get_organization_roster(pb::GetOrganizationRosterRequest { agent_id: "ghost".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // The system prompt: own prompt, its role, then the organisational context and the framework.
    let prompt = server
        .client
        .render_system_prompt(pb::RenderSystemPromptRequest { agent_id: "research-agent".into() })
        .await
        .unwrap()
        .into_inner()
        .system_prompt;
    assert!(
        prompt.starts_with(
            "You research carefully.\n\n## YOUR ROLE\n\nYour role in this project: researcher (Researches).\n"
        ),
        "{prompt}"
    );
    assert!(prompt.contains("Before taking any action, THINK:"), "{prompt}");
    assert!(prompt.contains("\n## YOUR ORGANIZATIONAL CONTEXT\n\nYou are: Research Agent\nRole: researcher\nTeam: research\nYour Manager: Manager (ID: manager-agent)\nCurrent Workload: 1/3 tasks"), "{prompt}");
    assert!(prompt.contains("Your Expertise: research, writing\n"), "{prompt}");
    assert!(prompt.contains("## DELEGATION FRAMEWORK") && prompt.contains("5. Escalate to your manager"), "{prompt}");
    server.stop().await;
}

#[tokio::test]
async fn import_and_views_on_sqlite() {
    import_and_views(Backend::Sqlite).await;
}

#[tokio::test]
async fn import_and_views_on_postgres() {
    import_and_views(Backend::Postgres).await;
}

/// The next change on a WatchRoster stream that differs from `previous` (a
/// change may be announced twice: once as made, once as a refresh finds it).
async fn next_change(
    changes: &mut tonic::Streaming<pb::WatchRosterResponse>,
    previous: &mut Option<pb::WatchRosterResponse>,
) -> pb::WatchRosterResponse {
    loop {
        let change = tokio::time::timeout(std::time::Duration::from_secs(20), changes.message())
            .await
            .unwrap_or_else(|_| panic!("no change after {previous:?}"))
            .unwrap()
            .unwrap();
        if previous.as_ref() != Some(&change) {
            *previous = Some(change.clone());
            return change;
        }
    }
}

#[tokio::test]
async fn watch_roster_streams_changes() {
    let mut server = TestServer::sqlite().await;
    let mut changes = server.client.watch_roster(pb::WatchRosterRequest::default()).await.unwrap().into_inner();
    let mut previous = None;
    server.agent("alice", "", "", &["rust"], 2).await;
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!((change.kind, change.agent.unwrap().id.as_str()), (pb::RosterChangeKind::AgentUpserted as i32, "alice"));
    server.delegate(delegate_request("t", "", &["rust"])).await;
    let change = next_change(&mut changes, &mut previous).await;
    let agent = change.agent.unwrap();
    assert_eq!(
        (change.kind, agent.current_workload, agent.status),
        (pb::RosterChangeKind::AgentStatus as i32, 1, pb::AgentStatus::Busy as i32)
    );
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "t".into() }).await.unwrap();
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!(change.agent.unwrap().status, pb::AgentStatus::Idle as i32);
    server.client.remove_agent(pb::RemoveAgentRequest { id: "alice".into() }).await.unwrap();
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!((change.kind, change.agent.unwrap().id.as_str()), (pb::RosterChangeKind::AgentRemoved as i32, "alice"));
    server.stop().await;
}

/// A watcher asking for some kinds of change hears only those: one that
/// leaves out agents' status changes hears nothing of a delegation or a
/// release, while a watcher of everything still does. A kind that is not
/// one is refused, naming it.
#[tokio::test]
async fn watch_roster_sends_the_kinds_asked_for() {
    let mut server = TestServer::sqlite().await;
    let kinds = [pb::RosterChangeKind::AgentUpserted as i32, pb::RosterChangeKind::AgentRemoved as i32];
    let mut agents_only =
        server.client.watch_roster(pb::WatchRosterRequest { kinds: kinds.to_vec() }).await.unwrap().into_inner();
    let mut everything = server.client.watch_roster(pb::WatchRosterRequest::default()).await.unwrap().into_inner();
    let (mut previous, mut previous_all) = (None, None);
    server.agent("alice", "", "", &["rust"], 2).await;
    server.delegate(delegate_request("t", "", &["rust"])).await;
    server.client.release_task(pb::ReleaseTaskRequest { task_id: "t".into() }).await.unwrap();
    server.client.remove_agent(pb::RemoveAgentRequest { id: "alice".into() }).await.unwrap();
    let mut heard = Vec::new();
    for _ in 0..2 {
        heard.push(next_change(&mut agents_only, &mut previous).await.kind);
    }
    assert_eq!(heard, kinds, "the agent put, then removed: no status change between");
    let mut heard_all = Vec::new();
    for _ in 0..4 {
        heard_all.push(next_change(&mut everything, &mut previous_all).await.kind);
    }
    assert_eq!(
        heard_all,
        [
            pb::RosterChangeKind::AgentUpserted as i32,
            pb::RosterChangeKind::AgentStatus as i32,
            pb::RosterChangeKind::AgentStatus as i32,
            pb::RosterChangeKind::AgentRemoved as i32,
        ]
    );
    for kinds in [vec![0], vec![pb::RosterChangeKind::AgentUpserted as i32, 42]] {
        let status = server.client.watch_roster(pb::WatchRosterRequest { kinds: kinds.clone() }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{kinds:?}: {status:?}");
        let index = kinds.len() - 1;
        assert!(status.message().starts_with(&format!("kinds[{index}]: ")), "{status:?}");
    }
    server.stop().await;
}

/// Changes made through one replica reach the WatchRoster streams of another
/// (from the database, at its next refresh; removals at the periodic full
/// comparison).
async fn watch_roster_hears_other_replicas(backend: Backend) {
    let Some(mut first) = TestServer::on(backend).await else { return };
    let second = first.replica().await;
    let mut changes = second.client.clone().watch_roster(pb::WatchRosterRequest::default()).await.unwrap().into_inner();
    let mut previous = None;
    first.agent("alice", "", "", &["rust"], 2).await;
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!((change.kind, change.agent.unwrap().id.as_str()), (pb::RosterChangeKind::AgentUpserted as i32, "alice"));
    let role = pb::RoleDefinition { name: "reviewer".into(), description: "Reviews".into(), ..Default::default() };
    first.client.put_role_definition(pb::PutRoleDefinitionRequest { role: Some(role) }).await.unwrap();
    let change = next_change(&mut changes, &mut previous).await;
    let role = change.role.unwrap();
    assert_eq!(
        (change.kind, role.name.as_str(), role.description.as_str()),
        (pb::RosterChangeKind::RoleUpserted as i32, "reviewer", "Reviews")
    );
    first.client.remove_role_definition(pb::RemoveRoleDefinitionRequest { name: "reviewer".into() }).await.unwrap();
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!(
        (change.kind, change.role.unwrap().name.as_str()),
        (pb::RosterChangeKind::RoleRemoved as i32, "reviewer")
    );
    first.client.remove_agent(pb::RemoveAgentRequest { id: "alice".into() }).await.unwrap();
    let change = next_change(&mut changes, &mut previous).await;
    assert_eq!((change.kind, change.agent.unwrap().id.as_str()), (pb::RosterChangeKind::AgentRemoved as i32, "alice"));
    second.stop().await;
    first.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_roster_hears_other_replicas_on_sqlite() {
    watch_roster_hears_other_replicas(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_roster_hears_other_replicas_on_postgres() {
    watch_roster_hears_other_replicas(Backend::Postgres).await;
}
