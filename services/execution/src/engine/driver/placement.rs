//! Placement: who takes a started step (the roster asked about a named
//! executor's capacity and status, or to choose by criteria, one question
//! per step or a turn's questions in one batch), what the driver learns of
//! that agent (its context and its role's memory, kept across executions),
//! whether it may perform the step, and the worker the step then goes to.

use std::{cmp::Reverse, sync::Arc, time::Duration};

use tracing::Instrument as _;

use super::{Driver, Effect, Known, Timer};
use crate::{
    clients::roster::{DelegationAsk, RETRY_PAUSE, RosterFailure, patiently},
    domain::{
        StepStatus,
        authority::{self, Subject},
        model::{AgentContext, EventKind},
    },
    engine::{Found, Input, Route, workers::Slot},
};

impl Driver {
    /// The agent the step was reassigned or handed to, else the one it
    /// names; a tool step that names none and has no criteria runs as the
    /// execution's lead.
    pub(in crate::engine) fn named_executor(&self, position: usize) -> Option<String> {
        let definition = self.definition(position);
        self.steps[position].assigned_to.clone().or_else(|| definition.executor().map(str::to_owned)).or_else(|| {
            (self.is_tool_step(position) && definition.delegate.is_none() && !self.execution.lead_agent_id.is_empty())
                .then(|| self.execution.lead_agent_id.clone())
        })
    }

    /// Asks the roster who takes a step (`assigned`: about the agent named
    /// for it); its answer comes back as [`Input::Executor`].
    pub(in crate::engine) fn ask_roster(&mut self, position: usize, assigned: Option<String>) {
        let Some(ask) = self.delegation_ask(position, assigned) else {
            let message = "the step names no executor and asks for no delegation".to_owned();
            self.end_attempt(position);
            self.fail(position, "NO_EXECUTOR", message);
            return;
        };
        let route = self.route(position);
        let span = self.spans[position].clone().unwrap_or_else(tracing::Span::none);
        self.asks.push((ask, route, span));
    }

    /// What the roster is asked about a step (`assigned`: about the agent
    /// named for it); `None` when the step names nobody and gives no criteria.
    pub(in crate::engine) fn delegation_ask(&self, position: usize, assigned: Option<String>) -> Option<DelegationAsk> {
        let definition = self.definition(position);
        let criteria = match (&assigned, definition.delegate.clone()) {
            (_, Some(criteria)) => criteria,
            (Some(_), None) => muster_format::DelegationRequest::default(),
            (None, None) => return None,
        };
        Some(DelegationAsk {
            assigned_agent_id: assigned.unwrap_or_default(),
            task_id: self.task_id(position),
            requester_id: self.execution.lead_agent_id.clone(),
            required_expertise: criteria.expertise,
            required_role: criteria.role.unwrap_or_default(),
            team: criteria.team.unwrap_or_default(),
            urgency: criteria.urgency.unwrap_or_default(),
            deadline: criteria.deadline.as_deref().and_then(|text| muster_format::rfc3339_millis(text).ok()),
            delegation_chain: self.steps[position].delegation_chain.clone(),
            description: definition.message.clone(),
            only_if_free: false,
        })
    }

    /// Sends the turn's questions to the roster: one alone, or all in one
    /// batch (a fan-out's steps are placed in one round trip).
    pub(super) fn send_asks(&mut self) {
        let roster = self.engine.roster.clone();
        match self.asks.len() {
            0 => {}
            1 => {
                let (ask, route, span) = self.asks.pop().expect("one ask");
                self.engine.spawn(resolve(roster, ask, route, None).instrument(span));
            }
            _ => {
                let asks = std::mem::take(&mut self.asks);
                let engine = self.engine.clone();
                self.engine.spawn(async move {
                    let questions: Vec<DelegationAsk> = asks.iter().map(|(ask, ..)| ask.clone()).collect();
                    let answers =
                        patiently(RETRY_PAUSE, "a delegation", || roster.delegate_batch(questions.clone()))
                            .await;
                    match answers {
                        Ok(decisions) => {
                            for ((ask, route, span), decision) in asks.into_iter().zip(decisions) {
                                engine.spawn(resolve(roster.clone(), ask, route, Some(decision)).instrument(span));
                            }
                        }
                        // A roster that cannot batch is asked task by task.
                        Err(failure) => {
                            tracing::warn!(error = %failure.message(), "the roster refused a batch; asking task by task");
                            for (ask, route, span) in asks {
                                engine.spawn(resolve(roster.clone(), ask, route, None).instrument(span));
                            }
                        }
                    }
                });
            }
        }
    }

