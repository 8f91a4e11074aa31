//! Agent credentials in SQL: the `tokens` table and the revision counter
//! (see `migrations/*/0002_credentials.sql`). Each function runs inside the
//! caller's transaction, so a credential changes with the agent it belongs to.

use muster_runtime::{
    auth::{
        TokenHash,
        directory::{CredentialChange, Position},
    },
    db::{Backend, placeholders},
};
use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use crate::error::{Error, Result};

/// Takes the next revision. The counter row stays locked until the
/// transaction ends, so revisions commit in order.
pub(super) async fn next_revision(transaction: &mut Transaction<'static, Any>) -> Result<i64> {
    let revision: i64 =
        sqlx::query_scalar("UPDATE credential_revision SET revision = revision + 1 WHERE id = 1 RETURNING revision")
            .fetch_one(&mut **transaction)
            .await?;
    Ok(revision)
}

/// Most tokens one INSERT records.
const TOKENS_PER_STATEMENT: usize = 500;

/// A new good token: (agent id, the agent's role, the token's hash).
pub(super) type NewToken<'a> = (&'a str, &'a str, &'a TokenHash);

/// Records new good tokens, all under `revision`.
pub(super) async fn issue(
    transaction: &mut Transaction<'static, Any>,
    backend: Backend,
    tokens: &[NewToken<'_>],
    revision: i64,
    now: i64,
) -> Result<()> {
    for chunk in tokens.chunks(TOKENS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO tokens (token_hash, agent_id, role, active, revision, issued_at) VALUES {}",
            placeholders(backend, chunk.len(), 6)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (agent_id, role, token) in chunk {
            query = query
                .bind(token.to_hex())
                .bind((*agent_id).to_owned())
                .bind((*role).to_owned())
                .bind(1_i64)
                .bind(revision)
                .bind(now);
        }
        query.execute(&mut **transaction).await?;
    }
    Ok(())
}

/// Revokes every good token of `agent_id`; returns how many there were.
pub(super) async fn revoke_all(
    transaction: &mut Transaction<'static, Any>,
    agent_id: &str,
    revision: i64,
    now: i64,
) -> Result<u64> {
    let result =
        sqlx::query("UPDATE tokens SET active = 0, revision = $2, revoked_at = $3 WHERE agent_id = $1 AND active = 1")
            .bind(agent_id.to_owned())
            .bind(revision)
            .bind(now)
            .execute(&mut **transaction)
            .await?;
    Ok(result.rows_affected())
}

/// Records a new role on the good tokens of `agent_id`, when it changed.
pub(super) async fn set_role(transaction: &mut Transaction<'static, Any>, agent_id: &str, role: &str) -> Result<()> {
    let stale: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM tokens WHERE agent_id = $1 AND active = 1 AND role <> $2")
            .bind(agent_id.to_owned())
            .bind(role.to_owned())
            .fetch_one(&mut **transaction)
            .await?;
    if stale == 0 {
        return Ok(());
    }
    let revision = next_revision(transaction).await?;
    sqlx::query("UPDATE tokens SET role = $2, revision = $3 WHERE agent_id = $1 AND active = 1")
        .bind(agent_id.to_owned())
        .bind(role.to_owned())
        .bind(revision)
        .execute(&mut **transaction)
        .await?;
    Ok(())
}

/// The agent id a good token belongs to.
pub(super) async fn agent_of(pool: &sqlx::AnyPool, token: &TokenHash) -> Result<Option<String>> {
    let agent: Option<String> = sqlx::query_scalar("SELECT agent_id FROM tokens WHERE token_hash = $1 AND active = 1")
        .bind(token.to_hex())
        .fetch_optional(pool)
        .await?;
    Ok(agent)
}

/// Credential changes after a position, in (revision, token) order.
const CHANGES_AFTER_SQL: &str = "SELECT token_hash, agent_id, role, active, revision FROM tokens \
     WHERE revision > $1 OR (revision = $1 AND token_hash > $2) ORDER BY revision, token_hash LIMIT CAST($3 AS BIGINT)";

/// The changes after `position`, at most `limit`. On a SQLite file, read on
/// the native reader ([`muster_runtime::db::NativeSqlite::read`]): through
/// the pool, loading the tokens of a large roster at start would hold the
/// one writers' connection, page after page, while decisions wait for it.
pub(super) async fn changes_after(
    database: &muster_runtime::db::Database,
    position: Position,
    limit: usize,
) -> Result<Vec<CredentialChange>> {
    let revision = i64::try_from(position.revision).unwrap_or(i64::MAX);
    let token = position.token.map(TokenHash::to_hex).unwrap_or_default();
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    if let Some(native) = database.native() {
        return native.read(|connection| {
            let mut statement = connection.prepare_cached(&crate::store::sql::for_rusqlite(CHANGES_AFTER_SQL))?;
            let mut rows = statement.query(rusqlite::params![revision, token, limit])?;
            let mut changes = Vec::new();
            while let Some(row) = rows.next()? {
                changes.push(change(row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)?);
            }
            Ok(changes)
        });
    }
    let rows = sqlx::query(CHANGES_AFTER_SQL).bind(revision).bind(token).bind(limit).fetch_all(&database.pool).await?;
    rows.iter()
        .map(|row| {
            change(
                row.try_get("token_hash")?,
                row.try_get("agent_id")?,
                row.try_get("role")?,
                row.try_get("active")?,
                row.try_get("revision")?,
            )
        })
        .collect()
}

/// A stored token row as a change.
fn change(hash: String, agent_id: String, role: String, active: i64, revision: i64) -> Result<CredentialChange> {
    Ok(CredentialChange {
        token: TokenHash::from_hex(&hash)
            .ok_or_else(|| Error::Internal(format!("a stored token hash is not 64 hex digits: {hash:?}")))?,
        agent_id,
        role,
        active: active != 0,
        revision: u64::try_from(revision).unwrap_or_default(),
    })
}
