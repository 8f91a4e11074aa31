//! The sqlx implementation of the repository: agents, teams, roles and
//! tokens. Import lives in `import.rs`; delegation, queue and audit in
//! `delegation.rs`.

use muster_runtime::{
    auth::{
        TokenHash,
        directory::{CredentialChange, Position},
    },
    db::{Backend, Connections, Database, Migrations, SMALL_PAGES, placeholders},
};
use std::sync::Arc;

use sqlx::{Any, AssertSqlSafe, Row, Transaction, any::AnyRow};

use super::{AgentQuery, ImportPlan, Store, credentials, index::Index};
use crate::domain::{
    delegation::{DelegationRequest, Settings},
    model::{Agent, AgentField, RoleDefinition, Status, Team},
};
use crate::error::{AGENT, Error, ROLE_DEFINITION, Result, TEAM};

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
    pub(super) database: Database,
    pub(super) index: Arc<Index>,
    pub(super) waiting: Arc<std::sync::Mutex<super::together::Waiting>>,
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

/// NOT_FOUND for the role definition `name`.
fn role_not_found(name: &str) -> Error {
    Error::not_found(ROLE_DEFINITION, name, format!("role definition {name:?} does not exist"))
}

/// The refusals of an agent's references, the same from every path that checks them.
pub(super) fn missing_team(agent: &Agent) -> Error {
    Error::invalid(
        "agent.team",
        format!("agent.team: team {:?} does not exist; create it with PutTeam first", agent.team),
    )
}

pub(super) fn missing_senior(agent: &Agent) -> Error {
    Error::invalid(
        "agent.senior_id",
        format!("agent.senior_id: senior {:?} does not exist in the roster", agent.senior_id),
    )
}

pub(super) fn hierarchy_loop(chain: &[impl AsRef<str>]) -> Error {
    let chain: Vec<&str> = chain.iter().map(AsRef::as_ref).collect();
    Error::invalid("agent.senior_id", format!("agent.senior_id: the hierarchy would loop: {}", chain.join(" -> ")))
}

/// Checks the references of an agent: its team exists, its senior exists and
/// the hierarchy stays free of cycles.
async fn check_agent_references(transaction: &mut Transaction<'static, Any>, agent: &Agent) -> Result<()> {
    if !agent.team.is_empty() && !exists(transaction, "SELECT 1 FROM teams WHERE name = $1", &agent.team).await? {
        return Err(missing_team(agent));
    }
    if agent.senior_id.is_empty() {
        return Ok(());
    }
    let mut seen = vec![agent.id.clone()];
    let mut current = agent.senior_id.clone();
    while !current.is_empty() {
        if seen.contains(&current) {
            seen.push(current);
            return Err(hierarchy_loop(&seen));
        }
        let row = sqlx::query("SELECT senior_id FROM agents WHERE id = $1")
            .bind(current.clone())
            .fetch_optional(&mut **transaction)
            .await?;
        let Some(row) = row else {
            if current == agent.senior_id {
                return Err(missing_senior(agent));
            }
            break;
        };
        seen.push(current);
        current = row.try_get("senior_id")?;
    }
    Ok(())
}

/// Most rows one INSERT writes (17 parameters each for agents: 8,500 in all,
/// under both databases' limits).
const ROWS_PER_STATEMENT: usize = 500;

/// Writes the expertise rows of `agents` (none may have any yet).
async fn insert_expertise(
    transaction: &mut Transaction<'static, Any>,
    backend: Backend,
    agents: &[&Agent],
) -> Result<()> {
    let rows: Vec<(&str, &str)> =
        agents.iter().flat_map(|agent| agent.expertise.iter().map(|tag| (tag.as_str(), agent.id.as_str()))).collect();
    for chunk in rows.chunks(ROWS_PER_STATEMENT) {
        let sql =
            format!("INSERT INTO agent_expertise (tag, agent_id) VALUES {}", placeholders(backend, chunk.len(), 2));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (tag, agent_id) in chunk {
            query = query.bind((*tag).to_owned()).bind((*agent_id).to_owned());
        }
        query.execute(&mut **transaction).await?;
    }
    Ok(())
}

pub(super) fn expertise_json(agent: &Agent) -> Result<String> {
    serde_json::to_string(&agent.expertise).map_err(|error| Error::Internal(error.to_string()))
}

