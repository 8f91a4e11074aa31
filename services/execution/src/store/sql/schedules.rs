//! Schedules, in SQL: the due ones, the next due time, listing, and a
//! missed run skipped.

use sqlx::{Row, any::AnyRow};

use super::SqlStore;
use crate::{Error, Result, domain::schedule::ScheduleState};

pub(super) async fn due_schedules(store: &SqlStore, now: i64, limit: u32) -> Result<Vec<ScheduleState>> {
    let rows =
        sqlx::query("SELECT * FROM schedules WHERE next_fire_at <= $1 ORDER BY next_fire_at LIMIT CAST($2 AS BIGINT)")
            .bind(now)
            .bind(i64::from(limit))
            .fetch_all(&store.database.pool)
            .await?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn next_due_schedule(store: &SqlStore) -> Result<Option<i64>> {
    Ok(sqlx::query_scalar::<_, Option<i64>>("SELECT MIN(next_fire_at) FROM schedules")
        .fetch_one(&store.database.pool)
        .await?)
}

pub(super) async fn schedules<'a>(store: &'a SqlStore, after: &'a str, limit: u32) -> Result<Vec<ScheduleState>> {
    let rows =
        sqlx::query("SELECT * FROM schedules WHERE process_name > $1 ORDER BY process_name LIMIT CAST($2 AS BIGINT)")
            .bind(after.to_owned())
            .bind(i64::from(limit))
            .fetch_all(&store.database.reads)
            .await?;
    rows.iter().map(schedule_from_row).collect()
}

pub(super) async fn skip_schedule<'a>(store: &'a SqlStore, process_name: &'a str, due: i64, next: i64) -> Result<bool> {
    let moved = sqlx::query("UPDATE schedules SET next_fire_at = $1 WHERE process_name = $2 AND next_fire_at = $3")
        .bind(next)
        .bind(process_name.to_owned())
        .bind(due)
        .execute(&store.database.pool)
        .await?;
    Ok(moved.rows_affected() == 1)
}

fn schedule_from_row(row: &AnyRow) -> Result<ScheduleState> {
    let missed: String = row.try_get("missed")?;
    Ok(ScheduleState {
        process_name: row.try_get("process_name")?,
        cron: row.try_get("cron")?,
        time_zone: row.try_get("time_zone")?,
        missed: muster_format::MissedRuns::parse(&missed)
            .ok_or_else(|| Error::Storage(format!("unknown missed runs policy '{missed}' in the database")))?,
        next_fire_at: row.try_get("next_fire_at")?,
        last_fired_at: row.try_get("last_fired_at")?,
        last_execution_id: row.try_get("last_execution_id")?,
    })
}
