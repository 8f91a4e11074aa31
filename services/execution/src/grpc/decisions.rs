//! Approvals and interventions: who may decide a human approval step (its
//! executor and monitors), who may intervene (operators, the lead anywhere,
//! a step's monitors in that step), and what the permission matrix lets
//! their role do.

use muster_proto::{execution::v1 as wire, roster::v1 as roster};
use muster_runtime::auth::{Caller, permission_denied};
use tonic::Status;

use super::{ExecutionApi, convert::execution_to_wire};
use crate::{
    Error,
    clients::dependency_error,
    engine::{Control, Intervention, InterventionAction, approvers, step_roles},
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

impl ExecutionApi {
    pub(super) async fn decide(
        &self,
        caller: &Caller,
        request: wire::SubmitApprovalRequest,
    ) -> Result<wire::SubmitApprovalResponse, Status> {
        let (execution, definition) = self.execution_and_definition(&request.execution_id).await?;
        let step = definition.steps.iter().find(|step| step.id == request.step_id).ok_or_else(|| {
            Error::NotFound(format!("execution '{}' has no step '{}'", request.execution_id, request.step_id))
        })?;
        if step.step_type != "human_approval" {
            return Err(Error::FailedPrecondition(format!("step '{}' is not a human_approval step", step.id)).into());
        }
        let described = format!("decide step '{}' of execution '{}'", step.id, request.execution_id);
        let allowed = approvers(step);
        if !caller.agent_id().is_some_and(|agent_id| allowed.iter().any(|approver| approver == agent_id)) {
            return Err(permission_denied(
                caller,
                &described,
                "NOT_AN_APPROVER",
                format!("only the step's executor or monitors ({}) may decide it", allowed.join(", ")),
                &[("execution_id", request.execution_id.clone()), ("step_id", step.id.clone())],
            ));
        }
        let action = if request.approved { "approve" } else { "request_changes" };
        let matrix_version = self.check_matrix_action(caller, &execution, action, &described)?;
        let control = |reply| Control::Decide {
            step_id: request.step_id.clone(),
            approved: request.approved,
            by: caller.audit_name(),
            comment: request.comment,
            matrix_version,
            reply,
        };
        self.control(&request.execution_id, control).await?;
        let execution = self.engine.store.get_execution(&request.execution_id).await?.unwrap_or(execution);
        let step = execution_to_wire(execution, Some(&*definition))
            .steps
            .into_iter()
            .find(|state| state.step_id == request.step_id);
        Ok(wire::SubmitApprovalResponse { step })
    }

    pub(super) async fn intervene_as(
        &self,
        caller: &Caller,
        request: wire::InterveneRequest,
    ) -> Result<wire::InterveneResponse, Status> {
        let (execution, definition) = self.execution_and_definition(&request.execution_id).await?;
        let action = match wire::InterventionAction::try_from(request.action).unwrap_or_default() {
            wire::InterventionAction::Pause => InterventionAction::Pause,
            wire::InterventionAction::Resume => InterventionAction::Resume,
            wire::InterventionAction::Retry => InterventionAction::Retry,
            wire::InterventionAction::Cancel => InterventionAction::Cancel,
            wire::InterventionAction::Reassign => {
                if request.target_agent_id.is_empty() {
                    return Err(Status::invalid_argument("REASSIGN needs target_agent_id"));
                }
                let mut roster = self.engine.roster.clone();
                roster
                    .get_agent(roster::GetAgentRequest { id: request.target_agent_id.clone() })
                    .await
                    .map_err(|status| dependency_error("roster", status))?;
                InterventionAction::Reassign(request.target_agent_id.clone())
            }
            wire::InterventionAction::OverrideOutput => {
                if serde_json::from_str::<serde_json::Value>(&request.output_json).is_err() {
                    return Err(Status::invalid_argument("OVERRIDE_OUTPUT needs output_json, a JSON value"));
                }
                InterventionAction::OverrideOutput(request.output_json.clone())
            }
            wire::InterventionAction::Unspecified => return Err(Status::invalid_argument("action is required")),
        };
        let step_id = (!request.step_id.is_empty()).then(|| request.step_id.clone());
        if let Some(step_id) = &step_id
            && !definition.steps.iter().any(|step| &step.id == step_id)
        {
            return Err(Error::NotFound(format!("execution '{}' has no step '{step_id}'", request.execution_id)).into());
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
                    let step =
                        definition.steps.iter().find(|step| &step.id == step_id).map(step_roles).unwrap_or_default();
                    (!step.monitors.iter().any(|monitor| monitor == agent_id)).then(|| {
                        format!(
                            "only operators, the execution's lead and the monitors of step '{step_id}' ({}) may intervene in it",
                            if step.monitors.is_empty() { "none".to_owned() } else { step.monitors.join(", ") }
                        )
                    })
                }
                _ => None,
            };
            if let Some(why) = why {
                return Err(permission_denied(
                    caller,
                    &described,
                    "NOT_LEAD_OR_MONITOR",
                    why,
                    &[("execution_id", request.execution_id.clone())],
                ));
            }
            matrix_version = self.check_matrix_action(caller, &execution, matrix_action(&action), &described)?;
        }
        let intervention =
            Intervention { step_id, action, by: caller.audit_name(), reason: request.reason, matrix_version };
        self.control(&request.execution_id, |reply| Control::Intervene { intervention, reply }).await?;
        let execution = self.engine.store.get_execution(&request.execution_id).await?.unwrap_or(execution);
        Ok(wire::InterveneResponse { execution: Some(execution_to_wire(execution, Some(&*definition))) })
    }
}
