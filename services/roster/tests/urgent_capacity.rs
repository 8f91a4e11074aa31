//! 5/5 means only urgent tasks: an agent at capacity takes an urgent task
//! (HIGH, CRITICAL) in one slot over capacity, audited, and never a second;
//! LOW and NORMAL tasks wait or escalate as ever. The slot over capacity is
//! given once however many calls race for it, on SQLite and PostgreSQL.

mod common;

use muster_roster::{
    domain::{
        delegation::{DecisionKind, DelegationRequest, Settings, Tier, Urgency},
        model::{Agent, Status, Team},
    },
    store::{DelegationOutcome, DelegationQuery, QueueState, SqlStore, Store},
};
use muster_runtime::{auth::TokenHash, testing::TestDatabase};

const NOW: i64 = common::START_MILLIS;

/// How many urgent calls race for the one slot over capacity.
const RACING_CALLS: usize = 32;

fn agent(id: &str, senior: &str, expertise: &[&str]) -> Agent {
    Agent {
        id: id.into(),
        team: "core".into(),
        senior_id: senior.into(),
        expertise: expertise.iter().map(|tag| (*tag).to_owned()).collect(),
        workload_capacity: 5,
        ..Agent::default()
    }
    .normalize()
    .expect("valid agent")
}

/// A rust task the lead delegates, decided by the framework.
fn rust_task(task_id: &str, urgency: Urgency) -> DelegationRequest {
    DelegationRequest {
        task_id: task_id.into(),
        requester_id: "lead".into(),
        required_expertise: vec!["rust".into()],
        urgency,
        ..DelegationRequest::default()
    }
}

/// A task a process assigned to `dev` by name.
fn assigned_task(task_id: &str, urgency: Urgency) -> DelegationRequest {
    DelegationRequest { assigned_agent_id: "dev".into(), ..rust_task(task_id, urgency) }
}

/// A lead and `dev`, its one rust expert, at 5/5.
async fn expert_at_capacity(store: &SqlStore) {
    store.migrate().await.expect("migrate");
    store.put_team(&Team { name: "core".into(), ..Team::default() }, NOW).await.unwrap();
    store.insert_agent(&agent("lead", "", &["plan"]), &TokenHash::of("h-lead"), NOW).await.unwrap();
    store.insert_agent(&agent("dev", "lead", &["rust"]), &TokenHash::of("h-dev"), NOW).await.unwrap();
    for index in 0..5 {
        let outcome = store.delegate(&rust_task(&format!("fill-{index}"), Urgency::Normal), NOW, settings()).await;
        let outcome = outcome.unwrap();
        assert_eq!(
            (outcome.decision.kind, outcome.decision.primary_agent_id.as_str()),
            (DecisionKind::Delegate, "dev")
        );
    }
    assert_eq!(store.get_agent("dev").await.unwrap().current_workload, 5);
}

fn settings() -> Settings {
    Settings::default()
}

/// An agent's workload and status in the database, with which the
/// organisation in memory agrees.
async fn held(store: &SqlStore, id: &str) -> (u32, Status) {
    let stored = store.get_agent(id).await.unwrap();
    assert_eq!(store.indexed_agent(id).await.unwrap().current_workload, stored.current_workload, "index and database");
    (stored.current_workload, stored.status())
}

fn assert_placed_over_capacity(outcome: &DelegationOutcome, tier: Tier, urgency: &str) {
    let decision = &outcome.decision;
    assert_eq!(
        (decision.kind, decision.primary_agent_id.as_str(), decision.tier, decision.over_capacity),
        (DecisionKind::Delegate, "dev", tier, true),
        "{decision:?}"
    );
    assert!(
        decision.text.contains(&format!("placed over capacity because the task is urgent ({urgency})")),
        "{}",
        decision.text
    );
    assert!(decision.text.contains("from 5/5 to 6/5 tasks"), "{}", decision.text);
    assert!(!outcome.delegation_id.is_empty(), "a placement over capacity is audited: {outcome:?}");
}

