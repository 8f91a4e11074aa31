//! The execution store's writer alone, on a SQLite file: what a step's
//! commits cost when many runs commit together, against one run's fan-out.
//!
//! - `many`: EXECUTIONS runs of a ten-step chain, created together, each
//!   then committing its steps one commit after another as a driver does
//!   (the end of a step with its output and the start of the next, two
//!   events), all runs at once, so the writer groups their commits.
//! - `fan-out`: one run of as many steps, started and ended 64 at a time
//!   (a worker's room), a commit per 64.
//!
//! Prints steps (or, for the creations, runs) per second, the writer's
//! transactions and the commits they held, how long each took and how busy
//! the writer was, and the sizes of the write-ahead log after `many` and of
//! the database.
//!
//! `cargo bench -p muster-execution --bench store [-- EXECUTIONS [OUTPUT_BYTES]]`
//! (default 1000 runs, outputs of 700 bytes as the sample behaviour's).

use std::{sync::Arc, time::Instant};

use muster_execution::{
    domain::{
        ExecutionStatus, StepStatus,
        model::{Event, EventKind, Execution, Step},
    },
    store::{SqlStore, StepWrite, Store, Write},
};

/// Steps of each run of `many`.
const STEPS: usize = 10;
/// Steps of the fan-out committed together.
const WORKER_ROOM: usize = 64;

fn execution(id: &str) -> Execution {
    Execution {
        id: id.to_owned(),
        process_name: "bench".to_owned(),
        process_version: 1,
        status: ExecutionStatus::Running,
        reason: String::new(),
        lead_agent_id: "lead".to_owned(),
        inputs_json: "{}".to_owned(),
        idempotency_key: None,
        started_at: 1_000,
        ended_at: None,
        last_sequence: 0,
        trace_parent: String::new(),
        session: None,
    }
}

fn step_write(execution_id: &str, position: usize, step: Step) -> StepWrite {
    StepWrite {
        execution_id: execution_id.to_owned(),
        position: position as u32,
        step_id: format!("s{position}"),
        step,
    }
}

fn running(position: usize) -> Step {
    Step {
        status: StepStatus::Running,
        executor: format!("agent-{}", position % 10),
        attempt: 1,
        started_at: Some(2_000 + position as i64),
        ..Step::default()
    }
}

fn completed(position: usize, output: &Arc<str>) -> Step {
    Step {
        status: StepStatus::Completed,
        output_json: Some(output.clone()),
        ended_at: Some(3_000 + position as i64),
        cost: 0.01,
        tokens_used: 100,
        ..running(position)
    }
}

fn step_event(execution: &mut Execution, kind: EventKind, position: usize, output: Option<&Arc<str>>) -> Event {
    let mut event = Event::new(execution, kind, 2_000, String::new());
    event.step_id = format!("s{position}");
    event.agent_id = format!("agent-{}", position % 10);
    event.output_json = output.cloned();
    event
}

/// A run's creation: its row, its steps pending, the first one running.
fn creation(id: &str, steps: usize) -> (Execution, Vec<Write>) {
    let mut execution = execution(id);
    let started = Event::new(&mut execution, EventKind::ExecutionStarted, 1_000, String::new());
    let writes = vec![
        Write::CreateExecution(execution.clone()),
        Write::Steps((0..steps).map(|position| step_write(id, position, Step::default())).collect()),
        Write::Events(vec![started]),
    ];
    (execution, writes)
}

/// One run of a ten-step chain, commit after commit.
async fn chain(store: SqlStore, mut execution: Execution, output: Arc<str>) {
    let id = execution.id.clone();
    let first = step_event(&mut execution, EventKind::StepStarted, 0, None);
    store
        .commit(vec![Write::Steps(vec![step_write(&id, 0, running(0))]), Write::Events(vec![first])])
        .await
        .expect("a start");
    for position in 0..STEPS {
        let mut steps = vec![step_write(&id, position, completed(position, &output))];
        let mut events = vec![step_event(&mut execution, EventKind::StepCompleted, position, Some(&output))];
        if position + 1 < STEPS {
            steps.push(step_write(&id, position + 1, running(position + 1)));
            events.push(step_event(&mut execution, EventKind::StepStarted, position + 1, None));
        }
        store.commit(vec![Write::Steps(steps), Write::Events(events)]).await.expect("a step's commit");
    }
    execution.status = ExecutionStatus::Completed;
    execution.ended_at = Some(4_000);
    let finished = Event::new(&mut execution, EventKind::ExecutionFinished, 4_000, String::new());
    store.commit(vec![Write::UpdateExecution(execution), Write::Events(vec![finished])]).await.expect("an end");
}

