//! The queue in the database: tasks waiting for a slot, a freed slot offered
//! to them in priority order, stale ones escalated, and a task's place.

use std::collections::HashMap;

use sqlx::Row;

use super::{Tx, from_json, to_json};
use super::{
    audit::record,
    reservation::{free_slot, reserve_slot, upsert_reservation},
};
use crate::domain::{
    delegation::{Decision, DelegationRequest, queue_escalation_decision, queue_offer_decision},
    model::Status,
};
use crate::error::{Error, QUEUED_TASK, Result};
use crate::store::{
    QueueResolution, QueueState,
    sql::{SqlStore, fetch_agent, index::WorkloadChange},
};

/// How many tasks wait for each expert; only the queue tier and a task
/// assigned to one agent read it.
pub(super) async fn load_queued(transaction: &mut Tx, request: &DelegationRequest) -> Result<HashMap<String, u32>> {
    let rows = if request.assigned_agent_id.is_empty() {
        sqlx::query("SELECT expert_id, COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued' GROUP BY expert_id")
            .fetch_all(&mut **transaction)
            .await?
    } else {
        sqlx::query(
            "SELECT expert_id, COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued' AND expert_id = $1 \
             GROUP BY expert_id",
        )
        .bind(request.assigned_agent_id.clone())
        .fetch_all(&mut **transaction)
        .await?
    };
    let mut queued = HashMap::new();
    for row in rows {
        let expert: String = row.try_get("expert_id")?;
        let waiting: i64 = row.try_get("waiting")?;
        queued.insert(expert, u32::try_from(waiting).unwrap_or(u32::MAX));
    }
    Ok(queued)
}

/// Resolves the task's place in the queue, if it has one; true if it had.
pub(super) async fn resolve_queued(
    transaction: &mut Tx,
    task_id: &str,
    state: &str,
    decision: &Decision,
) -> Result<bool> {
    let result =
        sqlx::query("UPDATE queued_tasks SET state = $2, resolution_json = $3 WHERE task_id = $1 AND state = 'queued'")
            .bind(task_id.to_owned())
            .bind(state.to_owned())
            .bind(to_json(decision)?)
            .execute(&mut **transaction)
            .await?;
    Ok(result.rows_affected() > 0)
}

/// Offers a freed slot of `agent_id` to the oldest task queued for it, if the
/// agent can take it; `None` when nobody waits or the agent cannot.
pub(super) async fn offer_slot(
    transaction: &mut Tx,
    agent_id: &str,
    now: i64,
    changes: &mut Vec<WorkloadChange>,
) -> Result<Option<QueueResolution>> {
    let next = sqlx::query(
        "SELECT task_id, request_json, queued_at FROM queued_tasks WHERE expert_id = $1 AND state = 'queued' \
         ORDER BY queued_at, seq LIMIT 1",
    )
    .bind(agent_id.to_owned())
    .fetch_optional(&mut **transaction)
    .await?;
    let Some(next) = next else { return Ok(None) };
    let queued_task: String = next.try_get("task_id")?;
    let request: DelegationRequest = from_json(&next.try_get::<String, _>("request_json")?)?;
    let queued_at: i64 = next.try_get("queued_at")?;
    let Some(reserved) = reserve_slot(transaction, agent_id, false, now).await? else { return Ok(None) };
    changes.push(reserved);
    // A task handed to a busy agent may still hold its former slot.
    let former = sqlx::query("SELECT agent_id FROM reservations WHERE task_id = $1")
        .bind(queued_task.clone())
        .fetch_optional(&mut **transaction)
        .await?;
    if let Some(former) = former {
        changes.extend(free_slot(transaction, &former.try_get::<String, _>("agent_id")?, now).await?);
    }
    let expert = fetch_agent(transaction, agent_id).await?.ok_or_else(|| Error::Internal("expert vanished".into()))?;
    let decision = queue_offer_decision(&expert, queued_at, now);
    upsert_reservation(transaction, &queued_task, agent_id, now).await?;
    resolve_queued(transaction, &queued_task, "delegated", &decision).await?;
    let delegation_id =
        record(transaction, &queued_task, &request.requester_id, &decision, &request.description, now).await?;
    Ok(Some(QueueResolution { task_id: queued_task, decision, delegation_id }))
}

pub(in crate::store) async fn escalate_stale(store: &SqlStore, now: i64) -> Result<Vec<QueueResolution>> {
    let mut transaction = store.database.begin_write().await?;
    let rows = sqlx::query(
        "SELECT q.task_id, q.expert_id, q.escalate_to, q.request_json, q.expires_at, a.manual_status AS expert_status \
         FROM queued_tasks q LEFT JOIN agents a ON a.id = q.expert_id \
         WHERE q.state = 'queued' AND ((q.expires_at IS NOT NULL AND q.expires_at <= $1) \
         OR a.id IS NULL OR a.manual_status = 'offline') ORDER BY q.queued_at, q.seq",
    )
    .bind(now)
    .fetch_all(&mut *transaction)
    .await?;
    let mut resolutions = Vec::new();
    for row in rows {
        let task_id: String = row.try_get("task_id")?;
        let expert_id: String = row.try_get("expert_id")?;
        let escalate_to: String = row.try_get("escalate_to")?;
        let request: DelegationRequest = from_json(&row.try_get::<String, _>("request_json")?)?;
        let expert_status: Option<String> = row.try_get("expert_status")?;
        let reason = match expert_status.as_deref() {
            None => format!("expert {expert_id} left the roster while the task was queued"),
            Some(status) if status == Status::Offline.as_str() => {
                format!("expert {expert_id} went offline while the task was queued")
            }
            Some(_) => format!(
                "the task waited for {expert_id} longer than a {} task may wait{}",
                request.urgency.as_str(),
                if request.deadline.is_some() { " (or its deadline came)" } else { "" }
            ),
        };
        let senior = if escalate_to.is_empty() { None } else { fetch_agent(&mut transaction, &escalate_to).await? };
        let decision = queue_escalation_decision(&expert_id, senior.as_ref(), &reason);
        resolve_queued(&mut transaction, &task_id, "escalated", &decision).await?;
        let delegation_id =
            record(&mut transaction, &task_id, &request.requester_id, &decision, &request.description, now).await?;
        resolutions.push(QueueResolution { task_id, decision, delegation_id });
    }
    transaction.commit().await?;
    Ok(resolutions)
}

pub(in crate::store) async fn queue_state(store: &SqlStore, task_id: &str) -> Result<QueueState> {
    let row = sqlx::query("SELECT state, resolution_json FROM queued_tasks WHERE task_id = $1")
        .bind(task_id.to_owned())
        .fetch_optional(&store.database.pool)
        .await?
        .ok_or_else(|| Error::not_found(QUEUED_TASK, task_id, format!("task {task_id:?} was never queued")))?;
    let state: String = row.try_get("state")?;
    if state == "queued" {
        return Ok(QueueState::Queued);
    }
    let resolution: Option<String> = row.try_get("resolution_json")?;
    let resolution =
        resolution.ok_or_else(|| Error::Internal(format!("queued task {task_id:?} resolved without a decision")))?;
    Ok(QueueState::Resolved(Box::new(from_json(&resolution)?)))
}

pub(in crate::store) async fn queued_task_count(store: &SqlStore) -> Result<u64> {
    let row = sqlx::query("SELECT COUNT(*) AS waiting FROM queued_tasks WHERE state = 'queued'")
        .fetch_one(&store.database.pool)
        .await?;
    Ok(u64::try_from(row.try_get::<i64, _>("waiting")?).unwrap_or(0))
}