    pub(in crate::engine) fn executor_found(&mut self, position: usize, attempt: u32, found: Found) {
        if let Some(agent) = self.asked_ahead(position, attempt) {
            return self.ahead_answered(position, attempt, agent, found);
        }
        if !self.is_current(position, attempt) {
            // The step moved on while the roster decided: give back what it
            // reserved, unless the step holds the task's slot again since.
            if matches!(found, Found::Chosen { .. }) && !self.active[position] && !self.steps[position].roster_reserved
            {
                self.release_later(self.task_id(position));
            }
            return;
        }
        match found {
            Found::Chosen { agent_id, escalated, detail } => {
                self.steps[position].executor = agent_id.clone();
                self.steps[position].wait_seconds = 0;
                self.steps[position].roster_reserved = true;
                // The agent the step names taking it is no news; anyone else is.
                if escalated || self.named_executor(position).as_ref() != Some(&agent_id) {
                    let kind = if escalated { EventKind::StepEscalated } else { EventKind::StepDelegated };
                    let mut event = self.step_event(kind, position);
                    event.detail = detail;
                    self.record(event);
                }
                self.executor_known(position, attempt, agent_id);
            }
            Found::Queued { expert_id, wait_seconds, detail } => {
                let step = &mut self.steps[position];
                step.executor = expert_id;
                step.wait_seconds = wait_seconds;
                self.set_status(position, StepStatus::Queued);
                let mut event = self.step_event(EventKind::StepQueued, position);
                event.wait_seconds = wait_seconds;
                event.detail = detail;
                self.record(event);
            }
            Found::Failed { code, message } => match self.named_executor(position) {
                // Nobody to escalate to for an agent the step names: the step
                // waits for that agent (up to its schedule-to-start time),
                // where a lead or operator can see it and reassign it.
                Some(named) if code == "ESCALATED" => {
                    tracing::info!(execution_id = %self.execution.id, step = %self.definition(position).id, agent_id = %named, reason = %message, "waiting for the named executor");
                    self.executor_known(position, attempt, named);
                }
                _ => {
                    self.end_attempt(position);
                    self.fail(position, &code, message);
                }
            },
        }
    }

    /// The executor is known: with what the roster says of it, the step goes
    /// to a worker.
    pub(in crate::engine) fn executor_known(&mut self, position: usize, attempt: u32, agent_id: String) {
        self.steps[position].executor = agent_id.clone();
        self.stage_lazily(position);
        match self.contexts.get_mut(&agent_id) {
            Some(Known::Ready(context)) => {
                let role = context.roster_role.clone();
                self.check_memory(position, attempt, agent_id, role);
            }
            Some(Known::Fetching(waiting)) => waiting.push((position, attempt)),
            // Kept by the engine with its role's memory, whose version has
            // not moved: the attempt goes on in this turn.
            None if self.staged.memories.is_empty()
                && let Some((context, memory_version)) = self.engine.context_at_hand(&agent_id) =>
            {
                self.memory_versions.insert(agent_id.clone(), memory_version);
                self.contexts.insert(agent_id.clone(), Known::Fetching(vec![(position, attempt)]));
                self.context_known(agent_id, Ok(context));
            }
            None => {
                self.contexts.insert(agent_id.clone(), Known::Fetching(vec![(position, attempt)]));
                let engine = self.engine.clone();
                let driver = self.route.clone();
                self.spawn_reading_memory(async move {
                    let fetched = engine.agent_context(&agent_id).await;
                    let mut memory_version = 0;
                    let fetched = match fetched {
                        Ok(context) => {
                            let memory;
                            (memory_version, memory) = engine.recall_kept(&context.roster_role).await;
                            Ok(AgentContext { memory, ..(*context).clone() })
                        }
                        Err(failure) => Err(failure),
                    };
                    let context = fetched.map(Arc::new).map_err(|failure| match failure {
                        RosterFailure::NotFound(_) => format!("agent '{agent_id}' is not in the roster"),
                        other => format!("the roster cannot describe agent '{agent_id}': {}", other.message()),
                    });
                    let _ = driver.send(Input::Context { agent_id, context, memory_version });
                });
            }
        }
    }

    /// Spawns `task`, which reads memory, in the execution's span: at once,
    /// or after this turn's commit when the turn remembered something (the
    /// task must see it).
    fn spawn_reading_memory(&mut self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        let task = task.instrument(tracing::Span::current());
        if self.staged.memories.is_empty() {
            self.engine.spawn(task);
        } else {
            self.after_commit.push(Effect::Spawn(Box::pin(task)));
        }
    }

