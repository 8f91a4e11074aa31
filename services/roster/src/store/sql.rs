//! The sqlx implementation of the repository: agents, teams, roles and
//! tokens: agents in `sql/agents.rs`, teams and roles in
//! `sql/organisation.rs`. Import lives in `import.rs`; delegation, queue and
//! audit in `delegation.rs`.

pub(super) mod agents;
mod credentials;
mod delegation;
mod import;
pub(super) mod index;
pub(super) mod organisation;

use muster_runtime::{
    auth::{
        TokenHash,
        directory::{CredentialChange, Position},
    },
    db::{Connections, Database, Migrations, SMALL_PAGES},
};
use std::sync::Arc;

use sqlx::{Any, AssertSqlSafe, Row, Transaction, any::AnyRow};

use super::{AgentQuery, ImportPlan, Store};
use crate::domain::{
    delegation::{DelegationRequest, Settings},
    model::{Agent, AgentField, RoleDefinition, Status, Team},
};
use crate::error::{AGENT, Error, Result};
use index::Index;

static MIGRATIONS: Migrations = Migrations {
    sqlite: &[
        (1, "init", include_str!("../../migrations/sqlite/0001_init.sql")),
        (2, "credentials", include_str!("../../migrations/sqlite/0002_credentials.sql")),
        (3, "agent_versions", include_str!("../../migrations/sqlite/0003_agent_versions.sql")),
        (4, "decision_writes", include_str!("../../migrations/sqlite/0004_decision_writes.sql")),
        (5, "task_durations", include_str!("../../migrations/sqlite/0005_task_durations.sql")),
    ],
    postgres: &[
        (1, "init", include_str!("../../migrations/postgres/0001_init.sql")),
        (2, "credentials", include_str!("../../migrations/postgres/0002_credentials.sql")),
        (3, "agent_versions", include_str!("../../migrations/postgres/0003_agent_versions.sql")),
        (4, "decision_writes", include_str!("../../migrations/postgres/0004_decision_writes.sql")),
        (5, "task_durations", include_str!("../../migrations/postgres/0005_task_durations.sql")),
    ],
};

pub(super) const AGENT_COLUMNS: &str = "id, name, role, team, senior_id, expertise_json, manual_status, \
     current_workload, workload_capacity, availability_until, custom_prompt, llm_config_json, backstory, \
     allow_delegation, max_iterations, average_task_millis";

/// The effective status in SQL, the same rule as `Status::from_workload`.
const STATUS_SQL: &str = "(CASE WHEN manual_status <> '' THEN manual_status \
     WHEN current_workload = 0 THEN 'idle' \
     WHEN current_workload + 1 >= workload_capacity THEN 'busy' ELSE 'active' END)";

/// The roster's store over a SQLite or PostgreSQL pool, with the
/// organisation indexed in memory (see `index.rs`).
#[derive(Debug, Clone)]
pub struct SqlStore {
    database: Database,
    index: Arc<Index>,
    waiting: Arc<std::sync::Mutex<delegation::together::Waiting>>,
}

impl SqlStore {
    /// A store over a pool (not yet migrated).
    pub fn new(database: Database) -> Self {
        Self { database, index: Arc::default(), waiting: Arc::default() }
    }

    /// Connects lazily to `url` (`sqlite://...` or `postgres://...`).
    pub fn connect(url: &str, max_connections: u32) -> Result<Self> {
        // A decision commits a few small rows, in several tables and indexes.
        let connections = Connections { sqlite_page_size: SMALL_PAGES, ..Connections::new(max_connections) };
        let database = Database::connect_lazy_with(url, connections).map_err(|error| match error {
            muster_runtime::Error::Database(error) => Error::Database(error),
            other => Error::Runtime(other),
        })?;
        Ok(Self::new(database))
    }
}

/// A statement written for the pool (`$1`, `$2`, ...) as a native SQLite
/// connection takes it: rusqlite binds by number, `?1` where the pool's SQL
/// has `$1` (a number used twice stays one parameter).
pub(super) fn for_rusqlite(sql: &str) -> String {
    sql.replace('$', "?")
}

pub(super) fn agent_from_row(row: &AnyRow) -> Result<Agent> {
    let expertise_json: String = row.try_get("expertise_json")?;
    let manual_status: String = row.try_get("manual_status")?;
    let manual_status = if manual_status.is_empty() {
        None
    } else {
        Some(
            Status::parse(&manual_status)
                .ok_or_else(|| Error::Internal(format!("bad stored status {manual_status:?}")))?,
        )
    };
    Ok(Agent {
        id: row.try_get("id")?,
        name: row.try_get("name")?,
        role: row.try_get("role")?,
        team: row.try_get("team")?,
        senior_id: row.try_get("senior_id")?,
        expertise: serde_json::from_str(&expertise_json)
            .map_err(|error| Error::Internal(format!("bad stored expertise: {error}")))?,
        manual_status,
        current_workload: to_u32(row.try_get::<i64, _>("current_workload")?),
        workload_capacity: to_u32(row.try_get::<i64, _>("workload_capacity")?),
        availability_until: row.try_get::<Option<i64>, _>("availability_until")?,
        custom_prompt: row.try_get("custom_prompt")?,
        llm_config_json: row.try_get("llm_config_json")?,
        backstory: row.try_get("backstory")?,
        allow_delegation: row.try_get::<i64, _>("allow_delegation")? != 0,
        max_iterations: to_u32(row.try_get::<i64, _>("max_iterations")?),
        average_task_millis: row.try_get::<i64, _>("average_task_millis")?,
    })
}

