//! Who takes part in an execution, in SQL: the condition
//! `list_executions` adds for an agent, and the agents each process version
//! names, kept when it is published. The rule is the one `takes_part`
//! (`grpc/access.rs`) applies to one execution: its lead, a participant of
//! its session, the executor of a step, or named in a step of its process
//! version ([`named_agents`]). The first three are read where the engine
//! writes them (the execution's row, `session_assignments`, `steps`), so
//! the listing follows a new lead or a step's new executor as the engine
//! does; the fourth is `process_agents`, since a definition is not
//! queryable and a version never changes.

use std::collections::BTreeSet;

use muster_runtime::db::Database;
use sqlx::{AnyConnection, Row as _};

use super::processes::process_from_row;
use crate::{Result, domain::model::named_agents};

/// How many versions are listed per transaction when the service starts.
const VERSIONS_PER_TRANSACTION: i64 = 100;

/// ` AND id IN (...)`: the executions an agent takes part in, for a query
/// of `executions`. Each of its four placeholders, taken from `next`, is
/// bound to the agent's id. The candidates are found from the agent's side
/// (an index per part), so a page costs what the agent takes part in, not
/// what the database holds.
pub(super) fn takes_part(next: &mut impl FnMut() -> String) -> String {
    let (lead, participant, executor, named) = (next(), next(), next(), next());
    format!(
        " AND id IN (SELECT id FROM executions WHERE lead_agent_id = {lead} \
         UNION SELECT a.execution_id FROM session_assignments a JOIN executions s ON s.id = a.execution_id \
         WHERE a.agent_id = {participant} AND s.is_session <> 0 \
         UNION SELECT execution_id FROM steps WHERE executor = {executor} \
         UNION SELECT n.id FROM process_agents p JOIN executions n ON n.process_name = p.process_name \
         AND n.process_version = p.process_version WHERE p.agent_id = {named})"
    )
}

/// How many times [`takes_part`] binds the agent's id.
pub(super) const TAKES_PART_BINDS: usize = 4;

/// Keeps the agents a version names (each once), in the transaction that
/// publishes it or lists it.
pub(super) async fn keep_named_agents(
    connection: &mut AnyConnection,
    process_name: &str,
    version: i64,
    definition: &muster_format::ProcessDefinition,
) -> Result<()> {
    let named: BTreeSet<&str> = named_agents(definition).filter(|agent_id| !agent_id.is_empty()).collect();
    for agent_id in named {
        sqlx::query(
            "INSERT INTO process_agents (agent_id, process_name, process_version) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind(agent_id.to_owned())
        .bind(process_name.to_owned())
        .bind(version)
        .execute(&mut *connection)
        .await?;
    }
    Ok(())
}

/// Lists the agents of the versions published before they were kept, once
/// (each is marked listed). Replicas starting together may list the same
/// version twice: both keep the same rows. A version that no longer reads
/// is marked without agents, with a warning, rather than stopping the
/// service.
pub(super) async fn list_earlier_versions(database: &Database) -> Result<()> {
    loop {
        let rows = sqlx::query(
            "SELECT * FROM processes WHERE agents_listed = 0 ORDER BY name, version LIMIT CAST($1 AS BIGINT)",
        )
        .bind(VERSIONS_PER_TRANSACTION)
        .fetch_all(&database.pool)
        .await?;
        if rows.is_empty() {
            return Ok(());
        }
        let mut transaction = database.pool.begin().await?;
        for row in &rows {
            let name: String = row.try_get("name")?;
            let version: i64 = row.try_get("version")?;
            match process_from_row(row) {
                Ok(process) => keep_named_agents(&mut transaction, &name, version, &process.definition).await?,
                Err(error) => tracing::warn!(
                    process = %name,
                    version,
                    %error,
                    "a process version no longer reads: no agent is listed as named in its executions"
                ),
            }
            sqlx::query("UPDATE processes SET agents_listed = 1 WHERE name = $1 AND version = $2")
                .bind(name)
                .bind(version)
                .execute(&mut *transaction)
                .await?;
        }
        transaction.commit().await?;
    }
}
