//! The index read from the database: loaded once, the rows a commit
//! changed read again when their versions skip, and the background refresh
//! that finds other replicas' changes (recent rows by `updated_at`, and
//! every [`FULL_CHECK_EVERY`] refreshes a pass over every id and version).

use std::{collections::HashSet, sync::Arc};

use sqlx::{AssertSqlSafe, Row};
use tokio_stream::StreamExt as _;

use super::{Index, WorkloadChange, team_from_row};
use crate::error::Result;
use crate::store::{
    IndexChanges,
    sql::{AGENT_COLUMNS, SqlStore, agent_from_row},
};

/// How far back, in ms, a refresh looks for changed rows beyond its last
/// run: transactions in flight and clocks a little apart.
const REFRESH_LOOKBACK_MILLIS: i64 = 5_000;

/// Every this many refreshes, one compares every id and version.
pub const FULL_CHECK_EVERY: u64 = 60;

/// Most ids one statement reads back.
const IDS_PER_STATEMENT: usize = 500;

/// `AGENT_COLUMNS` and the row's version.
fn versioned_columns() -> String {
    format!("{AGENT_COLUMNS}, version")
}

impl SqlStore {
    /// Loads the index once, on first use.
    pub(in crate::store::sql) async fn index(&self) -> Result<&Index> {
        self.index
            .loaded
            .get_or_try_init(|| async {
                self.full_check().await?;
                tracing::debug!(agents = self.index.read().agents.len(), "roster index loaded");
                Ok::<(), crate::error::Error>(())
            })
            .await?;
        Ok(&self.index)
    }

