//! The delegation scenarios and edge cases, through the gRPC service, on SQLite
//! and PostgreSQL.

mod common;

use common::{Backend, TestServer, delegate_request};
use muster_proto::roster::v1 as pb;
use pb::{DecisionKind as Kind, DelegationTier as Tier};

/// cto (leadership) <- fe-lead (frontend) <- alice, carol (frontend); cto <- bob, dave (backend).
async fn organisation(backend: Backend) -> Option<TestServer> {
    let mut server = TestServer::on(backend).await?;
    for team in ["leadership", "frontend", "backend"] {
        server.team(team).await;
    }
    server.agent("cto", "leadership", "", &["management"], 5).await;
    server.agent("fe-lead", "frontend", "cto", &["react", "management"], 5).await;
    server.agent("alice", "frontend", "fe-lead", &["react", "css"], 5).await;
    server.agent("carol", "frontend", "fe-lead", &["css"], 5).await;
    server.agent("bob", "backend", "cto", &["react", "node"], 5).await;
    server.agent("dave", "backend", "cto", &["node", "go"], 1).await;
    Some(server)
}

fn kind(decision: &pb::DelegationDecision) -> Kind {
    Kind::try_from(decision.decision).unwrap()
}

fn tier(decision: &pb::DelegationDecision) -> Tier {
    Tier::try_from(decision.tier).unwrap()
}

