//! One conformance suite over the repository, run against SQLite and PostgreSQL.

mod common;

use muster_roster::{
    Error,
    domain::{
        delegation::{DecisionKind, DelegationRequest, Settings, Urgency},
        model::{Agent, AgentField, RoleDefinition, Status, Team},
    },
    store::{AgentQuery, DelegationQuery, INDEX_FULL_CHECK_EVERY, ImportPlan, QueueState, SqlStore, Store},
};
use muster_runtime::{
    auth::{TokenHash, directory::Position},
    testing::TestDatabase,
};

const NOW: i64 = common::START_MILLIS;

fn token(text: &str) -> TokenHash {
    TokenHash::of(text)
}

fn agent(id: &str, team: &str, senior: &str, expertise: &[&str], capacity: u32) -> Agent {
    Agent {
        id: id.into(),
        team: team.into(),
        senior_id: senior.into(),
        expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
        workload_capacity: capacity,
        ..Agent::default()
    }
    .normalize()
    .expect("valid agent")
}

fn request(task_id: &str, requester: &str, expertise: &[&str]) -> DelegationRequest {
    DelegationRequest {
        task_id: task_id.into(),
        requester_id: requester.into(),
        required_expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
        ..DelegationRequest::default()
    }
}

/// The organisation held in memory answers every listing as the database does.
async fn assert_index_agrees(store: &SqlStore, moment: &str) {
    let all = store.list_agents(&AgentQuery::default()).await.unwrap();
    let mut queries = vec![AgentQuery::default(), AgentQuery { available_only: true, ..AgentQuery::default() }];
    for status in [Status::Idle, Status::Active, Status::Busy, Status::Offline] {
        queries.push(AgentQuery { status: Some(status), ..AgentQuery::default() });
    }
    for agent in all.iter().take(20) {
        queries.push(AgentQuery { team: agent.team.clone(), ..AgentQuery::default() });
        queries.push(AgentQuery {
            role: agent.role.clone(),
            after_id: agent.id.clone(),
            limit: 3,
            ..AgentQuery::default()
        });
        for tag in &agent.expertise {
            queries.push(AgentQuery { expertise: tag.clone(), available_only: true, ..AgentQuery::default() });
        }
    }
    for query in &queries {
        let stored = store.list_agents(query).await.unwrap();
        let indexed: Vec<Agent> =
            store.indexed_agents(query).await.unwrap().iter().map(|agent| (**agent).clone()).collect();
        assert_eq!(indexed, stored, "{moment}: {query:?}");
    }
    for agent in &all {
        assert_eq!(*store.indexed_agent(&agent.id).await.unwrap(), *agent, "{moment}");
    }
}