async fn urgent_tasks_at_capacity(store: SqlStore) {
    expert_at_capacity(&store).await;

    // LOW and NORMAL at 5/5 wait in the queue, as ever.
    for (task_id, urgency) in [("low", Urgency::Low), ("normal", Urgency::Normal)] {
        let outcome = store.delegate(&rust_task(task_id, urgency), NOW, settings()).await.unwrap();
        assert_eq!(
            (outcome.decision.kind, outcome.decision.over_capacity),
            (DecisionKind::Queue, false),
            "{outcome:?}"
        );
    }
    assert_eq!(held(&store, "dev").await, (5, Status::Busy));

    // CRITICAL at 5/5: the slot over capacity, with the reason in the audit trail.
    let critical = store.delegate(&rust_task("critical", Urgency::Critical), NOW, settings()).await.unwrap();
    assert_placed_over_capacity(&critical, Tier::QueueForExpert, "critical");
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));
    let records = store
        .list_delegations(&DelegationQuery { task_id: "critical".into(), ..DelegationQuery::default() })
        .await
        .unwrap();
    assert_eq!(records.len(), 1);
    assert!(
        records[0].decision.over_capacity
            && records[0].decision.text.contains("over capacity because the task is urgent")
    );

    // At 6/5 a second urgent task is not placed there: HIGH would wait past
    // its thirty minutes behind the two queued tasks, CRITICAL cannot wait.
    for (task_id, urgency) in [("second-high", Urgency::High), ("second-critical", Urgency::Critical)] {
        let outcome = store.delegate(&rust_task(task_id, urgency), NOW, settings()).await.unwrap();
        assert_eq!(
            (outcome.decision.kind, outcome.decision.over_capacity),
            (DecisionKind::Escalate, false),
            "{outcome:?}"
        );
    }
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));

    // Releasing the slot over capacity brings it back to 5/5, still busy;
    // the queued tasks wait for a slot below capacity.
    let released = store.release_task("critical", NOW).await.unwrap();
    assert_eq!((released.agent_id.as_deref(), released.offered.is_some()), (Some("dev"), false));
    assert_eq!(held(&store, "dev").await, (5, Status::Busy));
    assert_eq!(store.queue_state("low").await.unwrap(), QueueState::Queued);

    // HIGH at 5/5 takes it too.
    let high = store.delegate(&rust_task("high", Urgency::High), NOW, settings()).await.unwrap();
    assert_placed_over_capacity(&high, Tier::QueueForExpert, "high");
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));
    store.release_task("high", NOW).await.unwrap();
    // A slot below capacity goes to the oldest queued task, as ever.
    let released = store.release_task("fill-0", NOW).await.unwrap();
    assert_eq!(released.offered.map(|offer| offer.task_id), Some("low".to_owned()));
    assert_eq!(held(&store, "dev").await, (5, Status::Busy));

    // A task assigned to dev by name: the same rule.
    let assigned = store.delegate(&assigned_task("assigned-critical", Urgency::Critical), NOW, settings()).await;
    assert_placed_over_capacity(&assigned.unwrap(), Tier::Named, "critical");
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));
    let again = store.delegate(&assigned_task("assigned-high", Urgency::High), NOW, settings()).await.unwrap();
    assert_eq!((again.decision.kind, again.decision.over_capacity), (DecisionKind::Queue, false), "{again:?}");
    // A task that holds a slot of dev keeps it, over capacity or not.
    let kept = store.delegate(&assigned_task("fill-1", Urgency::Normal), NOW, settings()).await.unwrap();
    assert_eq!((kept.decision.kind, kept.decision.over_capacity), (DecisionKind::Delegate, false), "{kept:?}");
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));

    // Tasks assigned in one batch: one urgent task over capacity, the rest wait.
    store.release_task("assigned-critical", NOW).await.unwrap();
    let batch = [
        assigned_task("batch-normal", Urgency::Normal),
        assigned_task("batch-critical", Urgency::Critical),
        assigned_task("batch-high", Urgency::High),
    ];
    let outcomes = store.delegate_batch(&batch, NOW, settings()).await.unwrap();
    let kinds: Vec<_> =
        outcomes.iter().map(|outcome| (outcome.decision.kind, outcome.decision.over_capacity)).collect();
    assert_eq!(kinds, [(DecisionKind::Queue, false), (DecisionKind::Delegate, true), (DecisionKind::Queue, false)]);
    assert_placed_over_capacity(&outcomes[1], Tier::Named, "critical");
    assert_eq!(held(&store, "dev").await, (6, Status::Busy));
}

