//! One execution's driver: the only writer of its state. It starts ready
//! steps (up to the parallel limit), records what step tasks report, fails
//! the dependants of failed steps, and ends the execution.
//!
//! Group commit: what step tasks report is staged, and everything staged in
//! one turn of the loop (all the reports ready at once, and the steps they
//! ready) is written in one transaction before the driver waits again.
//! Requests that answer a caller (approvals, interventions, delegation
//! onward) are written before the answer goes out.

use std::{collections::HashMap, sync::Arc};

use muster_format::{ProcessDefinition, StepDefinition};
use muster_proto::common::v1::{EventType, StepError, StepEvent, StepRoles};
use tokio::{sync::mpsc, task::JoinSet};
use tracing::Instrument as _;

use super::{
    Control, Engine,
    assignment::{AgentContexts, StepTask, StepUpdate},
};
use crate::{
    Error, Result,
    domain::{ExecutionStatus, StepStatus, authority::RoleAssignment},
    store::{ExecutionRow, StepRow},
    workers::Outcome,
};

pub(crate) struct Driver {
    pub(super) engine: Arc<Engine>,
    pub(super) execution: ExecutionRow,
    pub(super) definition: Arc<ProcessDefinition>,
    pub(super) index: HashMap<String, usize>,
    pub(super) running: JoinSet<(usize, u32, Outcome)>,
    pub(super) updates_sender: mpsc::UnboundedSender<StepUpdate>,
    pub(super) updates: mpsc::UnboundedReceiver<StepUpdate>,
    pub(super) controls: mpsc::UnboundedReceiver<Control>,
    pub(super) max_parallel: usize,
    pub(super) agent_contexts: AgentContexts,
    /// Steps given to another agent by a REASSIGN intervention.
    pub(super) reassigned: HashMap<usize, String>,
    /// Agents each step passed through by delegation onward, oldest first.
    pub(super) delegation_chains: HashMap<usize, Vec<String>>,
    /// Dependants reopened by a RETRY, to persist with it.
    pub(super) dependants_reopened: Vec<usize>,
    /// Changes staged for the next write: changed steps, whether the
    /// execution's row changed, and the events, in order.
    staged: Staged,
}

#[derive(Default)]
struct Staged {
    positions: Vec<usize>,
    execution_changed: bool,
    assignments: Vec<RoleAssignment>,
    events: Vec<StepEvent>,
}

impl Driver {
    pub(crate) fn new(
        engine: Arc<Engine>,
        mut execution: ExecutionRow,
        definition: Arc<ProcessDefinition>,
        controls: mpsc::UnboundedReceiver<Control>,
    ) -> Self {
        // Steps that were running when the service stopped are assigned again.
        for step in &mut execution.steps {
            if step.status.is_in_flight() {
                step.status = StepStatus::Ready;
            }
        }
        let index = definition.steps.iter().enumerate().map(|(position, step)| (step.id.clone(), position)).collect();
        let max_parallel =
            definition.max_parallel.map(|limit| limit as usize).unwrap_or(engine.default_max_parallel).max(1);
        let (updates_sender, updates) = mpsc::unbounded_channel();
        Self {
            engine,
            execution,
            definition,
            index,
            running: JoinSet::new(),
            updates_sender,
            updates,
            controls,
            max_parallel,
            agent_contexts: AgentContexts::default(),
            reassigned: HashMap::new(),
            dependants_reopened: Vec::new(),
            delegation_chains: HashMap::new(),
            staged: Staged::default(),
        }
    }

