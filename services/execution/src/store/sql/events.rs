//! The event log, in SQL: an execution's events, the log in commit order,
//! and the publishers' cursors.

use sqlx::Row;

use super::SqlStore;
use crate::Result;
use crate::store::LogEntry;

pub(super) async fn last_event_sequence<'a>(store: &'a SqlStore, execution_id: &'a str) -> Result<u64> {
    let last: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(sequence), 0) FROM events WHERE execution_id = $1")
        .bind(execution_id.to_owned())
        .fetch_one(&store.database.reads)
        .await?;
    Ok(last as u64)
}

pub(super) async fn events_after<'a>(
    store: &'a SqlStore,
    execution_id: &'a str,
    after_sequence: u64,
    limit: u32,
) -> Result<Vec<Vec<u8>>> {
    let rows = sqlx::query(
        "SELECT event FROM events WHERE execution_id = $1 AND sequence > $2 ORDER BY sequence LIMIT CAST($3 AS BIGINT)",
    )
    .bind(execution_id.to_owned())
    .bind(after_sequence as i64)
    .bind(i64::from(limit))
    .fetch_all(&store.database.reads)
    .await?;
    rows.iter().map(|row| Ok(row.try_get("event")?)).collect()
}

pub(super) async fn log_after(store: &SqlStore, after_position: i64, limit: u32) -> Result<Vec<LogEntry>> {
    const LOG_AFTER: &str = "SELECT id, event FROM events WHERE id > $1 ORDER BY id LIMIT CAST($2 AS BIGINT)";
    // Read after every commit of the engine: on SQLite, without a
    // hand-off to a pool's connection thread.
    if let Some(native) = store.database.native() {
        return native.read(|connection| {
            let mut statement = connection.prepare_cached(LOG_AFTER)?;
            let rows = statement
                .query_map(rusqlite::params![after_position, i64::from(limit)], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<Vec<LogEntry>>>()?)
        });
    }
    let rows =
        sqlx::query(LOG_AFTER).bind(after_position).bind(i64::from(limit)).fetch_all(&store.database.reads).await?;
    rows.iter().map(|row| Ok((row.try_get("id")?, row.try_get("event")?))).collect()
}

pub(super) async fn log_end(store: &SqlStore) -> Result<i64> {
    let end: Option<i64> = sqlx::query_scalar("SELECT MAX(id) FROM events").fetch_one(&store.database.reads).await?;
    Ok(end.unwrap_or(0))
}

pub(super) async fn cursor<'a>(store: &'a SqlStore, name: &'a str) -> Result<i64> {
    let position: Option<i64> = sqlx::query_scalar("SELECT position FROM event_cursors WHERE name = $1")
        .bind(name.to_owned())
        .fetch_optional(&store.database.reads)
        .await?;
    Ok(position.unwrap_or(0))
}

pub(super) async fn advance_cursor<'a>(store: &'a SqlStore, name: &'a str, position: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO event_cursors (name, position) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE \
         SET position = excluded.position WHERE event_cursors.position < excluded.position",
    )
    .bind(name.to_owned())
    .bind(position)
    .execute(&store.database.pool)
    .await?;
    Ok(())
}