#[tokio::test]
async fn urgent_tasks_at_capacity_on_sqlite() {
    let file = common::sqlite_file();
    urgent_tasks_at_capacity(SqlStore::connect(&file.url, 1).unwrap()).await;
}

#[tokio::test]
async fn urgent_tasks_at_capacity_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    urgent_tasks_at_capacity(SqlStore::connect(&database.url, 5).unwrap()).await;
}

/// Urgent calls at once, half through each replica, for `dev` at 5/5: the
/// tasks that took a slot.
async fn race(
    first: &SqlStore,
    second: &SqlStore,
    round: &str,
    request: fn(&str, Urgency) -> DelegationRequest,
) -> Vec<String> {
    let calls: Vec<_> = (0..RACING_CALLS)
        .map(|index| {
            let store = if index % 2 == 0 { first.clone() } else { second.clone() };
            let urgency = if index % 4 < 2 { Urgency::High } else { Urgency::Critical };
            let request = request(&format!("{round}-{index}"), urgency);
            tokio::spawn(async move { store.delegate(&request, NOW, Settings::default()).await.unwrap() })
        })
        .collect();
    let mut placed = Vec::new();
    for call in calls {
        let outcome = call.await.unwrap();
        if outcome.decision.kind == DecisionKind::Delegate {
            assert!(outcome.decision.over_capacity && outcome.decision.primary_agent_id == "dev", "{outcome:?}");
            placed.push(outcome.decision.text.clone());
        }
    }
    placed
}

/// Of many urgent calls for an expert at 5/5, exactly one takes the slot
/// over capacity, whether decided by the framework or assigned. On
/// PostgreSQL the calls go through two replicas on one database, each
/// deciding from its own memory of the roster; SQLite has one replica
/// (`first` and `second` are the same store). `late`, on the same database,
/// last saw the expert at 5/5: after the race it decides for the slot over
/// capacity, and the database refuses it.
async fn concurrent_urgent_calls(first: SqlStore, second: SqlStore, late: SqlStore) {
    expert_at_capacity(&first).await;
    for replica in [&second, &late] {
        replica.migrate().await.unwrap();
        assert_eq!(replica.indexed_agent("dev").await.unwrap().current_workload, 5, "every replica knows dev at 5/5");
    }

    let placed = race(&first, &second, "chosen", rust_task).await;
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_eq!(first.get_agent("dev").await.unwrap().current_workload, 6, "6/5, never 7/5");

    let refused = late.delegate(&rust_task("late", Urgency::Critical), NOW, settings()).await.unwrap();
    assert_eq!((refused.decision.kind, refused.decision.over_capacity), (DecisionKind::Escalate, false), "{refused:?}");
    assert_eq!(first.get_agent("dev").await.unwrap().current_workload, 6, "the stale replica took nothing");
    assert_eq!(late.indexed_agent("dev").await.unwrap().current_workload, 6, "read again after losing");

    let records = first.list_delegations(&DelegationQuery::default()).await.unwrap();
    let over: Vec<_> = records.iter().filter(|record| record.decision.over_capacity).collect();
    assert_eq!(over.len(), 1);
    first.release_task(&over[0].task_id, NOW).await.unwrap();
    assert_eq!(first.get_agent("dev").await.unwrap().current_workload, 5);

    let placed = race(&first, &second, "assigned", assigned_task).await;
    assert_eq!(placed.len(), 1, "{placed:?}");
    let stored = first.get_agent("dev").await.unwrap();
    assert_eq!((stored.current_workload, stored.status()), (6, Status::Busy));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_urgent_calls_on_sqlite() {
    let file = common::sqlite_file();
    let store = SqlStore::connect(&file.url, 1).unwrap();
    concurrent_urgent_calls(store.clone(), store, SqlStore::connect(&file.url, 1).unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_urgent_calls_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    let replica = || SqlStore::connect(&database.url, 5).unwrap();
    concurrent_urgent_calls(replica(), replica(), replica()).await;
}
