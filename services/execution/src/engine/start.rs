//! Starting a run: admission under the process's and agents' budgets and
//! throttles, one run at a time per limit across the replicas, then the
//! execution created and its driver spawned.

use std::{sync::Arc, time::Duration};
use tracing::Instrument as _;

use super::{Engine, StartRequest, TOOL_CALL};
use crate::{
    Error, Result,
    domain::{
        ExecutionStatus,
        budget::Budget,
        model::{Event, EventKind, Execution, ProcessVersion, Step},
    },
    store::{StepWrite, Write},
};

impl Engine {
    /// Creates an execution and starts driving it; with an idempotency key
    /// already used, returns that execution instead.
    pub(crate) async fn start(self: &Arc<Self>, request: StartRequest) -> Result<Execution> {
        Ok(self.start_with_steps(request).await?.0)
    }

    /// [`Engine::start`], with the steps of an execution it created as they
    /// were committed (`None`: the idempotency key's execution, not created
    /// now), so that an answer shows them without reading them back.
    pub(crate) async fn start_with_steps(
        self: &Arc<Self>,
        request: StartRequest,
    ) -> Result<(Execution, Option<Vec<Step>>)> {
        if let Some(key) = &request.idempotency_key
            && let Some(existing) = self.store.find_by_idempotency_key(key).await?
        {
            let execution = self.store.execution(&existing).await?.ok_or_else(|| {
                Error::not_found(
                    "muster.execution.v1.Execution",
                    existing.to_string(),
                    format!("execution {existing} vanished"),
                )
            })?;
            return Ok((execution, None));
        }
        // A tool step runs under an agent's identity: the one it names, the
        // roster's choice, or the execution's lead.
        if request.lead_agent_id.is_empty()
            && let Some(step) = request
                .process
                .definition
                .steps
                .iter()
                .find(|step| step.step_type == TOOL_CALL && step.executor().is_none() && step.delegate.is_none())
        {
            return Err(Error::precondition(
                "TOOL_STEP_WITHOUT_AGENT",
                format!("step/{}", step.id),
                format!(
                    "tool_call step '{}' runs under an agent's identity: name it with 'agent' or 'roles.executor', \
                 ask the roster with 'delegate', or give the execution a lead",
                    step.id
                ),
            ));
        }
        let (admitted, budget) = self.admit(&request.process).await?;
        let now = muster_runtime::time::now_millis();
        let trace_parent = muster_runtime::telemetry::traceparent(&tracing::Span::current());
        let mut execution = Execution {
            id: uuid::Uuid::now_v7().to_string(),
            process_name: request.process.name.clone(),
            process_version: request.process.version,
            status: ExecutionStatus::Running,
            reason: String::new(),
            lead_agent_id: request.lead_agent_id,
            inputs_json: request.inputs_json,
            idempotency_key: request.idempotency_key,
            started_at: now,
            ended_at: None,
            last_sequence: 0,
            // The execution joins the trace of the call that starts it.
            trace_parent: trace_parent.clone(),
            session: request.session,
        };
        let mut events = vec![Event::new(&mut execution, EventKind::ExecutionStarted, now, trace_parent.clone())];
        if let Some(session) = execution.session.clone() {
            // The task context goes to every participant.
            let mut started = Event::new(&mut execution, EventKind::SessionStarted, now, trace_parent);
            started.participants = session.assignments.keys().cloned().collect();
            started.detail =
                crate::domain::session::context_window(&execution.id, &session, &execution.lead_agent_id, &[]);
            started.matrix_version = self.matrix().version;
            events.push(started);
        }
        let definition = &request.process.definition;
        let steps: Vec<Step> = definition.steps.iter().map(|_| Step::new()).collect();
        let step_writes = steps
            .iter()
            .zip(&definition.steps)
            .enumerate()
            .map(|(position, (step, step_definition))| StepWrite {
                execution_id: execution.id.clone(),
                position: position as u32,
                step_id: step_definition.id.clone(),
                step: step.clone(),
            })
            .collect();
        let mut writes =
            vec![Write::CreateExecution(execution.clone()), Write::Steps(step_writes), Write::Events(events.clone())];
        if let Some((due, next)) = request.fired_schedule {
            writes.push(Write::FireSchedule {
                process_name: execution.process_name.clone(),
                due,
                next,
                execution_id: execution.id.clone(),
                fired_at: now,
            });
        }
        if !request.claimed_messages.is_empty() {
            writes.push(Write::ClaimMessages {
                execution_id: execution.id.clone(),
                message_ids: request.claimed_messages,
            });
        }
        // Created and given its driver whether or not the caller waits for
        // the answer: a call dropped while its creation is committed would
        // otherwise leave a run this live replica owns and nothing drives.
        let engine = self.clone();
        let process = request.process;
        let created = async move {
            let _admitted = admitted;
            engine.store.commit(writes).await?;
            engine.announce(events);
            tracing::info!(execution_id = %execution.id, process = %execution.process_name, version = execution.process_version, "execution started");
            engine.spawn_driver(execution.clone(), steps.clone(), process, Some(budget));
            Ok((execution, Some(steps)))
        };
        tokio::spawn(created.instrument(tracing::Span::current()))
            .await
            .map_err(|error| Error::Storage(format!("creating the execution stopped: {error}")))?
    }

