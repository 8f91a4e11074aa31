//! ImportRoster in the database: one transaction; the references of every
//! agent checked in memory against the roster as it will stand; new agents,
//! their expertise and their tokens written in multi-row statements.

use std::collections::{HashMap, HashSet};

use muster_runtime::db::Backend;
use sqlx::{Any, Row, Transaction};

use crate::domain::model::{Agent, Team};
use crate::error::{Error, Result};
use crate::store::{
    ImportPlan,
    sql::{
        SqlStore,
        agents::{hierarchy_loop, insert_agent_rows, missing_senior, missing_team, update_agent_row},
        credentials,
        organisation::{upsert_role_row, upsert_team_row},
    },
};

type Tx = Transaction<'static, Any>;

/// The field of ImportRosterRequest its refusals are about: the agents and
/// teams of a plan come from its files, whose positions the plan no longer knows.
const FILES: &str = "files";

/// Writes `plan`: teams and roles replaced, new agents created with their
/// tokens, existing agents' descriptive fields updated. All or nothing.
/// Returns the ids of the agents created, in the plan's order.
pub(super) async fn import(store: &SqlStore, plan: &ImportPlan, now: i64) -> Result<Vec<String>> {
    let backend = store.database.backend;
    let mut transaction = store.database.begin_write().await?;
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
            return Err(missing_team(agent).on_field(FILES));
        }
        check_hierarchy(agent, &seniors, &mut verified).map_err(|error| error.on_field(FILES))?;
    }
    for team in &plan.teams {
        if !team.lead_agent_id.is_empty() && !seniors.contains_key(&team.lead_agent_id) {
            return Err(Error::invalid(
                FILES,
                format!("team {:?}: lead {:?} is not in the roster", team.name, team.lead_agent_id),
            ));
        }
    }

    for agent in &existing {
        update_agent_row(&mut transaction, backend, agent, now).await?;
    }
    let created = insert_agents(&mut transaction, backend, plan, &new, now).await?;
    for team in plan.teams.iter().filter(|team| !team.lead_agent_id.is_empty()) {
        upsert_team_row(&mut transaction, team, now).await?;
    }
    transaction.commit().await?;
    // New agents are as written (idle, no manual status, version 0); the
    // updated ones keep state of their own, so they are read again.
    for team in &plan.teams {
        store.index.put_team(team.clone());
    }
    for agent in new {
        store.index.put(Agent { current_workload: 0, manual_status: None, ..agent.clone() }, 0);
    }
    let updated: Vec<String> = existing.iter().map(|agent| agent.id.clone()).collect();
    store.reread_after_commit(&updated).await;
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
    insert_agent_rows(transaction, backend, new, now).await?;
    let is_new: HashSet<&str> = new.iter().map(|agent| agent.id.as_str()).collect();
    let tokens: Vec<credentials::NewToken<'_>> = plan
        .agents
        .iter()
        .filter(|(agent, _)| is_new.contains(agent.id.as_str()))
        .map(|(agent, token)| (agent.id.as_str(), agent.role.as_str(), token))
        .collect();
    let revision = credentials::next_revision(transaction).await?;
    credentials::issue(transaction, backend, &tokens, revision, now).await?;
    Ok(new.iter().map(|agent| agent.id.clone()).collect())
}
