//! ImportRoster in the database: one transaction; the references of every
//! agent checked in memory against the roster as it will stand; new agents,
//! their expertise and their tokens written in multi-row statements.

use std::collections::{HashMap, HashSet};

use muster_runtime::db::{Backend, placeholders};
use sqlx::{Any, AssertSqlSafe, Row, Transaction};

use super::{
    ImportPlan, credentials,
    sql::{
        SqlStore, expertise_json, hierarchy_loop, missing_senior, missing_team, update_agent_row, upsert_role_row,
        upsert_team_row,
    },
};
use crate::domain::model::{Agent, Team};
use crate::error::{Error, Result};

/// Most rows one INSERT writes (17 parameters each for agents: 8,500 in all,
/// under both databases' limits).
const ROWS_PER_STATEMENT: usize = 500;

type Tx = Transaction<'static, Any>;

/// Writes `plan`: teams and roles replaced, new agents created with their
/// tokens, existing agents' descriptive fields updated. All or nothing.
/// Returns the ids of the agents created, in the plan's order.
pub(super) async fn import(store: &SqlStore, plan: &ImportPlan, now: i64) -> Result<Vec<String>> {
    let backend = store.database.backend;
    let mut transaction = store.database.pool.begin().await?;
    for team in &plan.teams {
        // Leads are set once the agents are known to exist.
        upsert_team_row(&mut transaction, &Team { lead_agent_id: String::new(), ..team.clone() }, now).await?;
    }
    for role in &plan.roles {
        upsert_role_row(&mut transaction, role, now).await?;
    }

    // The roster as it will stand: whom each agent reports to, which teams exist.
    let mut seniors: HashMap<String, String> = HashMap::new();
    for row in sqlx::query("SELECT id, senior_id FROM agents").fetch_all(&mut *transaction).await? {
        seniors.insert(row.try_get("id")?, row.try_get("senior_id")?);
    }
    let (existing, new): (Vec<&Agent>, Vec<&Agent>) =
        plan.agents.iter().map(|(agent, _)| agent).partition(|agent| seniors.contains_key(&agent.id));
    let mut teams = HashSet::new();
    for row in sqlx::query("SELECT name FROM teams").fetch_all(&mut *transaction).await? {
        teams.insert(row.try_get::<String, _>("name")?);
    }
    for (agent, _) in &plan.agents {
        seniors.insert(agent.id.clone(), agent.senior_id.clone());
    }
    let mut verified = HashSet::new();
    for (agent, _) in &plan.agents {
        if !agent.team.is_empty() && !teams.contains(&agent.team) {
            return Err(missing_team(agent));
        }
        check_hierarchy(agent, &seniors, &mut verified)?;
    }
    for team in &plan.teams {
        if !team.lead_agent_id.is_empty() && !seniors.contains_key(&team.lead_agent_id) {
            return Err(Error::InvalidArgument(format!(
                "team {:?}: lead {:?} is not in the roster",
                team.name, team.lead_agent_id
            )));
        }
    }

    for agent in existing {
        update_agent_row(&mut transaction, agent, now).await?;
    }
    let created = insert_agents(&mut transaction, backend, plan, &new, now).await?;
    for team in plan.teams.iter().filter(|team| !team.lead_agent_id.is_empty()) {
        upsert_team_row(&mut transaction, team, now).await?;
    }
    transaction.commit().await?;
    Ok(created)
}

/// Checks that `agent`'s chain of seniors has no loop and that its own senior
/// exists. `verified` holds agents whose chain was walked before and ends
/// without a loop, so a walk stops there and the whole check stays linear.
fn check_hierarchy(agent: &Agent, seniors: &HashMap<String, String>, verified: &mut HashSet<String>) -> Result<()> {
    let mut chain = vec![agent.id.as_str()];
    let mut on_chain = HashSet::from([agent.id.as_str()]);
    let mut current = agent.senior_id.as_str();
    while !current.is_empty() && !verified.contains(current) {
        if on_chain.contains(current) {
            chain.push(current);
            return Err(hierarchy_loop(&chain));
        }
        let Some(senior) = seniors.get(current) else {
            if current == agent.senior_id {
                return Err(missing_senior(agent));
            }
            // An older dangling reference further up is not this import's to judge.
            break;
        };
        chain.push(current);
        on_chain.insert(current);
        current = senior;
    }
    verified.extend(chain.into_iter().map(str::to_owned));
    Ok(())
}

/// Creates the `new` agents of `plan`, their expertise rows and their tokens
/// (all under one new credential revision); returns their ids.
async fn insert_agents(
    transaction: &mut Tx,
    backend: Backend,
    plan: &ImportPlan,
    new: &[&Agent],
    now: i64,
) -> Result<Vec<String>> {
    if new.is_empty() {
        return Ok(Vec::new());
    }
    for chunk in new.chunks(ROWS_PER_STATEMENT) {
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
            return Err(Error::AlreadyExists(
                "agents of this import were created by someone else while it ran; import again".to_owned(),
            ));
        }
    }
    let expertise: Vec<(&str, &str)> =
        new.iter().flat_map(|agent| agent.expertise.iter().map(|tag| (tag.as_str(), agent.id.as_str()))).collect();
    for chunk in expertise.chunks(ROWS_PER_STATEMENT) {
        let sql =
            format!("INSERT INTO agent_expertise (tag, agent_id) VALUES {}", placeholders(backend, chunk.len(), 2));
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (tag, agent_id) in chunk {
            query = query.bind((*tag).to_owned()).bind((*agent_id).to_owned());
        }
        query.execute(&mut **transaction).await?;
    }
    let is_new: HashSet<&str> = new.iter().map(|agent| agent.id.as_str()).collect();
    let tokens: Vec<_> = plan.agents.iter().filter(|(agent, _)| is_new.contains(agent.id.as_str())).collect();
    let revision = credentials::next_revision(transaction).await?;
    for chunk in tokens.chunks(ROWS_PER_STATEMENT) {
        let sql = format!(
            "INSERT INTO tokens (token_hash, agent_id, role, active, revision, issued_at) VALUES {}",
            placeholders(backend, chunk.len(), 6)
        );
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for (agent, token) in chunk {
            query = query
                .bind(token.to_hex())
                .bind(agent.id.clone())
                .bind(agent.role.clone())
                .bind(1_i64)
                .bind(revision)
                .bind(now);
        }
        query.execute(&mut **transaction).await?;
    }
    Ok(new.iter().map(|agent| agent.id.clone()).collect())
}
