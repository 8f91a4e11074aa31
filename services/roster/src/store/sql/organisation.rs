//! Teams and role definitions in the database: put, listed and removed (a
//! team or role still referred to stays).

use sqlx::{Any, Row, Transaction};

use super::{SqlStore, exists};
use crate::domain::model::{RoleDefinition, Team};
use crate::error::{Error, ROLE_DEFINITION, Result, TEAM};

pub(super) async fn put_team(store: &SqlStore, team: &Team, now: i64) -> Result<Team> {
    let mut transaction = store.database.begin_write().await?;
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
    store.index.put_team(team.clone());
    Ok(team.clone())
}

pub(super) async fn list_teams(store: &SqlStore) -> Result<Vec<Team>> {
    let rows = sqlx::query("SELECT name, description, lead_agent_id FROM teams ORDER BY name")
        .fetch_all(&store.database.pool)
        .await?;
    rows.iter().map(crate::store::sql::index::team_from_row).collect()
}

pub(super) async fn remove_team(store: &SqlStore, name: &str) -> Result<()> {
    let mut transaction = store.database.begin_write().await?;
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
    store.index.remove_team(name);
    Ok(())
}

pub(super) async fn put_role(store: &SqlStore, role: &RoleDefinition, now: i64) -> Result<RoleDefinition> {
    let mut transaction = store.database.begin_write().await?;
    upsert_role_row(&mut transaction, role, now).await?;
    transaction.commit().await?;
    Ok(role.clone())
}

pub(super) async fn get_role(store: &SqlStore, name: &str) -> Result<RoleDefinition> {
    let row = sqlx::query("SELECT definition_json FROM roles WHERE name = $1")
        .bind(name.to_owned())
        .fetch_optional(&store.database.pool)
        .await?
        .ok_or_else(|| role_not_found(name))?;
    role_from_json(&row.try_get::<String, _>("definition_json")?)
}

pub(super) async fn list_roles(store: &SqlStore) -> Result<Vec<RoleDefinition>> {
    let rows = sqlx::query("SELECT definition_json FROM roles ORDER BY name").fetch_all(&store.database.pool).await?;
    rows.iter().map(|row| role_from_json(&row.try_get::<String, _>("definition_json")?)).collect()
}

pub(super) async fn remove_role(store: &SqlStore, name: &str) -> Result<()> {
    let result =
        sqlx::query("DELETE FROM roles WHERE name = $1").bind(name.to_owned()).execute(&store.database.pool).await?;
    if result.rows_affected() == 0 {
        return Err(role_not_found(name));
    }
    Ok(())
}

/// NOT_FOUND for the role definition `name`.
fn role_not_found(name: &str) -> Error {
    Error::not_found(ROLE_DEFINITION, name, format!("role definition {name:?} does not exist"))
}

pub(in crate::store) async fn upsert_team_row(
    transaction: &mut Transaction<'static, Any>,
    team: &Team,
    now: i64,
) -> Result<()> {
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

pub(in crate::store) async fn upsert_role_row(
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
