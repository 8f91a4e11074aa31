//! Slots in the database: reserving one atomically (under capacity, or over
//! it for an urgent call), the reservations a decision writes, and releases,
//! which free slots and offer each to the queue.

use muster_runtime::db::Backend;
use sqlx::{Any, AssertSqlSafe, Row};

use super::Tx;
use crate::error::Result;
use crate::store::sql::index::WorkloadChange;

/// Runs a workload update that returns `id, version, current_workload`.
pub(super) async fn workload_update(
    transaction: &mut Tx,
    statement: sqlx::query::Query<'_, Any, sqlx::any::AnyArguments>,
) -> Result<Option<WorkloadChange>> {
    statement.fetch_optional(&mut **transaction).await?.as_ref().map(workload_change).transpose()
}

/// The workload change a row of `id, version, current_workload` tells.
pub(in crate::store) fn workload_change(row: &sqlx::any::AnyRow) -> Result<WorkloadChange> {
    let workload: i64 = row.try_get("current_workload")?;
    Ok((row.try_get("id")?, row.try_get("version")?, u32::try_from(workload.max(0)).unwrap_or(u32::MAX)))
}

/// Takes one slot below capacity of agent `$1`, at time `$2`.
pub(super) const RESERVE_SLOT_SQL: &str = "UPDATE agents SET current_workload = current_workload + 1, updated_at = $2, \
     version = version + 1 \
     WHERE id = $1 AND current_workload < workload_capacity AND manual_status NOT IN ('offline', 'busy') \
     RETURNING id, version, current_workload";

/// Who holds a slot for task `$1` (`held_by`), and whether it waits in the
/// queue (`queued`, a count).
pub(super) const HELD_AND_QUEUED_SQL: &str = "SELECT (SELECT agent_id FROM reservations WHERE task_id = $1) AS held_by, \
     (SELECT COUNT(*) FROM queued_tasks WHERE task_id = $1 AND state = 'queued') AS queued";

/// Takes the one slot over capacity of agent `$1`, which only an urgent task
/// may take, and only while the agent is exactly at capacity: of any number
/// of concurrent calls, one takes it (6/5), none goes further (7/5).
const RESERVE_SLOT_OVER_CAPACITY_SQL: &str = "UPDATE agents SET current_workload = current_workload + 1, \
     updated_at = $2, version = version + 1 \
     WHERE id = $1 AND current_workload = workload_capacity AND manual_status NOT IN ('offline', 'busy') \
     RETURNING id, version, current_workload";

/// Takes one slot of `agent_id` if it has one, or with `over_capacity` its
/// one slot over capacity; `None` when someone else took it.
pub(super) async fn reserve_slot(
    transaction: &mut Tx,
    agent_id: &str,
    over_capacity: bool,
    now: i64,
) -> Result<Option<WorkloadChange>> {
    let sql = if over_capacity { RESERVE_SLOT_OVER_CAPACITY_SQL } else { RESERVE_SLOT_SQL };
    workload_update(transaction, sqlx::query(sql).bind(agent_id.to_owned()).bind(now)).await
}

/// Gives back one slot of `agent_id`.
pub(super) async fn free_slot(transaction: &mut Tx, agent_id: &str, now: i64) -> Result<Option<WorkloadChange>> {
    workload_update(
        transaction,
        sqlx::query(
            "UPDATE agents SET current_workload = current_workload - 1, updated_at = $2, version = version + 1 \
             WHERE id = $1 AND current_workload > 0 RETURNING id, version, current_workload",
        )
        .bind(agent_id.to_owned())
        .bind(now),
    )
    .await
}

/// Many tasks' reservations, `(task, agent holding its slot, since)` each,
/// in multi-row statements.
pub(in crate::store) async fn upsert_reservations(
    transaction: &mut Tx,
    backend: Backend,
    rows: &[(&str, &str, i64)],
) -> Result<()> {
    for chunk in muster_runtime::db::in_statements(rows) {
        let query = chunk.iter().fold(
            sqlx::query(AssertSqlSafe(reservations_sql(backend, chunk.len()))),
            |query, (task_id, agent_id, at)| query.bind((*task_id).to_owned()).bind((*agent_id).to_owned()).bind(*at),
        );
        query.execute(&mut **transaction).await?;
    }
    Ok(())
}

/// [`upsert_reservations`] in a transaction on a SQLite file's native
/// connection.
pub(in crate::store) fn upsert_reservations_natively(
    transaction: &rusqlite::Connection,
    rows: &[(&str, &str, i64)],
) -> Result<()> {
    for chunk in muster_runtime::db::in_statements(rows) {
        let mut statement = transaction.prepare_cached(&reservations_sql(Backend::Sqlite, chunk.len()))?;
        for (row, (task_id, agent_id, at)) in chunk.iter().enumerate() {
            statement.raw_bind_parameter(row * 3 + 1, *task_id)?;
            statement.raw_bind_parameter(row * 3 + 2, *agent_id)?;
            statement.raw_bind_parameter(row * 3 + 3, *at)?;
        }
        statement.raw_execute()?;
    }
    Ok(())
}

/// Upserts `rows` reservations, 3 parameters each.
fn reservations_sql(backend: Backend, rows: usize) -> String {
    format!(
        "INSERT INTO reservations (task_id, agent_id, reserved_at) VALUES {} \
         ON CONFLICT (task_id) DO UPDATE SET agent_id = excluded.agent_id, reserved_at = excluded.reserved_at",
        muster_runtime::db::placeholders(backend, rows, 3)
    )
}

/// The task's one reservation: `agent_id` holds a slot for it.
pub(super) async fn upsert_reservation(transaction: &mut Tx, task_id: &str, agent_id: &str, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO reservations (task_id, agent_id, reserved_at) VALUES ($1, $2, $3) \
         ON CONFLICT (task_id) DO UPDATE SET agent_id = excluded.agent_id, reserved_at = excluded.reserved_at",
    )
    .bind(task_id.to_owned())
    .bind(agent_id.to_owned())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}