async fn conformance(store: SqlStore) {
    store.migrate().await.expect("migrate");
    store.migrate().await.expect("migrations are idempotent");

    // Teams and agents.
    store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    let boss = store.insert_agent(&agent("boss", "core", "", &["plan"], 5), &token("hash-boss"), NOW).await.unwrap();
    assert_eq!((boss.current_workload, boss.workload_capacity, boss.status()), (0, 5, Status::Idle));
    store.insert_agent(&agent("dev", "core", "boss", &["rust", "sql"], 2), &token("hash-dev"), NOW).await.unwrap();
    assert!(matches!(
        store.insert_agent(&agent("dev", "", "", &[], 0), &token("other"), NOW).await,
        Err(Error::AlreadyExists { .. })
    ));
    assert!(matches!(
        store.insert_agent(&agent("x", "", "ghost", &[], 0), &token("x"), NOW).await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(
        store.insert_agent(&agent("x", "nowhere", "", &[], 0), &token("x"), NOW).await,
        Err(Error::InvalidArgument { .. })
    ));
    assert!(matches!(store.get_agent("ghost").await, Err(Error::NotFound { .. })));
    assert!(
        matches!(
            store.insert_agent(&agent("x", "", "", &[], 0), &token("hash-dev"), NOW).await,
            Err(Error::Database(_))
        ),
        "token hashes are unique"
    );

    let listed = store.list_agents(&AgentQuery { expertise: "sql".into(), ..AgentQuery::default() }).await.unwrap();
    assert_eq!(listed.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec!["dev"]);
    let page =
        store.list_agents(&AgentQuery { after_id: "boss".into(), limit: 1, ..AgentQuery::default() }).await.unwrap();
    assert_eq!(page.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), vec!["dev"]);

    // Updates keep the token and the workload.
    let mut changed = agent("dev", "core", "boss", &["rust"], 2);
    changed.name = "Developer".into();
    store.update_agent(&changed, &AgentField::ALL, NOW).await.unwrap();
    assert_eq!(store.agent_by_token(&token("hash-dev")).await.unwrap().unwrap().name, "Developer");
    // An update that names fields changes only those.
    let mut partial = agent("dev", "", "", &[], 0);
    partial.name = "ignored".into();
    partial.backstory = "Writes Rust.".into();
    let updated = store.update_agent(&partial, &[AgentField::Backstory], NOW).await.unwrap();
    assert_eq!((updated.name.as_str(), updated.backstory.as_str()), ("Developer", "Writes Rust."));
    assert_eq!((updated.team.as_str(), updated.senior_id.as_str()), ("core", "boss"), "unnamed fields are kept");
    assert!(
        store.list_agents(&AgentQuery { expertise: "sql".into(), ..AgentQuery::default() }).await.unwrap().is_empty(),
        "expertise index follows updates"
    );

    // Tokens: a rotation revokes the old one, a revocation every one, and
    // each change is in the credential history, in order.
    let before = store.credential_changes_after(Position::default(), 1000).await.unwrap();
    assert_eq!(before.len(), 2, "one token each for boss and dev: {before:?}");
    store.replace_token("dev", Some(&token("hash-dev-2")), NOW).await.unwrap();
    assert!(store.agent_by_token(&token("hash-dev")).await.unwrap().is_none());
    assert_eq!(store.agent_by_token(&token("hash-dev-2")).await.unwrap().unwrap().id, "dev");
    store.replace_token("dev", None, NOW).await.unwrap();
    assert!(store.agent_by_token(&token("hash-dev-2")).await.unwrap().is_none());
    assert!(matches!(store.replace_token("ghost", None, NOW).await, Err(Error::NotFound { .. })));
    let last = before.last().unwrap();
    let after = store
        .credential_changes_after(Position { revision: last.revision, token: Some(last.token) }, 1000)
        .await
        .unwrap();
    let states: Vec<(bool, bool)> =
        after.iter().map(|change| (change.token == token("hash-dev-2"), change.active)).collect();
    assert_eq!(states, [(false, false), (true, false)], "hash-dev revoked at the rotation, then hash-dev-2 revoked");
    assert!(after.windows(2).all(|pair| (pair[0].revision, pair[0].token) < (pair[1].revision, pair[1].token)));
    let paged = store.credential_changes_after(Position::default(), 1).await.unwrap();
    assert_eq!(paged.len(), 1, "changes come in pages");

    // Roles.
    let role = RoleDefinition {
        name: "Dev".into(),
        tools: vec!["git".into()],
        permitted_actions: vec!["code".into()],
        read_paths: vec!["src/".into(), "README.md".into()],
        write_paths: vec!["src/".into()],
        ..RoleDefinition::default()
    };
    store.put_role(&role, NOW).await.unwrap();
    assert_eq!(store.get_role("Dev").await.unwrap(), role);
    assert_eq!(store.list_roles().await.unwrap().len(), 1);
    store.remove_role("Dev").await.unwrap();
    assert!(matches!(store.remove_role("Dev").await, Err(Error::NotFound { .. })));

    assert_index_agrees(&store, "before delegating").await;
    // Delegation reserves slots; status follows workload; release is idempotent.
    let settings = Settings::default();
    assert_eq!(store.queued_task_count().await.unwrap(), 0);
    let outcome = store.delegate(&request("t1", "boss", &["rust"]), NOW, settings).await.unwrap();
    assert_eq!((outcome.decision.kind, outcome.decision.primary_agent_id.as_str()), (DecisionKind::Delegate, "dev"));
    assert_eq!(store.get_agent("dev").await.unwrap().status(), Status::Busy, "1/2 is one below capacity");
    store.delegate(&request("t2", "boss", &["rust"]), NOW, settings).await.unwrap();
    let queued = store
        .delegate(&DelegationRequest { urgency: Urgency::Low, ..request("t3", "boss", &["rust"]) }, NOW + 10, settings)
        .await
        .unwrap();
    assert_eq!(queued.decision.kind, DecisionKind::Queue);
    assert_eq!(store.queue_state("t3").await.unwrap(), QueueState::Queued);
    assert_eq!(store.queued_task_count().await.unwrap(), 1);
    assert!(matches!(store.queue_state("t1").await, Err(Error::NotFound { .. })));

    let released = store.release_task("t1", NOW + 20).await.unwrap();
    assert_eq!(released.agent_id.as_deref(), Some("dev"));
    let offered = released.offered.expect("the queued task gets the slot");
    assert_eq!((offered.task_id.as_str(), offered.decision.kind), ("t3", DecisionKind::Delegate));
    assert_eq!(store.queued_task_count().await.unwrap(), 0, "offered the slot, t3 left the queue");
    assert!(
        matches!(store.queue_state("t3").await.unwrap(), QueueState::Resolved(decision) if decision.kind == DecisionKind::Delegate)
    );
    assert!(store.release_task("t1", NOW + 30).await.unwrap().agent_id.is_none());
    assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 2);

    // Stale queue entries escalate to the senior chosen when queued (a
    // normal task: an urgent one would take dev's slot over capacity).
    let queued = store.delegate(&request("t4", "boss", &["rust"]), NOW, settings).await.unwrap();
    assert_eq!(queued.decision.kind, DecisionKind::Queue);
    assert!(store.escalate_stale(NOW + 4 * 3_600_000 - 1).await.unwrap().is_empty());
    assert_eq!(store.queued_task_count().await.unwrap(), 1);
    let escalated = store.escalate_stale(NOW + 4 * 3_600_000).await.unwrap();
    assert_eq!(escalated.len(), 1);
    assert_eq!(store.queued_task_count().await.unwrap(), 0, "escalated, t4 left the queue");
    assert_eq!(escalated[0].decision.kind, DecisionKind::Escalate);
    assert!(store.escalate_stale(NOW + 5 * 3_600_000).await.unwrap().is_empty(), "escalated once");

    // A queued task that is released leaves the queue: the freed slot is not offered to it.
    let withdrawn = store
        .delegate(&DelegationRequest { urgency: Urgency::Low, ..request("t5", "boss", &["rust"]) }, NOW, settings)
        .await
        .unwrap();
    assert_eq!(withdrawn.decision.kind, DecisionKind::Queue);
    assert_eq!(store.queued_task_count().await.unwrap(), 1);
    assert!(store.release_task("t5", NOW).await.unwrap().agent_id.is_none());
    assert_eq!(store.queued_task_count().await.unwrap(), 0, "released, t5 left the queue");
    assert!(matches!(store.queue_state("t5").await, Err(Error::NotFound { .. })));
    let freed = store.release_task("t2", NOW).await.unwrap();
    assert_eq!(freed.agent_id.as_deref(), Some("dev"));
    assert!(freed.offered.is_none(), "t5 was withdrawn");
    store.delegate(&request("t2", "boss", &["rust"]), NOW, settings).await.unwrap();

    assert_index_agrees(&store, "after delegating and releasing").await;
    // The audit trail.
    let records = store
        .list_delegations(&DelegationQuery { agent_id: "dev".into(), ..DelegationQuery::default() })
        .await
        .unwrap();
    assert_eq!(
        records.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(),
        vec!["t1", "t2", "t4", "t5", "t2", "t3", "t3"],
        "ordered by decision time"
    );
    let ranged = store
        .list_delegations(&DelegationQuery {
            since: Some(NOW + 1),
            until: Some(NOW + 21),
            ..DelegationQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(ranged.iter().map(|r| r.task_id.as_str()).collect::<Vec<_>>(), vec!["t3", "t3"]);

    // Manual offline sticks and excludes; import is all or nothing.
    store.set_status("dev", Some(Status::Offline), None, NOW).await.unwrap();
    assert_eq!(store.get_agent("dev").await.unwrap().status(), Status::Offline);
    let plan = ImportPlan {
        teams: vec![Team { name: "new".into(), lead_agent_id: "newbie".into(), ..Team::default() }],
        roles: vec![],
        agents: vec![
            (agent("newbie", "new", "boss", &[], 0), token("hash-newbie")),
            (agent("dev", "core", "boss", &["rust"], 2), token("unused")),
        ],
    };
    let created = store.import(&plan, NOW).await.unwrap();
    assert_eq!(created, vec!["newbie"]);
    assert_eq!(store.agent_by_token(&token("hash-newbie")).await.unwrap().unwrap().id, "newbie");
    assert!(store.agent_by_token(&token("unused")).await.unwrap().is_none(), "existing agents get no new token");
    assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 2, "existing agents keep their workload");
    let broken =
        ImportPlan { agents: vec![(agent("other", "", "ghost", &[], 0), token("h"))], ..ImportPlan::default() };
    assert!(store.import(&broken, NOW).await.is_err());
    assert!(matches!(store.get_agent("other").await, Err(Error::NotFound { .. })), "rolled back");
    // References are checked against the roster as the import leaves it:
    // seniors may come later in the plan, or already be there.
    let refused = |agents: Vec<Agent>| ImportPlan {
        agents: agents.into_iter().map(|agent| (agent.clone(), token(&format!("hash-{}", agent.id)))).collect(),
        ..ImportPlan::default()
    };
    let message = |result: Result<Vec<String>, Error>| match result {
        Err(Error::InvalidArgument { field, message }) => {
            assert_eq!(field, "files", "an import's refusal is about the request's files");
            message
        }
        other => panic!("refusal expected, got {other:?}"),
    };
    let looped =
        refused(vec![agent("a1", "", "a2", &[], 0), agent("a2", "", "a3", &[], 0), agent("a3", "", "a1", &[], 0)]);
    assert_eq!(
        message(store.import(&looped, NOW).await),
        "agent.senior_id: the hierarchy would loop: a1 -> a2 -> a3 -> a1"
    );
    // Making an existing agent report to a newcomer that reports to it is a loop too.
    let through_existing = refused(vec![agent("boss", "core", "n1", &[], 0), agent("n1", "", "boss", &[], 0)]);
    assert!(message(store.import(&through_existing, NOW).await).contains("would loop"));
    let no_team = refused(vec![agent("a1", "nowhere", "", &[], 0)]);
    assert_eq!(
        message(store.import(&no_team, NOW).await),
        "agent.team: team \"nowhere\" does not exist; create it with PutTeam first"
    );
    assert!(matches!(store.get_agent("a1").await, Err(Error::NotFound { .. })), "nothing of a refused import stays");
    let chain: Vec<Agent> = (0..1200)
        .map(|index| {
            agent(
                &format!("c{index}"),
                "",
                &if index == 0 { "boss".to_owned() } else { format!("c{}", index - 1) },
                &["rust", "go"],
                1,
            )
        })
        .rev()
        .collect();
    let created = store.import(&refused(chain), NOW).await.unwrap();
    assert_eq!(created.len(), 1200, "more than one statement's worth of rows");
    assert_eq!(created[0], "c1199", "in the plan's order");
    let last = store.get_agent("c1199").await.unwrap();
    assert_eq!((last.senior_id.as_str(), last.expertise.clone()), ("c1198", vec!["go".to_owned(), "rust".to_owned()]));
    assert_eq!(store.agent_by_token(&token("hash-c0")).await.unwrap().unwrap().id, "c0");
    assert_eq!(
        store.list_agents(&AgentQuery { expertise: "go".to_owned(), ..AgentQuery::default() }).await.unwrap().len(),
        1200
    );
    for index in 0..1200 {
        store.remove_agent(&format!("c{}", 1199 - index), NOW).await.unwrap();
    }

    // Removal rules.
    assert!(matches!(
        store.remove_agent("boss", NOW).await,
        Err(Error::FailedPrecondition { kind: "AGENT_HAS_JUNIORS", .. })
    ));
    assert!(matches!(store.remove_team("new").await, Err(Error::FailedPrecondition { kind: "TEAM_NOT_EMPTY", .. })));
    store.remove_agent("newbie", NOW).await.unwrap();
    assert!(store.agent_by_token(&token("hash-newbie")).await.unwrap().is_none(), "removal revokes");
    assert_eq!(store.list_teams().await.unwrap().iter().find(|t| t.name == "new").unwrap().lead_agent_id, "");
    store.remove_team("new").await.unwrap();
    assert_index_agrees(&store, "after imports and removals").await;
    assert!(matches!(store.indexed_agent("newbie").await, Err(Error::NotFound { .. })));
}