fn to_u32(value: i64) -> u32 {
    u32::try_from(value.max(0)).unwrap_or(u32::MAX)
}

pub(super) async fn fetch_agent(transaction: &mut Transaction<'static, Any>, id: &str) -> Result<Option<Agent>> {
    Ok(fetch_versioned(transaction, id).await?.map(|(agent, _)| agent))
}

/// An agent and its row's version (raised by one at every change of the row).
pub(super) async fn fetch_versioned(
    transaction: &mut Transaction<'static, Any>,
    id: &str,
) -> Result<Option<(Agent, i64)>> {
    let row = sqlx::query(AssertSqlSafe(format!("SELECT {AGENT_COLUMNS}, version FROM agents WHERE id = $1")))
        .bind(id.to_owned())
        .fetch_optional(&mut **transaction)
        .await?;
    row.map(|row| Ok((agent_from_row(&row)?, row.try_get("version")?))).transpose()
}

/// The row an agent's change left, read in its transaction.
async fn stored(transaction: &mut Transaction<'static, Any>, id: &str) -> Result<(Agent, i64)> {
    fetch_versioned(transaction, id).await?.ok_or_else(|| Error::Internal("agent vanished".into()))
}

async fn exists(transaction: &mut Transaction<'static, Any>, sql: &'static str, key: &str) -> Result<bool> {
    Ok(sqlx::query(sql).bind(key.to_owned()).fetch_optional(&mut **transaction).await?.is_some())
}

/// NOT_FOUND for the agent `id`.
fn agent_not_found(id: &str) -> Error {
    Error::not_found(AGENT, id, format!("agent {id:?} is not in the roster"))
}

impl Store for SqlStore {
    async fn migrate(&self) -> Result<()> {
        self.database.migrate(&MIGRATIONS).await.map_err(|error| Error::Internal(format!("migrating: {error}")))
    }

    async fn insert_agent(&self, agent: &Agent, token: &TokenHash, now: i64) -> Result<Agent> {
        agents::insert_agent(self, agent, token, now).await
    }

    async fn get_agent(&self, id: &str) -> Result<Agent> {
        agents::get_agent(self, id).await
    }

    async fn list_agents(&self, query: &AgentQuery) -> Result<Vec<Agent>> {
        agents::list_agents(self, query).await
    }

    async fn update_agent(&self, agent: &Agent, fields: &[AgentField], now: i64) -> Result<Agent> {
        agents::update_agent(self, agent, fields, now).await
    }

    async fn remove_agent(&self, id: &str, now: i64) -> Result<()> {
        agents::remove_agent(self, id, now).await
    }

    async fn set_status(
        &self,
        id: &str,
        status: Option<Status>,
        availability_until: Option<i64>,
        now: i64,
    ) -> Result<Agent> {
        agents::set_status(self, id, status, availability_until, now).await
    }

    async fn put_team(&self, team: &Team, now: i64) -> Result<Team> {
        organisation::put_team(self, team, now).await
    }

    async fn list_teams(&self) -> Result<Vec<Team>> {
        organisation::list_teams(self).await
    }

    async fn remove_team(&self, name: &str) -> Result<()> {
        organisation::remove_team(self, name).await
    }

    async fn put_role(&self, role: &RoleDefinition, now: i64) -> Result<RoleDefinition> {
        organisation::put_role(self, role, now).await
    }

    async fn get_role(&self, name: &str) -> Result<RoleDefinition> {
        organisation::get_role(self, name).await
    }

    async fn list_roles(&self) -> Result<Vec<RoleDefinition>> {
        organisation::list_roles(self).await
    }

    async fn remove_role(&self, name: &str) -> Result<()> {
        organisation::remove_role(self, name).await
    }

    async fn agent_by_token(&self, token: &TokenHash) -> Result<Option<Agent>> {
        match credentials::agent_of(&self.database.pool, token).await? {
            Some(agent_id) => match self.get_agent(&agent_id).await {
                Ok(agent) => Ok(Some(agent)),
                Err(Error::NotFound { .. }) => Ok(None),
                Err(error) => Err(error),
            },
            None => Ok(None),
        }
    }

