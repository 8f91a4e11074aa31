//! One execution's driver: the only writer of its state. It starts ready
//! steps (up to the parallel limit), has the roster place them (a named
//! executor's capacity and status, or a choice by criteria), hands them to
//! workers or invokes their tools ([`tool_step`]), follows what running
//! attempts report ([`progress`]) and what the run spends ([`spending`]),
//! records the outcomes, fails the dependants of failed steps, and ends the
//! execution.
//!
//! Everything happens in turns. A turn takes every input waiting (worker
//! reports, the roster's answers, callers' requests, due timers), applies
//! them to the state in memory, and writes every change with its events in
//! one commit; only then does it act on them — send assignments, answer
//! callers, tell watchers. So a worker never gets a step whose start is not
//! recorded, and nothing a caller was told is lost if the service dies.
//!
//! Costs stay flat as an execution grows: a step that ends looks only at its
//! dependants, an assignment carries a bounded history and shared memory,
//! and nothing rescans every step.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet, VecDeque},
    sync::{Arc, OnceLock},
    time::Duration,
};

use muster_format::{StepDefinition, StepRoles};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

mod progress;
mod spending;
mod tool_step;

use super::{Control, Engine, Found, Input, Route, ahead::Ahead, inbox::Cause, schema, workers::Slot};
use crate::{
    Result,
    clients::roster::{DelegationAsk, RosterFailure, patiently},
    domain::{
        ExecutionStatus, StepStatus,
        authority::{self, RoleAssignment, Subject, SubtaskRequest},
        dag::{Dag, Readiness},
        inbox::{self, InboxMessage},
        memory::{self, MemoryEntry},
        model::{
            AgentContext, Assignment, Event, EventKind, Execution, HistoryEntry, MemoryOutput, Outcome, ProcessVersion,
            SharedMemory, Step,
        },
        payload,
    },
    store::{StepWrite, Write},
};

/// Most steps whose outputs an assignment's shared memory carries.
const SHARED_MEMORY_STEPS: usize = 100;
/// Most encoded outputs kept for the shared memories still to be built.
const KEPT_MEMORY_OUTPUTS: usize = 4 * SHARED_MEMORY_STEPS;
/// Most bytes of outputs an assignment's shared memory carries.
const SHARED_MEMORY_BYTES: usize = 256 * 1024;
/// Most history entries an assignment carries.
const HISTORY_ENTRIES: usize = 100;
/// Most inputs taken in one turn before writing.
const INPUTS_PER_TURN: usize = 4096;

/// What a timer is for; it applies only if its attempt is still the step's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// The attempt ran out of time.
    Timeout,
    /// No worker took the attempt in time.
    ScheduleToStart,
    /// A failed attempt's retry may start.
    Retry,
    /// A tool step waiting for a worker that provides its tool looks again.
    ToolProvider,
}

/// A due time: (milliseconds since the epoch, what, step, attempt).
type Due = Reverse<(i64, Timer, usize, u32)>;

/// What an agent's assignments tell it, per agent of the execution.
pub(super) enum Known {
    /// Being fetched; these attempts wait for it.
    Fetching(Vec<(usize, u32)>),
    Ready(Arc<AgentContext>),
}

/// Done after a commit.
enum Effect {
    Send {
        slot: Slot,
        assignment: Arc<Assignment>,
        route: Route,
    },
    CallTool {
        call: crate::domain::model::ToolCall,
        limit: Duration,
        route: Route,
    },
    Release(String),
    /// A message was posted to the inbox: its process may start.
    Posted(String),
}

/// What an assignment carries of the steps it builds on: their history and
/// their completed outputs. Built once for the steps that depend on the same
/// steps, until a step ends.
#[derive(Clone)]
struct Upstream {
    history: Arc<[HistoryEntry]>,
    shared_memory: Arc<SharedMemory>,
    left_out: u32,
}

/// Changes waiting for the next commit.
#[derive(Default)]
struct Staged {
    steps: Vec<usize>,
    execution_changed: bool,
    assignments: Vec<RoleAssignment>,
    subtasks: Vec<SubtaskRequest>,
    events: Vec<Event>,
    messages: Vec<InboxMessage>,
    memories: Vec<MemoryEntry>,
}

pub(crate) struct Driver {
    pub(super) engine: Arc<Engine>,
    pub(super) execution: Execution,
    pub(super) process: Arc<ProcessVersion>,
    pub(super) dag: Dag,
    pub(super) steps: Vec<Step>,
    /// Attempts underway: executor being found, queued, waiting for a
    /// worker, or running. They count against `max_parallel`.
    active: Vec<bool>,
    in_flight: usize,
    max_parallel: usize,
    /// Steps ready to start, in the order they became ready.
    ready: VecDeque<usize>,
    /// Steps that ended: the execution ends when all have.
    ended: usize,
    /// The last history and shared memory built, with the dependencies of
    /// the step it was built for: the next step with the same dependencies
    /// takes it, until a step ends.
    upstream: Option<(Vec<usize>, Upstream)>,
    /// Outputs in the shared memories built lately, by step position: kept
    /// (with their encoded form, once made) for the next.
    memory_outputs: HashMap<usize, Arc<MemoryOutput>>,
    completed: usize,
    /// The span of each attempt underway: the step's part of the trace.
    spans: Vec<Option<tracing::Span>>,
    /// When each step became ready, while it is on its way to a worker with
    /// room for it: the time to the assignment's sending is measured.
    ready_since: Vec<Option<std::time::Instant>>,
    route: mpsc::UnboundedSender<Input>,
    inputs: mpsc::UnboundedReceiver<Input>,
    contexts: HashMap<String, Known>,
    /// The version of the memory each agent's context carries.
    memory_versions: HashMap<String, i64>,
    timers: BinaryHeap<Due>,
    /// The execution's inputs, parsed once.
    execution_inputs: serde_json::Map<String, serde_json::Value>,
    staged: Staged,
    staged_mark: Vec<bool>,
    after_commit: Vec<Effect>,
    /// Tools' and roles' schemas, compiled once.
    schemas: schema::Compiled,
    /// Questions for the roster from this turn, sent together.
    asks: Vec<(DelegationAsk, Route, tracing::Span)>,
    /// The budget in force when the execution started (`Some(None)`: none),
    /// if the engine knew it; read at the first completed step otherwise.
    pub(super) budget: Option<Option<crate::domain::budget::Budget>>,
    /// The budget's limits on cost and tokens and the use counted against
    /// them; set at the first completed step (`Some(None)`: no such limit).
    spending: Option<Option<spending::Spending>>,
    /// Attempts whose executor's budget was found to leave room.
    within_agent_budget: HashSet<(usize, u32)>,
    /// Agents whose budget went over with `warn`, told once per execution.
    warned_agents: HashSet<String>,
    /// What the running attempts reported so far, by step position.
    reported: HashMap<usize, progress::Reported>,
    /// Each step's ask ahead for its executor's slot (`ahead.rs`).
    pub(super) ahead: Vec<Ahead>,
}