#[tokio::test]
async fn conformance_on_sqlite() {
    let file = common::sqlite_file();
    let store = SqlStore::connect(&file.url, 1).unwrap();
    conformance(store).await;
}

#[tokio::test]
async fn conformance_on_sqlite_in_memory() {
    let store = SqlStore::connect("sqlite::memory:", 1).unwrap();
    conformance(store).await;
}

#[tokio::test]
async fn conformance_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    let store = SqlStore::connect(&database.url, 5).unwrap();
    conformance(store).await;
}

/// The store loads only the best cross-team matches; the choice must still be
/// the framework's (lower workload, then id), on the idle fast path and off it.
async fn cross_team_order(store: SqlStore) {
    store.migrate().await.unwrap();
    for team in ["home", "away"] {
        store.put_team(&Team { name: team.into(), ..Team::default() }, NOW).await.unwrap();
    }
    store.insert_agent(&agent("asker", "home", "", &[], 5), &token("h-asker"), NOW).await.unwrap();
    for index in 0..12 {
        store
            .insert_agent(
                &agent(&format!("w{index:02}"), "away", "", &["rust", "go"], 5),
                &token(&format!("h{index}")),
                NOW,
            )
            .await
            .unwrap();
    }
    // Everyone idle: the lowest id wins, and candidates come in id order.
    let outcome = store.delegate(&request("r1", "asker", &["rust", "go"]), NOW, Settings::default()).await.unwrap();
    assert_eq!(outcome.decision.primary_agent_id, "w00");
    assert_eq!(outcome.decision.candidates[..3], ["w00".to_owned(), "w01".to_owned(), "w02".to_owned()]);
    // Give every agent but w11 a task, and w00 two: w11 (idle) must win over lower ids.
    for index in 0..11 {
        let mut chain = vec![];
        for other in 0..12 {
            if other != index {
                chain.push(format!("w{other:02}"));
            }
        }
        let forced =
            DelegationRequest { delegation_chain: chain, ..request(&format!("fill-{index}"), "asker", &["rust"]) };
        let outcome = store.delegate(&forced, NOW, Settings::default()).await.unwrap();
        assert_eq!(outcome.decision.primary_agent_id, format!("w{index:02}"));
    }
    let outcome = store.delegate(&request("r2", "asker", &["go", "rust"]), NOW, Settings::default()).await.unwrap();
    assert_eq!(outcome.decision.primary_agent_id, "w11", "the idle agent comes first");
    // Now all hold one task except w00 (two): the lowest id among the least loaded wins.
    let outcome = store.delegate(&request("r3", "asker", &["rust"]), NOW, Settings::default()).await.unwrap();
    assert_eq!(outcome.decision.primary_agent_id, "w01", "w00 holds two tasks (r1, fill-0)");
}

