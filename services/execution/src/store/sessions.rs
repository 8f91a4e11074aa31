//! Session assignments, the versions of the permission matrix, and the use
//! of a process's budget.

use std::collections::BTreeMap;

use sqlx::{Any, Row, Transaction};

use super::Store;
use crate::{
    Error, Result,
    domain::authority::{Matrix, RoleAssignment},
};

/// Creates or replaces an agent's assignment in a session.
pub(super) async fn upsert_assignment(
    transaction: &mut Transaction<'_, Any>,
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

/// A stored matrix version whose document no longer parses is corrupt data.
fn matrix_from_row(row: &sqlx::any::AnyRow) -> Result<Matrix> {
    let version: i64 = row.try_get("version")?;
    Matrix::parse(version as u32, row.try_get("source")?, row.try_get("created_at")?, row.try_get("created_by")?)
        .map(|(matrix, _)| matrix)
        .map_err(|_| Error::Storage(format!("permission matrix version {version} no longer parses")))
}

/// What a process used within a period: cost, tokens and executions.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Usage {
    pub(crate) cost: f64,
    pub(crate) tokens: u64,
    pub(crate) runs: u64,
}

impl Store {
    /// The assignments of a session, by agent id.
    pub(crate) async fn assignments(&self, execution_id: &str) -> Result<BTreeMap<String, RoleAssignment>> {
        let rows = sqlx::query("SELECT * FROM session_assignments WHERE execution_id = $1 ORDER BY agent_id")
            .bind(execution_id.to_owned())
            .fetch_all(&self.database.pool)
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

    /// The newest version of the permission matrix, if any was stored.
    pub(crate) async fn latest_matrix(&self) -> Result<Option<Matrix>> {
        let row = sqlx::query("SELECT * FROM permission_matrices ORDER BY version DESC LIMIT 1")
            .fetch_optional(&self.database.pool)
            .await?;
        row.as_ref().map(matrix_from_row).transpose()
    }

    /// One version of the permission matrix.
    pub(crate) async fn matrix(&self, version: u32) -> Result<Option<Matrix>> {
        let row = sqlx::query("SELECT * FROM permission_matrices WHERE version = $1")
            .bind(i64::from(version))
            .fetch_optional(&self.database.pool)
            .await?;
        row.as_ref().map(matrix_from_row).transpose()
    }

    /// Versions below `before` (all with `None`), newest first, at most `limit`.
    pub(crate) async fn matrices(&self, before: Option<u32>, limit: u32) -> Result<Vec<Matrix>> {
        let rows = sqlx::query("SELECT * FROM permission_matrices WHERE version < $1 ORDER BY version DESC LIMIT $2")
            .bind(before.map_or(i64::MAX, i64::from))
            .bind(i64::from(limit))
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(matrix_from_row).collect()
    }

    /// Stores `matrix` as the next version (its `version` field is ignored)
    /// and returns it with its version. Of two concurrent stores racing for a
    /// version, the second fails on the primary key and may be retried.
    pub(crate) async fn put_matrix(&self, matrix: Matrix) -> Result<Matrix> {
        let mut transaction = self.database.pool.begin().await?;
        let latest: Option<i64> =
            sqlx::query_scalar("SELECT MAX(version) FROM permission_matrices").fetch_one(&mut *transaction).await?;
        let version = latest.unwrap_or(0) + 1;
        sqlx::query(
            "INSERT INTO permission_matrices (version, source, created_at, created_by) VALUES ($1, $2, $3, $4)",
        )
        .bind(version)
        .bind(matrix.source.clone())
        .bind(matrix.created_at)
        .bind(matrix.created_by.clone())
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(Matrix { version: version as u32, ..matrix })
    }

    /// What the executions of `process_name` started at or after `since` used.
    pub(crate) async fn process_usage(&self, process_name: &str, since: i64) -> Result<Usage> {
        let row = sqlx::query(
            "SELECT COUNT(DISTINCT e.id) AS runs, CAST(COALESCE(SUM(s.cost), 0) AS DOUBLE PRECISION) AS cost, \
             CAST(COALESCE(SUM(s.tokens_used), 0) AS BIGINT) AS tokens \
             FROM executions e LEFT JOIN steps s ON s.execution_id = e.id \
             WHERE e.process_name = $1 AND e.started_at >= $2",
        )
        .bind(process_name.to_owned())
        .bind(since)
        .fetch_one(&self.database.pool)
        .await?;
        Ok(Usage {
            cost: row.try_get("cost")?,
            tokens: row.try_get::<i64, _>("tokens")? as u64,
            runs: row.try_get::<i64, _>("runs")? as u64,
        })
    }
}
