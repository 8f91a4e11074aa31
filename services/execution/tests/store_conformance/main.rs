//! One conformance suite over the execution service's `Store`, run against SQLite and
//! PostgreSQL: both backends behave the same, commit by commit.

mod agents;

use std::{sync::Arc, time::Duration};

use muster_runtime::testing::TestDatabase;

use muster_execution::{
    domain::{
        ExecutionStatus, StepStatus,
        authority::{DEFAULT_MATRIX, Matrix, RoleAssignment, Session, SubtaskRequest, SubtaskStatus},
        budget::{Action, Budget, Source},
        inbox::{InboxMessage, MessageState, Priority},
        memory::MemoryEntry,
        model::{Event, EventKind, Execution, Finding, Step, Warnings},
    },
    error::Error,
    store::{
        Activity, Archived, ExecutionFilter, InboxFilter, NOTIFIER_CURSOR, NewProcess, Published, Replica, SqlStore,
        StepWrite, Store, Write,
    },
};

const PROCESS: &str = "name: flow\nsteps:\n\
    \x20 - {id: a, type: agent_task, agent: x, message: m}\n\
    \x20 - {id: b, type: agent_task, agent: x, message: m, depends_on: [a]}\n";

fn new_process(source: &str, hash: &str) -> NewProcess {
    let definition = muster_format::validate_process(source, &muster_format::Context::default()).process.unwrap();
    NewProcess {
        name: definition.name.clone(),
        source: source.to_owned(),
        content_hash: hash.to_owned(),
        published_at: 1_000,
        warnings: Warnings::default(),
        definition: Arc::new(definition),
    }
}

fn execution(id: &str, started_at: i64, session: Option<Session>) -> Execution {
    Execution {
        id: id.to_owned(),
        process_name: "flow".to_owned(),
        process_version: 1,
        status: ExecutionStatus::Running,
        reason: String::new(),
        lead_agent_id: "lead".to_owned(),
        inputs_json: "{}".to_owned(),
        idempotency_key: Some(format!("key-{id}")),
        started_at,
        ended_at: None,
        last_sequence: 0,
        trace_parent: String::new(),
        session,
    }
}

fn steps(execution_id: &str, states: &[Step]) -> Write {
    Write::Steps(
        states
            .iter()
            .enumerate()
            .map(|(position, step)| StepWrite {
                execution_id: execution_id.to_owned(),
                position: position as u32,
                step_id: ["a", "b"][position].to_owned(),
                step: step.clone(),
            })
            .collect(),
    )
}

fn events(execution: &mut Execution, count: usize) -> Vec<Event> {
    (0..count).map(|_| Event::new(execution, EventKind::StepStarted, 2_000, String::new())).collect()
}

