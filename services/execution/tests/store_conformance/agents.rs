//! An agent's executions (`ExecutionFilter::agent_id`), on both backends:
//! those it leads, takes part in as a session's participant, executes a
//! step of, or is named in by its process version, and no others; with the
//! other filters, and page by page, each once.

use muster_runtime::{db::Database, testing::TestDatabase};

use muster_execution::{
    domain::{
        ExecutionStatus,
        authority::{RoleAssignment, Session},
        model::{Execution, Step},
    },
    store::{ExecutionFilter, SqlStore, Store, Write},
};

use super::{PROCESS, SqliteFile, new_process, steps};

/// Names `writer`, `approver`, `owner`, `monitor` and `watcher`.
const NAMING: &str = "\
name: naming
steps:
  - {id: a, type: agent_task, agent: writer, message: m}
  - {id: b, type: human_approval, approvers: [approver], depends_on: [a],
     roles: {executor: owner, monitors: [monitor], informed: [watcher]}}
";

/// A running execution of `process` (version 1) led by `lead` ('' for none).
fn run(id: &str, started_at: i64, process: &str, lead: &str) -> Execution {
    Execution {
        process_name: process.to_owned(),
        lead_agent_id: lead.to_owned(),
        ..super::execution(id, started_at, None)
    }
}

/// `run` as a session, with `member` assigned a role.
fn session_with(id: &str, started_at: i64, member: &str) -> Vec<Write> {
    let session = Session { title: "task".to_owned(), description: String::new(), ..Default::default() };
    let assignment = RoleAssignment {
        agent_id: member.to_owned(),
        role: "developer".to_owned(),
        subtask: String::new(),
        assigned_by: "operator:ops".to_owned(),
        assigned_at: started_at,
    };
    vec![
        Write::CreateExecution(Execution { session: Some(session), ..run(id, started_at, "flow", "") }),
        Write::Assignment { execution_id: id.to_owned(), assignment },
    ]
}

/// `run`, its first step executed by `executor`.
fn executed_by(id: &str, started_at: i64, executor: &str) -> Vec<Write> {
    let step = Step { executor: executor.to_owned(), ..Step::new() };
    vec![Write::CreateExecution(run(id, started_at, "flow", "")), steps(id, &[step])]
}

async fn listed(store: &SqlStore, filter: ExecutionFilter) -> Vec<String> {
    store.list_executions(&filter).await.unwrap().into_iter().map(|execution| execution.id).collect()
}

async fn of(store: &SqlStore, agent_id: &str) -> Vec<String> {
    listed(store, ExecutionFilter { agent_id: Some(agent_id.to_owned()), limit: 100, ..ExecutionFilter::default() })
        .await
}