    /// An agent's later attempt: its context is known, but memory may have
    /// grown since it was read (a step of this run or another remembered,
    /// an operator added or removed an entry). The memory's version is asked
    /// first; the entries are read again only when it moved. Where the
    /// version is at hand (SQLite) and has not moved, the attempt goes on in
    /// this turn: a step made ready by another's end starts in the same
    /// commit as that end. What this turn remembers is looked for once it
    /// is written.
    fn check_memory(&mut self, position: usize, attempt: u32, agent_id: String, role: String) {
        let known = self.memory_versions.get(&agent_id).copied().unwrap_or(-1);
        if self.staged.memories.is_empty()
            && let Some(Ok(version)) = self.engine.store.memory_version_at_hand(&role)
            && version == known
        {
            return self.memory_checked(agent_id, position, attempt, None);
        }
        let engine = self.engine.clone();
        let driver = self.route.clone();
        self.spawn_reading_memory(async move {
            let fresh = engine.recall_if_changed(&role, known).await;
            let _ = driver.send(Input::Memory { agent_id, position, attempt, fresh });
        });
    }

    /// The memory is checked: the attempt is assigned with the memory as it
    /// is now.
    pub(super) fn memory_checked(
        &mut self,
        agent_id: String,
        position: usize,
        attempt: u32,
        fresh: Option<(i64, Vec<crate::domain::memory::MemoryEntry>)>,
    ) {
        let Some(Known::Ready(context)) = self.contexts.get_mut(&agent_id) else { return };
        if let Some((version, memory)) = fresh
            && self.memory_versions.get(&agent_id).is_none_or(|known| *known < version)
        {
            *context = Arc::new(AgentContext { memory, ..(**context).clone() });
            self.memory_versions.insert(agent_id, version);
        }
        let current = context.clone();
        if self.is_current(position, attempt)
            && matches!(self.steps[position].status, StepStatus::Ready | StepStatus::Queued)
        {
            self.assign(position, current);
        }
    }

    pub(super) fn context_known(&mut self, agent_id: String, context: std::result::Result<Arc<AgentContext>, String>) {
        let Some(Known::Fetching(waiting)) = self.contexts.remove(&agent_id) else { return };
        match context {
            Ok(context) => {
                self.contexts.insert(agent_id, Known::Ready(context.clone()));
                for (position, attempt) in waiting {
                    // A step that was queued at the roster and has its slot
                    // now is as ready as one that never queued.
                    if self.is_current(position, attempt)
                        && matches!(self.steps[position].status, StepStatus::Ready | StepStatus::Queued)
                    {
                        self.assign(position, context.clone());
                    }
                }
            }
            Err(message) => {
                for (position, attempt) in waiting {
                    if self.is_current(position, attempt) {
                        self.end_attempt(position);
                        self.fail(position, "NO_EXECUTOR", message.clone());
                    }
                }
            }
        }
    }

    /// The executor may take the step (its session role, or the matrix for
    /// its roster role, permits the step's action): a worker with room gets
    /// it, or it waits for one.
    pub(in crate::engine) fn assign(&mut self, position: usize, context: Arc<AgentContext>) {
        let agent_id = self.steps[position].executor.clone();
        let attempt = self.steps[position].attempt;
        if let Some(budget) = self.engine.agent_budget(&agent_id)
            && !self.within_agent_budget.remove(&(position, attempt))
        {
            return self.read_agent_usage(position, attempt, agent_id, budget);
        }
        if let Err(reason) = self.admit(position, &agent_id, &context) {
            self.end_attempt(position);
            self.fail(position, "PERMISSION_DENIED", reason);
            return;
        }
        if self.is_tool_step(position) {
            return self.call_tool(position, &context);
        }
        if let Some(schema) = context.role_definition.as_ref().map(|role| role.input_schema_json.as_str())
            && !schema.trim().is_empty()
        {
            let inputs = self.merged_inputs(&self.definition(position).inputs_json);
            let inputs: serde_json::Value = serde_json::from_str(&inputs).unwrap_or_default();
            if let Err(reason) = self.schemas.check(schema, &inputs) {
                let role = &context.roster_role;
                self.end_attempt(position);
                let message = format!("the inputs do not match the input schema of role '{role}': {reason}");
                self.fail(position, "INPUT_SCHEMA", message);
                return;
            }
        }
        match self.engine.workers.acquire(&agent_id, self.route(position)) {
            Some(slot) => self.dispatch(position, slot),
            None => self.wait_for_worker(position),
        }
    }

    /// The step waits for a worker, until its schedule-to-start limit.
    pub(super) fn wait_for_worker(&mut self, position: usize) {
        self.set_status_lazily(position, StepStatus::WaitingForWorker);
        let limit = self
            .definition(position)
            .schedule_to_start_seconds
            .map(Duration::from_secs)
            .or(self.engine.settings.schedule_to_start);
        if let Some(limit) = limit {
            let due = muster_runtime::time::now_millis() + limit.as_millis() as i64;
            self.timers.push(Reverse((due, Timer::ScheduleToStart, position, self.steps[position].attempt)));
        }
    }

