//! One execution's driver: the only writer of its state. It starts ready
//! steps (up to the parallel limit), has the roster place them (a named
//! executor's capacity and status, or a choice by criteria; the next step's
//! slot asked for while the one before runs: [`ahead`]) and hands them
//! to workers ([`placement`], with what they carry: [`assignment`]) or
//! invokes their tools ([`tool_step`]), follows what running attempts
//! report ([`progress`]) and what the run spends ([`spending`]), records
//! the outcomes and fails the dependants of failed steps ([`outcomes`]),
//! applies due timers ([`timers`]), and ends the execution.
//!
//! Everything happens in turns. A turn takes every input waiting (worker
//! reports, the roster's answers, callers' requests, due timers), applies
//! them to the state in memory, and writes every change with its events in
//! one commit ([`commit`]); only then does it act on them — send
//! assignments, answer callers, tell watchers. So a worker never gets a step whose start is not
//! recorded, and nothing a caller was told is lost if the service dies.
//!
//! Costs stay flat as an execution grows: a step that ends looks only at its
//! dependants, an assignment carries a bounded history and shared memory,
//! and nothing rescans every step.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};

use muster_format::{StepDefinition, StepRoles};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

mod ahead;
mod assignment;
mod commit;
mod outcomes;
mod placement;
mod progress;
mod spending;
mod timers;
mod tool_step;

use super::{Control, Engine, Input, Route, inbox::Cause, schema, workers::Slot};
use crate::{
    Result,
    clients::roster::DelegationAsk,
    domain::{
        ExecutionStatus, StepStatus,
        authority::{RoleAssignment, SubtaskRequest},
        dag::{Dag, Readiness},
        inbox::InboxMessage,
        memory::MemoryEntry,
        model::{
            AgentContext, Assignment, Event, EventKind, Execution, HistoryEntry, MemoryOutput, ProcessVersion,
            SharedMemory, Step,
        },
        payload,
    },
};
use ahead::Ahead;

/// How long the slots of ended steps are offered back to a roster that is
/// unavailable.
const RELEASE_PATIENCE: Duration = Duration::from_secs(600);

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
/// Most agents whose contexts a starting or resumed run has fetched ahead of
/// its steps (the first steps' agents).
const PREFETCHED: usize = 32;

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
    /// A task that reads memory, spawned once what the turn remembered is written.
    Spawn(std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>),
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
    /// Whether a step was staged to be written now ([`Driver::stage`]),
    /// rather than with the next commit ([`Driver::stage_lazily`]).
    steps_now: bool,
    /// Whether a step staged lazily waits ([`Driver::stage_lazily`]): the
    /// steps staged quietly alone ([`Driver::stage_quietly`]) never make a
    /// commit of their own.
    lazy: bool,
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
    /// When the steps staged lazily are written if no other commit took
    /// them first (milliseconds since the epoch).
    lazy_due: Option<i64>,
    /// Until when the turn's commit waits for an answer to an ask ahead
    /// that a started step waits for ([`Driver::flush_or_hold`]).
    hold_until: Option<tokio::time::Instant>,
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
    ahead: Vec<Ahead>,
    /// The steps asked about ahead whose answer may still be on its way.
    asked_ahead: Vec<usize>,
    /// The asks ahead of this turn, placed after its commit with the slots
    /// it gives back.
    asks_ahead: Vec<(DelegationAsk, Route)>,
    /// The execution was resumed (after a restart, or taken over from
    /// another replica): slots its steps reserved before may not be
    /// recorded (a slot reserved ahead is written only with a commit made
    /// for another reason), so its end releases the task of every step
    /// that did not complete.
    pub(super) resumed: bool,
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
            lazy_due: None,
            hold_until: None,
            after_commit: Vec::new(),
            schemas: schema::Compiled::default(),
            asks: Vec::new(),
            budget: None,
            spending: None,
            within_agent_budget: HashSet::new(),
            warned_agents: HashSet::new(),
            reported: HashMap::new(),
            ahead: vec![Ahead::None; count],
            asked_ahead: Vec::new(),
            asks_ahead: Vec::new(),
            resumed: false,
        }
    }

    pub(super) fn definition(&self, position: usize) -> &StepDefinition {
        &self.process.definition.steps[position]
    }

    pub(super) async fn run(mut self, stopping: CancellationToken) -> Result<()> {
        self.reopen_all();
        self.prefetch_contexts();
        loop {
            self.advance();
            self.send_asks();
            if self.ended == self.steps.len() {
                return self.finish(None).await;
            }
            self.flush_or_hold().await?;
            let next_due = self.timers.peek().map(|Reverse((due, ..))| *due).into_iter().chain(self.lazy_due).min();
            let due = next_due.map(|due| {
                let wait = (due - muster_runtime::time::now_millis()).max(0) as u64;
                tokio::time::Instant::now() + Duration::from_millis(wait)
            });
            let sleep = due.into_iter().chain(self.hold_until).min().map(tokio::time::sleep_until);
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

    /// Has the contexts of the agents named by the first steps not ended
    /// fetched ahead of their steps ([`PREFETCHED`] agents at most).
    fn prefetch_contexts(&self) {
        let mut agents: Vec<String> = Vec::new();
        for position in 0..self.steps.len() {
            if agents.len() == PREFETCHED {
                break;
            }
            if self.steps[position].status.is_final() || self.definition(position).step_type == super::HUMAN_APPROVAL {
                continue;
            }
            if let Some(agent) = self.named_executor(position)
                && !agents.contains(&agent)
            {
                agents.push(agent);
            }
        }
        self.engine.prefetch_contexts(agents);
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

    /// A step that goes back to be started, before the others waiting.
    pub(super) fn reopened_ready(&mut self, position: usize) {
        self.ready.push_front(position);
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

    pub(super) fn task_id(&self, position: usize) -> String {
        format!("{}/{}", self.execution.id, self.definition(position).id)
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
        if self.resumed {
            for position in 0..self.steps.len() {
                if self.steps[position].status != StepStatus::Completed {
                    self.release_later(self.task_id(position));
                }
            }
        }
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
