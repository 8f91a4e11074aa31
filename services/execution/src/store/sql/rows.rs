//! The statements and rows of a commit: executions, steps, events,
//! assignments and subtasks, as multi-row statements on SQLite and JSON
//! record sets on PostgreSQL.

use std::sync::OnceLock;

use muster_runtime::db::{Backend, ROW_COUNTS, placeholder, placeholders};
use prost::Message as _;

use super::hex;
use crate::store::StepWrite;
use crate::{
    Result,
    domain::{
        authority::{RoleAssignment, SubtaskRequest},
        model::{Event, Execution},
    },
    grpc::convert,
};

/// A statement with its parameters bound.
pub(super) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments>;

/// The text of a multi-row statement of `rows` rows (one of [`ROW_COUNTS`]), made once.
fn multi_row_text(texts: &'static [OnceLock<String>; 4], rows: usize, make: impl FnOnce() -> String) -> &'static str {
    let index = ROW_COUNTS.iter().position(|count| *count == rows).expect("a row count of ROW_COUNTS");
    texts[index].get_or_init(make)
}

/// Rows per statement on PostgreSQL, where all rows travel as one JSON
/// parameter: the statement's text never changes, so it is prepared once
/// per connection (a multi-row VALUES list with thousands of parameters was
/// parsed and planned anew for every size, tens of milliseconds each).
pub(super) const JSON_ROWS_PER_STATEMENT: usize = 5000;

/// The columns of a step row, in order.
const STEP_COLUMNS: &str = "execution_id, step_id, position, status, executor, attempt, output_json, error_code, \
     error_message, started_at, ended_at, cost, tokens_used, assigned_to, delegation_chain, wait_seconds, retry_at, \
     roster_reserved, slot_task";

/// How many columns a SQLite step row has: [`STEP_COLUMNS`], then
/// `output_id` (the row of `step_outputs` holding its output).
pub(super) const STEP_COLUMN_COUNT: usize = 20;

/// What a step row's upsert changes.
const STEP_UPDATE: &str = "ON CONFLICT (execution_id, step_id) DO UPDATE SET status = excluded.status, \
     executor = excluded.executor, attempt = excluded.attempt, output_json = excluded.output_json, \
     error_code = excluded.error_code, error_message = excluded.error_message, \
     started_at = excluded.started_at, ended_at = excluded.ended_at, cost = excluded.cost, \
     tokens_used = excluded.tokens_used, assigned_to = excluded.assigned_to, \
     delegation_chain = excluded.delegation_chain, wait_seconds = excluded.wait_seconds, \
     retry_at = excluded.retry_at, roster_reserved = excluded.roster_reserved, \
     slot_task = excluded.slot_task";

/// The SQLite upsert of `rows` step rows (one of [`ROW_COUNTS`]), its text
/// made once (a commit's statements are looked up by their text).
pub(super) fn step_upsert_sql(rows: usize) -> &'static str {
    static TEXTS: [OnceLock<String>; 4] = [const { OnceLock::new() }; 4];
    multi_row_text(&TEXTS, rows, || {
        let values = placeholders(Backend::Sqlite, rows, STEP_COLUMN_COUNT);
        format!(
            "INSERT INTO steps ({STEP_COLUMNS}, output_id) VALUES {values} {STEP_UPDATE}, \
             output_id = excluded.output_id"
        )
    })
}

/// The SQLite insert of `rows` events (one of [`ROW_COUNTS`]), its text made once.
pub(super) fn event_insert_sql(rows: usize) -> &'static str {
    static TEXTS: [OnceLock<String>; 4] = [const { OnceLock::new() }; 4];
    multi_row_text(&TEXTS, rows, || {
        let values = placeholders(Backend::Sqlite, rows, 3);
        format!("INSERT INTO events (execution_id, sequence, event) VALUES {values}")
    })
}

