//! The writer: one task that puts every commit waiting into one transaction
//! (group commit), holding the replica's lease, natively on a SQLite file.

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
};

use muster_runtime::db::{Backend, Database, NativeSqlite, in_statements};
use prost::Message as _;
use sqlx::AssertSqlSafe;
use tokio::sync::{mpsc, oneshot};

use super::{SQLITE_LEASE_CHECK, json_rows, lease_lapsed, literal, memory};
use super::{
    inboxes::{insert_message, settle_messages, settle_messages_statement},
    memory::insert_memory,
    rows::{
        EventRow, ExecutionRow, INSERT_EXECUTION, JSON_ROWS_PER_STATEMENT, STEP_COLUMN_COUNT, StepRow, bind_event,
        bind_execution_update, bind_step, event_insert_sql, events_from_json_sql, insert_execution, step_upsert_sql,
        steps_from_json_sql, update_execution_sql, upsert_assignment, upsert_subtask,
    },
};
use crate::store::{StepWrite, Write};
use crate::{
    Error, Result,
    domain::{
        authority::{RoleAssignment, SubtaskRequest},
        inbox::InboxMessage,
        memory::MemoryEntry,
        model::{Event, EventKind, Execution},
    },
    grpc::convert,
};

/// Most commits put into one transaction.
const MOST_COMMITS_PER_TRANSACTION: usize = 256;

/// Appends a step's output to `step_outputs` (its row id is the step's `output_id`).
const APPEND_OUTPUT: &str = "INSERT INTO step_outputs (output) VALUES (?1)";

/// A commit waiting for the writer.
pub(super) struct Job {
    pub(super) writes: Vec<Write>,
    pub(super) done: oneshot::Sender<Result<()>>,
}

/// A transaction of `replica` on PostgreSQL, begun in one round trip with
/// `muster_hold_lease`: the event log's turn, held until it ends, so no
/// takeover happens meanwhile; read-only when the lease lapsed, so that its
/// first write fails with [`Error::Superseded`].
async fn begin_holding_lease<'c>(
    connection: &'c mut sqlx::AnyConnection,
    replica: &str,
) -> Result<sqlx::Transaction<'c, sqlx::Any>> {
    use sqlx::Connection as _;
    let begin = format!("BEGIN; SELECT muster_hold_lease({})", literal(replica));
    Ok(connection.begin_with(AssertSqlSafe(begin)).await?)
}

/// The writer's connection. On PostgreSQL it is kept from one transaction
/// to the next: a pool tests a PostgreSQL connection with a round trip
/// when it hands it out and another when it takes it back, which cost a
/// running execution's commit (one transaction of a few short statements)
/// about a fifth of its time. After a failed transaction it goes back to
/// the pool (which closes it if it broke) and the next takes another; in a
/// pool of one connection, after every transaction (the store's other
/// queries need it too). On SQLite the pool's one connection stays in the
/// pool: a native transaction holds it while it runs.
struct Writer {
    database: Database,
    held: Option<sqlx::pool::PoolConnection<sqlx::Any>>,
    shared: Shared,
}

/// What the writer shares with the store.
pub(super) struct Shared {
    /// Forgotten after every transaction that remembers something.
    pub(super) memory_versions: Arc<memory::Versions>,
    /// Counted, each transaction, for the tests.
    #[cfg(test)]
    pub(super) transactions: Arc<std::sync::atomic::AtomicU64>,
}

/// The writer's connection on PostgreSQL, taken from the pool when it holds none.
async fn held_connection<'c>(
    database: &Database,
    held: &'c mut Option<sqlx::pool::PoolConnection<sqlx::Any>>,
) -> Result<&'c mut sqlx::pool::PoolConnection<sqlx::Any>> {
    Ok(match held {
        Some(connection) => connection,
        empty => empty.insert(database.pool.acquire().await?),
    })
}

