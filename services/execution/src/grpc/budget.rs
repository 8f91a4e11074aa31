//! Budgets on the wire: setting a process's budget and listing the budgets
//! in force with their use (the engine refuses the runs past them).

use muster_proto::execution::v1 as wire;
use muster_runtime::auth::Caller;

use super::{ExecutionGrpc, is_role_name, paging::page_size};
use crate::{
    Error, Result,
    domain::{
        budget::{Action, Budget, Source, Usage, agent_key},
        model::ProcessVersion,
    },
    engine::roles,
};

/// Longest budget period: a year.
const MAX_PERIOD_SECONDS: u64 = 31_536_000;
/// Largest cost limit, in US dollars.
const MAX_COST: f64 = 1e9;
/// Largest token limit.
const MAX_TOKENS: u64 = 1_000_000_000_000_000;
/// Processes read at a time while listing.
const SCAN: u32 = 200;

/// A budget from a SetBudget request, checked.
fn budget_from_wire(budget: Option<wire::Budget>) -> Result<Budget> {
    let mut budget = budget.ok_or_else(|| Error::invalid("budget", "budget is required"))?;
    match wire::BudgetScope::try_from(budget.scope) {
        Ok(wire::BudgetScope::Process) => {
            if !muster_format::is_identifier(&budget.name) {
                return Err(Error::invalid(
                    "budget.name",
                    format!(
                        "budget.name '{}' is not a process name",
                        muster_runtime::status::truncate(&budget.name, 128)
                    ),
                ));
            }
        }
        // A role's runs are those of the process that runs it.
        Ok(wire::BudgetScope::Role) => {
            if !is_role_name(&budget.name) {
                return Err(Error::invalid(
                    "budget.name",
                    format!("budget.name '{}' is not a role name", muster_runtime::status::truncate(&budget.name, 128)),
                ));
            }
            budget.name = roles::process_name(&budget.name);
        }
        Ok(wire::BudgetScope::Agent) => {
            let well_formed = !budget.name.is_empty()
                && budget.name.len() <= 64
                && budget.name.chars().all(|character| {
                    character.is_ascii_lowercase() || character.is_ascii_digit() || "-_.".contains(character)
                });
            if !well_formed {
                return Err(Error::invalid(
                    "budget.name",
                    format!("budget.name '{}' is not an agent id", muster_runtime::status::truncate(&budget.name, 128)),
                ));
            }
            if budget.run_max_cost != 0.0 || budget.run_max_tokens != 0 {
                return Err(Error::invalid(
                    "budget.run_max_cost",
                    "an agent's budget has no per-run limits (run_max_cost, run_max_tokens): \
                     set them on the process or role"
                        .to_owned(),
                ));
            }
            if budget.on_exceed == wire::BudgetAction::Pause as i32 {
                return Err(Error::invalid(
                    "budget.on_exceed",
                    "budget.on_exceed of an agent's budget is stop (its steps are refused) or warn".to_owned(),
                ));
            }
            budget.name = agent_key(&budget.name);
        }
        _ => {
            return Err(Error::invalid(
                "budget.scope",
                "budget.scope must be BUDGET_SCOPE_PROCESS, BUDGET_SCOPE_ROLE or BUDGET_SCOPE_AGENT".to_owned(),
            ));
        }
    }
    let on_exceed = match wire::BudgetAction::try_from(budget.on_exceed) {
        Ok(wire::BudgetAction::Unspecified | wire::BudgetAction::Stop) => Action::Stop,
        Ok(wire::BudgetAction::Pause) => Action::Pause,
        Ok(wire::BudgetAction::Warn) => Action::Warn,
        Err(_) => {
            return Err(Error::invalid(
                "budget.on_exceed",
                format!("budget.on_exceed {} is not a BudgetAction", budget.on_exceed),
            ));
        }
    };
    let period_seconds = muster_runtime::time::duration_seconds(budget.period.as_ref())
        .map_err(|problem| Error::invalid("budget.period", format!("budget.period {problem}")))?;
    let checked = Budget {
        process_name: budget.name,
        period_seconds,
        max_cost: budget.max_cost,
        max_tokens: budget.max_tokens,
        max_runs: budget.max_runs,
        run_max_cost: budget.run_max_cost,
        run_max_tokens: budget.run_max_tokens,
        on_exceed,
        source: Source::Operator,
    };
    for (field, cost) in [("max_cost", checked.max_cost), ("run_max_cost", checked.run_max_cost)] {
        if !(cost.is_finite() && (0.0..=MAX_COST).contains(&cost)) {
            return Err(Error::invalid(
                format!("budget.{field}"),
                format!("budget.{field} must be from 0 to {MAX_COST} US dollars, not {cost}"),
            ));
        }
    }
    for (field, tokens) in [("max_tokens", checked.max_tokens), ("run_max_tokens", checked.run_max_tokens)] {
        if tokens > MAX_TOKENS {
            return Err(Error::invalid(
                format!("budget.{field}"),
                format!("budget.{field} must be at most {MAX_TOKENS}"),
            ));
        }
    }
    if checked.has_period_limit() && !(1..=MAX_PERIOD_SECONDS).contains(&checked.period_seconds) {
        return Err(Error::invalid(
            "budget.period",
            format!(
                "budget.period must be from 1 to {MAX_PERIOD_SECONDS} seconds with a limit per period, not {} s",
                checked.period_seconds
            ),
        ));
    }
    Ok(checked)
}

