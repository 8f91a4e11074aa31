//! Memory versions, in SQL: one row per memory (role '' is the global
//! memory) whose version every added or removed entry raises in the same
//! transaction. A running execution asks for the version before each
//! assignment and reads the entries again only when it moved: one indexed
//! lookup in the common case, where nothing changed.

use std::collections::BTreeSet;

use muster_runtime::db::Database;
use sqlx::Row as _;

use crate::Result;

/// Raises the version of each memory of `roles`, once each, in the order of
/// their names: transactions that raise several never wait for each other
/// in a cycle (PostgreSQL holds each row until the commit).
pub(super) async fn raise_versions<'a>(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    roles: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    for role in roles.into_iter().collect::<BTreeSet<_>>() {
        sqlx::query(
            "INSERT INTO memory_versions (role, version) VALUES ($1, 1) \
             ON CONFLICT (role) DO UPDATE SET version = memory_versions.version + 1",
        )
        .bind(role.to_owned())
        .execute(&mut **transaction)
        .await?;
    }
    Ok(())
}

/// Removes an entry and raises its memory's version; whether it existed.
pub(super) async fn forget(database: &Database, id: &str) -> Result<bool> {
    let mut transaction = database.pool.begin().await?;
    let deleted = sqlx::query("DELETE FROM memory WHERE id = $1 RETURNING role")
        .bind(id.to_owned())
        .fetch_optional(&mut *transaction)
        .await?;
    let Some(deleted) = deleted else { return Ok(false) };
    let role: String = deleted.try_get("role")?;
    raise_versions(&mut transaction, [role.as_str()]).await?;
    transaction.commit().await?;
    Ok(true)
}

/// The global memory's version plus `role`'s: both only grow, so the sum
/// moves exactly when either does.
pub(super) async fn version(database: &Database, role: &str) -> Result<i64> {
    let row = sqlx::query(
        "SELECT CAST(COALESCE(SUM(version), 0) AS BIGINT) AS version FROM memory_versions WHERE role IN ($1, $2)",
    )
    .bind(String::new())
    .bind(role.to_owned())
    .fetch_one(&database.reads)
    .await?;
    Ok(row.try_get("version")?)
}