/// A step row as PostgreSQL's `json_to_recordset` reads it.
#[derive(serde::Serialize)]
pub(super) struct StepRow<'a> {
    pub(super) execution_id: &'a str,
    pub(super) step_id: &'a str,
    pub(super) position: i64,
    pub(super) status: &'a str,
    pub(super) executor: &'a str,
    pub(super) attempt: i64,
    pub(super) output_json: &'a str,
    pub(super) error_code: &'a str,
    pub(super) error_message: &'a str,
    pub(super) started_at: Option<i64>,
    pub(super) ended_at: Option<i64>,
    pub(super) cost: f64,
    pub(super) tokens_used: i64,
    pub(super) assigned_to: Option<&'a str>,
    pub(super) delegation_chain: String,
    pub(super) wait_seconds: i64,
    pub(super) retry_at: Option<i64>,
    pub(super) roster_reserved: i64,
    pub(super) slot_task: &'a str,
}

impl<'a> StepRow<'a> {
    pub(super) fn of(write: &'a StepWrite) -> Self {
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
pub(super) struct ExecutionRow<'a> {
    pub(super) id: &'a str,
    pub(super) status: &'a str,
    pub(super) reason: &'a str,
    pub(super) lead_agent_id: &'a str,
    pub(super) ended_at: Option<i64>,
    pub(super) last_sequence: i64,
}

impl<'a> ExecutionRow<'a> {
    pub(super) fn of(execution: &'a Execution) -> Self {
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
pub(super) struct EventRow<'a> {
    pub(super) execution_id: &'a str,
    pub(super) sequence: i64,
    pub(super) event: String,
}

impl<'a> EventRow<'a> {
    pub(super) fn all(events: &[&'a Event]) -> Vec<Self> {
        events
            .iter()
            .map(|event| EventRow {
                execution_id: &event.execution_id,
                sequence: event.sequence as i64,
                event: hex(&convert::event_to_wire(event).encode_to_vec()),
            })
            .collect()
    }
}

/// PostgreSQL's upsert of the step rows in the JSON array `json` (a
/// parameter or a literal) holds.
pub(super) fn steps_from_json_sql(json: &str) -> String {
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
pub(super) fn events_from_json_sql(json: &str) -> String {
    format!(
        "INSERT INTO events (execution_id, sequence, event) \
         SELECT execution_id, sequence, decode(event, 'hex') FROM json_to_recordset({json}::json) \
         AS r(execution_id TEXT, sequence BIGINT, event TEXT)"
    )
}

/// The update of an execution's row, its six values (status, reason, lead,
/// end, last sequence, then the id) as parameters.
pub(super) fn update_execution_sql(backend: Backend) -> String {
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

pub(super) fn bind_execution_update<'q>(query: AnyQuery<'q>, execution: &Execution) -> AnyQuery<'q> {
    query
        .bind(execution.status.as_str())
        .bind(execution.reason.clone())
        .bind(execution.lead_agent_id.clone())
        .bind(execution.ended_at)
        .bind(execution.last_sequence as i64)
        .bind(execution.id.clone())
}

pub(super) fn bind_step<'q>(query: AnyQuery<'q>, write: &StepWrite) -> AnyQuery<'q> {
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
        // The output in the row: only the native writer appends outputs.
        .bind(None::<i64>)
}

pub(super) fn bind_event<'q>(query: AnyQuery<'q>, event: &Event) -> AnyQuery<'q> {
    query
        .bind(event.execution_id.clone())
        .bind(event.sequence as i64)
        .bind(convert::event_to_wire(event).encode_to_vec())
}

/// The insert of an execution's row, its sixteen values as parameters.
pub(super) const INSERT_EXECUTION: &str = "INSERT INTO executions (id, process_name, process_version, status, reason, lead_agent_id, inputs_json, \
     idempotency_key, started_at, ended_at, last_sequence, trace_parent, is_session, session_title, \
     session_description, owner) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

pub(super) async fn insert_execution(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    execution: &Execution,
    owner: Option<&str>,
) -> Result<()> {
    sqlx::query(INSERT_EXECUTION)
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

pub(super) async fn upsert_assignment(
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

pub(super) async fn upsert_subtask(
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