#[tokio::test]
async fn cross_team_order_on_sqlite() {
    cross_team_order(SqlStore::connect("sqlite::memory:", 1).unwrap()).await;
}

#[tokio::test]
async fn cross_team_order_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    cross_team_order(SqlStore::connect(&database.url, 5).unwrap()).await;
}

/// Two stores on one database, as two replicas: a decision from a stale
/// index never gives a slot twice, and each index takes the other's changes
/// at its next refresh (removals at the next full check).
async fn replicas(first: SqlStore, second: SqlStore) {
    first.migrate().await.unwrap();
    second.migrate().await.unwrap();
    first.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    first.insert_agent(&agent("boss", "core", "", &["plan"], 5), &token("h-boss"), NOW).await.unwrap();
    first.insert_agent(&agent("dev", "core", "boss", &["rust"], 1), &token("h-dev"), NOW).await.unwrap();
    assert_eq!(second.indexed_agent("dev").await.unwrap().current_workload, 0, "loaded on first use");

    let settings = Settings::default();
    let taken = first.delegate(&request("t1", "boss", &["rust"]), NOW, settings).await.unwrap();
    assert_eq!((taken.decision.kind, taken.decision.primary_agent_id.as_str()), (DecisionKind::Delegate, "dev"));
    // The second still sees dev free: it decides for dev, loses the slot in
    // the database, and decides again knowing better.
    assert_eq!(second.indexed_agent("dev").await.unwrap().current_workload, 0);
    let outcome = second.delegate(&request("t2", "boss", &["rust"]), NOW, settings).await.unwrap();
    assert_ne!(outcome.decision.kind, DecisionKind::Delegate, "{outcome:?}");
    assert_eq!(first.get_agent("dev").await.unwrap().current_workload, 1, "one slot, given once");
    assert_eq!(second.indexed_agent("dev").await.unwrap().current_workload, 1, "read again after losing");

    first.set_status("boss", Some(Status::Offline), None, NOW).await.unwrap();
    first.insert_agent(&agent("ops", "core", "boss", &["rust", "ops"], 2), &token("h-ops"), NOW).await.unwrap();
    first.put_team(&Team { name: "core".into(), lead_agent_id: "boss".into(), ..Team::default() }, NOW).await.unwrap();
    assert_eq!(
        second.indexed_agents(&AgentQuery { expertise: "ops".into(), ..AgentQuery::default() }).await.unwrap().len(),
        0,
        "not refreshed yet"
    );
    assert_eq!(second.indexed_agent("ops").await.unwrap().workload_capacity, 2, "an unknown id is looked up");
    second.refresh_index(NOW).await.unwrap();
    assert_eq!(second.indexed_agent("boss").await.unwrap().manual_status, Some(Status::Offline));
    let colleague = second.delegate(&request("t3", "dev", &["ops"]), NOW, settings).await.unwrap();
    assert_eq!(colleague.decision.primary_agent_id, "ops", "decided from what the refresh brought");
    assert_index_agrees(&second, "after a refresh").await;

    // Removed and created again elsewhere: its version starts again from 0,
    // below the one the second holds (the delegation and release raised it).
    first.release_task("t3", NOW).await.unwrap();
    second.refresh_index(NOW).await.unwrap();
    first.remove_agent("ops", NOW).await.unwrap();
    first.insert_agent(&agent("ops", "core", "boss", &["ops"], 4), &token("h-ops-2"), NOW).await.unwrap();
    second.refresh_index(NOW).await.unwrap();
    assert_eq!(second.indexed_agent("ops").await.unwrap().workload_capacity, 4, "the new agent, not the old");
    assert_index_agrees(&second, "after an agent was created again").await;

    first.remove_agent("ops", NOW).await.unwrap();
    for _ in 0..INDEX_FULL_CHECK_EVERY {
        second.refresh_index(NOW).await.unwrap();
    }
    assert!(matches!(second.indexed_agent("ops").await, Err(Error::NotFound { .. })), "removal found");
    assert_index_agrees(&second, "after a full check").await;
    assert_index_agrees(&first, "on the first").await;

    // The audit trail: a decision appends its record to the log; a read on
    // either replica first moves what is there, and when both move records
    // at once, each record moves once.
    assert_eq!(first.fold_audit_trail().await.unwrap(), 3, "the three decisions above are in the log");
    assert_eq!(second.fold_audit_trail().await.unwrap(), 0, "and move once");
    first.insert_agent(&agent("pool", "core", "boss", &["bulk"], 2_000), &token("h-pool"), NOW).await.unwrap();
    let asked = 1_100;
    for task in 0..asked {
        let outcome = first.delegate(&request(&format!("bulk-{task}"), "dev", &["bulk"]), NOW, settings).await.unwrap();
        assert!(!outcome.delegation_id.is_empty(), "{outcome:?}");
    }
    let listed = second
        .list_delegations(&DelegationQuery { task_id: "bulk-7".into(), ..DelegationQuery::default() })
        .await
        .unwrap();
    assert_eq!(listed.len(), 1, "a read on the other replica finds a record only the log held");
    let more = 600;
    for task in asked..asked + more {
        first.delegate(&request(&format!("bulk-{task}"), "dev", &["bulk"]), NOW, settings).await.unwrap();
    }
    let (by_first, by_second) = tokio::join!(first.fold_audit_trail(), second.fold_audit_trail());
    assert_eq!(by_first.unwrap() + by_second.unwrap(), more as u64, "every record moved once");
    let records = second
        .list_delegations(&DelegationQuery { agent_id: "pool".into(), limit: 10_000, ..DelegationQuery::default() })
        .await
        .unwrap();
    let ids: std::collections::HashSet<&str> = records.iter().map(|record| record.id.as_str()).collect();
    assert_eq!((records.len(), ids.len()), (asked + more, asked + more));
}

