//! Decisions and interventions of people and agents, applied by the driver:
//! approving or rejecting a human approval step, and pausing, resuming,
//! retrying, cancelling, reassigning a step or overriding its output (or
//! pausing and resuming the whole execution). Who may do what is checked
//! by the gRPC layer; the driver checks that the step's state allows it,
//! applies it, and records its event.

use super::driver::Driver;
use crate::{
    Error, Result,
    domain::{ExecutionStatus, StepStatus, model::EventKind},
};

/// What an intervention does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InterventionAction {
    Pause,
    Resume,
    Retry,
    Cancel,
    Reassign(String),
    OverrideOutput(String),
}

impl InterventionAction {
    /// What it does, as a verb: `pause`, `reassign`, ...
    pub(crate) fn verb_infinitive(&self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Resume => "resume",
            Self::Retry => "retry",
            Self::Cancel => "cancel",
            Self::Reassign(_) => "reassign",
            Self::OverrideOutput(_) => "override the output of",
        }
    }

    fn verb(&self) -> &'static str {
        match self {
            Self::Pause => "paused",
            Self::Resume => "resumed",
            Self::Retry => "retried",
            Self::Cancel => "cancelled",
            Self::Reassign(_) => "reassigned",
            Self::OverrideOutput(_) => "overrode the output of",
        }
    }
}

/// An intervention, already authorised.
#[derive(Debug, Clone)]
pub(crate) struct Intervention {
    /// The step; `None` for execution-wide pause and resume.
    pub(crate) step_id: Option<String>,
    pub(crate) action: InterventionAction,
    /// Who: an agent's id, or `operator:<name>`.
    pub(crate) by: String,
    pub(crate) reason: String,
    /// The permission matrix version that authorised it (0: none applied).
    pub(crate) matrix_version: u32,
}