async fn an_agent_lists_its_executions(url: &str) {
    let database = Database::connect_lazy(url, 2).unwrap();
    let store = SqlStore::new(database.clone());
    store.migrate().await.unwrap();
    store.publish_process(new_process(PROCESS, "flow")).await.unwrap(); // names x
    store.publish_process(new_process(NAMING, "naming")).await.unwrap();
    store.commit(vec![Write::CreateExecution(run("led", 1_000, "flow", "leader"))]).await.unwrap();
    store.commit(session_with("session", 2_000, "member")).await.unwrap();
    store.commit(executed_by("executed", 3_000, "doer")).await.unwrap();
    store.commit(vec![Write::CreateExecution(run("named", 4_000, "naming", ""))]).await.unwrap();
    let mut unrelated = session_with("unrelated", 5_000, "someone");
    unrelated.extend(executed_by("unrelated", 5_000, "someone").into_iter().skip(1));
    store.commit(unrelated).await.unwrap();

    // Each part, and only its executions.
    assert_eq!(of(&store, "leader").await, ["led"]);
    assert_eq!(of(&store, "member").await, ["session"]);
    assert_eq!(of(&store, "doer").await, ["executed"]);
    for named in ["writer", "approver", "owner", "monitor", "watcher"] {
        assert_eq!(of(&store, named).await, ["named"], "{named} is named in the version 'named' runs");
    }
    assert_eq!(of(&store, "x").await, ["unrelated", "executed", "session", "led"], "x is named in 'flow'");
    assert_eq!(of(&store, "someone").await, ["unrelated"]);
    assert!(of(&store, "stranger").await.is_empty());
    // Operators and services: every execution.
    assert_eq!(listed(&store, ExecutionFilter { limit: 100, ..ExecutionFilter::default() }).await.len(), 5);

    // The other filters combine with it.
    let mut ended = run("unrelated", 5_000, "flow", "");
    ended.status = ExecutionStatus::Completed;
    store.commit(vec![Write::UpdateExecution(ended)]).await.unwrap();
    let x_completed = ExecutionFilter {
        agent_id: Some("x".to_owned()),
        status: Some(ExecutionStatus::Completed),
        limit: 100,
        ..ExecutionFilter::default()
    };
    assert_eq!(listed(&store, x_completed).await, ["unrelated"]);
    let x_in_time = ExecutionFilter {
        agent_id: Some("x".to_owned()),
        started_after: Some(2_000),
        started_before: Some(5_000),
        limit: 100,
        ..ExecutionFilter::default()
    };
    assert_eq!(listed(&store, x_in_time).await, ["executed", "session"]);
    let writer_in_flow = ExecutionFilter {
        agent_id: Some("writer".to_owned()),
        process_name: Some("flow".to_owned()),
        limit: 100,
        ..ExecutionFilter::default()
    };
    assert!(listed(&store, writer_in_flow).await.is_empty());

    // As the engine sees it: a new lead takes the old one's place, a step's
    // new executor its old one's.
    store.commit(vec![Write::UpdateExecution(run("led", 1_000, "flow", "successor"))]).await.unwrap();
    let step = Step { executor: "other-doer".to_owned(), attempt: 2, ..Step::new() };
    store.commit(vec![steps("executed", &[step])]).await.unwrap();
    assert!(of(&store, "leader").await.is_empty());
    assert_eq!(of(&store, "successor").await, ["led"]);
    assert!(of(&store, "doer").await.is_empty());
    assert_eq!(of(&store, "other-doer").await, ["executed"]);

    // The versions published before their agents were kept are listed when
    // the service starts, those without a stored definition too.
    sqlx::query("UPDATE processes SET agents_listed = 0, definition = NULL").execute(&database.pool).await.unwrap();
    sqlx::query("DELETE FROM process_agents").execute(&database.pool).await.unwrap();
    assert!(of(&store, "writer").await.is_empty(), "the listing reads the kept agents");
    store.migrate().await.unwrap();
    assert_eq!(of(&store, "writer").await, ["named"]);
    assert_eq!(of(&store, "x").await, ["unrelated", "executed", "session", "led"]);

    pages(&store).await;
}

/// Page by page: each of an agent's executions once, in order, however it
/// takes part (twice over for some), among others' started at the same times.
async fn pages(store: &SqlStore) {
    store.publish_process(new_process(&NAMING.replace("writer", "pager"), "naming-pager")).await.unwrap();
    let mut expected = Vec::new();
    for index in 0..23 {
        // Three at each time, so that pages break between equal times.
        let started_at = 100_000 - (index / 3) * 10;
        let (mine, other) = (format!("p{index:02}"), format!("q{index:02}"));
        let writes = match index % 4 {
            0 => {
                let mut writes = executed_by(&mine, started_at, "pager");
                writes[0] = Write::CreateExecution(run(&mine, started_at, "flow", "pager"));
                writes
            }
            1 => session_with(&mine, started_at, "pager"),
            2 => executed_by(&mine, started_at, "pager"),
            _ => vec![Write::CreateExecution(Execution { process_version: 2, ..run(&mine, started_at, "naming", "") })],
        };
        store.commit(writes).await.unwrap();
        store.commit(vec![Write::CreateExecution(run(&other, started_at, "naming", "pager-not"))]).await.unwrap();
        expected.push((started_at, mine));
    }
    expected.sort_by(|left, right| right.0.cmp(&left.0).then_with(|| left.1.cmp(&right.1)));
    let expected: Vec<String> = expected.into_iter().map(|(_, id)| id).collect();

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let filter = ExecutionFilter {
            agent_id: Some("pager".to_owned()),
            after: after.clone(),
            limit: 5,
            ..Default::default()
        };
        let page = store.list_executions(&filter).await.unwrap();
        seen.extend(page.iter().map(|execution| execution.id.clone()));
        match page.last() {
            Some(last) if page.len() == 5 => after = Some((last.started_at, last.id.clone())),
            _ => break,
        }
    }
    assert_eq!(seen, expected, "every one once, newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_its_executions_on_sqlite() {
    let file =
        SqliteFile(std::env::temp_dir().join(format!("muster-execution-agents-{}.db", uuid::Uuid::new_v4().simple())));
    an_agent_lists_its_executions(&format!("sqlite://{}", file.0.display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lists_its_executions_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    an_agent_lists_its_executions(&database.url).await;
}