#[tokio::test]
async fn replicas_on_sqlite() {
    let file = common::sqlite_file();
    replicas(SqlStore::connect(&file.url, 1).unwrap(), SqlStore::connect(&file.url, 1).unwrap()).await;
}

#[tokio::test]
async fn replicas_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    replicas(SqlStore::connect(&database.url, 5).unwrap(), SqlStore::connect(&database.url, 5).unwrap()).await;
}

/// Calls that arrive together are decided together: every slot is given
/// once, every call gets its own decision and audit record, and the tasks
/// without a slot wait in the queue. `held` writes to the store's SQLite
/// file while the first burst of calls arrives: the first call, whose
/// transaction waits for the file, is still deciding when the others come,
/// however busy the machine (its calls run on the calling thread, and would
/// otherwise be together only when two threads ran at the same moment).
async fn decided_together(store: SqlStore, held: Option<&str>) {
    store.migrate().await.unwrap();
    store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    store.insert_agent(&agent("lead", "core", "", &["plan"], 5), &token("h-lead"), NOW).await.unwrap();
    for index in 0..10 {
        let id = format!("dev{index}");
        store.insert_agent(&agent(&id, "core", "lead", &["rust"], 3), &token(&format!("h-{id}")), NOW).await.unwrap();
    }
    let holder = held.map(|path| {
        let holder = rusqlite::Connection::open(path).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        holder
    });
    let calls: Vec<_> = (0..40)
        .map(|index| {
            let store = store.clone();
            tokio::spawn(async move {
                let request =
                    DelegationRequest { urgency: Urgency::Low, ..request(&format!("task-{index}"), "lead", &["rust"]) };
                store.delegate(&request, NOW, Settings::default()).await.unwrap()
            })
        })
        .collect();
    if let Some(holder) = holder {
        // Well within the store's busy timeout (5 s).
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        holder.execute_batch("ROLLBACK").unwrap();
    }
    let mut slots: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    let mut kinds = Vec::new();
    let mut queued = Vec::new();
    for (index, call) in calls.into_iter().enumerate() {
        let outcome = call.await.unwrap();
        assert!(!outcome.delegation_id.is_empty(), "{outcome:?}");
        if outcome.decision.kind == DecisionKind::Delegate {
            *slots.entry(outcome.decision.primary_agent_id.clone()).or_default() += 1;
        }
        if outcome.decision.kind == DecisionKind::Queue {
            queued.push(format!("task-{index}"));
        }
        kinds.push(outcome.decision.kind);
    }
    assert_eq!(kinds.iter().filter(|kind| **kind == DecisionKind::Delegate).count(), 30, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|kind| **kind == DecisionKind::Queue).count(), 10, "{kinds:?}");
    for index in 0..10 {
        let id = format!("dev{index}");
        assert_eq!(slots.get(&id), Some(&3), "{slots:?}");
        assert_eq!(store.get_agent(&id).await.unwrap().current_workload, 3);
    }
    let records = store.list_delegations(&DelegationQuery::default()).await.unwrap();
    assert_eq!(records.len(), 40);
    assert_eq!(store.queued_task_count().await.unwrap(), 10);
    assert!(store.delegations_decided_together() > 0, "no call shared a transaction");
    assert_index_agrees(&store, "after deciding together").await;

    // With free slots again, the queued tasks asked for once more leave the
    // queue, whether decided alone or among new calls.
    for index in 10..14 {
        let id = format!("dev{index}");
        store.insert_agent(&agent(&id, "core", "lead", &["rust"], 5), &token(&format!("h-{id}")), NOW).await.unwrap();
    }
    let fresh = (0..10).map(|index| format!("fresh-{index}"));
    let calls: Vec<_> = queued
        .iter()
        .cloned()
        .chain(fresh)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                let request = DelegationRequest { urgency: Urgency::Low, ..request(&task, "lead", &["rust"]) };
                store.delegate(&request, NOW, Settings::default()).await.unwrap()
            })
        })
        .collect();
    for call in calls {
        let outcome = call.await.unwrap();
        assert_eq!(outcome.decision.kind, DecisionKind::Delegate, "{outcome:?}");
    }
    assert_eq!(store.queued_task_count().await.unwrap(), 0, "a placed task still waits in the queue");
    for task in &queued {
        assert_ne!(store.queue_state(task).await.unwrap(), QueueState::Queued, "{task}");
    }
    for index in 10..14 {
        assert_eq!(store.get_agent(&format!("dev{index}")).await.unwrap().current_workload, 5);
    }
    assert_index_agrees(&store, "after the queue was placed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_together_on_sqlite() {
    let file = common::sqlite_file();
    let path = file.url.trim_start_matches("sqlite://").to_owned();
    decided_together(SqlStore::connect(&file.url, 1).unwrap(), Some(&path)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decided_together_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    decided_together(SqlStore::connect(&database.url, 5).unwrap(), None).await;
}

/// A task asked for only if its agent has a free slot: placed on a free
/// slot (or the one it holds), and otherwise answered QUEUE with nothing
/// written: no slot over capacity, no queue entry, no audit record; alone
/// and in a batch.
async fn only_if_free(store: SqlStore) {
    store.migrate().await.expect("migrate");
    store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    store.insert_agent(&agent("boss", "core", "", &["plan"], 5), &token("hash-boss"), NOW).await.unwrap();
    store.insert_agent(&agent("dev", "core", "boss", &["rust"], 1), &token("hash-dev"), NOW).await.unwrap();
    let settings = Settings::default();
    let ask = |task: &str| DelegationRequest {
        assigned_agent_id: "dev".into(),
        only_if_free: true,
        ..request(task, "boss", &[])
    };
    let workload = async || store.get_agent("dev").await.unwrap().current_workload;
    let records = async || store.list_delegations(&DelegationQuery::default()).await.unwrap().len();

    let placed = store.delegate(&ask("a1"), NOW, settings).await.unwrap();
    assert_eq!(placed.decision.kind, DecisionKind::Delegate);
    assert_eq!(placed.decision.primary_agent_id, "dev");
    assert_eq!(workload().await, 1);
    let before = records().await;

    for task in [ask("a2"), DelegationRequest { urgency: Urgency::Critical, ..ask("a3") }] {
        let outcome = store.delegate(&task, NOW, settings).await.unwrap();
        assert_eq!(outcome.decision.kind, DecisionKind::Queue, "{}: {:?}", task.task_id, outcome.decision);
        assert!(outcome.delegation_id.is_empty() && !outcome.queue_changed);
        assert!(matches!(store.queue_state(&task.task_id).await, Err(Error::NotFound { .. })), "{}", task.task_id);
    }
    let batch = store.delegate_batch(&[ask("a4"), ask("a5")], NOW, settings).await.unwrap();
    assert!(batch.iter().all(|outcome| outcome.decision.kind == DecisionKind::Queue), "{batch:?}");
    assert_eq!(workload().await, 1, "no slot over capacity, not even for an urgent task");
    assert_eq!(store.queued_task_count().await.unwrap(), 0);
    assert_eq!(records().await, before, "nothing in the audit trail");
    for task in ["a2", "a3", "a4", "a5"] {
        assert!(store.release_task(task, NOW).await.unwrap().agent_id.is_none(), "{task} holds no slot");
    }

    // The task holding the slot keeps it; once freed, the slot is taken.
    assert_eq!(store.delegate(&ask("a1"), NOW, settings).await.unwrap().decision.kind, DecisionKind::Delegate);
    assert_eq!(workload().await, 1);
    assert_eq!(store.release_task("a1", NOW).await.unwrap().agent_id.as_deref(), Some("dev"));
    let batch = store.delegate_batch(&[ask("a2"), ask("a3")], NOW, settings).await.unwrap();
    let kinds: Vec<DecisionKind> = batch.iter().map(|outcome| outcome.decision.kind).collect();
    assert_eq!(kinds, [DecisionKind::Delegate, DecisionKind::Queue]);
    assert_eq!(workload().await, 1);
    assert_eq!(store.queued_task_count().await.unwrap(), 0);
}

#[tokio::test]
async fn only_if_free_on_sqlite() {
    let file = common::sqlite_file();
    only_if_free(SqlStore::connect(&file.url, 1).unwrap()).await;
}

#[tokio::test]
async fn only_if_free_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    only_if_free(SqlStore::connect(&database.url, 5).unwrap()).await;
}

