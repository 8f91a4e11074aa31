//! Interventions by operators, a step's monitors and the execution's lead:
//! pause, resume, retry, cancel, reassign and override the output. Who may
//! do what is checked by the gRPC layer; the driver checks that the step's state
//! allows it, applies it, and records a STEP_INTERVENED event with it.

use muster_proto::common::v1::EventType;

use super::driver::{Driver, assignment_id};
use crate::{
    Error, Result,
    domain::{ExecutionStatus, StepStatus},
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
    pub(super) async fn intervene(&mut self, intervention: Intervention) -> Result<()> {
        let Some(step_id) = intervention.step_id.clone() else {
            return self.intervene_on_execution(intervention).await;
        };
        let Some(&position) = self.index.get(&step_id) else {
            return Err(Error::NotFound(format!("execution '{}' has no step '{step_id}'", self.execution.id)));
        };
        let status = self.execution.steps[position].status;
        let refuse = || {
            Err(Error::FailedPrecondition(format!(
                "step '{step_id}' is {}: it cannot be {}",
                status.as_str(),
                intervention.action.verb()
            )))
        };
        let now = muster_runtime::time::now_millis();
        let mut events = Vec::new();
        match &intervention.action {
            InterventionAction::Pause => {
                if !matches!(status, StepStatus::Pending | StepStatus::Ready | StepStatus::Running | StepStatus::Queued)
                {
                    return refuse();
                }
                self.withdraw(position, "paused");
                self.execution.steps[position].status = StepStatus::Paused;
            }
            InterventionAction::Resume => {
                if status != StepStatus::Paused {
                    return refuse();
                }
                self.execution.steps[position].status = StepStatus::Pending;
            }
            InterventionAction::Retry => {
                if !matches!(
                    status,
                    StepStatus::Failed | StepStatus::Cancelled | StepStatus::Running | StepStatus::Queued
                ) {
                    return refuse();
                }
                self.withdraw(position, "retried");
                self.reopen(position);
                // Dependants that failed because of this step get another chance too.
                self.reopen_dependants(&step_id);
            }
            InterventionAction::Cancel => {
                if status.is_final() {
                    return refuse();
                }
                self.withdraw(position, "cancelled");
                let step = &mut self.execution.steps[position];
                step.status = StepStatus::Cancelled;
                step.error_code = "CANCELLED".to_owned();
                step.error_message = format!("cancelled by {}", intervention.by);
                step.ended_at = Some(now);
            }
            InterventionAction::Reassign(agent_id) => {
                if status.is_final() || status == StepStatus::WaitingApproval {
                    return refuse();
                }
                self.withdraw(position, "reassigned");
                self.reassigned.insert(position, agent_id.clone());
                let step = &mut self.execution.steps[position];
                step.executor = agent_id.clone();
                if step.status.is_in_flight() {
                    step.status = StepStatus::Ready;
                }
            }
            InterventionAction::OverrideOutput(output_json) => {
                if status == StepStatus::Completed {
                    return refuse();
                }
                self.withdraw(position, "output overridden");
                let step = &mut self.execution.steps[position];
                step.status = StepStatus::Completed;
                step.output_json = output_json.clone();
                step.error_code.clear();
                step.error_message.clear();
                step.ended_at = Some(now);
            }
        }
        let mut intervened = self.step_event(EventType::StepIntervened, position);
        intervened.agent_id = intervention.by.clone();
        intervened.detail = describe(&intervention, &step_id);
        intervened.matrix_version = intervention.matrix_version;
        // The agent a step is reassigned to hears of it.
        if let InterventionAction::Reassign(agent_id) = &intervention.action {
            intervened.participants = vec![agent_id.clone()];
        }
        events.push(intervened);
        if matches!(intervention.action, InterventionAction::OverrideOutput(_)) {
            events.push(self.step_event(EventType::StepCompleted, position));
        }
        let mut changed: Vec<usize> = vec![position];
        changed.append(&mut self.dependants_reopened);
        self.persist(&changed, false, events).await?;
        tracing::info!(execution_id = %self.execution.id, step = %step_id, by = %intervention.by, action = intervention.action.verb(), "intervention");
        Ok(())
    }

    async fn intervene_on_execution(&mut self, intervention: Intervention) -> Result<()> {
        let next = match (&intervention.action, self.execution.status) {
            (InterventionAction::Pause, ExecutionStatus::Running) => ExecutionStatus::Paused,
            (InterventionAction::Resume, ExecutionStatus::Paused) => ExecutionStatus::Running,
            (InterventionAction::Pause | InterventionAction::Resume, status) => {
                return Err(Error::FailedPrecondition(format!(
                    "execution '{}' is {}: it cannot be {}",
                    self.execution.id,
                    status.as_str(),
                    intervention.action.verb()
                )));
            }
            _ => {
                return Err(Error::InvalidArgument(
                    "only pause and resume apply to a whole execution; name a step for the others".to_owned(),
                ));
            }
        };
        self.execution.status = next;
        let mut event = super::new_event(&mut self.execution, EventType::StepIntervened);
        event.agent_id = intervention.by.clone();
        event.detail = describe(&intervention, "");
        event.matrix_version = intervention.matrix_version;
        self.persist(&[], true, vec![event]).await
    }

    /// Stops the running attempt of a step, if any: the worker is told, and its late answer is ignored.
    fn withdraw(&mut self, position: usize, reason: &str) {
        let step = &self.execution.steps[position];
        if step.status.is_in_flight() {
            self.engine.workers.withdraw(&assignment_id(&self.execution.id, &step.step_id, step.attempt), reason);
            self.release_delegation(position);
        }
    }

    fn reopen(&mut self, position: usize) {
        let step = &mut self.execution.steps[position];
        step.status = StepStatus::Pending;
        step.error_code.clear();
        step.error_message.clear();
        step.ended_at = None;
    }

    fn reopen_dependants(&mut self, step_id: &str) {
        let dependants: Vec<usize> = self
            .definition
            .steps
            .iter()
            .enumerate()
            .filter(|(position, definition)| {
                definition.depends_on.iter().any(|dependency| dependency == step_id)
                    && self.execution.steps[*position].error_code == "UPSTREAM_FAILED"
            })
            .map(|(position, _)| position)
            .collect();
        for position in dependants {
            self.reopen(position);
            self.dependants_reopened.push(position);
            let id = self.execution.steps[position].step_id.clone();
            self.reopen_dependants(&id);
        }
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
