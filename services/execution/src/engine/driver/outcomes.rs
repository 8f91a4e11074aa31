//! Outcomes: what a worker reported becomes the step's end (completed,
//! failed and retried when it may be, lost and assigned again), with what
//! it remembered and posted; a step that ends makes its dependants ready or
//! fails them, and its roster slot goes back or on to the next link of a
//! chain run by the same agent.

use std::{cmp::Reverse, sync::Arc};

use super::{Driver, Effect, Known, Timer, stored_output};
use crate::domain::{
    StepStatus,
    dag::Readiness,
    inbox::{self, InboxMessage},
    memory::{self, MemoryEntry},
    model::{EventKind, MemoryOutput, Outcome},
};

impl Driver {
    /// What a worker reported: the attempt ends completed, failed (retried
    /// when it may be), or lost (assigned again).
    pub(super) fn settle(&mut self, position: usize, outcome: Outcome) {
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
                output_value,
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
                let output: Arc<str> = Arc::from(stored_output(output_json));
                if let Some(value) = output_value.filter(|_| !self.dag.dependants(position).is_empty()) {
                    // The step's entry in its dependants' shared memory, from the value as it came.
                    let entry = MemoryOutput::with_value(self.definition(position).id.clone(), output.clone(), &value);
                    self.memory_outputs.insert(position, Arc::new(entry));
                }
                let step = &mut self.steps[position];
                step.output_json = Some(output);
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

    /// Whether a completed agent task's output matches its executor's role's
    /// output schema (when the role has one).
    pub(super) fn check_output(&mut self, position: usize, output_json: &str) -> std::result::Result<(), String> {
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

    /// The role of a step's executor, as the roster said; empty for none.
    pub(super) fn executor_role(&self, position: usize) -> &str {
        match self.contexts.get(&self.steps[position].executor) {
            Some(Known::Ready(context)) => &context.roster_role,
            _ => "",
        }
    }

    /// Writes what a completed step's worker asked to remember (checked
    /// already), with the step's commit.
    pub(super) fn remember(&mut self, position: usize, notes: &[(Option<bool>, String)], now: i64) {
        let role = self.executor_role(position).to_owned();
        let author = self.steps[position].executor.clone();
        for (global, text) in notes {
            let role = if *global == Some(true) { "" } else { role.as_str() };
            let entry = MemoryEntry::new(role, text, &author, &self.execution.id, now);
            self.staged.memories.push(entry);
        }
    }

    /// Posts a completed step's output to an inbox, with the step's commit.
    pub(super) fn post_output(&mut self, position: usize, inbox: String, now: i64) {
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
    pub(in crate::engine) fn end_attempt(&mut self, position: usize) {
        if std::mem::replace(&mut self.active[position], false) {
            self.in_flight -= 1;
        }
        self.spans[position] = None;
        self.forget_reported(position);
    }

    pub(super) fn max_iterations(&self, position: usize) -> u32 {
        match self.contexts.get(&self.steps[position].executor) {
            Some(Known::Ready(context)) => context.max_iterations,
            _ => crate::clients::roster::DEFAULT_MAX_ITERATIONS,
        }
    }

    /// Fails a step for good, with its event, and fails the dependants it blocks.
    pub(in crate::engine) fn fail(&mut self, position: usize, code: &str, message: String) {
        self.record_failure(position, code, message);
        self.after_end(position);
    }

    /// A step failed: its state, its event, its roster slot given back.
    pub(super) fn record_failure(&mut self, position: usize, code: &str, message: String) {
        let now = muster_runtime::time::now_millis();
        self.steps[position].retry_at = None;
        self.steps[position].ended_with_error(code, message, now);
        self.set_status(position, StepStatus::Failed);
        let mut event = self.step_event(EventKind::StepFailed, position);
        event.error = Some((self.steps[position].error_code.clone(), self.steps[position].error_message.clone()));
        self.record(event);
        self.release_delegation(position);
    }

    pub(super) fn upstream_failure(&self, dependency: usize) -> String {
        format!("step '{}', which this step depends on, did not complete", self.definition(dependency).id)
    }

    pub(super) fn fail_upstream(&mut self, position: usize, dependency: usize) {
        let message = self.upstream_failure(dependency);
        self.fail(position, "UPSTREAM_FAILED", message);
    }

    /// A step ended: its pending dependants become ready, or fail when it
    /// blocks them (and theirs after them, without recursion).
    pub(in crate::engine) fn after_end(&mut self, position: usize) {
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
    pub(in crate::engine) fn release_delegation(&mut self, position: usize) {
        self.forget_reserved_ahead(position);
        let task_id = self.take_slot_task(position);
        if std::mem::replace(&mut self.steps[position].roster_reserved, false) {
            self.stage(position);
            self.release_later(task_id);
        }
    }

    /// The roster task whose slot the step holds (one it took over, else its
    /// own), no longer marked as taken over.
    pub(super) fn take_slot_task(&mut self, position: usize) -> String {
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
    pub(super) fn pass_slot(&mut self, position: usize) {
        let heir = self.steps[position].roster_reserved.then(|| {
            let agent = self.steps[position].executor.as_str();
            self.dag.dependants(position).iter().copied().find(|&dependant| {
                let (step, definition) = (&self.steps[dependant], self.definition(dependant));
                step.status == StepStatus::Ready
                    && !step.roster_reserved
                    && step.assigned_to.is_none()
                    && !self.active[dependant]
                    && definition.step_type != crate::engine::HUMAN_APPROVAL
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
}