async fn conformance(store: SqlStore) {
    store.migrate().await.expect("migrate");
    store.migrate().await.expect("migrations run once");

    // Processes: a new source is a new version; the same source returns it.
    let Published::New(first) = store.publish_process(new_process(PROCESS, "hash-1")).await.unwrap() else {
        panic!("a first publish stores version 1");
    };
    assert_eq!((first.version, first.step_count), (1, 2));
    let Published::Unchanged(same) = store.publish_process(new_process(PROCESS, "hash-1")).await.unwrap() else {
        panic!("the same source returns the latest version");
    };
    assert_eq!(same.version, 1);
    let changed = PROCESS.replace("message: m}", "message: n}");
    let Published::New(second) = store.publish_process(new_process(&changed, "hash-2")).await.unwrap() else {
        panic!("a changed source is a new version");
    };
    assert_eq!(second.version, 2);
    assert_eq!(store.latest_version("flow").await.unwrap(), Some(2));
    assert_eq!(store.latest_version("nothing").await.unwrap(), None);
    let latest = store.process("flow", 2).await.unwrap().unwrap();
    assert_eq!((latest.version, latest.definition.steps[0].message.as_str()), (2, "n"));
    let pinned = store.process("flow", 1).await.unwrap().unwrap();
    assert_eq!(
        (pinned.source.as_str(), pinned.definition.steps[1].depends_on.clone()),
        (PROCESS, vec!["a".to_owned()])
    );
    assert!(store.process("flow", 3).await.unwrap().is_none());
    for name in ["alpha", "omega"] {
        store
            .publish_process(new_process(&PROCESS.replace("name: flow", &format!("name: {name}")), name))
            .await
            .unwrap();
    }
    let page: Vec<String> =
        store.list_processes("", 2).await.unwrap().into_iter().map(|process| process.name).collect();
    assert_eq!(page, ["alpha", "flow"]);
    let next = store.list_processes("flow", 2).await.unwrap();
    assert_eq!((next.len(), next[0].name.as_str(), next[0].version), (1, "omega", 1));
    // Of many warnings, the first are kept with the count of them all.
    let warning = |line: u32| Finding {
        error: false,
        code: "EMI102".to_owned(),
        message: format!("warning on line {line}"),
        path: "steps[0]".to_owned(),
        line,
        column: 3,
    };
    let warned = NewProcess {
        warnings: Warnings::keep((1..=250).map(warning).collect()),
        ..new_process(&PROCESS.replace("name: flow", "name: warned"), "hash-warned")
    };
    store.publish_process(warned).await.unwrap();
    let read = store.process("warned", 1).await.unwrap().unwrap();
    assert_eq!((read.warnings.kept.len(), read.warnings.count), (Warnings::KEPT, 250));
    assert_eq!(read.warnings.kept[Warnings::KEPT - 1], warning(Warnings::KEPT as u32));

    // An execution with its steps and first events, in one commit.
    let assignment = RoleAssignment {
        agent_id: "dev".to_owned(),
        role: "developer".to_owned(),
        subtask: "code".to_owned(),
        assigned_by: "operator:ops".to_owned(),
        assigned_at: 1_500,
    };
    let session = Session {
        title: "t".to_owned(),
        description: "d".to_owned(),
        assignments: [(assignment.agent_id.clone(), assignment.clone())].into(),
        subtasks: Default::default(),
    };
    let mut first_run = execution("e1", 1_000, Some(session.clone()));
    let started = events(&mut first_run, 2);
    store
        .commit(vec![
            Write::CreateExecution(first_run.clone()),
            steps("e1", &[Step::new(), Step::new()]),
            Write::Events(started.clone()),
        ])
        .await
        .unwrap();
    let stored = store.execution("e1").await.unwrap().unwrap();
    assert_eq!(stored.session.as_ref().unwrap().assignments["dev"], assignment);
    assert_eq!((stored.status, stored.idempotency_key.as_deref()), (ExecutionStatus::Running, Some("key-e1")));
    assert_eq!(store.find_by_idempotency_key("key-e1").await.unwrap().as_deref(), Some("e1"));
    assert_eq!(store.last_event_sequence("e1").await.unwrap(), 2);

    // Steps: written twice in one commit, the last state stays; every field round-trips.
    let running = Step { status: StepStatus::Running, executor: "x".to_owned(), attempt: 1, ..Step::new() };
    let done = Step {
        status: StepStatus::Completed,
        executor: "y".to_owned(),
        attempt: 2,
        // Quotes, escapes, a line break and text beyond ASCII survive every backend's encoding.
        output_json: Some("{\"ok\":true,\"text\":\"a \\\"quote\\\"\\nnext — ü ✓\"}".into()),
        started_at: Some(3_000),
        ended_at: Some(4_000),
        cost: 0.25,
        tokens_used: 42,
        assigned_to: Some("y".to_owned()),
        delegation_chain: vec!["x".to_owned()],
        wait_seconds: 7,
        retry_at: Some(5_000),
        roster_reserved: true,
        slot_task: "e1/s0".to_owned(),
        ..Step::new()
    };
    first_run.status = ExecutionStatus::Paused;
    first_run.lead_agent_id = "lead-2".to_owned();
    let more = events(&mut first_run, 3);
    // A running execution's progress (a backend may write it its own way;
    // a row written twice keeps its last state) ...
    let earlier = Execution { lead_agent_id: "lead-1".to_owned(), ..first_run.clone() };
    store
        .commit(vec![
            steps("e1", std::slice::from_ref(&running)),
            Write::UpdateExecution(earlier),
            steps("e1", std::slice::from_ref(&done)),
            Write::UpdateExecution(first_run.clone()),
            Write::Events(more),
        ])
        .await
        .unwrap();
    assert_eq!(store.execution("e1").await.unwrap().unwrap().lead_agent_id, "lead-2");
    let read = store.steps("e1").await.unwrap();
    assert_eq!(read.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    assert_eq!(read[0].1, done);
    assert_eq!(read[1].1, Step::new());
    // ... and steps written with other changes.
    let redone = Step { attempt: 3, output_json: Some("{\"back\":\"\\\\ and '\"}".into()), ..done.clone() };
    store
        .commit(vec![
            steps("e1", std::slice::from_ref(&redone)),
            Write::Assignment {
                execution_id: "e1".to_owned(),
                assignment: RoleAssignment { role: "reviewer".to_owned(), ..assignment.clone() },
            },
        ])
        .await
        .unwrap();
    assert_eq!(store.steps("e1").await.unwrap()[0].1, redone);
    store.commit(vec![steps("e1", std::slice::from_ref(&done))]).await.unwrap();
    assert_eq!(store.step_output("e1", "a").await.unwrap().as_deref(), done.output_json.as_deref());
    assert_eq!(store.step_output("e1", "b").await.unwrap(), None, "no output yet");
    assert_eq!(store.step_output("e1", "nothing").await.unwrap(), None, "no such step");
    assert!(store.executes_a_step("e1", "y").await.unwrap());
    assert!(!store.executes_a_step("e1", "x").await.unwrap());
    let stored = store.execution("e1").await.unwrap().unwrap();
    assert_eq!((stored.status, stored.lead_agent_id.as_str()), (ExecutionStatus::Paused, "lead-2"));
    assert_eq!(stored.session.unwrap().assignments["dev"].role, "reviewer");

    // A subtask request, then its decision: every field round-trips.
    let asked = SubtaskRequest {
        id: "st-1".to_owned(),
        requested_by: "arch".to_owned(),
        agent_id: "dev".to_owned(),
        role: "developer".to_owned(),
        subtask: "Write the migration — ü".to_owned(),
        reason: "the 'schema' changes".to_owned(),
        status: SubtaskStatus::Pending,
        decided_by: String::new(),
        note: String::new(),
        requested_at: 6_000,
        decided_at: 0,
    };
    store.commit(vec![Write::Subtask { execution_id: "e1".to_owned(), subtask: asked.clone() }]).await.unwrap();
    let subtasks = |stored: Option<Execution>| stored.unwrap().session.unwrap().subtasks;
    assert_eq!(subtasks(store.execution("e1").await.unwrap())["st-1"], asked);
    let decided = SubtaskRequest {
        status: SubtaskStatus::Approved,
        decided_by: "lead-2".to_owned(),
        note: "go".to_owned(),
        decided_at: 7_000,
        ..asked.clone()
    };
    store.commit(vec![Write::Subtask { execution_id: "e1".to_owned(), subtask: decided.clone() }]).await.unwrap();
    assert_eq!(subtasks(store.execution("e1").await.unwrap()).into_values().collect::<Vec<_>>(), [decided]);

    // A commit that breaks a rule changes nothing, and fails alone among
    // the commits written with it.
    let other = execution("e2", 2_000, None);
    let create_other = vec![Write::CreateExecution(other.clone()), steps("e2", &[Step::new(), Step::new()])];
    let duplicate = Write::Events(vec![started[0].clone()]);
    let (bad, good) = tokio::join!(
        store.commit(vec![steps("e1", &[Step { attempt: 9, ..done.clone() }]), duplicate]),
        store.commit(create_other),
    );
    assert!(bad.is_err(), "an event numbered twice is refused");
    good.expect("the other commit lands");
    assert_eq!(store.steps("e1").await.unwrap()[0].1.attempt, 2, "the failed commit wrote nothing");
    // Alone (a running execution's usual shape: steps and events), the same.
    let duplicate = Write::Events(vec![started[1].clone()]);
    assert!(store.commit(vec![steps("e1", &[Step { attempt: 9, ..done.clone() }]), duplicate]).await.is_err());
    store.commit(vec![steps("e2", &[Step::new(), Step::new()])]).await.expect("the next commit lands");
    assert_eq!(store.steps("e1").await.unwrap()[0].1.attempt, 2, "rolled back");
    assert_eq!(store.steps("e2").await.unwrap().len(), 2);

    // Events: by execution after a sequence, bounded; the log in commit order.
    let events_of_e1 = store.events_after("e1", 1, 3).await.unwrap();
    assert_eq!(events_of_e1.len(), 3);
    let concurrent: Vec<_> = (1..=20)
        .map(|sequence| {
            let store = store.clone();
            let mut run = Execution { last_sequence: sequence - 1, ..other.clone() };
            let event = events(&mut run, 1);
            tokio::spawn(async move { store.commit(vec![Write::Events(event)]).await })
        })
        .collect();
    for commit in concurrent {
        commit.await.unwrap().unwrap();
    }
    let log = store.log_after(0, 1000).await.unwrap();
    assert_eq!(log.len(), 5 + 20);
    assert_eq!(store.log_end().await.unwrap(), log.last().unwrap().0, "the log ends at its newest entry");
    assert!(log.windows(2).all(|pair| pair[0].0 < pair[1].0), "positions grow");
    let tail = store.log_after(log[9].0, 1000).await.unwrap();
    assert_eq!(tail.len(), 15);
    assert_eq!(store.cursor(NOTIFIER_CURSOR).await.unwrap(), 0);
    store.advance_cursor(NOTIFIER_CURSOR, log[9].0).await.unwrap();
    store.advance_cursor(NOTIFIER_CURSOR, log[3].0).await.unwrap();
    assert_eq!(store.cursor(NOTIFIER_CURSOR).await.unwrap(), log[9].0, "a cursor never moves back");

    // Lists and recovery.
    let mut ended = execution("e3", 3_000, None);
    ended.status = ExecutionStatus::Completed;
    ended.ended_at = Some(3_500);
    store.commit(vec![Write::CreateExecution(ended), steps("e3", &[done.clone(), done])]).await.unwrap();
    store.join(&replica("only", ""), Duration::from_secs(600)).await.unwrap();
    assert_eq!(store.adopt().await.unwrap(), ["e1", "e2"], "the unfinished executions, oldest first");
    assert!(store.adopt().await.unwrap().is_empty(), "adopted once");
    let newest_first = |filter: ExecutionFilter| {
        let store = store.clone();
        async move {
            store.list_executions(&filter).await.unwrap().into_iter().map(|execution| execution.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(newest_first(ExecutionFilter { limit: 10, ..ExecutionFilter::default() }).await, ["e3", "e2", "e1"]);
    assert_eq!(newest_first(ExecutionFilter { limit: 2, ..ExecutionFilter::default() }).await, ["e3", "e2"]);
    assert_eq!(
        newest_first(ExecutionFilter { limit: 2, after: Some((2_000, "e2".to_owned())), ..ExecutionFilter::default() })
            .await,
        ["e1"]
    );
    assert_eq!(
        newest_first(ExecutionFilter {
            status: Some(ExecutionStatus::Completed),
            limit: 10,
            ..ExecutionFilter::default()
        })
        .await,
        ["e3"]
    );
    assert_eq!(
        newest_first(ExecutionFilter {
            started_after: Some(1_500),
            started_before: Some(3_000),
            limit: 10,
            ..Default::default()
        })
        .await,
        ["e2"]
    );
    let usage = store.process_usage("flow", 0, "").await.unwrap();
    assert_eq!((usage.runs, usage.tokens), (3, 42 + 42 + 42));
    let activity = store.process_activity("flow").await.unwrap();
    assert_eq!(activity, Activity { underway: 2, last_started_at: Some(3_000) }, "e1 and e2 have not ended");
    assert_eq!(store.process_activity("nothing").await.unwrap(), Activity::default());
    let others = store.process_usage("flow", 0, "e1").await.unwrap();
    assert_eq!((others.runs, others.tokens), (2, 126 - 42), "but one execution, e1 and its 42 tokens");

    // The permission matrix: versions, the newest in force.
    assert!(store.latest_matrix().await.unwrap().is_none());
    let (matrix, _) = Matrix::parse(0, DEFAULT_MATRIX.to_owned(), 10, "muster".to_owned()).unwrap();
    // Replicas starting at once store one first version between them.
    let other = Matrix { created_by: "replica-b".to_owned(), ..matrix.clone() };
    let (first, also_first) = tokio::join!(store.first_matrix(matrix.clone()), store.first_matrix(other));
    let (first, also_first) = (first.unwrap(), also_first.unwrap());
    assert_eq!((first.version, also_first.version), (1, 1));
    assert_eq!(first.created_by, also_first.created_by, "one of the two, stored once");
    // Matrices put at once each take a version of their own.
    let put = |by: &str| store.put_matrix(Matrix { created_by: by.to_owned(), ..matrix.clone() });
    let (two, three, four) = tokio::join!(put("operator:a"), put("operator:b"), put("operator:c"));
    let mut versions = [two.unwrap().version, three.unwrap().version, four.unwrap().version];
    versions.sort_unstable();
    assert_eq!(versions, [2, 3, 4]);
    assert_eq!(put("operator:ops").await.unwrap().version, 5);
    assert_eq!(store.latest_matrix().await.unwrap().unwrap().created_by, "operator:ops");
    assert_eq!(store.matrix(1).await.unwrap().unwrap().created_by, first.created_by);
    let versions: Vec<u32> = store.matrices(None, 10).await.unwrap().iter().map(|matrix| matrix.version).collect();
    assert_eq!(versions, [5, 4, 3, 2, 1]);
    let older: Vec<u32> = store.matrices(Some(2), 10).await.unwrap().iter().map(|matrix| matrix.version).collect();
    assert_eq!(older, [1]);

    inboxes(&store).await;
    budgets(&store).await;
    schedules(&store).await;
    memory(&store).await;
}

/// The steps of `e-out`, and its first step's output alone.
async fn read_outputs(store: &SqlStore) -> (Step, Step, Option<String>) {
    let steps = store.steps("e-out").await.unwrap();
    (steps[0].1.clone(), steps[1].1.clone(), store.step_output("e-out", "a").await.unwrap())
}

/// A step's output read back however it was written: with the step's
/// completion (which SQLite appends to a table of outputs), in a later
/// write of the step alone, cleared for a rerun, and set apart from any
/// completion (as an operator sets it).
async fn outputs(store: &SqlStore) {
    let mut run = execution("e-out", 9_000, None);
    let mut done = Step {
        status: StepStatus::Completed,
        executor: "x".to_owned(),
        attempt: 1,
        output_json: Some("{\"answer\":42,\"note\":\"ü ✓\"}".into()),
        started_at: Some(9_100),
        ended_at: Some(9_200),
        roster_reserved: true,
        ..Step::new()
    };
    let running =
        Step { status: StepStatus::Running, executor: "z".to_owned(), started_at: Some(9_200), ..Step::new() };
    store.commit(vec![Write::CreateExecution(run.clone()), steps("e-out", &[Step::new(), Step::new()])]).await.unwrap();
    let mut completed = Event::new(&mut run, EventKind::StepCompleted, 9_200, String::new());
    completed.step_id = "a".to_owned();
    completed.output_json = done.output_json.clone();
    let started = Event::new(&mut run, EventKind::StepStarted, 9_200, String::new());
    store
        .commit(vec![
            Write::UpdateExecution(run.clone()),
            steps("e-out", &[done.clone(), running.clone()]),
            Write::Events(vec![completed, started]),
        ])
        .await
        .unwrap();
    assert_eq!(
        read_outputs(store).await,
        (done.clone(), running.clone(), done.output_json.as_deref().map(str::to_owned))
    );
    // The step written again without its completion: its slot given back.
    done.roster_reserved = false;
    store.commit(vec![Write::UpdateExecution(run.clone()), steps("e-out", std::slice::from_ref(&done))]).await.unwrap();
    assert_eq!(read_outputs(store).await.0, done);
    // Cleared for a rerun, then given an output by an operator.
    let rerun = Step { status: StepStatus::Pending, ..Step::new() };
    store
        .commit(vec![Write::UpdateExecution(run.clone()), steps("e-out", std::slice::from_ref(&rerun))])
        .await
        .unwrap();
    assert_eq!(read_outputs(store).await.0, rerun);
    assert_eq!(store.step_output("e-out", "a").await.unwrap(), None);
    let set = Step { output_json: Some("[\"by hand\"]".into()), ..done.clone() };
    store.commit(vec![Write::UpdateExecution(run.clone()), steps("e-out", std::slice::from_ref(&set))]).await.unwrap();
    assert_eq!(read_outputs(store).await.0, set);
    assert_eq!(store.step_output("e-out", "a").await.unwrap().as_deref(), Some("[\"by hand\"]"));
}

/// Memory: entries by memory, newest first, page by page; forgotten ones
/// go; every change raises the version of its memory, and nothing else does.
async fn memory(store: &SqlStore) {
    let entry = |id: &str, role: &str, at: i64| MemoryEntry {
        id: id.to_owned(),
        role: role.to_owned(),
        text: format!("remember {id}"),
        author: "agent".to_owned(),
        execution_id: "run".to_owned(),
        created_at: at,
    };
    let version = |role: &'static str| store.memory_version(role);
    assert_eq!((version("risk").await.unwrap(), version("").await.unwrap()), (0, 0));
    let written = vec![entry("m1", "risk", 10), entry("m2", "risk", 20), entry("m3", "risk", 20), entry("g1", "", 15)];
    store.commit(vec![Write::Remember(written.clone())]).await.unwrap();
    // One commit raises each memory it wrote to once; a role's version
    // includes the global memory's.
    assert_eq!((version("risk").await.unwrap(), version("").await.unwrap()), (2, 1));
    assert_eq!(version("delivery").await.unwrap(), 1, "the global memory's alone");
    let ids = |entries: Vec<MemoryEntry>| entries.into_iter().map(|entry| entry.id).collect::<Vec<_>>();
    assert_eq!(ids(store.memory("risk", None, 10).await.unwrap()), ["m3", "m2", "m1"]);
    assert_eq!(store.memory("", None, 10).await.unwrap(), vec![written[3].clone()]);
    let first_page = store.memory("risk", None, 2).await.unwrap();
    let last = first_page.last().map(|entry| (entry.created_at, entry.id.clone())).unwrap();
    assert_eq!(ids(store.memory("risk", Some(&last), 2).await.unwrap()), ["m1"]);
    assert_eq!(version("risk").await.unwrap(), 2, "reading changes nothing");
    assert!(store.forget_memory("m2").await.unwrap());
    assert!(!store.forget_memory("m2").await.unwrap());
    assert_eq!(ids(store.memory("risk", None, 10).await.unwrap()), ["m3", "m1"]);
    assert_eq!((version("risk").await.unwrap(), version("").await.unwrap()), (3, 1), "forgotten once");
    // An entry appended twice with the same id is stored once: the first.
    assert_eq!(store.append_memory(entry("k1", "risk", 30)).await.unwrap(), entry("k1", "risk", 30));
    let retried = MemoryEntry { text: "another text".to_owned(), ..entry("k1", "risk", 40) };
    assert_eq!(store.append_memory(retried).await.unwrap(), entry("k1", "risk", 30));
    assert_eq!(ids(store.memory("risk", None, 10).await.unwrap()), ["k1", "m3", "m1"]);
    assert_eq!(version("risk").await.unwrap(), 4, "appended once");
}

/// Schedules: kept by publishing; a due time fires once, the loser of two
/// replicas rolling back its whole commit.
async fn schedules(store: &SqlStore) {
    let scheduled = "name: nightly\ntriggers: {schedule: '0 2 * * *', missed: run_once}\nsteps:\n  \
                     - {id: a, type: agent_task, agent: x, message: m}\n";
    store.publish_process(new_process(scheduled, "nightly-1")).await.unwrap();
    let listed = store.schedules("", 10).await.unwrap();
    let [state] = listed.as_slice() else { panic!("one schedule: {listed:?}") };
    // Published at 1 000 ms: due at 02:00 UTC on the first day.
    assert_eq!((state.cron.as_str(), state.next_fire_at), ("0 2 * * *", 7_200_000));
    assert_eq!(state.missed, muster_format::MissedRuns::RunOnce);
    assert_eq!(store.next_due_schedule().await.unwrap(), Some(7_200_000));
    assert!(store.due_schedules(7_199_999, 10).await.unwrap().is_empty());
    assert_eq!(store.due_schedules(7_200_000, 10).await.unwrap().len(), 1);

    // Two replicas fire the same due time: one commit wins, the other
    // creates nothing.
    let fire = |id: &str| {
        let mut run = execution(id, 7_200_100, None);
        run.process_name = "nightly".to_owned();
        run.idempotency_key = None;
        vec![
            Write::CreateExecution(run),
            Write::FireSchedule {
                process_name: "nightly".to_owned(),
                due: 7_200_000,
                next: 93_600_000,
                execution_id: id.to_owned(),
                fired_at: 7_200_100,
            },
        ]
    };
    store.commit(fire("nightly-a")).await.unwrap();
    let lost = store.commit(fire("nightly-b")).await;
    assert!(matches!(lost, Err(Error::Superseded(_))), "{lost:?}");
    assert!(store.execution("nightly-b").await.unwrap().is_none(), "rolled back");
    let state = &store.schedules("", 10).await.unwrap()[0];
    assert_eq!(
        (state.next_fire_at, state.last_fired_at, state.last_execution_id.as_str()),
        (93_600_000, Some(7_200_100), "nightly-a")
    );
    // Skipping is conditional too.
    assert!(!store.skip_schedule("nightly", 7_200_000, 1).await.unwrap());
    assert!(store.skip_schedule("nightly", 93_600_000, 180_000_000).await.unwrap());

    // A new version keeps the due time of an unchanged schedule, moves it for
    // a new one, and a version without a schedule removes it.
    let reworded = scheduled.replace("message: m", "message: n");
    store.publish_process(new_process(&reworded, "nightly-2")).await.unwrap();
    assert_eq!(store.schedules("", 10).await.unwrap()[0].next_fire_at, 180_000_000);
    store.publish_process(new_process(&reworded.replace("'0 2 * * *'", "'0 3 * * *'"), "nightly-3")).await.unwrap();
    assert_eq!(store.schedules("", 10).await.unwrap()[0].next_fire_at, 10_800_000);
    let unscheduled = reworded.replace("triggers: {schedule: '0 2 * * *', missed: run_once}\n", "");
    store.publish_process(new_process(&unscheduled, "nightly-4")).await.unwrap();
    assert!(store.schedules("", 10).await.unwrap().is_empty());
}

/// Operators' budgets: set, replaced, removed by an all-0 budget.
async fn budgets(store: &SqlStore) {
    assert_eq!(store.budget("flow").await.unwrap(), None);
    let mut budget = Budget {
        process_name: "flow".to_owned(),
        period_seconds: 86_400,
        max_cost: 12.5,
        max_tokens: 1 << 40,
        max_runs: u32::MAX,
        run_max_cost: 0.25,
        run_max_tokens: 7,
        on_exceed: Action::Pause,
        source: Source::Operator,
    };
    store.put_budget(&budget, "operator 'ops'").await.unwrap();
    assert_eq!(store.budget("flow").await.unwrap().as_ref(), Some(&budget), "every field survives");
    budget.max_runs = 3;
    store.put_budget(&budget, "operator 'ops'").await.unwrap();
    assert_eq!(store.budget("flow").await.unwrap().map(|budget| budget.max_runs), Some(3), "replaced");
    let unlimited =
        Budget { max_cost: 0.0, max_tokens: 0, max_runs: 0, run_max_cost: 0.0, run_max_tokens: 0, ..budget };
    store.put_budget(&unlimited, "operator 'ops'").await.unwrap();
    assert_eq!(store.budget("flow").await.unwrap(), None, "an all-0 budget removes it");
}

fn message(id: &str, posted_at: i64) -> InboxMessage {
    InboxMessage {
        id: id.to_owned(),
        inbox: "risk".to_owned(),
        sender: "delivery".to_owned(),
        priority: Priority::High,
        subject: "late".to_owned(),
        body: "3 days — ü".to_owned(),
        posted_at,
        state: MessageState::Unprocessed,
        claimed_by: String::new(),
        processed_by: String::new(),
        note: String::new(),
    }
}

/// Admission locks: on PostgreSQL a start holding the lock of a limit (an
/// agent's budget, a process) keeps another replica's start under that
/// limit waiting until it is created; SQLite, used by one service alone,
/// needs none.
async fn admission(store: &SqlStore, shared: bool) {
    assert!(store.admission_lock(&[]).await.unwrap().is_none(), "no limit, no lock");
    let held = store.admission_lock(&["agent:x", "flow"]).await.unwrap();
    assert_eq!(held.is_some(), shared);
    let Some(held) = held else { return };
    let waiting = store.admission_lock(&["agent:x"]);
    tokio::pin!(waiting);
    let before = tokio::time::timeout(Duration::from_millis(300), &mut waiting).await;
    assert!(before.is_err(), "the agent's lock is held");
    drop(held);
    let after = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("given once the first is dropped");
    assert!(after.unwrap().is_some());
}

/// Messages: posted, listed in pages, claimed with a run's creation and
/// settled with its end, archived unless claimed; one process per inbox.
async fn inboxes(store: &SqlStore) {
    let triggered =
        "name: reviewer\ntriggers: {inbox: risk}\nsteps:\n  - {id: a, type: agent_task, agent: x, message: m}\n";
    store.publish_process(new_process(triggered, "reviewer-1")).await.unwrap();
    assert_eq!(store.triggered_by("risk").await.unwrap().as_deref(), Some("reviewer"));
    assert_eq!(store.triggered_by("other").await.unwrap(), None);
    assert_eq!(store.trigger_inboxes().await.unwrap(), ["risk"]);
    let rival = store.publish_process(new_process(&triggered.replace("reviewer", "rival"), "rival-1")).await;
    assert!(matches!(rival, Err(Error::FailedPrecondition { .. })), "{rival:?}");
    // A new version without the trigger frees the inbox.
    store
        .publish_process(new_process(&triggered.replace("triggers: {inbox: risk}\n", ""), "reviewer-2"))
        .await
        .unwrap();
    assert_eq!(store.triggered_by("risk").await.unwrap(), None);
    store.publish_process(new_process(triggered, "reviewer-3")).await.unwrap();

    for (id, at) in [("m1", 10), ("m2", 20), ("m3", 20)] {
        assert_eq!(store.post_message(message(id, at)).await.unwrap(), None, "stored");
    }
    // A message posted again with its id is not stored twice: the first is returned.
    let retried = InboxMessage { body: "another body".to_owned(), ..message("m1", 30) };
    assert_eq!(store.post_message(retried).await.unwrap(), Some(message("m1", 10)));
    let list = |state, unclaimed, after: Option<(i64, &str)>, limit| InboxFilter {
        inbox: "risk".to_owned(),
        state,
        unclaimed,
        after: after.map(|(at, id)| (at, id.to_owned())),
        limit,
    };
    let ids = |messages: Vec<InboxMessage>| messages.into_iter().map(|message| message.id).collect::<Vec<_>>();
    let all = store.inbox_messages(&list(None, false, None, 10)).await.unwrap();
    assert_eq!(all[0], message("m1", 10), "every field survives");
    assert_eq!(ids(all), ["m1", "m2", "m3"]);
    assert_eq!(ids(store.inbox_messages(&list(None, false, Some((20, "m2")), 10)).await.unwrap()), ["m3"]);
    assert_eq!(ids(store.inbox_messages(&list(None, false, None, 2)).await.unwrap()), ["m1", "m2"]);

    // A run claims two; the third waits; the inbox is busy.
    let mut run = execution("inbox-run", 5_000, None);
    store
        .commit(vec![
            Write::CreateExecution(run.clone()),
            Write::ClaimMessages { execution_id: run.id.clone(), message_ids: vec!["m1".into(), "m2".into()] },
        ])
        .await
        .unwrap();
    assert!(store.inbox_busy("risk").await.unwrap());
    let unclaimed = list(Some(MessageState::Unprocessed), true, None, 10);
    assert_eq!(ids(store.inbox_messages(&unclaimed).await.unwrap()), ["m3"]);

    // A rival run (another replica's, which read the inbox before that
    // commit) claiming one of them is refused whole as superseded: it is
    // not created, and takes none of its messages.
    let rival = execution("rival-run", 5_001, None);
    let lost = store
        .commit(vec![
            Write::CreateExecution(rival.clone()),
            Write::ClaimMessages { execution_id: rival.id.clone(), message_ids: vec!["m3".into(), "m2".into()] },
        ])
        .await;
    assert!(matches!(lost, Err(Error::Superseded(_))), "{lost:?}");
    assert_eq!(store.execution("rival-run").await.unwrap(), None, "the superseded run is not created");
    assert_eq!(ids(store.inbox_messages(&unclaimed).await.unwrap()), ["m3"], "m3 still waits");
    let m2 = store.inbox_messages(&list(None, false, Some((10, "m1")), 1)).await.unwrap();
    assert_eq!(m2[0].claimed_by, run.id, "m2 stays the first run's");
    let Archived::Claimed(claimed) = store.archive_message("m1").await.unwrap() else { panic!("m1 is claimed") };
    assert_eq!((claimed.state, claimed.claimed_by.as_str()), (MessageState::Unprocessed, run.id.as_str()));

    // It fails: the messages come back, with a note.
    run.status = ExecutionStatus::Failed;
    run.reason = "step 'a' failed: no worker".to_owned();
    store.commit(vec![Write::UpdateExecution(run.clone())]).await.unwrap();
    assert!(!store.inbox_busy("risk").await.unwrap());
    let back = store.inbox_messages(&unclaimed).await.unwrap();
    assert_eq!(ids(back.clone()), ["m1", "m2", "m3"]);
    assert_eq!(back[0].note, "run inbox-run failed: step 'a' failed: no worker");
    assert_eq!(back[2].note, "", "the waiting message was never tried");

    // The next run takes all three and completes: processed.
    let mut next = execution("inbox-run-2", 6_000, None);
    let claim = vec!["m1".into(), "m2".into(), "m3".into()];
    store
        .commit(vec![
            Write::CreateExecution(next.clone()),
            Write::ClaimMessages { execution_id: next.id.clone(), message_ids: claim },
        ])
        .await
        .unwrap();
    next.status = ExecutionStatus::Completed;
    store.commit(vec![Write::UpdateExecution(next.clone())]).await.unwrap();
    let processed = store.inbox_messages(&list(Some(MessageState::Processed), false, None, 10)).await.unwrap();
    assert_eq!(processed.len(), 3);
    assert!(processed.iter().all(|message| message.processed_by == next.id && message.claimed_by.is_empty()));
    assert!(processed.iter().all(|message| message.note.is_empty()));

    // Archived messages leave the default list.
    let Archived::Done(archived) = store.archive_message("m1").await.unwrap() else { panic!("m1 is archived") };
    assert_eq!(archived.state, MessageState::Archived);
    assert_eq!(ids(store.inbox_messages(&list(None, false, None, 10)).await.unwrap()), ["m2", "m3"]);
    assert_eq!(ids(store.inbox_messages(&list(Some(MessageState::Archived), false, None, 10)).await.unwrap()), ["m1"]);
    assert_eq!(store.archive_message("nothing").await.unwrap(), Archived::NotFound);

    // A step's commit posts; a refused run notes why its messages wait, on
    // the waiting ones only.
    store.commit(vec![Write::PostMessages(vec![message("m4", 30), message("m5", 31)])]).await.unwrap();
    let waiting = list(Some(MessageState::Unprocessed), true, None, 10);
    assert_eq!(ids(store.inbox_messages(&waiting).await.unwrap()), ["m4", "m5"]);
    store.note_messages(&["m4".to_owned(), "m2".to_owned()], "no run started: budget").await.unwrap();
    let noted = store.inbox_messages(&list(None, false, None, 10)).await.unwrap();
    let notes: Vec<(&str, &str)> = noted.iter().map(|message| (message.id.as_str(), message.note.as_str())).collect();
    assert_eq!(notes, [("m2", ""), ("m3", ""), ("m4", "no run started: budget"), ("m5", "")]);
}

/// Two replicas on one database: each drives the executions it holds a
/// lease on; one whose lease lapses can no longer write, and the other
/// takes its executions over; one that leaves gives them back at once.
fn replica(id: &str, url: &str) -> Replica {
    Replica { id: id.to_owned(), url: url.to_owned(), address: String::new() }
}

async fn replicas(url: &str) {
    let store = || SqlStore::connect(url, 1, 1).unwrap();
    let (first, second, third) = (store(), store(), store());
    first.migrate().await.unwrap();
    // Quotes, backslashes and escapes reach the database as they are, in
    // whatever form a backend sends them.
    let reason = "progress: it's \\'done\\' \\x41 $$ E'\\n' \u{e9}\u{1f600}";
    let progress = |id: &str| {
        let mut update = execution(id, 0, None);
        update.reason = reason.to_owned();
        vec![Write::UpdateExecution(update)]
    };
    // An execution from before replicas: nobody owns it.
    first.commit(vec![Write::CreateExecution(execution("old", 1_000, None))]).await.unwrap();
    // Long enough for the checks below on a busy machine; renewed before them.
    let lease = Duration::from_millis(2_000);
    first.join(&Replica { address: "10.0.0.1".to_owned(), ..replica("first", "http://first") }, lease).await.unwrap();
    assert!(first.join(&replica("again", ""), Duration::from_secs(1)).await.is_err(), "a store joins once");
    assert_eq!(first.adopt().await.unwrap(), ["old"]);
    first.commit(vec![Write::CreateExecution(execution("new", 2_000, None))]).await.unwrap();
    let mut ended = execution("ended", 3_000, None);
    ended.status = ExecutionStatus::Completed;
    first.commit(vec![Write::CreateExecution(ended)]).await.unwrap();

    second.join(&replica("second", "http://second"), Duration::from_secs(600)).await.unwrap();
    assert!(second.adopt().await.unwrap().is_empty(), "the first replica's lease is live");
    let driver = second.driver_of("new").await.unwrap().unwrap();
    assert_eq!(
        (driver.id.as_str(), driver.url.as_str(), driver.address.as_str()),
        ("first", "http://first", "10.0.0.1")
    );
    assert_eq!(second.driver_of("ended").await.unwrap(), None, "an ended execution has no driver");
    assert!(first.renew(lease).await.unwrap());
    assert!(first.leads().await.unwrap() && !second.leads().await.unwrap(), "the eldest leads");
    let peers = second.peers().await.unwrap();
    assert_eq!(peers, [driver], "the others, not itself");

    // The first replica's lease lapses: its commits fail, it cannot renew
    // or adopt, and the second takes its unfinished executions over.
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let lapsed = first.commit(progress("new")).await;
    assert!(matches!(lapsed, Err(Error::Superseded(_))), "{lapsed:?}");
    assert!(!first.renew(Duration::from_secs(600)).await.unwrap(), "a lapsed lease is not renewed");
    assert_eq!(second.driver_of("new").await.unwrap(), None, "a lapsed lease drives nothing");
    assert_eq!(second.adopt().await.unwrap(), ["old", "new"]);
    assert_eq!(second.driver_of("new").await.unwrap().unwrap().id, "second");
    assert!(first.adopt().await.unwrap().is_empty(), "a replica without a lease adopts nothing");
    assert!(second.leads().await.unwrap());
    second.commit(progress("new")).await.unwrap();
    assert_eq!(second.execution("new").await.unwrap().unwrap().reason, reason);

    // A replica that leaves gives its executions back at once.
    third.join(&replica("third", ""), Duration::from_secs(600)).await.unwrap();
    assert!(third.adopt().await.unwrap().is_empty());
    assert!(second.peers().await.unwrap().is_empty(), "neither a lapsed replica nor one without a URL");
    second.leave().await.unwrap();
    assert_eq!(third.adopt().await.unwrap(), ["old", "new"]);
    assert!(third.leads().await.unwrap());
    let left = second.commit(progress("old")).await;
    assert!(matches!(left, Err(Error::Superseded(_))), "a replica that left writes nothing: {left:?}");
}

/// A SQLite file removed when dropped.
struct SqliteFile(std::path::PathBuf);

impl Drop for SqliteFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conforms_on_sqlite() {
    let file =
        SqliteFile(std::env::temp_dir().join(format!("muster-execution-store-{}.db", uuid::Uuid::new_v4().simple())));
    let url = format!("sqlite://{}", file.0.display());
    admission(&SqlStore::connect(&url, 1, 2).unwrap(), false).await;
    conformance(SqlStore::connect(&url, 1, 2).unwrap()).await;
    outputs(&SqlStore::connect(&url, 1, 2).unwrap()).await;
    // The output that came with its completion was appended once (the
    // step's later writes did not append it again); the one set by hand
    // stays in the row.
    let (appended, in_row): (i64, String) = rusqlite::Connection::open(&file.0)
        .unwrap()
        .query_row(
            "SELECT (SELECT COUNT(*) FROM step_outputs WHERE output LIKE '{\"answer\":42%'), output_json \
             FROM steps WHERE execution_id = 'e-out' AND step_id = 'a'",
            [],
            |row| Ok((row.get(0)?, row.get(1)?)),
        )
        .unwrap();
    assert_eq!((appended, in_row.as_str()), (1, "[\"by hand\"]"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_take_turns_on_sqlite() {
    let file =
        SqliteFile(std::env::temp_dir().join(format!("muster-execution-store-{}.db", uuid::Uuid::new_v4().simple())));
    replicas(&format!("sqlite://{}", file.0.display())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_take_turns_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    replicas(&database.url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_conforms_on_postgres() {
    let Some(database) = TestDatabase::create().await else { return };
    admission(&SqlStore::connect(&database.url, 4, 0).unwrap(), true).await;
    conformance(SqlStore::connect(&database.url, 4, 0).unwrap()).await;
    outputs(&SqlStore::connect(&database.url, 4, 0).unwrap()).await;
}

/// A replica cut off from PostgreSQL in the middle of a transaction (or
/// paused there) does not keep the event log's turn from the others: the
/// database ends a transaction whose client stays silent, and its locks go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_transaction_gives_the_logs_turn_back_on_postgres() {
    use muster_runtime::db::{Connections, Database};
    use sqlx::{Connection as _, Executor as _};
    let Some(database) = TestDatabase::create().await else { return };
    let idle = Duration::from_millis(300);
    let silent =
        Database::connect_lazy_with(&database.url, Connections { idle_in_transaction: idle, ..Connections::new(1) })
            .unwrap();
    let mut held = silent.pool.acquire().await.unwrap();
    let mut transaction = held.begin().await.unwrap();
    transaction.execute("SELECT pg_advisory_xact_lock(1836413812, 7106407)").await.unwrap();

    let mut other = sqlx::PgConnection::connect(&database.url).await.unwrap();
    let try_turn = "SELECT pg_try_advisory_lock(1836413812, 7106407)";
    let taken: bool = sqlx::query_scalar(try_turn).fetch_one(&mut other).await.unwrap();
    assert!(!taken, "the silent transaction holds the turn while it is young");
    tokio::time::sleep(idle * 3).await;
    let taken: bool = sqlx::query_scalar(try_turn).fetch_one(&mut other).await.unwrap();
    assert!(taken, "the turn is free once the database ended the silent transaction");
    let ended = transaction.execute("SELECT 1").await;
    assert!(ended.is_err(), "the silent transaction was ended: {ended:?}");
}
