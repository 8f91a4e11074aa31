//! [`Store`] on SQLite and PostgreSQL through sqlx's `Any` driver, with
//! portable SQL and one migration set per backend.
//!
//! Writes of executions go through one writer task: each commit waits in
//! its queue, and the writer puts every commit waiting when it is free into
//! one transaction (group commit), with one multi-row statement per table.
//! Positions in the event log follow commit order, which the notifier's
//! cursor relies on: one writer per replica, and on PostgreSQL the
//! replicas' transactions that append to the log take turns (a transaction
//! advisory lock). Once the store has joined the replicas
//! ([`Store::join`]), every transaction first checks the replica's lease on
//! its executions (on PostgreSQL with its BEGIN, holding the log's turn,
//! which a takeover takes too), so a replica that lost its lease can no
//! longer write. Reads use the database's read pool, so they never wait
//! behind the writer. On a
//! SQLite file, a transaction of running executions' progress (the usual
//! one) runs whole on the writer's thread through the native connection.

use std::{
    collections::HashMap,
    sync::{Arc, OnceLock},
    time::Duration,
};

use muster_proto::common::v1 as common;
use muster_runtime::db::{
    Backend, Connections, Database, Migrations, NativeSqlite, SMALL_PAGES, placeholder, placeholders,
};
use prost::Message as _;
use sqlx::{AssertSqlSafe, Row, any::AnyRow};
use tokio::sync::{mpsc, oneshot};

mod memory;
mod participants;

use super::{
    Activity, AdmissionLock, Archived, BoxFuture, ExecutionFilter, InboxFilter, LogEntry, NewProcess, Published,
    Replica, StepWrite, Store, Write,
};
use crate::{
    Error, Result,
    domain::{
        authority::{Matrix, RoleAssignment, Session, SubtaskRequest, SubtaskStatus},
        budget::{self, Budget, Usage},
        inbox::{InboxMessage, MessageState},
        memory::MemoryEntry,
        model::{Event, Execution, Finding, ProcessVersion, Step, Warnings},
        schedule::ScheduleState,
    },
    wire,
};

/// The migrations of both backends.
const MIGRATIONS: Migrations = Migrations {
    sqlite: &[
        (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
        (2, "trace parent", include_str!("../../migrations/sqlite/0002_trace_parent.sql")),
        (3, "sessions", include_str!("../../migrations/sqlite/0003_sessions.sql")),
        (4, "engine", include_str!("../../migrations/sqlite/0004_engine.sql")),
        (5, "inboxes", include_str!("../../migrations/sqlite/0005_inboxes.sql")),
        (6, "budgets", include_str!("../../migrations/sqlite/0006_budgets.sql")),
        (7, "schedules", include_str!("../../migrations/sqlite/0007_schedules.sql")),
        (8, "memory", include_str!("../../migrations/sqlite/0008_memory.sql")),
        (9, "agent budgets", include_str!("../../migrations/sqlite/0009_agent_budgets.sql")),
        (10, "inherited slots", include_str!("../../migrations/sqlite/0010_inherited_slots.sql")),
        (11, "replicas", include_str!("../../migrations/sqlite/0011_replicas.sql")),
        (12, "replica_address", include_str!("../../migrations/sqlite/0012_replica_address.sql")),
        (13, "process agents", include_str!("../../migrations/sqlite/0013_process_agents.sql")),
        (14, "memory versions", include_str!("../../migrations/sqlite/0014_memory_versions.sql")),
        (15, "session subtasks", include_str!("../../migrations/sqlite/0015_session_subtasks.sql")),
    ],
    postgres: &[
        (1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
        (2, "trace parent", include_str!("../../migrations/postgres/0002_trace_parent.sql")),
        (3, "sessions", include_str!("../../migrations/postgres/0003_sessions.sql")),
        (4, "engine", include_str!("../../migrations/postgres/0004_engine.sql")),
        (5, "inboxes", include_str!("../../migrations/postgres/0005_inboxes.sql")),
        (6, "budgets", include_str!("../../migrations/postgres/0006_budgets.sql")),
        (7, "schedules", include_str!("../../migrations/postgres/0007_schedules.sql")),
        (8, "memory", include_str!("../../migrations/postgres/0008_memory.sql")),
        (9, "agent budgets", include_str!("../../migrations/postgres/0009_agent_budgets.sql")),
        (10, "inherited slots", include_str!("../../migrations/postgres/0010_inherited_slots.sql")),
        (11, "replicas", include_str!("../../migrations/postgres/0011_replicas.sql")),
        (12, "replica_address", include_str!("../../migrations/postgres/0012_replica_address.sql")),
        (13, "commit progress", include_str!("../../migrations/postgres/0013_commit_progress.sql")),
        (14, "process agents", include_str!("../../migrations/postgres/0014_process_agents.sql")),
        (15, "memory versions", include_str!("../../migrations/postgres/0015_memory_versions.sql")),
        (16, "session subtasks", include_str!("../../migrations/postgres/0016_session_subtasks.sql")),
    ],
};

/// Most commits put into one transaction.
const MOST_COMMITS_PER_TRANSACTION: usize = 256;
/// Rows per multi-row statement (SQLite binds each value).
const STEP_ROWS_PER_STATEMENT: usize = 400;
const EVENT_ROWS_PER_STATEMENT: usize = 1000;
/// Rows per statement on PostgreSQL, where all rows travel as one JSON
/// parameter: the statement's text never changes, so it is prepared once
/// per connection (a multi-row VALUES list with thousands of parameters was
/// parsed and planned anew for every size, tens of milliseconds each).
const JSON_ROWS_PER_STATEMENT: usize = 5000;

/// The columns of a step row, in order.
const STEP_COLUMNS: &str = "execution_id, step_id, position, status, executor, attempt, output_json, error_code, \
     error_message, started_at, ended_at, cost, tokens_used, assigned_to, delegation_chain, wait_seconds, retry_at, \
     roster_reserved, slot_task";

/// The advisory lock appends to the event log take on PostgreSQL ("must",
/// "log"); the two-key form, a key space apart from the admission locks'.
/// `muster_hold_lease` takes it for every transaction of a replica (a store
/// that has not joined the replicas is its process's only writer), and a
/// takeover takes it too, so the two take turns.
const LOG_LOCK: (i32, i32) = (0x6d75_7374, 0x006c_6f67);

/// How many columns [`STEP_COLUMNS`] names.
const STEP_COLUMN_COUNT: usize = 19;

/// What a step row's upsert changes.
const STEP_UPDATE: &str = "ON CONFLICT (execution_id, step_id) DO UPDATE SET status = excluded.status, \
     executor = excluded.executor, attempt = excluded.attempt, output_json = excluded.output_json, \
     error_code = excluded.error_code, error_message = excluded.error_message, \
     started_at = excluded.started_at, ended_at = excluded.ended_at, cost = excluded.cost, \
     tokens_used = excluded.tokens_used, assigned_to = excluded.assigned_to, \
     delegation_chain = excluded.delegation_chain, wait_seconds = excluded.wait_seconds, \
     retry_at = excluded.retry_at, roster_reserved = excluded.roster_reserved, \
     slot_task = excluded.slot_task";

/// The SQLite upsert of `rows` step rows, its text made once per row count
/// (a commit's statements are looked up by their text).
fn step_upsert_sql(rows: usize) -> &'static str {
    static TEXTS: [OnceLock<String>; STEP_ROWS_PER_STATEMENT] = [const { OnceLock::new() }; STEP_ROWS_PER_STATEMENT];
    TEXTS[rows - 1].get_or_init(|| {
        let values = placeholders(Backend::Sqlite, rows, STEP_COLUMN_COUNT);
        format!("INSERT INTO steps ({STEP_COLUMNS}) VALUES {values} {STEP_UPDATE}")
    })
}

/// The SQLite insert of `rows` events, its text made once per row count.
fn event_insert_sql(rows: usize) -> &'static str {
    static TEXTS: [OnceLock<String>; EVENT_ROWS_PER_STATEMENT] = [const { OnceLock::new() }; EVENT_ROWS_PER_STATEMENT];
    TEXTS[rows - 1].get_or_init(|| {
        let values = placeholders(Backend::Sqlite, rows, 3);
        format!("INSERT INTO events (execution_id, sequence, event) VALUES {values}")
    })
}

/// A step row as PostgreSQL's `json_to_recordset` reads it.
#[derive(serde::Serialize)]
struct StepRow<'a> {
    execution_id: &'a str,
    step_id: &'a str,
    position: i64,
    status: &'a str,
    executor: &'a str,
    attempt: i64,
    output_json: &'a str,
    error_code: &'a str,
    error_message: &'a str,
    started_at: Option<i64>,
    ended_at: Option<i64>,
    cost: f64,
    tokens_used: i64,
    assigned_to: Option<&'a str>,
    delegation_chain: String,
    wait_seconds: i64,
    retry_at: Option<i64>,
    roster_reserved: i64,
    slot_task: &'a str,
}

