//! Memory, in SQL: entries appended (once per id), listed newest first and
//! forgotten, and one version row per memory (role '' is the global
//! memory) whose version every added or removed entry raises in the same
//! transaction. A running execution asks for the version before each
//! assignment and reads the entries again only when it moved: one indexed
//! lookup in the common case, where nothing changed.

use std::collections::BTreeSet;

use muster_runtime::db::Database;
use sqlx::{Row, any::AnyRow};

use super::{SqlStore, memory};
use crate::{Result, domain::memory::MemoryEntry};

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
pub(super) async fn forget(database: &Database, versions: &Versions, id: &str) -> Result<bool> {
    let mut transaction = database.pool.begin().await?;
    let deleted = sqlx::query("DELETE FROM memory WHERE id = $1 RETURNING role")
        .bind(id.to_owned())
        .fetch_optional(&mut *transaction)
        .await?;
    let Some(deleted) = deleted else { return Ok(false) };
    let role: String = deleted.try_get("role")?;
    raise_versions(&mut transaction, [role.as_str()]).await?;
    let committed = transaction.commit().await;
    versions.forget();
    committed?;
    Ok(true)
}

/// How the version of the global memory and `role`'s is read: their sum.
const VERSION: &str =
    "SELECT CAST(COALESCE(SUM(version), 0) AS BIGINT) AS version FROM memory_versions WHERE role IN ($1, $2)";

/// The global memory's version plus `role`'s: both only grow, so the sum
/// moves exactly when either does.
pub(super) async fn version(database: &Database, versions: &Versions, role: &str) -> Result<i64> {
    if let Some(version) = version_at_hand(database, versions, role) {
        return version;
    }
    let row = sqlx::query(VERSION).bind(String::new()).bind(role.to_owned()).fetch_one(&database.reads).await?;
    Ok(row.try_get("version")?)
}

/// [`version`] on a SQLite file, for nearly every assignment: what
/// `versions` keeps, else read on the calling thread (an indexed lookup of
/// two rows) without a hand-off to a pool's connection thread, and kept.
pub(super) fn version_at_hand(database: &Database, versions: &Versions, role: &str) -> Option<Result<i64>> {
    let native = database.native()?;
    let generation = {
        let kept = versions.lock();
        if let Some(version) = kept.by_role.get(role) {
            return Some(Ok(*version));
        }
        kept.generation
    };
    let version = native.read(|connection| {
        Ok(connection.prepare_cached(VERSION)?.query_row(rusqlite::params!["", role], |row| row.get(0))?)
    });
    if let Ok(version) = &version {
        let mut kept = versions.lock();
        // Kept only if no commit raised a version while it was read.
        if kept.generation == generation {
            kept.by_role.insert(role.to_owned(), *version);
        }
    }
    Some(version)
}

/// The memory versions read from a SQLite file, by role. The file has one
/// writer, this process, which forgets them all once a commit that raises
/// one is made and before anyone learns of it; a read that a commit
/// overtook is not kept.
#[derive(Debug, Default)]
pub(super) struct Versions(std::sync::Mutex<Kept>);

#[derive(Debug, Default)]
struct Kept {
    /// How many times they were forgotten.
    generation: u64,
    by_role: std::collections::HashMap<String, i64>,
}

impl Versions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A commit raised versions (or may have): none kept is current.
    pub(super) fn forget(&self) {
        let mut kept = self.lock();
        kept.generation += 1;
        kept.by_role.clear();
    }
}

pub(super) async fn append_memory(store: &SqlStore, entry: MemoryEntry) -> Result<MemoryEntry> {
    let stored = || async {
        let row = sqlx::query("SELECT * FROM memory WHERE id = $1")
            .bind(entry.id.clone())
            .fetch_optional(&store.database.pool)
            .await?;
        row.as_ref().map(memory_from_row).transpose()
    };
    if let Some(existing) = stored().await? {
        return Ok(existing);
    }
    let mut transaction = store.database.pool.begin().await?;
    if let Err(error) = insert_memory(&mut transaction, &entry).await {
        drop(transaction);
        return stored().await?.ok_or(error);
    }
    memory::raise_versions(&mut transaction, [entry.role.as_str()]).await?;
    let committed = transaction.commit().await;
    store.memory_versions.forget();
    committed?;
    Ok(entry)
}

pub(super) async fn memory<'a>(
    store: &'a SqlStore,
    role: &'a str,
    before: Option<&'a (i64, String)>,
    limit: u32,
) -> Result<Vec<MemoryEntry>> {
    let rows = match before {
        None => {
            sqlx::query(
                "SELECT * FROM memory WHERE role = $1 ORDER BY created_at DESC, id DESC LIMIT CAST($2 AS BIGINT)",
            )
            .bind(role.to_owned())
            .bind(i64::from(limit))
            .fetch_all(&store.database.reads)
            .await?
        }
        Some((created_at, id)) => {
            sqlx::query(
                "SELECT * FROM memory WHERE role = $1 AND (created_at < $2 OR (created_at = $3 AND id < $4)) \
                 ORDER BY created_at DESC, id DESC LIMIT CAST($5 AS BIGINT)",
            )
            .bind(role.to_owned())
            .bind(*created_at)
            .bind(*created_at)
            .bind(id.clone())
            .bind(i64::from(limit))
            .fetch_all(&store.database.reads)
            .await?
        }
    };
    rows.iter().map(memory_from_row).collect()
}

pub(super) async fn insert_memory(
    transaction: &mut sqlx::Transaction<'_, sqlx::Any>,
    entry: &MemoryEntry,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO memory (id, role, text, author, execution_id, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
    )
    .bind(entry.id.clone())
    .bind(entry.role.clone())
    .bind(entry.text.clone())
    .bind(entry.author.clone())
    .bind(entry.execution_id.clone())
    .bind(entry.created_at)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

fn memory_from_row(row: &AnyRow) -> Result<MemoryEntry> {
    Ok(MemoryEntry {
        id: row.try_get("id")?,
        role: row.try_get("role")?,
        text: row.try_get("text")?,
        author: row.try_get("author")?,
        execution_id: row.try_get("execution_id")?,
        created_at: row.try_get("created_at")?,
    })
}