impl Driver {
    fn position_of(&self, step_id: &str) -> Result<usize> {
        self.process.definition.steps.iter().position(|step| step.id == step_id).ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.StepState",
                format!("{}/{step_id}", self.execution.id),
                format!("execution '{}' has no step '{step_id}'", self.execution.id),
            )
        })
    }

    /// Records an approval decision: approved completes the step, rejected fails it.
    pub(super) fn decide(
        &mut self,
        step_id: &str,
        approved: bool,
        by: &str,
        comment: &str,
        matrix_version: u32,
    ) -> Result<()> {
        let position = self.position_of(step_id)?;
        if self.steps[position].status != StepStatus::WaitingApproval {
            return Err(Error::precondition(
                "STEP_NOT_WAITING_FOR_APPROVAL",
                format!("step/{step_id}"),
                format!(
                    "step '{step_id}' is not waiting for approval (it is {})",
                    self.steps[position].status.as_str()
                ),
            ));
        }
        let now = muster_runtime::time::now_millis();
        let step = &mut self.steps[position];
        step.executor = by.to_owned();
        step.ended_at = Some(now);
        let mut event = if approved {
            step.output_json =
                Some(serde_json::json!({"approved": true, "by": by, "comment": comment}).to_string().into());
            let waited = step.started_at.map_or(0, |started| (now - started).max(0) as u64);
            self.set_status(position, StepStatus::Completed);
            let mut event = self.step_event(EventKind::StepCompleted, position);
            event.duration_ms = waited;
            event
        } else {
            let message =
                if comment.is_empty() { format!("rejected by {by}") } else { format!("rejected by {by}: {comment}") };
            self.steps[position].ended_with_error("REJECTED", message, now);
            self.set_status(position, StepStatus::Failed);
            let mut event = self.step_event(EventKind::StepFailed, position);
            event.error = Some((self.steps[position].error_code.clone(), self.steps[position].error_message.clone()));
            event
        };
        event.matrix_version = matrix_version;
        self.record(event);
        self.after_end(position);
        Ok(())
    }

    pub(super) fn intervene(&mut self, intervention: Intervention) -> Result<()> {
        let Some(step_id) = intervention.step_id.clone() else {
            return self.intervene_on_execution(intervention);
        };
        let position = self.position_of(&step_id)?;
        let status = self.steps[position].status;
        let refuse = || {
            Err(Error::precondition(
                "STEP_STATE",
                format!("step/{step_id}"),
                format!("step '{step_id}' is {}: it cannot be {}", status.as_str(), intervention.action.verb()),
            ))
        };
        let now = muster_runtime::time::now_millis();
        let mut reopened = false;
        match &intervention.action {
            InterventionAction::Pause => {
                if !matches!(
                    status,
                    StepStatus::Pending
                        | StepStatus::Ready
                        | StepStatus::Running
                        | StepStatus::Queued
                        | StepStatus::WaitingForWorker
                ) {
                    return refuse();
                }
                self.stop_attempt(position, "paused");
                self.steps[position].retry_at = None;
                self.set_status(position, StepStatus::Paused);
            }
            InterventionAction::Resume => {
                if status != StepStatus::Paused {
                    return refuse();
                }
                self.set_status(position, StepStatus::Pending);
                reopened = true;
            }
            InterventionAction::Retry => {
                if !matches!(
                    status,
                    StepStatus::Failed
                        | StepStatus::Cancelled
                        | StepStatus::Running
                        | StepStatus::Queued
                        | StepStatus::WaitingForWorker
                ) {
                    return refuse();
                }
                self.withdraw_attempt(position, "retried");
                self.reopen(position);
                // Dependants that failed because of this step get another chance too.
                for dependant in self.dag.downstream(position) {
                    if self.steps[dependant].status == StepStatus::Failed
                        && self.steps[dependant].error_code == "UPSTREAM_FAILED"
                    {
                        self.reopen(dependant);
                    }
                }
                reopened = true;
            }
            InterventionAction::Cancel => {
                if status.is_final() {
                    return refuse();
                }
                self.stop_attempt(position, "cancelled");
                let step = &mut self.steps[position];
                step.error_code = "CANCELLED".to_owned();
                step.error_message = format!("cancelled by {}", intervention.by);
                step.ended_at = Some(now);
                step.retry_at = None;
                self.set_status(position, StepStatus::Cancelled);
            }
            InterventionAction::Reassign(agent_id) => {
                if status.is_final() || status == StepStatus::WaitingApproval {
                    return refuse();
                }
                let underway = matches!(
                    status,
                    StepStatus::Ready | StepStatus::Running | StepStatus::Queued | StepStatus::WaitingForWorker
                );
                self.withdraw_attempt(position, "reassigned");
                let step = &mut self.steps[position];
                step.assigned_to = Some(agent_id.clone());
                step.executor = agent_id.clone();
                step.retry_at = None;
                if underway {
                    self.set_status(position, StepStatus::Ready);
                    self.reopened_ready(position);
                } else {
                    self.stage(position);
                }
            }
            InterventionAction::OverrideOutput(output_json) => {
                if status == StepStatus::Completed {
                    return refuse();
                }
                self.stop_attempt(position, "output overridden");
                let step = &mut self.steps[position];
                step.output_json = Some(output_json.as_str().into());
                step.error_code.clear();
                step.error_message.clear();
                step.ended_at = Some(now);
                step.retry_at = None;
                self.set_status(position, StepStatus::Completed);
            }
        }
        let mut intervened = self.step_event(EventKind::StepIntervened, position);
        intervened.agent_id = intervention.by.clone();
        intervened.detail = describe(&intervention, &step_id);
        intervened.matrix_version = intervention.matrix_version;
        // The agent a step is reassigned to hears of it.
        if let InterventionAction::Reassign(agent_id) = &intervention.action {
            intervened.participants = vec![agent_id.clone()];
        }
        self.record(intervened);
        match &intervention.action {
            InterventionAction::OverrideOutput(_) => {
                let completed = self.step_event(EventKind::StepCompleted, position);
                self.record(completed);
                self.after_end(position);
            }
            InterventionAction::Cancel => self.after_end(position),
            _ => {}
        }
        if reopened {
            self.reopen_all();
        }
        tracing::info!(execution_id = %self.execution.id, step = %step_id, by = %intervention.by, action = intervention.action.verb(), "intervention");
        Ok(())
    }

    fn intervene_on_execution(&mut self, intervention: Intervention) -> Result<()> {
        let next = match (&intervention.action, self.execution.status) {
            (InterventionAction::Pause, ExecutionStatus::Running) => ExecutionStatus::Paused,
            (InterventionAction::Resume, ExecutionStatus::Paused) => ExecutionStatus::Running,
            (InterventionAction::Pause | InterventionAction::Resume, status) => {
                return Err(Error::precondition(
                    "EXECUTION_STATE",
                    format!("execution/{}", self.execution.id),
                    format!(
                        "execution '{}' is {}: it cannot be {}",
                        self.execution.id,
                        status.as_str(),
                        intervention.action.verb()
                    ),
                ));
            }
            _ => {
                return Err(Error::invalid(
                    "step_id",
                    "only pause and resume apply to a whole execution; name a step for the others".to_owned(),
                ));
            }
        };
        self.execution.status = next;
        self.stage_execution();
        let mut event = self.execution_event(EventKind::StepIntervened);
        event.agent_id = intervention.by.clone();
        event.detail = describe(&intervention, "");
        event.matrix_version = intervention.matrix_version;
        self.record(event);
        Ok(())
    }

    /// A step back to the start: pending again, its error and end cleared.
    fn reopen(&mut self, position: usize) {
        let step = &mut self.steps[position];
        step.error_code.clear();
        step.error_message.clear();
        step.ended_at = None;
        step.retry_at = None;
        self.set_status(position, StepStatus::Pending);
    }
}

fn describe(intervention: &Intervention, step_id: &str) -> String {
    let target = if step_id.is_empty() { "the execution".to_owned() } else { format!("step '{step_id}'") };
    let mut text = format!("{} {} {target}", intervention.by, intervention.action.verb());
    if let InterventionAction::Reassign(agent_id) = &intervention.action {
        text.push_str(&format!(" to {agent_id}"));
    }
    if !intervention.reason.is_empty() {
        text.push_str(&format!(": {}", intervention.reason));
    }
    text
}
