//! A turn's writes: every change staged (steps, the execution, session
//! records, events numbered in order), written in one commit, and only then
//! acted on: assignments sent, callers answered, slots released.

use tracing::Instrument as _;

use super::{Driver, Effect, step_roles};

/// How long, at most, a step staged lazily waits for another commit to be
/// written with, in milliseconds.
const LAZY_WRITE: i64 = 100;
/// How long a turn's commit may wait for an answer to an ask ahead
/// ([`Driver::flush_or_hold`]).
const HOLD_FOR_AHEAD: std::time::Duration = std::time::Duration::from_millis(2);
use crate::engine::inbox::Cause;
use crate::{
    Result,
    domain::{
        StepStatus,
        authority::{RoleAssignment, SubtaskRequest},
        model::{Event, EventKind},
    },
    store::{StepWrite, Write},
};

impl Driver {
    /// Writes what an accepted request changed before it is answered; a
    /// refused request changed nothing.
    pub(super) async fn written(&mut self, outcome: Result<()>) -> Result<Result<()>> {
        if outcome.is_ok() {
            self.flush().await?;
        }
        Ok(outcome)
    }

    /// Sets a step's status, keeping count of ended steps and staging it.
    pub(in crate::engine) fn set_status(&mut self, position: usize, status: StepStatus) {
        self.change_status(position, status);
        self.stage(position);
    }

    /// [`Driver::set_status`] for a status that tells nobody anything (a
    /// step waiting for a worker): written with the next commit.
    pub(in crate::engine) fn set_status_lazily(&mut self, position: usize, status: StepStatus) {
        self.change_status(position, status);
        self.stage_lazily(position);
    }

    fn change_status(&mut self, position: usize, status: StepStatus) {
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
    }

    /// Stages a step's row for this turn's commit.
    pub(in crate::engine) fn stage(&mut self, position: usize) {
        self.staged.steps_now = true;
        self.stage_lazily(position);
    }

    /// Stages a step's row for the next commit, of this turn or a later
    /// one: a change that tells nobody anything and that the engine can do
    /// without after a restart (a step waiting for a worker, the executor
    /// found for it: a restarted service starts the step again, asking the
    /// roster, which keeps a task's slot). Written at the latest
    /// [`LAZY_WRITE`] later.
    pub(in crate::engine) fn stage_lazily(&mut self, position: usize) {
        self.staged.lazy = true;
        self.stage_quietly(position);
    }

    /// Stages a step's row to ride the next commit made for another reason,
    /// however late: a change nobody reads from the store but a restarted
    /// service, which does without it (a slot reserved ahead: the end of a
    /// resumed execution gives back the slot of every step not completed).
    pub(in crate::engine) fn stage_quietly(&mut self, position: usize) {
        if !self.staged_mark[position] {
            self.staged_mark[position] = true;
            self.staged.steps.push(position);
        }
    }

    pub(in crate::engine) fn stage_execution(&mut self) {
        self.staged.execution_changed = true;
    }

    pub(in crate::engine) fn stage_assignment(&mut self, assignment: RoleAssignment) {
        self.staged.assignments.push(assignment);
    }

    pub(in crate::engine) fn stage_subtask(&mut self, subtask: SubtaskRequest) {
        self.staged.subtasks.push(subtask);
    }

    pub(in crate::engine) fn record(&mut self, event: Event) {
        self.staged.events.push(event);
    }

    /// An event about a step, numbered next.
    pub(in crate::engine) fn step_event(&mut self, kind: EventKind, position: usize) -> Event {
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
    pub(in crate::engine) fn execution_event(&mut self, kind: EventKind) -> Event {
        let trace_parent = muster_runtime::telemetry::traceparent(&tracing::Span::current());
        Event::new(&mut self.execution, kind, muster_runtime::time::now_millis(), trace_parent)
    }

    pub(in crate::engine) fn release_later(&mut self, task_id: String) {
        self.after_commit.push(Effect::Release(task_id));
    }

    /// [`Driver::flush`], unless a started step waits for the answer to its
    /// ask ahead: then the commit waits for that answer, [`HOLD_FOR_AHEAD`]
    /// at most, so that the step's start goes in the same commit as what
    /// made it ready (a step of a chain going from agent to agent costs one
    /// commit, not two). Nobody has heard of what waits.
    pub(super) async fn flush_or_hold(&mut self) -> Result<()> {
        if self.awaits_ahead() {
            let now = tokio::time::Instant::now();
            if now < *self.hold_until.get_or_insert(now + HOLD_FOR_AHEAD) {
                return Ok(());
            }
        }
        self.hold_until = None;
        self.flush().await
    }

    /// Writes what is staged in one commit with its events, then acts on it:
    /// assignments go out, watchers hear the events, slots are released.
    /// Steps staged lazily alone wait for a later commit, until [`LAZY_WRITE`];
    /// steps staged quietly alone wait for a later commit, however late.
    pub(in crate::engine) async fn flush(&mut self) -> Result<()> {
        let staged = &self.staged;
        let now = muster_runtime::time::now_millis();
        let due = staged.steps_now
            || staged.execution_changed
            || !staged.assignments.is_empty()
            || !staged.subtasks.is_empty()
            || !staged.events.is_empty()
            || !staged.messages.is_empty()
            || !staged.memories.is_empty()
            || self.lazy_due.is_some_and(|lazy_due| lazy_due <= now);
        if !due {
            if staged.lazy {
                self.lazy_due.get_or_insert(now + LAZY_WRITE);
            }
            self.run_effects();
            return Ok(());
        }
        self.lazy_due = None;
        let staged = std::mem::take(&mut self.staged);
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

    pub(super) fn run_effects(&mut self) {
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
                    let call = super::tool_step::run_call(self.engine.workers.clone(), call, limit, route);
                    self.engine.spawn(call.instrument(span));
                }
                Effect::Release(task_id) => releases.push(task_id),
                Effect::Spawn(task) => self.engine.spawn(task),
                Effect::Posted(inbox) => self.engine.spawn_trigger(inbox, Cause::Posted),
            }
        }
        // The slots the turn's ended steps held go back with the asks ahead
        // of the steps it sent, in one placement.
        if !releases.is_empty() || !self.asks_ahead.is_empty() {
            let asks = std::mem::take(&mut self.asks_ahead);
            self.engine.spawn(super::ahead::place_ahead(self.engine.roster.clone(), releases, asks));
        }
    }
}