impl<'a> StepRow<'a> {
    fn of(write: &'a StepWrite) -> Self {
        let step = &write.step;
        Self {
            execution_id: &write.execution_id,
            step_id: &write.step_id,
            position: i64::from(write.position),
            status: step.status.as_str(),
            executor: &step.executor,
            attempt: i64::from(step.attempt),
            output_json: step.output_json.as_deref().unwrap_or_default(),
            error_code: &step.error_code,
            error_message: &step.error_message,
            started_at: step.started_at,
            ended_at: step.ended_at,
            cost: step.cost,
            tokens_used: step.tokens_used as i64,
            assigned_to: step.assigned_to.as_deref(),
            delegation_chain: serde_json::to_string(&step.delegation_chain).unwrap_or_else(|_| "[]".to_owned()),
            wait_seconds: step.wait_seconds as i64,
            retry_at: step.retry_at,
            roster_reserved: i64::from(step.roster_reserved),
            slot_task: &step.slot_task,
        }
    }
}

/// An execution's row as `muster_commit_progress` updates it.
#[derive(serde::Serialize)]
struct ExecutionRow<'a> {
    id: &'a str,
    status: &'a str,
    reason: &'a str,
    lead_agent_id: &'a str,
    ended_at: Option<i64>,
    last_sequence: i64,
}

impl<'a> ExecutionRow<'a> {
    fn of(execution: &'a Execution) -> Self {
        Self {
            id: &execution.id,
            status: execution.status.as_str(),
            reason: &execution.reason,
            lead_agent_id: &execution.lead_agent_id,
            ended_at: execution.ended_at,
            last_sequence: execution.last_sequence as i64,
        }
    }
}

/// An event row as PostgreSQL's `json_to_recordset` reads it: the encoded
/// event in hexadecimal.
#[derive(serde::Serialize)]
struct EventRow<'a> {
    execution_id: &'a str,
    sequence: i64,
    event: String,
}

impl<'a> EventRow<'a> {
    fn all(events: &[&'a Event]) -> Vec<Self> {
        events
            .iter()
            .map(|event| EventRow {
                execution_id: &event.execution_id,
                sequence: event.sequence as i64,
                event: hex(&wire::event_to_wire(event).encode_to_vec()),
            })
            .collect()
    }
}

/// PostgreSQL's upsert of the step rows in the JSON array `json` (a
/// parameter or a literal) holds.
fn steps_from_json_sql(json: &str) -> String {
    format!(
        "INSERT INTO steps ({STEP_COLUMNS}) SELECT {STEP_COLUMNS} FROM json_to_recordset({json}::json) AS r(\
         execution_id TEXT, step_id TEXT, position BIGINT, status TEXT, executor TEXT, attempt BIGINT, \
         output_json TEXT, error_code TEXT, error_message TEXT, started_at BIGINT, ended_at BIGINT, \
         cost DOUBLE PRECISION, tokens_used BIGINT, assigned_to TEXT, delegation_chain TEXT, \
         wait_seconds BIGINT, retry_at BIGINT, roster_reserved BIGINT, slot_task TEXT) {STEP_UPDATE}"
    )
}

/// PostgreSQL's insert of the event rows in the JSON array `json` (a
/// parameter or a literal) holds.
fn events_from_json_sql(json: &str) -> String {
    format!(
        "INSERT INTO events (execution_id, sequence, event) \
         SELECT execution_id, sequence, decode(event, 'hex') FROM json_to_recordset({json}::json) \
         AS r(execution_id TEXT, sequence BIGINT, event TEXT)"
    )
}

/// `text` as a PostgreSQL string literal: an escape string (`E'...'`),
/// read the same whatever `standard_conforming_strings` says.
fn literal(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 3);
    quoted.push_str("E'");
    let mut rest = text;
    while let Some(at) = rest.find(['\\', '\'']) {
        quoted.push_str(&rest[..at]);
        quoted.push_str(if rest.as_bytes()[at] == b'\\' { "\\\\" } else { "''" });
        rest = &rest[at + 1..];
    }
    quoted.push_str(rest);
    quoted.push('\'');
    quoted
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(DIGITS[usize::from(byte >> 4)] as char);
        text.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    text
}

fn json_rows<T: serde::Serialize>(rows: &[T]) -> Result<String> {
    serde_json::to_string(rows).map_err(|error| Error::Storage(format!("encoding rows: {error}")))
}

/// A commit waiting for the writer.
struct Job {
    writes: Vec<Write>,
    done: oneshot::Sender<Result<()>>,
}

/// The store on a SQL database.
#[derive(Clone)]
pub(crate) struct SqlStore {
    database: Database,
    writer: mpsc::Sender<Job>,
    /// The replica this store writes for, once it joined.
    replica: Arc<OnceLock<Arc<str>>>,
}

impl std::fmt::Debug for SqlStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("SqlStore").field("backend", &self.database.backend).finish_non_exhaustive()
    }
}

impl SqlStore {
    /// A store on `url` (`sqlite://...` or `postgres://...`), connected on
    /// first use, with a pool of `readers` connections for reads (0: reads
    /// share the writers'). A SQLite file it creates has small pages: a
    /// running execution commits a few small rows per step.
    pub(crate) fn connect(url: &str, max_connections: u32, readers: u32) -> muster_runtime::Result<Self> {
        let connections = Connections { readers, sqlite_page_size: SMALL_PAGES, ..Connections::new(max_connections) };
        Ok(Self::new(Database::connect_lazy_with(url, connections)?))
    }

    /// A store on `database`; its writer runs until the last clone is dropped.
    pub(crate) fn new(database: Database) -> Self {
        let (writer, jobs) = mpsc::channel(4096);
        let replica = Arc::new(OnceLock::new());
        tokio::spawn(write_loop(database.clone(), replica.clone(), jobs));
        Self { database, writer, replica }
    }

    /// The replica this store writes for.
    fn replica(&self) -> Result<&str> {
        self.replica
            .get()
            .map(|id| &**id)
            .ok_or_else(|| Error::Storage("the store has not joined the replicas".to_owned()))
    }
}

/// SQLite's clock in milliseconds since the epoch, as SQL.
macro_rules! sqlite_now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

/// The database's clock, in milliseconds since the epoch: leases are
/// compared on one clock whatever the replicas' clocks say.
fn database_now(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
        Backend::Sqlite => sqlite_now!(),
    }
}

/// The statement that finds the replica's lease unexpired, on SQLite (whose
/// writers take turns anyway); the first of every transaction of a replica.
/// PostgreSQL runs `muster_hold_lease` (its migration 11) with the
/// transaction's BEGIN: [`begin_holding_lease`].
const SQLITE_LEASE_CHECK: &str = concat!("SELECT 1 FROM replicas WHERE id = ?1 AND expires_at > ", sqlite_now!());

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
const READ_ONLY_TRANSACTION: &str = "25006";

/// What a commit of a replica whose lease lapsed fails with.
fn lease_lapsed(replica: &str) -> Error {
    Error::Superseded(format!(
        "replica {replica} no longer holds its lease on its executions: another replica takes them over"
    ))
}