    pub(crate) async fn run(mut self) -> Result<()> {
        loop {
            self.advance().await?;
            if self.execution.steps.iter().all(|step| step.status.is_final()) {
                return self.finish(None).await;
            }
            self.flush().await?;
            tokio::select! {
                biased;
                Some(update) = self.updates.recv() => {
                    self.apply_update(update).await?;
                    self.take_ready_reports().await?;
                }
                Some(control) = self.controls.recv() => match control {
                    Control::Cancel(reason) => return self.finish(Some(reason)).await,
                    Control::Decide { step_id, approved, by, comment, matrix_version, reply } => {
                        let outcome = self.decide(&step_id, approved, &by, &comment, matrix_version).await;
                        let _ = reply.send(outcome);
                    }
                    Control::DelegateOnward { request, reply } => {
                        let outcome = self.delegate_onward(request).await;
                        let _ = reply.send(outcome);
                    }
                    Control::Intervene { intervention, reply } => {
                        let outcome = self.intervene(intervention).await;
                        let _ = reply.send(outcome);
                    }
                    Control::AssignRole { assignment, matrix_version, reply } => {
                        let outcome = self.assign_role(assignment, matrix_version).await;
                        let _ = reply.send(outcome);
                    }
                    Control::SetLead { agent_id, by, reply } => {
                        let outcome = self.set_lead(agent_id, &by).await;
                        let _ = reply.send(outcome);
                    }
                },
                Some(joined) = self.running.join_next() => {
                    self.settle_joined(joined).await?;
                    self.take_ready_reports().await?;
                }
            }
        }
    }

    /// Takes every report already waiting, without waiting for more, so one
    /// write records them together.
    async fn take_ready_reports(&mut self) -> Result<()> {
        loop {
            if let Ok(update) = self.updates.try_recv() {
                self.apply_update(update).await?;
            } else if let Some(joined) = self.running.try_join_next() {
                self.settle_joined(joined).await?;
            } else {
                return Ok(());
            }
        }
    }

    async fn settle_joined(
        &mut self,
        joined: std::result::Result<(usize, u32, Outcome), tokio::task::JoinError>,
    ) -> Result<()> {
        match joined {
            Ok((position, attempt, outcome)) => self.settle(position, attempt, outcome).await,
            Err(error) => {
                tracing::error!(execution_id = %self.execution.id, %error, "step task panicked");
                Ok(())
            }
        }
    }