/// A transaction of the writer's; on PostgreSQL, holding `replica`'s
/// lease (SQLite checks it with the transaction's first statement).
async fn begin<'c>(
    database: &Database,
    held: &'c mut Option<sqlx::pool::PoolConnection<sqlx::Any>>,
    replica: Option<&str>,
) -> Result<sqlx::Transaction<'c, sqlx::Any>> {
    use sqlx::Connection as _;
    if database.backend == Backend::Sqlite {
        return Ok(database.pool.begin().await?);
    }
    let connection = held_connection(database, held).await?;
    match replica {
        Some(replica) => begin_holding_lease(connection, replica).await,
        None => Ok(connection.begin().await?),
    }
}

/// PostgreSQL's SQLSTATE for a write in a read-only transaction.
pub(super) const READ_ONLY_TRANSACTION: &str = "25006";

/// Applies queued commits, grouping what waits into one transaction. A
/// group that fails is applied again commit by commit, so one bad commit
/// fails alone. Running executions' progress goes first, in a group of its
/// own (on SQLite, the native connection's short path), and the rest
/// (starts, ends, messages) after it in another: a burst of starts neither
/// delays the runs under way nor drags their commits onto the slower path.
pub(super) async fn write_loop(
    database: Database,
    replica: Arc<OnceLock<Arc<str>>>,
    shared: Shared,
    mut jobs: mpsc::Receiver<Job>,
) {
    let mut writer = Writer { database, held: None, shared };
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MOST_COMMITS_PER_TRANSACTION {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let replica = replica.get().map(|id| &**id);
        // On SQLite what the native connection writes goes in one
        // transaction, the rest (sessions, messages, memory, schedules)
        // after it; on PostgreSQL the progress has its one round trip.
        let split: fn(&Job) -> bool = match writer.database.native() {
            Some(_) => |job| job.writes.iter().all(is_native),
            None => |job| job.writes.iter().all(is_progress),
        };
        let (progress, rest): (Vec<Job>, Vec<Job>) = group.into_iter().partition(split);
        for (kind, group) in [("progress", progress), ("other", rest)] {
            if !group.is_empty() {
                commit_group(&mut writer, replica, kind, group).await;
            }
        }
    }
}

/// Applies a group of commits in one transaction and answers each; `kind`
/// labels its metrics (`progress`, or `other`).
async fn commit_group(writer: &mut Writer, replica: Option<&str>, kind: &str, mut group: Vec<Job>) {
    let started = std::time::Instant::now();
    #[cfg(test)]
    writer.shared.transactions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let outcome = apply(writer, replica, group.iter().flat_map(|job| &job.writes)).await;
    // Before anyone hears of a commit that remembered something.
    let remembers = group.iter().flat_map(|job| &job.writes).any(|write| matches!(write, Write::Remember(_)));
    if remembers {
        writer.shared.memory_versions.forget();
    }
    muster_runtime::metrics::observe(
        "muster_execution_commit_seconds",
        "Transactions of the execution store's writer, each holding every commit that waited for it, by kind (running executions' progress, or other)",
        &[("kind", kind)],
        started.elapsed().as_secs_f64(),
    );
    muster_runtime::metrics::count(
        "muster_execution_commits_total",
        "Commits of executions' changes (several share a transaction when they wait together), by kind (running executions' progress, or other)",
        &[("kind", kind)],
        group.len() as u64,
    );
    match outcome {
        Ok(()) => {
            for job in group {
                let _ = job.done.send(Ok(()));
            }
        }
        Err(error) if group.len() == 1 => {
            let _ = group.pop().map(|job| job.done.send(Err(error)));
        }
        Err(_) => {
            for job in group {
                let outcome = apply(writer, replica, job.writes.iter()).await;
                if remembers {
                    writer.shared.memory_versions.forget();
                }
                let _ = job.done.send(outcome);
            }
        }
    }
}

/// Writes in one transaction: the lease check of `replica` (when the store
/// joined the replicas), new executions (owned by `replica`; their steps
/// and assignments refer to them), then updates, steps, assignments and
/// events, each table in as few statements as its rows allow.
async fn apply<'a>(writer: &mut Writer, replica: Option<&str>, writes: impl Iterator<Item = &'a Write>) -> Result<()> {
    let outcome = apply_on(writer, replica, writes).await;
    if outcome.is_err() || writer.database.pool.options().get_max_connections() < 2 {
        writer.held = None;
    }
    outcome
}