impl Driver {
    pub(super) fn new(
        engine: Arc<Engine>,
        execution: Execution,
        mut steps: Vec<Step>,
        process: Arc<ProcessVersion>,
        route: mpsc::UnboundedSender<Input>,
        inputs: mpsc::UnboundedReceiver<Input>,
    ) -> Self {
        let count = steps.len();
        // Attempts that were underway when the service stopped start again.
        for step in &mut steps {
            if step.status.is_in_flight() {
                step.status = StepStatus::Ready;
            }
        }
        let ended = steps.iter().filter(|step| step.status.is_final()).count();
        let completed = steps.iter().filter(|step| step.status == StepStatus::Completed).count();
        let max_parallel =
            process.definition.max_parallel.map(|limit| limit as usize).unwrap_or(engine.settings.max_parallel).max(1);
        let execution_inputs = payload::execution_inputs(&execution.inputs_json);
        Self {
            dag: Dag::new(&process.definition),
            engine,
            execution,
            process,
            steps,
            active: vec![false; count],
            in_flight: 0,
            max_parallel,
            ready: VecDeque::new(),
            ended,
            upstream: None,
            memory_outputs: HashMap::new(),
            completed,
            spans: vec![None; count],
            ready_since: vec![None; count],
            route,
            inputs,
            contexts: HashMap::new(),
            memory_versions: HashMap::new(),
            timers: BinaryHeap::new(),
            execution_inputs,
            staged: Staged::default(),
            staged_mark: vec![false; count],
            after_commit: Vec::new(),
            schemas: schema::Compiled::default(),
            asks: Vec::new(),
            budget: None,
            spending: None,
            within_agent_budget: HashSet::new(),
            warned_agents: HashSet::new(),
            reported: HashMap::new(),
            ahead: vec![Ahead::None; count],
        }
    }

    pub(super) fn definition(&self, position: usize) -> &StepDefinition {
        &self.process.definition.steps[position]
    }

    pub(super) async fn run(mut self, stopping: CancellationToken) -> Result<()> {
        self.reopen_all();
        loop {
            self.advance();
            self.send_asks();
            if self.ended == self.steps.len() {
                return self.finish(None).await;
            }
            self.flush().await?;
            let next_due = self.timers.peek().map(|Reverse((due, ..))| *due);
            let sleep = next_due.map(|due| {
                let wait = (due - muster_runtime::time::now_millis()).max(0) as u64;
                tokio::time::sleep(Duration::from_millis(wait))
            });
            tokio::select! {
                biased;
                () = stopping.cancelled() => return Ok(()),
                input = self.inputs.recv() => {
                    let Some(input) = input else { return Ok(()) };
                    if let Some(cancelled) = self.handle(input).await? {
                        return self.finish(Some(cancelled)).await;
                    }
                    for _ in 0..INPUTS_PER_TURN {
                        let Ok(input) = self.inputs.try_recv() else { break };
                        if let Some(cancelled) = self.handle(input).await? {
                            return self.finish(Some(cancelled)).await;
                        }
                    }
                }
                () = async { sleep.expect("guarded").await }, if sleep.is_some() => self.fire_timers(),
            }
            self.fire_timers();
        }
    }

    /// Applies one input; returns the reason when the execution is cancelled.
    async fn handle(&mut self, input: Input) -> Result<Option<String>> {
        match input {
            Input::Report { position, attempt, outcome } => {
                if self.is_current(position, attempt) && self.steps[position].status == StepStatus::Running {
                    self.settle(position, outcome);
                    if self.steps[position].status == StepStatus::Completed {
                        return self.spend(position).await;
                    }
                }
            }
            Input::Progress { position, attempt, progress } => {
                if self.is_current(position, attempt) && self.steps[position].status == StepStatus::Running {
                    return self.progressed(position, progress).await;
                }
            }
            Input::Executor { position, attempt, found } => self.executor_found(position, attempt, found),
            Input::Context { agent_id, context, memory_version } => {
                self.memory_versions.insert(agent_id.clone(), memory_version);
                self.context_known(agent_id, context);
            }
            Input::Memory { agent_id, position, attempt, fresh } => {
                self.memory_checked(agent_id, position, attempt, fresh);
            }
            Input::AgentUsage { position, attempt, budget, usage } => {
                self.agent_usage_known(position, attempt, &budget, usage);
            }
            Input::WorkerReady { position, attempt, slot } => {
                if self.is_current(position, attempt) && self.steps[position].status == StepStatus::WaitingForWorker {
                    self.dispatch(position, slot);
                }
            }
            Input::Control(control) => return self.control(control).await,
        }
        Ok(None)
    }

    async fn control(&mut self, control: Control) -> Result<Option<String>> {
        match control {
            Control::Cancel(reason) => return Ok(Some(reason)),
            Control::Decide { step_id, approved, by, comment, matrix_version, reply } => {
                let outcome = self.decide(&step_id, approved, &by, &comment, matrix_version);
                let outcome = self.written(outcome).await?;
                let _ = reply.send(outcome);
            }
            Control::HandOff { request, reply } => {
                let answer = self.hand_off(request).await;
                self.flush().await?;
                let _ = reply.send(answer);
            }
            Control::Intervene { intervention, reply } => {
                let outcome = self.intervene(intervention);
                let outcome = self.written(outcome).await?;
                let _ = reply.send(outcome);
            }
            Control::AssignRole { assignment, matrix_version, reply } => {
                let outcome = self.assign_role(assignment, matrix_version);
                let outcome = self.written(outcome).await?;
                let _ = reply.send(outcome);
            }
            Control::RequestSubtask { request, reply } => {
                let outcome = self.request_subtask(*request);
                let outcome = self.written(outcome).await?;
                let _ = reply.send(outcome);
            }
            Control::DecideSubtask { decided, assignment, matrix_version, reply } => {
                let outcome = self.decide_subtask(*decided, assignment.map(|assignment| *assignment), matrix_version);
                let outcome = self.written(outcome).await?;
                let _ = reply.send(outcome);
            }
            Control::SetLead { agent_id, by, reply } => {
                self.set_lead(agent_id, &by);
                self.flush().await?;
                let _ = reply.send(Ok(()));
            }
        }
        Ok(None)
    }

