//! Budgets, in SQL: a process's and the agents' limits, and the usage
//! measured against them.

use sqlx::{Row, any::AnyRow};

use super::SqlStore;
use crate::{
    Error, Result,
    domain::budget::{self, Budget, Usage},
};

pub(super) async fn budget<'a>(store: &'a SqlStore, process_name: &'a str) -> Result<Option<Budget>> {
    let row = sqlx::query("SELECT * FROM budgets WHERE process_name = $1")
        .bind(process_name.to_owned())
        .fetch_optional(&store.database.reads)
        .await?;
    row.as_ref().map(budget_from_row).transpose()
}

pub(super) async fn agent_budgets(store: &SqlStore) -> Result<Vec<Budget>> {
    let rows = sqlx::query("SELECT * FROM budgets WHERE process_name LIKE 'agent:%' ORDER BY process_name")
        .fetch_all(&store.database.reads)
        .await?;
    rows.iter().map(budget_from_row).collect()
}

pub(super) async fn agent_usage<'a>(store: &'a SqlStore, agent_id: &'a str, since: i64) -> Result<Usage> {
    let row = sqlx::query(
        "SELECT COUNT(*) AS runs, CAST(COALESCE(SUM(cost), 0) AS DOUBLE PRECISION) AS cost, \
         CAST(COALESCE(SUM(tokens_used), 0) AS BIGINT) AS tokens \
         FROM steps WHERE executor = $1 AND started_at >= $2",
    )
    .bind(agent_id.to_owned())
    .bind(since)
    .fetch_one(&store.database.reads)
    .await?;
    usage_from_row(&row)
}

pub(super) async fn put_budget<'a>(store: &'a SqlStore, budget: &'a Budget, set_by: &'a str) -> Result<()> {
    if budget.is_unlimited() {
        sqlx::query("DELETE FROM budgets WHERE process_name = $1")
            .bind(budget.process_name.clone())
            .execute(&store.database.pool)
            .await?;
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO budgets (process_name, period_seconds, max_cost, max_tokens, max_runs, run_max_cost, \
         run_max_tokens, on_exceed, set_at, set_by) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (process_name) DO UPDATE SET period_seconds = excluded.period_seconds, \
         max_cost = excluded.max_cost, max_tokens = excluded.max_tokens, max_runs = excluded.max_runs, \
         run_max_cost = excluded.run_max_cost, run_max_tokens = excluded.run_max_tokens, \
         on_exceed = excluded.on_exceed, set_at = excluded.set_at, set_by = excluded.set_by",
    )
    .bind(budget.process_name.clone())
    .bind(i64::try_from(budget.period_seconds).unwrap_or(i64::MAX))
    .bind(budget.max_cost)
    .bind(i64::try_from(budget.max_tokens).unwrap_or(i64::MAX))
    .bind(i64::from(budget.max_runs))
    .bind(budget.run_max_cost)
    .bind(i64::try_from(budget.run_max_tokens).unwrap_or(i64::MAX))
    .bind(budget.on_exceed.as_str())
    .bind(muster_runtime::time::now_millis())
    .bind(set_by.to_owned())
    .execute(&store.database.pool)
    .await?;
    Ok(())
}

pub(super) async fn process_usage<'a>(
    store: &'a SqlStore,
    process_name: &'a str,
    since: i64,
    except_execution: &'a str,
) -> Result<Usage> {
    let row = sqlx::query(
        "SELECT COUNT(DISTINCT e.id) AS runs, CAST(COALESCE(SUM(s.cost), 0) AS DOUBLE PRECISION) AS cost, \
         CAST(COALESCE(SUM(s.tokens_used), 0) AS BIGINT) AS tokens \
         FROM executions e LEFT JOIN steps s ON s.execution_id = e.id \
         WHERE e.process_name = $1 AND e.started_at >= $2 AND e.id <> $3",
    )
    .bind(process_name.to_owned())
    .bind(since)
    .bind(except_execution.to_owned())
    .fetch_one(&store.database.reads)
    .await?;
    usage_from_row(&row)
}

/// A usage query's row: `runs`, `cost` and `tokens`.
fn usage_from_row(row: &AnyRow) -> Result<Usage> {
    Ok(Usage {
        cost: row.try_get("cost")?,
        tokens: row.try_get::<i64, _>("tokens")? as u64,
        runs: row.try_get::<i64, _>("runs")? as u64,
    })
}

fn budget_from_row(row: &AnyRow) -> Result<Budget> {
    Ok(Budget {
        process_name: row.try_get("process_name")?,
        period_seconds: row.try_get::<i64, _>("period_seconds")? as u64,
        max_cost: row.try_get("max_cost")?,
        max_tokens: row.try_get::<i64, _>("max_tokens")? as u64,
        max_runs: row.try_get::<i64, _>("max_runs")? as u32,
        run_max_cost: row.try_get("run_max_cost")?,
        run_max_tokens: row.try_get::<i64, _>("run_max_tokens")? as u64,
        on_exceed: {
            let action: String = row.try_get("on_exceed")?;
            budget::Action::parse(&action)
                .ok_or_else(|| Error::Storage(format!("unknown budget action '{action}' in the database")))?
        },
        source: budget::Source::Operator,
    })
}
