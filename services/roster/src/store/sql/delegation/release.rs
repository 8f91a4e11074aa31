//! Releases in the database: a task done or given up frees its slot, and
//! each freed slot is offered to the queue in the same transaction.

use std::collections::{HashMap, HashSet};

use muster_runtime::db::Backend;
use sqlx::{AssertSqlSafe, Row};

use super::queue::offer_slot;
use super::reservation::workload_change;
use crate::error::Result;
use crate::store::{
    QueueResolution, ReleaseOutcome,
    sql::{SqlStore, index::WorkloadChange},
};

pub(in crate::store) async fn release_task(store: &SqlStore, task_id: &str, now: i64) -> Result<ReleaseOutcome> {
    let mut outcomes = release_tasks(store, std::slice::from_ref(&task_id.to_owned()), now).await?;
    Ok(outcomes.pop().unwrap_or_default())
}

/// What a release transaction did.
#[derive(Default)]
pub(in crate::store::sql) struct Released {
    /// Who held a slot for each task.
    held: HashMap<String, String>,
    /// How long each task held its slot, in ms.
    held_for: HashMap<String, i64>,
    /// The agents whose observed task duration changed, with the new average.
    averages: Vec<(String, i64)>,
    /// The tasks that left the queue (a task that ends while still queued
    /// is never offered a slot).
    left_queue: HashSet<String>,
    /// The queued tasks each agent's freed slots went to, oldest first.
    offers: HashMap<String, std::collections::VecDeque<QueueResolution>>,
    /// The workloads it changed.
    changes: Vec<WorkloadChange>,
}

/// Frees the slots of many tasks in one transaction, each as [`release_task`]
/// would: the reservations and queue entries go in multi-row statements,
/// each agent's freed slots in one update, and then, one at a time, to the
/// oldest tasks queued for that agent. A fan-out's ends cost a few
/// statements instead of four per task.
///
/// On a SQLite file, a release whose agents have no task waiting for them
/// (nearly every one) runs on the calling thread
/// ([`muster_runtime::db::NativeSqlite`]), like the Delegate calls decided
/// together: besides sparing a thread hand-off per statement, one
/// connection writing keeps SQLite's page cache, which a transaction
/// discards whenever another connection wrote since its last one.
pub(in crate::store) async fn release_tasks(
    store: &SqlStore,
    task_ids: &[String],
    now: i64,
) -> Result<Vec<ReleaseOutcome>> {
    let (first_mention, first_mentions) = first_mentions(task_ids);
    let natively = match store.database.native() {
        Some(native) => {
            native
                .write(&store.database.pool, |transaction| release_natively(transaction, &first_mentions, now))
                .await?
        }
        None => None,
    };
    let released = match natively {
        Some(released) => released,
        None => release_in_pool(store, &first_mentions, now).await?,
    };
    Ok(outcomes(store, task_ids, &first_mention, released).await)
}

/// Whether each of `task_ids` is its first mention (a task named twice is
/// released at its first), and the tasks at their first mention.
pub(in crate::store::sql) fn first_mentions(task_ids: &[String]) -> (Vec<bool>, Vec<&String>) {
    let mut distinct = HashSet::with_capacity(task_ids.len());
    let first_mention: Vec<bool> = task_ids.iter().map(|task_id| distinct.insert(task_id.as_str())).collect();
    let first_mentions =
        task_ids.iter().zip(&first_mention).filter(|(_, first)| **first).map(|(task_id, _)| task_id).collect();
    (first_mention, first_mentions)
}

/// What a committed release of `task_ids` did for each of them, its
/// changes applied to the organisation in memory.
pub(in crate::store::sql) async fn outcomes(
    store: &SqlStore,
    task_ids: &[String],
    first_mention: &[bool],
    mut released: Released,
) -> Vec<ReleaseOutcome> {
    store.apply_workloads(&released.changes).await;
    store.index.apply_averages(&released.averages);
    task_ids
        .iter()
        .zip(first_mention)
        .map(|(task_id, first)| {
            if !first {
                return ReleaseOutcome::default();
            }
            let agent_id = released.held.get(task_id).cloned();
            let offered = agent_id.as_deref().and_then(|agent| released.offers.get_mut(agent)?.pop_front());
            let queue_changed = released.left_queue.contains(task_id) || offered.is_some();
            ReleaseOutcome { agent_id, offered, queue_changed }
        })
        .collect()
}

/// Each agent's freed slots, with how long those tasks took on average
/// (ms; 0 when unknown), in the order of the agents' ids: two releases
/// that free slots of the same agents change their rows in the same order,
/// so neither waits for the other while holding what it waits for.
fn freed_slots(released: &Released, first_mentions: &[&String]) -> Vec<(String, u32, i64)> {
    let mut freed: Vec<(&str, u32, i64)> = Vec::new();
    for task_id in first_mentions {
        if let Some(agent_id) = released.held.get(task_id.as_str()) {
            let took = released.held_for.get(task_id.as_str()).copied().unwrap_or(0).max(0);
            match freed.iter_mut().find(|(agent, _, _)| *agent == agent_id) {
                Some((_, count, total)) => {
                    *count += 1;
                    *total = total.saturating_add(took);
                }
                None => freed.push((agent_id, 1, took)),
            }
        }
    }
    freed.sort_unstable_by_key(|(agent, _, _)| *agent);
    freed.into_iter().map(|(agent, count, total)| (agent.to_owned(), count, total / i64::from(count))).collect()
}