    /// Fails the dependants of failed steps, readies steps whose dependencies
    /// are done, and starts ready steps up to the parallel limit.
    async fn advance(&mut self) -> Result<()> {
        let mut changed = Vec::new();
        let mut events = Vec::new();
        loop {
            let mut progressed = false;
            for position in 0..self.execution.steps.len() {
                if self.execution.steps[position].status != StepStatus::Pending {
                    continue;
                }
                let definition = &self.definition.steps[position];
                let mut all_done = true;
                let mut blocking_failure = None;
                for dependency in &definition.depends_on {
                    let Some(&dependency_position) = self.index.get(dependency) else { continue };
                    let dependency_row = &self.execution.steps[dependency_position];
                    let continues = self.definition.steps[dependency_position].continue_on_failure;
                    match dependency_row.status {
                        StepStatus::Completed => {}
                        StepStatus::Failed | StepStatus::Cancelled if continues => {}
                        StepStatus::Failed | StepStatus::Cancelled => blocking_failure = Some(dependency.clone()),
                        _ => all_done = false,
                    }
                }
                if let Some(failed_dependency) = blocking_failure {
                    let now = muster_runtime::time::now_millis();
                    let step = &mut self.execution.steps[position];
                    step.status = StepStatus::Failed;
                    step.error_code = "UPSTREAM_FAILED".to_owned();
                    step.error_message =
                        format!("step '{failed_dependency}', which this step depends on, did not complete");
                    step.ended_at = Some(now);
                    changed.push(position);
                    let mut event = self.step_event(EventType::StepFailed, position);
                    event.error = Some(StepError {
                        code: self.execution.steps[position].error_code.clone(),
                        message: self.execution.steps[position].error_message.clone(),
                    });
                    events.push(event);
                    progressed = true;
                } else if all_done {
                    self.execution.steps[position].status = StepStatus::Ready;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        self.stage(&changed, false, events);

        if self.execution.status == ExecutionStatus::Paused {
            return Ok(());
        }
        let mut in_flight = self.running.len();
        for position in 0..self.execution.steps.len() {
            if in_flight >= self.max_parallel {
                break;
            }
            if self.execution.steps[position].status == StepStatus::Ready {
                if self.definition.steps[position].step_type == HUMAN_APPROVAL {
                    self.request_approval(position).await?;
                } else {
                    self.spawn_step(position);
                    in_flight += 1;
                }
            }
        }
        Ok(())
    }

    /// A human approval step waits for its executor's or a monitor's decision.
    async fn request_approval(&mut self, position: usize) -> Result<()> {
        let step = &mut self.execution.steps[position];
        step.status = StepStatus::WaitingApproval;
        step.attempt = 1;
        step.started_at = Some(muster_runtime::time::now_millis());
        let mut event = self.step_event(EventType::ApprovalRequested, position);
        event.waiting_for = approvers(&self.definition.steps[position]);
        self.persist(&[position], false, vec![event]).await
    }

    /// Records an approval decision: approved completes the step, rejected fails it.
    async fn decide(
        &mut self,
        step_id: &str,
        approved: bool,
        by: &str,
        comment: &str,
        matrix_version: u32,
    ) -> Result<()> {
        let Some(&position) = self.index.get(step_id) else {
            return Err(Error::NotFound(format!("execution '{}' has no step '{step_id}'", self.execution.id)));
        };
        if self.execution.steps[position].status != StepStatus::WaitingApproval {
            return Err(Error::FailedPrecondition(format!(
                "step '{step_id}' is not waiting for approval (it is {})",
                self.execution.steps[position].status.as_str()
            )));
        }
        let now = muster_runtime::time::now_millis();
        let step = &mut self.execution.steps[position];
        step.executor = by.to_owned();
        step.ended_at = Some(now);
        let mut event = if approved {
            step.status = StepStatus::Completed;
            step.output_json = serde_json::json!({"approved": true, "by": by, "comment": comment}).to_string();
            let mut event = self.step_event(EventType::StepCompleted, position);
            event.duration_ms =
                self.execution.steps[position].started_at.map_or(0, |started| (now - started).max(0) as u64);
            event
        } else {
            step.status = StepStatus::Failed;
            step.error_code = "REJECTED".to_owned();
            step.error_message =
                if comment.is_empty() { format!("rejected by {by}") } else { format!("rejected by {by}: {comment}") };
            let mut event = self.step_event(EventType::StepFailed, position);
            event.error = Some(StepError {
                code: self.execution.steps[position].error_code.clone(),
                message: self.execution.steps[position].error_message.clone(),
            });
            event
        };
        event.matrix_version = matrix_version;
        self.persist(&[position], false, vec![event]).await
    }

    pub(super) fn spawn_step(&mut self, position: usize) {
        let step = &mut self.execution.steps[position];
        step.status = StepStatus::Running;
        step.attempt += 1;
        let attempt = step.attempt;
        let definition = self.definition.steps[position].clone();
        let upstream_outputs = definition
            .depends_on
            .iter()
            .filter_map(|dependency| {
                let row = &self.execution.steps[*self.index.get(dependency)?];
                (row.status == StepStatus::Completed).then(|| (dependency.clone(), row.output_json.clone()))
            })
            .collect();
        let task = StepTask {
            engine: self.engine.clone(),
            execution_id: self.execution.id.clone(),
            process_name: self.execution.process_name.clone(),
            process_version: self.execution.process_version,
            execution_inputs_json: self.execution.inputs_json.clone(),
            lead_agent_id: self.execution.lead_agent_id.clone(),
            position,
            attempt,
            definition,
            upstream_outputs,
            shared_memory_json: self.shared_memory_json(),
            history: self.history(),
            updates: self.updates_sender.clone(),
            agent_contexts: self.agent_contexts.clone(),
            reassigned_to: self.reassigned.get(&position).cloned(),
            delegation_chain: self.delegation_chains.get(&position).cloned().unwrap_or_default(),
            session: self.session_snapshot(),
        };
        let span = tracing::info_span!("step", step_id = %task.definition.id, attempt);
        self.running.spawn(task.run().instrument(span));
    }

    async fn apply_update(&mut self, update: StepUpdate) -> Result<()> {
        let (position, attempt) = update.step();
        if self.execution.steps[position].attempt != attempt || !self.execution.steps[position].status.is_in_flight() {
            return Ok(());
        }
        let event = match update {
            StepUpdate::Assigned { agent_id, .. } => {
                let step = &mut self.execution.steps[position];
                step.status = StepStatus::Running;
                step.executor = agent_id;
                step.started_at = Some(muster_runtime::time::now_millis());
                self.step_event(EventType::StepStarted, position)
            }
            StepUpdate::Delegated { agent_id, detail, escalated, .. } => {
                self.execution.steps[position].executor = agent_id;
                let kind = if escalated { EventType::StepEscalated } else { EventType::StepDelegated };
                let mut event = self.step_event(kind, position);
                event.detail = detail;
                event
            }
            StepUpdate::Queued { expert_id, wait_seconds, detail, .. } => {
                self.execution.steps[position].status = StepStatus::Queued;
                self.execution.steps[position].executor = expert_id;
                let mut event = self.step_event(EventType::StepQueued, position);
                event.wait_seconds = wait_seconds;
                event.detail = detail;
                event
            }
        };
        self.stage(&[position], false, vec![event]);
        Ok(())
    }

    async fn settle(&mut self, position: usize, attempt: u32, outcome: Outcome) -> Result<()> {
        if self.execution.steps[position].attempt != attempt || !self.execution.steps[position].status.is_in_flight() {
            return Ok(());
        }
        let now = muster_runtime::time::now_millis();
        let retries = self.definition.steps[position].retries;
        // A session step's result counts only while its executor may still perform it.
        let outcome = match outcome {
            Outcome::Completed(result) => match self.admit_result(position) {
                Ok(()) => Outcome::Completed(result),
                Err(reason) => Outcome::Failed(muster_proto::execution::v1::StepFailure {
                    assignment_id: result.assignment_id,
                    error_code: "PERMISSION_DENIED".to_owned(),
                    message: reason,
                    retryable: false,
                }),
            },
            other => other,
        };
        let step = &mut self.execution.steps[position];
        let event = match outcome {
            Outcome::Completed(result) => {
                step.status = StepStatus::Completed;
                step.output_json = stored_output(result.output_json);
                step.cost = result.cost;
                step.tokens_used = result.tokens_used;
                step.ended_at = Some(now);
                let duration_ms =
                    step.started_at.map(|started| (now - started).max(0) as u64).unwrap_or(result.duration_ms);
                let mut event = self.step_event(EventType::StepCompleted, position);
                event.duration_ms = duration_ms;
                Some(event)
            }
            Outcome::Failed(failure) if failure.retryable && attempt <= retries => {
                tracing::info!(execution_id = %self.execution.id, step = %step.step_id, attempt, error = %failure.message, "step failed; retrying");
                step.status = StepStatus::Ready;
                step.error_code = failure.error_code;
                step.error_message = failure.message;
                None
            }
            Outcome::Failed(failure) => {
                step.status = StepStatus::Failed;
                step.error_code =
                    if failure.error_code.is_empty() { "WORKER_FAILED".to_owned() } else { failure.error_code };
                step.error_message = failure.message;
                step.ended_at = Some(now);
                let mut event = self.step_event(EventType::StepFailed, position);
                event.error = Some(StepError {
                    code: self.execution.steps[position].error_code.clone(),
                    message: self.execution.steps[position].error_message.clone(),
                });
                Some(event)
            }
            Outcome::WorkerLost => {
                tracing::info!(execution_id = %self.execution.id, step = %step.step_id, attempt, "worker lost; assigning the step again");
                step.status = StepStatus::Ready;
                None
            }
        };
        if self.execution.steps[position].status.is_final() {
            self.release_delegation(position);
        }
        self.stage(&[position], false, event.into_iter().collect());
        Ok(())
    }

    /// Frees the roster slot a delegated step held, whatever its outcome.
    pub(super) fn release_delegation(&self, position: usize) {
        let definition = &self.definition.steps[position];
        if definition.executor().is_some() || definition.delegate.is_none() {
            return;
        }
        let mut roster = self.engine.roster.clone();
        let task_id = format!("{}/{}", self.execution.id, definition.id);
        tokio::spawn(async move {
            let request = muster_proto::roster::v1::ReleaseTaskRequest { task_id: task_id.clone() };
            if let Err(status) = roster.release_task(request).await {
                tracing::warn!(%task_id, error = %status.message(), "could not release the delegated slot");
            }
        });
    }

    /// Ends the execution: cancelled when `cancel_reason` is given, else
    /// completed when every step completed and failed otherwise.
    async fn finish(&mut self, cancel_reason: Option<String>) -> Result<()> {
        let now = muster_runtime::time::now_millis();
        let mut changed = Vec::new();
        if let Some(reason) = &cancel_reason {
            self.running.abort_all();
            for (position, step) in self.execution.steps.iter_mut().enumerate() {
                if !step.status.is_final() {
                    self.engine
                        .workers
                        .withdraw(&assignment_id(&self.execution.id, &step.step_id, step.attempt), reason);
                    step.status = StepStatus::Cancelled;
                    step.error_code = "CANCELLED".to_owned();
                    step.error_message = reason.clone();
                    step.ended_at = Some(now);
                    changed.push(position);
                }
            }
            for position in changed.clone() {
                self.release_delegation(position);
            }
            self.execution.status = ExecutionStatus::Cancelled;
            self.execution.reason = reason.clone();
        } else if let Some(failed) = self.execution.steps.iter().find(|step| step.status != StepStatus::Completed) {
            self.execution.status = ExecutionStatus::Failed;
            self.execution.reason =
                format!("step '{}' {}: {}", failed.step_id, failed.status.as_str(), failed.error_message);
        } else {
            self.execution.status = ExecutionStatus::Completed;
        }
        self.execution.ended_at = Some(now);
        let mut event = new_event(&mut self.execution, EventType::ExecutionFinished);
        event.execution_status = self.execution.status.to_wire() as i32;
        event.detail = self.execution.reason.clone();
        self.persist(&changed, true, vec![event]).await?;
        tracing::info!(execution_id = %self.execution.id, status = self.execution.status.as_str(), reason = %self.execution.reason, "execution finished");
        Ok(())
    }

    /// Stages changes for the next write (see the module's doc).
    pub(super) fn stage(&mut self, positions: &[usize], execution_changed: bool, events: Vec<StepEvent>) {
        for position in positions {
            if !self.staged.positions.contains(position) {
                self.staged.positions.push(*position);
            }
        }
        self.staged.execution_changed |= execution_changed;
        self.staged.events.extend(events);
    }

    /// Stages a changed session assignment for the next write.
    pub(super) fn stage_assignment(&mut self, assignment: RoleAssignment) {
        self.staged.assignments.push(assignment);
    }

    /// Writes what is staged, in one transaction with its events and their
    /// outbox rows, then announces the events.
    pub(super) async fn flush(&mut self) -> Result<()> {
        let staged = std::mem::take(&mut self.staged);
        if staged.positions.is_empty()
            && !staged.execution_changed
            && staged.assignments.is_empty()
            && staged.events.is_empty()
        {
            return Ok(());
        }
        let steps: Vec<&StepRow> = staged.positions.iter().map(|position| &self.execution.steps[*position]).collect();
        self.engine
            .store
            .record(&self.execution, &steps, staged.execution_changed, &staged.assignments, &staged.events)
            .await?;
        self.engine.announce(staged.events);
        Ok(())
    }

    /// Writes these changes, and whatever was staged before them, now.
    pub(super) async fn persist(
        &mut self,
        positions: &[usize],
        execution_changed: bool,
        events: Vec<StepEvent>,
    ) -> Result<()> {
        self.stage(positions, execution_changed, events);
        self.flush().await
    }

    pub(super) fn step_event(&mut self, event_type: EventType, position: usize) -> StepEvent {
        let base = new_event(&mut self.execution, event_type);
        let definition = &self.definition.steps[position];
        let row = &self.execution.steps[position];
        StepEvent {
            step_id: row.step_id.clone(),
            step_name: definition.name.clone(),
            roles: Some(step_roles(definition)),
            agent_id: row.executor.clone(),
            retry_count: row.attempt.saturating_sub(1),
            output_json: if event_type == EventType::StepCompleted { row.output_json.clone() } else { String::new() },
            cost: row.cost,
            tokens_used: row.tokens_used,
            ..base
        }
    }

    /// Every completed step's output by step id, as a JSON object. Outputs are
    /// valid JSON once stored (see `settle`), so this is concatenation, not parsing.
    fn shared_memory_json(&self) -> String {
        let mut memory = String::from("{");
        for step in self.execution.steps.iter().filter(|step| step.status == StepStatus::Completed) {
            if memory.len() > 1 {
                memory.push(',');
            }
            memory.push_str(&serde_json::Value::String(step.step_id.clone()).to_string());
            memory.push(':');
            memory.push_str(&step.output_json);
        }
        memory.push('}');
        memory
    }

    fn history(&self) -> Vec<muster_proto::execution::v1::HistoryEntry> {
        let mut finished: Vec<&StepRow> = self.execution.steps.iter().filter(|step| step.status.is_final()).collect();
        finished.sort_by_key(|step| step.ended_at);
        finished
            .into_iter()
            .map(|step| muster_proto::execution::v1::HistoryEntry {
                step_id: step.step_id.clone(),
                agent_id: step.executor.clone(),
                action: step.status.as_str().to_owned(),
                at: step.ended_at.map(muster_runtime::time::to_timestamp),
            })
            .collect()
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

/// The roles of a step as sent in events; a step with only an `agent` has it as executor.
pub(crate) fn step_roles(definition: &StepDefinition) -> StepRoles {
    match &definition.roles {
        Some(roles) => StepRoles {
            executor: roles.executor.clone(),
            monitors: roles.monitors.clone(),
            informed: roles.informed.clone(),
        },
        None => StepRoles { executor: definition.agent.clone().unwrap_or_default(), ..Default::default() },
    }
}

/// The step type that waits for a person's decision instead of a worker.
pub(crate) const HUMAN_APPROVAL: &str = "human_approval";

/// Who may decide an approval step: its executor and its monitors.
pub(crate) fn approvers(definition: &StepDefinition) -> Vec<String> {
    let roles = step_roles(definition);
    let mut approvers: Vec<String> =
        std::iter::once(roles.executor).chain(roles.monitors).filter(|agent| !agent.is_empty()).collect();
    approvers.dedup();
    approvers
}

/// The id of one attempt of a step.
pub(crate) fn assignment_id(execution_id: &str, step_id: &str, attempt: u32) -> String {
    format!("{execution_id}/{step_id}/{attempt}")
}

/// A new event of the execution, with the next sequence number.
pub(crate) fn new_event(execution: &mut ExecutionRow, event_type: EventType) -> StepEvent {
    execution.last_sequence += 1;
    StepEvent {
        event_id: uuid::Uuid::now_v7().to_string(),
        sequence: execution.last_sequence,
        r#type: event_type as i32,
        occurred_at: Some(muster_runtime::time::to_timestamp(muster_runtime::time::now_millis())),
        execution_id: execution.id.clone(),
        process_name: execution.process_name.clone(),
        process_version: execution.process_version,
        lead_agent_id: execution.lead_agent_id.clone(),
        trace_parent: muster_runtime::telemetry::traceparent(&tracing::Span::current()),
        ..Default::default()
    }
}