    /// Writes what an accepted request changed before it is answered; a
    /// refused request changed nothing.
    async fn written(&mut self, outcome: Result<()>) -> Result<Result<()>> {
        if outcome.is_ok() {
            self.flush().await?;
        }
        Ok(outcome)
    }

    pub(super) fn is_current(&self, position: usize, attempt: u32) -> bool {
        self.active[position] && self.steps[position].attempt == attempt
    }

    /// Whether an attempt of the step is underway.
    pub(super) fn is_active(&self, position: usize) -> bool {
        self.active[position]
    }

    /// The next input, for an execution ending.
    pub(super) async fn next_input(&mut self) -> Option<Input> {
        self.inputs.recv().await
    }

    pub(super) fn route(&self, position: usize) -> Route {
        Route { driver: self.route.clone(), position, attempt: self.steps[position].attempt }
    }

    /// Sets a step's status, keeping count of ended steps and staging it.
    pub(super) fn set_status(&mut self, position: usize, status: StepStatus) {
        let was_final = self.steps[position].status.is_final();
        let was_completed = self.steps[position].status == StepStatus::Completed;
        self.steps[position].status = status;
        match status {
            StepStatus::Ready => {
                self.ready_since[position].get_or_insert_with(std::time::Instant::now);
            }
            // Sent after the commit that records the start.
            StepStatus::Running => {}
            // Waiting for the agent or a worker to have room, or no longer on its way.
            _ => self.ready_since[position] = None,
        }
        match (was_final, status.is_final()) {
            (false, true) => self.ended += 1,
            (true, false) => self.ended -= 1,
            _ => {}
        }
        if was_final || status.is_final() {
            self.upstream = None;
        }
        match (was_completed, status == StepStatus::Completed) {
            (false, true) => self.completed += 1,
            (true, false) => self.completed -= 1,
            _ => {}
        }
        self.stage(position);
    }

    pub(super) fn stage(&mut self, position: usize) {
        if !self.staged_mark[position] {
            self.staged_mark[position] = true;
            self.staged.steps.push(position);
        }
    }

    pub(super) fn stage_execution(&mut self) {
        self.staged.execution_changed = true;
    }

    pub(super) fn stage_assignment(&mut self, assignment: RoleAssignment) {
        self.staged.assignments.push(assignment);
    }

    pub(super) fn stage_subtask(&mut self, subtask: SubtaskRequest) {
        self.staged.subtasks.push(subtask);
    }

    pub(super) fn record(&mut self, event: Event) {
        self.staged.events.push(event);
    }

    /// A step that goes back to be started, before the others waiting.
    pub(super) fn reopened_ready(&mut self, position: usize) {
        self.ready.push_front(position);
    }

    pub(super) fn release_later(&mut self, task_id: String) {
        self.after_commit.push(Effect::Release(task_id));
    }

    /// Ready steps whose dependencies are done, failed steps' dependants
    /// failed, after a start or anything that reopened steps.
    pub(super) fn reopen_all(&mut self) {
        let mut blocked = Vec::new();
        let queued: std::collections::HashSet<usize> = self.ready.iter().copied().collect();
        for position in 0..self.steps.len() {
            match self.steps[position].status {
                StepStatus::Pending => match self.dag.readiness(position, &self.steps) {
                    Readiness::Ready => {
                        self.set_status(position, StepStatus::Ready);
                        self.ready.push_back(position);
                    }
                    Readiness::Blocked(_) => blocked.push(position),
                    Readiness::Waiting => {}
                },
                StepStatus::Ready if !self.active[position] => match self.steps[position].retry_at {
                    Some(due) => self.timers.push(Reverse((due, Timer::Retry, position, self.steps[position].attempt))),
                    None if !queued.contains(&position) => self.ready.push_back(position),
                    None => {}
                },
                _ => {}
            }
        }
        for position in blocked {
            if self.steps[position].status == StepStatus::Pending
                && let Readiness::Blocked(dependency) = self.dag.readiness(position, &self.steps)
            {
                self.fail_upstream(position, dependency);
            }
        }
    }

    /// Starts ready steps while there is room.
    fn advance(&mut self) {
        if self.execution.status == ExecutionStatus::Paused {
            return;
        }
        while self.in_flight < self.max_parallel {
            let Some(position) = self.ready.pop_front() else { return };
            let step = &self.steps[position];
            if step.status == StepStatus::Ready && !self.active[position] && step.retry_at.is_none() {
                self.start(position);
            }
        }
    }

    /// Starts an attempt: an approval waits for its decision; a task asks
    /// the roster for its executor — the agent it was reassigned or handed
    /// to, else the one it names (the roster checks its capacity and
    /// status), else whom the roster chooses by the step's criteria.
    fn start(&mut self, position: usize) {
        let now = muster_runtime::time::now_millis();
        if self.definition(position).step_type == super::HUMAN_APPROVAL {
            let waiting_for = self.definition(position).approvers();
            let step = &mut self.steps[position];
            step.attempt = 1;
            step.started_at = Some(now);
            self.set_status(position, StepStatus::WaitingApproval);
            let mut event = self.step_event(EventKind::ApprovalRequested, position);
            event.waiting_for = waiting_for;
            self.record(event);
            return;
        }
        let step = &mut self.steps[position];
        step.attempt += 1;
        step.retry_at = None;
        let attempt = step.attempt;
        self.active[position] = true;
        self.in_flight += 1;
        let span = tracing::info_span!("step", step_id = %self.definition(position).id, attempt);
        self.spans[position] = Some(span);
        if self.start_ahead(position, attempt) {
            return;
        }
        if !self.steps[position].slot_task.is_empty() {
            match (&self.steps[position].assigned_to, self.definition(position).executor()) {
                // The slot it took over is its named executor's: it starts at once.
                (None, Some(agent)) => {
                    let agent = agent.to_owned();
                    return self.executor_known(position, attempt, agent);
                }
                // Given to someone else since: that slot goes back, the roster is asked.
                _ => self.release_delegation(position),
            }
        }
        self.ask_roster(position, self.named_executor(position));
    }

    /// The agent the step was reassigned or handed to, else the one it
    /// names; a tool step that names none and has no criteria runs as the
    /// execution's lead.
    pub(super) fn named_executor(&self, position: usize) -> Option<String> {
        let definition = self.definition(position);
        self.steps[position].assigned_to.clone().or_else(|| definition.executor().map(str::to_owned)).or_else(|| {
            (self.is_tool_step(position) && definition.delegate.is_none() && !self.execution.lead_agent_id.is_empty())
                .then(|| self.execution.lead_agent_id.clone())
        })
    }

