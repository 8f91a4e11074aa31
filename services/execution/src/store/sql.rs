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
//! one) runs whole on the writer's thread through the native connection,
//! which appends each output a step completes with to `step_outputs`
//! rather than growing the step's row.

use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use muster_runtime::db::{Backend, Connections, Database, Migrations, SMALL_PAGES};
use tokio::sync::{mpsc, oneshot};

mod budgets;
mod events;
mod executions;
mod inboxes;
mod memory;
mod participants;
mod processes;
mod replicas;
mod rows;
mod schedules;
mod sessions;
mod writer;

use super::{
    Activity, AdmissionLock, Archived, BoxFuture, ExecutionFilter, InboxFilter, LogEntry, NewProcess, Published,
    Replica, Store, Write,
};
use crate::{
    Error, Result,
    domain::{
        authority::Matrix,
        budget::{Budget, Usage},
        inbox::InboxMessage,
        memory::MemoryEntry,
        model::{Execution, ProcessVersion, Step},
        schedule::ScheduleState,
    },
};
use writer::{Job, READ_ONLY_TRANSACTION, write_loop};

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
        (16, "step outputs", include_str!("../../migrations/sqlite/0016_step_outputs.sql")),
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

/// The store on a SQL database.
#[derive(Clone)]
pub struct SqlStore {
    database: Database,
    writer: mpsc::Sender<Job>,
    /// The memory versions read on SQLite, until a commit raises one.
    memory_versions: Arc<memory::Versions>,
    /// The writer's transactions so far, for the tests.
    #[cfg(test)]
    transactions: Arc<std::sync::atomic::AtomicU64>,
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
    pub fn connect(url: &str, max_connections: u32, readers: u32) -> muster_runtime::Result<Self> {
        let connections = Connections { readers, sqlite_page_size: SMALL_PAGES, ..Connections::new(max_connections) };
        Ok(Self::new(Database::connect_lazy_with(url, connections)?))
    }

    /// A store on `database`; its writer runs until the last clone is dropped.
    pub fn new(database: Database) -> Self {
        let (writer, jobs) = mpsc::channel(4096);
        let replica = Arc::new(OnceLock::new());
        let memory_versions = Arc::new(memory::Versions::default());
        let shared = writer::Shared {
            memory_versions: memory_versions.clone(),
            #[cfg(test)]
            transactions: Arc::default(),
        };
        #[cfg(test)]
        let transactions = shared.transactions.clone();
        tokio::spawn(write_loop(database.clone(), replica.clone(), shared, jobs));
        Self {
            database,
            writer,
            memory_versions,
            #[cfg(test)]
            transactions,
            replica,
        }
    }

    /// How many transactions the writer committed (or tried to): commits
    /// that waited together share one.
    #[cfg(test)]
    pub(crate) fn transactions(&self) -> u64 {
        self.transactions.load(std::sync::atomic::Ordering::Relaxed)
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
/// transaction's BEGIN: `writer::begin_holding_lease`.
const SQLITE_LEASE_CHECK: &str = concat!("SELECT 1 FROM replicas WHERE id = ?1 AND expires_at > ", sqlite_now!());

/// What a commit of a replica whose lease lapsed fails with.
fn lease_lapsed(replica: &str) -> Error {
    Error::Superseded(format!(
        "replica {replica} no longer holds its lease on its executions: another replica takes them over"
    ))
}

impl Store for SqlStore {
    fn migrate(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            self.database.migrate(&MIGRATIONS).await.map_err(|error| Error::Storage(error.to_string()))?;
            participants::list_earlier_versions(&self.database).await
        })
    }