async fn delegation_scenarios(backend: Backend) {
    let Some(mut server) = organisation(backend).await else { return };

    // Senior to junior, same team, exact expertise; the fallback is the cross-team expert.
    let decision = server.delegate(delegate_request("t1", "fe-lead", &["react"])).await;
    assert_eq!((kind(&decision), tier(&decision)), (Kind::Delegate, Tier::SameTeamMatch));
    assert_eq!(decision.primary_agent_id, "alice");
    assert_eq!(decision.fallback_agent_id, "bob");
    assert_eq!(decision.candidates, vec!["alice", "bob"]);
    assert!(decision.text.starts_with("DELEGATION DECISION:\nPrimary Choice: Alice (member, react expertise, same team, idle, 0/5 tasks)\nFallback: Bob ("), "{}", decision.text);
    assert!(decision.text.contains("Decision: DELEGATE to Alice\nReasoning: "), "{}", decision.text);
    assert_eq!(server.get("alice").await.current_workload, 1, "the slot is reserved");
    assert_eq!(server.get("alice").await.status, pb::AgentStatus::Active as i32);

    // Tie-break: lower workload first, then id.
    server.agent("anna", "frontend", "fe-lead", &["react"], 5).await;
    let decision = server.delegate(delegate_request("t2", "fe-lead", &["react"])).await;
    assert_eq!(decision.primary_agent_id, "anna", "anna has 0 tasks, alice 1");
    let decision = server.delegate(delegate_request("t3", "fe-lead", &["react"])).await;
    assert_eq!(decision.primary_agent_id, "alice", "both hold 1 task: alice < anna");

    // Peer coordination: alice hands css work to carol (never to herself).
    let decision = server.delegate(delegate_request("t4", "alice", &["css"])).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Delegate, "carol"));

    // Partial expertise in the team comes before a full match in another team.
    let decision = server.delegate(delegate_request("t5", "fe-lead", &["react", "node"])).await;
    assert_eq!(tier(&decision), Tier::SameTeamPartial);
    assert_eq!(decision.primary_agent_id, "anna");
    assert!(decision.reasoning.contains("part of it (react)"), "{}", decision.reasoning);

    // Cross-team with the coordination note.
    let decision = server.delegate(delegate_request("t6", "fe-lead", &["node"])).await;
    assert_eq!((tier(&decision), decision.primary_agent_id.as_str()), (Tier::CrossTeamMatch, "bob"));
    assert!(decision.notes.contains("coordination overhead"), "{}", decision.notes);

    // The orchestrator (no requester) with a team.
    let decision =
        server.delegate(pb::DelegateRequest { team: "backend".into(), ..delegate_request("t7", "", &["node"]) }).await;
    assert_eq!((tier(&decision), decision.primary_agent_id.as_str()), (Tier::SameTeamMatch, "dave"));

    // A team named in the request wins over the requester's own team.
    let decision = server
        .delegate(pb::DelegateRequest { team: "backend".into(), ..delegate_request("t7b", "fe-lead", &["node"]) })
        .await;
    assert_eq!((tier(&decision), decision.primary_agent_id.as_str()), (Tier::SameTeamMatch, "bob"), "dave is full");

    // Queue versus escalate: dave (the only go expert) is now at capacity 1/1.
    assert_eq!(server.get("dave").await.status, pb::AgentStatus::Busy as i32);
    let decision = server.delegate(delegate_request("t8", "bob", &["go"])).await;
    assert_eq!((kind(&decision), tier(&decision)), (Kind::Queue, Tier::QueueForExpert));
    assert_eq!(decision.primary_agent_id, "dave");
    assert_eq!(decision.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(), 1800, "one average task");
    assert_eq!(decision.fallback_agent_id, "cto", "the senior to escalate to");
    assert!(
        decision.text.contains("Decision: QUEUE for Dave\n") && decision.text.contains("Wait Time: 30m\n"),
        "{}",
        decision.text
    );

    // At capacity only urgent tasks: a critical one takes dave's one slot
    // over capacity (2/1); the next cannot wait and escalates.
    let critical = |task: &str| pb::DelegateRequest {
        urgency: pb::Urgency::Critical as i32,
        ..delegate_request(task, "bob", &["go"])
    };
    let decision = server.delegate(critical("t9")).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Delegate, "dave"));
    assert!(decision.text.contains("placed over capacity because the task is urgent (critical)"), "{}", decision.text);
    assert_eq!(
        (server.get("dave").await.current_workload, server.get("dave").await.status),
        (2, pb::AgentStatus::Busy as i32)
    );
    let decision = server.delegate(critical("t9b")).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Escalate, "cto"));
    assert!(decision.reasoning.contains("critical task cannot wait"), "{}", decision.reasoning);

    // A known availability: five hours is too long for a normal task, fine for a low one.
    server
        .client
        .set_agent_status(pb::SetAgentStatusRequest {
            id: "dave".into(),
            status: 0,
            availability_until: Some(muster_runtime::time::to_timestamp(server.clock_now() + 5 * 3_600_000)),
        })
        .await
        .unwrap();
    let decision = server.delegate(delegate_request("t10", "bob", &["go"])).await;
    assert_eq!(kind(&decision), Kind::Escalate);
    assert!(decision.reasoning.contains("exceeds the 4h a normal task may wait"), "{}", decision.reasoning);
    let low = pb::DelegateRequest { urgency: pb::Urgency::Low as i32, ..delegate_request("t11", "bob", &["go"]) };
    let decision = server.delegate(low).await;
    assert_eq!(kind(&decision), Kind::Queue);
    assert_eq!(
        decision.estimated_wait.map(|wait| wait.seconds).unwrap_or_default(),
        5 * 3600 + 1800,
        "availability plus one task queued ahead"
    );
    let deadline = pb::DelegateRequest {
        urgency: pb::Urgency::Low as i32,
        deadline: Some(muster_runtime::time::to_timestamp(server.clock_now() + 3_600_000)),
        ..delegate_request("t12", "bob", &["go"])
    };
    let decision = server.delegate(deadline).await;
    assert_eq!(kind(&decision), Kind::Escalate);
    assert!(decision.reasoning.contains("past the deadline"), "{}", decision.reasoning);

    // No expertise anywhere: escalate for guidance.
    let decision = server.delegate(delegate_request("t13", "alice", &["cobol"])).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Escalate, "fe-lead"));
    assert!(decision.reasoning.contains("No colleague has the required expertise"), "{}", decision.reasoning);
    server.stop().await;
}