/// The writer's figures so far: transactions, commits, seconds in them.
fn writer_figures() -> [f64; 3] {
    let text = muster_runtime::metrics::render();
    let sum = |name: &str| -> f64 {
        text.lines()
            .filter(|line| line.starts_with(name) && line[name.len()..].starts_with([' ', '{']))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    [
        sum("muster_execution_commit_seconds_count"),
        sum("muster_execution_commits_total"),
        sum("muster_execution_commit_seconds_sum"),
    ]
}

fn wal_bytes(path: &std::path::Path) -> u64 {
    std::fs::metadata(path.with_extension("db-wal")).map_or(0, |metadata| metadata.len())
}

fn report(shape: &str, steps: usize, started: Instant, before: [f64; 3]) {
    let seconds = started.elapsed().as_secs_f64();
    let after = writer_figures();
    let [transactions, commits, time] = [0, 1, 2].map(|index| after[index] - before[index]);
    println!(
        "{shape:<8} {steps:>7} {seconds:>8.3} {:>10.0} {:>8.1} {transactions:>13} {:>9.1} {:>11.0} {:>9.0}%",
        steps as f64 / seconds,
        seconds * 1e6 / steps as f64,
        commits / transactions.max(1.0),
        time * 1e6 / transactions.max(1.0),
        time * 100.0 / seconds
    );
}

#[tokio::main]
async fn main() {
    let arguments: Vec<usize> = std::env::args().skip(1).filter_map(|argument| argument.parse().ok()).collect();
    let executions = arguments.first().copied().unwrap_or(1000);
    let output_bytes = arguments.get(1).copied().unwrap_or(700);
    let output: Arc<str> = format!("{{\"text\":\"{}\"}}", "x".repeat(output_bytes.saturating_sub(12))).into();

    let folder = std::env::temp_dir().join(format!("muster-store-bench-{}", std::process::id()));
    std::fs::create_dir_all(&folder).expect("a scratch folder");
    let path = folder.join("execution.db");
    let url = format!("sqlite://{}?mode=rwc", path.display());
    let store = match std::env::var("PAGE").ok().and_then(|page| page.parse().ok()) {
        Some(page) => {
            let connections = muster_runtime::db::Connections {
                readers: 2,
                sqlite_page_size: page,
                sqlite_foreign_keys: std::env::var("FK").is_ok(),
                ..muster_runtime::db::Connections::new(1)
            };
            SqlStore::new(muster_runtime::db::Database::connect_lazy_with(&url, connections).expect("a database"))
        }
        None => SqlStore::connect(&url, 1, 2).expect("a store"),
    };
    store.migrate().await.expect("migrations");
    println!(
        "shape      steps  seconds    steps/s  µs/step  transactions  commits/t  µs/transaction  writer busy   (outputs of {output_bytes} bytes)"
    );

    // Many runs at once: created together, then each commits its chain.
    let before = writer_figures();
    let started = Instant::now();
    let creations: Vec<_> = (0..executions)
        .map(|index| {
            let store = store.clone();
            tokio::spawn(async move {
                let (execution, writes) = creation(&format!("many-{index:06}"), STEPS);
                store.commit(writes).await.expect("a creation");
                execution
            })
        })
        .collect();
    let mut runs = Vec::with_capacity(executions);
    for creation in creations {
        runs.push(creation.await.expect("a creation"));
    }
    report("created", executions, started, before);
    let before = writer_figures();
    let started = Instant::now();
    let chains: Vec<_> =
        runs.into_iter().map(|execution| tokio::spawn(chain(store.clone(), execution, output.clone()))).collect();
    for chain in chains {
        chain.await.expect("a run");
    }
    report("many", executions * STEPS, started, before);
    let wal_after_many = wal_bytes(&path);

    // One run's fan-out of as many steps, a worker's room at a time.
    let steps = executions * STEPS;
    let before = writer_figures();
    let started = Instant::now();
    let (mut execution, writes) = creation("fan-out", steps);
    store.commit(writes).await.expect("a creation");
    let id = execution.id.clone();
    for first in (0..steps).step_by(WORKER_ROOM) {
        let positions = first..(first + WORKER_ROOM).min(steps);
        let starts = positions.clone().map(|position| step_write(&id, position, running(position))).collect();
        let events = positions
            .clone()
            .map(|position| step_event(&mut execution, EventKind::StepStarted, position, None))
            .collect();
        store.commit(vec![Write::Steps(starts), Write::Events(events)]).await.expect("starts");
        let ends = positions.clone().map(|position| step_write(&id, position, completed(position, &output))).collect();
        let events = positions
            .map(|position| step_event(&mut execution, EventKind::StepCompleted, position, Some(&output)))
            .collect();
        store.commit(vec![Write::Steps(ends), Write::Events(events)]).await.expect("ends");
    }
    report("fan-out", steps, started, before);
    println!(
        "write-ahead log after many: {:.1} MB; database: {:.1} MB",
        wal_after_many as f64 / 1e6,
        std::fs::metadata(&path).map_or(0, |metadata| metadata.len()) as f64 / 1e6
    );
    drop(store);
    let _ = std::fs::remove_dir_all(&folder);
}