/// Creates `agents` (idle, no manual status) with their expertise rows.
pub(super) async fn insert_agent_rows(
    transaction: &mut Transaction<'static, Any>,
    backend: Backend,
    agents: &[&Agent],
    now: i64,
) -> Result<()> {
    for chunk in agents.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO agents (id, name, role, team, senior_id, expertise_json, manual_status, current_workload, \
             workload_capacity, availability_until, custom_prompt, llm_config_json, backstory, allow_delegation, \
             max_iterations, created_at, updated_at) VALUES {} ON CONFLICT (id) DO NOTHING",
            placeholders(backend, chunk.len(), 17)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for agent in chunk {
            query = query
                .bind(agent.id.clone())
                .bind(agent.name.clone())
                .bind(agent.role.clone())
                .bind(agent.team.clone())
                .bind(agent.senior_id.clone())
                .bind(expertise_json(agent)?)
                .bind(String::new())
                .bind(0_i64)
                .bind(i64::from(agent.workload_capacity))
                .bind(agent.availability_until)
                .bind(agent.custom_prompt.clone())
                .bind(agent.llm_config_json.clone())
                .bind(agent.backstory.clone())
                .bind(i64::from(agent.allow_delegation))
                .bind(i64::from(agent.max_iterations))
                .bind(now)
                .bind(now);
        }
        let inserted = query.execute(&mut **transaction).await?.rows_affected();
        if inserted != chunk.len() as u64 {
            return Err(match chunk {
                [agent] => Error::already_exists(AGENT, &agent.id, format!("agent {:?} already exists", agent.id)),
                _ => Error::already_exists(
                    AGENT,
                    "",
                    "agents of this import were created by someone else while it ran; import again",
                ),
            });
        }
    }
    insert_expertise(transaction, backend, agents).await
}

pub(super) async fn update_agent_row(
    transaction: &mut Transaction<'static, Any>,
    backend: Backend,
    agent: &Agent,
    now: i64,
) -> Result<bool> {
    let result = sqlx::query(
        "UPDATE agents SET name = $2, role = $3, team = $4, senior_id = $5, expertise_json = $6, \
         workload_capacity = $7, availability_until = $8, custom_prompt = $9, llm_config_json = $10, \
         backstory = $11, allow_delegation = $12, max_iterations = $13, updated_at = $14, version = version + 1 \
         WHERE id = $1",
    )
    .bind(agent.id.clone())
    .bind(agent.name.clone())
    .bind(agent.role.clone())
    .bind(agent.team.clone())
    .bind(agent.senior_id.clone())
    .bind(expertise_json(agent)?)
    .bind(i64::from(agent.workload_capacity))
    .bind(agent.availability_until)
    .bind(agent.custom_prompt.clone())
    .bind(agent.llm_config_json.clone())
    .bind(agent.backstory.clone())
    .bind(i64::from(agent.allow_delegation))
    .bind(i64::from(agent.max_iterations))
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    if result.rows_affected() == 0 {
        return Ok(false);
    }
    sqlx::query("DELETE FROM agent_expertise WHERE agent_id = $1")
        .bind(agent.id.clone())
        .execute(&mut **transaction)
        .await?;
    insert_expertise(transaction, backend, &[agent]).await?;
    credentials::set_role(transaction, &agent.id, &agent.role).await?;
    Ok(true)
}

pub(super) async fn upsert_team_row(transaction: &mut Transaction<'static, Any>, team: &Team, now: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO teams (name, description, lead_agent_id, updated_at) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (name) DO UPDATE SET description = excluded.description, \
         lead_agent_id = excluded.lead_agent_id, updated_at = excluded.updated_at",
    )
    .bind(team.name.clone())
    .bind(team.description.clone())
    .bind(team.lead_agent_id.clone())
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

pub(super) async fn upsert_role_row(
    transaction: &mut Transaction<'static, Any>,
    role: &RoleDefinition,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT INTO roles (name, definition_json, updated_at) VALUES ($1, $2, $3) \
         ON CONFLICT (name) DO UPDATE SET definition_json = excluded.definition_json, updated_at = excluded.updated_at",
    )
    .bind(role.name.clone())
    .bind(role_to_json(role))
    .bind(now)
    .execute(&mut **transaction)
    .await?;
    Ok(())
}