/// Milliseconds of a lease, for the database.
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Applies queued commits, grouping what waits into one transaction. A
/// group that fails is applied again commit by commit, so one bad commit
/// fails alone.
async fn write_loop(database: Database, replica: Arc<OnceLock<Arc<str>>>, mut jobs: mpsc::Receiver<Job>) {
    let mut writer = Writer { database, held: None };
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        while group.len() < MOST_COMMITS_PER_TRANSACTION {
            match jobs.try_recv() {
                Ok(job) => group.push(job),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let replica = replica.get().map(|id| &**id);
        let outcome = apply(&mut writer, replica, group.iter().flat_map(|job| &job.writes)).await;
        muster_runtime::metrics::observe(
            "muster_execution_commit_seconds",
            "Transactions of the execution store's writer, each holding every commit that waited for it",
            &[],
            started.elapsed().as_secs_f64(),
        );
        muster_runtime::metrics::count(
            "muster_execution_commits_total",
            "Commits of executions' changes (several share a transaction when they wait together)",
            &[],
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
                    let outcome = apply(&mut writer, replica, job.writes.iter()).await;
                    let _ = job.done.send(outcome);
                }
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
    let Writer { database, held } = writer;
    let database = &*database;
    let mut created = Vec::new();
    let mut updated = Vec::new();
    let mut steps: Vec<&StepWrite> = Vec::new();
    let mut assignments = Vec::new();
    let mut subtasks = Vec::new();
    let mut events: Vec<&Event> = Vec::new();
    let mut claims = Vec::new();
    let mut posted: Vec<&InboxMessage> = Vec::new();
    let mut fired = Vec::new();
    let mut remembered: Vec<&MemoryEntry> = Vec::new();
    for write in writes {
        match write {
            Write::CreateExecution(execution) => created.push(execution),
            Write::UpdateExecution(execution) => updated.push(execution),
            Write::Steps(rows) => steps.extend(rows),
            Write::Assignment { execution_id, assignment } => assignments.push((execution_id, assignment)),
            Write::Subtask { execution_id, subtask } => subtasks.push((execution_id, subtask)),
            Write::Events(list) => events.extend(list),
            Write::ClaimMessages { execution_id, message_ids } => claims.push((execution_id, message_ids)),
            Write::PostMessages(list) => posted.extend(list),
            Write::Remember(list) => remembered.extend(list),
            Write::FireSchedule { process_name, due, next, execution_id, fired_at } => {
                fired.push((process_name, *due, *next, execution_id, *fired_at));
            }
        }
    }
    // A step written twice in one transaction keeps its last state (one
    // multi-row upsert may touch a row only once).
    let mut last_write: HashMap<(&str, u32), usize> = HashMap::with_capacity(steps.len());
    for (index, step) in steps.iter().enumerate() {
        last_write.insert((step.execution_id.as_str(), step.position), index);
    }
    let steps: Vec<&StepWrite> = steps
        .iter()
        .enumerate()
        .filter(|(index, step)| last_write[&(step.execution_id.as_str(), step.position)] == *index)
        .map(|(_, step)| *step)
        .collect();

    let backend = database.backend;
    let only_progress = created.is_empty()
        && posted.is_empty()
        && remembered.is_empty()
        && fired.is_empty()
        && claims.is_empty()
        && assignments.is_empty()
        && subtasks.is_empty()
        && updated.iter().all(|execution| !execution.status.is_final());
    if let Some(native) = database.native().filter(|_| only_progress) {
        return apply_natively(native, database, replica, &updated, &steps, &events).await;
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
        .execute(&mut *transaction)
        .await?;
        if moved.rows_affected() == 0 {
            return Err(Error::Superseded(format!("the schedule of process '{process_name}' was no longer due")));
        }
    }
    for (execution_id, message_ids) in claims {
        for id in message_ids {
            let moved = sqlx::query(
                "UPDATE inbox_messages SET claimed_by = $1, note = '' \
                 WHERE id = $2 AND state = 'unprocessed' AND claimed_by = ''",
            )
            .bind(execution_id.clone())
            .bind(id.clone())
            .execute(&mut *transaction)
            .await?;
            // Another run (of another replica) took it first: this run
            // must not start with it.
            if moved.rows_affected() == 0 {
                return Err(Error::Superseded(format!("inbox message '{id}' was no longer waiting for a run")));
            }
        }
    }
    if backend == Backend::Postgres {
        for chunk in steps.chunks(JSON_ROWS_PER_STATEMENT) {
            let rows: Vec<StepRow<'_>> = chunk.iter().map(|write| StepRow::of(write)).collect();
            sqlx::query(AssertSqlSafe(steps_from_json_sql("$1")))
                .bind(json_rows(&rows)?)
                .execute(&mut *transaction)
                .await?;
        }
    } else {
        for chunk in steps.chunks(STEP_ROWS_PER_STATEMENT) {
            let sql = step_upsert_sql(chunk.len());
            let query = chunk.iter().fold(sqlx::query(sql), |query, write| bind_step(query, write));
            query.execute(&mut *transaction).await?;
        }
    }
    for (execution_id, assignment) in assignments {
        upsert_assignment(&mut transaction, execution_id, assignment).await?;
    }
    for (execution_id, subtask) in subtasks {
        upsert_subtask(&mut transaction, execution_id, subtask).await?;
    }
    if backend == Backend::Postgres {
        for chunk in events.chunks(JSON_ROWS_PER_STATEMENT) {
            sqlx::query(AssertSqlSafe(events_from_json_sql("$1")))
                .bind(json_rows(&EventRow::all(chunk))?)
                .execute(&mut *transaction)
                .await?;
        }
    } else {
        for chunk in events.chunks(EVENT_ROWS_PER_STATEMENT) {
            let sql = event_insert_sql(chunk.len());
            let query = chunk.iter().fold(sqlx::query(sql), |query, event| bind_event(query, event));
            query.execute(&mut *transaction).await?;
        }
    }
    transaction.commit().await?;
    Ok(())
}

type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// A running execution's progress on SQLite (its row, its steps and their
/// events, nothing that needs an answer between statements) as one
/// transaction run whole on the calling thread ([`NativeSqlite`]): a
/// thread hand-off per statement was where most of a small commit's time
/// went.
async fn apply_natively(
    native: &NativeSqlite,
    database: &Database,
    replica: Option<&str>,
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
            }
            for chunk in steps.chunks(STEP_ROWS_PER_STATEMENT) {
                let mut statement = transaction.prepare_cached(step_upsert_sql(chunk.len()))?;
                for (row, write) in chunk.iter().enumerate() {
                    let first = row * STEP_COLUMN_COUNT;
                    let step = StepRow::of(write);
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
                }
                statement.raw_execute()?;
            }
            for chunk in events.chunks(EVENT_ROWS_PER_STATEMENT) {
                let mut statement = transaction.prepare_cached(event_insert_sql(chunk.len()))?;
                for (row, event) in chunk.iter().enumerate() {
                    let first = row * 3;
                    statement.raw_bind_parameter(first + 1, &event.execution_id)?;
                    statement.raw_bind_parameter(first + 2, event.sequence as i64)?;
                    statement.raw_bind_parameter(first + 3, wire::event_to_wire(event).encode_to_vec())?;
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

/// The update of an execution's row, its six values (status, reason, lead,
/// end, last sequence, then the id) as parameters.
fn update_execution_sql(backend: Backend) -> String {
    let value = |number| placeholder(backend, number);
    format!(
        "UPDATE executions SET status = {}, reason = {}, lead_agent_id = {}, ended_at = {}, last_sequence = {} \
         WHERE id = {}",
        value(1),
        value(2),
        value(3),
        value(4),
        value(5),
        value(6)
    )
}

fn bind_execution_update<'q>(query: AnyQuery<'q>, execution: &Execution) -> AnyQuery<'q> {
    query
        .bind(execution.status.as_str())
        .bind(execution.reason.clone())
        .bind(execution.lead_agent_id.clone())
        .bind(execution.ended_at)
        .bind(execution.last_sequence as i64)
        .bind(execution.id.clone())
}

fn bind_step<'q>(query: AnyQuery<'q>, write: &StepWrite) -> AnyQuery<'q> {
    let row = StepRow::of(write);
    query
        .bind(row.execution_id.to_owned())
        .bind(row.step_id.to_owned())
        .bind(row.position)
        .bind(row.status)
        .bind(row.executor.to_owned())
        .bind(row.attempt)
        .bind(row.output_json.to_owned())
        .bind(row.error_code.to_owned())
        .bind(row.error_message.to_owned())
        .bind(row.started_at)
        .bind(row.ended_at)
        .bind(row.cost)
        .bind(row.tokens_used)
        .bind(row.assigned_to.map(str::to_owned))
        .bind(row.delegation_chain)
        .bind(row.wait_seconds)
        .bind(row.retry_at)
        .bind(row.roster_reserved)
        .bind(row.slot_task.to_owned())
}

fn bind_event<'q>(query: AnyQuery<'q>, event: &Event) -> AnyQuery<'q> {
    query.bind(event.execution_id.clone()).bind(event.sequence as i64).bind(wire::event_to_wire(event).encode_to_vec())
}

async fn insert_execution(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    execution: &Execution,
    owner: Option<&str>,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO executions (id, process_name, process_version, status, reason, lead_agent_id, inputs_json, \
         idempotency_key, started_at, ended_at, last_sequence, trace_parent, is_session, session_title, \
         session_description, owner) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)",
    )
    .bind(execution.id.clone())
    .bind(execution.process_name.clone())
    .bind(i64::from(execution.process_version))
    .bind(execution.status.as_str())
    .bind(execution.reason.clone())
    .bind(execution.lead_agent_id.clone())
    .bind(execution.inputs_json.clone())
    .bind(execution.idempotency_key.clone())
    .bind(execution.started_at)
    .bind(execution.ended_at)
    .bind(execution.last_sequence as i64)
    .bind(execution.trace_parent.clone())
    .bind(i64::from(execution.session.is_some()))
    .bind(execution.session.as_ref().map(|session| session.title.clone()).unwrap_or_default())
    .bind(execution.session.as_ref().map(|session| session.description.clone()).unwrap_or_default())
    .bind(owner.map(str::to_owned))
    .execute(&mut **transaction)
    .await?;
    if let Some(session) = &execution.session {
        for assignment in session.assignments.values() {
            upsert_assignment(transaction, &execution.id, assignment).await?;
        }
    }
    Ok(())
}

