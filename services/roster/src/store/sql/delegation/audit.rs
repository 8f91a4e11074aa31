//! The audit trail in the database: a record of every decision, folded
//! into one per task once it is settled, and listed with its filters.

use muster_runtime::db::Backend;
use sqlx::{AssertSqlSafe, Row};

use super::Tx;
use super::{from_json, to_json};
use crate::domain::delegation::Decision;
use crate::error::Result;
use crate::store::{DelegationQuery, DelegationRecord, sql::SqlStore};

/// The columns of an audit record, in `delegation_log` and `delegations` alike.
macro_rules! record_columns {
    () => {
        "id, task_id, requester_id, primary_agent_id, decision, tier, decision_json, description, decided_at"
    };
}
pub(in crate::store) const RECORD_COLUMNS: &str = record_columns!();

/// Appends a decision's audit record to `delegation_log`, in the decision's
/// transaction; [`fold_audit_trail`] moves it into `delegations`.
pub(super) async fn record(
    transaction: &mut Tx,
    task_id: &str,
    requester_id: &str,
    decision: &Decision,
    description: &str,
    now: i64,
) -> Result<String> {
    let id = uuid::Uuid::now_v7().to_string();
    sqlx::query(concat!(
        "INSERT INTO delegation_log (",
        record_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
    ))
    .bind(id.clone())
    .bind(task_id.to_owned())
    .bind(requester_id.to_owned())
    .bind(decision.primary_agent_id.clone())
    .bind(decision.kind.as_str().to_owned())
    .bind(decision.tier.as_str().to_owned())
    .bind(to_json(decision)?)
    .bind(description.to_owned())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(id)
}

/// Most audit records one transaction of [`fold_audit_trail`] moves.
const FOLD_BATCH: usize = 512;

/// Moves the audit records in `delegation_log` into `delegations`, oldest
/// first, [`FOLD_BATCH`] per transaction, until none that was there when it
/// began is left (another replica may be moving some: it waits for those).
/// Returns how many this call moved.
pub(in crate::store) async fn fold_audit_trail(store: &SqlStore) -> Result<u64> {
    let newest: Option<i64> =
        sqlx::query_scalar("SELECT MAX(seq) FROM delegation_log").fetch_one(&store.database.pool).await?;
    let Some(newest) = newest else { return Ok(0) };
    let mut moved = 0;
    loop {
        let (batch, left) = match store.database.native() {
            Some(native) => {
                native.write(&store.database.pool, |transaction| fold_natively(transaction, newest)).await?
            }
            None => fold_in_pool(store, newest).await?,
        };
        moved += batch;
        if !left {
            return Ok(moved);
        }
        // Decisions waiting for the writer take it between two batches.
        tokio::task::yield_now().await;
    }
}

/// On SQLite: the oldest records up to `$1` into `delegations`, then out of the log.
fn fold_sqlite_sql() -> [String; 2] {
    let oldest = format!("SELECT seq FROM delegation_log WHERE seq <= $1 ORDER BY seq LIMIT {FOLD_BATCH}");
    [
        format!(
            "INSERT INTO delegations ({RECORD_COLUMNS}) SELECT {RECORD_COLUMNS} FROM delegation_log \
             WHERE seq IN ({oldest}) ORDER BY seq"
        ),
        format!("DELETE FROM delegation_log WHERE seq IN ({oldest})"),
    ]
}

/// Whether the log still holds records up to `$1`.
const FOLD_LEFT_SQL: &str = "SELECT COUNT(*) FROM (SELECT 1 FROM delegation_log WHERE seq <= $1 LIMIT 1) AS left_over";

/// One batch of [`fold_audit_trail`] on a SQLite file's native connection:
/// how many moved, and whether more are left.
fn fold_natively(transaction: &rusqlite::Connection, newest: i64) -> Result<(u64, bool)> {
    let [insert, delete] = fold_sqlite_sql();
    let moved = transaction.prepare_cached(&crate::store::sql::for_rusqlite(&insert))?.execute([newest])?;
    transaction.prepare_cached(&crate::store::sql::for_rusqlite(&delete))?.execute([newest])?;
    let left: i64 = transaction
        .prepare_cached(&crate::store::sql::for_rusqlite(FOLD_LEFT_SQL))?
        .query_row([newest], |row| row.get(0))?;
    Ok((moved as u64, left > 0))
}