fn role_to_json(role: &RoleDefinition) -> String {
    serde_json::json!({
        "name": role.name, "description": role.description, "goals": role.goals,
        "responsibilities": role.responsibilities, "tools": role.tools,
        "permitted_actions": role.permitted_actions, "input_schema_json": role.input_schema_json,
        "output_schema_json": role.output_schema_json, "mission": role.mission,
        "context_files": role.context_files, "read_paths": role.read_paths, "write_paths": role.write_paths,
        "schedule": role.schedule, "inbox": role.inbox,
        "user_preferences": role.user_preferences, "post_to_inbox": role.post_to_inbox,
        "budget": role.budget, "throttle": role.throttle,
    })
    .to_string()
}

fn role_from_json(text: &str) -> Result<RoleDefinition> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|error| Error::Internal(format!("bad stored role: {error}")))?;
    let text_field = |key: &str| value.get(key).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    let list_field = |key: &str| {
        value
            .get(key)
            .and_then(|v| v.as_array())
            .map(|items| items.iter().filter_map(|item| item.as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    Ok(RoleDefinition {
        name: text_field("name"),
        description: text_field("description"),
        goals: list_field("goals"),
        responsibilities: list_field("responsibilities"),
        tools: list_field("tools"),
        permitted_actions: list_field("permitted_actions"),
        input_schema_json: text_field("input_schema_json"),
        output_schema_json: text_field("output_schema_json"),
        mission: text_field("mission"),
        context_files: list_field("context_files"),
        read_paths: list_field("read_paths"),
        write_paths: list_field("write_paths"),
        schedule: text_field("schedule"),
        inbox: text_field("inbox"),
        user_preferences: text_field("user_preferences"),
        post_to_inbox: text_field("post_to_inbox"),
        budget: value.get("budget").and_then(|budget| serde_json::from_value(budget.clone()).ok()),
        throttle: value.get("throttle").and_then(|throttle| serde_json::from_value(throttle.clone()).ok()),
    })
}

impl Store for SqlStore {
    async fn migrate(&self) -> Result<()> {
        self.database.migrate(&MIGRATIONS).await.map_err(|error| Error::Internal(format!("migrating: {error}")))
    }

    async fn insert_agent(&self, agent: &Agent, token: &TokenHash, now: i64) -> Result<Agent> {
        let mut transaction = self.database.pool.begin().await?;
        if exists(&mut transaction, "SELECT 1 FROM agents WHERE id = $1", &agent.id).await? {
            return Err(Error::already_exists(AGENT, &agent.id, format!("agent {:?} already exists", agent.id)));
        }
        check_agent_references(&mut transaction, agent).await?;
        let backend = self.database.backend;
        insert_agent_rows(&mut transaction, backend, &[agent], now).await?;
        let revision = credentials::next_revision(&mut transaction).await?;
        credentials::issue(&mut transaction, backend, &[(&agent.id, &agent.role, token)], revision, now).await?;
        let (stored, version) = stored(&mut transaction, &agent.id).await?;
        transaction.commit().await?;
        self.index.put(stored.clone(), version);
        Ok(stored)
    }

    async fn get_agent(&self, id: &str) -> Result<Agent> {
        let row = sqlx::query(AssertSqlSafe(format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1")))
            .bind(id.to_owned())
            .fetch_optional(&self.database.pool)
            .await?;
        match row {
            Some(row) => agent_from_row(&row),
            None => Err(agent_not_found(id)),
        }
    }

    async fn list_agents(&self, query: &AgentQuery) -> Result<Vec<Agent>> {
        let mut conditions = vec!["id > $1".to_owned()];
        let mut binds = vec![query.after_id.clone()];
        let mut add = |condition: &str, value: &str| {
            binds.push(value.to_owned());
            conditions.push(condition.replace('?', &format!("${}", binds.len())));
        };
        if !query.team.is_empty() {
            add("team = ?", &query.team);
        }
        if !query.role.is_empty() {
            add("role = ?", &query.role);
        }
        if let Some(status) = query.status {
            add(&format!("{STATUS_SQL} = ?"), status.as_str());
        }
        if !query.expertise.is_empty() {
            add("id IN (SELECT agent_id FROM agent_expertise WHERE tag = ?)", &query.expertise);
        }
        if query.available_only {
            conditions
                .push("manual_status NOT IN ('offline', 'busy') AND current_workload < workload_capacity".to_owned());
        }
        let mut sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE {} ORDER BY id", conditions.join(" AND "));
        if query.limit > 0 {
            sql.push_str(&format!(" LIMIT {}", query.limit));
        }
        let mut statement = sqlx::query(AssertSqlSafe(sql));
        for value in binds {
            statement = statement.bind(value);
        }
        statement.fetch_all(&self.database.pool).await?.iter().map(agent_from_row).collect()
    }

    async fn update_agent(&self, agent: &Agent, fields: &[AgentField], now: i64) -> Result<Agent> {
        let mut transaction = self.database.pool.begin().await?;
        if self.database.backend == Backend::Postgres {
            // Two updates of different fields must not undo each other.
            sqlx::query("SELECT 1 FROM agents WHERE id = $1 FOR UPDATE")
                .bind(agent.id.clone())
                .execute(&mut *transaction)
                .await?;
        }
        let Some(mut updated) = fetch_agent(&mut transaction, &agent.id).await? else {
            return Err(agent_not_found(&agent.id));
        };
        updated.update(agent, fields);
        let agent = &updated.normalize()?;
        check_agent_references(&mut transaction, agent).await?;
        update_agent_row(&mut transaction, self.database.backend, agent, now).await?;
        let (stored, version) = stored(&mut transaction, &agent.id).await?;
        transaction.commit().await?;
        self.index.put(stored.clone(), version);
        Ok(stored)
    }

    async fn remove_agent(&self, id: &str, now: i64) -> Result<()> {
        let mut transaction = self.database.pool.begin().await?;
        if !exists(&mut transaction, "SELECT 1 FROM agents WHERE id = $1", id).await? {
            return Err(agent_not_found(id));
        }
        let juniors: Vec<String> = sqlx::query("SELECT id FROM agents WHERE senior_id = $1 ORDER BY id")
            .bind(id.to_owned())
            .fetch_all(&mut *transaction)
            .await?
            .iter()
            .map(|row| row.try_get("id"))
            .collect::<Result<_, _>>()?;
        if !juniors.is_empty() {
            return Err(Error::precondition(
                "AGENT_HAS_JUNIORS",
                format!("agent/{id}"),
                format!("agent {id:?} is the senior of {}; give them another senior first", juniors.join(", ")),
            ));
        }
        sqlx::query("UPDATE teams SET lead_agent_id = '', updated_at = $2 WHERE lead_agent_id = $1")
            .bind(id.to_owned())
            .bind(now)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM agent_expertise WHERE agent_id = $1")
            .bind(id.to_owned())
            .execute(&mut *transaction)
            .await?;
        sqlx::query("DELETE FROM agents WHERE id = $1").bind(id.to_owned()).execute(&mut *transaction).await?;
        let revision = credentials::next_revision(&mut transaction).await?;
        credentials::revoke_all(&mut transaction, id, revision, now).await?;
        transaction.commit().await?;
        self.index.remove(id);
        Ok(())
    }

    async fn set_status(
        &self,
        id: &str,
        status: Option<Status>,
        availability_until: Option<i64>,
        now: i64,
    ) -> Result<Agent> {
        let mut transaction = self.database.pool.begin().await?;
        let result = sqlx::query(
            "UPDATE agents SET manual_status = $2, availability_until = $3, updated_at = $4, version = version + 1 \
                 WHERE id = $1",
        )
        .bind(id.to_owned())
        .bind(status.map(Status::as_str).unwrap_or_default().to_owned())
        .bind(availability_until)
        .bind(now)
        .execute(&mut *transaction)
        .await?;
        if result.rows_affected() == 0 {
            return Err(agent_not_found(id));
        }
        let (stored, version) = stored(&mut transaction, id).await?;
        transaction.commit().await?;
        self.index.put(stored.clone(), version);
        Ok(stored)
    }

    async fn put_team(&self, team: &Team, now: i64) -> Result<Team> {
        let mut transaction = self.database.pool.begin().await?;
        if !team.lead_agent_id.is_empty()
            && !exists(&mut transaction, "SELECT 1 FROM agents WHERE id = $1", &team.lead_agent_id).await?
        {
            return Err(Error::invalid(
                "team.lead_agent_id",
                format!("team.lead_agent_id: agent {:?} is not in the roster", team.lead_agent_id),
            ));
        }
        upsert_team_row(&mut transaction, team, now).await?;
        transaction.commit().await?;
        self.index.put_team(team.clone());
        Ok(team.clone())
    }

    async fn list_teams(&self) -> Result<Vec<Team>> {
        let rows = sqlx::query("SELECT name, description, lead_agent_id FROM teams ORDER BY name")
            .fetch_all(&self.database.pool)
            .await?;
        rows.iter().map(super::index::team_from_row).collect()
    }

    async fn remove_team(&self, name: &str) -> Result<()> {
        let mut transaction = self.database.pool.begin().await?;
        if !exists(&mut transaction, "SELECT 1 FROM teams WHERE name = $1", name).await? {
            return Err(Error::not_found(TEAM, name, format!("team {name:?} does not exist")));
        }
        let members = sqlx::query("SELECT id FROM agents WHERE team = $1 ORDER BY id LIMIT 5")
            .bind(name.to_owned())
            .fetch_all(&mut *transaction)
            .await?;
        if !members.is_empty() {
            let ids: Vec<String> = members.iter().map(|row| row.try_get("id")).collect::<Result<_, _>>()?;
            return Err(Error::precondition(
                "TEAM_NOT_EMPTY",
                format!("team/{name}"),
                format!("team {name:?} still has agents ({}); move or remove them first", ids.join(", ")),
            ));
        }
        sqlx::query("DELETE FROM teams WHERE name = $1").bind(name.to_owned()).execute(&mut *transaction).await?;
        transaction.commit().await?;
        self.index.remove_team(name);
        Ok(())
    }

    async fn put_role(&self, role: &RoleDefinition, now: i64) -> Result<RoleDefinition> {
        let mut transaction = self.database.pool.begin().await?;
        upsert_role_row(&mut transaction, role, now).await?;
        transaction.commit().await?;
        Ok(role.clone())
    }

    async fn get_role(&self, name: &str) -> Result<RoleDefinition> {
        let row = sqlx::query("SELECT definition_json FROM roles WHERE name = $1")
            .bind(name.to_owned())
            .fetch_optional(&self.database.pool)
            .await?
            .ok_or_else(|| role_not_found(name))?;
        role_from_json(&row.try_get::<String, _>("definition_json")?)
    }

    async fn list_roles(&self) -> Result<Vec<RoleDefinition>> {
        let rows =
            sqlx::query("SELECT definition_json FROM roles ORDER BY name").fetch_all(&self.database.pool).await?;
        rows.iter().map(|row| role_from_json(&row.try_get::<String, _>("definition_json")?)).collect()
    }

    async fn remove_role(&self, name: &str) -> Result<()> {
        let result =
            sqlx::query("DELETE FROM roles WHERE name = $1").bind(name.to_owned()).execute(&self.database.pool).await?;
        if result.rows_affected() == 0 {
            return Err(role_not_found(name));
        }
        Ok(())
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
        let mut transaction = self.database.pool.begin().await?;
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
        super::import::import(self, plan, now).await
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
        super::together::delegate(self, request, now, settings).await
    }

    async fn delegate_batch(
        &self,
        requests: &[DelegationRequest],
        now: i64,
        settings: Settings,
    ) -> Result<Vec<super::DelegationOutcome>> {
        super::delegation::delegate_batch(self, requests, now, settings).await
    }

    async fn release_task(&self, task_id: &str, now: i64) -> Result<super::ReleaseOutcome> {
        super::delegation::release::release_task(self, task_id, now).await
    }

    async fn release_tasks(&self, task_ids: &[String], now: i64) -> Result<Vec<super::ReleaseOutcome>> {
        super::delegation::release::release_tasks(self, task_ids, now).await
    }

    async fn escalate_stale(&self, now: i64) -> Result<Vec<super::QueueResolution>> {
        super::delegation::queue::escalate_stale(self, now).await
    }

    async fn queue_state(&self, task_id: &str) -> Result<super::QueueState> {
        super::delegation::queue::queue_state(self, task_id).await
    }

    async fn queued_task_count(&self) -> Result<u64> {
        super::delegation::queue::queued_task_count(self).await
    }

    async fn list_delegations(&self, query: &super::DelegationQuery) -> Result<Vec<super::DelegationRecord>> {
        super::delegation::audit::list_delegations(self, query).await
    }

    async fn fold_audit_trail(&self) -> Result<u64> {
        super::delegation::audit::fold_audit_trail(self).await
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