async fn apply_on<'a>(
    writer: &mut Writer,
    replica: Option<&str>,
    writes: impl Iterator<Item = &'a Write>,
) -> Result<()> {
    let Writer { database, held, .. } = writer;
    let database = &*database;
    let grouped = Grouped::of(writes);
    let backend = database.backend;
    let Grouped {
        created,
        updated,
        steps,
        assignments,
        subtasks,
        events,
        claims,
        posted,
        fired,
        remembered,
        only_progress,
        natively,
    } = grouped;
    if let Some(native) = database.native().filter(|_| natively) {
        return apply_natively(native, database, replica, &created, &updated, &steps, &events).await;
    }
    if backend == Backend::Postgres && only_progress {
        return apply_in_one_round_trip(database, held, replica, &updated, &steps, &events).await;
    }
    let mut transaction = begin(database, held, replica).await?;
    if backend == Backend::Sqlite
        && let Some(replica) = replica
    {
        let held = sqlx::query(SQLITE_LEASE_CHECK).bind(replica.to_owned()).fetch_optional(&mut *transaction).await?;
        if held.is_none() {
            return Err(lease_lapsed(replica));
        }
    }
    for execution in created {
        insert_execution(&mut transaction, execution, replica).await?;
    }
    for execution in updated {
        let sql = update_execution_sql(backend);
        bind_execution_update(sqlx::query(AssertSqlSafe(sql)), execution).execute(&mut *transaction).await?;
        if execution.status.is_final() {
            settle_messages(&mut transaction, execution).await?;
        }
    }
    for message in posted {
        insert_message(&mut transaction, message).await?;
    }
    for entry in &remembered {
        insert_memory(&mut transaction, entry).await?;
    }
    memory::raise_versions(&mut transaction, remembered.iter().map(|entry| entry.role.as_str())).await?;
    fire_schedules(&mut transaction, fired).await?;
    claim_messages(&mut transaction, claims).await?;
    upsert_steps(&mut transaction, backend, &steps).await?;
    for (execution_id, assignment) in assignments {
        upsert_assignment(&mut transaction, execution_id, assignment).await?;
    }
    for (execution_id, subtask) in subtasks {
        upsert_subtask(&mut transaction, execution_id, subtask).await?;
    }
    insert_events(&mut transaction, backend, &events).await?;
    transaction.commit().await?;
    Ok(())
}

/// The writes of one transaction, by table; a step written twice keeps its
/// last state (one multi-row upsert may touch a row only once).
#[derive(Default)]
struct Grouped<'a> {
    created: Vec<&'a Execution>,
    updated: Vec<&'a Execution>,
    steps: Vec<&'a StepWrite>,
    assignments: Vec<(&'a String, &'a RoleAssignment)>,
    subtasks: Vec<(&'a String, &'a SubtaskRequest)>,
    events: Vec<&'a Event>,
    claims: Vec<(&'a String, &'a Vec<String>)>,
    posted: Vec<&'a InboxMessage>,
    /// Schedules fired: the process, when it was due, when it is due next,
    /// the run it started and when.
    fired: Vec<(&'a String, i64, i64, &'a String, i64)>,
    remembered: Vec<&'a MemoryEntry>,
    /// Whether every write is a running execution's progress ([`is_progress`]).
    only_progress: bool,
    /// Whether SQLite's native connection writes them all ([`is_native`]).
    natively: bool,
}

