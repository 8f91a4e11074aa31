//! Agents in the database: added with their first token, read, listed with
//! the roster's filters, updated field by field, removed, and their status
//! set; the references an agent makes (its team, its senior, no loop in the
//! hierarchy) checked in the same transaction.

use muster_runtime::{
    auth::TokenHash,
    db::{Backend, placeholders},
};

use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use super::{AGENT_COLUMNS, STATUS_SQL, SqlStore, agent_from_row, agent_not_found, exists, fetch_agent, stored};
use crate::domain::model::{Agent, AgentField, Status};
use crate::error::{AGENT, Error, Result};
use crate::store::{AgentQuery, sql::credentials};

pub(super) async fn insert_agent(store: &SqlStore, agent: &Agent, token: &TokenHash, now: i64) -> Result<Agent> {
    let mut transaction = store.database.begin_write().await?;
    if exists(&mut transaction, "SELECT 1 FROM agents WHERE id = $1", &agent.id).await? {
        return Err(Error::already_exists(AGENT, &agent.id, format!("agent {:?} already exists", agent.id)));
    }
    check_agent_references(&mut transaction, agent).await?;
    let backend = store.database.backend;
    insert_agent_rows(&mut transaction, backend, &[agent], now).await?;
    let revision = credentials::next_revision(&mut transaction).await?;
    credentials::issue(&mut transaction, backend, &[(&agent.id, &agent.role, token)], revision, now).await?;
    let (stored, version) = stored(&mut transaction, &agent.id).await?;
    transaction.commit().await?;
    store.index.put(stored.clone(), version);
    Ok(stored)
}

pub(super) async fn get_agent(store: &SqlStore, id: &str) -> Result<Agent> {
    let row = sqlx::query(AssertSqlSafe(format!("SELECT {AGENT_COLUMNS} FROM agents WHERE id = $1")))
        .bind(id.to_owned())
        .fetch_optional(&store.database.pool)
        .await?;
    match row {
        Some(row) => agent_from_row(&row),
        None => Err(agent_not_found(id)),
    }
}

pub(super) async fn list_agents(store: &SqlStore, query: &AgentQuery) -> Result<Vec<Agent>> {
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
        conditions.push("manual_status NOT IN ('offline', 'busy') AND current_workload < workload_capacity".to_owned());
    }
    let mut sql = format!("SELECT {AGENT_COLUMNS} FROM agents WHERE {} ORDER BY id", conditions.join(" AND "));
    if query.limit > 0 {
        sql.push_str(&format!(" LIMIT {}", query.limit));
    }
    let mut statement = sqlx::query(AssertSqlSafe(sql));
    for value in binds {
        statement = statement.bind(value);
    }
    statement.fetch_all(&store.database.pool).await?.iter().map(agent_from_row).collect()
}

pub(super) async fn update_agent(store: &SqlStore, agent: &Agent, fields: &[AgentField], now: i64) -> Result<Agent> {
    let mut transaction = store.database.begin_write().await?;
    if store.database.backend == Backend::Postgres {
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
    update_agent_row(&mut transaction, store.database.backend, agent, now).await?;
    let (stored, version) = stored(&mut transaction, &agent.id).await?;
    transaction.commit().await?;
    store.index.put(stored.clone(), version);
    Ok(stored)
}

pub(super) async fn remove_agent(store: &SqlStore, id: &str, now: i64) -> Result<()> {
    let mut transaction = store.database.begin_write().await?;
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
    store.index.remove(id);
    Ok(())
}

pub(super) async fn set_status(
    store: &SqlStore,
    id: &str,
    status: Option<Status>,
    availability_until: Option<i64>,
    now: i64,
) -> Result<Agent> {
    let mut transaction = store.database.begin_write().await?;
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
    store.index.put(stored.clone(), version);
    Ok(stored)
}

/// The refusals of an agent's references, the same from every path that checks them.
pub(in crate::store) fn missing_team(agent: &Agent) -> Error {
    Error::invalid(
        "agent.team",
        format!("agent.team: team {:?} does not exist; create it with PutTeam first", agent.team),
    )
}

pub(in crate::store) fn missing_senior(agent: &Agent) -> Error {
    Error::invalid(
        "agent.senior_id",
        format!("agent.senior_id: senior {:?} does not exist in the roster", agent.senior_id),
    )
}

pub(in crate::store) fn hierarchy_loop(chain: &[impl AsRef<str>]) -> Error {
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
pub(in crate::store) async fn insert_agent_rows(
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

pub(in crate::store) async fn update_agent_row(
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