impl ExecutionGrpc {
    pub(super) async fn set_budget(
        &self,
        caller: &Caller,
        request: wire::SetBudgetRequest,
    ) -> Result<wire::SetBudgetResponse> {
        let for_role = request.budget.as_ref().is_some_and(|budget| budget.scope == wire::BudgetScope::Role as i32);
        let budget = budget_from_wire(request.budget)?;
        if let Some(agent_id) = budget.agent_id() {
            self.roster_agent(agent_id, "budget.name").await?;
            self.engine.store.put_budget(&budget, &caller.to_string()).await?;
            self.engine.load_agent_budgets().await?;
            tracing::info!(agent_id, %caller, "agent budget set");
            let set = if budget.is_unlimited() { None } else { Some(self.agent_budget_in_force(budget).await?) };
            return Ok(wire::SetBudgetResponse { budget: set });
        }
        let process = self.engine.process(&budget.process_name, None).await?.ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.Process",
                &budget.process_name,
                if for_role {
                    format!(
                        "the role has no runs of its own (no process '{}'): give it a schedule or an inbox",
                        budget.process_name
                    )
                } else {
                    format!("no process named '{}' is published", budget.process_name)
                },
            )
        })?;
        self.engine.store.put_budget(&budget, &caller.to_string()).await?;
        tracing::info!(process = %budget.process_name, %caller, "budget set");
        Ok(wire::SetBudgetResponse { budget: self.budget_in_force(&process).await? })
    }

    pub(super) async fn list_budgets(&self, request: wire::ListBudgetsRequest) -> Result<wire::ListBudgetsResponse> {
        super::key_token(&request.page_token)?;
        let size = page_size(request.page_size) as usize;
        if request.scope == wire::BudgetScope::Agent as i32 {
            let all = self.engine.store.agent_budgets().await?;
            let start = all.partition_point(|budget| budget.process_name <= request.page_token);
            let page: Vec<Budget> = all[start..].iter().take(size).cloned().collect();
            let next_page_token = match page.last() {
                Some(last) if start + page.len() < all.len() => last.process_name.clone(),
                _ => String::new(),
            };
            let mut budgets = Vec::with_capacity(page.len());
            for budget in page {
                budgets.push(self.agent_budget_in_force(budget).await?);
            }
            return Ok(wire::ListBudgetsResponse { budgets, next_page_token });
        }
        let mut after = request.page_token;
        let mut budgets = Vec::new();
        loop {
            let processes = self.engine.store.list_processes(&after, SCAN).await?;
            for process in &processes {
                after = process.name.clone();
                if let Some(budget) = self.budget_in_force(process).await? {
                    budgets.push(budget);
                    if budgets.len() == size {
                        return Ok(wire::ListBudgetsResponse { budgets, next_page_token: after });
                    }
                }
            }
            if processes.len() < SCAN as usize {
                return Ok(wire::ListBudgetsResponse { budgets, next_page_token: String::new() });
            }
        }
    }

    /// An agent's budget with its use in the current period.
    async fn agent_budget_in_force(&self, budget: Budget) -> Result<wire::Budget> {
        let agent_id = budget.agent_id().unwrap_or_default().to_owned();
        let now = muster_runtime::time::now_millis();
        let usage = self.engine.store.agent_usage(&agent_id, budget.period_start(now)).await?;
        Ok(budget_to_wire(&budget, wire::BudgetScope::Agent, agent_id, usage))
    }

    /// A process's budget in force with its use in the current period.
    async fn budget_in_force(&self, process: &ProcessVersion) -> Result<Option<wire::Budget>> {
        let Some(budget) = self.engine.budget_of(process).await? else { return Ok(None) };
        let now = muster_runtime::time::now_millis();
        let usage = self.engine.store.process_usage(&budget.process_name, budget.period_start(now), "").await?;
        // The process of a role's runs shows as the role's budget.
        let (scope, name) = match roles::owned_role(&process.definition.description) {
            Some(role) if process.name == roles::process_name(&role) => (wire::BudgetScope::Role, role),
            _ => (wire::BudgetScope::Process, budget.process_name.clone()),
        };
        Ok(Some(budget_to_wire(&budget, scope, name, usage)))
    }
}

/// A budget on the wire, under `scope` and `name`, with its use.
fn budget_to_wire(budget: &Budget, scope: wire::BudgetScope, name: String, usage: Usage) -> wire::Budget {
    wire::Budget {
        scope: scope as i32,
        name,
        period: (budget.period_seconds > 0).then(|| muster_runtime::time::seconds_to_duration(budget.period_seconds)),
        max_cost: budget.max_cost,
        max_tokens: budget.max_tokens,
        max_runs: budget.max_runs,
        used_cost: usage.cost,
        used_tokens: usage.tokens,
        used_runs: u32::try_from(usage.runs).unwrap_or(u32::MAX),
        source: budget.source.as_str().to_owned(),
        run_max_cost: budget.run_max_cost,
        run_max_tokens: budget.run_max_tokens,
        on_exceed: action_to_wire(budget.on_exceed) as i32,
    }
}

fn action_to_wire(action: Action) -> wire::BudgetAction {
    match action {
        Action::Stop => wire::BudgetAction::Stop,
        Action::Pause => wire::BudgetAction::Pause,
        Action::Warn => wire::BudgetAction::Warn,
    }
}
