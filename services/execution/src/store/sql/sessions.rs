//! Permission matrices, in SQL: the versions a team session's authority
//! is checked against.

use sqlx::{Row, any::AnyRow};

use super::SqlStore;
use crate::{Error, Result, domain::authority::Matrix};

pub(super) async fn latest_matrix(store: &SqlStore) -> Result<Option<Matrix>> {
    let row = sqlx::query(LATEST_MATRIX).fetch_optional(&store.database.reads).await?;
    row.as_ref().map(matrix_from_row).transpose()
}

pub(super) async fn matrix(store: &SqlStore, version: u32) -> Result<Option<Matrix>> {
    let row = sqlx::query("SELECT * FROM permission_matrices WHERE version = $1")
        .bind(i64::from(version))
        .fetch_optional(&store.database.reads)
        .await?;
    row.as_ref().map(matrix_from_row).transpose()
}

pub(super) async fn matrices(store: &SqlStore, before: Option<u32>, limit: u32) -> Result<Vec<Matrix>> {
    let rows = sqlx::query(
        "SELECT * FROM permission_matrices WHERE version < $1 ORDER BY version DESC LIMIT CAST($2 AS BIGINT)",
    )
    .bind(before.map_or(i64::MAX, i64::from))
    .bind(i64::from(limit))
    .fetch_all(&store.database.reads)
    .await?;
    rows.iter().map(matrix_from_row).collect()
}

pub(super) async fn put_matrix(store: &SqlStore, matrix: Matrix) -> Result<Matrix> {
    // Replicas putting a matrix at once may both take the same next
    // version: the one refused by the key takes the one after.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let put = async {
            let mut transaction = store.database.pool.begin().await?;
            let latest: Option<i64> =
                sqlx::query_scalar("SELECT MAX(version) FROM permission_matrices").fetch_one(&mut *transaction).await?;
            let version = latest.unwrap_or(0) + 1;
            sqlx::query(
                "INSERT INTO permission_matrices (version, source, created_at, created_by) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(version)
            .bind(matrix.source.clone())
            .bind(matrix.created_at)
            .bind(matrix.created_by.clone())
            .execute(&mut *transaction)
            .await?;
            transaction.commit().await?;
            Ok::<_, sqlx::Error>(version)
        };
        match put.await {
            Ok(version) => return Ok(Matrix { version: version as u32, ..matrix }),
            Err(sqlx::Error::Database(error)) if error.is_unique_violation() && attempts < 10 => continue,
            Err(error) => return Err(error.into()),
        }
    }
}

pub(super) async fn first_matrix(store: &SqlStore, matrix: Matrix) -> Result<Matrix> {
    let mut transaction = store.database.pool.begin().await?;
    sqlx::query(
        "INSERT INTO permission_matrices (version, source, created_at, created_by) VALUES (1, $1, $2, $3) \
         ON CONFLICT (version) DO NOTHING",
    )
    .bind(matrix.source.clone())
    .bind(matrix.created_at)
    .bind(matrix.created_by.clone())
    .execute(&mut *transaction)
    .await?;
    let latest = sqlx::query(LATEST_MATRIX).fetch_one(&mut *transaction).await?;
    transaction.commit().await?;
    matrix_from_row(&latest)
}

/// The newest version of the permission matrix.
const LATEST_MATRIX: &str = "SELECT * FROM permission_matrices ORDER BY version DESC LIMIT 1";

/// A stored matrix version whose document no longer parses is corrupt data.
fn matrix_from_row(row: &AnyRow) -> Result<Matrix> {
    let version: i64 = row.try_get("version")?;
    Matrix::parse(version as u32, row.try_get("source")?, row.try_get("created_at")?, row.try_get("created_by")?)
        .map(|(matrix, _)| matrix)
        .map_err(|_| Error::Storage(format!("permission matrix version {version} no longer parses")))
}
