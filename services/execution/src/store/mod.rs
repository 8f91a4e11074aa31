//! Durable state of the execution service: process versions, executions,
//! steps, the event history and the outbox. Every state change of an
//! execution and its events are written in one transaction, so the outbox
//! never misses an event and never holds one for a change that did not happen.

mod rows;
mod sessions;

use muster_proto::common::v1::StepEvent;
use muster_runtime::db::{Database, Migrations};
use prost::Message;
use sqlx::{AssertSqlSafe, Row, any::AnyRow};

pub(crate) use rows::{ExecutionRow, ProcessRow, StepRow};

use crate::{
    Error, Result,
    domain::{ExecutionStatus, authority::RoleAssignment},
};

/// The migrations of both backends.
pub(crate) const MIGRATIONS: Migrations = Migrations {
    sqlite: &[
        (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
        (2, "trace parent", include_str!("../../migrations/sqlite/0002_trace_parent.sql")),
        (3, "sessions", include_str!("../../migrations/sqlite/0003_sessions.sql")),
    ],
    postgres: &[
        (1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
        (2, "trace parent", include_str!("../../migrations/postgres/0002_trace_parent.sql")),
        (3, "sessions", include_str!("../../migrations/postgres/0003_sessions.sql")),
    ],
};

/// An event waiting in the outbox.
#[derive(Debug, Clone)]
pub(crate) struct OutboxEntry {
    pub(crate) id: i64,
    pub(crate) event: StepEvent,
}

/// Filters of `list_executions`.
#[derive(Debug, Default)]
pub(crate) struct ExecutionFilter {
    pub(crate) process_name: Option<String>,
    pub(crate) status: Option<ExecutionStatus>,
    pub(crate) started_after: Option<i64>,
    pub(crate) started_before: Option<i64>,
    pub(crate) limit: u32,
}

/// The execution service's repository.
#[derive(Debug, Clone)]
pub(crate) struct Store {
    database: Database,
}

impl Store {
    pub(crate) fn new(database: Database) -> Self {
        Self { database }
    }

    pub(crate) async fn migrate(&self) -> Result<()> {
        self.database.migrate(&MIGRATIONS).await.map_err(|error| Error::Storage(error.to_string()))
    }

    /// Stores a new version of a process: one more than the latest.
    pub(crate) async fn publish_process(&self, row: ProcessRow) -> Result<ProcessRow> {
        let mut transaction = self.database.pool.begin().await?;
        let latest: Option<i64> = sqlx::query("SELECT MAX(version) AS latest FROM processes WHERE name = $1")
            .bind(&row.name)
            .fetch_one(&mut *transaction)
            .await?
            .try_get("latest")?;
        let version = latest.unwrap_or(0) + 1;
        sqlx::query(
            "INSERT INTO processes (name, version, source, published_at, step_count, warnings) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&row.name)
        .bind(version)
        .bind(&row.source)
        .bind(row.published_at)
        .bind(i64::from(row.step_count))
        .bind(rows::encode_diagnostics(&row.warnings))
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(ProcessRow { version: version as u32, ..row })
    }

    /// One version of a process; `None` as version means the latest.
    pub(crate) async fn get_process(&self, name: &str, version: Option<u32>) -> Result<Option<ProcessRow>> {
        let row = match version {
            Some(version) => {
                sqlx::query("SELECT * FROM processes WHERE name = $1 AND version = $2")
                    .bind(name)
                    .bind(i64::from(version))
                    .fetch_optional(&self.database.pool)
                    .await?
            }
            None => {
                sqlx::query("SELECT * FROM processes WHERE name = $1 ORDER BY version DESC LIMIT 1")
                    .bind(name)
                    .fetch_optional(&self.database.pool)
                    .await?
            }
        };
        row.as_ref().map(ProcessRow::from_row).transpose()
    }

    /// The latest version of every process.
    pub(crate) async fn list_processes(&self) -> Result<Vec<ProcessRow>> {
        let rows = sqlx::query(
            "SELECT p.* FROM processes p JOIN (SELECT name, MAX(version) AS version FROM processes GROUP BY name) l \
             ON p.name = l.name AND p.version = l.version ORDER BY p.name",
        )
        .fetch_all(&self.database.pool)
        .await?;
        rows.iter().map(ProcessRow::from_row).collect()
    }

    /// Creates an execution with its steps and first events.
    pub(crate) async fn create_execution(&self, execution: &ExecutionRow, events: &[StepEvent]) -> Result<()> {
        let mut transaction = self.database.pool.begin().await?;
        sqlx::query(
            "INSERT INTO executions (id, process_name, process_version, status, reason, lead_agent_id, inputs_json, \
             idempotency_key, started_at, ended_at, last_sequence, trace_parent, is_session, session_title, \
             session_description) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)",
        )
        .bind(&execution.id)
        .bind(&execution.process_name)
        .bind(i64::from(execution.process_version))
        .bind(execution.status.as_str())
        .bind(&execution.reason)
        .bind(&execution.lead_agent_id)
        .bind(&execution.inputs_json)
        .bind(execution.idempotency_key.clone())
        .bind(execution.started_at)
        .bind(execution.ended_at)
        .bind(execution.last_sequence as i64)
        .bind(&execution.trace_parent)
        .bind(i64::from(execution.session.is_some()))
        .bind(execution.session.as_ref().map(|session| session.title.clone()).unwrap_or_default())
        .bind(execution.session.as_ref().map(|session| session.description.clone()).unwrap_or_default())
        .execute(&mut *transaction)
        .await?;
        if let Some(session) = &execution.session {
            for assignment in session.assignments.values() {
                sessions::upsert_assignment(&mut transaction, &execution.id, assignment).await?;
            }
        }
        for step in &execution.steps {
            sqlx::query("INSERT INTO steps (execution_id, step_id, position, status) VALUES ($1, $2, $3, $4)")
                .bind(&execution.id)
                .bind(&step.step_id)
                .bind(i64::from(step.position))
                .bind(step.status.as_str())
                .execute(&mut *transaction)
                .await?;
        }
        insert_events(&mut transaction, events).await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Writes the new state of some steps (and of the execution, and of
    /// session assignments) with their events, atomically.
    pub(crate) async fn record(
        &self,
        execution: &ExecutionRow,
        changed_steps: &[&StepRow],
        execution_changed: bool,
        assignments: &[RoleAssignment],
        events: &[StepEvent],
    ) -> Result<()> {
        let mut transaction = self.database.pool.begin().await?;
        for assignment in assignments {
            sessions::upsert_assignment(&mut transaction, &execution.id, assignment).await?;
        }
        for step in changed_steps {
            sqlx::query(
                "UPDATE steps SET status = $1, executor = $2, attempt = $3, output_json = $4, error_code = $5, \
                 error_message = $6, started_at = $7, ended_at = $8, cost = $9, tokens_used = $10 \
                 WHERE execution_id = $11 AND step_id = $12",
            )
            .bind(step.status.as_str())
            .bind(&step.executor)
            .bind(i64::from(step.attempt))
            .bind(&step.output_json)
            .bind(&step.error_code)
            .bind(&step.error_message)
            .bind(step.started_at)
            .bind(step.ended_at)
            .bind(step.cost)
            .bind(step.tokens_used as i64)
            .bind(&execution.id)
            .bind(&step.step_id)
            .execute(&mut *transaction)
            .await?;
        }
        // The execution's row changes with its status or lead only: its event
        // numbering is read back from the history (`last_event_sequence`).
        if execution_changed {
            sqlx::query(
                "UPDATE executions SET status = $1, reason = $2, lead_agent_id = $3, ended_at = $4, last_sequence = $5 \
                 WHERE id = $6",
            )
            .bind(execution.status.as_str())
            .bind(&execution.reason)
            .bind(&execution.lead_agent_id)
            .bind(execution.ended_at)
            .bind(execution.last_sequence as i64)
            .bind(&execution.id)
            .execute(&mut *transaction)
            .await?;
        }
        insert_events(&mut transaction, events).await?;
        transaction.commit().await?;
        Ok(())
    }

    pub(crate) async fn find_by_idempotency_key(&self, key: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT id FROM executions WHERE idempotency_key = $1")
            .bind(key)
            .fetch_optional(&self.database.pool)
            .await?;
        Ok(row.map(|row| row.try_get("id")).transpose()?)
    }

    /// An execution with its steps in definition order.
    pub(crate) async fn get_execution(&self, id: &str) -> Result<Option<ExecutionRow>> {
        let Some(row) =
            sqlx::query("SELECT * FROM executions WHERE id = $1").bind(id).fetch_optional(&self.database.pool).await?
        else {
            return Ok(None);
        };
        let mut execution = ExecutionRow::from_row(&row)?;
        if let Some(session) = &mut execution.session {
            session.assignments = self.assignments(id).await?;
        }
        let steps = sqlx::query("SELECT * FROM steps WHERE execution_id = $1 ORDER BY position")
            .bind(id)
            .fetch_all(&self.database.pool)
            .await?;
        execution.steps = steps.iter().map(StepRow::from_row).collect::<Result<_>>()?;
        Ok(Some(execution))
    }

    /// The sequence of an execution's last recorded event (0 for none), where
    /// a resumed execution goes on numbering.
    pub(crate) async fn last_event_sequence(&self, execution_id: &str) -> Result<u64> {
        let last: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(sequence), 0) FROM events WHERE execution_id = $1")
            .bind(execution_id)
            .fetch_one(&self.database.pool)
            .await?;
        Ok(last as u64)
    }

    /// Executions without their steps, newest first.
    pub(crate) async fn list_executions(&self, filter: &ExecutionFilter) -> Result<Vec<ExecutionRow>> {
        let mut sql = String::from("SELECT * FROM executions WHERE 1 = 1");
        let mut parameter = 0;
        let mut next = || {
            parameter += 1;
            format!("${parameter}")
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
        let rows = query.fetch_all(&self.database.pool).await?;
        rows.iter().map(ExecutionRow::from_row).collect()
    }

    /// Ids of executions that have not ended, for crash recovery.
    pub(crate) async fn unfinished_executions(&self) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT id FROM executions WHERE status IN ('running', 'paused') ORDER BY started_at")
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(|row| Ok(row.try_get("id")?)).collect()
    }

    /// Events of an execution after a sequence number.
    pub(crate) async fn events_after(&self, execution_id: &str, after_sequence: u64) -> Result<Vec<StepEvent>> {
        let rows = sqlx::query("SELECT event FROM events WHERE execution_id = $1 AND sequence > $2 ORDER BY sequence")
            .bind(execution_id)
            .bind(after_sequence as i64)
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(decode_event).collect()
    }

    /// The oldest outbox entries after `after_id`.
    pub(crate) async fn outbox_after(&self, after_id: i64, limit: u32) -> Result<Vec<OutboxEntry>> {
        let rows = sqlx::query("SELECT id, event FROM outbox WHERE id > $1 ORDER BY id LIMIT $2")
            .bind(after_id)
            .bind(i64::from(limit))
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(|row| Ok(OutboxEntry { id: row.try_get("id")?, event: decode_event(row)? })).collect()
    }

    /// Removes acknowledged outbox entries, up to and including `up_to_id`.
    pub(crate) async fn delete_outbox_through(&self, up_to_id: i64) -> Result<()> {
        sqlx::query("DELETE FROM outbox WHERE id <= $1").bind(up_to_id).execute(&self.database.pool).await?;
        Ok(())
    }
}

async fn insert_events(transaction: &mut sqlx::Transaction<'_, sqlx::Any>, events: &[StepEvent]) -> Result<()> {
    for event in events {
        let encoded = event.encode_to_vec();
        sqlx::query("INSERT INTO events (execution_id, sequence, event) VALUES ($1, $2, $3)")
            .bind(&event.execution_id)
            .bind(event.sequence as i64)
            .bind(encoded.clone())
            .execute(&mut **transaction)
            .await?;
        sqlx::query("INSERT INTO outbox (event_id, event) VALUES ($1, $2)")
            .bind(&event.event_id)
            .bind(encoded)
            .execute(&mut **transaction)
            .await?;
    }
    Ok(())
}

fn decode_event(row: &AnyRow) -> Result<StepEvent> {
    let bytes: Vec<u8> = row.try_get("event")?;
    StepEvent::decode(bytes.as_slice()).map_err(|error| Error::Storage(format!("corrupt stored event: {error}")))
}

impl From<sqlx::Error> for Error {
    fn from(error: sqlx::Error) -> Self {
        Error::Storage(error.to_string())
    }
}
