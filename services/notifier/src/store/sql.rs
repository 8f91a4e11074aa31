//! [`Store`] on SQLite and PostgreSQL through sqlx's `Any` driver.
//!
//! Cursors are assigned here, inside the ingest transaction, as the next ids
//! after the largest one; on PostgreSQL a transaction-scoped advisory lock
//! serialises ingest transactions, so cursors become visible in increasing
//! order (a reader never sees cursor 7 before cursor 6 has committed).

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use muster_runtime::db::{
    Backend, Connections, Database, Migrations, in_statements, placeholder, placeholder_list, placeholders,
};
use sqlx::{AssertSqlSafe, Row, any::AnyRow};

use super::{IngestOutcome, MemoryProgress, MemoryState, NewEvent, Store, StoredNotification};
use crate::{Error, Result, domain::Reason};

/// The notifier's migrations.
pub(crate) static MIGRATIONS: Migrations = Migrations {
    sqlite: &[(1, "init", include_str!("../../migrations/sqlite/0001_init.sql"))],
    postgres: &[(1, "init", include_str!("../../migrations/postgres/0001_init.sql"))],
};

/// Rows per multi-row statement: stays under both backends' bind limits.
const ROWS_PER_STATEMENT: usize = 500;
/// Any number unlikely to collide with another service's advisory locks.
const INGEST_LOCK_KEY: i64 = 0x6d75_7374_6e74_6679;
/// The advisory lock replicas take turns writing with (see [`WriterTurn`]).
const WRITER_TURN_KEY: i64 = 0x6d75_7374_7475_726e;

/// A process's turn to write, on PostgreSQL: a transaction holding an
/// advisory lock, which ends with it — committed by [`WriterTurn::end`],
/// rolled back when dropped, or cut off with the connection when the
/// process dies. Nothing on SQLite (one process writes the file).
pub struct WriterTurn {
    transaction: Option<sqlx::Transaction<'static, sqlx::Any>>,
}

impl WriterTurn {
    /// Ends the turn.
    pub async fn end(self) -> Result<()> {
        if let Some(transaction) = self.transaction {
            transaction.commit().await?;
        }
        Ok(())
    }
}

/// The SQL implementation of [`Store`].
#[derive(Debug, Clone)]
pub struct SqlStore {
    database: Database,
}

impl SqlStore {
    /// A store on `url` (`sqlite://...` or `postgres://...`); connects on first use.
    pub fn connect_lazy(url: &str, max_connections: u32) -> Result<Self> {
        // On SQLite the one foreign key (a notification's event) is not
        // checked: only the ingest writes either table, the event first, in
        // the transaction that writes its notifications, and checking cost
        // the ingest a lookup per notification and a statement journal.
        let connections = Connections { sqlite_foreign_keys: false, ..Connections::new(max_connections) };
        Ok(Self { database: Database::connect_lazy_with(url, connections)? })
    }

    /// Runs the migrations.
    pub async fn migrate(&self) -> Result<()> {
        Ok(self.database.migrate(&MIGRATIONS).await?)
    }

    /// The notifications `sql` selects with `$1` the cursor to read after
    /// and `$2` the most to read.
    async fn notifications(&self, sql: String, after_cursor: u64, limit: u32) -> Result<Vec<StoredNotification>> {
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(from_cursor(after_cursor))
            .bind(i64::from(limit))
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(Self::notification_from_row).collect()
    }

    fn notification_from_row(row: &AnyRow) -> Result<StoredNotification> {
        let reason: i64 = row.try_get("reason")?;
        let memory: i64 = row.try_get("memory_state")?;
        Ok(StoredNotification {
            cursor: to_cursor(row.try_get("notification_id")?),
            agent_id: row.try_get("agent_id")?,
            reason: Reason::from_i64(reason).ok_or_else(|| Error::Corrupt(format!("reason {reason}")))?,
            event_id: row.try_get("event_id")?,
            encoded: Bytes::from(row.try_get::<Vec<u8>, _>("event")?),
            output_summary: row.try_get("output_summary")?,
            created_at: row.try_get("received_at")?,
            memory: MemoryState::from_i64(memory).ok_or_else(|| Error::Corrupt(format!("memory state {memory}")))?,
        })
    }
}

fn to_cursor(value: i64) -> u64 {
    u64::try_from(value).unwrap_or_default()
}

