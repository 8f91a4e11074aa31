//! Executions and their steps, in SQL: reading one, its steps, outputs and
//! session records, and listing them with their filters.

use std::sync::Arc;

use muster_runtime::db::{Backend, placeholder};
use sqlx::{AssertSqlSafe, Row, any::AnyRow};

use super::{SqlStore, participants};
use crate::store::{Activity, AdmissionLock, ExecutionFilter};
use crate::{
    Error, Result,
    domain::{
        authority::{RoleAssignment, Session, SubtaskRequest, SubtaskStatus},
        model::{Execution, Step},
    },
};

pub(super) async fn execution<'a>(store: &'a SqlStore, id: &'a str) -> Result<Option<Execution>> {
    let Some(row) = sqlx::query("SELECT * FROM executions WHERE id = $1")
        .bind(id.to_owned())
        .fetch_optional(&store.database.reads)
        .await?
    else {
        return Ok(None);
    };
    let mut execution = execution_from_row(&row)?;
    if let Some(session) = &mut execution.session {
        session.assignments = store.assignments(id).await?;
        session.subtasks = store.subtasks(id).await?;
    }
    Ok(Some(execution))
}

pub(super) async fn steps<'a>(store: &'a SqlStore, execution_id: &'a str) -> Result<Vec<(String, Step)>> {
    let sql = match store.database.backend {
        Backend::Sqlite => {
            "SELECT s.*, o.output AS appended_output FROM steps s LEFT JOIN step_outputs o ON o.id = s.output_id \
             WHERE s.execution_id = $1 ORDER BY s.position"
        }
        Backend::Postgres => {
            "SELECT *, CAST(NULL AS TEXT) AS appended_output FROM steps WHERE execution_id = $1 ORDER BY position"
        }
    };
    let rows = sqlx::query(sql).bind(execution_id.to_owned()).fetch_all(&store.database.reads).await?;
    rows.iter().map(step_from_row).collect()
}

pub(super) async fn step_output<'a>(
    store: &'a SqlStore,
    execution_id: &'a str,
    step_id: &'a str,
) -> Result<Option<String>> {
    let sql = match store.database.backend {
        Backend::Sqlite => {
            "SELECT s.output_json, o.output AS appended_output FROM steps s \
             LEFT JOIN step_outputs o ON o.id = s.output_id WHERE s.execution_id = $1 AND s.step_id = $2"
        }
        Backend::Postgres => {
            "SELECT output_json, CAST(NULL AS TEXT) AS appended_output FROM steps \
             WHERE execution_id = $1 AND step_id = $2"
        }
    };
    let row = sqlx::query(sql)
        .bind(execution_id.to_owned())
        .bind(step_id.to_owned())
        .fetch_optional(&store.database.reads)
        .await?;
    let output = row.as_ref().map(stored_output).transpose()?;
    Ok(output.filter(|output| !output.is_empty()))
}

pub(super) async fn executes_a_step<'a>(store: &'a SqlStore, execution_id: &'a str, agent_id: &'a str) -> Result<bool> {
    let found = sqlx::query("SELECT 1 AS found FROM steps WHERE execution_id = $1 AND executor = $2 LIMIT 1")
        .bind(execution_id.to_owned())
        .bind(agent_id.to_owned())
        .fetch_optional(&store.database.reads)
        .await?;
    Ok(found.is_some())
}

pub(super) async fn find_by_idempotency_key<'a>(store: &'a SqlStore, key: &'a str) -> Result<Option<String>> {
    let row = sqlx::query("SELECT id FROM executions WHERE idempotency_key = $1")
        .bind(key.to_owned())
        .fetch_optional(&store.database.reads)
        .await?;
    Ok(row.map(|row| row.try_get("id")).transpose()?)
}

pub(super) async fn list_executions<'a>(store: &'a SqlStore, filter: &'a ExecutionFilter) -> Result<Vec<Execution>> {
    let backend = store.database.backend;
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
    let rows = query.fetch_all(&store.database.reads).await?;
    rows.iter().map(execution_from_row).collect()
}

pub(super) async fn admission_lock<'a>(store: &'a SqlStore, keys: &'a [&'a str]) -> Result<Option<AdmissionLock>> {
    if store.database.backend != Backend::Postgres || keys.is_empty() {
        return Ok(None);
    }
    // One connection however many limits: a start holds no more.
    let mut transaction = store.database.pool.begin().await?;
    for name in keys {
        // FNV-1a of the name: the lock's key.
        let key = name
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3));
        sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(key as i64).execute(&mut *transaction).await?;
    }
    Ok(Some(AdmissionLock::new(transaction)))
}

pub(super) async fn process_activity<'a>(store: &'a SqlStore, process_name: &'a str) -> Result<Activity> {
    let row = sqlx::query(
        "SELECT COUNT(CASE WHEN ended_at IS NULL THEN 1 END) AS underway, MAX(started_at) AS last_started_at \
         FROM executions WHERE process_name = $1",
    )
    .bind(process_name.to_owned())
    .fetch_one(&store.database.pool)
    .await?;
    Ok(Activity {
        underway: row.try_get::<i64, _>("underway")? as u64,
        last_started_at: row.try_get("last_started_at")?,
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

/// A step's output (empty for none): in its row when not empty, else the
/// one appended to `step_outputs` (SQLite), read as `appended_output`.
fn stored_output(row: &AnyRow) -> Result<String> {
    let output: String = row.try_get("output_json")?;
    if !output.is_empty() {
        return Ok(output);
    }
    Ok(row.try_get::<Option<String>, _>("appended_output")?.unwrap_or_default())
}

fn step_from_row(row: &AnyRow) -> Result<(String, Step)> {
    let status: String = row.try_get("status")?;
    let output = stored_output(row)?;
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