    /// Reads these agents again and takes what the database holds (removing
    /// those it no longer has).
    pub(in crate::store) async fn reread_agents(&self, ids: &[String]) -> Result<()> {
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            let list = muster_runtime::db::placeholder_list(self.database.backend, 1, chunk.len());
            let sql = format!("SELECT {} FROM agents WHERE id IN ({list})", versioned_columns());
            let query = chunk.iter().fold(sqlx::query(AssertSqlSafe(sql)), |query, id| query.bind(id.clone()));
            let rows = query.fetch_all(&self.database.pool).await?;
            let mut found = HashSet::new();
            let mut state = self.index.write();
            for row in &rows {
                let agent = agent_from_row(row)?;
                found.insert(agent.id.clone());
                state.put(agent, row.try_get("version")?);
            }
            for id in chunk.iter().filter(|id| !found.contains(*id)) {
                state.remove(id);
            }
        }
        Ok(())
    }

    /// Takes committed workload changes, reading again the rows they cannot settle.
    pub(in crate::store) async fn apply_workloads(&self, changes: &[WorkloadChange]) {
        let stale = self.index.apply_workloads(changes);
        self.reread_after_commit(&stale).await;
    }

    /// [`Self::reread_agents`] once a change is committed: the change stands
    /// whatever happens here, so a failure is logged, not returned (the next
    /// refresh takes those rows).
    pub(in crate::store) async fn reread_after_commit(&self, ids: &[String]) {
        if let Err(error) = self.reread_agents(ids).await {
            tracing::warn!(%error, agents = ids.len(), "reading changed agents again failed; the next refresh takes them");
        }
    }

    /// Takes what other writers of the database changed since the last
    /// refresh (see the module's documentation), or loads the index if it is
    /// not yet; `now` is the service's clock.
    pub(in crate::store) async fn index_refresh(&self, now: i64) -> Result<IndexChanges> {
        if self.index.loaded.get().is_none() {
            // The first refresh loads it, so the first Delegate need not.
            self.index().await?;
            return Ok(IndexChanges::default());
        }
        let count = self.index.refreshes.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if count.is_multiple_of(FULL_CHECK_EVERY) {
            return self.full_check().await;
        }
        // The first refresh looks a minute back: the load came shortly before.
        let since = match self.index.last_refresh.swap(now, std::sync::atomic::Ordering::Relaxed) {
            0 => now.saturating_sub(60_000),
            last => last,
        }
        .saturating_sub(REFRESH_LOOKBACK_MILLIS);
        let differing = self.index.differing(self.versions(Some(since)).await?);
        self.reread_agents(&differing).await?;
        let teams = sqlx::query("SELECT name, description, lead_agent_id FROM teams WHERE updated_at >= $1")
            .bind(since)
            .fetch_all(&self.database.pool)
            .await?;
        let mut state = self.index.write();
        for row in &teams {
            let team = team_from_row(row)?;
            state.teams.insert(team.name.clone(), team);
        }
        Ok(IndexChanges { changed: differing, removed: Vec::new() })
    }

    /// The id and version of every agent whose row changed at or after
    /// `since` (every agent for `None`). On a SQLite file, read on the
    /// native reader ([`muster_runtime::db::NativeSqlite::read`]): through
    /// the pool, the thousands of rows a busy second changes would hold
    /// the one writers' connection, and every decision waiting for it, for
    /// a hand-off per row.
    async fn versions(&self, since: Option<i64>) -> Result<Vec<(String, i64)>> {
        let sql = match since {
            Some(_) => "SELECT id, version FROM agents WHERE updated_at >= $1",
            None => "SELECT id, version FROM agents",
        };
        if let Some(native) = self.database.native() {
            return native.read(|connection| {
                let mut statement = connection.prepare_cached(&crate::store::sql::for_rusqlite(sql))?;
                if let Some(since) = since {
                    statement.raw_bind_parameter(1, since)?;
                }
                let mut rows = statement.raw_query();
                let mut versions = Vec::new();
                while let Some(row) = rows.next()? {
                    versions.push((row.get(0)?, row.get(1)?));
                }
                Ok(versions)
            });
        }
        let rows = since
            .into_iter()
            .fold(sqlx::query(sql), |query, since| query.bind(since))
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(|row| Ok((row.try_get("id")?, row.try_get("version")?))).collect()
    }

    /// Compares every id and version with the database and takes every
    /// difference, removals included; the first one loads the index.
    async fn full_check(&self) -> Result<IndexChanges> {
        let mut changes = IndexChanges::default();
        let known: HashSet<Arc<str>> = self.index.read().agents.keys().cloned().collect();
        let teams_known: HashSet<String> = self.index.read().teams.keys().cloned().collect();
        if known.is_empty() {
            // Loading: every row in full, one at a time (a list of 100,000
            // rows would double the memory the index takes).
            let sql = format!("SELECT {} FROM agents", versioned_columns());
            let mut rows = sqlx::query(AssertSqlSafe(sql)).fetch(&self.database.pool);
            while let Some(row) = rows.try_next().await? {
                let agent = agent_from_row(&row)?;
                self.index.write().put(agent, row.try_get("version")?);
            }
        } else {
            // Every agent held may have been removed elsewhere: no row at all is an answer too.
            let rows = self.versions(None).await?;
            let present: HashSet<String> = rows.iter().map(|(id, _)| id.clone()).collect();
            changes.changed = self.index.differing(rows);
            self.reread_agents(&changes.changed).await?;
            let mut state = self.index.write();
            for id in known.iter().filter(|id| !present.contains(&***id)) {
                state.remove(id);
                changes.removed.push(id.to_string());
            }
        }
        let teams =
            sqlx::query("SELECT name, description, lead_agent_id FROM teams").fetch_all(&self.database.pool).await?;
        let mut state = self.index.write();
        let mut present = HashSet::new();
        for row in &teams {
            let team = team_from_row(row)?;
            present.insert(team.name.clone());
            state.teams.insert(team.name.clone(), team);
        }
        for name in teams_known.iter().filter(|name| !present.contains(*name)) {
            state.teams.remove(name);
        }
        Ok(changes)
    }
}