/// Gives back `$2` slots of agent `$1` at time `$3`, whose tasks took `$4`
/// ms on average: the agent's observed task duration moves a fifth of the
/// way towards it (or starts at it).
const FREE_SLOTS_SQL: &str = "UPDATE agents SET current_workload = \
     CASE WHEN current_workload > $2 THEN current_workload - $2 ELSE 0 END, \
     average_task_millis = CASE WHEN $4 <= 0 THEN average_task_millis \
     WHEN average_task_millis <= 0 THEN $4 ELSE (average_task_millis * 4 + $4) / 5 END, \
     updated_at = $3, version = version + 1 WHERE id = $1 \
     RETURNING id, version, current_workload, average_task_millis";

/// [`release_tasks`]'s transaction through the pool, offering the freed
/// slots to the tasks queued for them.
async fn release_in_pool(store: &SqlStore, first_mentions: &[&String], now: i64) -> Result<Released> {
    let backend = store.database.backend;
    let mut transaction = store.database.begin_write().await?;
    let mut released = Released::default();
    for chunk in muster_runtime::db::in_statements(first_mentions) {
        let list = muster_runtime::db::placeholder_list(backend, 1, chunk.len());
        let sql =
            format!("DELETE FROM reservations WHERE task_id IN ({list}) RETURNING task_id, agent_id, reserved_at");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            let task_id: String = row.try_get("task_id")?;
            released.held_for.insert(task_id.clone(), now - row.try_get::<i64, _>("reserved_at")?);
            released.held.insert(task_id, row.try_get("agent_id")?);
        }
        let sql = format!("DELETE FROM queued_tasks WHERE state = 'queued' AND task_id IN ({list}) RETURNING task_id");
        let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, task_id| query.bind((*task_id).clone()));
        for row in query.fetch_all(&mut *transaction).await? {
            released.left_queue.insert(row.try_get("task_id")?);
        }
    }
    for (agent_id, count, took) in freed_slots(&released, first_mentions) {
        let row = sqlx::query(FREE_SLOTS_SQL)
            .bind(agent_id.clone())
            .bind(i64::from(count))
            .bind(now)
            .bind(took)
            .fetch_optional(&mut *transaction)
            .await?;
        if let Some(row) = row {
            released.changes.push(workload_change(&row)?);
            released.averages.push((agent_id.clone(), row.try_get("average_task_millis")?));
        }
        let mut offered = std::collections::VecDeque::new();
        for _ in 0..count {
            match offer_slot(&mut transaction, &agent_id, now, &mut released.changes).await? {
                Some(resolution) => offered.push_back(resolution),
                None => break,
            }
        }
        released.offers.insert(agent_id, offered);
    }
    transaction.commit().await?;
    Ok(released)
}

/// [`release_tasks`]'s transaction on a SQLite file's native connection;
/// `None`, having written nothing, when a task waits in the queue for an
/// agent whose slot it frees (the pool's path offers it the slot).
pub(in crate::store::sql) fn release_natively(
    transaction: &rusqlite::Connection,
    first_mentions: &[&String],
    now: i64,
) -> Result<Option<Released>> {
    let mut released = Released::default();
    for chunk in muster_runtime::db::in_statements(first_mentions) {
        let list = muster_runtime::db::placeholder_list(Backend::Sqlite, 1, chunk.len());
        let mut waiting = transaction.prepare_cached(&format!(
            "SELECT 1 FROM reservations r JOIN queued_tasks q ON q.expert_id = r.agent_id AND q.state = 'queued' \
             WHERE r.task_id IN ({list}) LIMIT 1"
        ))?;
        for (position, task_id) in chunk.iter().enumerate() {
            waiting.raw_bind_parameter(position + 1, task_id.as_str())?;
        }
        if waiting.raw_query().next()?.is_some() {
            return Ok(None);
        }
    }
    for chunk in muster_runtime::db::in_statements(first_mentions) {
        let list = muster_runtime::db::placeholder_list(Backend::Sqlite, 1, chunk.len());
        for (sql, taken) in [
            (
                format!("DELETE FROM reservations WHERE task_id IN ({list}) RETURNING task_id, agent_id, reserved_at"),
                true,
            ),
            (
                format!("DELETE FROM queued_tasks WHERE state = 'queued' AND task_id IN ({list}) RETURNING task_id"),
                false,
            ),
        ] {
            let mut statement = transaction.prepare_cached(&sql)?;
            for (position, task_id) in chunk.iter().enumerate() {
                statement.raw_bind_parameter(position + 1, task_id.as_str())?;
            }
            let mut rows = statement.raw_query();
            while let Some(row) = rows.next()? {
                if taken {
                    let task_id: String = row.get(0)?;
                    released.held_for.insert(task_id.clone(), now - row.get::<_, i64>(2)?);
                    released.held.insert(task_id, row.get(1)?);
                } else {
                    released.left_queue.insert(row.get(0)?);
                }
            }
        }
    }
    let mut statement = transaction.prepare_cached(&crate::store::sql::for_rusqlite(FREE_SLOTS_SQL))?;
    for (agent_id, count, took) in freed_slots(&released, first_mentions) {
        let mut rows = statement.query(rusqlite::params![agent_id, i64::from(count), now, took])?;
        if let Some(row) = rows.next()? {
            let workload: i64 = row.get(2)?;
            released.changes.push((row.get(0)?, row.get(1)?, u32::try_from(workload.max(0)).unwrap_or(u32::MAX)));
            released.averages.push((agent_id, row.get(3)?));
        }
    }
    drop(statement);
    Ok(Some(released))
}
