//! Approvals and interventions: who may decide a human approval step (its
//! `approvers`, else its executor and monitors), who may intervene
//! (operators, the lead anywhere, a step's monitors in that step), and what
//! the permission matrix lets their role do.

use muster_proto::execution::v1 as wire;
use muster_runtime::auth::Caller;

use super::{ExecutionGrpc, access::denied, convert::execution_to_wire};
use crate::{
    Error, Result,
    engine::{Control, Intervention, InterventionAction, step_roles},
};

/// The matrix action an intervention needs.
fn matrix_action(action: &InterventionAction) -> &'static str {
    match action {
        InterventionAction::Reassign(_) => "reassign",
        InterventionAction::Cancel => "close_task",
        InterventionAction::Pause
        | InterventionAction::Resume
        | InterventionAction::Retry
        | InterventionAction::OverrideOutput(_) => "unblock",
    }
}

impl ExecutionGrpc {
    pub(super) async fn decide(
        &self,
        caller: &Caller,
        request: wire::SubmitApprovalRequest,
    ) -> Result<wire::SubmitApprovalResponse> {
        let described = format!("decide step '{}' of execution '{}'", request.step_id, request.execution_id);
        let (execution, process) = self.execution_for(caller, &request.execution_id, &described).await?;
        let step = process.definition.steps.iter().find(|step| step.id == request.step_id).ok_or_else(|| {
            Error::not_found(
                "muster.execution.v1.StepState",
                format!("{}/{}", request.execution_id, request.step_id),
                format!("execution '{}' has no step '{}'", request.execution_id, request.step_id),
            )
        })?;
        if step.step_type != crate::engine::HUMAN_APPROVAL {
            return Err(Error::precondition(
                "NOT_AN_APPROVAL_STEP",
                format!("step/{}", step.id),
                format!("step '{}' is not a human_approval step", step.id),
            ));
        }
        let allowed = step.approvers();
        if !caller.agent_id().is_some_and(|agent_id| allowed.iter().any(|approver| approver == agent_id)) {
            let who =
                if step.approvers.is_empty() { "the step's executor or monitors" } else { "the step's approvers" };
            return Err(denied(
                caller,
                described,
                "NOT_AN_APPROVER",
                format!("only {who} ({}) may decide it", allowed.join(", ")),
                vec![("execution_id", request.execution_id.clone()), ("step_id", step.id.clone())],
            ));
        }
        let action = if request.approved { "approve" } else { "request_changes" };
        let matrix_version = self.check_matrix_action(caller, &execution, action, &described).await?;
        let control = |reply| Control::Decide {
            step_id: request.step_id.clone(),
            approved: request.approved,
            by: caller.audit_name(),
            comment: request.comment,
            matrix_version,
            reply,
        };
        self.control(&request.execution_id, control).await?;
        let execution = self.engine.store.execution(&request.execution_id).await?.unwrap_or(execution);
        let steps = self.steps(&request.execution_id).await?;
        let step = execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room())
            .steps
            .into_iter()
            .find(|state| state.step_id == request.step_id);
        Ok(wire::SubmitApprovalResponse { step })
    }

    pub(super) async fn intervene_as(
        &self,
        caller: &Caller,
        request: wire::InterveneRequest,
    ) -> Result<wire::InterveneResponse> {
        let (execution, process) = self
            .execution_for(caller, &request.execution_id, &format!("intervene in execution '{}'", request.execution_id))
            .await?;
        let action = match wire::InterventionAction::try_from(request.action).unwrap_or_default() {
            wire::InterventionAction::Pause => InterventionAction::Pause,
            wire::InterventionAction::Resume => InterventionAction::Resume,
            wire::InterventionAction::Retry => InterventionAction::Retry,
            wire::InterventionAction::Cancel => InterventionAction::Cancel,
            wire::InterventionAction::Reassign => {
                if request.target_agent_id.is_empty() {
                    return Err(Error::invalid("target_agent_id", "REASSIGN needs target_agent_id"));
                }
                self.roster_agent(&request.target_agent_id, "target_agent_id").await?;
                InterventionAction::Reassign(request.target_agent_id.clone())
            }
            wire::InterventionAction::OverrideOutput => {
                let Some(output) = &request.output else {
                    return Err(Error::invalid("output", "OVERRIDE_OUTPUT needs output, a JSON value"));
                };
                let output = muster_runtime::json::value_to_text(Some(output))
                    .map_err(|problem| Error::invalid("output", format!("output {problem}")))?;
                InterventionAction::OverrideOutput(output)
            }
            wire::InterventionAction::Unspecified => {
                return Err(Error::invalid("action", "action is required"));
            }
        };
        let step_id = (!request.step_id.is_empty()).then(|| request.step_id.clone());
        if let Some(step_id) = &step_id
            && !process.definition.steps.iter().any(|step| &step.id == step_id)
        {
            return Err(Error::not_found(
                "muster.execution.v1.StepState",
                format!("{}/{step_id}", request.execution_id),
                format!("execution '{}' has no step '{step_id}'", request.execution_id),
            ));
        }
        let target = match &step_id {
            Some(step_id) => format!("step '{step_id}' of execution '{}'", request.execution_id),
            None => format!("execution '{}'", request.execution_id),
        };
        let described = format!("{} {target}", action.verb_infinitive());
        // Operators may intervene anywhere. Of agents, the execution's lead
        // may intervene anywhere, a step's monitors only in that step.
        let mut matrix_version = 0;
        if let Some(agent_id) = caller.agent_id() {
            let is_lead = !execution.lead_agent_id.is_empty() && execution.lead_agent_id == agent_id;
            let why = match &step_id {
                None if !is_lead => Some(format!(
                    "only operators and the execution's lead ({}) may pause or resume the whole execution",
                    if execution.lead_agent_id.is_empty() { "none is set" } else { &execution.lead_agent_id }
                )),
                Some(step_id) if !is_lead => {
                    let monitors: Vec<String> = process
                        .definition
                        .steps
                        .iter()
                        .find(|step| &step.id == step_id)
                        .map(|step| step_roles(step).monitors)
                        .unwrap_or_default();
                    (!monitors.iter().any(|monitor| monitor == agent_id)).then(|| {
                        format!(
                            "only operators, the execution's lead and the monitors of step '{step_id}' ({}) may intervene in it",
                            if monitors.is_empty() { "none".to_owned() } else { monitors.join(", ") }
                        )
                    })
                }
                _ => None,
            };
            if let Some(why) = why {
                return Err(denied(
                    caller,
                    described,
                    "NOT_LEAD_OR_MONITOR",
                    why,
                    vec![("execution_id", request.execution_id.clone())],
                ));
            }
            matrix_version = self.check_matrix_action(caller, &execution, matrix_action(&action), &described).await?;
        }
        let intervention =
            Intervention { step_id, action, by: caller.audit_name(), reason: request.reason, matrix_version };
        self.control(&request.execution_id, |reply| Control::Intervene { intervention, reply }).await?;
        let execution = self.engine.store.execution(&request.execution_id).await?.unwrap_or(execution);
        let steps = self.steps(&request.execution_id).await?;
        Ok(wire::InterveneResponse {
            execution: Some(execution_to_wire(&execution, &steps, Some(&process.definition), self.outputs_room())),
        })
    }
}