    /// Checks that a run of `process` may start now, under its budget, its
    /// throttle and the budgets of the agents it names; the budget in
    /// force, for the run's driver. Runs under a limit per period or a
    /// throttle start one at a time, each after the check (the guard
    /// answered is held until it is created), in this replica and, on
    /// PostgreSQL, across replicas, so that concurrent starts cannot
    /// overrun them. An agent's budget is locked as a process's is, by its
    /// key (`agent:ID`, which no process name can be).
    async fn admit(&self, process: &ProcessVersion) -> Result<(Option<Admitted>, Option<Budget>)> {
        // The agents the process names as executors, in order: every
        // replica locks them in that order, then the process.
        let mut named: Vec<&str> = process.definition.steps.iter().filter_map(|step| step.executor()).collect();
        named.sort_unstable();
        named.dedup();
        let agent_budgets: Vec<Budget> = named.into_iter().filter_map(|agent_id| self.agent_budget(agent_id)).collect();
        let budget = self.budget_of(process).await?;
        let period_limited = budget.as_ref().filter(|budget| budget.has_period_limit());
        let throttle = process
            .definition
            .throttle
            .filter(|throttle| throttle.min_interval_seconds > 0 || throttle.max_concurrent > 0);
        if agent_budgets.is_empty() && period_limited.is_none() && throttle.is_none() {
            return Ok((None, budget));
        }
        // One start at a time in this replica, then across replicas (the
        // local gate first: a replica holds at most one start's database
        // connections waiting for the shared locks).
        let local = self.admission_gate.clone().lock_owned().await;
        let keys: Vec<&str> = agent_budgets
            .iter()
            .map(|agent_budget| agent_budget.process_name.as_str())
            .chain((period_limited.is_some() || throttle.is_some()).then_some(process.name.as_str()))
            .collect();
        let admitted = Admitted { _local: local, _shared: self.store.admission_lock(&keys).await? };
        let now = muster_runtime::time::now_millis();
        for agent_budget in &agent_budgets {
            let agent_id = agent_budget.agent_id().unwrap_or_default();
            let usage = self.store.agent_usage(agent_id, agent_budget.period_start(now)).await?;
            if let Some(exhausted) = agent_budget.exhausted(&usage) {
                return Err(Error::BudgetExhausted {
                    key: agent_budget.process_name.clone(),
                    description: format!("{} ({} budget)", exhausted.description, agent_budget.source.as_str()),
                });
            }
        }
        if let Some(budget) = period_limited {
            let usage = self.store.process_usage(&budget.process_name, budget.period_start(now), "").await?;
            if let Some(exhausted) = budget.exhausted(&usage) {
                return Err(Error::BudgetExhausted {
                    key: budget.process_name.clone(),
                    description: format!("{} ({} budget)", exhausted.description, budget.source.as_str()),
                });
            }
        }
        if let Some(throttle) = throttle {
            let activity = self.store.process_activity(&process.name).await?;
            let throttled = |description: String, retry_after| Error::Throttled {
                process: process.name.clone(),
                description,
                retry_after,
            };
            if throttle.max_concurrent > 0 && activity.underway >= u64::from(throttle.max_concurrent) {
                let runs = if throttle.max_concurrent == 1 { "run" } else { "runs" };
                return Err(throttled(
                    format!(
                        "it allows {} {runs} at a time; {} of {} runs underway",
                        throttle.max_concurrent, activity.underway, throttle.max_concurrent
                    ),
                    None,
                ));
            }
            let interval = i64::try_from(throttle.min_interval_seconds.saturating_mul(1000)).unwrap_or(i64::MAX);
            if let Some(last) = activity.last_started_at
                && now < last.saturating_add(interval)
            {
                let wait = last.saturating_add(interval) - now;
                return Err(throttled(
                    format!(
                        "it starts runs at least {} s apart; the next may start in {} s",
                        throttle.min_interval_seconds,
                        (wait as u64).div_ceil(1000)
                    ),
                    Some(Duration::from_millis(wait as u64)),
                ));
            }
        }
        Ok((Some(admitted), budget))
    }

    /// The budget in force for a process: the one an operator set, else the
    /// one it declares.
    pub(crate) async fn budget_of(&self, process: &ProcessVersion) -> Result<Option<Budget>> {
        if let Some(budget) = self.store.budget(&process.name).await? {
            return Ok(Some(budget));
        }
        Ok(process.definition.budget.as_ref().map(|declared| Budget::from((process.name.as_str(), declared))))
    }
}

/// Held from a run's admission until it is created: see [`Engine::admit`].
pub(crate) struct Admitted {
    _local: tokio::sync::OwnedMutexGuard<()>,
    _shared: Option<crate::store::AdmissionLock>,
}
