//! What a running execution spends against its process's budget: after each
//! completed step, and whenever a running attempt reports more use
//! ([`super::progress`]), the run's cost and tokens — its completed steps'
//! plus what its attempts underway reported so far, with what the process's
//! other runs had used in the period when the budget was first read — are
//! checked against the budget's limits. The first limit gone over is acted
//! on once, as the budget says — the run stops (a step underway is
//! withdrawn), pauses or goes on — and the step's monitors and the lead are
//! told (`budget_exceeded`).
//!
//! An agent's budget is checked before each of its steps starts, against
//! what the steps it started in the period used: a step past a limit is
//! refused (it fails with `BUDGET_EXHAUSTED`), or, with `warn`, goes on;
//! either way the step's monitors and the lead are told.

use super::Driver;
use crate::{
    Result,
    domain::{
        ExecutionStatus, StepStatus,
        budget::{Action, Budget, Usage},
        model::EventKind,
    },
};

/// A budget that limits cost or tokens, and the use counted against it.
pub(super) struct Spending {
    budget: Budget,
    /// This run's completed steps' use so far.
    run: Usage,
    /// The other runs' use in the period, when the budget was read.
    others: Usage,
    /// Whether a limit was gone over (and acted on) already.
    acted: bool,
}

impl Driver {
    /// Reads what an attempt's executor used in its budget's period; the
    /// attempt goes on when the answer comes ([`Driver::agent_usage_known`]).
    pub(super) fn read_agent_usage(&mut self, position: usize, attempt: u32, agent_id: String, budget: Budget) {
        let store = self.engine.store.clone();
        let driver = self.route.clone();
        self.engine.spawn(async move {
            let since = budget.period_start(muster_runtime::time::now_millis());
            let usage = loop {
                match store.agent_usage(&agent_id, since).await {
                    Ok(usage) => break usage,
                    Err(error) => {
                        tracing::warn!(%error, agent_id, "reading an agent's use of its budget failed; retrying");
                        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                    }
                }
            };
            let _ = driver.send(super::Input::AgentUsage { position, attempt, budget, usage });
        });
    }

    /// The executor's use is known: its step starts, is refused, or (with
    /// `warn`) starts with a warning.
    pub(super) fn agent_usage_known(&mut self, position: usize, attempt: u32, budget: &Budget, usage: Usage) {
        if !self.is_current(position, attempt)
            || !matches!(self.steps[position].status, StepStatus::Ready | StepStatus::Queued)
        {
            return;
        }
        let agent_id = self.steps[position].executor.clone();
        let Some(super::Known::Ready(context)) = self.contexts.get(&agent_id) else { return };
        let context = context.clone();
        if let Some(exhausted) = budget.exhausted(&usage) {
            let reason = format!(
                "budget of {} exhausted: {} ({} budget)",
                budget.owner(),
                exhausted.description,
                budget.source.as_str()
            );
            let refused = budget.on_exceed != Action::Warn;
            if refused || self.warned_agents.insert(agent_id.clone()) {
                tracing::warn!(execution_id = %self.execution.id, %reason, "agent over budget");
                let mut event = self.step_event(EventKind::BudgetExceeded, position);
                let done = if refused { "the step is refused" } else { "the step goes on" };
                event.detail = format!("{reason}; {done}");
                event.cost = usage.cost;
                event.tokens_used = usage.tokens;
                self.record(event);
            }
            if refused {
                self.end_attempt(position);
                self.fail(position, "BUDGET_EXHAUSTED", reason);
                return;
            }
        }
        self.within_agent_budget.insert((position, attempt));
        self.assign(position, context);
    }

    /// Counts a completed step's cost and tokens; the reason to cancel the
    /// execution when a limit is gone over and the budget says to stop.
    pub(super) async fn spend(&mut self, position: usize) -> Result<Option<String>> {
        let step = &self.steps[position];
        let used = Usage { cost: step.cost, tokens: step.tokens_used, runs: 0 };
        // Read the first time, the budget counts the completed steps, this one included.
        if let Some(Some(spending)) = &mut self.spending {
            spending.run.cost += used.cost;
            spending.run.tokens = spending.run.tokens.saturating_add(used.tokens);
        }
        self.check_spending(position).await
    }

    /// Checks the run's use (its completed steps' and its attempts'
    /// underway) against the budget, reading it the first time; acts on the
    /// first limit gone over, with `position` as the step that went over.
    /// The reason to cancel the execution when the budget says to stop.
    pub(super) async fn check_spending(&mut self, position: usize) -> Result<Option<String>> {
        if self.spending.is_none() {
            self.spending = Some(self.read_budget().await?);
        }
        let in_flight = self.in_flight_use();
        let Some(Some(spending)) = &mut self.spending else { return Ok(None) };
        if spending.acted {
            return Ok(None);
        }
        let run = Usage {
            cost: spending.run.cost + in_flight.cost,
            tokens: spending.run.tokens.saturating_add(in_flight.tokens),
            runs: 0,
        };
        let Some(exceeded) = spending.budget.exceeded(&run, &spending.others) else { return Ok(None) };
        spending.acted = true;
        let action = spending.budget.on_exceed;
        let reason = format!("budget exceeded: {} ({} budget)", exceeded.description, spending.budget.source.as_str());
        let done = match action {
            Action::Stop => "the run is stopped",
            Action::Pause => "the run is paused until it is resumed",
            Action::Warn => "the run goes on",
        };
        tracing::warn!(execution_id = %self.execution.id, %reason, action = action.as_str(), "over budget");
        let mut event = self.step_event(EventKind::BudgetExceeded, position);
        event.detail = format!("{reason}; {done}");
        event.cost = run.cost;
        event.tokens_used = run.tokens;
        self.record(event);
        match action {
            Action::Stop => return Ok(Some(reason)),
            Action::Pause if self.execution.status == ExecutionStatus::Running => {
                self.execution.status = ExecutionStatus::Paused;
                self.stage_execution();
            }
            Action::Pause | Action::Warn => {}
        }
        Ok(None)
    }

    /// The budget in force (as the run's start found it, or read now), if it
    /// limits cost or tokens, with the use so far.
    async fn read_budget(&mut self) -> Result<Option<Spending>> {
        let budget = match self.budget.take() {
            Some(known) => known,
            None => self.engine.budget_of(&self.process).await?,
        };
        let Some(budget) = budget else { return Ok(None) };
        if !budget.limits_use() {
            return Ok(None);
        }
        let mut run = Usage::default();
        for step in self.steps.iter().filter(|step| step.status == StepStatus::Completed) {
            run.cost += step.cost;
            run.tokens = run.tokens.saturating_add(step.tokens_used);
        }
        let others = if budget.has_period_limit() {
            let since = budget.period_start(muster_runtime::time::now_millis());
            self.engine.store.process_usage(&budget.process_name, since, &self.execution.id).await?
        } else {
            Usage::default()
        };
        Ok(Some(Spending { budget, run, others, acted: false }))
    }
}