impl<'a> Grouped<'a> {
    fn of(writes: impl Iterator<Item = &'a Write>) -> Self {
        let mut grouped = Self { only_progress: true, natively: true, ..Self::default() };
        let mut steps: Vec<&StepWrite> = Vec::new();
        for write in writes {
            grouped.only_progress &= is_progress(write);
            grouped.natively &= is_native(write);
            match write {
                Write::CreateExecution(execution) => grouped.created.push(execution),
                Write::UpdateExecution(execution) => grouped.updated.push(execution),
                Write::Steps(rows) => steps.extend(rows),
                Write::Assignment { execution_id, assignment } => grouped.assignments.push((execution_id, assignment)),
                Write::Subtask { execution_id, subtask } => grouped.subtasks.push((execution_id, subtask)),
                Write::Events(list) => grouped.events.extend(list),
                Write::ClaimMessages { execution_id, message_ids } => grouped.claims.push((execution_id, message_ids)),
                Write::PostMessages(list) => grouped.posted.extend(list),
                Write::Remember(list) => grouped.remembered.extend(list),
                Write::FireSchedule { process_name, due, next, execution_id, fired_at } => {
                    grouped.fired.push((process_name, *due, *next, execution_id, *fired_at));
                }
            }
        }
        let mut last_write: HashMap<(&str, u32), usize> = HashMap::with_capacity(steps.len());
        for (index, step) in steps.iter().enumerate() {
            last_write.insert((step.execution_id.as_str(), step.position), index);
        }
        grouped.steps = steps
            .iter()
            .enumerate()
            .filter(|(index, step)| last_write[&(step.execution_id.as_str(), step.position)] == *index)
            .map(|(_, step)| *step)
            .collect();
        grouped
    }
}

/// Whether a write is a running execution's progress (its row, steps,
/// events): nothing that needs an answer between statements.
fn is_progress(write: &Write) -> bool {
    match write {
        Write::UpdateExecution(execution) => !execution.status.is_final(),
        Write::Steps(_) | Write::Events(_) => true,
        Write::CreateExecution(_)
        | Write::Assignment { .. }
        | Write::Subtask { .. }
        | Write::ClaimMessages { .. }
        | Write::PostMessages(_)
        | Write::Remember(_)
        | Write::FireSchedule { .. } => false,
    }
}

/// Whether SQLite's native connection writes it ([`apply_natively`]): a
/// running execution's progress, a new execution outside sessions, an
/// execution's end.
fn is_native(write: &Write) -> bool {
    match write {
        Write::CreateExecution(execution) => execution.session.is_none(),
        Write::UpdateExecution(_) | Write::Steps(_) | Write::Events(_) => true,
        Write::Assignment { .. }
        | Write::Subtask { .. }
        | Write::ClaimMessages { .. }
        | Write::PostMessages(_)
        | Write::Remember(_)
        | Write::FireSchedule { .. } => false,
    }
}

/// Moves each fired schedule on to its next time, only if it was still due
/// at the time it fired (another replica may have fired it first).
async fn fire_schedules(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    fired: Vec<(&String, i64, i64, &String, i64)>,
) -> Result<()> {
    for (process_name, due, next, execution_id, fired_at) in fired {
        let moved = sqlx::query(
            "UPDATE schedules SET next_fire_at = $1, last_fired_at = $2, last_execution_id = $3 \
             WHERE process_name = $4 AND next_fire_at = $5",
        )
        .bind(next)
        .bind(fired_at)
        .bind(execution_id.clone())
        .bind(process_name.clone())
        .bind(due)
        .execute(&mut **transaction)
        .await?;
        if moved.rows_affected() == 0 {
            return Err(Error::Superseded(format!("the schedule of process '{process_name}' was no longer due")));
        }
    }
    Ok(())
}

/// A new run takes its inbox messages, only those still waiting.
async fn claim_messages(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    claims: Vec<(&String, &Vec<String>)>,
) -> Result<()> {
    for (execution_id, message_ids) in claims {
        for id in message_ids {
            let moved = sqlx::query(
                "UPDATE inbox_messages SET claimed_by = $1, note = '' \
                 WHERE id = $2 AND state = 'unprocessed' AND claimed_by = ''",
            )
            .bind(execution_id.clone())
            .bind(id.clone())
            .execute(&mut **transaction)
            .await?;
            // Another run (of another replica) took it first: this run
            // must not start with it.
            if moved.rows_affected() == 0 {
                return Err(Error::Superseded(format!("inbox message '{id}' was no longer waiting for a run")));
            }
        }
    }
    Ok(())
}