async fn upsert_assignment(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    execution_id: &str,
    assignment: &RoleAssignment,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO session_assignments (execution_id, agent_id, role, subtask, assigned_by, assigned_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (execution_id, agent_id) DO UPDATE SET role = excluded.role, \
         subtask = excluded.subtask, assigned_by = excluded.assigned_by, assigned_at = excluded.assigned_at",
    )
    .bind(execution_id.to_owned())
    .bind(assignment.agent_id.clone())
    .bind(assignment.role.clone())
    .bind(assignment.subtask.clone())
    .bind(assignment.assigned_by.clone())
    .bind(assignment.assigned_at)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

async fn upsert_subtask(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    execution_id: &str,
    subtask: &SubtaskRequest,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO session_subtasks (execution_id, id, requested_by, agent_id, role, subtask, reason, status, \
         decided_by, note, requested_at, decided_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
         ON CONFLICT (execution_id, id) DO UPDATE SET status = excluded.status, decided_by = excluded.decided_by, \
         note = excluded.note, decided_at = excluded.decided_at",
    )
    .bind(execution_id.to_owned())
    .bind(subtask.id.clone())
    .bind(subtask.requested_by.clone())
    .bind(subtask.agent_id.clone())
    .bind(subtask.role.clone())
    .bind(subtask.subtask.clone())
    .bind(subtask.reason.clone())
    .bind(subtask.status.as_str())
    .bind(subtask.decided_by.clone())
    .bind(subtask.note.clone())
    .bind(subtask.requested_at)
    .bind(subtask.decided_at)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// A version's warnings are stored as one encoded message of wire
/// diagnostics, with their count (absent, before warnings were counted:
/// all of them are stored).
#[derive(Clone, PartialEq, prost::Message)]
struct StoredDiagnostics {
    #[prost(message, repeated, tag = "1")]
    diagnostics: Vec<common::Diagnostic>,
    #[prost(uint32, tag = "2")]
    count: u32,
}

fn encode_warnings(warnings: &Warnings) -> Vec<u8> {
    StoredDiagnostics { diagnostics: warnings.kept.iter().map(wire::finding_to_wire).collect(), count: warnings.count }
        .encode_to_vec()
}

fn decode_warnings(bytes: &[u8]) -> Result<Warnings> {
    let stored = StoredDiagnostics::decode(bytes)
        .map_err(|error| Error::Storage(format!("corrupt stored diagnostics: {error}")))?;
    let kept: Vec<Finding> = stored.diagnostics.into_iter().map(wire::finding_from_wire).collect();
    // Versions stored before the count kept every warning.
    Ok(if stored.count == 0 { Warnings::keep(kept) } else { Warnings { kept, count: stored.count } })
}

/// The messages an ended execution had: processed when it completed, given
/// back for the next run, with a note, otherwise.
async fn settle_messages(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, execution: &Execution) -> Result<()> {
    if execution.status == crate::domain::ExecutionStatus::Completed {
        sqlx::query(
            "UPDATE inbox_messages SET state = 'processed', processed_by = $1, claimed_by = '', note = '' \
             WHERE claimed_by = $2",
        )
        .bind(execution.id.clone())
        .bind(execution.id.clone())
        .execute(&mut **transaction)
        .await?;
    } else {
        let note = muster_runtime::status::truncate(
            &format!("run {} {}: {}", execution.id, execution.status.as_str(), execution.reason),
            1024,
        )
        .into_owned();
        sqlx::query("UPDATE inbox_messages SET claimed_by = '', note = $1 WHERE claimed_by = $2")
            .bind(note)
            .bind(execution.id.clone())
            .execute(&mut **transaction)
            .await?;
    }
    Ok(())
}

async fn insert_memory(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, entry: &MemoryEntry) -> Result<()> {
    sqlx::query(
        "INSERT INTO memory (id, role, text, author, execution_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(entry.id.clone())
    .bind(entry.role.clone())
    .bind(entry.text.clone())
    .bind(entry.author.clone())
    .bind(entry.execution_id.clone())
    .bind(entry.created_at)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

/// A usage query's row: `runs`, `cost` and `tokens`.
fn usage_from_row(row: &AnyRow) -> Result<Usage> {
    Ok(Usage {
        cost: row.try_get("cost")?,
        tokens: row.try_get::<i64, _>("tokens")? as u64,
        runs: row.try_get::<i64, _>("runs")? as u64,
    })
}

fn budget_from_row(row: &AnyRow) -> Result<Budget> {
    Ok(Budget {
        process_name: row.try_get("process_name")?,
        period_seconds: row.try_get::<i64, _>("period_seconds")? as u64,
        max_cost: row.try_get("max_cost")?,
        max_tokens: row.try_get::<i64, _>("max_tokens")? as u64,
        max_runs: row.try_get::<i64, _>("max_runs")? as u32,
        run_max_cost: row.try_get("run_max_cost")?,
        run_max_tokens: row.try_get::<i64, _>("run_max_tokens")? as u64,
        on_exceed: {
            let action: String = row.try_get("on_exceed")?;
            budget::Action::parse(&action)
                .ok_or_else(|| Error::Storage(format!("unknown budget action '{action}' in the database")))?
        },
        source: budget::Source::Operator,
    })
}

fn memory_from_row(row: &AnyRow) -> Result<MemoryEntry> {
    Ok(MemoryEntry {
        id: row.try_get("id")?,
        role: row.try_get("role")?,
        text: row.try_get("text")?,
        author: row.try_get("author")?,
        execution_id: row.try_get("execution_id")?,
        created_at: row.try_get("created_at")?,
    })
}

async fn insert_message(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, message: &InboxMessage) -> Result<()> {
    sqlx::query(
        "INSERT INTO inbox_messages (id, inbox, sender, priority, subject, body, posted_at, state) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(message.id.clone())
    .bind(message.inbox.clone())
    .bind(message.sender.clone())
    .bind(message.priority.as_str())
    .bind(message.subject.clone())
    .bind(message.body.clone())
    .bind(message.posted_at)
    .bind(message.state.as_str())
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

fn schedule_from_row(row: &AnyRow) -> Result<ScheduleState> {
    let missed: String = row.try_get("missed")?;
    Ok(ScheduleState {
        process_name: row.try_get("process_name")?,
        cron: row.try_get("cron")?,
        time_zone: row.try_get("time_zone")?,
        missed: muster_format::MissedRuns::parse(&missed)
            .ok_or_else(|| Error::Storage(format!("unknown missed runs policy '{missed}' in the database")))?,
        next_fire_at: row.try_get("next_fire_at")?,
        last_fired_at: row.try_get("last_fired_at")?,
        last_execution_id: row.try_get("last_execution_id")?,
    })
}

fn message_from_row(row: &AnyRow) -> Result<InboxMessage> {
    let priority: String = row.try_get("priority")?;
    let state: String = row.try_get("state")?;
    Ok(InboxMessage {
        id: row.try_get("id")?,
        inbox: row.try_get("inbox")?,
        sender: row.try_get("sender")?,
        priority: priority.parse()?,
        subject: row.try_get("subject")?,
        body: row.try_get("body")?,
        posted_at: row.try_get("posted_at")?,
        state: state.parse()?,
        claimed_by: row.try_get("claimed_by")?,
        processed_by: row.try_get("processed_by")?,
        note: row.try_get("note")?,
    })
}

/// The latest versions of processes other than `name` that `inbox` triggers.
const TRIGGERED_BY: &str = "SELECT p.name FROM processes p WHERE p.trigger_inbox = $1 AND p.name <> $2 \
     AND p.version = (SELECT MAX(q.version) FROM processes q WHERE q.name = p.name) ORDER BY p.name LIMIT 1";

fn process_from_row(row: &AnyRow) -> Result<ProcessVersion> {
    let name: String = row.try_get("name")?;
    let version = row.try_get::<i64, _>("version")? as u32;
    let source: String = row.try_get("source")?;
    let warnings: Vec<u8> = row.try_get("warnings")?;
    let stored: Option<String> = row.try_get("definition")?;
    let definition = match stored {
        Some(json) => serde_json::from_str(&json).map_err(|error| {
            Error::Storage(format!("process {name} version {version}: corrupt definition: {error}"))
        })?,
        // Published before definitions were stored: checked once more, here.
        None => muster_format::validate_process(&source, &muster_format::Context::default())
            .process
            .ok_or_else(|| Error::Storage(format!("process {name} version {version} no longer parses")))?,
    };
    Ok(ProcessVersion {
        content_hash: row.try_get("content_hash")?,
        published_at: row.try_get("published_at")?,
        step_count: row.try_get::<i64, _>("step_count")? as u32,
        warnings: decode_warnings(&warnings)?,
        definition: Arc::new(definition),
        name,
        version,
        source,
    })
}

fn execution_from_row(row: &AnyRow) -> Result<Execution> {
    let status: String = row.try_get("status")?;
    Ok(Execution {
        id: row.try_get("id")?,
        process_name: row.try_get("process_name")?,
        process_version: row.try_get::<i64, _>("process_version")? as u32,
        status: status.parse()?,
        reason: row.try_get("reason")?,
        lead_agent_id: row.try_get("lead_agent_id")?,
        inputs_json: row.try_get("inputs_json")?,
        idempotency_key: row.try_get("idempotency_key")?,
        started_at: row.try_get("started_at")?,
        ended_at: row.try_get("ended_at")?,
        last_sequence: row.try_get::<i64, _>("last_sequence")? as u64,
        trace_parent: row.try_get("trace_parent")?,
        session: (row.try_get::<i64, _>("is_session")? != 0)
            .then(|| {
                Ok::<_, Error>(Session {
                    title: row.try_get("session_title")?,
                    description: row.try_get("session_description")?,
                    assignments: Default::default(),
                    subtasks: Default::default(),
                })
            })
            .transpose()?,
    })
}

fn step_from_row(row: &AnyRow) -> Result<(String, Step)> {
    let status: String = row.try_get("status")?;
    let output: String = row.try_get("output_json")?;
    let chain: String = row.try_get("delegation_chain")?;
    let step = Step {
        status: status.parse()?,
        executor: row.try_get("executor")?,
        attempt: row.try_get::<i64, _>("attempt")? as u32,
        output_json: (!output.is_empty()).then(|| Arc::from(output)),
        error_code: row.try_get("error_code")?,
        error_message: row.try_get("error_message")?,
        started_at: row.try_get("started_at")?,
        ended_at: row.try_get("ended_at")?,
        cost: row.try_get("cost")?,
        tokens_used: row.try_get::<i64, _>("tokens_used")? as u64,
        assigned_to: row.try_get("assigned_to")?,
        delegation_chain: serde_json::from_str(&chain)
            .map_err(|error| Error::Storage(format!("corrupt delegation chain: {error}")))?,
        wait_seconds: row.try_get::<i64, _>("wait_seconds")? as u64,
        retry_at: row.try_get("retry_at")?,
        roster_reserved: row.try_get::<i64, _>("roster_reserved")? != 0,
        slot_task: row.try_get("slot_task")?,
    };
    Ok((row.try_get("step_id")?, step))
}

/// The newest version of the permission matrix.
const LATEST_MATRIX: &str = "SELECT * FROM permission_matrices ORDER BY version DESC LIMIT 1";

/// A stored matrix version whose document no longer parses is corrupt data.
fn matrix_from_row(row: &AnyRow) -> Result<Matrix> {
    let version: i64 = row.try_get("version")?;
    Matrix::parse(version as u32, row.try_get("source")?, row.try_get("created_at")?, row.try_get("created_by")?)
        .map(|(matrix, _)| matrix)
        .map_err(|_| Error::Storage(format!("permission matrix version {version} no longer parses")))
}

impl SqlStore {
    async fn subtasks(&self, execution_id: &str) -> Result<std::collections::BTreeMap<String, SubtaskRequest>> {
        let rows = sqlx::query("SELECT * FROM session_subtasks WHERE execution_id = $1 ORDER BY id")
            .bind(execution_id.to_owned())
            .fetch_all(&self.database.reads)
            .await?;
        rows.iter()
            .map(|row| {
                let status: String = row.try_get("status")?;
                let subtask = SubtaskRequest {
                    id: row.try_get("id")?,
                    requested_by: row.try_get("requested_by")?,
                    agent_id: row.try_get("agent_id")?,
                    role: row.try_get("role")?,
                    subtask: row.try_get("subtask")?,
                    reason: row.try_get("reason")?,
                    status: SubtaskStatus::parse(&status)
                        .ok_or_else(|| Error::Storage(format!("unknown subtask status '{status}'")))?,
                    decided_by: row.try_get("decided_by")?,
                    note: row.try_get("note")?,
                    requested_at: row.try_get("requested_at")?,
                    decided_at: row.try_get("decided_at")?,
                };
                Ok((subtask.id.clone(), subtask))
            })
            .collect()
    }

    async fn assignments(&self, execution_id: &str) -> Result<std::collections::BTreeMap<String, RoleAssignment>> {
        let rows = sqlx::query("SELECT * FROM session_assignments WHERE execution_id = $1 ORDER BY agent_id")
            .bind(execution_id.to_owned())
            .fetch_all(&self.database.reads)
            .await?;
        rows.iter()
            .map(|row| {
                let assignment = RoleAssignment {
                    agent_id: row.try_get("agent_id")?,
                    role: row.try_get("role")?,
                    subtask: row.try_get("subtask")?,
                    assigned_by: row.try_get("assigned_by")?,
                    assigned_at: row.try_get("assigned_at")?,
                };
                Ok((assignment.agent_id.clone(), assignment))
            })
            .collect()
    }
}

fn replica_from_row(row: &AnyRow) -> Result<Replica> {
    Ok(Replica { id: row.try_get("id")?, url: row.try_get("url")?, address: row.try_get("address")? })
}

impl Store for SqlStore {
    fn migrate(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.database.migrate(&MIGRATIONS).await.map_err(|error| Error::Storage(error.to_string()))?;
            participants::list_earlier_versions(&self.database).await
        })
    }

    fn publish_process(&self, process: NewProcess) -> BoxFuture<'_, Result<Published>> {
        Box::pin(async move {
            let mut transaction = self.database.pool.begin().await?;
            let latest = sqlx::query("SELECT * FROM processes WHERE name = $1 ORDER BY version DESC LIMIT 1")
                .bind(process.name.clone())
                .fetch_optional(&mut *transaction)
                .await?;
            let latest = latest.as_ref().map(process_from_row).transpose()?;
            if let Some(latest) = latest.filter(|latest| latest.content_hash == process.content_hash) {
                return Ok(Published::Unchanged(latest));
            }
            let version: i64 =
                sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) + 1 FROM processes WHERE name = $1")
                    .bind(process.name.clone())
                    .fetch_one(&mut *transaction)
                    .await?;
            let inbox = process.definition.triggers.as_ref().and_then(|triggers| triggers.inbox.clone());
            if let Some(inbox) = &inbox
                && let Some(other) = sqlx::query_scalar::<_, String>(TRIGGERED_BY)
                    .bind(inbox.clone())
                    .bind(process.name.clone())
                    .fetch_optional(&mut *transaction)
                    .await?
            {
                return Err(Error::precondition(
                    "INBOX_TAKEN",
                    format!("inbox/{inbox}"),
                    format!("inbox '{inbox}' already triggers process '{other}': an inbox triggers one process"),
                ));
            }
            let definition = serde_json::to_string(&*process.definition)
                .map_err(|error| Error::Storage(format!("encoding the definition: {error}")))?;
            sqlx::query(
                "INSERT INTO processes (name, version, source, published_at, step_count, warnings, definition, \
                 content_hash, trigger_inbox, agents_listed) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 1)",
            )
            .bind(process.name.clone())
            .bind(version)
            .bind(process.source.clone())
            .bind(process.published_at)
            .bind(process.definition.steps.len() as i64)
            .bind(encode_warnings(&process.warnings))
            .bind(definition)
            .bind(process.content_hash.clone())
            .bind(inbox.unwrap_or_default())
            .execute(&mut *transaction)
            .await?;
            participants::keep_named_agents(&mut transaction, &process.name, version, &process.definition).await?;
            // The schedule follows the latest version; an unchanged cron and
            // time zone keep their due time.
            match process.schedule() {
                Some(schedule) => {
                    sqlx::query(
                        "INSERT INTO schedules (process_name, cron, time_zone, missed, next_fire_at, last_fired_at, \
                         last_execution_id) VALUES ($1, $2, $3, $4, $5, NULL, '') \
                         ON CONFLICT (process_name) DO UPDATE SET missed = excluded.missed, \
                         next_fire_at = CASE WHEN schedules.cron = excluded.cron \
                         AND schedules.time_zone = excluded.time_zone THEN schedules.next_fire_at \
                         ELSE excluded.next_fire_at END, cron = excluded.cron, time_zone = excluded.time_zone",
                    )
                    .bind(schedule.process_name)
                    .bind(schedule.cron)
                    .bind(schedule.time_zone)
                    .bind(schedule.missed.as_str())
                    .bind(schedule.next_fire_at)
                    .execute(&mut *transaction)
                    .await?;
                }
                None => {
                    sqlx::query("DELETE FROM schedules WHERE process_name = $1")
                        .bind(process.name.clone())
                        .execute(&mut *transaction)
                        .await?;
                }
            }
            transaction.commit().await?;
            Ok(Published::New(ProcessVersion {
                step_count: process.definition.steps.len() as u32,
                name: process.name,
                version: version as u32,
                source: process.source,
                content_hash: process.content_hash,
                published_at: process.published_at,
                warnings: process.warnings,
                definition: process.definition,
            }))
        })
    }

    fn process<'a>(&'a self, name: &'a str, version: Option<u32>) -> BoxFuture<'a, Result<Option<ProcessVersion>>> {
        Box::pin(async move {
            let row = match version {
                Some(version) => {
                    sqlx::query("SELECT * FROM processes WHERE name = $1 AND version = $2")
                        .bind(name.to_owned())
                        .bind(i64::from(version))
                        .fetch_optional(&self.database.reads)
                        .await?
                }
                None => {
                    sqlx::query("SELECT * FROM processes WHERE name = $1 ORDER BY version DESC LIMIT 1")
                        .bind(name.to_owned())
                        .fetch_optional(&self.database.reads)
                        .await?
                }
            };
            row.as_ref().map(process_from_row).transpose()
        })
    }

    fn list_processes<'a>(&'a self, after_name: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ProcessVersion>>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT p.* FROM processes p JOIN (SELECT name, MAX(version) AS version FROM processes \
                 WHERE name > $1 GROUP BY name) l ON p.name = l.name AND p.version = l.version \
                 ORDER BY p.name LIMIT CAST($2 AS BIGINT)",
            )
            .bind(after_name.to_owned())
            .bind(i64::from(limit))
            .fetch_all(&self.database.reads)
            .await?;
            rows.iter().map(process_from_row).collect()
        })
    }

    fn commit(&self, writes: Vec<Write>) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let (done, outcome) = oneshot::channel();
            self.writer
                .send(Job { writes, done })
                .await
                .map_err(|_| Error::Storage("the store's writer has stopped".to_owned()))?;
            outcome.await.map_err(|_| Error::Storage("the store's writer has stopped".to_owned()))?
        })
    }

    fn execution<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Execution>>> {
        Box::pin(async move {
            let Some(row) = sqlx::query("SELECT * FROM executions WHERE id = $1")
                .bind(id.to_owned())
                .fetch_optional(&self.database.reads)
                .await?
            else {
                return Ok(None);
            };
            let mut execution = execution_from_row(&row)?;
            if let Some(session) = &mut execution.session {
                session.assignments = self.assignments(id).await?;
                session.subtasks = self.subtasks(id).await?;
            }
            Ok(Some(execution))
        })
    }

    fn steps<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Vec<(String, Step)>>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT * FROM steps WHERE execution_id = $1 ORDER BY position")
                .bind(execution_id.to_owned())
                .fetch_all(&self.database.reads)
                .await?;
            rows.iter().map(step_from_row).collect()
        })
    }

    fn step_output<'a>(&'a self, execution_id: &'a str, step_id: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT output_json FROM steps WHERE execution_id = $1 AND step_id = $2")
                .bind(execution_id.to_owned())
                .bind(step_id.to_owned())
                .fetch_optional(&self.database.reads)
                .await?;
            let output: Option<String> = row.map(|row| row.try_get("output_json")).transpose()?;
            Ok(output.filter(|output| !output.is_empty()))
        })
    }

    fn executes_a_step<'a>(&'a self, execution_id: &'a str, agent_id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let found = sqlx::query("SELECT 1 AS found FROM steps WHERE execution_id = $1 AND executor = $2 LIMIT 1")
                .bind(execution_id.to_owned())
                .bind(agent_id.to_owned())
                .fetch_optional(&self.database.reads)
                .await?;
            Ok(found.is_some())
        })
    }

    fn find_by_idempotency_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT id FROM executions WHERE idempotency_key = $1")
                .bind(key.to_owned())
                .fetch_optional(&self.database.reads)
                .await?;
            Ok(row.map(|row| row.try_get("id")).transpose()?)
        })
    }

    fn post_message(&self, message: InboxMessage) -> BoxFuture<'_, Result<Option<InboxMessage>>> {
        Box::pin(async move {
            let stored = || async {
                let row = sqlx::query("SELECT * FROM inbox_messages WHERE id = $1")
                    .bind(message.id.clone())
                    .fetch_optional(&self.database.pool)
                    .await?;
                row.as_ref().map(message_from_row).transpose()
            };
            if let Some(existing) = stored().await? {
                return Ok(Some(existing));
            }
            let mut transaction = self.database.pool.begin().await?;
            if let Err(error) = insert_message(&mut transaction, &message).await {
                // The same post, retried at once, stored it meanwhile.
                drop(transaction);
                return stored().await?.map(Some).ok_or(error);
            }
            transaction.commit().await?;
            Ok(None)
        })
    }

    fn inbox_messages<'a>(&'a self, filter: &'a InboxFilter) -> BoxFuture<'a, Result<Vec<InboxMessage>>> {
        Box::pin(async move {
            let backend = self.database.backend;
            let mut sql = format!("SELECT * FROM inbox_messages WHERE inbox = {}", placeholder(backend, 1));
            let mut parameter = 1;
            let mut next = || {
                parameter += 1;
                placeholder(backend, parameter)
            };
            match filter.state {
                Some(_) => sql.push_str(&format!(" AND state = {}", next())),
                None => sql.push_str(" AND state <> 'archived'"),
            }
            if filter.unclaimed {
                sql.push_str(" AND claimed_by = ''");
            }
            if filter.after.is_some() {
                let (first, second, third) = (next(), next(), next());
                sql.push_str(&format!(" AND (posted_at > {first} OR (posted_at = {second} AND id > {third}))"));
            }
            sql.push_str(&format!(" ORDER BY posted_at, id LIMIT {}", filter.limit));
            let mut query = sqlx::query(AssertSqlSafe(sql)).bind(filter.inbox.clone());
            if let Some(state) = filter.state {
                query = query.bind(state.as_str());
            }
            if let Some((posted_at, id)) = &filter.after {
                query = query.bind(*posted_at).bind(*posted_at).bind(id.clone());
            }
            let rows = query.fetch_all(&self.database.reads).await?;
            rows.iter().map(message_from_row).collect()
        })
    }

    fn archive_message<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Archived>> {
        Box::pin(async move {
            let mut transaction = self.database.pool.begin().await?;
            sqlx::query("UPDATE inbox_messages SET state = 'archived' WHERE id = $1 AND claimed_by = ''")
                .bind(id.to_owned())
                .execute(&mut *transaction)
                .await?;
            let row = sqlx::query("SELECT * FROM inbox_messages WHERE id = $1")
                .bind(id.to_owned())
                .fetch_optional(&mut *transaction)
                .await?;
            transaction.commit().await?;
            Ok(match row.as_ref().map(message_from_row).transpose()? {
                Some(message) if message.state == MessageState::Archived => Archived::Done(message),
                Some(message) => Archived::Claimed(message),
                None => Archived::NotFound,
            })
        })
    }

    fn note_messages<'a>(&'a self, ids: &'a [String], note: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let note = muster_runtime::status::truncate(note, 1024).into_owned();
            let mut transaction = self.database.pool.begin().await?;
            for id in ids {
                sqlx::query(
                    "UPDATE inbox_messages SET note = $1 WHERE id = $2 AND claimed_by = '' AND state = 'unprocessed'",
                )
                .bind(note.clone())
                .bind(id.clone())
                .execute(&mut *transaction)
                .await?;
            }
            transaction.commit().await?;
            Ok(())
        })
    }

    fn inbox_busy<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let found =
                sqlx::query("SELECT 1 AS found FROM inbox_messages WHERE inbox = $1 AND claimed_by <> '' LIMIT 1")
                    .bind(inbox.to_owned())
                    .fetch_optional(&self.database.pool)
                    .await?;
            Ok(found.is_some())
        })
    }

    fn triggered_by<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar::<_, String>(TRIGGERED_BY)
                .bind(inbox.to_owned())
                .bind(String::new())
                .fetch_optional(&self.database.reads)
                .await?)
        })
    }

    fn trigger_inboxes(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar::<_, String>(
                "SELECT DISTINCT p.trigger_inbox FROM processes p WHERE p.trigger_inbox <> '' \
                 AND p.version = (SELECT MAX(q.version) FROM processes q WHERE q.name = p.name) ORDER BY 1",
            )
            .fetch_all(&self.database.reads)
            .await?)
        })
    }

    fn budget<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Option<Budget>>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT * FROM budgets WHERE process_name = $1")
                .bind(process_name.to_owned())
                .fetch_optional(&self.database.reads)
                .await?;
            row.as_ref().map(budget_from_row).transpose()
        })
    }

    fn agent_budgets(&self) -> BoxFuture<'_, Result<Vec<Budget>>> {
        Box::pin(async move {
            let rows = sqlx::query("SELECT * FROM budgets WHERE process_name LIKE 'agent:%' ORDER BY process_name")
                .fetch_all(&self.database.reads)
                .await?;
            rows.iter().map(budget_from_row).collect()
        })
    }

    fn agent_usage<'a>(&'a self, agent_id: &'a str, since: i64) -> BoxFuture<'a, Result<Usage>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT COUNT(*) AS runs, CAST(COALESCE(SUM(cost), 0) AS DOUBLE PRECISION) AS cost, \
                 CAST(COALESCE(SUM(tokens_used), 0) AS BIGINT) AS tokens \
                 FROM steps WHERE executor = $1 AND started_at >= $2",
            )
            .bind(agent_id.to_owned())
            .bind(since)
            .fetch_one(&self.database.reads)
            .await?;
            usage_from_row(&row)
        })
    }

    fn put_budget<'a>(&'a self, budget: &'a Budget, set_by: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            if budget.is_unlimited() {
                sqlx::query("DELETE FROM budgets WHERE process_name = $1")
                    .bind(budget.process_name.clone())
                    .execute(&self.database.pool)
                    .await?;
                return Ok(());
            }
            sqlx::query(
                "INSERT INTO budgets (process_name, period_seconds, max_cost, max_tokens, max_runs, run_max_cost, \
                 run_max_tokens, on_exceed, set_at, set_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
                 ON CONFLICT (process_name) DO UPDATE SET period_seconds = excluded.period_seconds, \
                 max_cost = excluded.max_cost, max_tokens = excluded.max_tokens, max_runs = excluded.max_runs, \
                 run_max_cost = excluded.run_max_cost, run_max_tokens = excluded.run_max_tokens, \
                 on_exceed = excluded.on_exceed, set_at = excluded.set_at, set_by = excluded.set_by",
            )
            .bind(budget.process_name.clone())
            .bind(i64::try_from(budget.period_seconds).unwrap_or(i64::MAX))
            .bind(budget.max_cost)
            .bind(i64::try_from(budget.max_tokens).unwrap_or(i64::MAX))
            .bind(i64::from(budget.max_runs))
            .bind(budget.run_max_cost)
            .bind(i64::try_from(budget.run_max_tokens).unwrap_or(i64::MAX))
            .bind(budget.on_exceed.as_str())
            .bind(muster_runtime::time::now_millis())
            .bind(set_by.to_owned())
            .execute(&self.database.pool)
            .await?;
            Ok(())
        })
    }

    fn list_executions<'a>(&'a self, filter: &'a ExecutionFilter) -> BoxFuture<'a, Result<Vec<Execution>>> {
        Box::pin(async move {
            let backend = self.database.backend;
            let mut sql = String::from("SELECT * FROM executions WHERE 1 = 1");
            let mut parameter = 0;
            let mut next = || {
                parameter += 1;
                placeholder(backend, parameter)
            };
            if filter.process_name.is_some() {
                sql.push_str(&format!(" AND process_name = {}", next()));
            }
            if filter.status.is_some() {
                sql.push_str(&format!(" AND status = {}", next()));
            }
            if filter.started_after.is_some() {
                sql.push_str(&format!(" AND started_at >= {}", next()));
            }
            if filter.started_before.is_some() {
                sql.push_str(&format!(" AND started_at < {}", next()));
            }
            if filter.after.is_some() {
                let (first, second, third) = (next(), next(), next());
                sql.push_str(&format!(" AND (started_at < {first} OR (started_at = {second} AND id > {third}))"));
            }
            if filter.agent_id.is_some() {
                sql.push_str(&participants::takes_part(&mut next));
            }
            sql.push_str(&format!(" ORDER BY started_at DESC, id LIMIT {}", filter.limit));
            let mut query = sqlx::query(AssertSqlSafe(sql));
            if let Some(name) = &filter.process_name {
                query = query.bind(name.clone());
            }
            if let Some(status) = filter.status {
                query = query.bind(status.as_str());
            }
            if let Some(after) = filter.started_after {
                query = query.bind(after);
            }
            if let Some(before) = filter.started_before {
                query = query.bind(before);
            }
            if let Some((started_at, id)) = &filter.after {
                query = query.bind(*started_at).bind(*started_at).bind(id.clone());
            }
            if let Some(agent_id) = &filter.agent_id {
                for _ in 0..participants::TAKES_PART_BINDS {
                    query = query.bind(agent_id.clone());
                }
            }
            let rows = query.fetch_all(&self.database.reads).await?;
            rows.iter().map(execution_from_row).collect()
        })
    }

    fn join<'a>(&'a self, replica: &'a Replica, lease: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let joined_already = || Error::Storage("the store joined the replicas already".to_owned());
            if self.replica.get().is_some() {
                return Err(joined_already());
            }
            let backend = self.database.backend;
            let now = database_now(backend);
            let mut transaction = self.database.pool.begin().await?;
            if let Some((identity, _)) = replica.id.split_once(super::INCARNATION) {
                if backend == Backend::Postgres {
                    // The log's turn, as a takeover takes it: a transaction of
                    // the previous incarnation under way ends first, and none
                    // after this one finds its lease.
                    sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                        .bind(LOG_LOCK.0)
                        .bind(LOG_LOCK.1)
                        .execute(&mut *transaction)
                        .await?;
                }
                let prefix = format!("{identity}{}", super::INCARNATION);
                let length = i64::try_from(prefix.len()).unwrap_or(i64::MAX);
                let previous = "SELECT id FROM replicas WHERE substr(id, 1, CAST($2 AS INTEGER)) = $1";
                sqlx::query(AssertSqlSafe(format!(
                    "UPDATE executions SET owner = NULL WHERE status IN ('running', 'paused') AND owner IN ({previous})"
                )))
                .bind(prefix.clone())
                .bind(length)
                .execute(&mut *transaction)
                .await?;
                let replaced = sqlx::query("DELETE FROM replicas WHERE substr(id, 1, CAST($2 AS INTEGER)) = $1")
                    .bind(prefix)
                    .bind(length)
                    .execute(&mut *transaction)
                    .await?;
                if replaced.rows_affected() > 0 {
                    tracing::info!(replica = %replica.id, %identity, "replaced the previous incarnation of this replica: its executions are taken back at once");
                }
            }
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO replicas (id, url, address, joined_at, expires_at) VALUES ($1, $2, $3, {now}, {now} + $4)"
            )))
            .bind(replica.id.clone())
            .bind(replica.url.clone())
            .bind(replica.address.clone())
            .bind(lease_millis(lease))
            .execute(&mut *transaction)
            .await?;
            transaction.commit().await?;
            self.replica.set(replica.id.as_str().into()).map_err(|_| joined_already())
        })
    }

    fn renew(&self, lease: Duration) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let now = database_now(self.database.backend);
            let renewed = sqlx::query(AssertSqlSafe(format!(
                "UPDATE replicas SET expires_at = {now} + $1 WHERE id = $2 AND expires_at > {now}"
            )))
            .bind(lease_millis(lease))
            .bind(self.replica()?.to_owned())
            .execute(&self.database.pool)
            .await?;
            Ok(renewed.rows_affected() == 1)
        })
    }

    fn adopt(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(async move {
            let replica = self.replica()?;
            let backend = self.database.backend;
            let now = database_now(backend);
            let mut transaction = self.database.pool.begin().await?;
            if backend == Backend::Postgres {
                // The log's turn: a replica's transaction under way ends
                // first (it checked its lease as it began), and the next one
                // sees what this one changes. One replica adopts at a time,
                // and its statements see the replicas that joined and the
                // executions adopted before.
                sqlx::query("SELECT pg_advisory_xact_lock($1, $2)")
                    .bind(LOG_LOCK.0)
                    .bind(LOG_LOCK.1)
                    .execute(&mut *transaction)
                    .await?;
            }
            // A replica whose lease lapsed leaves.
            sqlx::query(AssertSqlSafe(format!("DELETE FROM replicas WHERE expires_at <= {now}")))
                .execute(&mut *transaction)
                .await?;
            let adopted = sqlx::query(AssertSqlSafe(format!(
                "UPDATE executions SET owner = $1 WHERE status IN ('running', 'paused')                  AND (owner IS NULL OR owner NOT IN (SELECT id FROM replicas))                  AND EXISTS (SELECT 1 FROM replicas WHERE id = $1 AND expires_at > {now})                  RETURNING id, started_at"
            )))
            .bind(replica.to_owned())
            .fetch_all(&mut *transaction)
            .await?;
            transaction.commit().await?;
            let mut adopted = adopted
                .iter()
                .map(|row| Ok((row.try_get::<i64, _>("started_at")?, row.try_get::<String, _>("id")?)))
                .collect::<Result<Vec<_>>>()?;
            adopted.sort_unstable();
            Ok(adopted.into_iter().map(|(_, id)| id).collect())
        })
    }

    fn leave(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let replica = self.replica()?.to_owned();
            let mut transaction = self.database.pool.begin().await?;
            sqlx::query("UPDATE executions SET owner = NULL WHERE owner = $1 AND status IN ('running', 'paused')")
                .bind(replica.clone())
                .execute(&mut *transaction)
                .await?;
            sqlx::query("DELETE FROM replicas WHERE id = $1").bind(replica).execute(&mut *transaction).await?;
            transaction.commit().await?;
            Ok(())
        })
    }

    fn driver_of<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Option<Replica>>> {
        Box::pin(async move {
            let now = database_now(self.database.backend);
            let row = sqlx::query(AssertSqlSafe(format!(
                "SELECT r.id, r.url, r.address FROM executions e JOIN replicas r ON r.id = e.owner \
                 WHERE e.id = $1 AND e.status IN ('running', 'paused') AND r.expires_at > {now}"
            )))
            .bind(execution_id.to_owned())
            .fetch_optional(&self.database.reads)
            .await?;
            row.as_ref().map(replica_from_row).transpose()
        })
    }

    fn peers(&self) -> BoxFuture<'_, Result<Vec<Replica>>> {
        Box::pin(async move {
            let replica = self.replica()?;
            let now = database_now(self.database.backend);
            let rows = sqlx::query(AssertSqlSafe(format!(
                "SELECT id, url, address FROM replicas WHERE expires_at > {now} AND id <> $1 AND url <> '' ORDER BY id"
            )))
            .bind(replica.to_owned())
            .fetch_all(&self.database.reads)
            .await?;
            rows.iter().map(replica_from_row).collect()
        })
    }

    fn leads(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(async move {
            let replica = self.replica()?;
            let now = database_now(self.database.backend);
            let eldest: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT id FROM replicas WHERE expires_at > {now} ORDER BY joined_at, id LIMIT 1"
            )))
            .fetch_optional(&self.database.reads)
            .await?;
            Ok(eldest.as_deref() == Some(replica))
        })
    }

    fn last_event_sequence<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(async move {
            let last: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(sequence), 0) FROM events WHERE execution_id = $1")
                .bind(execution_id.to_owned())
                .fetch_one(&self.database.reads)
                .await?;
            Ok(last as u64)
        })
    }

    fn events_after<'a>(
        &'a self,
        execution_id: &'a str,
        after_sequence: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT event FROM events WHERE execution_id = $1 AND sequence > $2 ORDER BY sequence LIMIT CAST($3 AS BIGINT)",
            )
            .bind(execution_id.to_owned())
            .bind(after_sequence as i64)
            .bind(i64::from(limit))
            .fetch_all(&self.database.reads)
            .await?;
            rows.iter().map(|row| Ok(row.try_get("event")?)).collect()
        })
    }

    fn log_after(&self, after_position: i64, limit: u32) -> BoxFuture<'_, Result<Vec<LogEntry>>> {
        const LOG_AFTER: &str = "SELECT id, event FROM events WHERE id > $1 ORDER BY id LIMIT CAST($2 AS BIGINT)";
        Box::pin(async move {
            // Read after every commit of the engine: on SQLite, without a
            // hand-off to a pool's connection thread.
            if let Some(native) = self.database.native() {
                return native.read(|connection| {
                    let mut statement = connection.prepare_cached(LOG_AFTER)?;
                    let rows = statement.query_map(rusqlite::params![after_position, i64::from(limit)], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })?;
                    Ok(rows.collect::<rusqlite::Result<Vec<LogEntry>>>()?)
                });
            }
            let rows = sqlx::query(LOG_AFTER)
                .bind(after_position)
                .bind(i64::from(limit))
                .fetch_all(&self.database.reads)
                .await?;
            rows.iter().map(|row| Ok((row.try_get("id")?, row.try_get("event")?))).collect()
        })
    }

    fn log_end(&self) -> BoxFuture<'_, Result<i64>> {
        Box::pin(async move {
            let end: Option<i64> =
                sqlx::query_scalar("SELECT MAX(id) FROM events").fetch_one(&self.database.reads).await?;
            Ok(end.unwrap_or(0))
        })
    }

    fn cursor<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(async move {
            let position: Option<i64> = sqlx::query_scalar("SELECT position FROM event_cursors WHERE name = $1")
                .bind(name.to_owned())
                .fetch_optional(&self.database.reads)
                .await?;
            Ok(position.unwrap_or(0))
        })
    }

    fn advance_cursor<'a>(&'a self, name: &'a str, position: i64) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            sqlx::query(
                "INSERT INTO event_cursors (name, position) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE \
                 SET position = excluded.position WHERE event_cursors.position < excluded.position",
            )
            .bind(name.to_owned())
            .bind(position)
            .execute(&self.database.pool)
            .await?;
            Ok(())
        })
    }

    fn latest_matrix(&self) -> BoxFuture<'_, Result<Option<Matrix>>> {
        Box::pin(async move {
            let row = sqlx::query(LATEST_MATRIX).fetch_optional(&self.database.reads).await?;
            row.as_ref().map(matrix_from_row).transpose()
        })
    }

    fn matrix(&self, version: u32) -> BoxFuture<'_, Result<Option<Matrix>>> {
        Box::pin(async move {
            let row = sqlx::query("SELECT * FROM permission_matrices WHERE version = $1")
                .bind(i64::from(version))
                .fetch_optional(&self.database.reads)
                .await?;
            row.as_ref().map(matrix_from_row).transpose()
        })
    }

    fn matrices(&self, before: Option<u32>, limit: u32) -> BoxFuture<'_, Result<Vec<Matrix>>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT * FROM permission_matrices WHERE version < $1 ORDER BY version DESC LIMIT CAST($2 AS BIGINT)",
            )
            .bind(before.map_or(i64::MAX, i64::from))
            .bind(i64::from(limit))
            .fetch_all(&self.database.reads)
            .await?;
            rows.iter().map(matrix_from_row).collect()
        })
    }

    fn put_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>> {
        Box::pin(async move {
            // Replicas putting a matrix at once may both take the same next
            // version: the one refused by the key takes the one after.
            let mut attempts = 0;
            loop {
                attempts += 1;
                let put = async {
                    let mut transaction = self.database.pool.begin().await?;
                    let latest: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM permission_matrices")
                        .fetch_one(&mut *transaction)
                        .await?;
                    let version = latest.unwrap_or(0) + 1;
                    sqlx::query(
                        "INSERT INTO permission_matrices (version, source, created_at, created_by) \
                         VALUES ($1, $2, $3, $4)",
                    )
                    .bind(version)
                    .bind(matrix.source.clone())
                    .bind(matrix.created_at)
                    .bind(matrix.created_by.clone())
                    .execute(&mut *transaction)
                    .await?;
                    transaction.commit().await?;
                    Ok::<_, sqlx::Error>(version)
                };
                match put.await {
                    Ok(version) => return Ok(Matrix { version: version as u32, ..matrix }),
                    Err(sqlx::Error::Database(error)) if error.is_unique_violation() && attempts < 10 => continue,
                    Err(error) => return Err(error.into()),
                }
            }
        })
    }

    fn first_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>> {
        Box::pin(async move {
            let mut transaction = self.database.pool.begin().await?;
            sqlx::query(
                "INSERT INTO permission_matrices (version, source, created_at, created_by) VALUES (1, $1, $2, $3) \
                 ON CONFLICT (version) DO NOTHING",
            )
            .bind(matrix.source.clone())
            .bind(matrix.created_at)
            .bind(matrix.created_by.clone())
            .execute(&mut *transaction)
            .await?;
            let latest = sqlx::query(LATEST_MATRIX).fetch_one(&mut *transaction).await?;
            transaction.commit().await?;
            matrix_from_row(&latest)
        })
    }

    fn due_schedules(&self, now: i64, limit: u32) -> BoxFuture<'_, Result<Vec<ScheduleState>>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT * FROM schedules WHERE next_fire_at <= $1 ORDER BY next_fire_at LIMIT CAST($2 AS BIGINT)",
            )
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&self.database.pool)
            .await?;
            rows.iter().map(schedule_from_row).collect()
        })
    }

    fn next_due_schedule(&self) -> BoxFuture<'_, Result<Option<i64>>> {
        Box::pin(async move {
            Ok(sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(next_fire_at) FROM schedules")
                .fetch_one(&self.database.pool)
                .await?)
        })
    }

    fn schedules<'a>(&'a self, after: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ScheduleState>>> {
        Box::pin(async move {
            let rows = sqlx::query(
                "SELECT * FROM schedules WHERE process_name > $1 ORDER BY process_name LIMIT CAST($2 AS BIGINT)",
            )
            .bind(after.to_owned())
            .bind(i64::from(limit))
            .fetch_all(&self.database.reads)
            .await?;
            rows.iter().map(schedule_from_row).collect()
        })
    }

    fn skip_schedule<'a>(&'a self, process_name: &'a str, due: i64, next: i64) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let moved =
                sqlx::query("UPDATE schedules SET next_fire_at = $1 WHERE process_name = $2 AND next_fire_at = $3")
                    .bind(next)
                    .bind(process_name.to_owned())
                    .bind(due)
                    .execute(&self.database.pool)
                    .await?;
            Ok(moved.rows_affected() == 1)
        })
    }

    fn process_activity<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Activity>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT COUNT(CASE WHEN ended_at IS NULL THEN 1 END) AS underway, MAX(started_at) AS last_started_at \
                 FROM executions WHERE process_name = $1",
            )
            .bind(process_name.to_owned())
            .fetch_one(&self.database.pool)
            .await?;
            Ok(Activity {
                underway: row.try_get::<i64, _>("underway")? as u64,
                last_started_at: row.try_get("last_started_at")?,
            })
        })
    }

    fn admission_lock<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, Result<Option<AdmissionLock>>> {
        Box::pin(async move {
            if self.database.backend != Backend::Postgres || keys.is_empty() {
                return Ok(None);
            }
            // One connection however many limits: a start holds no more.
            let mut transaction = self.database.pool.begin().await?;
            for name in keys {
                // FNV-1a of the name: the lock's key.
                let key = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
                    (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
                });
                sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(key as i64).execute(&mut *transaction).await?;
            }
            Ok(Some(AdmissionLock::new(transaction)))
        })
    }

    fn append_memory(&self, entry: MemoryEntry) -> BoxFuture<'_, Result<MemoryEntry>> {
        Box::pin(async move {
            let stored = || async {
                let row = sqlx::query("SELECT * FROM memory WHERE id = $1")
                    .bind(entry.id.clone())
                    .fetch_optional(&self.database.pool)
                    .await?;
                row.as_ref().map(memory_from_row).transpose()
            };
            if let Some(existing) = stored().await? {
                return Ok(existing);
            }
            let mut transaction = self.database.pool.begin().await?;
            if let Err(error) = insert_memory(&mut transaction, &entry).await {
                drop(transaction);
                return stored().await?.ok_or(error);
            }
            memory::raise_versions(&mut transaction, [entry.role.as_str()]).await?;
            transaction.commit().await?;
            Ok(entry)
        })
    }

    fn memory<'a>(
        &'a self,
        role: &'a str,
        before: Option<&'a (i64, String)>,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<MemoryEntry>>> {
        Box::pin(async move {
            let rows = match before {
                None => sqlx::query(
                    "SELECT * FROM memory WHERE role = $1 ORDER BY created_at DESC, id DESC LIMIT CAST($2 AS BIGINT)",
                )
                .bind(role.to_owned())
                .bind(i64::from(limit))
                .fetch_all(&self.database.reads)
                .await?,
                Some((created_at, id)) => {
                    sqlx::query(
                        "SELECT * FROM memory WHERE role = $1 AND (created_at < $2 OR (created_at = $3 AND id < $4)) \
                         ORDER BY created_at DESC, id DESC LIMIT CAST($5 AS BIGINT)",
                    )
                    .bind(role.to_owned())
                    .bind(*created_at)
                    .bind(*created_at)
                    .bind(id.clone())
                    .bind(i64::from(limit))
                    .fetch_all(&self.database.reads)
                    .await?
                }
            };
            rows.iter().map(memory_from_row).collect()
        })
    }

    fn forget_memory<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(memory::forget(&self.database, id))
    }

    fn memory_version<'a>(&'a self, role: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(memory::version(&self.database, role))
    }

    fn process_usage<'a>(
        &'a self,
        process_name: &'a str,
        since: i64,
        except_execution: &'a str,
    ) -> BoxFuture<'a, Result<Usage>> {
        Box::pin(async move {
            let row = sqlx::query(
                "SELECT COUNT(DISTINCT e.id) AS runs, CAST(COALESCE(SUM(s.cost), 0) AS DOUBLE PRECISION) AS cost, \
                 CAST(COALESCE(SUM(s.tokens_used), 0) AS BIGINT) AS tokens \
                 FROM executions e LEFT JOIN steps s ON s.execution_id = e.id \
                 WHERE e.process_name = $1 AND e.started_at >= $2 AND e.id <> $3",
            )
            .bind(process_name.to_owned())
            .bind(since)
            .bind(except_execution.to_owned())
            .fetch_one(&self.database.reads)
            .await?;
            usage_from_row(&row)
        })
    }
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        if error.as_database_error().and_then(|error| error.code()).as_deref() == Some(READ_ONLY_TRANSACTION) {
            // The transaction `muster_hold_lease` found without a lease (or a
            // database that takes no writes).
            return Error::Superseded(format!(
                "this replica no longer holds its lease on its executions, or the database takes no writes: {error}"
            ));
        }
        Error::Storage(error.to_string())
    }
}

impl From<rusqlite::Error> for Error {
    fn from(error: rusqlite::Error) -> Self {
        Error::Storage(error.to_string())
    }
}