    /// Asks the roster who takes a step (`assigned`: about the agent named
    /// for it); its answer comes back as [`Input::Executor`].
    pub(super) fn ask_roster(&mut self, position: usize, assigned: Option<String>) {
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
    pub(super) fn delegation_ask(&self, position: usize, assigned: Option<String>) -> Option<DelegationAsk> {
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
    fn send_asks(&mut self) {
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
                        patiently(Duration::from_millis(500), "a delegation", || roster.delegate_batch(questions.clone()))
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

    pub(super) fn executor_found(&mut self, position: usize, attempt: u32, found: Found) {
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
    pub(super) fn executor_known(&mut self, position: usize, attempt: u32, agent_id: String) {
        self.steps[position].executor = agent_id.clone();
        self.stage(position);
        match self.contexts.get_mut(&agent_id) {
            Some(Known::Ready(context)) => {
                let role = context.roster_role.clone();
                self.check_memory(position, attempt, agent_id, role);
            }
            Some(Known::Fetching(waiting)) => waiting.push((position, attempt)),
            None => {
                self.contexts.insert(agent_id.clone(), Known::Fetching(vec![(position, attempt)]));
                let engine = self.engine.clone();
                let driver = self.route.clone();
                self.engine.spawn(async move {
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

    /// An agent's later attempt: its context is known, but memory may have
    /// grown since it was read (a step of this run or another remembered,
    /// an operator added or removed an entry). The memory's version is asked
    /// first; the entries are read again only when it moved.
    fn check_memory(&mut self, position: usize, attempt: u32, agent_id: String, role: String) {
        let known = self.memory_versions.get(&agent_id).copied().unwrap_or(-1);
        let engine = self.engine.clone();
        let driver = self.route.clone();
        self.engine.spawn(async move {
            let fresh = engine.recall_if_changed(&role, known).await;
            let _ = driver.send(Input::Memory { agent_id, position, attempt, fresh });
        });
    }

    /// The memory is checked: the attempt is assigned with the memory as it
    /// is now.
    fn memory_checked(
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

    fn context_known(&mut self, agent_id: String, context: std::result::Result<Arc<AgentContext>, String>) {
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
    pub(super) fn assign(&mut self, position: usize, context: Arc<AgentContext>) {
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
    fn wait_for_worker(&mut self, position: usize) {
        self.set_status(position, StepStatus::WaitingForWorker);
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

    /// Whether a completed agent task's output matches its executor's role's
    /// output schema (when the role has one).
    fn check_output(&mut self, position: usize, output_json: &str) -> std::result::Result<(), String> {
        if self.is_tool_step(position) {
            return Ok(());
        }
        let Some(Known::Ready(context)) = self.contexts.get(&self.steps[position].executor) else { return Ok(()) };
        let Some(role) = context.role_definition.as_ref().filter(|role| !role.output_schema_json.trim().is_empty())
        else {
            return Ok(());
        };
        let (name, schema) = (role.name.clone(), role.output_schema_json.clone());
        let output: serde_json::Value =
            serde_json::from_str(&stored_output(output_json.to_owned())).unwrap_or_default();
        self.schemas
            .check(&schema, &output)
            .map_err(|reason| format!("the output does not match the output schema of role '{name}': {reason}"))
    }

    /// Whether the executor may perform the step: in a session it must be
    /// assigned and its role permit the step's `action`; outside sessions the
    /// actions its roster role lists, then the matrix for the roster roles
    /// it governs.
    fn admit(&self, position: usize, agent_id: &str, context: &AgentContext) -> std::result::Result<(), String> {
        let action = self.definition(position).action.as_deref();
        if let Some(session) = &self.execution.session {
            return super::session::admit(
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
    fn dispatch(&mut self, position: usize, slot: Slot) {
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

    /// What a worker reported: the attempt ends completed, failed (retried
    /// when it may be), or lost (assigned again).
    fn settle(&mut self, position: usize, outcome: Outcome) {
        self.end_attempt(position);
        let now = muster_runtime::time::now_millis();
        let outcome = match outcome {
            Outcome::Completed { iterations, .. } if iterations > self.max_iterations(position) => Outcome::Failed {
                error_code: "ITERATION_LIMIT".to_owned(),
                message: format!(
                    "the agent reported {iterations} iterations; it may run at most {} per step",
                    self.max_iterations(position)
                ),
                retryable: false,
            },
            Outcome::Completed { ref post_to_inbox, .. }
                if !post_to_inbox.is_empty() && !muster_format::is_identifier(post_to_inbox) =>
            {
                Outcome::Failed {
                    error_code: "INVALID_RESULT".to_owned(),
                    message: format!(
                        "post_to_inbox '{}' is not an inbox name ([a-z0-9][a-z0-9_-]*, at most 64 characters)",
                        muster_runtime::status::truncate(post_to_inbox, 128)
                    ),
                    retryable: false,
                }
            }
            Outcome::Completed { ref remember, .. }
                if let Err(message) = memory::check_notes(remember, !self.executor_role(position).is_empty()) =>
            {
                Outcome::Failed { error_code: "INVALID_RESULT".to_owned(), message, retryable: false }
            }
            Outcome::Completed { ref output_json, .. } => match self.admit_result(position) {
                Ok(()) => match self.check_output(position, output_json) {
                    Ok(()) => outcome,
                    Err(message) => {
                        Outcome::Failed { error_code: "OUTPUT_SCHEMA".to_owned(), message, retryable: true }
                    }
                },
                Err(message) => {
                    Outcome::Failed { error_code: "PERMISSION_DENIED".to_owned(), message, retryable: false }
                }
            },
            other => other,
        };
        match outcome {
            Outcome::Completed {
                output_json,
                tokens_used,
                cost,
                duration_ms,
                post_to_inbox,
                remember,
                skip_triggers,
                ..
            } => {
                self.remember(position, &remember, now);
                let inbox = Some(post_to_inbox)
                    .filter(|inbox| !inbox.is_empty())
                    .or_else(|| self.definition(position).post_to_inbox.clone())
                    .filter(|_| !skip_triggers);
                let step = &mut self.steps[position];
                step.output_json = Some(Arc::from(stored_output(output_json)));
                step.cost = cost;
                step.tokens_used = tokens_used;
                step.ended_at = Some(now);
                step.error_code.clear();
                step.error_message.clear();
                let duration_ms = step.started_at.map_or(duration_ms, |started| (now - started).max(0) as u64);
                self.set_status(position, StepStatus::Completed);
                let mut event = self.step_event(EventKind::StepCompleted, position);
                event.duration_ms = duration_ms;
                self.record(event);
                if let Some(inbox) = inbox {
                    self.post_output(position, inbox, now);
                }
                self.after_end(position);
                self.pass_slot(position);
            }
            Outcome::Failed { error_code, message, retryable } => {
                let code = if error_code.is_empty() { "WORKER_FAILED".to_owned() } else { error_code };
                if retryable && self.steps[position].attempt <= self.definition(position).retries {
                    tracing::info!(execution_id = %self.execution.id, step = %self.definition(position).id, attempt = self.steps[position].attempt, error = %message, "step failed; retrying");
                    let exponent = (self.steps[position].attempt - 1).min(5);
                    let due = now + (100_i64 << exponent);
                    let step = &mut self.steps[position];
                    step.error_code = code;
                    step.error_message = message;
                    step.retry_at = Some(due);
                    self.set_status(position, StepStatus::Ready);
                    self.timers.push(Reverse((due, Timer::Retry, position, self.steps[position].attempt)));
                } else {
                    self.fail(position, &code, message);
                }
            }
            Outcome::WorkerLost => {
                tracing::info!(execution_id = %self.execution.id, step = %self.definition(position).id, attempt = self.steps[position].attempt, "worker lost; assigning the step again");
                self.set_status(position, StepStatus::Ready);
                self.ready.push_front(position);
            }
        }
    }

    /// The role of a step's executor, as the roster said; empty for none.
    fn executor_role(&self, position: usize) -> &str {
        match self.contexts.get(&self.steps[position].executor) {
            Some(Known::Ready(context)) => &context.roster_role,
            _ => "",
        }
    }

    /// Writes what a completed step's worker asked to remember (checked
    /// already), with the step's commit.
    fn remember(&mut self, position: usize, notes: &[(Option<bool>, String)], now: i64) {
        let role = self.executor_role(position).to_owned();
        let author = self.steps[position].executor.clone();
        for (global, text) in notes {
            let role = if *global == Some(true) { "" } else { role.as_str() };
            let entry = MemoryEntry::new(role, text, &author, &self.execution.id, now);
            self.staged.memories.push(entry);
        }
    }

    /// Posts a completed step's output to an inbox, with the step's commit.
    fn post_output(&mut self, position: usize, inbox: String, now: i64) {
        let output = self.steps[position].output_json.clone().unwrap_or_else(|| Arc::from(""));
        let step_id = self.definition(position).id.clone();
        let body = if output.len() <= inbox::MAX_BODY_BYTES {
            output.to_string()
        } else {
            // Too long for a message: where to read it (ReadPayload).
            serde_json::json!({
                "execution_id": self.execution.id,
                "step_id": step_id,
                "output_omitted_bytes": output.len(),
            })
            .to_string()
        };
        self.staged.messages.push(InboxMessage {
            id: uuid::Uuid::now_v7().to_string(),
            inbox: inbox.clone(),
            sender: self.steps[position].executor.clone(),
            priority: inbox::Priority::Normal,
            subject: format!("step '{step_id}' of {} ({}) completed", self.execution.process_name, self.execution.id),
            body,
            posted_at: now,
            state: inbox::MessageState::Unprocessed,
            claimed_by: String::new(),
            processed_by: String::new(),
            note: String::new(),
        });
        self.after_commit.push(Effect::Posted(inbox));
    }

    /// The attempt is no longer underway.
    pub(super) fn end_attempt(&mut self, position: usize) {
        if std::mem::replace(&mut self.active[position], false) {
            self.in_flight -= 1;
        }
        self.spans[position] = None;
        self.forget_reported(position);
    }

    fn max_iterations(&self, position: usize) -> u32 {
        match self.contexts.get(&self.steps[position].executor) {
            Some(Known::Ready(context)) => context.max_iterations,
            _ => crate::clients::roster::DEFAULT_MAX_ITERATIONS,
        }
    }

    /// Fails a step for good, with its event, and fails the dependants it blocks.
    pub(super) fn fail(&mut self, position: usize, code: &str, message: String) {
        self.record_failure(position, code, message);
        self.after_end(position);
    }

    /// A step failed: its state, its event, its roster slot given back.
    fn record_failure(&mut self, position: usize, code: &str, message: String) {
        let now = muster_runtime::time::now_millis();
        self.steps[position].retry_at = None;
        self.steps[position].ended_with_error(code, message, now);
        self.set_status(position, StepStatus::Failed);
        let mut event = self.step_event(EventKind::StepFailed, position);
        event.error = Some((self.steps[position].error_code.clone(), self.steps[position].error_message.clone()));
        self.record(event);
        self.release_delegation(position);
    }

    fn upstream_failure(&self, dependency: usize) -> String {
        format!("step '{}', which this step depends on, did not complete", self.definition(dependency).id)
    }

    fn fail_upstream(&mut self, position: usize, dependency: usize) {
        let message = self.upstream_failure(dependency);
        self.fail(position, "UPSTREAM_FAILED", message);
    }

    /// A step ended: its pending dependants become ready, or fail when it
    /// blocks them (and theirs after them, without recursion).
    pub(super) fn after_end(&mut self, position: usize) {
        let mut ended = vec![position];
        while let Some(next) = ended.pop() {
            for index in 0..self.dag.dependants(next).len() {
                let dependant = self.dag.dependants(next)[index];
                if self.steps[dependant].status != StepStatus::Pending {
                    continue;
                }
                match self.dag.readiness(dependant, &self.steps) {
                    Readiness::Ready => {
                        self.set_status(dependant, StepStatus::Ready);
                        self.ready.push_back(dependant);
                    }
                    Readiness::Blocked(dependency) => {
                        let message = self.upstream_failure(dependency);
                        self.record_failure(dependant, "UPSTREAM_FAILED", message);
                        ended.push(dependant);
                    }
                    Readiness::Waiting => {}
                }
            }
        }
    }

    /// Frees the roster slot the step holds, if it holds one.
    pub(super) fn release_delegation(&mut self, position: usize) {
        self.forget_reserved_ahead(position);
        let task_id = self.take_slot_task(position);
        if std::mem::replace(&mut self.steps[position].roster_reserved, false) {
            self.stage(position);
            self.release_later(task_id);
        }
    }

    /// The roster task whose slot the step holds (one it took over, else its
    /// own), no longer marked as taken over.
    fn take_slot_task(&mut self, position: usize) -> String {
        match std::mem::take(&mut self.steps[position].slot_task) {
            inherited if inherited.is_empty() => self.task_id(position),
            inherited => inherited,
        }
    }

    /// A completed step's roster slot goes to the next link of its chain: a
    /// dependant it made ready that names the same agent and asks for no
    /// delegation by criteria. That step starts without asking the roster
    /// (the agent just finished a step, and keeps one slot for the chain);
    /// the slot is released when the last link ends. Otherwise it is
    /// released now.
    fn pass_slot(&mut self, position: usize) {
        let heir = self.steps[position].roster_reserved.then(|| {
            let agent = self.steps[position].executor.as_str();
            self.dag.dependants(position).iter().copied().find(|&dependant| {
                let (step, definition) = (&self.steps[dependant], self.definition(dependant));
                step.status == StepStatus::Ready
                    && !step.roster_reserved
                    && step.assigned_to.is_none()
                    && !self.active[dependant]
                    && definition.step_type != super::HUMAN_APPROVAL
                    && definition.delegate.is_none()
                    && definition.executor() == Some(agent)
            })
        });
        let Some(Some(heir)) = heir else { return self.release_delegation(position) };
        let task_id = self.take_slot_task(position);
        self.steps[position].roster_reserved = false;
        self.steps[heir].roster_reserved = true;
        self.steps[heir].slot_task = task_id;
        self.stage(position);
        self.stage(heir);
    }

    pub(super) fn task_id(&self, position: usize) -> String {
        format!("{}/{}", self.execution.id, self.definition(position).id)
    }

    /// Due timers take effect.
    fn fire_timers(&mut self) {
        let now = muster_runtime::time::now_millis();
        while let Some(Reverse((due, timer, position, attempt))) = self.timers.peek().copied() {
            if due > now {
                return;
            }
            self.timers.pop();
            if self.steps[position].attempt != attempt {
                continue;
            }
            match timer {
                Timer::Timeout if self.active[position] && self.steps[position].status == StepStatus::Running => {
                    self.engine.workers.withdraw(&self.assignment_id(position), "timed out");
                    let seconds = self.definition(position).timeout_seconds.unwrap_or_default();
                    self.settle(
                        position,
                        Outcome::Failed {
                            error_code: "TIMEOUT".to_owned(),
                            message: format!("no result within {seconds} s"),
                            retryable: true,
                        },
                    );
                }
                Timer::ScheduleToStart
                    if self.active[position] && self.steps[position].status == StepStatus::WaitingForWorker =>
                {
                    self.no_worker_in_time(position);
                }
                Timer::ToolProvider
                    if self.active[position] && self.steps[position].status == StepStatus::WaitingForWorker =>
                {
                    self.look_for_provider(position);
                }
                Timer::Retry if !self.active[position] && self.steps[position].status == StepStatus::Ready => {
                    self.steps[position].retry_at = None;
                    self.stage(position);
                    self.ready.push_back(position);
                }
                _ => {}
            }
        }
    }

    /// No worker took the step in time: a step the roster chose an agent for
    /// goes back to the roster without that agent; one whose executor is
    /// named fails.
    fn no_worker_in_time(&mut self, position: usize) {
        let agent_id = self.steps[position].executor.clone();
        self.engine.workers.stop_waiting(&agent_id, &self.route(position));
        self.end_attempt(position);
        let limit = self
            .definition(position)
            .schedule_to_start_seconds
            .map(Duration::from_secs)
            .or(self.engine.settings.schedule_to_start)
            .unwrap_or_default();
        if self.is_tool_step(position) {
            let tool = self.definition(position).tool.clone().unwrap_or_default();
            let why = format!("no connected worker provided tool '{tool}' within {}", seconds_or_milliseconds(limit));
            return self.fail(position, "NO_WORKER", why);
        }
        let why = format!("no worker serving '{agent_id}' took the step within {}", seconds_or_milliseconds(limit));
        let chosen_by_roster =
            self.steps[position].assigned_to.is_none() && self.definition(position).executor().is_none();
        if chosen_by_roster {
            self.steps[position].delegation_chain.push(agent_id);
            let mut event = self.step_event(EventKind::StepDelegated, position);
            event.detail = format!("{why}; the roster is asked again, without that agent");
            self.record(event);
            self.set_status(position, StepStatus::Ready);
            self.ready.push_front(position);
        } else {
            self.fail(position, "NO_WORKER", why);
        }
    }

    pub(super) fn assignment_id(&self, position: usize) -> String {
        format!("{}/{}/{}", self.execution.id, self.definition(position).id, self.steps[position].attempt)
    }

    /// The assignment of a step's current attempt, with its task context.
    fn assignment(&self, position: usize, upstream: Upstream) -> Assignment {
        let definition = self.definition(position);
        let step = &self.steps[position];
        let context = match self.contexts.get(&step.executor) {
            Some(Known::Ready(context)) => context.clone(),
            _ => Arc::new(AgentContext::default()),
        };
        let upstream_outputs = self
            .dag
            .dependencies(position)
            .iter()
            .filter(|dependency| self.steps[**dependency].status == StepStatus::Completed)
            .filter_map(|dependency| {
                let output = self.steps[*dependency].output_json.clone()?;
                Some((self.definition(*dependency).id.clone(), output))
            })
            .collect();
        let carried = payload::split(&definition.id, self.merged_inputs(&definition.inputs_json), upstream_outputs);
        let (session_role, session_context) = match &self.execution.session {
            Some(session) => (
                super::session::admit(
                    &self.engine.matrix(),
                    &self.execution.lead_agent_id,
                    session,
                    &step.executor,
                    definition.action.as_deref(),
                )
                .unwrap_or_default(),
                crate::domain::session::context_window(
                    &self.execution.id,
                    session,
                    &self.execution.lead_agent_id,
                    &super::step_views(&self.steps, &self.process.definition),
                ),
            ),
            None => (String::new(), String::new()),
        };
        let span = self.spans[position].as_ref().cloned().unwrap_or_else(tracing::Span::current);
        Assignment {
            assignment_id: self.assignment_id(position),
            idempotency_key: self.task_id(position),
            attempt: step.attempt,
            agent_id: step.executor.clone(),
            execution_id: self.execution.id.clone(),
            process_name: self.execution.process_name.clone(),
            process_version: self.execution.process_version,
            step_id: definition.id.clone(),
            step_name: definition.name.clone(),
            step_type: definition.step_type.clone(),
            message: definition.message.clone(),
            inputs_json: carried.inputs_json,
            upstream_outputs: carried.upstream_outputs,
            payload_refs: carried.payload_refs,
            shared_memory: upstream.shared_memory,
            shared_memory_left_out: upstream.left_out,
            history: upstream.history,
            context,
            roles: step_roles(definition),
            delegation_chain: step.delegation_chain.clone(),
            timeout_ms: definition.timeout_seconds.map_or(0, |seconds| seconds * 1000),
            trace_parent: muster_runtime::telemetry::traceparent(&span),
            session_role,
            session_context,
        }
    }

    /// The execution's inputs overlaid with the step's own, as JSON text.
    fn merged_inputs(&self, step_inputs: &str) -> String {
        payload::merge_inputs(&self.execution_inputs, step_inputs)
    }

    /// The history and shared memory of the steps `position` builds on:
    /// the nearest of them ([`Dag::upstream`]) that ended, in the order
    /// they ended, and the outputs of the latest completed ones that fit.
    /// Nothing that runs beside the step, so an attempt sees the same
    /// whenever it starts.
    fn upstream(&mut self, position: usize) -> Upstream {
        let dependencies = self.dag.dependencies(position);
        if let Some((built_for, upstream)) = &self.upstream
            && built_for.as_slice() == dependencies
        {
            return upstream.clone();
        }
        let dependencies = dependencies.to_vec();
        let mut ended = self.dag.upstream(position, HISTORY_ENTRIES.max(SHARED_MEMORY_STEPS));
        ended.retain(|&step| self.steps[step].status.is_final());
        ended.sort_by_key(|&step| (self.steps[step].ended_at, step));
        let (shared_memory, left_out) = self.shared_memory(&ended);
        let upstream =
            Upstream { history: self.history(&ended).into(), shared_memory: Arc::new(shared_memory), left_out };
        self.upstream = Some((dependencies, upstream.clone()));
        upstream
    }

    /// The outputs of the latest completed of `ended` that fit, newest
    /// first, and how many completed steps of the execution it leaves out.
    /// An output kept from an earlier memory comes with its encoded form.
    fn shared_memory(&mut self, ended: &[usize]) -> (SharedMemory, u32) {
        let mut outputs = Vec::new();
        let mut bytes = 0;
        for &position in ended.iter().rev() {
            if outputs.len() >= SHARED_MEMORY_STEPS {
                break;
            }
            let step = &self.steps[position];
            let Some(output) = step.output_json.as_ref().filter(|_| step.status == StepStatus::Completed) else {
                continue;
            };
            if bytes + output.len() > SHARED_MEMORY_BYTES {
                break;
            }
            bytes += output.len();
            let entry = match self.memory_outputs.get(&position) {
                Some(entry) if Arc::ptr_eq(&entry.output, output) => entry.clone(),
                _ => {
                    let entry = Arc::new(MemoryOutput {
                        step_id: self.definition(position).id.clone(),
                        output: output.clone(),
                        encoded: OnceLock::new(),
                    });
                    self.memory_outputs.insert(position, entry.clone());
                    entry
                }
            };
            outputs.push(entry);
        }
        if self.memory_outputs.len() > KEPT_MEMORY_OUTPUTS {
            self.memory_outputs.retain(|_, kept| outputs.iter().any(|output| Arc::ptr_eq(output, kept)));
        }
        let left_out = self.completed.saturating_sub(outputs.len());
        (SharedMemory { outputs, encoded: OnceLock::new() }, u32::try_from(left_out).unwrap_or(u32::MAX))
    }

    /// The last of `ended`, oldest first.
    fn history(&self, ended: &[usize]) -> Vec<HistoryEntry> {
        let start = ended.len().saturating_sub(HISTORY_ENTRIES);
        ended[start..]
            .iter()
            .map(|&position| {
                let step = &self.steps[position];
                HistoryEntry {
                    step_id: self.definition(position).id.clone(),
                    agent_id: step.executor.clone(),
                    action: step.status.as_str(),
                    at: step.ended_at,
                }
            })
            .collect()
    }

    /// An event about a step, numbered next.
    pub(super) fn step_event(&mut self, kind: EventKind, position: usize) -> Event {
        let now = muster_runtime::time::now_millis();
        let trace_parent = match &self.spans[position] {
            Some(span) => muster_runtime::telemetry::traceparent(span),
            None => muster_runtime::telemetry::traceparent(&tracing::Span::current()),
        };
        let mut event = Event::new(&mut self.execution, kind, now, trace_parent);
        let definition = &self.process.definition.steps[position];
        let step = &self.steps[position];
        event.step_id = definition.id.clone();
        event.step_name = definition.name.clone();
        event.roles = Some(step_roles(definition));
        event.agent_id = step.executor.clone();
        event.retry_count = step.attempt.saturating_sub(1);
        if kind == EventKind::StepCompleted {
            event.output_json = step.output_json.clone();
        }
        event.cost = step.cost;
        event.tokens_used = step.tokens_used;
        event
    }

    /// An event about the execution as a whole, numbered next.
    pub(super) fn execution_event(&mut self, kind: EventKind) -> Event {
        let trace_parent = muster_runtime::telemetry::traceparent(&tracing::Span::current());
        Event::new(&mut self.execution, kind, muster_runtime::time::now_millis(), trace_parent)
    }

    /// Ends the execution: cancelled when `cancel_reason` is given, else
    /// completed when every step completed and failed otherwise.
    async fn finish(mut self, cancel_reason: Option<String>) -> Result<()> {
        let now = muster_runtime::time::now_millis();
        if let Some(reason) = &cancel_reason {
            for position in 0..self.steps.len() {
                if self.steps[position].status.is_final() {
                    continue;
                }
                self.stop_attempt(position, reason);
                let step = &mut self.steps[position];
                step.error_code = "CANCELLED".to_owned();
                step.error_message = reason.clone();
                step.ended_at = Some(now);
                step.retry_at = None;
                self.set_status(position, StepStatus::Cancelled);
            }
            self.execution.status = ExecutionStatus::Cancelled;
            self.execution.reason = reason.clone();
        } else if let Some(failed) = self.steps.iter().position(|step| step.status != StepStatus::Completed) {
            let step = &self.steps[failed];
            self.execution.status = ExecutionStatus::Failed;
            self.execution.reason =
                format!("step '{}' {}: {}", self.definition(failed).id, step.status.as_str(), step.error_message);
        } else {
            self.execution.status = ExecutionStatus::Completed;
        }
        self.execution.ended_at = Some(now);
        let mut event = self.execution_event(EventKind::ExecutionFinished);
        event.execution_status = Some(self.execution.status);
        event.detail = self.execution.reason.clone();
        self.record(event);
        self.stage_execution();
        self.give_back_ahead().await;
        self.flush().await?;
        tracing::info!(execution_id = %self.execution.id, status = self.execution.status.as_str(), reason = %self.execution.reason, "execution finished");
        let outcome = [("process", self.execution.process_name.as_str()), ("status", self.execution.status.as_str())];
        muster_runtime::metrics::count(
            "muster_process_runs_total",
            "Executions that ended, by process and how (completed, failed, cancelled)",
            &outcome,
            1,
        );
        muster_runtime::metrics::observe_long(
            "muster_process_run_duration_seconds",
            "How long executions took from their start to their end, by process and how they ended",
            &outcome,
            (now - self.execution.started_at).max(0) as f64 / 1000.0,
        );
        if let Some(inbox) = self.process.definition.triggers.as_ref().and_then(|triggers| triggers.inbox.clone()) {
            self.engine.spawn_trigger(inbox, Cause::Settled);
        }
        Ok(())
    }

    /// Stops whatever an attempt is doing: a worker's assignment is
    /// withdrawn, a wait for a worker given up, a roster slot released.
    pub(super) fn stop_attempt(&mut self, position: usize, reason: &str) {
        self.withdraw_attempt(position, reason);
        self.release_delegation(position);
    }

    /// Stops an attempt but keeps the step's roster slot, for a step that
    /// starts again at once: its next delegation moves the slot (or keeps
    /// it, for the same agent), and no release can race it.
    pub(super) fn withdraw_attempt(&mut self, position: usize, reason: &str) {
        match self.steps[position].status {
            StepStatus::Running => self.engine.workers.withdraw(&self.assignment_id(position), reason),
            StepStatus::WaitingForWorker => {
                let agent_id = self.steps[position].executor.clone();
                self.engine.workers.stop_waiting(&agent_id, &self.route(position));
            }
            _ => {}
        }
        self.end_attempt(position);
    }

    /// Writes what is staged in one commit with its events, then acts on it:
    /// assignments go out, watchers hear the events, slots are released.
    pub(super) async fn flush(&mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        if staged.steps.is_empty()
            && !staged.execution_changed
            && staged.assignments.is_empty()
            && staged.subtasks.is_empty()
            && staged.events.is_empty()
            && staged.messages.is_empty()
            && staged.memories.is_empty()
        {
            self.run_effects();
            return Ok(());
        }
        let mut writes = Vec::with_capacity(4);
        if staged.execution_changed {
            writes.push(Write::UpdateExecution(self.execution.clone()));
        }
        if !staged.steps.is_empty() {
            let steps = staged
                .steps
                .iter()
                .map(|&position| {
                    self.staged_mark[position] = false;
                    StepWrite {
                        execution_id: self.execution.id.clone(),
                        position: position as u32,
                        step_id: self.definition(position).id.clone(),
                        step: self.steps[position].clone(),
                    }
                })
                .collect();
            writes.push(Write::Steps(steps));
        }
        for assignment in staged.assignments {
            writes.push(Write::Assignment { execution_id: self.execution.id.clone(), assignment });
        }
        for subtask in staged.subtasks {
            writes.push(Write::Subtask { execution_id: self.execution.id.clone(), subtask });
        }
        if !staged.events.is_empty() {
            writes.push(Write::Events(staged.events.clone()));
        }
        if !staged.messages.is_empty() {
            writes.push(Write::PostMessages(staged.messages));
        }
        if !staged.memories.is_empty() {
            writes.push(Write::Remember(staged.memories));
        }
        self.engine.store.commit(writes).await?;
        self.engine.announce(staged.events);
        self.run_effects();
        Ok(())
    }

    fn run_effects(&mut self) {
        let mut releases = Vec::new();
        for effect in self.after_commit.drain(..) {
            match effect {
                Effect::Send { slot, assignment, route } => {
                    let ready_since = self.ready_since[route.position].take();
                    slot.send(assignment, route);
                    if let Some(since) = ready_since {
                        muster_runtime::metrics::observe(
                            "muster_execution_step_dispatch_seconds",
                            "From a step becoming ready to its assignment being sent to a worker, for the steps whose agent and a worker had room for them at once",
                            &[],
                            since.elapsed().as_secs_f64(),
                        );
                    }
                }
                Effect::CallTool { call, limit, route } => {
                    let span = self.spans[route.position].clone().unwrap_or_else(tracing::Span::none);
                    let call = tool_step::run_call(self.engine.workers.clone(), call, limit, route);
                    self.engine.spawn(call.instrument(span));
                }
                Effect::Release(task_id) => releases.push(task_id),
                Effect::Posted(inbox) => self.engine.spawn_trigger(inbox, Cause::Posted),
            }
        }
        // The slots the turn's ended steps held go back in one call.
        if !releases.is_empty() {
            let roster = self.engine.roster.clone();
            self.engine.spawn(async move {
                let released = match releases.as_slice() {
                    [task_id] => roster.release(task_id.clone()).await,
                    _ => roster.release_batch(releases.clone()).await,
                };
                if let Err(failure) = released {
                    tracing::warn!(tasks = ?releases, error = %failure.message(), "could not release the slots");
                }
            });
        }
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
            None => patiently(Duration::from_millis(500), "a delegation", || roster.delegate(ask.clone())).await,
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

/// A duration as people read it: whole seconds, else milliseconds.
fn seconds_or_milliseconds(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{} s", duration.as_secs())
    } else {
        format!("{} ms", duration.as_millis())
    }
}

/// A worker's output as stored: JSON text. Output that is not JSON is kept as a JSON string.
fn stored_output(output_json: String) -> String {
    if output_json.trim().is_empty() {
        "null".to_owned()
    } else if serde_json::from_str::<serde::de::IgnoredAny>(&output_json).is_ok() {
        output_json
    } else {
        serde_json::Value::String(output_json).to_string()
    }
}

/// The roles of a step as events and assignments carry them; a step with
/// only an `agent` has it as executor.
pub(crate) fn step_roles(definition: &StepDefinition) -> StepRoles {
    match &definition.roles {
        Some(roles) => roles.clone(),
        None => StepRoles {
            executor: definition.agent.clone().unwrap_or_default(),
            monitors: Vec::new(),
            informed: Vec::new(),
        },
    }
}