/// The steps' rows, in as few statements as their number allows.
async fn upsert_steps(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    steps: &[&StepWrite],
) -> Result<()> {
    if backend == Backend::Postgres {
        for chunk in steps.chunks(JSON_ROWS_PER_STATEMENT) {
            let rows: Vec<StepRow<'_>> = chunk.iter().map(|write| StepRow::of(write)).collect();
            sqlx::query(AssertSqlSafe(steps_from_json_sql("$1")))
                .bind(json_rows(&rows)?)
                .execute(&mut **transaction)
                .await?;
        }
    } else {
        for chunk in in_statements(steps) {
            let sql = step_upsert_sql(chunk.len());
            let query = chunk.iter().fold(sqlx::query(sql), |query, write| bind_step(query, write));
            query.execute(&mut **transaction).await?;
        }
    }
    Ok(())
}

/// The events, appended to the log in as few statements as their number allows.
async fn insert_events(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    backend: Backend,
    events: &[&Event],
) -> Result<()> {
    if backend == Backend::Postgres {
        for chunk in events.chunks(JSON_ROWS_PER_STATEMENT) {
            sqlx::query(AssertSqlSafe(events_from_json_sql("$1")))
                .bind(json_rows(&EventRow::all(chunk))?)
                .execute(&mut **transaction)
                .await?;
        }
    } else {
        for chunk in in_statements(events) {
            let sql = event_insert_sql(chunk.len());
            let query = chunk.iter().fold(sqlx::query(sql), |query, event| bind_event(query, event));
            query.execute(&mut **transaction).await?;
        }
    }
    Ok(())
}

/// Executions' starts, progress and ends on SQLite (their rows, their
/// steps and their events, the inbox messages an end settles: nothing that
/// needs an answer between statements) as one transaction run whole on the
/// calling thread ([`NativeSqlite`]): a thread hand-off per statement was
/// where most of a small commit's time went.
async fn apply_natively(
    native: &NativeSqlite,
    database: &Database,
    replica: Option<&str>,
    created: &[&Execution],
    updated: &[&Execution],
    steps: &[&StepWrite],
    events: &[&Event],
) -> Result<()> {
    native
        .write(&database.pool, |transaction| {
            if let Some(replica) = replica {
                let mut check = transaction.prepare_cached(SQLITE_LEASE_CHECK)?;
                if !check.exists([replica])? {
                    return Err(lease_lapsed(replica));
                }
            }
            for execution in created {
                let mut statement = transaction.prepare_cached(INSERT_EXECUTION)?;
                statement.execute(rusqlite::params![
                    execution.id,
                    execution.process_name,
                    i64::from(execution.process_version),
                    execution.status.as_str(),
                    execution.reason,
                    execution.lead_agent_id,
                    execution.inputs_json,
                    execution.idempotency_key,
                    execution.started_at,
                    execution.ended_at,
                    execution.last_sequence as i64,
                    execution.trace_parent,
                    false,
                    "",
                    "",
                    replica,
                ])?;
            }
            for execution in updated {
                let mut statement = transaction.prepare_cached(&update_execution_sql(Backend::Sqlite))?;
                statement.execute(rusqlite::params![
                    execution.status.as_str(),
                    execution.reason,
                    execution.lead_agent_id,
                    execution.ended_at,
                    execution.last_sequence as i64,
                    execution.id,
                ])?;
                if execution.status.is_final() {
                    let (sql, first) = settle_messages_statement(execution);
                    transaction.prepare_cached(sql)?.execute(rusqlite::params![first, execution.id])?;
                }
            }
            // The outputs this commit completes their steps with, by execution and step.
            let completed: HashMap<(&str, &str), &str> = events
                .iter()
                .filter(|event| event.kind == EventKind::StepCompleted)
                .filter_map(|event| Some(((&*event.execution_id, &*event.step_id), &**event.output_json.as_ref()?)))
                .collect();
            let mut appended = Vec::new();
            for chunk in in_statements(steps) {
                // An output that comes with its step's completion is
                // appended to `step_outputs`; any other stays in the row.
                appended.clear();
                for write in chunk {
                    let output = write.step.output_json.as_deref();
                    let completes =
                        output.is_some() && completed.get(&(&*write.execution_id, &*write.step_id)).copied() == output;
                    appended.push(if completes {
                        transaction.prepare_cached(APPEND_OUTPUT)?.execute([output])?;
                        Some(transaction.last_insert_rowid())
                    } else {
                        None
                    });
                }
                let mut statement = transaction.prepare_cached(step_upsert_sql(chunk.len()))?;
                for (row, write) in chunk.iter().enumerate() {
                    let first = row * STEP_COLUMN_COUNT;
                    let mut step = StepRow::of(write);
                    if appended[row].is_some() {
                        step.output_json = "";
                    }
                    let mut bind = |column: usize, value: &dyn rusqlite::ToSql| {
                        statement.raw_bind_parameter(first + column, value)
                    };
                    bind(1, &step.execution_id)?;
                    bind(2, &step.step_id)?;
                    bind(3, &step.position)?;
                    bind(4, &step.status)?;
                    bind(5, &step.executor)?;
                    bind(6, &step.attempt)?;
                    bind(7, &step.output_json)?;
                    bind(8, &step.error_code)?;
                    bind(9, &step.error_message)?;
                    bind(10, &step.started_at)?;
                    bind(11, &step.ended_at)?;
                    bind(12, &step.cost)?;
                    bind(13, &step.tokens_used)?;
                    bind(14, &step.assigned_to)?;
                    bind(15, &step.delegation_chain)?;
                    bind(16, &step.wait_seconds)?;
                    bind(17, &step.retry_at)?;
                    bind(18, &step.roster_reserved)?;
                    bind(19, &step.slot_task)?;
                    bind(20, &appended[row])?;
                }
                statement.raw_execute()?;
            }
            for chunk in in_statements(events) {
                let mut statement = transaction.prepare_cached(event_insert_sql(chunk.len()))?;
                for (row, event) in chunk.iter().enumerate() {
                    let first = row * 3;
                    statement.raw_bind_parameter(first + 1, &event.execution_id)?;
                    statement.raw_bind_parameter(first + 2, event.sequence as i64)?;
                    statement.raw_bind_parameter(first + 3, convert::event_to_wire(event).encode_to_vec())?;
                }
                statement.raw_execute()?;
            }
            Ok(())
        })
        .await
}