    /// Whether the executor may perform the step: in a session it must be
    /// assigned and its role permit the step's `action`; outside sessions the
    /// actions its roster role lists, then the matrix for the roster roles
    /// it governs.
    pub(super) fn admit(
        &self,
        position: usize,
        agent_id: &str,
        context: &AgentContext,
    ) -> std::result::Result<(), String> {
        let action = self.definition(position).action.as_deref();
        if let Some(session) = &self.execution.session {
            return crate::engine::session::admit(
                &self.engine.matrix(),
                &self.execution.lead_agent_id,
                session,
                agent_id,
                action,
            )
            .map(drop);
        }
        let Some(action) = action else { return Ok(()) };
        let subject = Subject {
            agent_id,
            roster_role: &context.roster_role,
            roster_actions: context.role_definition.as_ref().map(|role| role.permitted_actions.as_slice()),
            lead: &self.execution.lead_agent_id,
            session: None,
        };
        let verdict = authority::check(&self.engine.matrix(), &subject, action);
        if verdict.allowed { Ok(()) } else { Err(format!("{agent_id} may not '{action}': {}", verdict.reason)) }
    }

    /// A worker has room: the step starts, and the assignment goes out once
    /// that is written.
    pub(super) fn dispatch(&mut self, position: usize, slot: Slot) {
        let now = muster_runtime::time::now_millis();
        let step = &mut self.steps[position];
        step.started_at = Some(now);
        // The step's use is its current attempt's, as it reports it.
        (step.cost, step.tokens_used) = (0.0, 0);
        self.set_status(position, StepStatus::Running);
        let event = self.step_event(EventKind::StepStarted, position);
        self.record(event);
        if let Some(seconds) = self.definition(position).timeout_seconds {
            let due = now + (seconds * 1000) as i64;
            self.timers.push(Reverse((due, Timer::Timeout, position, self.steps[position].attempt)));
        }
        let upstream = self.upstream(position);
        let assignment = Arc::new(self.assignment(position, upstream));
        let route = self.route(position);
        self.after_commit.push(Effect::Send { slot, assignment, route });
        self.ask_ahead(position);
    }
}

/// Asks the roster who takes a step (unless its `first` answer came in a
/// batch), following a queued task until the expert takes it or the wait
/// goes stale; the answer goes to the driver.
async fn resolve(
    roster: Arc<dyn crate::clients::roster::Roster>,
    ask: DelegationAsk,
    route: Route,
    mut first: Option<crate::domain::model::Decision>,
) {
    let send = |found: Found| {
        let _ = route.driver.send(Input::Executor { position: route.position, attempt: route.attempt, found });
    };
    loop {
        let asked = match first.take() {
            Some(decision) => Ok(decision),
            None => patiently(RETRY_PAUSE, "a delegation", || roster.delegate(ask.clone())).await,
        };
        let mut decision = match asked {
            Ok(decision) => decision,
            Err(failure) => {
                return send(Found::Failed {
                    code: "NO_EXECUTOR".to_owned(),
                    message: format!("the roster refused to delegate: {}", failure.message()),
                });
            }
        };
        loop {
            let detail = if decision.text.is_empty() { decision.reasoning.clone() } else { decision.text.clone() };
            match decision.kind {
                crate::domain::model::DecisionKind::Delegate => {
                    return send(Found::Chosen { agent_id: decision.primary_agent_id, escalated: false, detail });
                }
                crate::domain::model::DecisionKind::Escalate if !decision.primary_agent_id.is_empty() => {
                    return send(Found::Chosen { agent_id: decision.primary_agent_id, escalated: true, detail });
                }
                crate::domain::model::DecisionKind::Escalate => {
                    return send(Found::Failed {
                        code: "ESCALATED".to_owned(),
                        message: format!("no agent can take the step: {}", decision.reasoning),
                    });
                }
                crate::domain::model::DecisionKind::Queue => {
                    send(Found::Queued {
                        expert_id: decision.primary_agent_id.clone(),
                        wait_seconds: decision.wait_seconds,
                        detail: decision.reasoning.clone(),
                    });
                    match roster.watch_queued(ask.task_id.clone()).await {
                        Ok(Some(resolution)) => decision = resolution,
                        Err(RosterFailure::Refused(message) | RosterFailure::NotFound(message)) => {
                            return send(Found::Failed {
                                code: "ESCALATED".to_owned(),
                                message: format!("no agent can take the step: {message}"),
                            });
                        }
                        // The roster restarted or closed the watch: ask again;
                        // the task keeps its place in the queue.
                        _ => {
                            tokio::time::sleep(Duration::from_millis(200)).await;
                            break;
                        }
                    }
                }
            }
        }
    }
}