async fn edge_cases(backend: Backend) {
    let Some(mut server) = organisation(backend).await else { return };

    // Colleague not in the roster: escalate to the manager.
    let named = pb::DelegateRequest { preferred_agent_id: "ghost".into(), ..delegate_request("e1", "alice", &["css"]) };
    let decision = server.delegate(named).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Escalate, "fe-lead"));
    assert!(decision.reasoning.contains("Colleague \"ghost\" is not in the roster"), "{}", decision.reasoning);

    // A named, eligible colleague is accepted (tier NAMED), with a note when it lacks expertise.
    let named =
        pb::DelegateRequest { preferred_agent_id: "carol".into(), ..delegate_request("e2", "fe-lead", &["react"]) };
    let decision = server.delegate(named).await;
    assert_eq!((tier(&decision), decision.primary_agent_id.as_str()), (Tier::Named, "carol"));
    assert_eq!(decision.fallback_agent_id, "alice");
    assert!(decision.notes.contains("lacks some required expertise"), "{}", decision.notes);

    // A named colleague who is offline is not chosen; the framework decides.
    server
        .client
        .set_agent_status(pb::SetAgentStatusRequest {
            id: "carol".into(),
            status: pb::AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    let named =
        pb::DelegateRequest { preferred_agent_id: "carol".into(), ..delegate_request("e3", "fe-lead", &["css"]) };
    let decision = server.delegate(named).await;
    assert_eq!((tier(&decision), decision.primary_agent_id.as_str()), (Tier::SameTeamMatch, "alice"));
    assert!(decision.notes.contains("carol") || decision.notes.contains("Carol"), "{}", decision.notes);

    // All experts offline: never delegated to, escalate.
    server
        .client
        .set_agent_status(pb::SetAgentStatusRequest {
            id: "alice".into(),
            status: pb::AgentStatus::Offline as i32,
            availability_until: None,
        })
        .await
        .unwrap();
    let decision = server.delegate(delegate_request("e4", "fe-lead", &["css"])).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Escalate, "cto"));
    assert!(decision.reasoning.contains("offline"), "{}", decision.reasoning);
    assert!(!decision.candidates.contains(&"alice".to_owned()));

    // Delegation loop: bob got the node task from dave; he may not hand it back.
    let looped =
        pb::DelegateRequest { delegation_chain: vec!["dave".into()], ..delegate_request("e5", "bob", &["go"]) };
    let decision = server.delegate(looped).await;
    assert_eq!((kind(&decision), decision.primary_agent_id.as_str()), (Kind::Escalate, "cto"));
    assert!(
        decision.notes.contains("loop prevented: the task came through dave -> bob; not delegating back to dave"),
        "{}",
        decision.notes
    );
    assert!(decision.reasoning.contains("delegation chain"), "{}", decision.reasoning);
    // The senior is skipped when it is in the chain too: nobody is left.
    let looped = pb::DelegateRequest {
        delegation_chain: vec!["cto".into(), "dave".into()],
        ..delegate_request("e6", "bob", &["go"])
    };
    let decision = server.delegate(looped).await;
    assert_eq!(kind(&decision), Kind::Escalate);
    assert!(decision.primary_agent_id.is_empty());
    assert!(decision.text.contains("Decision: ESCALATE to the orchestrator"), "{}", decision.text);

    // Workload overflow: dave holds 1/1; a second node task goes elsewhere, never over capacity.
    let decision =
        server.delegate(pb::DelegateRequest { team: "backend".into(), ..delegate_request("e7", "", &["go"]) }).await;
    assert_eq!(decision.primary_agent_id, "dave");
    let decision =
        server.delegate(pb::DelegateRequest { team: "backend".into(), ..delegate_request("e8", "", &["go"]) }).await;
    assert_eq!(kind(&decision), Kind::Queue);
    assert_eq!(server.get("dave").await.current_workload, 1);

    // Unknown requester is the caller's mistake.
    let status = server.client.delegate(delegate_request("e9", "ghost", &["go"])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    let status = server.client.delegate(delegate_request("", "bob", &["go"])).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let status = server
        .client
        .delegate(pb::DelegateRequest { urgency: 9, ..delegate_request("e10", "bob", &["go"]) })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);

    // Dry run reserves and records nothing.
    server
        .client
        .set_agent_status(pb::SetAgentStatusRequest { id: "alice".into(), status: 0, availability_until: None })
        .await
        .unwrap();
    let response = server
        .client
        .delegate(pb::DelegateRequest { dry_run: true, ..delegate_request("e11", "fe-lead", &["css"]) })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.decision.unwrap().primary_agent_id, "alice");
    assert!(response.delegation_id.is_empty());
    assert_eq!(server.get("alice").await.current_workload, 1, "only e3 holds a slot");

    // Re-delegating a task moves its slot.
    server.delegate(delegate_request("e12", "fe-lead", &["css"])).await;
    assert_eq!(server.get("alice").await.current_workload, 2);
    let onward = pb::DelegateRequest {
        delegation_chain: vec!["fe-lead".into()],
        ..delegate_request("e12", "alice", &["react"])
    };
    let decision = server.delegate(onward).await;
    assert_eq!(decision.primary_agent_id, "bob");
    assert_eq!(server.get("alice").await.current_workload, 1);
    assert_eq!(server.get("bob").await.current_workload, 1);

    // The audit trail.
    let records = server
        .client
        .list_delegations(pb::ListDelegationsRequest { task_id: "e12".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(records.len(), 2);
    assert_eq!(records[0].requester_id, "fe-lead");
    assert_eq!(records[1].decision.as_ref().unwrap().primary_agent_id, "bob");
    let by_agent = server
        .client
        .list_delegations(pb::ListDelegationsRequest { agent_id: "cto".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert!(
        by_agent
            .iter()
            .all(|record| record.decision.as_ref().unwrap().primary_agent_id == "cto" || record.requester_id == "cto")
    );
    assert_eq!(by_agent.len(), 2, "e4 and e5 escalated to the cto");
    let all = server.client.list_delegations(pb::ListDelegationsRequest::default()).await.unwrap().into_inner().records;
    assert_eq!(all.len(), 10, "every non-dry-run decision is recorded");
    // Pages of three follow one another to the same records, the last one short.
    let (mut paged, mut page_token, mut pages) = (Vec::new(), String::new(), 0);
    loop {
        let request = pb::ListDelegationsRequest { limit: 3, page_token: page_token.clone(), ..Default::default() };
        let page = server.client.list_delegations(request).await.unwrap().into_inner();
        pages += 1;
        paged.extend(page.records.into_iter().map(|record| record.id));
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(paged, all.iter().map(|record| record.id.clone()).collect::<Vec<_>>());
    assert_eq!(pages, 4);
    let forged = pb::ListDelegationsRequest { page_token: "not-a-token".into(), ..Default::default() };
    let refused = server.client.list_delegations(forged).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    server.clock.advance(60_000);
    server.delegate(delegate_request("e13", "fe-lead", &["css"])).await;
    let since = muster_runtime::time::to_timestamp(server.clock_now());
    let recent = server
        .client
        .list_delegations(pb::ListDelegationsRequest { since: Some(since), ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(recent.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), vec!["e13"]);
    let before = server
        .client
        .list_delegations(pb::ListDelegationsRequest { until: Some(since), limit: 3, ..Default::default() })
        .await
        .unwrap()
        .into_inner()
        .records;
    assert_eq!(before.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), vec!["e1", "e2", "e3"]);
    server.stop().await;
}

#[tokio::test]
async fn delegation_scenarios_on_sqlite() {
    delegation_scenarios(Backend::Sqlite).await;
}

#[tokio::test]
async fn delegation_scenarios_on_postgres() {
    delegation_scenarios(Backend::Postgres).await;
}

#[tokio::test]
async fn edge_cases_on_sqlite() {
    edge_cases(Backend::Sqlite).await;
}

#[tokio::test]
async fn edge_cases_on_postgres() {
    edge_cases(Backend::Postgres).await;
}