/// A running execution's progress on PostgreSQL (what [`apply_natively`]
/// writes on SQLite) in one round trip: one call of
/// `muster_commit_progress` (migration 13), its own transaction, with the
/// rows as JSON parameters. The function holds the lease first, so the
/// event log's turn is held before the events draw their positions, and its
/// statements are planned once per connection: sent as text, they were
/// planned on every commit.
async fn apply_in_one_round_trip(
    database: &Database,
    held: &mut Option<sqlx::pool::PoolConnection<sqlx::Any>>,
    replica: Option<&str>,
    updated: &[&Execution],
    steps: &[&StepWrite],
    events: &[&Event],
) -> Result<()> {
    if updated.is_empty() && steps.is_empty() && events.is_empty() {
        return Ok(());
    }
    // An execution updated twice keeps its last state (one UPDATE takes
    // one source row per target row).
    let last: HashMap<&str, usize> =
        updated.iter().enumerate().map(|(index, execution)| (execution.id.as_str(), index)).collect();
    let executions: Vec<ExecutionRow<'_>> = updated
        .iter()
        .enumerate()
        .filter(|(index, execution)| last[execution.id.as_str()] == *index)
        .map(|(_, execution)| ExecutionRow::of(execution))
        .collect();
    let steps: Vec<StepRow<'_>> = steps.iter().map(|write| StepRow::of(write)).collect();
    let connection = held_connection(database, held).await?;
    sqlx::query("SELECT muster_commit_progress($1, $2::json, $3::json, $4::json)")
        .bind(replica.map(str::to_owned))
        .bind(json_rows(&executions)?)
        .bind(json_rows(&steps)?)
        .bind(json_rows(&EventRow::all(events))?)
        .execute(&mut **connection)
        .await?;
    Ok(())
}