/// One batch of [`fold_audit_trail`] through the pool. On PostgreSQL one
/// statement moves the records, locking them first: a replica moving the
/// same records meanwhile is waited for, and each record moves once.
async fn fold_in_pool(store: &SqlStore, newest: i64) -> Result<(u64, bool)> {
    let mut transaction = store.database.begin_write().await?;
    let moved = match store.database.backend {
        Backend::Sqlite => {
            let [insert, delete] = fold_sqlite_sql();
            let moved = sqlx::query(AssertSqlSafe(insert)).bind(newest).execute(&mut *transaction).await?;
            sqlx::query(AssertSqlSafe(delete)).bind(newest).execute(&mut *transaction).await?;
            moved.rows_affected()
        }
        Backend::Postgres => {
            let sql = format!(
                "WITH moved AS (DELETE FROM delegation_log WHERE seq IN \
                 (SELECT seq FROM delegation_log WHERE seq <= $1 ORDER BY seq LIMIT {FOLD_BATCH} FOR UPDATE) \
                 RETURNING seq, {RECORD_COLUMNS}) \
                 INSERT INTO delegations ({RECORD_COLUMNS}) SELECT {RECORD_COLUMNS} FROM moved ORDER BY seq"
            );
            sqlx::query(AssertSqlSafe(sql)).bind(newest).execute(&mut *transaction).await?.rows_affected()
        }
    };
    let left: i64 = sqlx::query_scalar(FOLD_LEFT_SQL).bind(newest).fetch_one(&mut *transaction).await?;
    transaction.commit().await?;
    Ok((moved, left > 0))
}

pub(in crate::store) async fn list_delegations(
    store: &SqlStore,
    query: &DelegationQuery,
) -> Result<Vec<DelegationRecord>> {
    // Every decision answered before this call is in the trail it reads.
    fold_audit_trail(store).await?;
    let mut conditions = vec!["1 = 1".to_owned()];
    let mut text_binds: Vec<String> = Vec::new();
    let mut time_binds: Vec<i64> = Vec::new();
    if !query.agent_id.is_empty() {
        text_binds.push(query.agent_id.clone());
        let index = text_binds.len();
        conditions.push(format!("(requester_id = ${index} OR primary_agent_id = ${index})"));
    }
    if !query.task_id.is_empty() {
        text_binds.push(query.task_id.clone());
        conditions.push(format!("task_id = ${}", text_binds.len()));
    }
    if let Some(since) = query.since {
        time_binds.push(since);
        conditions.push(format!("decided_at >= ${}", text_binds.len() + time_binds.len()));
    }
    if let Some(until) = query.until {
        time_binds.push(until);
        conditions.push(format!("decided_at < ${}", text_binds.len() + time_binds.len()));
    }
    if let Some((decided_at, seq)) = query.after {
        time_binds.extend([decided_at, decided_at, seq]);
        let first = text_binds.len() + time_binds.len() - 2;
        conditions.push(format!("(decided_at > ${first} OR (decided_at = ${} AND seq > ${}))", first + 1, first + 2));
    }
    let limit = if query.limit == 0 { 1000 } else { query.limit.min(10_000) };
    let sql = format!(
        "SELECT id, task_id, requester_id, decision_json, description, decided_at, seq FROM delegations WHERE {} ORDER BY decided_at, seq LIMIT {limit}",
        conditions.join(" AND ")
    );
    let mut statement = sqlx::query(AssertSqlSafe(sql));
    for value in text_binds {
        statement = statement.bind(value);
    }
    for value in time_binds {
        statement = statement.bind(value);
    }
    let rows = statement.fetch_all(&store.database.pool).await?;
    rows.iter()
        .map(|row| {
            Ok(DelegationRecord {
                id: row.try_get("id")?,
                task_id: row.try_get("task_id")?,
                requester_id: row.try_get("requester_id")?,
                decision: from_json(&row.try_get::<String, _>("decision_json")?)?,
                decided_at: row.try_get("decided_at")?,
                description: row.try_get("description")?,
                position: (row.try_get("decided_at")?, row.try_get("seq")?),
            })
        })
        .collect()
}