    fn publish_process(&self, process: NewProcess) -> BoxFuture<'_, Result<Published>> {
        Box::pin(processes::publish_process(self, process))
    }

    fn process<'a>(&'a self, name: &'a str, version: u32) -> BoxFuture<'a, Result<Option<ProcessVersion>>> {
        Box::pin(processes::process(self, name, version))
    }

    fn latest_version<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<u32>>> {
        Box::pin(processes::latest_version(self, name))
    }

    fn list_processes<'a>(&'a self, after_name: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ProcessVersion>>> {
        Box::pin(processes::list_processes(self, after_name, limit))
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
        Box::pin(executions::execution(self, id))
    }

    fn steps<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Vec<(String, Step)>>> {
        Box::pin(executions::steps(self, execution_id))
    }

    fn step_output<'a>(&'a self, execution_id: &'a str, step_id: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(executions::step_output(self, execution_id, step_id))
    }

    fn executes_a_step<'a>(&'a self, execution_id: &'a str, agent_id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(executions::executes_a_step(self, execution_id, agent_id))
    }

    fn find_by_idempotency_key<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(executions::find_by_idempotency_key(self, key))
    }

    fn post_message(&self, message: InboxMessage) -> BoxFuture<'_, Result<Option<InboxMessage>>> {
        Box::pin(inboxes::post_message(self, message))
    }

    fn inbox_messages<'a>(&'a self, filter: &'a InboxFilter) -> BoxFuture<'a, Result<Vec<InboxMessage>>> {
        Box::pin(inboxes::inbox_messages(self, filter))
    }

    fn archive_message<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Archived>> {
        Box::pin(inboxes::archive_message(self, id))
    }

    fn note_messages<'a>(&'a self, ids: &'a [String], note: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(inboxes::note_messages(self, ids, note))
    }

    fn inbox_busy<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(inboxes::inbox_busy(self, inbox))
    }

    fn triggered_by<'a>(&'a self, inbox: &'a str) -> BoxFuture<'a, Result<Option<String>>> {
        Box::pin(inboxes::triggered_by(self, inbox))
    }

    fn trigger_inboxes(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(inboxes::trigger_inboxes(self))
    }

    fn budget<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Option<Budget>>> {
        Box::pin(budgets::budget(self, process_name))
    }

    fn agent_budgets(&self) -> BoxFuture<'_, Result<Vec<Budget>>> {
        Box::pin(budgets::agent_budgets(self))
    }

    fn agent_usage<'a>(&'a self, agent_id: &'a str, since: i64) -> BoxFuture<'a, Result<Usage>> {
        Box::pin(budgets::agent_usage(self, agent_id, since))
    }

    fn put_budget<'a>(&'a self, budget: &'a Budget, set_by: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(budgets::put_budget(self, budget, set_by))
    }

    fn list_executions<'a>(&'a self, filter: &'a ExecutionFilter) -> BoxFuture<'a, Result<Vec<Execution>>> {
        Box::pin(executions::list_executions(self, filter))
    }

    fn join<'a>(&'a self, replica: &'a Replica, lease: Duration) -> BoxFuture<'a, Result<()>> {
        Box::pin(replicas::join(self, replica, lease))
    }

    fn renew(&self, lease: Duration) -> BoxFuture<'_, Result<bool>> {
        Box::pin(replicas::renew(self, lease))
    }

    fn adopt(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(replicas::adopt(self))
    }

    fn leave(&self) -> BoxFuture<'_, Result<()>> {
        Box::pin(replicas::leave(self))
    }

    fn driver_of<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<Option<Replica>>> {
        Box::pin(replicas::driver_of(self, execution_id))
    }

    fn peers(&self) -> BoxFuture<'_, Result<Vec<Replica>>> {
        Box::pin(replicas::peers(self))
    }

    fn leads(&self) -> BoxFuture<'_, Result<bool>> {
        Box::pin(replicas::leads(self))
    }

    fn last_event_sequence<'a>(&'a self, execution_id: &'a str) -> BoxFuture<'a, Result<u64>> {
        Box::pin(events::last_event_sequence(self, execution_id))
    }

    fn events_after<'a>(
        &'a self,
        execution_id: &'a str,
        after_sequence: u64,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<Vec<u8>>>> {
        Box::pin(events::events_after(self, execution_id, after_sequence, limit))
    }

    fn log_after(&self, after_position: i64, limit: u32) -> BoxFuture<'_, Result<Vec<LogEntry>>> {
        Box::pin(events::log_after(self, after_position, limit))
    }

    fn log_end(&self) -> BoxFuture<'_, Result<i64>> {
        Box::pin(events::log_end(self))
    }

    fn cursor<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(events::cursor(self, name))
    }

    fn advance_cursor<'a>(&'a self, name: &'a str, position: i64) -> BoxFuture<'a, Result<()>> {
        Box::pin(events::advance_cursor(self, name, position))
    }

    fn latest_matrix(&self) -> BoxFuture<'_, Result<Option<Matrix>>> {
        Box::pin(sessions::latest_matrix(self))
    }

    fn matrix(&self, version: u32) -> BoxFuture<'_, Result<Option<Matrix>>> {
        Box::pin(sessions::matrix(self, version))
    }

    fn matrices(&self, before: Option<u32>, limit: u32) -> BoxFuture<'_, Result<Vec<Matrix>>> {
        Box::pin(sessions::matrices(self, before, limit))
    }

    fn put_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>> {
        Box::pin(sessions::put_matrix(self, matrix))
    }

    fn first_matrix(&self, matrix: Matrix) -> BoxFuture<'_, Result<Matrix>> {
        Box::pin(sessions::first_matrix(self, matrix))
    }

    fn due_schedules(&self, now: i64, limit: u32) -> BoxFuture<'_, Result<Vec<ScheduleState>>> {
        Box::pin(schedules::due_schedules(self, now, limit))
    }

    fn next_due_schedule(&self) -> BoxFuture<'_, Result<Option<i64>>> {
        Box::pin(schedules::next_due_schedule(self))
    }

    fn schedules<'a>(&'a self, after: &'a str, limit: u32) -> BoxFuture<'a, Result<Vec<ScheduleState>>> {
        Box::pin(schedules::schedules(self, after, limit))
    }

    fn skip_schedule<'a>(&'a self, process_name: &'a str, due: i64, next: i64) -> BoxFuture<'a, Result<bool>> {
        Box::pin(schedules::skip_schedule(self, process_name, due, next))
    }

    fn process_activity<'a>(&'a self, process_name: &'a str) -> BoxFuture<'a, Result<Activity>> {
        Box::pin(executions::process_activity(self, process_name))
    }

    fn admission_lock<'a>(&'a self, keys: &'a [&'a str]) -> BoxFuture<'a, Result<Option<AdmissionLock>>> {
        Box::pin(executions::admission_lock(self, keys))
    }

    fn append_memory(&self, entry: MemoryEntry) -> BoxFuture<'_, Result<MemoryEntry>> {
        Box::pin(memory::append_memory(self, entry))
    }

    fn memory<'a>(
        &'a self,
        role: &'a str,
        before: Option<&'a (i64, String)>,
        limit: u32,
    ) -> BoxFuture<'a, Result<Vec<MemoryEntry>>> {
        Box::pin(memory::memory(self, role, before, limit))
    }

    fn forget_memory<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<bool>> {
        Box::pin(memory::forget(&self.database, &self.memory_versions, id))
    }

    fn memory_version<'a>(&'a self, role: &'a str) -> BoxFuture<'a, Result<i64>> {
        Box::pin(memory::version(&self.database, &self.memory_versions, role))
    }

    fn memory_version_at_hand(&self, role: &str) -> Option<Result<i64>> {
        memory::version_at_hand(&self.database, &self.memory_versions, role)
    }

    fn process_usage<'a>(
        &'a self,
        process_name: &'a str,
        since: i64,
        except_execution: &'a str,
    ) -> BoxFuture<'a, Result<Usage>> {
        Box::pin(budgets::process_usage(self, process_name, since, except_execution))
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