    async fn replace_token(&self, agent_id: &str, token: Option<&TokenHash>, now: i64) -> Result<()> {
        let mut transaction = self.database.begin_write().await?;
        let role: Option<String> = sqlx::query_scalar("SELECT role FROM agents WHERE id = $1")
            .bind(agent_id.to_owned())
            .fetch_optional(&mut *transaction)
            .await?;
        let Some(role) = role else {
            return Err(agent_not_found(agent_id));
        };
        let revision = credentials::next_revision(&mut transaction).await?;
        credentials::revoke_all(&mut transaction, agent_id, revision, now).await?;
        if let Some(token) = token {
            let new = [(agent_id, role.as_str(), token)];
            credentials::issue(&mut transaction, self.database.backend, &new, revision, now).await?;
        }
        transaction.commit().await?;
        Ok(())
    }

    async fn credential_changes_after(&self, position: Position, limit: usize) -> Result<Vec<CredentialChange>> {
        credentials::changes_after(&self.database, position, limit).await
    }

    async fn import(&self, plan: &ImportPlan, now: i64) -> Result<Vec<String>> {
        import::import(self, plan, now).await
    }

    async fn indexed_agent(&self, id: &str) -> Result<Arc<Agent>> {
        let index = self.index().await?;
        if let Some(agent) = index.agent(id) {
            return Ok(agent);
        }
        // Perhaps created through another replica since the last refresh.
        self.reread_agents(&[id.to_owned()]).await?;
        index.agent(id).ok_or_else(|| agent_not_found(id))
    }

    async fn indexed_agents(&self, query: &AgentQuery) -> Result<Vec<Arc<Agent>>> {
        Ok(self.index().await?.list(query))
    }

    async fn refresh_index(&self, now: i64) -> Result<super::IndexChanges> {
        self.index_refresh(now).await
    }

    async fn delegate(
        &self,
        request: &DelegationRequest,
        now: i64,
        settings: Settings,
    ) -> Result<super::DelegationOutcome> {
        delegation::together::delegate(self, request, now, settings).await
    }

    async fn delegate_batch(
        &self,
        requests: &[DelegationRequest],
        now: i64,
        settings: Settings,
    ) -> Result<Vec<super::DelegationOutcome>> {
        delegation::delegate_batch(self, requests, now, settings).await
    }

    async fn release_task(&self, task_id: &str, now: i64) -> Result<super::ReleaseOutcome> {
        delegation::release::release_task(self, task_id, now).await
    }

    async fn place_together(
        &self,
        releases: &[String],
        requests: &[DelegationRequest],
        now: i64,
        settings: Settings,
    ) -> Result<Option<(Vec<super::ReleaseOutcome>, Vec<super::DelegationOutcome>)>> {
        delegation::place_natively(self, releases, requests, now, settings).await
    }

    async fn release_tasks(&self, task_ids: &[String], now: i64) -> Result<Vec<super::ReleaseOutcome>> {
        delegation::release::release_tasks(self, task_ids, now).await
    }

    async fn escalate_stale(&self, now: i64) -> Result<Vec<super::QueueResolution>> {
        delegation::queue::escalate_stale(self, now).await
    }

    async fn queue_state(&self, task_id: &str) -> Result<super::QueueState> {
        delegation::queue::queue_state(self, task_id).await
    }

    async fn queued_task_count(&self) -> Result<u64> {
        delegation::queue::queued_task_count(self).await
    }

    async fn list_delegations(&self, query: &super::DelegationQuery) -> Result<Vec<super::DelegationRecord>> {
        delegation::audit::list_delegations(self, query).await
    }

    async fn fold_audit_trail(&self) -> Result<u64> {
        delegation::audit::fold_audit_trail(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::MIGRATIONS;

    /// A file made by an older roster keeps its reservations when they
    /// are stored in task order.
    #[test]
    fn decision_writes_migration_keeps_the_reservations() {
        let connection = rusqlite::Connection::open_in_memory().unwrap();
        let (before, after): (Vec<_>, Vec<_>) = MIGRATIONS.sqlite.iter().partition(|(version, _, _)| *version < 4);
        for (_, _, sql) in &before {
            connection.execute_batch(sql).unwrap();
        }
        connection.execute_batch("INSERT INTO reservations VALUES ('task-1', 'dev', 7), ('task-2', 'ops', 8)").unwrap();
        for (_, _, sql) in &after {
            connection.execute_batch(sql).unwrap();
        }
        let kept: Vec<(String, String, i64)> = connection
            .prepare("SELECT task_id, agent_id, reserved_at FROM reservations ORDER BY task_id")
            .unwrap()
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(kept, vec![("task-1".into(), "dev".into(), 7), ("task-2".into(), "ops".into(), 8)]);
        let clustered: String = connection
            .query_row("SELECT sql FROM sqlite_schema WHERE name = 'reservations'", [], |row| row.get(0))
            .unwrap();
        assert!(clustered.contains("WITHOUT ROWID"), "{clustered}");
    }
}
