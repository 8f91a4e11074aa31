//! Replicas, in SQL: joining with a lease, renewing it, adopting the
//! executions of replicas whose lease lapsed, leaving, and who drives what.

use std::time::Duration;

use muster_runtime::db::Backend;
use sqlx::{AssertSqlSafe, Row, any::AnyRow};

use super::{SqlStore, database_now};
use crate::store::Replica;
use crate::{Error, Result};

pub(super) async fn join<'a>(store: &'a SqlStore, replica: &'a Replica, lease: Duration) -> Result<()> {
    let joined_already = || Error::Storage("the store joined the replicas already".to_owned());
    if store.replica.get().is_some() {
        return Err(joined_already());
    }
    let backend = store.database.backend;
    let now = database_now(backend);
    let mut transaction = store.database.pool.begin().await?;
    if let Some((identity, _)) = replica.id.split_once(crate::store::INCARNATION) {
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
        let prefix = format!("{identity}{}", crate::store::INCARNATION);
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
    store.replica.set(replica.id.as_str().into()).map_err(|_| joined_already())
}

pub(super) async fn renew(store: &SqlStore, lease: Duration) -> Result<bool> {
    let now = database_now(store.database.backend);
    let renewed = sqlx::query(AssertSqlSafe(format!(
        "UPDATE replicas SET expires_at = {now} + $1 WHERE id = $2 AND expires_at > {now}"
    )))
    .bind(lease_millis(lease))
    .bind(store.replica()?.to_owned())
    .execute(&store.database.pool)
    .await?;
    Ok(renewed.rows_affected() == 1)
}

pub(super) async fn adopt(store: &SqlStore) -> Result<Vec<String>> {
    let replica = store.replica()?;
    let backend = store.database.backend;
    let now = database_now(backend);
    let mut transaction = store.database.pool.begin().await?;
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
}

pub(super) async fn leave(store: &SqlStore) -> Result<()> {
    let replica = store.replica()?.to_owned();
    let mut transaction = store.database.pool.begin().await?;
    sqlx::query("UPDATE executions SET owner = NULL WHERE owner = $1 AND status IN ('running', 'paused')")
        .bind(replica.clone())
        .execute(&mut *transaction)
        .await?;
    sqlx::query("DELETE FROM replicas WHERE id = $1").bind(replica).execute(&mut *transaction).await?;
    transaction.commit().await?;
    Ok(())
}

pub(super) async fn driver_of<'a>(store: &'a SqlStore, execution_id: &'a str) -> Result<Option<Replica>> {
    let now = database_now(store.database.backend);
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT r.id, r.url, r.address FROM executions e JOIN replicas r ON r.id = e.owner \
         WHERE e.id = $1 AND e.status IN ('running', 'paused') AND r.expires_at > {now}"
    )))
    .bind(execution_id.to_owned())
    .fetch_optional(&store.database.reads)
    .await?;
    row.as_ref().map(replica_from_row).transpose()
}

pub(super) async fn peers(store: &SqlStore) -> Result<Vec<Replica>> {
    let replica = store.replica()?;
    let now = database_now(store.database.backend);
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT id, url, address FROM replicas WHERE expires_at > {now} AND id <> $1 AND url <> '' ORDER BY id"
    )))
    .bind(replica.to_owned())
    .fetch_all(&store.database.reads)
    .await?;
    rows.iter().map(replica_from_row).collect()
}

pub(super) async fn leads(store: &SqlStore) -> Result<bool> {
    let replica = store.replica()?;
    let now = database_now(store.database.backend);
    let eldest: Option<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT id FROM replicas WHERE expires_at > {now} ORDER BY joined_at, id LIMIT 1"
    )))
    .fetch_optional(&store.database.reads)
    .await?;
    Ok(eldest.as_deref() == Some(replica))
}

/// Milliseconds of a lease, for the database.
fn lease_millis(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

fn replica_from_row(row: &AnyRow) -> Result<Replica> {
    Ok(Replica { id: row.try_get("id")?, url: row.try_get("url")?, address: row.try_get("address")? })
}

/// The advisory lock appends to the event log take on PostgreSQL ("must",
/// "log"); the two-key form, a key space apart from the admission locks'.
/// `muster_hold_lease` takes it for every transaction of a replica (a store
/// that has not joined the replicas is its process's only writer), and a
/// takeover takes it too, so the two take turns.
const LOG_LOCK: (i32, i32) = (0x6d75_7374, 0x006c_6f67);