fn from_cursor(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

const NOTIFICATION_COLUMNS: &str = "n.notification_id, n.agent_id, n.reason, n.event_id, n.memory_state, \
     e.event, e.output_summary, e.received_at";

/// Remembers a memory file's length before an ingest appends to it.
const MEMORY_FILE_UPSERT: &str = "INSERT INTO memory_files (path, length_before_append) VALUES ($1, $2) \
     ON CONFLICT (path) DO UPDATE SET length_before_append = excluded.length_before_append";
/// Forgets a memory file's old length rather than cut the file back to it.
const MEMORY_FILE_FORGET: &str = "DELETE FROM memory_files WHERE path = $1";

/// What an ingest writes, planned from what the database already holds.
struct IngestPlan<'a> {
    /// One per event, in order.
    outcomes: Vec<IngestOutcome>,
    /// The events to store (neither stored before nor repeated in the batch).
    new_events: Vec<&'a NewEvent>,
    /// One row per recipient of a new event: its cursor, the event and the
    /// recipient's index.
    notifications: Vec<(u64, &'a NewEvent, usize)>,
    /// The memory files the new events append to.
    touched_paths: Vec<&'a str>,
}

impl<'a> IngestPlan<'a> {
    /// Cursors follow `max_cursor`, the largest stored.
    fn new(events: &'a [NewEvent], already_stored: &HashSet<String>, max_cursor: i64) -> Self {
        let mut next_cursor = to_cursor(max_cursor) + 1;
        let mut plan = Self {
            outcomes: Vec::with_capacity(events.len()),
            new_events: Vec::new(),
            notifications: Vec::new(),
            touched_paths: Vec::new(),
        };
        let mut seen: HashSet<&str> = HashSet::new();
        let mut touched: HashSet<&str> = HashSet::new();
        for event in events {
            if already_stored.contains(&event.event_id) || !seen.insert(event.event_id.as_str()) {
                plan.outcomes.push(IngestOutcome::Duplicate);
                continue;
            }
            plan.outcomes.push(IngestOutcome::Stored { first_cursor: next_cursor });
            for (index, recipient) in event.recipients.iter().enumerate() {
                plan.notifications.push((next_cursor + index as u64, event, index));
                if let Some(path) = recipient.memory_path.as_deref()
                    && touched.insert(path)
                {
                    plan.touched_paths.push(path);
                }
            }
            next_cursor += event.recipients.len() as u64;
            plan.new_events.push(event);
        }
        plan
    }

    /// Each touched memory file given a length: its length before this
    /// ingest appends, `None` when unknown. A touched file not given keeps
    /// the length recorded for it.
    fn memory_files(&self, lengths: &[(String, Option<u64>)]) -> Vec<(&'a str, Option<u64>)> {
        let given: HashMap<&str, Option<u64>> = lengths.iter().map(|(path, length)| (path.as_str(), *length)).collect();
        self.touched_paths.iter().filter_map(|path| Some((*path, *given.get(path)?))).collect()
    }
}

/// [`Store::ingest`] on a SQLite file, run whole on the calling thread:
/// the same statements without a thread hand-off for each. The inserts are
/// `OR FAIL`: a row that breaks a constraint stops its statement without
/// undoing the rows before it, which spares SQLite the statement journal
/// an undo needs, and the error rolls the whole transaction back.
fn ingest_natively(
    transaction: &rusqlite::Connection,
    events: &[NewEvent],
    memory_file_lengths: &[(String, Option<u64>)],
) -> Result<Vec<IngestOutcome>> {
    let mut already_stored: HashSet<String> = HashSet::new();
    // Statements of a few sizes (`in_statements`), each prepared once.
    for chunk in in_statements(events) {
        let list = placeholder_list(Backend::Sqlite, 1, chunk.len());
        let mut statement =
            transaction.prepare_cached(&format!("SELECT event_id FROM events WHERE event_id IN ({list})"))?;
        for (index, event) in chunk.iter().enumerate() {
            statement.raw_bind_parameter(index + 1, event.event_id.as_str())?;
        }
        let mut rows = statement.raw_query();
        while let Some(row) = rows.next()? {
            already_stored.insert(row.get(0)?);
        }
    }
    let max_cursor: i64 = transaction
        .prepare_cached("SELECT COALESCE(MAX(notification_id), 0) FROM notifications")?
        .query_row([], |row| row.get(0))?;
    let plan = IngestPlan::new(events, &already_stored, max_cursor);

    for chunk in in_statements(&plan.new_events) {
        let values = placeholders(Backend::Sqlite, chunk.len(), 5);
        let mut statement = transaction.prepare_cached(&format!(
            "INSERT OR FAIL INTO events (event_id, event, output_summary, notifications, received_at) VALUES {values}"
        ))?;
        for (row, event) in chunk.iter().enumerate() {
            let first = row * 5;
            statement.raw_bind_parameter(first + 1, event.event_id.as_str())?;
            statement.raw_bind_parameter(first + 2, &event.encoded[..])?;
            statement.raw_bind_parameter(first + 3, event.output_summary.as_str())?;
            statement.raw_bind_parameter(first + 4, event.recipients.len() as i64)?;
            statement.raw_bind_parameter(first + 5, event.received_at)?;
        }
        statement.raw_execute()?;
    }
    for chunk in in_statements(&plan.notifications) {
        let values = placeholders(Backend::Sqlite, chunk.len(), 5);
        let mut statement = transaction.prepare_cached(&format!(
            "INSERT OR FAIL INTO notifications (notification_id, agent_id, reason, event_id, memory_state) VALUES {values}"
        ))?;
        for (row, (cursor, event, index)) in chunk.iter().enumerate() {
            let first = row * 5;
            let recipient = &event.recipients[*index];
            statement.raw_bind_parameter(first + 1, from_cursor(*cursor))?;
            statement.raw_bind_parameter(first + 2, recipient.agent_id.as_str())?;
            statement.raw_bind_parameter(first + 3, recipient.reason.to_i64())?;
            statement.raw_bind_parameter(first + 4, event.event_id.as_str())?;
            statement.raw_bind_parameter(first + 5, recipient.memory.to_i64())?;
        }
        statement.raw_execute()?;
    }
    for (path, length) in plan.memory_files(memory_file_lengths) {
        match length {
            Some(length) => {
                transaction.prepare_cached(MEMORY_FILE_UPSERT)?.execute(rusqlite::params![path, from_cursor(length)])?
            }
            None => transaction.prepare_cached(MEMORY_FILE_FORGET)?.execute([path])?,
        };
    }
    Ok(plan.outcomes)
}

/// What [`Store::record_memory_progress`] writes, on a SQLite file's native
/// connection: after every batch's lines are appended, so without a thread
/// hand-off per statement (or a statement parsed again each time).
fn record_memory_progress_natively(transaction: &rusqlite::Connection, progress: &MemoryProgress) -> Result<()> {
    transaction
        .prepare_cached(
            "UPDATE memory_progress SET written_through = CASE WHEN ?1 > written_through THEN ?1 \
             ELSE written_through END WHERE singleton = 1",
        )?
        .execute([from_cursor(progress.written_through)])?;
    for (path, length) in &progress.lengths {
        transaction.prepare_cached(MEMORY_FILE_UPSERT)?.execute(rusqlite::params![path, from_cursor(*length)])?;
    }
    for (cursors, state) in [(&progress.failed, MemoryState::Failed), (&progress.recovered, MemoryState::Written)] {
        for chunk in in_statements(cursors) {
            let list = placeholder_list(Backend::Sqlite, 2, chunk.len());
            let mut statement = transaction.prepare_cached(&format!(
                "UPDATE notifications SET memory_state = ? WHERE notification_id IN ({list})"
            ))?;
            statement.raw_bind_parameter(1, state.to_i64())?;
            for (index, cursor) in chunk.iter().enumerate() {
                statement.raw_bind_parameter(index + 2, from_cursor(*cursor))?;
            }
            statement.raw_execute()?;
        }
    }
    Ok(())
}

impl Store for SqlStore {
    async fn ingest(
        &self,
        events: &[NewEvent],
        memory_file_lengths: &[(String, Option<u64>)],
    ) -> Result<Vec<IngestOutcome>> {
        if let Some(native) = self.database.native() {
            return native
                .write(&self.database.pool, |transaction| ingest_natively(transaction, events, memory_file_lengths))
                .await;
        }
        let mut transaction = self.database.pool.begin().await?;
        if self.database.backend == Backend::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(INGEST_LOCK_KEY).execute(&mut *transaction).await?;
        }

        let mut already_stored: HashSet<String> = HashSet::new();
        for chunk in events.chunks(ROWS_PER_STATEMENT) {
            let list = placeholder_list(self.database.backend, 1, chunk.len());
            let sql = format!("SELECT event_id FROM events WHERE event_id IN ({list})");
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for event in chunk {
                query = query.bind(event.event_id.as_str());
            }
            for row in query.fetch_all(&mut *transaction).await? {
                already_stored.insert(row.try_get("event_id")?);
            }
        }
        let max_row = sqlx::query("SELECT COALESCE(MAX(notification_id), 0) AS max_id FROM notifications")
            .fetch_one(&mut *transaction)
            .await?;
        let plan = IngestPlan::new(events, &already_stored, max_row.try_get("max_id")?);

        for chunk in plan.new_events.chunks(ROWS_PER_STATEMENT / 5) {
            let sql = format!(
                "INSERT INTO events (event_id, event, output_summary, notifications, received_at) VALUES {}",
                placeholders(self.database.backend, chunk.len(), 5)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for event in chunk {
                query = query
                    .bind(event.event_id.as_str())
                    .bind(&event.encoded[..])
                    .bind(event.output_summary.as_str())
                    .bind(event.recipients.len() as i64)
                    .bind(event.received_at);
            }
            query.execute(&mut *transaction).await?;
        }
        for chunk in plan.notifications.chunks(ROWS_PER_STATEMENT) {
            let sql = format!(
                "INSERT INTO notifications (notification_id, agent_id, reason, event_id, memory_state) VALUES {}",
                placeholders(self.database.backend, chunk.len(), 5)
            );
            let mut query = sqlx::query(AssertSqlSafe(sql));
            for (cursor, event, index) in chunk {
                let recipient = &event.recipients[*index];
                query = query
                    .bind(from_cursor(*cursor))
                    .bind(recipient.agent_id.as_str())
                    .bind(recipient.reason.to_i64())
                    .bind(event.event_id.as_str())
                    .bind(recipient.memory.to_i64());
            }
            query.execute(&mut *transaction).await?;
        }
        for (path, length) in plan.memory_files(memory_file_lengths) {
            match length {
                Some(length) => sqlx::query(MEMORY_FILE_UPSERT).bind(path).bind(from_cursor(length)),
                None => sqlx::query(MEMORY_FILE_FORGET).bind(path),
            }
            .execute(&mut *transaction)
            .await?;
        }

        transaction.commit().await?;
        Ok(plan.outcomes)
    }

    async fn list(&self, agent_id: &str, after_cursor: u64, limit: u32) -> Result<Vec<StoredNotification>> {
        let sql = format!(
            "SELECT {NOTIFICATION_COLUMNS} FROM notifications n JOIN events e ON e.event_id = n.event_id \
             WHERE n.agent_id = $1 AND n.notification_id > $2 ORDER BY n.notification_id LIMIT CAST($3 AS BIGINT)"
        );
        let rows = sqlx::query(AssertSqlSafe(sql))
            .bind(agent_id)
            .bind(from_cursor(after_cursor))
            .bind(i64::from(limit))
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(Self::notification_from_row).collect()
    }

    fn shared(&self) -> bool {
        self.database.backend == Backend::Postgres
    }

    async fn writer_turn(&self) -> Result<WriterTurn> {
        if !self.shared() {
            return Ok(WriterTurn { transaction: None });
        }
        let mut transaction = self.database.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(WRITER_TURN_KEY).execute(&mut *transaction).await?;
        Ok(WriterTurn { transaction: Some(transaction) })
    }

    async fn list_all(&self, after_cursor: u64, limit: u32) -> Result<Vec<StoredNotification>> {
        let sql = format!(
            "SELECT {NOTIFICATION_COLUMNS} FROM notifications n JOIN events e ON e.event_id = n.event_id \
             WHERE n.notification_id > $1 ORDER BY n.notification_id LIMIT CAST($2 AS BIGINT)"
        );
        self.notifications(sql, after_cursor, limit).await
    }

    async fn newest_cursor_of_all(&self) -> Result<u64> {
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT MAX(notification_id) FROM notifications").fetch_one(&self.database.pool).await?;
        Ok(newest.map_or(0, to_cursor))
    }

    async fn newest_cursor(&self, agent_id: &str) -> Result<u64> {
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT MAX(notification_id) FROM notifications WHERE agent_id = $1")
                .bind(agent_id)
                .fetch_one(&self.database.pool)
                .await?;
        Ok(newest.map_or(0, to_cursor))
    }

    async fn acknowledged_cursor(&self, agent_id: &str) -> Result<u64> {
        let row = sqlx::query("SELECT acknowledged_cursor FROM acknowledgements WHERE agent_id = $1")
            .bind(agent_id)
            .fetch_optional(&self.database.pool)
            .await?;
        Ok(match row {
            Some(row) => to_cursor(row.try_get("acknowledged_cursor")?),
            None => 0,
        })
    }

    async fn acknowledge(&self, agent_id: &str, cursor: u64) -> Result<u64> {
        let row = sqlx::query(
            "INSERT INTO acknowledgements (agent_id, acknowledged_cursor, updated_at) VALUES ($1, $2, $3) \
             ON CONFLICT (agent_id) DO UPDATE SET \
             acknowledged_cursor = CASE WHEN excluded.acknowledged_cursor > acknowledgements.acknowledged_cursor \
             THEN excluded.acknowledged_cursor ELSE acknowledgements.acknowledged_cursor END, \
             updated_at = excluded.updated_at \
             RETURNING acknowledged_cursor",
        )
        .bind(agent_id)
        .bind(from_cursor(cursor))
        .bind(muster_runtime::time::now_millis())
        .fetch_one(&self.database.pool)
        .await?;
        Ok(to_cursor(row.try_get("acknowledged_cursor")?))
    }

    async fn record_memory_progress(&self, progress: &MemoryProgress) -> Result<()> {
        if let Some(native) = self.database.native() {
            return native
                .write(&self.database.pool, |transaction| record_memory_progress_natively(transaction, progress))
                .await;
        }
        let mut transaction = self.database.pool.begin().await?;
        sqlx::query(
            "UPDATE memory_progress SET written_through = CASE WHEN $1 > written_through THEN $1 \
             ELSE written_through END WHERE singleton = 1",
        )
        .bind(from_cursor(progress.written_through))
        .execute(&mut *transaction)
        .await?;
        for (path, length) in &progress.lengths {
            sqlx::query(MEMORY_FILE_UPSERT).bind(path).bind(from_cursor(*length)).execute(&mut *transaction).await?;
        }
        for (cursors, state) in [(&progress.failed, MemoryState::Failed), (&progress.recovered, MemoryState::Written)] {
            for chunk in cursors.chunks(ROWS_PER_STATEMENT) {
                let list = placeholder_list(self.database.backend, 2, chunk.len());
                let state_placeholder = placeholder(self.database.backend, 1);
                let sql = format!(
                    "UPDATE notifications SET memory_state = {state_placeholder} WHERE notification_id IN ({list})"
                );
                let mut query = sqlx::query(AssertSqlSafe(sql)).bind(state.to_i64());
                for cursor in chunk {
                    query = query.bind(from_cursor(*cursor));
                }
                query.execute(&mut *transaction).await?;
            }
        }
        transaction.commit().await?;
        Ok(())
    }

    async fn unwritten_memory(&self, after_cursor: u64, limit: u32) -> Result<Vec<StoredNotification>> {
        let sql = format!(
            "SELECT {NOTIFICATION_COLUMNS} FROM notifications n JOIN events e ON e.event_id = n.event_id \
             WHERE n.notification_id > $1 AND ( \
               (n.memory_state = 0 AND n.notification_id > (SELECT written_through FROM memory_progress WHERE singleton = 1)) \
               OR n.memory_state = 4) \
             ORDER BY n.notification_id LIMIT CAST($2 AS BIGINT)"
        );
        self.notifications(sql, after_cursor, limit).await
    }

    async fn memory_file_length(&self, path: &str) -> Result<Option<u64>> {
        let row = sqlx::query("SELECT length_before_append FROM memory_files WHERE path = $1")
            .bind(path)
            .fetch_optional(&self.database.pool)
            .await?;
        Ok(match row {
            Some(row) => Some(to_cursor(row.try_get("length_before_append")?)),
            None => None,
        })
    }
}