/// A placement's releases and delegations in one transaction where the
/// store can (a SQLite file): a chain's step gives its agent's slot back
/// and takes the next agent's, the slot freed taken again in the same
/// commit. Where it cannot (a task waits for a freed slot; PostgreSQL),
/// nothing is written and the caller releases and delegates apart.
async fn placed_together(store: SqlStore, together: bool) {
    store.migrate().await.unwrap();
    store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    store.insert_agent(&agent("lead", "core", "", &["plan"], 5), &token("h-lead"), NOW).await.unwrap();
    for id in ["a", "b"] {
        store.insert_agent(&agent(id, "core", "lead", &["rust"], 1), &token(&format!("h-{id}")), NOW).await.unwrap();
    }
    let settings = Settings::default();
    let ask = |task: &str, agent: &str| DelegationRequest {
        assigned_agent_id: agent.into(),
        only_if_free: true,
        ..request(task, "lead", &[])
    };
    let workloads = async || {
        let mut workloads = Vec::new();
        for id in ["a", "b"] {
            workloads.push(store.get_agent(id).await.unwrap().current_workload);
        }
        workloads
    };
    assert_eq!(store.delegate(&ask("t1", "a"), NOW, settings).await.unwrap().decision.kind, DecisionKind::Delegate);

    // t1 gives a's slot back; t2 takes b's, and t3 the slot t1 freed.
    let placed = store.place_together(&["t1".to_owned()], &[ask("t2", "b"), ask("t3", "a")], NOW, settings).await;
    match placed.unwrap() {
        Some((released, decided)) => {
            assert!(together, "placed together where the store cannot");
            assert_eq!(released.len(), 1);
            assert_eq!(released[0].agent_id.as_deref(), Some("a"));
            let chosen: Vec<_> = decided
                .iter()
                .map(|outcome| (outcome.decision.kind, outcome.decision.primary_agent_id.as_str()))
                .collect();
            assert_eq!(chosen, [(DecisionKind::Delegate, "b"), (DecisionKind::Delegate, "a")]);
            assert_eq!(workloads().await, [1, 1]);
            assert_index_agrees(&store, "after placing together").await;
        }
        None => {
            assert!(!together, "not placed together on a SQLite file");
            assert_eq!(workloads().await, [1, 0], "nothing written");
            return;
        }
    }

    // A task waits in the queue for a's slot: t3's release is not settled
    // here (the queue is offered the slot), and nothing is written.
    let queued = DelegationRequest { assigned_agent_id: "a".into(), ..request("t4", "lead", &[]) };
    assert_eq!(store.delegate(&queued, NOW, settings).await.unwrap().decision.kind, DecisionKind::Queue);
    let placed = store.place_together(&["t3".to_owned()], &[ask("t5", "a")], NOW, settings).await.unwrap();
    assert!(placed.is_none(), "{placed:?}");
    assert_eq!(workloads().await, [1, 1]);
    assert_eq!(store.queue_state("t4").await.unwrap(), QueueState::Queued, "the queue was not offered the slot yet");
    // Nor is a task asked about twice, nor one with no agent named.
    let twice = [ask("t6", "b"), ask("t6", "b")];
    assert!(store.place_together(&["t2".to_owned()], &twice, NOW, settings).await.unwrap().is_none());
    let unnamed = [request("t7", "lead", &["rust"])];
    assert!(store.place_together(&["t2".to_owned()], &unnamed, NOW, settings).await.unwrap().is_none());
    // A slot not free: the placement gives way whole, t2 keeps its slot.
    assert!(store.place_together(&["never".to_owned()], &[ask("t8", "b")], NOW, settings).await.unwrap().is_none());
    assert_eq!(workloads().await, [1, 1]);
    assert_index_agrees(&store, "after placements that gave way").await;
}

#[tokio::test]
async fn placed_together_on_sqlite() {
    let file = common::sqlite_file();
    placed_together(SqlStore::connect(&file.url, 1).unwrap(), true).await;
}

#[tokio::test]
async fn placed_together_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    placed_together(SqlStore::connect(&database.url, 5).unwrap(), false).await;
}
